"""The same programs measured on two occasions: how far do the labels agree? (the `pool-overlap` stage)

`pool512` measured each training task's first 512 programs of the seed-0 draw; `full` had measured
the first 128 of them two days earlier, on the same host. Joined on (task, program), this prints per
task and overall: the median latency ratio (second / first occasion), the Spearman correlation of
the two latencies within the task, and whether both occasions name the same fastest program (the
pick that top-1 scores). Run from the repository root:

    python pipelines/newplatform/overlap.py pipelines/newplatform/data/full.parquet \
        pipelines/newplatform/data/pool512.parquet --out pipelines/newplatform/poolsize/overlap.json
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import numpy as np

from tcl.collect.stats import task_pair
from tcl.io import atomic_write_json
from tcl.records.ingest import read_records


def latencies(path: Path) -> dict[tuple[str, str], float]:
    """(task, program id) -> latency in seconds, of a records file."""
    table = read_records(path).select(["task_desc", "program_id", "latency"]).to_pydict()
    return {(t, p): float(lat) for t, p, lat in zip(table["task_desc"], table["program_id"], table["latency"])}


def compare(first: dict, second: dict) -> dict:
    """Per task and overall agreement of the programs both occasions measured (the others ignored);
    each task's figures are tcl.collect.stats.task_pair's (`tcl dataset stats` between platforms)."""
    by_task: dict[str, tuple[dict, dict]] = {}
    for (task, program), lat in first.items():
        if (task, program) in second:
            a, b = by_task.setdefault(task, ({}, {}))
            a[program], b[program] = lat, second[(task, program)]
    tasks = []
    for task, (a, b) in sorted(by_task.items()):
        pair = task_pair(a, b)
        spearman = pair["spearman"]  # None under stats.MIN_COMMON programs
        tasks.append({"task": task, "programs": pair["common"],
                      "median_ratio": float(np.median([b[p] / a[p] for p in a])),
                      "spearman": float("nan") if spearman is None else spearman,
                      "same_fastest": not pair["best_changes"]})
    ranked = [t["spearman"] for t in tasks if not np.isnan(t["spearman"])]
    return {"programs": sum(t["programs"] for t in tasks), "tasks": len(tasks),
            "median_ratio": statistics.median(t["median_ratio"] for t in tasks) if tasks else None,
            "mean_spearman": statistics.fmean(ranked) if ranked else None,
            "same_fastest": sum(t["same_fastest"] for t in tasks), "per_task": tasks}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("first", type=Path, help="records (Parquet) of the first occasion")
    ap.add_argument("second", type=Path, help="records (Parquet) of the second occasion")
    ap.add_argument("--out", type=Path, default=None, help="write the comparison as JSON")
    a = ap.parse_args()
    result = compare(latencies(a.first), latencies(a.second))
    if not result["tasks"]:
        raise SystemExit(f"{a.first} and {a.second} share no (task, program): nothing measured twice")
    for t in result["per_task"]:
        print(f"{t['task'][:48]:48} {t['programs']:4d}  ratio {t['median_ratio']:.3f}  "
              f"spearman {t['spearman']:.3f}  same fastest {'yes' if t['same_fastest'] else 'no'}")
    print(f"{result['programs']} programs of {result['tasks']} tasks measured twice: median ratio "
          f"{result['median_ratio']:.3f}, mean Spearman {result['mean_spearman']:.3f}, the same fastest "
          f"program in {result['same_fastest']} of {result['tasks']} tasks")
    if a.out:
        atomic_write_json(a.out, result)


if __name__ == "__main__":
    main()
