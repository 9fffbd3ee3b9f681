"""Figures of the bundled dataset (`tcl dataset stats`): counts per platform, and how much the
platforms disagree on matched programs.

Everything is read through the project's reader (`tcl.records.metaschedule.read_database`), so a
program here is exactly what ingest and the featurizer see: valid records give latencies and
program ids (`steps_id(steps_json(steps))`), rejected records are counted by reason, and a
failed build/run (run_secs 1e10, reason `failed_run`) is charged to its task through the
workload index at the head of its line.

Between two platforms, only programs valid on both are compared, task by task:

- `spearman`: rank correlation of the latencies (tasks with >= 3 common programs);
- `best_changes`: the fastest program on A is not the fastest on B;
- `rank_a_best_on_b`: rank (1 = fastest) on B of A's fastest program, and the other way round;
- `slowdown_a_best_on_b`: latency on B of A's fastest program / B's fastest latency — what a
  model that ranked perfectly for A would lose on B by picking A's best.

Per platform, `repeat_spread` summarises (max - min) / mean over the repeats of each stored
measurement: noise visible without measuring again (`tcl dataset noise` measures the rest).
Two traces whose steps are identical are one program for the featurizer; the faster is kept.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import statistics
from collections import Counter
from itertools import combinations
from pathlib import Path

import orjson

from ..hardware import get_platform
from ..records import Record, steps_id, steps_json
from ..records.metaschedule import read_database

_WL_INDEX = re.compile(rb"^\s*\[\s*(\d+)\s*,")
MIN_COMMON = 3  # programs two platforms must share in a task for a rank correlation


def _open(path: Path):
    if path.exists():
        return open(path, "rb")
    gz = path.with_name(path.name + ".gz")
    if gz.exists():
        return gzip.open(gz, "rb")
    raise FileNotFoundError(f"{path}(.gz): missing")


def read_workload_hashes(db_dir: Path) -> list[str]:
    with _open(db_dir / "database_workload.json") as f:
        return [str(orjson.loads(line)[0]) for line in f if line.strip()]


def read_task_meta(db_dir: Path) -> dict:
    path = db_dir / "tasks.json"
    return json.loads(path.read_text()) if path.exists() else {}


def load_platform(db_dir: str | Path, platform: str) -> dict:
    """One platform's database: {task: {program_id: latency}}, failures per task, rejects."""
    db_dir = Path(db_dir)
    meta = read_task_meta(db_dir)
    hashes = read_workload_hashes(db_dir)
    names = [meta.get(h, {}).get("name", h) for h in hashes]
    valid: dict[str, dict[str, float]] = {}
    failed: Counter = Counter()
    rejected: Counter = Counter()
    n_valid = duplicates = 0
    spread = []  # (max - min) / mean of the repeats of one measurement
    for item in read_database(db_dir, platform):
        if isinstance(item, Record):
            n_valid += 1
            if len(item.latencies) > 1:
                spread.append((max(item.latencies) - min(item.latencies)) / item.latency)
            programs = valid.setdefault(item.task_id, {})
            pid = steps_id(steps_json(item.steps))
            if pid in programs:  # two traces with the same steps: one program for the featurizer
                duplicates += 1
                programs[pid] = min(programs[pid], item.latency)
            else:
                programs[pid] = item.latency
            continue
        rejected[item.reason] += 1
        if item.reason == "failed_run":
            m = _WL_INDEX.match(item.raw.encode())
            if m and int(m.group(1)) < len(names):
                failed[names[int(m.group(1))]] += 1
    tasks = {meta[h]["name"]: meta[h] for h in hashes if h in meta}
    for name in set(valid) | set(failed):
        tasks.setdefault(name, {"name": name, "desc": name, "kind": "?", "weight": 1, "networks": []})
    settings_path = db_dir / "collect.json"
    collect = json.loads(settings_path.read_text()) if settings_path.exists() else {}
    return {"platform": platform, "valid": valid, "failed": dict(failed), "rejected": dict(rejected),
            "records_valid": n_valid, "duplicate_steps": duplicates, "repeat_spread": spread, "tasks": tasks, "collect": collect}


