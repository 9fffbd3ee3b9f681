"""Which held-out tasks make the 10% strategies' network top-1 differ (issue 12; session 46, descriptive).

At 10% of the 512-a-task pool kmeans's subsets read 0.043 ± 0.021 network top-1 above RDU's on the
held-out networks while per-task top-1 differs by 0.014 (summary-pairwise-10-0-23.md), and the pool's
own training tasks read them level (pipelines/sampling cv_pool512_trainruns). Network top-1 is Tenset's
weighted score, sum(w·best) / sum(w·picked) over a network's tasks, so a network's 1/top1 is exactly
a sum of per-task terms w_t·picked_t / sum(w·best): the difference of two strategies' 1/top1 splits
into per-task contributions. This reads the models `pairwise.sh` trained (training dirs under
$WORK/pairwise, git-ignored) on the 32 held-out tasks and writes, per network and task: its weight,
its share of the network's best time, each strategy's mean picked/best over its runs, and the task's
contribution to the RDU − baseline difference of 1/top1, with its standard error over the subsets
(a subset's training runs averaged first, then RDU − baseline paired by subset seed). It changes no
setting; it only says where the gap lies. `--run-name`, `--train-seeds` and `--full` read another study's
models the same way (pipelines/sampling's Figure 7 study: one training run a subset).

    python pipelines/newplatform/poolsize/trainseeds/heavytasks.py --runs runs/poolsize-rounds6/pairwise \
        --data pipelines/newplatform/data/test.npz --ratio 0.1 --subsets 0-23 \
        --out pipelines/newplatform/poolsize/trainseeds/heavytasks-10.json \
        --markdown pipelines/newplatform/poolsize/trainseeds/heavytasks-10.md
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from tcl import metrics as M
from tcl.features import FeatureSet
from tcl.io import atomic_write_json, atomic_write_text
from tcl.models import load_model

STRATEGIES = ("rdu", "kmeans", "random")
# a run's model dir under --runs: pairwise.sh's names, a subset trained with the subset seed, then 1000-1002
RUN_NAME = "{strategy}-{ratio:g}-s{subset}-t{train}"
TRAIN_SEEDS = "{subset},1000,1001,1002"


def seeds(spec: str) -> list[int]:
    lo, _, hi = spec.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def picked_over_best(scores, fs: FeatureSet) -> dict[int, float]:
    """Per task: latency of the top-scored program / the task's best latency (1 = found the best)."""
    per_task = M.task_best_topk(scores, fs.latency, fs.task, ks=(1,))
    return {t: e[1] / e["best"] for t, e in per_task.items()}


def best_shares(fs: FeatureSet) -> dict[str, dict[int, tuple[float, float]]]:
    """network -> task -> (its weight in the network, w·best over the network's sum of w·best).

    A network's 1/top1 (tcl.metrics.top_k_scores) is sum over its tasks of share · picked/best."""
    per_task = M.task_best_topk(np.zeros(len(fs)), fs.latency, fs.task, ks=(1,))
    out = {}
    held_out = M.held_out_networks(fs)   # as tcl evaluate scores a test split: its held-out networks only
    for net, tids in M.network_tasks(fs.task_networks, per_task).items():
        if held_out and net not in held_out:
            continue
        w = {t: M.task_weight_in(t, net, fs.task_weight, fs.task_network_weights) for t in tids}
        best_total = sum(w[t] * per_task[t]["best"] for t in tids)
        out[net] = {t: (w[t], w[t] * per_task[t]["best"] / best_total) for t in tids}
    return out


def by_subset(runs: list[dict[int, float]], tasks, per_subset: int) -> dict[int, np.ndarray]:
    """Per task: the mean picked/best of each subset's `per_subset` training runs (in run_dirs's order)."""
    return {t: np.array([r[t] for r in runs]).reshape(-1, per_subset).mean(axis=1) for t in tasks}


