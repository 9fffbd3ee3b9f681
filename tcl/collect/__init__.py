"""Measuring real programs with TVM MetaSchedule (`tcl collect`)."""