def _ranks(values: list[float]) -> list[float]:
    """1-based ranks, ties get their mean rank."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(a: list[float], b: list[float]) -> float | None:
    if len(a) < 2:
        return None
    ra, rb = _ranks(a), _ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va = sum((x - ma) ** 2 for x in ra)
    vb = sum((y - mb) ** 2 for y in rb)
    return cov / math.sqrt(va * vb) if va > 0 and vb > 0 else None


def _r(x, digits: int = 4):
    """Round for a stable, readable JSON (None stays None)."""
    if x is None:
        return None
    if isinstance(x, float):
        if x == 0 or not math.isfinite(x):
            return x
        return float(f"{x:.{digits}g}")
    return x


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def _geomean(xs):
    xs = [x for x in xs if x is not None and x > 0]
    return math.exp(statistics.fmean(math.log(x) for x in xs)) if xs else None


def _spread_summary(spread: list[float]) -> dict:
    """Within-measurement noise: spread of the repeats of each stored measurement."""
    if not spread:
        return {"median": None, "p90": None, "over_10pct": None}
    xs = sorted(spread)
    return {"median": _r(_median(xs)), "p90": _r(xs[int(0.9 * (len(xs) - 1))]),
            "over_10pct": _r(sum(x > 0.10 for x in xs) / len(xs))}


def platform_stats(d: dict) -> dict:
    valid, failed = d["valid"], d["failed"]
    n_valid = d["records_valid"]
    n_failed = sum(failed.values())
    n_records = n_valid + sum(d["rejected"].values())
    tasks = sorted(set(valid) | set(failed))
    per_task = [len(valid.get(t, {})) + failed.get(t, 0) for t in tasks]
    per_task_valid = [len(valid.get(t, {})) for t in tasks]  # distinct programs
    lats = [x for v in valid.values() for x in v.values()]
    p = get_platform(d["platform"])
    return {
        "platform": d["platform"],
        "family": p.family,
        "target": d["collect"].get("target", p.target),
        "threads": d["collect"].get("threads", p.threads),
        "restricted": p.restricted,
        "records": n_records,
        "valid": n_valid,
        "distinct_valid_programs": sum(len(v) for v in valid.values()),
        "duplicate_steps": d["duplicate_steps"],
        "failed": n_failed,
        "failure_rate": _r(n_failed / n_records if n_records else None),
        "rejected": dict(sorted(d["rejected"].items())),
        "tasks": len(tasks),
        "programs_per_task": {"min": min(per_task, default=0), "median": _r(_median(per_task)),
                              "max": max(per_task, default=0)},
        "valid_per_task": {"min": min(per_task_valid, default=0), "median": _r(_median(per_task_valid)),
                           "max": max(per_task_valid, default=0)},
        "latency_s": {"min": _r(min(lats, default=None)), "median": _r(_median(lats)),
                      "max": _r(max(lats, default=None))},
        "repeat_spread": _spread_summary(d["repeat_spread"]),
        "per_task": {t: {"valid": len(valid.get(t, {})), "failed": failed.get(t, 0),
                         "best_s": _r(min(valid[t].values())) if valid.get(t) else None}
                     for t in tasks},
    }


def task_pair(a: dict[str, float], b: dict[str, float]) -> dict | None:
    """One task's programs measured twice (two platforms, or two occasions of one): program id ->
    latency on each; the module docstring's figures over the programs both hold (None: none)."""
    common = sorted(set(a) & set(b))
    if not common:
        return None
    la, lb = [a[p] for p in common], [b[p] for p in common]
    best_a, best_b = min(common, key=a.__getitem__), min(common, key=b.__getitem__)
    rank_a, rank_b = _ranks(la), _ranks(lb)
    pos = {p: i for i, p in enumerate(common)}
    return {
        "common": len(common),
        "spearman": spearman(la, lb) if len(common) >= MIN_COMMON else None,
        "best_changes": best_a != best_b,
        "rank_a_best_on_b": rank_b[pos[best_a]],
        "rank_b_best_on_a": rank_a[pos[best_b]],
        "slowdown_a_best_on_b": b[best_a] / b[best_b],
        "slowdown_b_best_on_a": a[best_b] / a[best_a],
    }


def pair_stats(da: dict, db: dict, kinds: dict[str, str]) -> dict:
    per_task = {}
    for t in sorted(set(da["valid"]) & set(db["valid"])):
        row = task_pair(da["valid"][t], db["valid"][t])
        if row is not None:
            per_task[t] = row
    rows = list(per_task.values())
    by_kind = {}
    for kind in sorted({kinds.get(t, "?") for t in per_task}):
        ks = [r for t, r in per_task.items() if kinds.get(t, "?") == kind]
        by_kind[kind] = {"tasks": len(ks), "median_spearman": _r(_median(r["spearman"] for r in ks)),
                         "best_changes": sum(r["best_changes"] for r in ks)}
    fa, fb = get_platform(da["platform"]).family, get_platform(db["platform"]).family
    return {
        "a": da["platform"], "b": db["platform"], "same_family": fa == fb,
        "tasks": len(rows),
        "matched_valid_programs": sum(r["common"] for r in rows),
        "median_spearman": _r(_median(r["spearman"] for r in rows)),
        "min_spearman": _r(min((r["spearman"] for r in rows if r["spearman"] is not None), default=None)),
        "best_changes": sum(r["best_changes"] for r in rows),
        "mean_rank_a_best_on_b": _r(_mean(r["rank_a_best_on_b"] for r in rows)),
        "mean_rank_b_best_on_a": _r(_mean(r["rank_b_best_on_a"] for r in rows)),
        "geomean_slowdown_a_best_on_b": _r(_geomean(r["slowdown_a_best_on_b"] for r in rows)),
        "geomean_slowdown_b_best_on_a": _r(_geomean(r["slowdown_b_best_on_a"] for r in rows)),
        "by_kind": by_kind,
        "per_task": {t: {k: _r(v) if isinstance(v, float) else v for k, v in r.items()}
                     for t, r in per_task.items()},
    }


