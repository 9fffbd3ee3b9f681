"""Benchmarks behind `tcl bench ...`: each times a stage through its public interface and prints
the figure beside a baseline measured in the same run. Benchmarks import the stages, never the
other way round."""
