"""Candidates' traces -> the steps `tcl ingest` reads from a database line, without the file.

A MetaSchedule database stores each program's trace as the JSON of ``Trace.AsJSON`` (postproc
instructions kept); `tcl.records.metaschedule.trace_to_steps` turns that JSON into steps. Here the
same JSON is read straight from the candidate's trace object, so a candidate scored inside tuning
gets exactly the features its database line gets after ingest (tests/test_tuner.py checks it).

Two ways to the steps. With TCL's trace library (``tcl/_traces*.so``, built from
``tcl/csrc/traces.cc``, see setup.py), one TVM FFI call applies `trace_to_steps`'s rules to a
batch of candidates in C++, reading the traces in place, without the GIL (two threads take a
half each), and orjson parses the steps; a trace with an argument it does not know (an
expression of variables, not met in MetaSchedule's design spaces) sends its batch the other way. Without it, `trace_json` walks the FFI containers from Python (one call per value,
hundreds a trace: several times slower, docs/tuning.md) and `trace_to_steps` reads the result.
The library writes an ``IndexMap`` argument (a layout rewrite's map) as the string
``"<IndexMap>"`` where the database holds the map's JSON graph: the featurizer encodes either as
its one out-of-vocabulary string, so the features are the same (tests/test_tuner.py checks both
ways against the database).
"""

from __future__ import annotations

import orjson

from tcl.records import METASCHEDULE_STEP_KINDS, gc_paused
from tcl.records.metaschedule import trace_to_steps

_KINDS = list(METASCHEDULE_STEP_KINDS)  # the kinds trace_to_steps knows; others reject the trace


def _converter():
    import tvm
    import tvm_ffi
    from tvm.tirx.expr import FloatImm, IntImm
    from tvm.tirx.function import IndexMap
    from tvm_ffi import _ffi_api as ffi

    array_class, size, get = tvm_ffi.Array, ffi.ArraySize, ffi.ArrayGetItem
    string_class = type(tvm_ffi.convert("x"))
    scalars = frozenset((int, float, str, bool, type(None)))
    stringify = tvm_ffi.get_global_func("ffi.json.Stringify")
    graph_metadata = {"tvm_version": tvm.__version__}

    def convert(obj):
        cls = obj.__class__
        if cls in scalars:
            return obj
        if cls is array_class:
            return [convert(get(obj, i)) for i in range(size(obj))]
        if cls is string_class:
            return str(obj)
        if isinstance(obj, (IntImm, FloatImm)):
            return obj.value
        if isinstance(obj, IndexMap):  # as the database writes it (C++ SaveJSON, indented)
            return str(stringify(ffi.ToJSONGraph(obj, graph_metadata), 2))
        if isinstance(obj, str):
            return str(obj)
        raise TypeError(f"unexpected {cls.__name__} in a trace's JSON")

    return convert


_CONVERT = None
_AS_JSON = None


def trace_json(trace) -> list:
    """The JSON a database line holds for `trace` (``[instructions, decisions]``), as lists."""
    global _CONVERT, _AS_JSON
    if _CONVERT is None:
        from tvm.s_tir.schedule import _ffi_api

        _CONVERT, _AS_JSON = _converter(), _ffi_api.TraceAsJSON
    return _CONVERT(_AS_JSON(trace, False))


def trace_library():
    """The FFI function of TCL's trace library, or None where it was not built."""
    global _BATCH_STEPS
    if _BATCH_STEPS is None:
        import ctypes
        import importlib.machinery
        from pathlib import Path

        import tvm_ffi

        _BATCH_STEPS = False
        here = Path(__file__).resolve().parents[1]
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = here / f"_traces{suffix}"
            if path.is_file():
                ctypes.CDLL(str(path))  # its static initialiser registers the function
                _BATCH_STEPS = tvm_ffi.get_global_func("tcl.CandidateSteps")
                break
    return _BATCH_STEPS or None


_BATCH_STEPS = None
_POOL = None
_SPLIT_ABOVE = 64  # candidates: a smaller batch is not worth a second thread


def candidate_steps(candidates, use_library: bool = True) -> list[list]:
    """Steps of each MetaSchedule MeasureCandidate (its schedule's trace), as ingest makes them;
    a trace ingest would reject (an unknown instruction kind) gives no steps (an empty program)."""
    candidates = list(candidates)
    batch_steps = trace_library() if use_library else None
    with gc_paused():  # trees of small lists, no cycles: the collector would rescan the heap
        if batch_steps is None:
            out = [trace_to_steps(trace_json(c.sch.trace)) for c in candidates]
        else:
            try:
                out = [s for text in _library_texts(batch_steps, candidates) for s in orjson.loads(text)]
            except (TypeError, ValueError):  # an argument the library does not know: Python's way
                out = [trace_to_steps(trace_json(c.sch.trace)) for c in candidates]
    return [s if s.__class__ is list else [] for s in out]


def _library_texts(batch_steps, candidates: list) -> list[bytes]:
    import tvm_ffi

    global _POOL
    n = len(candidates)
    if n <= _SPLIT_ABOVE:
        return [str.encode(batch_steps(candidates, 0, n, _KINDS))]
    if _POOL is None:
        from concurrent.futures import ThreadPoolExecutor

        _POOL = ThreadPoolExecutor(2, thread_name_prefix="tcl-traces")
    array = tvm_ffi.Array(candidates)
    half = n // 2
    parts = [_POOL.submit(batch_steps, array, a, b, _KINDS) for a, b in ((0, half), (half, n))]
    return [str.encode(p.result()) for p in parts]
