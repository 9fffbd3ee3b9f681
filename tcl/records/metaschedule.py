"""Reader for MetaSchedule JSON databases.

    database_workload.json       [structural_hash, base64_IRModule]            one per line
    database_tuning_record.json  [workload_index, [trace, run_secs, target, args_info]]

A trace is `[instructions, decisions]`, an instruction `[kind, inputs, attrs, outputs]`,
a decision `[instruction_index, value]`. Each instruction becomes one step
`[kind, *numbers_and_strings]`: literal inputs, flattened attrs, and the sampled decision.
Inputs that name a sampled variable are replaced by its sampled value (a tile size, a
categorical pick) so a `Split` or `Annotate` step carries the numbers it actually used. A loop
input becomes its position among the outputs of the instruction that made it (the axis of a
`GetLoops`, the tile level of a `Split`), like the iterator index of an Ansor step: without it,
`RFactor` on the outer or the inner loop of a split would be the same step. Block names carry
no information and are dropped.

A trace is walked in C (`trace_steps.c`, built by setup.py) where that is built; the C walker
hands any trace not shaped as TVM writes them back to the Python walker below, which stays the
reference: the two give the same steps (tests/test_trace_steps.py checks it on the bundled data).

Optional `tasks.json` beside the database (written by `tcl collect`) supplies each
workload's readable name, weight, networks and occurrences per network (`weights`); without it
the operator's buffers describe it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterator

import orjson

from . import METASCHEDULE_STEP_KINDS, Record, Reject, check_latencies, loads_lenient, read_lines

try:
    from ._trace_steps import walk as _walk_compiled
except ImportError:  # not built (no C compiler at install): the Python walker alone
    _walk_compiled = None
HAS_COMPILED_WALKER = _walk_compiled is not None

_KINDS = frozenset(METASCHEDULE_STEP_KINDS)
_RV = re.compile(r"^[a-z]\d+$")  # random-variable names: b0 (block), l2 (loop), v5 (expr)


def _flatten(value, out: list) -> None:
    """Append the scalars of a (nested) list to `out`; a quoted string literal loses its quotes."""
    for v in value:
        if v.__class__ is list:
            _flatten(v, out)
        elif v.__class__ is str and len(v) >= 2 and v[0] == '"' and v[-1] == '"':
            out.append(v[1:-1])  # a string literal is stored quoted
        else:
            out.append(v)


_DROP = object()  # the value of a block variable: it names, it carries no number
_TILE_KINDS = frozenset(("SamplePerfectTile", "SamplePartitionedTile"))
_CATEGORICAL = "SampleCategorical"
_POSITIONS = range(1 << 16)


def trace_to_steps(trace) -> list | str:
    """Steps of a trace, or an error reason string (an unknown step kind); raises ValueError,
    TypeError, IndexError or KeyError on a malformed trace."""
    if _walk_compiled is not None:
        steps = _walk_compiled(trace, _KINDS, _TILE_KINDS, _CATEGORICAL)
        if steps is not None:
            return steps
    return trace_to_steps_py(trace)


def trace_to_steps_py(trace) -> list | str:
    """`trace_to_steps` in Python: the reference, and the walker of what the compiled one hands back.

    Runs once per record on every instruction (~50 a trace): kept to plain loops over lists.
    """
    insts, decisions = trace[0], trace[1]
    decided = {int(i): d for i, d in decisions}
    # variable -> its sampled value, a loop's output position, or _DROP for a block
    values: dict[str, object] = {}
    kinds, flatten, drop, rv, get = _KINDS, _flatten, _DROP, _RV.match, values.get
    steps = []
    for index, (kind, inputs, attrs, outputs) in enumerate(insts):
        if kind not in kinds:
            return f"unknown_step_kind:{kind}"
        step = [kind]
        for x in inputs:
            if x.__class__ is str:
                v = get(x)
                if v is drop:
                    continue
                if v is not None:
                    step.append(v)
                elif not rv(x):  # a variable never defined here carries nothing either
                    step.append(x[1:-1] if len(x) >= 2 and x[0] == '"' and x[-1] == '"' else x)
            elif x.__class__ is list:
                flatten(x, step)
            else:
                step.append(x)
        for a in attrs:
            if a.__class__ is list:
                flatten(a, step)
            elif a.__class__ is str and len(a) >= 2 and a[0] == '"' and a[-1] == '"':
                step.append(a[1:-1])
            else:
                step.append(a)
        if outputs:  # an instruction makes variables of one sort: loops, blocks or expressions
            if outputs[0][:1] == "l":
                values.update(zip(outputs, _POSITIONS))
            else:
                values.update(dict.fromkeys(outputs, drop))
        decision = decided.get(index)
        if decision is not None:
            if decision.__class__ is list:
                flatten(decision, step)
            else:
                step.append(decision)
            if kind in _TILE_KINDS:
                for name, v in zip(outputs, decision):
                    values[name] = v
            elif kind == _CATEGORICAL:
                candidates = attrs[0]
                if decision.__class__ is int and 0 <= decision < len(candidates):
                    values[outputs[0]] = candidates[decision]
        steps.append(step)
    return steps


def _describe_args(args_info) -> str:
    parts = []
    for a in args_info:
        if isinstance(a, list) and len(a) == 3 and a[0] == "TENSOR":
            parts.append(f"{a[1]}[{','.join(str(d) for d in a[2])}]")
    return " ".join(parts)


def read_database(db_dir: str | os.PathLike, platform: str) -> Iterator[Record | Reject]:
    db_dir = Path(db_dir)
    rec_path = _existing(db_dir / "database_tuning_record.json")
    workloads = []
    for item in read_workloads(db_dir):
        if item.__class__ is Reject:
            yield item
        else:
            workloads = item
    yield from read_records(_lines(rec_path), workloads, platform, rec_path)


def read_workloads(db_dir: str | os.PathLike) -> Iterator[list | Reject]:
    """Rejects of the workload file's bad lines, then (last) the list of workloads by index:
    (hash, name, desc, weight, networks, network weights), None where a line was bad."""
    db_dir = Path(db_dir)
    wl_path = _existing(db_dir / "database_workload.json")
    meta_path = db_dir / "tasks.json"
    task_meta = orjson.loads(meta_path.read_bytes()) if meta_path.exists() else {}
    workloads: list[tuple | None] = []
    for lineno, line in enumerate(_lines(wl_path), start=1):
        try:
            shash = str(orjson.loads(line)[0])
        except (orjson.JSONDecodeError, IndexError, TypeError) as exc:
            workloads.append(None)  # records pointing here are rejected below
            yield Reject(str(wl_path), lineno, "garbled", str(exc)[:120], _raw(line))
            continue
        meta = task_meta.get(shash, {})
        workloads.append((shash, meta.get("name", shash), meta.get("desc"), float(meta.get("weight", 1.0)),
                          ",".join(meta.get("networks", [])), network_weights_json(meta)))
    yield workloads


def read_records(lines, workloads: list, platform: str, path, first_lineno: int = 1,
                 whole_file: bool = True) -> Iterator[Record | Reject]:
    """Records (or Rejects naming `path` and the line) of tuning-record `lines`, numbered from
    `first_lineno`; a slice of a file (`whole_file=False`) may hold no record without being empty."""
    any_line = False
    for lineno, line in enumerate(lines, start=first_lineno):
        if not line or line.isspace():  # isspace stops at the first other byte; strip would copy the line
            continue
        any_line = True
        out = _parse_record(line, workloads, platform)
        if out.__class__ is Record:
            yield out
        else:
            yield Reject(str(path), lineno, out[0], out[1], _raw(line))
    if not any_line and whole_file:
        yield Reject(str(path), 0, "empty_file", "no tuning records", "")


def _parse_record(line, workloads, platform) -> Record | tuple[str, str]:
    try:
        obj = loads_lenient(line)
    except ValueError as exc:
        return "garbled", str(exc)[:120]
    try:
        wl_index, (trace, run_secs, _target, args_info) = obj[0], obj[1]
        if not isinstance(wl_index, int) or not isinstance(trace, list) or len(trace) != 2:
            raise TypeError("workload index / trace")
    except (IndexError, TypeError, ValueError) as exc:
        return "missing_field", f"{type(exc).__name__}: {exc}"[:120]
    if not 0 <= wl_index < len(workloads) or workloads[wl_index] is None:
        return "unknown_workload", f"workload index {wl_index}"
    reason = check_latencies(run_secs)
    if reason:
        return reason, f"run_secs={run_secs!r}"[:120]
    try:
        steps = trace_to_steps(trace)
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        return "missing_field", f"trace: {type(exc).__name__}: {exc}"[:120]
    if steps.__class__ is str:
        return "unknown_step_kind", steps.split(":", 1)[1]
    shash, name, desc, weight, networks, network_weights = workloads[wl_index]
    return Record(platform, name, desc or f"ms:{shash[:10]} {_describe_args(args_info)}", weight, networks,
                  network_weights, steps, [float(s) for s in run_secs], "metaschedule")


def network_weights_json(meta: dict) -> str:
    """{network: occurrences in it} of one tasks.json entry, as canonical JSON.

    An entry written before `weights` existed names its networks only; each then gets the
    task's total weight, which is exact for a task of one network.
    """
    weights = meta.get("weights")
    if not isinstance(weights, dict):
        weights = {n: meta.get("weight", 1.0) for n in meta.get("networks", [])}
    return orjson.dumps({str(n): float(w) for n, w in sorted(weights.items())}).decode()


def _existing(path: Path) -> Path:
    """The database file, or its .gz sibling (the bundled dataset ships compressed)."""
    if path.exists():
        return path
    gz = path.with_name(path.name + ".gz")
    return gz if gz.exists() else path


def _lines(path: Path):
    if not path.exists():
        raise FileNotFoundError(f"{path}: missing (a MetaSchedule database needs it)")
    return read_lines(path)


def _raw(line: bytes) -> str:
    return line[:2000].decode("utf-8", "replace")
