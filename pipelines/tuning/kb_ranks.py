"""Where a KB ranks the programs the tuning runs measured: per task, every run's database of a
study's run folder (`<task>/<model>-seed<S>/`) read back (tcl ingest -> tcl featurize), all runs'
programs pooled and scored by one KB, and for each run the mean percentile of its programs in the
KB's ranking (0: the KB's top) and its best latency; then the pool's fastest programs: which runs
measured them and where the KB ranks them. It says whether a search steered by the KB could have
proposed the schedules a peer found (a KB that ranks them low never lets its search near them).

    TCL_HARDWARE=pipelines/newplatform/hardware.json python pipelines/tuning/kb_ranks.py \\
        pipelines/newplatform/tuning/runs pipelines/newplatform/tuning/runs-next \\
        --model pipelines/newplatform/models/transfer-rdu-s0 --platform xeon-avx512-t2

Reads only what the runs measured (labels of the pool), so it is an explanation after the fact,
not a choice: nothing here feeds back into the runs.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

from tcl.features import featurize_file
from tcl.io import atomic_write_text
from tcl.models import load_model
from tcl.records.ingest import ingest


def run_programs(run_dir: Path, platform: str, work: Path, max_len: int):
    """(x, mask, latency) of one run's measured programs."""
    records = work / f"{run_dir.parent.name}-{run_dir.name}.parquet"
    ingest(run_dir, platform, records)
    fs = featurize_file(records, records.with_suffix(".npz"), max_len)
    return fs.x, fs.mask, np.asarray(fs.latency, np.float64)


def task_ranks(task_dir: Path, model, platform: str, work: Path, top: int) -> dict:
    runs = sorted(p for p in task_dir.iterdir() if (p / "database_tuning_record.json").exists())
    parts = [run_programs(r, platform, work, int(model.feature_meta["max_len"])) for r in runs]
    x = np.concatenate([p[0] for p in parts])
    mask = np.concatenate([p[1] for p in parts])
    latency = np.concatenate([p[2] for p in parts])
    run_of = np.concatenate([np.full(len(p[2]), i) for i, p in enumerate(parts)])
    score = model.predict(x, mask)
    rank = np.empty(len(score))
    rank[np.argsort(-score, kind="stable")] = np.arange(len(score))
    percentile = rank / max(len(score) - 1, 1)
    fastest = np.argsort(latency, kind="stable")[:top]
    return {
        "task": task_dir.name, "programs": len(score),
        "spearman": float(spearmanr(score, -latency).correlation),
        "runs": [{"run": r.name, "best_us": 1e6 * float(latency[run_of == i].min()),
                  "mean_percentile": float(percentile[run_of == i].mean())} for i, r in enumerate(runs)],
        "fastest_runs": sorted({runs[i].name for i in run_of[fastest]}),
        "fastest_percentile": [float(percentile[i]) for i in fastest],
    }


def markdown(rows: list[dict], top: int) -> str:
    lines = ["| task | programs | Spearman (KB score, speed) | run: best µs, mean percentile of its programs "
             f"| the {top} fastest: measured by | their KB percentile: median [min, max] |",
             "|---|---:|---:|---|---|---|"]
    for r in rows:
        runs = "; ".join(f"{x['run']}: {x['best_us']:.1f}, {x['mean_percentile']:.2f}" for x in r["runs"])
        p = r["fastest_percentile"]
        lines.append(f"| {r['task']} | {r['programs']} | {r['spearman']:.3f} | {runs} | "
                     f"{', '.join(r['fastest_runs'])} | {np.median(p):.2f} [{min(p):.2f}, {max(p):.2f}] |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("roots", nargs="+", type=Path, help="study run folders (<task>/<model>-seed<S>/)")
    ap.add_argument("--model", required=True, help="the KB: a checkpoint or training directory")
    ap.add_argument("--platform", required=True, help="the platform the runs measured")
    ap.add_argument("--top", type=int, default=15, help="the pool's fastest programs to locate")
    ap.add_argument("--markdown", type=Path, default=None)
    args = ap.parse_args()
    model = load_model(args.model)
    with tempfile.TemporaryDirectory() as tmp:
        rows = [task_ranks(task_dir, model, args.platform, Path(tmp), args.top)
                for root in args.roots for task_dir in sorted(p for p in root.iterdir() if p.is_dir())]
    text = markdown(rows, args.top)
    print(text, end="")
    if args.markdown:
        atomic_write_text(args.markdown, text)


if __name__ == "__main__":
    main()