def run_dirs(runs: Path, name: str, train_seeds: str, strategy: str, ratio: float, subsets: list[int]) -> list[Path]:
    """Each subset's training runs' model dirs: `name` formatted per subset and training seed."""
    dirs = [runs / name.format(strategy=strategy, ratio=ratio, subset=s, train=t)
            for s in subsets for t in train_seeds.format(subset=s).split(",")]
    missing = [d for d in dirs if not (d / "model.pt").exists()]
    if missing:
        raise SystemExit(f"{len(missing)} runs missing, e.g. {missing[0]} (run pairwise.sh first)")
    return dirs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=Path, required=True)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--ratio", type=float, default=0.1)
    ap.add_argument("--subsets", default="0-23")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--markdown", type=Path)
    ap.add_argument("--run-name", default=RUN_NAME, help="a run's model dir under --runs (format fields: "
                    "strategy, ratio, subset, train)")
    ap.add_argument("--train-seeds", default=TRAIN_SEEDS, help="comma-separated training seeds of a subset "
                    "(format field: subset)")
    ap.add_argument("--full", default="full-s*", help="glob under --runs of the whole pool's runs")
    args = ap.parse_args()
    per_subset = len(args.train_seeds.split(","))

    fs = FeatureSet.load(args.data)
    tasks = np.unique(fs.task).tolist()

    def scored(model_dir: Path) -> dict[int, float]:
        return picked_over_best(load_model(model_dir).predict_features(fs), fs)

    ratios, subset_means = {}, {}
    for strategy in STRATEGIES:
        runs = [scored(d) for d in run_dirs(args.runs, args.run_name, args.train_seeds, strategy, args.ratio,
                                            seeds(args.subsets))]
        subset_means[strategy] = by_subset(runs, tasks, per_subset)
        ratios[strategy] = {t: float(subset_means[strategy][t].mean()) for t in tasks}
        print(f"{strategy}: {len(runs)} runs", flush=True)
    full = [scored(d) for d in sorted(args.runs.glob(args.full))]
    ratios["full"] = {t: float(np.mean([r[t] for r in full])) for t in tasks}

    rows, inv_top1, net_diff = [], {}, {}
    for net, shares in best_shares(fs).items():   # networks in sorted order: the JSON is reproducible
        for t, (weight, share) in shares.items():
            row = {"network": net, "task": t, "desc": fs.task_desc[t] if t < len(fs.task_desc) else "",
                   "weight": weight, "best_share": share,
                   **{f"picked_{s}": ratios[s][t] for s in ratios}}
            # the task's term of the network's 1/top1 is share * picked/best
            for base in ("kmeans", "random", "full"):
                row[f"inv_top1_rdu_minus_{base}"] = share * (ratios["rdu"][t] - ratios[base][t])
            for base in ("kmeans", "random"):
                diff = subset_means["rdu"][t] - subset_means[base][t]
                row[f"inv_top1_rdu_minus_{base}_se"] = share * float(diff.std(ddof=1) / np.sqrt(len(diff)))
            rows.append(row)
        inv_top1[net] = {s: sum(share * ratios[s][t] for t, (_, share) in shares.items()) for s in ratios}
        net_diff[net] = {}   # RDU − baseline of the network's 1/top1, mean ± se over subsets
        for base in ("kmeans", "random"):
            d = sum(share * (subset_means["rdu"][t] - subset_means[base][t]) for t, (_, share) in shares.items())
            net_diff[net][base] = {"mean": float(d.mean()), "se": float(d.std(ddof=1) / np.sqrt(len(d)))}
    rows.sort(key=lambda r: (r["network"], -abs(r["inv_top1_rdu_minus_kmeans"])))
    result = {"ratio": args.ratio, "subsets": args.subsets, "runs_per_strategy": per_subset * len(seeds(args.subsets)),
              "full_runs": len(full), "tasks": rows, "inv_top1": inv_top1, "inv_top1_rdu_minus": net_diff}
    atomic_write_json(args.out, result)
    if args.markdown:
        atomic_write_text(args.markdown, markdown(result))


def markdown(result: dict) -> str:
    lines = [f"Held-out tasks behind the strategies' network top-1 at {result['ratio']:g} "
             f"(subsets {result['subsets']}, {result['runs_per_strategy']} runs a strategy, "
             f"whole pool {result['full_runs']} runs). picked/best: the latency of the model's top-1 "
             "program over the task's best, mean over runs; share: w·best over the network's sum; "
             "contribution: the task's term of RDU's 1/top1 minus the baseline's (positive: RDU worse there), "
             "± its standard error over subsets (paired by subset seed).", ""]
    for net, inv in sorted(result["inv_top1"].items()):
        lines.append(f"**{net}**: 1/top1 of the mean picked/best: " + ", ".join(
            f"{s} {v:.3f} (top1 {1 / v:.3f})" for s, v in inv.items()) + "; RDU − baseline " + ", ".join(
            f"{b} {d['mean']:+.3f} ± {d['se']:.3f}" for b, d in result["inv_top1_rdu_minus"][net].items()))
        lines += ["", "| task | weight | share | rdu | kmeans | random | whole pool | rdu − kmeans | rdu − random |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in (r for r in result["tasks"] if r["network"] == net):
            lines.append(f"| {r['task']} {r['desc'][:48]} | {r['weight']:g} | {r['best_share']:.3f} | "
                         f"{r['picked_rdu']:.3f} | {r['picked_kmeans']:.3f} | {r['picked_random']:.3f} | "
                         f"{r['picked_full']:.3f} | {r['inv_top1_rdu_minus_kmeans']:+.4f} ± "
                         f"{r['inv_top1_rdu_minus_kmeans_se']:.4f} | {r['inv_top1_rdu_minus_random']:+.4f} ± "
                         f"{r['inv_top1_rdu_minus_random_se']:.4f} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
