"""Reader for Tenset / Ansor measure records (one JSON object per line).

    {"i": [[workload_key, target, hw_params, host, layout_rewrite, ...], [[], steps]],
     "r": [costs, error_no, all_cost, timestamp], "v": "v0.6"}

Steps are lists headed by a code (`["SP", stage, iter, extent, [factors], inner_to_outer]`)
and are kept as written; `tcl.features` flattens nested arguments.
"""

from __future__ import annotations

import functools
from typing import Iterable, Iterator

import orjson

from . import ANSOR_STEP_KINDS, Record, Reject, check_latencies, loads_lenient

_KINDS = frozenset(ANSOR_STEP_KINDS)


@functools.lru_cache(maxsize=65536)
def _task_desc(workload_key: str, target: str) -> str:
    """'hash(shape args...) @ target-kind' from a workload key like '["hash", 1, 56, 56, 64]'."""
    try:
        key = orjson.loads(workload_key)
    except orjson.JSONDecodeError:
        key = [workload_key]
    name = str(key[0]) if key else "?"
    args = ",".join(str(a) for a in key[1:])
    kind = target.split()[0] if target else "?"
    return f"ansor:{name[:12]}({args}) @ {kind}"


def parse_line(line: bytes | str, platform: str) -> Record | tuple[str, str]:
    """One record, or (reason, detail) when the line is unusable."""
    try:
        obj = loads_lenient(line)
    except ValueError as exc:
        return "garbled", str(exc)[:120]
    try:
        inp, res = obj["i"], obj["r"]
        task_part, state_part = inp[0], inp[1]
        workload_key, target = task_part[0], task_part[1]
        raw_steps = state_part[1]
        costs, error_no = res[0], res[1]
        if not isinstance(workload_key, str) or not isinstance(raw_steps, list):
            raise TypeError("workload key / steps")
    except (KeyError, IndexError, TypeError) as exc:
        return "missing_field", f"{type(exc).__name__}: {exc}"[:120]
    if error_no != 0:
        return "measure_error", f"error_no={error_no}"
    reason = check_latencies(costs)
    if reason:
        return reason, f"costs={costs!r}"[:120]
    for s in raw_steps:
        if s.__class__ is not list or not s or s[0] not in _KINDS:
            return "unknown_step_kind", f"step {s!r}"[:120]
    # steps stay as Ansor wrote them (factor lists nested); the featurizer flattens each distinct step once
    return Record(platform, workload_key, _task_desc(workload_key, target), 1.0, "", "{}", raw_steps,
                  [float(c) for c in costs], "ansor")


def read_ansor_lines(path: str, lines: Iterable[bytes], platform: str,
                     first_line: int = 1) -> Iterator[Record | Reject]:
    for lineno, line in enumerate(lines, start=first_line):
        if not line or line.isspace():  # isspace stops at the first other byte; strip would copy the line
            continue
        out = parse_line(line, platform)
        if isinstance(out, Record):
            yield out
        else:
            yield Reject(path, lineno, out[0], out[1], line[:2000].decode("utf-8", "replace")
                         if isinstance(line, bytes) else line[:2000])
