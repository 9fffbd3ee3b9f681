"""Candidates' traces -> the steps `tcl ingest` reads from a database line, without the file.

A MetaSchedule database stores each program's trace as the JSON of ``Trace.AsJSON`` (postproc
instructions kept); `tcl.records.metaschedule.trace_to_steps` turns that JSON into steps. Here the
same JSON is read straight from the candidate's trace object, so a candidate scored inside tuning
gets exactly the features its database line gets after ingest (tests/test_tuner.py checks it).

Two ways to the steps. With TCL's trace library (``tcl/_traces*.so``, built from
``tcl/csrc/traces.cc``, see setup.py), one TVM FFI call applies `trace_to_steps`'s rules to a
batch of candidates in C++, reading the traces in place, without the GIL (two threads take a
half each), and orjson parses the steps; a trace with an argument it does not know (an
expression of variables, not met in MetaSchedule's design spaces) sends its batch the other way.
Without it, `trace_json` walks the FFI containers from Python (one call per value, hundreds a
trace: several times slower, docs/tuning.md) and `trace_to_steps` reads the result.
The library writes an ``IndexMap`` argument (a layout rewrite's map) as the string
``"<IndexMap>"`` where the database holds the map's JSON graph: the featurizer encodes either as
its one out-of-vocabulary string, so the features are the same (tests/test_tuner.py checks both
ways against the database).

What the tuner scores with is `CandidateFeatures`: candidates -> the featurizer's (x, mask). With
the library the same walk writes the featurizer's rows straight into a reused float32 buffer
(the vocabulary handed over once): no steps text, no Python objects per step, no table gathered
from. Without it, or for a batch the library refuses, `candidate_steps` then the Featurizer: the
reference, and the features are byte for byte the same (tests/test_tuner.py).
"""

from __future__ import annotations

import time

import numpy as np
import orjson

from tcl.features import N_NUMERIC, Featurizer
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
    """The steps function of TCL's trace library (``tcl.CandidateSteps``), or None where it was
    not built."""
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
    parts = _split(len(candidates))
    if len(parts) == 1:
        return [str.encode(batch_steps(candidates, 0, len(candidates), _KINDS))]
    import tvm_ffi

    array = tvm_ffi.Array(candidates)
    return [str.encode(p.result()) for p in [_pool().submit(batch_steps, array, a, b, _KINDS) for a, b in parts]]


def _split(n: int) -> list[tuple[int, int]]:
    """[begin, end) parts of a batch of n: two halves (one a thread) above _SPLIT_ABOVE."""
    return [(0, n)] if n <= _SPLIT_ABOVE else [(0, n // 2), (n // 2, n)]


def _pool():
    global _POOL
    if _POOL is None:
        from tcl.runtime import worker_pool

        _POOL = worker_pool(2, "tcl-traces")
    return _POOL


WAYS = ("library", "steps", "python")


class CandidateFeatures:
    """MeasureCandidates -> `featurizer`'s (x (N, L, F) float32, mask (N, L) bool) of their steps.

    `way`: "library" (default): with TCL's trace library, each candidate's trace is walked once
    in C++ and its rows written into x as the featurizer would encode its steps; x and mask are
    then views of buffers kept for the next call (valid until then: callers score a batch
    before they featurize the next). "steps": `candidate_steps` (the library's steps text where
    built), then the featurizer; "python": the traces walked from Python, then the featurizer
    (the reference). `path` says which way the last call went: "library", "steps" or "python";
    "library" falls back to the steps' way where the library is not built, or for a batch it
    refuses (an argument it does not know, an Ansor-style "token$number" string).
    """

    def __init__(self, featurizer: Featurizer, way: str = "library"):
        if way not in WAYS:
            raise ValueError(f"way must be one of {WAYS}, not {way!r}")
        self.featurizer = featurizer
        self.way = way
        self.path = way
        self.steps_seconds = 0.0  # of the last call, in candidate_steps (not the library's way)
        self._encode = None
        if way == "library" and trace_library() is not None:
            import tvm_ffi

            # None in a library built before the one pass: the steps' way
            make = tvm_ffi.get_global_func("tcl.CandidateFeaturizer", allow_missing=True)
            if make is not None:
                f = featurizer
                kinds = list(METASCHEDULE_STEP_KINDS)
                columns = [-1 if k in f.skip else f.kind_index[k] for k in kinds]
                strings = list(f.string_index)
                self._encode = make(kinds, columns, strings, [f.string_index[s] for s in strings],
                                    f.other_string, f.num_offset, N_NUMERIC, f.max_len, f.n_features)
        self._x = np.zeros((0, featurizer.max_len, featurizer.n_features), np.float32)
        self._lengths = np.zeros(0, np.int64)
        self._positions = np.arange(featurizer.max_len)

    def __call__(self, candidates) -> tuple[np.ndarray, np.ndarray]:
        candidates = list(candidates)
        n = len(candidates)
        self.steps_seconds = 0.0
        if self._encode is not None:
            if len(self._x) < n:
                self._x = np.empty((n, *self._x.shape[1:]), np.float32)  # each row block is written whole
                self._lengths = np.empty(n, np.int64)
            x, lengths = self._x[:n], self._lengths[:n]
            try:
                parts = _split(n)
                if len(parts) == 1:
                    self._encode(candidates, 0, n, x, lengths)
                else:
                    import tvm_ffi

                    array = tvm_ffi.Array(candidates)
                    for f in [_pool().submit(self._encode, array, a, b, x, lengths) for a, b in parts]:
                        f.result()
                self.path = "library"
                return x, self._positions[None, :] < lengths[:, None]
            except (TypeError, ValueError):  # an argument the library does not know: the steps' way
                pass
        use_library = self.way != "python" and trace_library() is not None
        self.path = "steps" if use_library else "python"
        start = time.perf_counter()
        steps = candidate_steps(candidates, use_library=use_library)
        self.steps_seconds = time.perf_counter() - start
        return self.featurizer(steps)
