"""The one compiled part of tcl: its onnxruntime operator library, ``tcl/_ortops*.so``.

Everything else is configured in pyproject.toml. The library is a plain shared object that
onnxruntime loads (``SessionOptions.register_custom_ops_library``), not a Python extension module.
It is optional: without a C++ compiler the install still succeeds, and ``tcl.serving`` runs the
exported standard-op graph instead of the fused scan.
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
])