def dataset_stats(raw_root: str | Path, platforms: list[str] | None = None) -> dict:
    """All figures of a bundled dataset root (`data/raw`): one JSON-ready dict."""
    raw_root = Path(raw_root)
    if platforms is None:
        platforms = sorted(p.name for p in raw_root.iterdir()
                           if p.is_dir() and any(p.glob("database_tuning_record.json*")))
    if not platforms:
        raise FileNotFoundError(f"{raw_root}: no platform databases under it")
    data = {p: load_platform(raw_root / p, p) for p in platforms}
    tasks: dict[str, dict] = {}
    for d in data.values():
        for name, m in d["tasks"].items():
            tasks.setdefault(name, m)
    kinds = {t: m.get("kind", "?") for t, m in tasks.items()}
    pairs = [pair_stats(data[a], data[b], kinds) for a, b in combinations(platforms, 2)]
    families: dict[str, list[str]] = {}
    for p in platforms:
        families.setdefault(get_platform(p).family, []).append(p)
    within = [x["median_spearman"] for x in pairs if x["same_family"]]
    across = [x["median_spearman"] for x in pairs if not x["same_family"]]
    per_platform = {p: platform_stats(d) for p, d in data.items()}
    return {
        "raw": str(raw_root),
        "platforms": platforms,
        "totals": {
            "records": sum(s["records"] for s in per_platform.values()),
            "valid": sum(s["valid"] for s in per_platform.values()),
            "failed": sum(s["failed"] for s in per_platform.values()),
            "tasks": len(tasks),
        },
        "tasks": {t: {"desc": m.get("desc", t), "kind": m.get("kind", "?"), "weight": m.get("weight", 1),
                      "weights": m.get("weights", {}), "networks": m.get("networks", [])}
                  for t, m in sorted(tasks.items())},
        "per_platform": per_platform,
        "pairs": pairs,
        "families": {
            "members": families,
            "median_spearman_within": _r(_median(within)),
            "median_spearman_across": _r(_median(across)),
            "pairs_within": sum(x["same_family"] for x in pairs),
            "pairs_across": sum(not x["same_family"] for x in pairs),
        },
    }


def noise_summary(reports: list[dict]) -> dict:
    """platform -> re-measure noise (`tcl dataset noise` reports): median and p90 of |new-old|/old."""
    out = {}
    for r in sorted(reports, key=lambda r: r.get("measured_at", "")):  # the latest report wins
        pct = r.get("percentiles_rel_diff") or {}
        out[r["platform"]] = {"median": r.get("median_rel_diff"), "p90": pct.get("p90"),
                              "programs": r.get("measured"), "measured_at": r.get("measured_at")}
    return out


def format_stats(s: dict) -> str:
    """A readable summary of `dataset_stats`."""
    lines = [f"{s['raw']}: {len(s['platforms'])} platforms, {s['totals']['tasks']} tasks, "
             f"{s['totals']['records']} records ({s['totals']['failed']} failed)", ""]
    lines.append(f"{'platform':18} {'family':16} {'records':>7} {'valid':>6} {'failed':>6} {'fail%':>6} "
                 f"{'tasks':>5} {'prog/task min/med':>17} {'latency range (s)':>22} {'noise med/p90':>14}")
    for p, x in s["per_platform"].items():
        ppt = f"{x['programs_per_task']['min']}/{x['programs_per_task']['median']:g}"
        lat = f"{x['latency_s']['min']:.3g} .. {x['latency_s']['max']:.3g}" if x["valid"] else "-"
        n = (s.get("noise") or {}).get(p)
        noise = f"{n['median']:.1%}/{n['p90']:.1%}" if n and n["median"] is not None else "-"
        lines.append(f"{p:18} {x['family'][:16]:16} {x['records']:>7} {x['valid']:>6} {x['failed']:>6} "
                     f"{100 * (x['failure_rate'] or 0):>5.1f}% {x['tasks']:>5} {ppt:>17} {lat:>22} {noise:>14}")
    lines += ["", f"{'pair (matched valid programs)':40} {'tasks':>5} {'med rho':>7} {'best chg':>8} "
                  f"{'rank A*@B':>9} {'rank B*@A':>9} {'slow A*@B':>9}"]
    for x in s["pairs"]:
        name = f"{x['a']} ~ {x['b']}" + (" (fam)" if x["same_family"] else "")
        rho = "-" if x["median_spearman"] is None else f"{x['median_spearman']:.3f}"
        lines.append(f"{name:40} {x['tasks']:>5} {rho:>7} {x['best_changes']:>4}/{x['tasks']:<3} "
                     f"{x['mean_rank_a_best_on_b'] or 0:>9.2f} {x['mean_rank_b_best_on_a'] or 0:>9.2f} "
                     f"{x['geomean_slowdown_a_best_on_b'] or 0:>9.3f}")
    f = s["families"]
    if s.get("noise"):
        lines += ["", "noise: |new - old| / old of re-measured programs (`tcl dataset noise`), median / p90"]
    lines += ["", f"median Spearman within a family: {f['median_spearman_within']} ({f['pairs_within']} pairs); "
                  f"across families: {f['median_spearman_across']} ({f['pairs_across']} pairs)"]
    return "\n".join(lines)
