"""The compiled parts of tcl; everything else is configured in pyproject.toml. All are optional:
without a compiler the install still succeeds and the pure-Python paths run.

* ``tcl/_ortops*.so``: the onnxruntime operator library, a plain shared object that onnxruntime
  loads (``SessionOptions.register_custom_ops_library``), not a Python extension module; without
  it ``tcl.serving`` runs the exported standard-op graph instead of the fused scan.
* ``tcl/_scan_grad*.so``: the Mamba selective scan's forward and backward for torch training on
  CPU (``tcl/csrc/scan_grad.cc``), a plain shared object loaded with ctypes by
  ``tcl.models.fused_ops``; without it training runs the scan as torch ops (``scan_method`` "fast").
* ``tcl/records/_trace_steps*.so``: the MetaSchedule trace walker in C (a Python extension);
  without it ``tcl.records.metaschedule`` walks traces in Python: the same steps, ~1.5x the CPU a record.
* ``tcl/_traces*.so``: a batch of MetaSchedule candidates' traces -> their steps in one TVM FFI
  call (``tcl/csrc/traces.cc``), loaded with ctypes by ``tcl.tuner.traces``; without it the
  tuner walks the traces from Python, several times slower. Built against the TVM FFI
  (apache-tvm-ffi) when it is importable at build time (see pyproject.toml's build requirements).
"""

from setuptools import Extension, setup


def _traces_extension() -> list[Extension]:
    try:
        import tvm_ffi.libinfo as ffi
    except ImportError:  # no TVM FFI to build against: the tuner's Python path serves
        return []
    lib_dir = str(__import__("pathlib").Path(ffi.find_libtvm_ffi()).parent)
    return [Extension(
        "tcl._traces",
        sources=["tcl/csrc/traces.cc"],
        language="c++",
        include_dirs=[ffi.find_include_path(), ffi.find_dlpack_include_path()],
        library_dirs=[lib_dir],
        runtime_library_dirs=[lib_dir],
        libraries=["tvm_ffi"],
        extra_compile_args=["-O2", "-std=c++17", "-fvisibility=hidden"],
        optional=True,
    )]


setup(ext_modules=[
    Extension(
        "tcl._ortops",
        sources=["tcl/csrc/ortops.cc"],
        depends=["tcl/csrc/mamba_ops.h"],
        language="c++",
        # no FP-exception semantics: lets the compiler turn the clamps into vector min/max (AVX2: ~5x)
        extra_compile_args=["-O3", "-std=c++17", "-fvisibility=hidden", "-fno-trapping-math"],
        optional=True,
    ),
    Extension(
        "tcl._scan_grad",
        sources=["tcl/csrc/scan_grad.cc"],
        depends=["tcl/csrc/mamba_ops.h"],
        language="c++",
        # -fopenmp-simd: the pragmas that vectorise the backward's dot products; no OpenMP runtime
        extra_compile_args=["-O3", "-std=c++17", "-fvisibility=hidden", "-fno-trapping-math", "-fopenmp-simd",
                            "-pthread"],
        extra_link_args=["-pthread"],
        optional=True,
    ),
    Extension("tcl.records._trace_steps", sources=["tcl/records/trace_steps.c"], optional=True),
    *_traces_extension(),
])
