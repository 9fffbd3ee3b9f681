"""The new-platform study's table and plot: every run's `tcl evaluate` JSON under results/, grouped
by its label, mean ± sd over seeds (sample sd; a zero-shot KB is one run). Run from the repository
root (the `summary` stage of pipelines/newplatform/dvc.yaml; the `resample-summary` stage names
its own folders with the options)."""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from tcl.io import atomic_write_json, atomic_write_text  # noqa: E402

HERE = Path(__file__).resolve().parent
METRICS = ("top1", "top5", "task_top1", "task_top5", "pairwise")
# the table's order: what a user has before measuring, then the 10% runs, then the 100% reference
ORDER = ("zeroshot-amd-zen4-avx512", "zeroshot-x86-avx2", "zeroshot-x86-sse",
         "scratch-rdu", "scratch-random", "finetune-rdu", "finetune-random", "mtl-rdu", "mtl-random",
         "transfer-rdu", "transfer-random", "transfer-pool-rdu", "transfer-pool-random", "scratch-full", "mlp-tenset-full")
# a label's last word names what it trained on; a zero-shot KB's names its family
PROGRAMS = {"rdu": "10% (RDU)", "random": "10% (random)", "full": "100%"}
# the pool-size study's labels: STRATEGY-RATIO (a KB from scratch, the main job's training),
# STRATEGY-RATIO-steps (equal optimizer steps), STRATEGY-RATIO-transfer (`tcl transfer`), full
POOL_STRATEGIES = ("rdu", "random", "kmeans", "uncertainty", "balto")
# (a suffix also names a sampler variant: rounds6, RDU with 6 rounds, poolsize/rounds6/run.sh)
POOL_TRAININGS = {"": "", "steps": ", equal steps", "transfer": ", tcl transfer", "rounds6": ", 6 rounds"}


def pool_label(label: str) -> tuple[str, float, str] | None:
    """(strategy, ratio, training) of a pool-size study label, else None."""
    words = label.split("-")
    training = words.pop() if words[-1] in POOL_TRAININGS else ""
    if len(words) != 2 or words[0] not in POOL_STRATEGIES:
        return None
    try:
        return words[0], float(words[1]), training
    except ValueError:
        return None


def trained_on(label: str) -> str:
    pooled = pool_label(label)
    if pooled:
        strategy, ratio, training = pooled
        return f"{ratio:.0%} ({strategy}{POOL_TRAININGS[training]})"
    return PROGRAMS.get(label.rsplit("-", 1)[-1], "none")


def order(label: str) -> tuple:
    """The table's order: ORDER's labels, then the pool-size study's by ratio, training, strategy."""
    if label in ORDER:
        return (0, ORDER.index(label))
    pooled = pool_label(label)
    if pooled:
        strategy, ratio, training = pooled
        return (1, ratio, list(POOL_TRAININGS).index(training), POOL_STRATEGIES.index(strategy))
    return (2, label)


def load_runs(results: Path) -> dict[str, list[dict]]:
    runs: dict[str, list[dict]] = {}
    for path in sorted(results.glob("*.json")):
        r = json.loads(path.read_text())
        runs.setdefault(r["label"], []).append(r)
    return runs


