"""`tcl bench tune`: a short tuning study end to end, for regression checks.

Tunes one workload (default: a held-out task of bert_base) with each cost model (default: the
TCL KB, MetaSchedule's XGBoost, random) for a few trials and seeds, and prints best latency vs
trials for each, then the two figures of the study:

- **search-time speedup at equal latency**: the trials (and seconds) a baseline spends to first
  reach its final best latency (not its whole budget: a baseline that levels off early has
  spent only that much to get there), divided by those TCL spends to reach that latency (no
  figure when TCL never reaches it within its budget);
- **latency ratio at equal trials**: the baseline's final best latency / TCL's (> 1: TCL better).

Curves are per seed; a cost model's curve is the geometric mean over seeds of the best latency
after each batch (the batches are the same for every model: `trials_per_iter`). The KB's own
speed inside the runs (candidates/s, share of the run's wall time) is reported beside them.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

DEFAULT_WORKLOAD = "dense_128_768_768"   # a bert_base task: held out from the KB's training data
DEFAULT_MODELS = ("tcl", "xgb", "random")
# The TCL variants measured against the baselines: the KB as served, and the KB fine-tuning on
# the run's own measurements after each batch (`tcl tune --fine-tune`).
TCL_VARIANTS = ("tcl", "tcl-ft")


def mean_curve(curves: list[dict]) -> tuple[list[int], list[float], list[float]]:
    """(trials, geometric-mean best latency, mean seconds) over seeds, up to the shortest run."""
    n = min(len(c["best"]) for c in curves)
    trials = curves[0]["trials"][:n]
    best = [math.exp(sum(math.log(c["best"][i]) for c in curves) / len(curves))
            if all(math.isfinite(c["best"][i]) for c in curves) else math.inf for i in range(n)]
    seconds = [sum(c["seconds"][i] for c in curves) / len(curves) for i in range(n)]
    return trials, best, seconds


def first_reaching(best: list[float], target: float) -> int | None:
    """Index of the first point whose best latency is <= target, or None."""
    for i, b in enumerate(best):
        if b <= target * (1 + 1e-12):
            return i
    return None


def ratios(curves: dict[str, tuple], reference: str = "tcl") -> dict[str, dict]:
    """Per baseline (every curve but the TCL variants): search-time speedup at equal latency
    (trials, seconds) and latency ratio at equal trials, against `reference`."""
    r_trials, r_best, r_secs = curves[reference]
    out = {}
    for name, (trials, best, secs) in curves.items():
        if name in TCL_VARIANTS or not best:
            continue
        target = best[-1]
        hit, spent = first_reaching(r_best, target), first_reaching(best, target)
        out[name] = {
            "baseline_final_latency_s": target,
            "baseline_trials_to_final": trials[spent],
            "speedup_trials": None if hit is None else trials[spent] / r_trials[hit],
            "speedup_seconds": None if hit is None else secs[spent] / r_secs[hit],
            "latency_ratio_at_equal_trials": (target / r_best[-1]
                                              if math.isfinite(target) and math.isfinite(r_best[-1]) else None),
        }
    return out


def run_order(cost_models, seeds) -> list[tuple[str, int]]:
    """(model, seed) in the order the study runs them: seed by seed, every model in turn, so the
    runs compared with each other are measured close in time and a host that slows down during
    the study (a noisy neighbour) hits every model alike rather than the last one alone."""
    return [(name, seed) for seed in seeds for name in cost_models]


def bench_tune(platform_name: str, workload: str = DEFAULT_WORKLOAD, trials: int = 64,
               trials_per_iter: int = 16, seeds: tuple[int, ...] = (0,),
               cost_models: tuple[str, ...] = DEFAULT_MODELS, model: str | None = None,
               mlp_model: str | None = None, out_dir: str | os.PathLike = "runs/bench-tune",
               settings=None, progress: bool = True, fine_tune: bool = False,
               kb_checkpoint: str | None = None) -> dict:
    """Run the study; returns {"curves": {model: {trials, best_latency_s, seconds}}, "ratios"
    (TCL's against each baseline; "ratios_fine_tune" likewise for tcl-ft), "cost_model": the KB's
    speed inside tuning, "runs": per (model, seed) results}. Cost model "tcl-ft" is the KB
    fine-tuning on each run's measurements, from `kb_checkpoint` (default `model`: it needs a
    models:/ URI or a checkpoint, not an .onnx file); `fine_tune`: plain "tcl" fine-tunes too."""
    from tcl.collect.networks import network_tasks
    from tcl.collect.workloads import build_workload, describe, resolve_workload
    from tcl.hardware import get_platform
    from tcl.tuner.tune import TuneTask, tune

    from tcl.tuner.baselines import COST_MODELS

    unknown = [n for n in cost_models if n not in COST_MODELS + TCL_VARIANTS]
    if unknown:
        raise ValueError(f"unknown cost model(s) {', '.join(unknown)}; of {', '.join(COST_MODELS + TCL_VARIANTS[1:])}")
    platform = get_platform(platform_name)
    op = resolve_workload(workload)
    known = network_tasks().get(op.key)
    runs, curves, warnings = {}, {name: [] for name in cost_models}, []
    for name, seed in run_order(cost_models, seeds):
        task = TuneTask(workload, build_workload(op), 1.0, describe(op), dict(known.weights) if known else {})
        kind = "tcl" if name in TCL_VARIANTS else name
        ref = {"tcl": model, "tcl-ft": kb_checkpoint or model, "mlp": mlp_model}.get(name)
        result = tune(platform, [task], trials, kind, Path(out_dir) / f"{name}-seed{seed}", model=ref,
                      seed=seed, settings=settings, progress=progress, trials_per_iter=trials_per_iter,
                      fine_tune=name == "tcl-ft" or (fine_tune and name == "tcl"))
        runs[f"{name}/seed{seed}"] = {k: result[k] for k in ("tasks", "seconds", "stats", "runner_restarts",
                                                              "hung_runs")}
        warnings += [w for w in result["warnings"] if w not in warnings]
        curves[name].append(result["curves"][workload])
    per_model = {name: mean_curve(c) for name, c in curves.items()}
    out = {"platform": platform.name, "workload": workload, "trials": trials, "seeds": list(seeds),
           "fine_tune": fine_tune,
           "curves": {n: {"trials": t, "best_latency_s": b, "seconds": s} for n, (t, b, s) in per_model.items()},
           "runs": runs}
    if warnings:  # a default KB that is not yet promoted (tcl.registry.default_kb_uri)
        out["warnings"] = warnings
    if "tcl-ft" in per_model:
        out["ratios_fine_tune"] = ratios(per_model, "tcl-ft")
    tcl_name = "tcl" if "tcl" in per_model else "tcl-ft" if "tcl-ft" in per_model else None
    if tcl_name:
        if tcl_name == "tcl":
            out["ratios"] = ratios(per_model)
        tcl_runs = [r for k, r in runs.items() if k.split("/")[0] in TCL_VARIANTS]
        stats = [r["stats"] for r in tcl_runs]
        scored = sum(s["candidates_scored"] for s in stats)
        pred = sum(s["predict_seconds"] for s in stats)
        wall = sum(r["seconds"] for r in tcl_runs)
        updates = sum(s["update_seconds"] for s in stats)
        out["cost_model"] = {"candidates_scored": scored, "cached": sum(s["cached"] for s in stats),
                             "predict_seconds": pred, "candidates_per_s": scored / pred if pred else None,
                             "share_of_tuning": pred / wall if wall else None,
                             "steps_seconds": sum(s["steps_seconds"] for s in stats),
                             "features_seconds": sum(s["features_seconds"] for s in stats),
                             "score_seconds": sum(s["score_seconds"] for s in stats),
                             "path": stats[-1]["path"] if stats else "",
                             "fine_tune_updates": sum(s["updates"] for s in stats),
                             "update_seconds": updates,
                             # the cost model's whole share: scoring and, with --fine-tune, learning
                             "share_with_updates": (pred + updates) / wall if wall else None}
    return out


def format_report(report: dict) -> str:
    lines = [f"{report['workload']} on {report['platform']}, {report['trials']} trials, "
             f"seeds {report['seeds']}: best latency (us) after each batch"]
    names = list(report["curves"])
    trials = report["curves"][names[0]]["trials"]
    lines.append(f"{'trials':>7} " + " ".join(f"{n:>10}" for n in names))
    for i, t in enumerate(trials):
        row = []
        for n in names:
            b = report["curves"][n]["best_latency_s"]
            row.append(f"{b[i] * 1e6:10.1f}" if i < len(b) and math.isfinite(b[i]) else f"{'-':>10}")
        lines.append(f"{t:>7} " + " ".join(row))
    for variant, key in (("tcl", "ratios"), ("tcl-ft", "ratios_fine_tune")):
        for name, r in report.get(key, {}).items():
            sp_t = "not reached" if r["speedup_trials"] is None else f"{r['speedup_trials']:.2f}x trials"
            sp_s = "" if r["speedup_seconds"] is None else f", {r['speedup_seconds']:.2f}x seconds"
            lr = "-" if r["latency_ratio_at_equal_trials"] is None else f"{r['latency_ratio_at_equal_trials']:.3f}"
            lines.append(f"{variant} vs {name}: search-time speedup at equal latency {sp_t}{sp_s}; "
                         f"latency ratio at equal trials {lr}")
    cm = report.get("cost_model")
    if cm and cm["candidates_per_s"]:
        lines.append(f"KB inside tuning: {cm['candidates_scored']} candidates ({cm['cached']} cached) at "
                     f"{cm['candidates_per_s']:.0f}/s (trace->steps {cm['steps_seconds']:.2f} s, features "
                     f"{cm['features_seconds']:.2f} s, onnxruntime {cm['score_seconds']:.2f} s; {cm['path']} "
                     f"path), {100 * cm['share_of_tuning']:.1f}% of tuning wall time")
        if cm["fine_tune_updates"]:
            lines.append(f"KB fine-tuned {cm['fine_tune_updates']} times in {cm['update_seconds']:.1f} s: "
                         f"scoring and fine-tuning {100 * cm['share_with_updates']:.1f}% of tuning wall time")
    return "\n".join(lines)


def bench_cost_model(model: str, workload: str = DEFAULT_WORKLOAD, n_candidates: int = 2048,
                     platform_name: str = "znver4-avx512-t2", seed: int = 0) -> dict:
    """Trace -> feature -> score speed of the KB's cost model on `n_candidates` distinct real
    candidates (design-space samples, postprocessed), each scored once (no cache), beside
    baselines measured in the same run: the same through the steps (the trace library's steps
    text, then the Python featurizer: the previous path), trace -> steps without the trace
    library (Python walking the FFI, on 256 of them) and MetaSchedule's own per-store feature
    extraction of the same candidates (what its XGBoost model reads)."""
    import time

    from tcl.collect.measure import sample_programs, use_x86_intrinsics_only
    from tcl.collect.workloads import build_workload, resolve_workload
    from tcl.hardware import get_platform

    use_x86_intrinsics_only()
    from tvm.s_tir import meta_schedule as ms
    from tvm.target import Target

    from tcl.tuner.cost_model import TCLCostModel
    from tcl.tuner.traces import candidate_steps, trace_library

    platform = get_platform(platform_name)
    mod = build_workload(resolve_workload(workload))
    programs = sample_programs(mod, platform.target, n_candidates, seed)
    args = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    candidates = [ms.MeasureCandidate(sch, args) for sch, _, _ in programs]
    ctx = ms.TuneContext(mod=mod, target=Target(dict(platform.target)))
    predictor = TCLCostModel(model).predictor
    for way in ("library", "steps"):  # sessions warm, converters built
        TCLCostModel(predictor, way=way).predict(ctx, candidates[:8])

    def timed(way: str):
        cm = TCLCostModel(predictor, way=way)
        start = time.perf_counter()
        cm.predict(ctx, candidates)
        return time.perf_counter() - start, cm.stats

    tcl_s, st = timed("library")
    steps_s, steps_st = timed("steps")
    extractor = ms.feature_extractor.PerStoreFeature()
    start = time.perf_counter()
    extractor.extract_from(ctx, candidates)
    perstore_s = time.perf_counter() - start
    few = candidates[:256]  # the Python path is slow: a sample of the candidates
    start = time.perf_counter()
    candidate_steps(few, use_library=False)
    python_s = time.perf_counter() - start
    n = len(candidates)

    def split(s) -> dict:
        return {"trace_to_steps": 1e6 * s.steps_seconds / n, "features": 1e6 * s.features_seconds / n,
                "onnxruntime": 1e6 * s.score_seconds / n}

    return {"workload": workload, "candidates": n, "trace_library": trace_library() is not None,
            "path": st.path, "tcl_candidates_per_s": n / tcl_s, "tcl_us_per_candidate": split(st),
            "steps_path_candidates_per_s": n / steps_s, "steps_path_us_per_candidate": split(steps_st),
            "python_trace_to_steps_us": 1e6 * python_s / len(few),
            "metaschedule_perstore_candidates_per_s": n / perstore_s}


def format_cost_model(row: dict) -> str:
    us, old = row["tcl_us_per_candidate"], row["steps_path_us_per_candidate"]
    if row["path"] == "library":
        split = f"trace->features in one pass {us['features']:.0f}"
    else:
        split = f"trace->steps {us['trace_to_steps']:.0f}, features {us['features']:.0f}"
    return (f"{row['workload']}: {row['candidates']} candidates; TCL cost model "
            f"{row['tcl_candidates_per_s']:.0f}/s (us per candidate: {split}, onnxruntime "
            f"{us['onnxruntime']:.0f}; trace library {'on' if row['trace_library'] else 'not built'}); "
            f"baselines in the same run: through the steps {row['steps_path_candidates_per_s']:.0f}/s "
            f"(trace->steps {old['trace_to_steps']:.0f}, features {old['features']:.0f}, onnxruntime "
            f"{old['onnxruntime']:.0f}), trace->steps from Python alone "
            f"{row['python_trace_to_steps_us']:.0f} us, MetaSchedule's per-store feature "
            f"extraction alone: {row['metaschedule_perstore_candidates_per_s']:.0f}/s")
