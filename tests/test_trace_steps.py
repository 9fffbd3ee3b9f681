"""The compiled MetaSchedule trace walker (tcl/records/trace_steps.c) against the Python one:
built, the same steps bit for bit on every bundled record, the same answer on odd traces, and a
small trace against steps worked out by hand."""

from __future__ import annotations

import copy

import orjson
import pytest

from tcl.records import read_lines
from tcl.records.metaschedule import (_CATEGORICAL, _KINDS, _TILE_KINDS, _walk_compiled, trace_to_steps,
                                      trace_to_steps_py)

from .conftest import REPO, fixture_path


def _compiled(trace):
    return _walk_compiled(trace, _KINDS, _TILE_KINDS, _CATEGORICAL)


@pytest.fixture(scope="module")
def compiled():
    assert _walk_compiled is not None, ("tcl/records/_trace_steps*.so was not built: `pip install -e .` "
                                        "(or `python setup.py build_ext --inplace`) compiles tcl/records/trace_steps.c")
    return _compiled


def _record_files():
    bundled = sorted((REPO / "data" / "raw").glob("*/database_tuning_record.json*"))
    fixtures = [fixture_path(f"metaschedule/{name}") / "database_tuning_record.json"
                for name in ("dense_256", "conv2d_small")]
    return bundled + fixtures


def test_compiled_walker_gives_the_python_steps_on_every_bundled_record(compiled):
    files = _record_files()
    assert len(files) >= 7  # the 5 bundled databases and the 2 fixtures
    n = 0
    for path in files:
        for line in read_lines(path):
            if not line.strip():
                continue
            trace = orjson.loads(line)[1][0]
            steps = compiled(trace)
            assert steps is not None, f"{path}: the compiled walker handed back a real trace"
            # the JSON text is what program_id hashes and what tells 1 from 1.0 from true
            assert orjson.dumps(steps) == orjson.dumps(trace_to_steps_py(trace)), path
            n += 1
    assert n > 20_000


def _trace(insts, decisions):
    return [insts, decisions]


# A small trace and its steps worked out by hand from the reader's rules (module doc of
# tcl.records.metaschedule): blocks dropped, a loop -> its position among its maker's outputs,
# a sampled variable -> its value, quoted literals unquoted, attrs flattened, the decision last.
HAND = _trace(
    [["GetSBlock", [], ["C", "main"], ["b0"]],
     ["GetLoops", ["b0"], [], ["l1", "l2"]],
     ["SamplePerfectTile", ["l2"], [2, 64], ["v3", "v4"]],
     ["Split", ["l2", "v3", "v4"], [1, 0], ["l5", "l6"]],
     ["Annotate", ["b0", '"SSR"'], ["meta_schedule.tiling_structure"], []],
     ["SampleCategorical", [], [[0, 16, 64], [0.5, 0.25, 0.25]], ["v7"]],
     ["Annotate", ["b0", "v7"], ["meta_schedule.unroll_explicit"], []],
     ["CacheWrite", ["b0", []], [0, "global"], ["b8"]],
     ["Fuse", ["l5", "l6"], [True], ["l9"]],
     ["Parallel", ["l9"], [], []]],
    [[2, [4, 16]], [5, 2]])
HAND_STEPS = [
    ["GetSBlock", "C", "main"],
    ["GetLoops"],
    ["SamplePerfectTile", 1, 2, 64, 4, 16],
    ["Split", 1, 4, 16, 1, 0],
    ["Annotate", "SSR", "meta_schedule.tiling_structure"],
    ["SampleCategorical", 0, 16, 64, 0.5, 0.25, 0.25, 2],
    ["Annotate", 64, "meta_schedule.unroll_explicit"],
    ["CacheWrite", 0, "global"],
    ["Fuse", 0, 1, True],
    ["Parallel", 0],
]


