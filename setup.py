"""The compiled parts of tcl; everything else is configured in pyproject.toml. Both are optional:
without a compiler the install still succeeds and the pure-Python path runs.

* ``tcl/_ortops*.so``: the onnxruntime operator library, a plain shared object that onnxruntime
  loads (``SessionOptions.register_custom_ops_library``), not a Python extension module; without
  it ``tcl.serving`` runs the exported standard-op graph instead of the fused scan.
* ``tcl/records/_trace_steps*.so``: the MetaSchedule trace walker in C (a Python extension);
  without it ``tcl.records.metaschedule`` walks traces in Python: the same steps, ~1.5x the CPU a record.
"""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension(
        "tcl._ortops",
        sources=["tcl/csrc/ortops.cc"],
        language="c++",
        # no FP-exception semantics: lets the compiler turn the clamps into vector min/max (AVX2: ~5x)
        extra_compile_args=["-O3", "-std=c++17", "-fvisibility=hidden", "-fno-trapping-math"],
        optional=True,
    ),
    Extension("tcl.records._trace_steps", sources=["tcl/records/trace_steps.c"], optional=True),
])
