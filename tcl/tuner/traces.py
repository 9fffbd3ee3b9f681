"""Candidates' traces -> the steps `tcl ingest` reads from a database line, without the file.

A MetaSchedule database stores each program's trace as the JSON of ``Trace.AsJSON`` (postproc
instructions kept); `tcl.records.metaschedule.trace_to_steps` turns that JSON into steps. Here the
same JSON is read straight from the candidate's trace object, so a candidate scored inside tuning
gets exactly the features its database line gets after ingest (tests/test_tuner.py checks it).

Two ways to the JSON. With TCL's trace library (``tcl/_traces*.so``, built from
``tcl/csrc/traces.cc`` by ``pip install``), one TVM FFI call writes the JSON text of a batch of
candidates in C++ without the GIL (two threads take a half each) and orjson parses it. Without
it, `trace_json` walks the FFI containers from Python (one call per value, hundreds a trace:
~10x slower, docs/tuning.md). The library writes an ``IndexMap`` attribute (a layout rewrite's
map) as the string ``"<IndexMap>"`` where the database holds the map's JSON graph: the
featurizer encodes either as its one out-of-vocabulary string, so the features are the same
(tests/test_tuner.py checks both paths against the database).
"""

from __future__ import annotations

from tcl.records.metaschedule import trace_to_steps


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
    global _BATCH_JSON
    if _BATCH_JSON is None:
        import ctypes
        import importlib.machinery
        from pathlib import Path

        import tvm_ffi

        _BATCH_JSON = False
        here = Path(__file__).resolve().parents[1]
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = here / f"_traces{suffix}"
            if path.is_file():
                ctypes.CDLL(str(path))  # its static initialiser registers the function
                _BATCH_JSON = tvm_ffi.get_global_func("tcl.CandidateTracesJSON")
                break
    return _BATCH_JSON or None


_BATCH_JSON = None
_POOL = None


def candidate_traces(candidates: list, use_library: bool = True) -> list[list]:
    """The trace JSON of each MeasureCandidate (see the module docstring for the two paths)."""
    batch_json = trace_library() if use_library else None
    if batch_json is None:
        return [trace_json(c.sch.trace) for c in candidates]
    import orjson
    import tvm_ffi

    global _POOL
    n = len(candidates)
    if n < 64:
        return orjson.loads(str.encode(batch_json(candidates, 0, n)))
    if _POOL is None:
        from concurrent.futures import ThreadPoolExecutor

        _POOL = ThreadPoolExecutor(2, thread_name_prefix="tcl-traces")
    array = tvm_ffi.Array(candidates)
    half = n // 2
    parts = [_POOL.submit(batch_json, array, a, b) for a, b in ((0, half), (half, n))]
    return [t for part in parts for t in orjson.loads(str.encode(part.result()))]


def candidate_steps(candidates, use_library: bool = True) -> list[list]:
    """Steps of each MetaSchedule MeasureCandidate (its schedule's trace), as ingest makes them;
    a trace ingest would reject (an unknown instruction kind) gives no steps (an empty program)."""
    out = []
    for trace in candidate_traces(list(candidates), use_library):
        steps = trace_to_steps(trace)
        out.append(steps if steps.__class__ is list else [])
    return out
