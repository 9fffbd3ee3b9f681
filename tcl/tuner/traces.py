"""Candidates' traces -> the steps `tcl ingest` reads from a database line, without the file.

A MetaSchedule database stores each program's trace as the JSON of ``Trace.AsJSON`` (postproc
instructions kept); `tcl.records.metaschedule.trace_to_steps` turns that JSON into steps. Here the
same JSON is read straight from the candidate's trace object, so a candidate scored inside tuning
gets exactly the features its database line gets after ingest (tests/test_tuner.py checks it).

``Trace.as_json()`` converts the FFI containers element by element through Python wrappers;
`trace_json` walks them with the FFI's own size/get functions and dispatches on the class,
about twice as fast. It is still the cost model's bottleneck (docs/tuning.md has the figures):
a trace holds hundreds of FFI values and each is fetched by its own call from Python.
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


def candidate_steps(candidates) -> list[list]:
    """Steps of each MetaSchedule MeasureCandidate (its schedule's trace), as ingest makes them;
    a trace ingest would reject (an unknown instruction kind) gives no steps (an empty program)."""
    out = []
    for c in candidates:
        steps = trace_to_steps(trace_json(c.sch.trace))
        out.append(steps if steps.__class__ is list else [])
    return out