def mean_sd(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def summarize(runs: dict[str, list[dict]], data_column: str | None = None) -> list[dict]:
    """One row per label; `data_column` names the data of every row (else read off the label)."""
    rows = []
    for label in sorted(runs, key=order):
        group = runs[label]
        data = data_column or trained_on(label)
        row = {"label": label, "runs": len(group), "data": data,
               "networks": sorted(group[0]["per_network"])}
        for m in METRICS:
            row[m], row[f"{m}_sd"] = mean_sd([float(r[m]) for r in group])
        for net in row["networks"]:
            row[f"{net}_top1"], row[f"{net}_top1_sd"] = mean_sd([float(r["per_network"][net]["top1"]) for r in group])
        rows.append(row)
    return rows


def runs_by_seed(results: Path) -> dict[tuple[str, int], dict]:
    """Every run of results/<label>-s<seed>.json by (label, seed)."""
    runs = {}
    for path in sorted(results.glob("*.json")):
        seeded = re.fullmatch(r".+-s(\d+)", path.stem)
        if seeded:
            r = json.loads(path.read_text())
            runs[(r["label"], int(seeded.group(1)))] = r
    return runs


def paired(runs: dict[tuple[str, int], dict], strategy: str) -> list[dict]:
    """`strategy` minus every other pool-size label of its ratio and training, and minus `full`, on the
    same seed (a seed fixes the model's initial weights and batches, and the sampler's draws, so the
    pairs share what the seeds' spread is mostly made of). Mean ± standard error over the seeds both have."""
    labels = sorted({label for label, _ in runs}, key=order)
    pooled = {label: pool_label(label) for label in labels}
    out = []
    for label in labels:
        if not pooled[label] or pooled[label][0] != strategy:
            continue
        others = [o for o in labels if o == "full" or (
            pooled[o] and pooled[o][0] != strategy and pooled[o][1:] == pooled[label][1:])]
        for other in others:
            seeds = sorted(s for (l, s) in runs if l == label and (other, s) in runs)
            row = {"label": label, "minus": other, "seeds": seeds}
            for m in METRICS:
                d = [float(runs[(label, s)][m]) - float(runs[(other, s)][m]) for s in seeds]
                row[m] = statistics.fmean(d)
                row[f"{m}_se"] = statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else 0.0
                row[f"{m}_above"] = sum(x > 0 for x in d)
            out.append(row)
    return out


def paired_table(rows: list[dict]) -> str:
    head = ["run", "minus", "seeds", "top-1", "task top-1", "pairwise", "seeds above (top-1 / task top-1)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append("| " + " | ".join([
            r["label"], r["minus"], str(len(r["seeds"])),
            *[f"{r[m]:+.3f} ± {r[m + '_se']:.3f}" for m in ("top1", "task_top1", "pairwise")],
            f"{r['top1_above']} / {r['task_top1_above']} of {len(r['seeds'])}"]) + " |")
    return ("Paired by seed: the run minus the other on the same seed, mean ± standard error.\n\n"
            + "\n".join(lines) + "\n")


def table(rows: list[dict]) -> str:
    nets = rows[0]["networks"]
    head = ["run", "trained on", "seeds", "top-1", "top-5", "task top-1", "task top-5", "pairwise",
            *[f"{n} top-1" for n in nets]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["label"], r["data"], str(r["runs"]),
                 *[f"{r[m]:.3f} ± {r[m + '_sd']:.3f}" for m in METRICS],
                 *[f"{r[n + '_top1']:.3f} ± {r[n + '_top1_sd']:.3f}" for n in nets]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], out: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    labels = [r["label"] for r in rows]
    for ax, metric, title in ((axes[0], "top1", "network top-1 (mean of bert_base, resnet50)"),
                              (axes[1], "task_top1", "per-task top-1 (32 held-out tasks)")):
        ax.bar(range(len(rows)), [r[metric] for r in rows], yerr=[r[metric + "_sd"] for r in rows],
               capsize=3, color=["#999999" if l.startswith("zeroshot") else "#4477aa" if l.endswith("full")
                                 else "#cc6677" if l.startswith("transfer") else "#ddcc77" for l in labels])
        ax.set_xticks(range(len(rows)), labels, rotation=60, ha="right", fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.set_ylim(0, 1)
    axes[0].set_ylabel("top-1, xeon-avx512-t2 (mean ± sd)")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=HERE / "results")
    ap.add_argument("--summary", type=Path, default=HERE / "summary.json")
    ap.add_argument("--markdown", type=Path, default=HERE / "summary.md")
    ap.add_argument("--plot", type=Path, default=HERE / "img" / "newplatform.png")
    ap.add_argument("--trained-on", default=None, help="the data column of every row (default: from the label)")
    ap.add_argument("--paired", metavar="STRATEGY", default=None,
                    help="also pair STRATEGY's pool-size runs by seed with the other strategies' and the whole pool's")
    ap.add_argument("--paired-markdown", type=Path, default=None, help="where the paired table goes (with --paired)")
    a = ap.parse_args()
    rows = summarize(load_runs(a.results), a.trained_on)
    atomic_write_json(a.summary, {"runs": rows})
    atomic_write_text(a.markdown, table(rows))
    plot(rows, a.plot)
    print(table(rows))
    if a.paired:
        pairs = paired(runs_by_seed(a.results), a.paired)
        atomic_write_text(a.paired_markdown or a.markdown.with_name(f"paired-{a.paired}.md"), paired_table(pairs))
        print(paired_table(pairs))


if __name__ == "__main__":
    main()