def test_both_walkers_give_the_hand_worked_steps(compiled):
    expected = orjson.dumps(HAND_STEPS)
    assert orjson.dumps(compiled(copy.deepcopy(HAND))) == expected
    assert orjson.dumps(trace_to_steps_py(copy.deepcopy(HAND))) == expected


def _edit(fn):
    trace = copy.deepcopy(HAND)
    fn(trace)
    return trace


# Odd traces: the compiled walker either handles one (handled=True) or hands it back (None), and
# trace_to_steps answers as the Python walker does either way, result or exception.
ODD = {
    "undefined variable and plain literal": (True, lambda t: t[0].append(["Annotate", ["v99", "x1y", 7], ["k"], []])),
    "nested list attrs and inputs": (True, lambda t: t[0].append(["Reorder", [["l1", ['"q"', [2.5]]]], [[[None]]], []])),
    "decision of a later duplicate index wins": (True, lambda t: t[1].append([2, [8, 8]])),
    "decision None is no decision": (True, lambda t: t[1].append([5, None])),
    "decision index out of range": (True, lambda t: t[1].extend([[-1, 3], [99, 3], [1 << 70, 3]])),
    "tile value None": (True, lambda t: t[1].__setitem__(0, [2, [None, 16]])),
    "categorical pick out of range": (True, lambda t: t[1].__setitem__(1, [5, 3])),
    "categorical pick a bool": (True, lambda t: t[1].__setitem__(1, [5, True])),
    "categorical candidate None": (True, lambda t: t[0][5][2][0].__setitem__(2, None)),
    "block output not named b": (True, lambda t: t[0][0][3].__setitem__(0, "blk")),
    "loop output redefined as block": (True, lambda t: t[0].append(["GetSBlock", [], ["D", "main"], ["l5"]])),
    "non-string later output": (True, lambda t: t[0][1][3].append(12)),
    "unicode literal": (True, lambda t: t[0].append(["Annotate", ["b0", '"é"', "é1"], ["k"], []])),
    "unknown kind": (False, lambda t: t[0][3].__setitem__(0, "NoSuchPrimitive")),
    "instruction of three fields": (False, lambda t: t[0][4].pop()),
    "inputs not a list": (False, lambda t: t[0][4].__setitem__(1, "b0")),
    "decision index a bool": (False, lambda t: t[1].append([True, 5])),
    "decision index a float": (False, lambda t: t[1].append([1.0, 5])),
    "decision of one field": (False, lambda t: t[1].append([2])),
    "tile decision a scalar": (False, lambda t: t[1].__setitem__(0, [2, 4])),
    "categorical without candidates": (False, lambda t: t[0][5].__setitem__(2, [])),
    "variable name with a newline": (False, lambda t: t[0].append(["Annotate", ["b0", "v1\n"], ["k"], []])),
    "non-ASCII variable-like name": (False, lambda t: t[0].append(["Annotate", ["b0", "v١"], ["k"], []])),
    "unhashable output": (False, lambda t: t[0][1][3].append([1])),
    "output name not a string": (False, lambda t: t[0][1].__setitem__(3, [5])),
}


def _outcome(walk, trace):
    try:
        return "steps", orjson.dumps(walk(copy.deepcopy(trace)))
    except Exception as exc:  # noqa: BLE001 -- the outcome compared is the exception itself
        return type(exc).__name__, str(exc)


@pytest.mark.parametrize("name", ODD)
def test_odd_traces_walk_as_in_python(compiled, name):
    handled, edit = ODD[name]
    trace = _edit(edit)
    assert (compiled(copy.deepcopy(trace)) is not None) == handled
    assert _outcome(trace_to_steps, trace) == _outcome(trace_to_steps_py, trace)


def test_odd_traces_include_a_rejected_and_a_raising_one():
    # the comparison above is only worth something if the odd traces reach both outcomes
    assert trace_to_steps_py(_edit(ODD["unknown kind"][1])) == "unknown_step_kind:NoSuchPrimitive"
    assert _outcome(trace_to_steps_py, _edit(ODD["tile decision a scalar"][1]))[0] == "TypeError"
