"""Benchmarks of the stages (`tcl bench ...`, `tcl models bench`): each prints its figure beside a baseline measured in the same run."""
