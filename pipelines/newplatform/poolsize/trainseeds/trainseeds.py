"""The training-seed decomposition of trainseeds/run.sh: how much of a strategy's spread over seeds is
the subset it chose and how much the training run on it, and the strategies compared on the subsets'
means over their training runs. Run from the repository root:

    T=pipelines/newplatform/poolsize/trainseeds
    python $T/trainseeds.py --summary $T/summary-10.json --markdown $T/summary-10.md      # run.sh's runs
    python $T/trainseeds.py --results $T/results-pairwise --rounds6 '' --whole-pool $T/results-pairwise \
        --whole-pool-baseline pipelines/newplatform/poolsize/rounds6/results ...           # pairwise.sh's

Every subset's runs: <results>/<label>-s<subset seed>-t<training seed>.json and rounds6's
<label>-s<seed>.json (training seed = subset seed; the first run). Only subsets with every training run
are read."""

from __future__ import annotations

import argparse
import json
import re
import statistics
from collections import defaultdict
from pathlib import Path

from tcl.io import atomic_write_json, atomic_write_text

HERE = Path(__file__).resolve().parent
ROUNDS6 = HERE.parent / "rounds6" / "results"
METRICS = {"top1": "network top-1", "task_top1": "per-task top-1"}
NAME = re.compile(r"(?P<label>.+)-s(?P<seed>\d+)(?:-t(?P<train>\d+))?\.json$")


def load(results: Path, rounds6: Path | None, labels: tuple[str, ...]) -> dict[str, dict[int, list[dict]]]:
    """label -> subset seed -> its runs' evaluations (rounds6's first, then by training seed)."""
    runs: dict[str, dict[int, list[tuple[int, dict]]]] = defaultdict(lambda: defaultdict(list))
    for folder, own in ((rounds6, False), (results, True)):
        if folder is None:
            continue
        for path in sorted(folder.glob("*.json")):
            m = NAME.match(path.name)
            if not m or m["label"] not in labels or (m["train"] is not None) != own:
                continue
            order = int(m["train"]) if own else -1   # rounds6's run first
            runs[m["label"]][int(m["seed"])].append((order, json.loads(path.read_text())))
    return {label: {seed: [r for _, r in sorted(rs, key=lambda t: t[0])] for seed, rs in by_seed.items()}
            for label, by_seed in runs.items()}


def complete(runs: dict[str, dict[int, list[dict]]]) -> dict[str, dict[int, list[dict]]]:
    """Only the subsets with as many runs as the most any subset has, and seeds every label has."""
    n = max(len(rs) for by_seed in runs.values() for rs in by_seed.values())
    seeds = set.intersection(*({s for s, rs in by_seed.items() if len(rs) == n} for by_seed in runs.values()))
    return {label: {s: by_seed[s] for s in sorted(seeds)} for label, by_seed in runs.items()}


def standard_error(values) -> float:
    values = list(values)
    return statistics.stdev(values) / len(values) ** 0.5


def decompose(by_seed: dict[int, list[dict]], metric: str) -> dict:
    """Within-subset (training) and between-subset variance of one run's metric."""
    values = [[r[metric] for r in rs] for rs in by_seed.values()]
    n = len(values[0])
    within = statistics.fmean(statistics.variance(v) for v in values)
    means = [statistics.fmean(v) for v in values]
    subset = max(0.0, statistics.variance(means) - within / n)
    return {"subsets": len(values), "runs_per_subset": n, "mean": statistics.fmean(means),
            "sd_training": within ** 0.5, "sd_subset": subset ** 0.5,
            "training_share": within / (within + subset) if within + subset > 0 else float("nan")}


def paired(runs: dict[str, dict[int, list[dict]]], label: str, peer: str, metric: str) -> dict:
    """label - peer on the subsets' means over their training runs, paired by subset seed.

    Every subset's k-th run has the same training seed (bar the first, the subset's own seed), so the
    model's initial weights are shared across subsets: their effect on the difference does not average
    out over subsets. Beside the standard error over subsets, the one over the training-seed columns
    (the difference averaged over subsets for each training run) says how far the initial weights move it.
    """
    diffs = [[a[metric] - b[metric] for a, b in zip(runs[label][s], runs[peer][s])] for s in runs[label]]
    by_subset = [statistics.fmean(d) for d in diffs]
    by_column = [statistics.fmean(col) for col in zip(*diffs)]
    return {"pair": f"{label} − {peer}", "metric": metric, "subsets": len(diffs), "mean": statistics.fmean(by_subset),
            "se": standard_error(by_subset), "above": sum(d > 0 for d in by_subset),
            "by_training_run": by_column, "se_training_runs": standard_error(by_column)}


