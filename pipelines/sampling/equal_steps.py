"""Does a 10% subset's model lose because it gets ~10x fewer optimizer steps? (issue 12, what was tried)

The study trains every subset's Mamba with the main job's `pipeline.train` (30 epochs, patience
10, warmup 1): on a 10% subset an epoch is ~5 batches against ~46 on the whole pool. Here, under
the cross-validation protocol of cv_settings.py (the training split's tasks in 4 folds, seeded as
there; score on the held-out fold's tasks; the test split untouched), each (platform, fold, seed)
trains on the whole pool, and on RDU's and random's 10% with the default epochs and with epochs,
patience and warmup scaled by pool / subset (equal optimizer steps).

    python pipelines/sampling/equal_steps.py run --platforms x86-sse-t1,znver4-avx512-t1 --folds 0,1,2,3 \
        --out /tmp/a.jsonl          # one JSON line a (platform, fold, seed), ~100 s each on one core
    python pipelines/sampling/equal_steps.py summary pipelines/sampling/equal_steps.jsonl
    python pipelines/sampling/equal_steps.py heldout --platform x86-sse-t1 --out /tmp/h.jsonl
                                    # RDU / random 10% of the whole training split, default and equal
                                    # steps, scored on the test split (the held-out networks), seeds 0-2
    python pipelines/sampling/equal_steps.py variant --name rdu-no-r \
        --sample '{"pool_ratio": 1.0, "weights": {"representativeness": 0}}' \
        --pair pipelines/sampling/equal_steps.jsonl --out /tmp/v.jsonl
                                    # a sampler setting (over params.yaml `sample:`) on every (platform,
                                    # fold, seed) of the rows file, equal steps, paired with its rows
    python pipelines/sampling/equal_steps.py variant-summary /tmp/v.jsonl
    python pipelines/sampling/equal_steps.py variant --name random --strategy random --seeds 2,3 \
        --trainings default --out /tmp/c.jsonl      # fresh seeds on the rows file's (platform, fold)s;
    python pipelines/sampling/equal_steps.py variant-summary /tmp/c.jsonl --pair self
                                    # ... paired with the file's own variants named rdu and random
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time

import numpy as np

from cv_settings import candidate_params, task_folds
from quick_study import train_and_score

from tcl.config import load_params
from tcl.features import load_feature_set
from tcl.sampling.subset import sample_features

VARIANTS = ("full", "rdu", "rdu-steps", "random", "random-steps")


def subset_scores(pool, valid, test, params: dict, seed: int, strategy: str,
                  trainings: tuple[str, ...] = ("default", "steps"), ratio: float = 0.1) -> dict[str, dict]:
    """{training: scores}: a Mamba on `strategy`'s `ratio` of `pool` scored on `test`, trained with
    the main job's epochs (default) and with epochs, patience and warmup x pool / subset (steps)."""
    tp = {**params["train"], **params["pipeline"]["train"]}
    sub, _ = sample_features(pool, ratio, strategy, params, seed=seed)
    k = len(pool) / len(sub)
    scaled = {"epochs": int(round(tp["epochs"] * k)), "patience": int(round(tp["patience"] * k)),
              "warmup_epochs": int(round(tp["warmup_epochs"] * k))}
    return {t: train_and_score(sub, valid, test, params, seed, threads=1, **(scaled if t == "steps" else {}))
            for t in trainings}


@functools.lru_cache(maxsize=None)
def split_of(platform: str, part: str):
    """data/splits/<platform>/<part>.npz, read once per process (every run of a platform reads it)."""
    return load_feature_set(f"data/splits/{platform}/{part}.npz")


def cv_pool(platform: str, fold: int):
    """(pool, valid, held): the CV protocol's training tasks, validation split and held-out fold."""
    train, valid = split_of(platform, "train"), split_of(platform, "valid")
    held_mask = np.isin(train.task, task_folds(len(train.tasks), 4, 0)[fold])
    return train.subset(~held_mask), valid, train.subset(held_mask)


def run_one(platform: str, fold: int, seed: int, params: dict) -> dict:
    pool, valid, held = cv_pool(platform, fold)
    t0 = time.time()
    row = {"platform": platform, "fold": fold, "seed": seed,
           "full": train_and_score(pool, valid, held, params, seed, threads=1)}
    for strategy in ("rdu", "random"):
        scores = subset_scores(pool, valid, held, params, seed, strategy)
        row[strategy], row[f"{strategy}-steps"] = scores["default"], scores["steps"]
    row["seconds"] = time.time() - t0
    return row


