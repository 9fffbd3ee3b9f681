"""Tuner settings tried on validation tasks before any goes to the study's held-out tasks.

A setting of the search (params.yaml ``tune.search``), of the fine-tuning (``tune.fine_tune``) or of
the KB's exploration (``tune.explore``)
is tried here first, on tasks of the KB's validation split (its training read them only to choose
epochs; never the held-out networks' tasks the study reports), with a rule written before the runs.
Each run is one `tcl.tuner.tune.tune` call, as `tcl bench tune` makes it (platform
znver4-avx512-t2, one task, batches of 16, the measurement settings' defaults: number 2, repeat 3);
one JSON row per run (the curve of best latency after each batch, seconds, the settings used),
appended to ROWS, so an interrupted study resumes where it stopped.

    python pipelines/tuning/validation_study.py run --name default --cost-model tcl-ft --out ROWS.jsonl
    python pipelines/tuning/validation_study.py run --name ft-lr2e-3 --cost-model tcl-ft \
        --fine-tune '{"lr": 0.002}' --out ROWS.jsonl
    python pipelines/tuning/validation_study.py run --name pop2048 --cost-model tcl-ft \
        --search '{"population_size": 2048}' --out ROWS.jsonl
    python pipelines/tuning/validation_study.py run --name xgb --cost-model xgb --out ROWS.jsonl
    python pipelines/tuning/validation_study.py summary ROWS.jsonl [MORE.jsonl] --baseline default --reference xgb

The summary pools each setting's seeds (geometric mean of the best-latency curves, the seeds every
setting ran) and gives, per task: the final latency, the trial at which the pooled curve first
reaches the baseline's and the reference's final latency, and within 1 % / 0.5 % of the best
final of all settings; then, per setting, the geometric mean over the tasks of its final over the
baseline's and its worst task (the figures a rule such as "adopt if <= 0.99 and no task > 1.02" reads),
and for runs with `--explore`, after how many of their measured batches the KB ranked a share at random.
`--names` keeps only some settings (and so pools the seeds those ran).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

VALIDATION_TASKS = "conv2d_14_64_384_1_1,dense_196_768_192"
KB_CHECKPOINT = "models/amd-zen4-avx512"  # the main job's KB of the family: its checkpoint (tcl-ft)
KB_ONNX = "models/amd-zen4-avx512.onnx"    # and its export (tcl, served)


def run(args) -> None:
    from tcl.collect.measure import MeasureSettings
    from tcl.collect.workloads import build_workload, describe, resolve_workload
    from tcl.hardware import get_platform
    from tcl.tuner.tune import TuneTask, tune

    out = Path(args.out)
    done = {(r["task"], r["name"], r["seed"]) for r in read_rows(out)} if out.exists() else set()
    platform = get_platform(args.platform)
    kind = "tcl" if args.cost_model in ("tcl", "tcl-ft") else args.cost_model
    model = args.model or {"tcl": KB_ONNX, "tcl-ft": KB_CHECKPOINT}.get(args.cost_model)
    settings = (None if args.min_repeat_ms is None
                else MeasureSettings(number=1, repeat=3, min_repeat_ms=args.min_repeat_ms))
    for workload in args.tasks.split(","):
        for seed in (int(s) for s in args.seeds.split(",")):
            if (workload, args.name, seed) in done:
                continue
            op = resolve_workload(workload)
            task = TuneTask(workload, build_workload(op), 1.0, describe(op), {})
            db = Path(args.work) / f"{workload}-{args.name}-s{seed}"
            result = tune(platform, [task], args.trials, kind, db, model=model, seed=seed, progress=False,
                          trials_per_iter=args.trials_per_iter, fine_tune=args.cost_model == "tcl-ft",
                          search=json.loads(args.search) if args.search else None,
                          fine_tune_settings=json.loads(args.fine_tune) if args.fine_tune else None,
                          explore=json.loads(args.explore) if args.explore else None,
                          online=json.loads(args.online) if args.online else None, settings=settings)
            used = json.loads((db / "tune.json").read_text())
            row = {"task": workload, "name": args.name, "cost_model": args.cost_model, "seed": seed,
                   "model": model, "search": used["search"], "fine_tune_params": used["fine_tune_params"],
                   "trials": args.trials, "curve": result["curves"][workload], "seconds": result["seconds"],
                   "candidates_scored": result["candidates_scored"], "predict_seconds": result["predict_seconds"],
                   "update_seconds": result["stats"].get("update_seconds")}
            if used.get("explore") and used["explore"]["share_max"] > 0:  # its settings and readings
                row.update(explore=used["explore"], explore_readings=result["stats"]["explore"])
            if used.get("online") and used["online"]["weight"] > 0:
                row.update(online=used["online"], **{k: result["stats"][k] for k in (
                    "online_train_seconds", "online_score_seconds", "online_blended")})
            with out.open("a") as f:  # one line a run: a crash loses at most the run under way
                f.write(json.dumps(row) + "\n")
            print(workload, args.name, seed, f"{row['curve']['best'][-1] * 1e6:.2f} us", f"{row['seconds']:.0f} s",
                  flush=True)


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summary(args) -> None:
    from tcl.bench.tune import first_reaching, mean_curve

    def reach(trials, best, level):  # the trial count at which the pooled curve first gets to level
        i = first_reaching(best, level)
        return "-" if i is None else str(trials[i])

    names = set(args.names.split(",")) if args.names else None
    by = defaultdict(lambda: defaultdict(dict))  # task -> name -> seed -> row
    for row in (r for path in args.rows for r in read_rows(Path(path))):
        if names is None or row["name"] in names:
            by[row["task"]][row["name"]][row["seed"]] = row
    final_of = defaultdict(dict)  # name -> task -> pooled final latency
    print("| task | setting | final µs (geometric mean) [each seed] | reaches baseline's final | reaches "
          "reference's final | within 1 % / 0.5 % of the best | seconds a run |")
    print("|---|---|---|---|---|---|---|")
    for task, names in sorted(by.items()):
        seeds = sorted(set.intersection(*(set(s) for s in names.values())))
        pooled = {}
        for name, runs in names.items():
            rows = [runs[s] for s in seeds]
            trials, best, _ = mean_curve([r["curve"] for r in rows])
            pooled[name] = (trials, best, [r["curve"]["best"][-1] for r in rows],
                            sum(r["seconds"] for r in rows) / len(rows))
        top = min(p[1][-1] for p in pooled.values())
        for name, p in pooled.items():
            final_of[name][task] = p[1][-1]
        levels = {k: pooled[k][1][-1] for k in (args.baseline, args.reference) if k in pooled}
        for name, (trials, best, finals, seconds) in sorted(pooled.items()):
            hits = [reach(trials, best, levels[k]) if k in levels else "?" for k in (args.baseline, args.reference)]
            near = [reach(trials, best, top * f) for f in (1.01, 1.005)]
            print(f"| {task} | {name} | {best[-1] * 1e6:.2f} [{', '.join(f'{x * 1e6:.1f}' for x in finals)}] | "
                  f"{hits[0]} | {hits[1]} | {' / '.join(near)} | {seconds:.0f} |")
    print(f"\nseeds: those every setting of a task ran; baseline {args.baseline}, reference {args.reference}")
    explored = defaultdict(list)  # name -> the share each measured batch left (runs with --explore)
    for names_of_task in by.values():
        for name, runs in names_of_task.items():
            for r in runs.values():
                explored[name] += [b["share"] for b in r.get("explore_readings") or []]
    for name, shares in sorted(explored.items()):
        if shares:
            print(f"{name}: ranking at random after {sum(x > 0 for x in shares)} of {len(shares)} measured batches")
    base = final_of.get(args.baseline, {})
    for name, by_task in sorted(final_of.items()):
        shared = sorted(set(by_task) & set(base))
        if name == args.baseline or not shared:
            continue
        rel = {t: by_task[t] / base[t] for t in shared}
        worst = max(rel, key=rel.get)
        print(f"{name} over {args.baseline}, final latency on {len(shared)} tasks: geometric mean "
              f"{statistics.geometric_mean(rel.values()):.4f}, "
              f"worst {rel[worst]:.4f} ({worst})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="tune each task with each seed under one setting; append the rows")
    r.add_argument("--name", required=True, help="the setting's name in the rows")
    r.add_argument("--cost-model", required=True, choices=["tcl", "tcl-ft", "xgb", "mlp", "random"])
    r.add_argument("--model", default=None, help="tcl: the KB (default its ONNX export), tcl-ft: its checkpoint "
                   "(default the main job's), mlp: the Tenset-MLP (required)")
    r.add_argument("--search", default=None, help="JSON over tune.search, e.g. '{\"population_size\": 2048}'")
    r.add_argument("--fine-tune", default=None, help="JSON over tune.fine_tune, e.g. '{\"lr\": 0.002}'")
    r.add_argument("--explore", default=None, help="JSON over tune.explore, e.g. '{\"share_max\": 0.2}'")
    r.add_argument("--online", default=None, help="JSON over tune.online, e.g. '{\"weight\": 0.5}'")
    r.add_argument("--tasks", default=VALIDATION_TASKS)
    r.add_argument("--seeds", default="0,1,2")
    r.add_argument("--trials", type=int, default=128)
    r.add_argument("--trials-per-iter", type=int, default=16)
    r.add_argument("--platform", default="znver4-avx512-t2")
    r.add_argument("--work", default="runs/validation-study", help="the tuning databases")
    r.add_argument("--out", required=True, help="ROWS.jsonl (appended)")
    r.add_argument("--min-repeat-ms", type=int, default=None,
                   help="measure as `tcl bench tune --min-repeat-ms N` does (number 1, repeat 3); "
                        "default: tcl tune's measurement settings")
    s = sub.add_parser("summary", help="each setting's pooled curve against the baseline's and the reference's")
    s.add_argument("rows", nargs="+", help="ROWS.jsonl files (a later study's rows beside an earlier one's)")
    s.add_argument("--baseline", default="default")
    s.add_argument("--reference", default="xgb")
    s.add_argument("--names", default=None, help="only these settings (comma-separated): the seeds pooled are "
                   "those all of them ran")
    args = ap.parse_args()
    run(args) if args.command == "run" else summary(args)


if __name__ == "__main__":
    main()
