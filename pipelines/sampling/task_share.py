"""How should a 10% budget be spread over a pool's tasks? (issue 12, what was tried)

Every strategy of `tcl sample` spreads its budget over all of the pool's tasks (RDU stratifies by
task; random is uniform, so ~10% of each task). With ~13 programs a task, a task gives a ranking
loss 78 pairs; half the tasks with twice the programs give twice the pairs, fewer operators. This
measures which spread trains the better model under the cross-validation protocol of
cv_settings.py (the training split's tasks dealt into 4 folds; the subset is chosen from the other
folds' programs, the model scored on the held-out fold's tasks; the test split untouched):

* ``share`` s: round(s x tasks) of the pool's tasks drawn at random (seeded), the budget
  (ratio x pool) dealt evenly over them, programs drawn at random within each; s = 1 is random
  sampling stratified by task;
* each subset's Mamba trained with equal optimizer steps (epochs, patience and warmup x pool /
  subset, as equal_steps.py's ``steps``).

Rule, fixed before the first run (2026-12-06): reported whatever it shows; if a share below 1 is
above share 1 on per-task top-1 by more than two standard errors of the paired difference over the
runs, a task-share setting for RDU is the next thing to test (on fresh seeds); otherwise
`sample:` is unchanged.

    python pipelines/sampling/task_share.py run --platforms x86-sse-t1,x86-sse-t2 --out R.jsonl
    python pipelines/sampling/task_share.py summary R.jsonl
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from equal_steps import append_row, cv_pool, read_rows, se
from quick_study import train_and_score

from tcl.config import load_params

SHARES = (1.0, 0.5, 0.25)


def task_share_subset(pool, ratio: float, share: float, seed: int):
    """`ratio` of `pool`'s programs from round(`share` x its tasks), drawn at random (seeded), the
    budget dealt evenly over the tasks (a task smaller than its part gives all it has, the rest
    goes to the others)."""
    rng = np.random.default_rng([seed, 12])
    tasks = np.unique(pool.task)
    chosen_tasks = rng.choice(tasks, size=max(1, int(round(share * len(tasks)))), replace=False)
    members = {t: rng.permutation(np.flatnonzero(pool.task == t)) for t in chosen_tasks}
    budget = min(int(round(ratio * len(pool))), sum(len(m) for m in members.values()))
    take = {t: 0 for t in chosen_tasks}
    while budget:  # one program a task in turn: an even spread, capped by each task's size
        open_tasks = [t for t in chosen_tasks if take[t] < len(members[t])]
        for t in open_tasks[:budget]:
            take[t] += 1
        budget -= min(budget, len(open_tasks))
    index = np.sort(np.concatenate([members[t][:take[t]] for t in chosen_tasks]))
    return pool.subset(index)


def run(platforms: list[str], folds: list[int], seeds: list[int], ratio: float, params: dict, out: str) -> None:
    done = {(r["platform"], r["fold"], r["seed"], r["share"]) for r in read_rows(out) if r["ratio"] == ratio}
    tp = {**params["train"], **params["pipeline"]["train"]}
    for platform in platforms:
        for fold in folds:
            pool, valid, held = cv_pool(platform, fold)
            for seed in seeds:
                for share in SHARES:
                    if (platform, fold, seed, share) in done:  # resumable
                        continue
                    t0 = time.time()
                    sub = task_share_subset(pool, ratio, share, seed)
                    k = len(pool) / len(sub)
                    steps = {key: int(round(tp[key] * k)) for key in ("epochs", "patience", "warmup_epochs")}
                    append_row(out, {"platform": platform, "fold": fold, "seed": seed, "share": share,
                                     "ratio": ratio, "programs": len(sub), "tasks": int(len(np.unique(sub.task))),
                                     **train_and_score(sub, valid, held, params, seed, threads=1, **steps),
                                     "seconds": time.time() - t0})


def summary(rows: list[dict]) -> str:
    """Per ratio and share: per-task and network top-1 (mean ± se over runs), and per-task top-1
    paired with share 1 of the same ratio on the same (platform, fold, seed)."""
    base = {(r["ratio"], r["platform"], r["fold"], r["seed"]): r["task_top1"] for r in rows if r["share"] == 1.0}
    lines = ["| ratio | share of tasks | runs | tasks | programs | per-task top-1 | network top-1 | - share 1 "
             "| above share 1 |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for ratio in sorted({r["ratio"] for r in rows}):
        for share in SHARES:
            rs = [r for r in rows if r["ratio"] == ratio and r["share"] == share
                  and (ratio, r["platform"], r["fold"], r["seed"]) in base]
            if not rs:
                continue
            v, w = (np.array([r[k] for r in rs]) for k in ("task_top1", "top1"))
            d = v - np.array([base[(ratio, r["platform"], r["fold"], r["seed"])] for r in rs])
            lines.append(f"| {ratio:g} | {share:g} | {len(rs)} | {np.mean([r['tasks'] for r in rs]):.1f} | "
                         f"{np.mean([r['programs'] for r in rs]):.0f} | {v.mean():.3f} ± {se(v):.3f} | "
                         f"{w.mean():.3f} ± {se(w):.3f} | {d.mean():+.3f} ± {se(d):.3f} | {(d > 0).sum()}/{len(d)} |")
    return "\n".join(lines)


def cv_run_parser(doc: str) -> tuple[argparse.ArgumentParser, argparse.ArgumentParser, argparse.ArgumentParser]:
    """(parser, its `run` subparser, its `summary` subparser) of a cross-validated study script:
    `run` takes the platforms, folds, seeds, ratio, params and the rows file; `summary` the rows."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--platforms", required=True)
    r.add_argument("--folds", default="0,1,2,3")
    r.add_argument("--seeds", default="0,1")
    r.add_argument("--ratio", type=float, default=0.1)
    r.add_argument("--params", default="params.yaml")
    r.add_argument("--out", required=True, help="JSON lines, appended; a run already there is skipped")
    s = sub.add_parser("summary")
    s.add_argument("rows")
    return ap, r, s


def main() -> None:
    ap, _, _ = cv_run_parser(__doc__)
    a = ap.parse_args()
    if a.command == "summary":
        print(summary(read_rows(a.rows)))
        return
    run(a.platforms.split(","), [int(f) for f in a.folds.split(",")], [int(s) for s in a.seeds.split(",")],
        a.ratio, load_params(a.params), a.out)


if __name__ == "__main__":
    main()