def whole_pool(folder: Path, metric: str) -> dict[int, float]:
    """seed -> the whole pool's run (one data set: their spread is the training seed's alone)."""
    return {int(NAME.match(p.name)["seed"]): json.loads(p.read_text())[metric] for p in folder.glob("full-s*.json")}


def whole_pool_row(folder: Path, metric: str, baseline: Path | None) -> dict:
    """The whole pool's mean and sd over seeds; with a baseline folder, this − baseline paired by seed."""
    runs = whole_pool(folder, metric)
    row = {"label": "full", "metric": metric, "runs": len(runs), "mean": statistics.fmean(runs.values()),
           "sd_training": statistics.stdev(runs.values())}
    if baseline is not None:
        base = whole_pool(baseline, metric)
        seeds = sorted(set(runs) & set(base))
        diffs = [runs[s] - base[s] for s in seeds]
        row["against_baseline"] = {"seeds": seeds, "mean": statistics.fmean(diffs),
                                   "se": standard_error(diffs),
                                   "sd_baseline": statistics.stdev(base[s] for s in seeds),
                                   "sd_here": statistics.stdev(runs[s] for s in seeds)}
    return row


def markdown(decomposition: list[dict], pairs: list[dict], full: list[dict]) -> str:
    lines = ["| strategy | metric | subsets × runs | mean | sd from training | sd from the subset | training's share of a run's variance |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for d in decomposition:
        lines.append(f"| {d['label']} | {METRICS[d['metric']]} | {d['subsets']} × {d['runs_per_subset']} | {d['mean']:.3f} "
                     f"| {d['sd_training']:.3f} | {d['sd_subset']:.3f} | {d['training_share']:.2f} |")
    for f in full:
        lines.append(f"| the whole pool (one data set) | {METRICS[f['metric']]} | 1 × {f['runs']} | {f['mean']:.3f} "
                     f"| {f['sd_training']:.3f} | | 1 |")
    for f in full:
        if "against_baseline" in f:
            b = f["against_baseline"]
            lines.append(f"\nThe whole pool against the baseline runs, {METRICS[f['metric']]}, paired by seed "
                         f"({len(b['seeds'])} seeds): {b['mean']:+.3f} ± {b['se']:.3f}; sd over these seeds "
                         f"{b['sd_here']:.3f} here, {b['sd_baseline']:.3f} there.")
    lines += ["", "| pair (subset means, paired by subset seed) | metric | subsets | mean difference | ± se over subsets "
              "| subsets above | by training run (subset's seed, 1000, 1001, 1002) | ± se over training runs |",
              "|---|---|---:|---:|---:|---:|---|---:|"]
    for p in pairs:
        columns = ", ".join(f"{d:+.3f}" for d in p["by_training_run"])
        lines.append(f"| {p['pair']} | {METRICS[p['metric']]} | {p['subsets']} | {p['mean']:+.3f} | {p['se']:.3f} "
                     f"| {p['above']} of {p['subsets']} | {columns} | {p['se_training_runs']:.3f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=HERE / "results")
    ap.add_argument("--rounds6", default=str(ROUNDS6), help="'' : every run is in --results")
    ap.add_argument("--whole-pool", type=Path, default=ROUNDS6, help="the folder of the whole pool's full-s<seed>.json")
    ap.add_argument("--whole-pool-baseline", type=Path, default=None,
                    help="another folder of full-s<seed>.json: the whole pool paired by seed against it")
    ap.add_argument("--labels", default="rdu-0.1,random-0.1,kmeans-0.1", help="the first is paired with the others")
    ap.add_argument("--summary", type=Path, default=HERE / "summary.json")
    ap.add_argument("--markdown", type=Path, default=HERE / "summary.md")
    args = ap.parse_args()
    labels = tuple(args.labels.split(","))
    runs = complete(load(args.results, Path(args.rounds6) if args.rounds6 else None, labels))
    decomposition = [{"label": label, "metric": m, **decompose(runs[label], m)} for label in labels for m in METRICS]
    pairs = [paired(runs, labels[0], peer, m) for peer in labels[1:] for m in METRICS]
    full = [whole_pool_row(args.whole_pool, m, args.whole_pool_baseline) for m in METRICS]
    atomic_write_json(args.summary, {"decomposition": decomposition, "pairs": pairs, "whole_pool": full,
                                     "subset_seeds": sorted(runs[labels[0]])})
    text = markdown(decomposition, pairs, full)
    atomic_write_text(args.markdown, text)
    print(text)


if __name__ == "__main__":
    main()