def se(values: np.ndarray) -> float:
    """Standard error of the mean (0 for a single value)."""
    return float(values.std(ddof=1) / np.sqrt(len(values))) if len(values) > 1 else 0.0


def append_row(path: str, row: dict) -> None:
    """One JSON line appended to `path` (a run survives an interrupted study) and echoed to stderr."""
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row), file=sys.stderr, flush=True)


def references_of(rows: list[dict]) -> list[dict]:
    """Rows named `rdu` / `random` of a variant file as pair rows (what `run` writes): the
    references for variants run on seeds `run` did not cover (`variant --seeds`)."""
    ref: dict = {}
    for r in rows:
        if r["name"] in ("rdu", "random"):
            row = ref.setdefault((r["platform"], r["fold"], r["seed"]),
                                 {"platform": r["platform"], "fold": r["fold"], "seed": r["seed"]})
            for training, suffix in (("default", ""), ("steps", "-steps")):
                if training in r:
                    row[r["name"] + suffix] = r[training]
    return list(ref.values())


def variant_summary(rows: list[dict], pair: list[dict]) -> str:
    """Each variant's per-task top-1 per training, paired with the rows file's on the same runs
    (default training with its `rdu` / `random`, equal steps with its `rdu-steps` / `random-steps`)."""
    ref = {(r["platform"], r["fold"], r["seed"]): r for r in pair}
    lines = ["| variant | training | runs | per-task top-1 | - rdu | - random | above random |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for name in dict.fromkeys(r["name"] for r in rows):
        for training, suffix in (("default", ""), ("steps", "-steps")):
            rs = [r for r in rows if r["name"] == name and training in r
                  and all(k + suffix in ref.get((r["platform"], r["fold"], r["seed"]), {}) for k in ("rdu", "random"))]
            if not rs:
                continue
            v = np.array([r[training]["task_top1"] for r in rs])
            d = {k: v - np.array([ref[(r["platform"], r["fold"], r["seed"])][k + suffix]["task_top1"] for r in rs])
                 for k in ("rdu", "random")}
            lines.append(f"| {name} | {training} | {len(rs)} | {v.mean():.3f} ± {se(v):.3f} | {d['rdu'].mean():+.3f} ± "
                         f"{se(d['rdu']):.3f} | {d['random'].mean():+.3f} ± {se(d['random']):.3f} | "
                         f"{(d['random'] > 0).sum()}/{len(rs)} |")
    return "\n".join(lines)


def summary(rows: list[dict]) -> str:
    lines = [f"{len(rows)} paired runs; platforms {', '.join(sorted({r['platform'] for r in rows}))}",
             "| variant | per-task top-1 | network top-1 |", "|---|---:|---:|"]
    for k in VARIANTS:
        v, w = (np.array([r[k][m] for r in rows]) for m in ("task_top1", "top1"))
        lines.append(f"| {k} | {v.mean():.3f} ± {se(v):.3f} | {w.mean():.3f} ± {se(w):.3f} |")
    lines += ["", "| paired (per-task top-1) | mean ± se | runs above |", "|---|---:|---:|"]
    for a, b in (("rdu-steps", "rdu"), ("random-steps", "random"), ("rdu", "random"),
                 ("rdu-steps", "random-steps"), ("full", "rdu-steps")):
        d = np.array([r[a]["task_top1"] - r[b]["task_top1"] for r in rows])
        lines.append(f"| {a} - {b} | {d.mean():+.3f} ± {se(d):.3f} | {(d > 0).sum()}/{len(d)} |")
    return "\n".join(lines)


def heldout_summary(rows: list[dict], full: list[dict]) -> str:
    """The held-out study's table from `heldout` rows (any ratios and strategies): per ratio and
    strategy, mean ± sd over seeds of network and per-task top-1 with equal steps (and with the
    default training where run), then the `full` model's (tcl evaluate JSON of the whole split)."""
    trainings = [t for t in ("steps", "default") if any(t in r for r in rows)]
    head = " | ".join(f"{m} ({t})" for t in trainings for m in ("top-1", "task top-1"))
    lines = [f"| platform | ratio | strategy | seeds | {head} |", "|---|---:|---|---:|" + "---:|" * 2 * len(trainings)]

    def cell(values) -> str:
        v = np.array(values)
        return f"{v.mean():.3f} ± {v.std(ddof=1) if len(v) > 1 else 0.0:.3f}"

    groups: dict = {}
    for r in rows:
        groups.setdefault((r["platform"], r.get("ratio", 0.1), r["strategy"]), []).append(r)
    for (platform, ratio, strategy), rs in sorted(groups.items(), key=lambda kv: kv[0][:2]):
        cells = [cell([r[t][m] for r in rs]) if all(t in r for r in rs) else "-"
                 for t in trainings for m in ("top1", "task_top1")]
        lines.append(f"| {platform} | {ratio * 100:g}% | {strategy} | {len(rs)} | " + " | ".join(cells) + " |")
    if full:
        one_pass = " | ".join(cell([f[m] for f in full]) for _ in trainings for m in ("top1", "task_top1"))
        platforms = ", ".join(sorted({f["platform"] for f in full}))
        lines.append(f"| {platforms} | 100% | full (one pass = the steps) | {len(full)} | {one_pass} |")
    return "\n".join(lines)


def heldout_png(rows: list[dict], full: list[dict], training: str = "steps") -> bytes:
    """Network and per-task top-1 (mean ± sd over seeds) vs the sampling ratio, one line per
    strategy, trained with `training`; the whole split's model as a grey band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tcl.summary import figure_png

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    strategies = list(dict.fromkeys(r["strategy"] for r in rows))
    for ax, metric, name in zip(axes, ("top1", "task_top1"), ("network top-1", "per-task top-1")):
        if full:
            v = np.array([f[metric] for f in full])
            ax.axhspan(v.mean() - v.std(ddof=1), v.mean() + v.std(ddof=1), color="grey", alpha=0.25)
            ax.axhline(v.mean(), color="grey", lw=1.5, label=f"100% ({len(v)} seeds, mean ± sd)")
        for i, strategy in enumerate(strategies):
            by_ratio: dict = {}
            for r in rows:
                if r["strategy"] == strategy and training in r:
                    by_ratio.setdefault(r.get("ratio", 0.1), []).append(r[training][metric])
            ratios = sorted(by_ratio)
            shift = 1 + 0.03 * (i - (len(strategies) - 1) / 2)  # side by side on the log axis
            ax.errorbar([x * 100 * shift for x in ratios], [np.mean(by_ratio[x]) for x in ratios],
                        yerr=[np.std(by_ratio[x], ddof=1) if len(by_ratio[x]) > 1 else 0 for x in ratios],
                        marker="o", capsize=3, label=strategy)
        ticks = sorted({r.get("ratio", 0.1) * 100 for r in rows})
        ax.set_xscale("log")
        ax.set_xticks(ticks, [f"{x:g}%" for x in ticks])
        ax.minorticks_off()
        ax.set_xlabel("sampling ratio of the train split")
        ax.set_ylabel(f"held-out {name} (mean ± sd over seeds)")
        ax.set_title(f"{', '.join(sorted({r['platform'] for r in rows}))}: equal optimizer steps ({training})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    return figure_png(fig)


def read_rows(path: str) -> list[dict]:
    """The JSON lines of `path` ([] when it does not exist yet)."""
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run")
    run.add_argument("--platforms", required=True)
    run.add_argument("--folds", default="0,1,2,3")
    run.add_argument("--seeds", default="0,1")
    run.add_argument("--params", default="params.yaml")
    run.add_argument("--out", required=True, help="JSON lines, appended")
    show = sub.add_parser("summary")
    show.add_argument("rows")
    held = sub.add_parser("heldout")
    held.add_argument("--platform", required=True)
    held.add_argument("--seeds", default="0,1,2")
    held.add_argument("--strategies", default="rdu,random")
    held.add_argument("--ratios", default="0.1", help="sampling ratios (comma-separated)")
    held.add_argument("--trainings", default="default,steps", help="default and/or steps (comma-separated)")
    held.add_argument("--sample", default="{}", help="JSON over params.yaml `sample:` (nested dicts merged)")
    held.add_argument("--params", default="params.yaml")
    held.add_argument("--out", required=True, help="JSON lines, appended")
    var = sub.add_parser("variant")
    var.add_argument("--name", required=True)
    var.add_argument("--sample", default="{}", help="JSON over params.yaml `sample:` (nested dicts merged)")
    var.add_argument("--strategy", default="rdu")
    var.add_argument("--pair", default="pipelines/sampling/equal_steps.jsonl",
                     help="the rows whose (platform, fold, seed) runs are repeated and paired")
    var.add_argument("--platforms", default=None, help="only these (default: every platform of --pair)")
    var.add_argument("--trainings", default="steps", help="default and/or steps (comma-separated)")
    var.add_argument("--seeds", default=None, help="these seeds on --pair's (platform, fold) runs instead of its own")
    var.add_argument("--limit", type=int, default=None, help="at most this many runs of --pair")
    var.add_argument("--params", default="params.yaml")
    var.add_argument("--out", required=True, help="JSON lines, appended; a run already there is skipped")
    hs = sub.add_parser("heldout-summary")
    hs.add_argument("rows")
    hs.add_argument("--full", nargs="*", default=[], help="the whole split's `tcl evaluate --json` files")
    hs.add_argument("--png", default=None, help="also plot top-1 vs ratio (equal steps) to this PNG")
    vs = sub.add_parser("variant-summary")
    vs.add_argument("rows")
    vs.add_argument("--pair", default="pipelines/sampling/equal_steps.jsonl",
                    help="the references' rows; 'self': the rows file's own variants named rdu and random")
    a = ap.parse_args()
    if a.command == "variant-summary":
        rows = read_rows(a.rows)
        print(variant_summary(rows, references_of(rows) if a.pair == "self" else read_rows(a.pair)))
        return
    if a.command == "heldout-summary":
        full = [json.loads(open(p).read()) for p in a.full]
        rows = read_rows(a.rows)
        print(heldout_summary(rows, full))
        if a.png:
            from tcl.io import atomic_write_bytes

            atomic_write_bytes(a.png, heldout_png(rows, full))
        return
    if a.command == "summary":
        print(summary(read_rows(a.rows)))
        return
    params = load_params(a.params)
    sample = json.loads(getattr(a, "sample", "{}"))  # variant / heldout: over params.yaml `sample:`
    if a.command == "variant":
        vparams = candidate_params(params, sample)
        trainings = tuple(a.trainings.split(","))
        done = {(r["name"], r["platform"], r["fold"], r["seed"]) for r in read_rows(a.out)
                if all(t in r for t in trainings)}
        wanted = a.platforms.split(",") if a.platforms else None
        runs = read_rows(a.pair)
        if a.seeds is not None:
            runs = [{"platform": p, "fold": f, "seed": int(seed)} for p, f in
                    dict.fromkeys((r["platform"], r["fold"]) for r in runs) for seed in a.seeds.split(",")]
        for r in runs[:a.limit]:
            key = (a.name, r["platform"], r["fold"], r["seed"])
            if key in done or (wanted and r["platform"] not in wanted):
                continue
            pool, valid, held = cv_pool(r["platform"], r["fold"])
            t0 = time.time()
            row = {"name": a.name, "platform": r["platform"], "fold": r["fold"], "seed": r["seed"],
                   "strategy": a.strategy, "sample": sample,
                   **subset_scores(pool, valid, held, vparams, r["seed"], a.strategy, trainings),
                   "seconds": time.time() - t0}
            append_row(a.out, row)
        return
    if a.command == "heldout":
        train, valid, test = (split_of(a.platform, n) for n in ("train", "valid", "test"))
        hparams = candidate_params(params, sample)
        trainings = tuple(a.trainings.split(","))
        done = {(r["seed"], r["strategy"], r.get("ratio", 0.1)) for r in read_rows(a.out)
                if r["platform"] == a.platform and r.get("sample", {}) == sample and all(t in r for t in trainings)}
        for ratio in (float(r) for r in a.ratios.split(",")):
            for seed in (int(s) for s in a.seeds.split(",")):
                for strategy in a.strategies.split(","):
                    if (seed, strategy, ratio) in done:  # resumable: a row already there is skipped
                        continue
                    row = {"platform": a.platform, "seed": seed, "strategy": strategy, "ratio": ratio,
                           **subset_scores(train, valid, test, hparams, seed, strategy, trainings, ratio),
                           **({"sample": sample} if sample else {})}
                    append_row(a.out, row)
        return
    for platform in a.platforms.split(","):
        for fold in (int(f) for f in a.folds.split(",")):
            for seed in (int(s) for s in a.seeds.split(",")):
                append_row(a.out, run_one(platform, fold, seed, params))


if __name__ == "__main__":
    main()
