"""Tune tasks with MetaSchedule under a chosen cost model, writing a MetaSchedule database.

    result = tune(platform, tasks, trials=256, cost_model="tcl", model=None, seed=0, out="runs/t")

One MetaSchedule run (`ms.tune_tasks`, the gradient task scheduler, evolutionary search) over
`tasks` (`TuneTask`: a TIR IRModule, its name and weight), measured with the collection's
builder and runner (tcl.collect.measure: the same build function, local or RPC runner, the
platform's target and runtime threads). `trials` is MetaSchedule's global budget
(``max_trials_global``), shared by the tasks as its scheduler decides. The database at `out`
gets `tasks.json` (names, weights, networks, as `tcl collect` writes it) and `tune.json`
(settings, cost model, where the run came from), so `tcl ingest` reads it like a collected one.

A measure callback follows the run: the best latency of each task after every batch (the
curve `tcl bench tune` compares), shown as a progress bar.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tcl.collect.measure import (FAILED_RUN_SECS, GuardedRunner, MeasureSettings, RpcSettings, for_metaschedule,
                                 make_builder, open_database, use_x86_intrinsics_only)
from tcl.hardware import Platform, host_mismatch, local_cpu_model, require_measurable
from tcl.io import atomic_write_json
from tcl.tuner.explore import explore_for
from tcl.tuner.online import online_for

TRIALS_PER_ITER = 64  # MetaSchedule's default batch of candidates measured together
# MetaSchedule's evolutionary search as TVM ships it (EvolutionarySearch's defaults); params.yaml
# ``tune.search`` overrides them for every cost model alike, so a comparison stays like for like
DEFAULT_SEARCH = {"population_size": 512, "init_measured_ratio": 0.2, "init_min_unmeasured": 50,
                  "max_fail_count": 5, "genetic_num_iters": 4, "genetic_mutate_prob": 0.85,
                  "genetic_max_fail_count": 10, "eps_greedy": 0.05}


@dataclass
class TuneTask:
    name: str
    mod: object                 # tvm.IRModule with one PrimFunc `main`
    weight: float = 1.0         # occurrences in the network tuned (1 for a lone workload)
    desc: str = ""
    weights: dict = field(default_factory=dict)  # network -> occurrences (tasks.json)


@dataclass
class Curve:
    """Best latency of one task after each measured batch."""

    trials: list = field(default_factory=list)      # measured so far (failures included)
    seconds: list = field(default_factory=list)     # since the run started
    best: list = field(default_factory=list)        # best mean latency so far (inf: none valid)


def workload_tasks(db_path: str | os.PathLike, index: int | None = None) -> list[TuneTask]:
    """The workloads of a MetaSchedule database (its folder or its database_workload.json), or
    the one at line `index` (0-based), as tasks (tcl.collect.workloads.database_workloads: names
    and weights from tasks.json beside it, else its structural hash and 1)."""
    from tcl.collect.workloads import database_workloads

    return [TuneTask(w.name, w.mod, w.weight, w.desc, dict(w.weights)) for w in database_workloads(db_path, index)]


def _progress_callback(names: list[str], curves: list[Curve], total: int, start: float, show: bool):
    from tqdm import tqdm
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

    bar = tqdm(total=total, unit="trial", desc="tune", disable=not show)

    @derived_object
    class FollowBest(PyMeasureCallback):
        def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results):
            curve = curves[task_id]
            best = curve.best[-1] if curve.best else math.inf
            for b, r in zip(builder_results, runner_results):
                if b.error_msg is None and r.error_msg is None and r.run_secs:
                    secs = [float(s) for s in r.run_secs]
                    if max(secs) < FAILED_RUN_SECS:
                        best = min(best, sum(secs) / len(secs))
            curve.trials.append((curve.trials[-1] if curve.trials else 0) + len(runner_results))
            curve.seconds.append(time.perf_counter() - start)
            curve.best.append(best)
            bar.update(len(runner_results))
            bar.set_postfix_str(f"{names[task_id]} best {best * 1e6:.1f} us")

    return FollowBest(), bar


def _write_tasks_json(out: Path, tasks: list[TuneTask]) -> None:
    from tvm_ffi import structural_hash

    path = out / "tasks.json"
    known = json.loads(path.read_text()) if path.is_file() else {}
    for t in tasks:
        known[str(structural_hash(t.mod))] = {
            "name": t.name, "desc": t.desc, "weights": t.weights,
            "networks": sorted(t.weights), "weight": t.weight}
    atomic_write_json(path, known)


def tune(platform: Platform, tasks: list[TuneTask], trials: int, cost_model: str, out: str | os.PathLike,
         model: str | None = None, seed: int = 0, rpc: RpcSettings | None = None,
         settings: MeasureSettings | None = None, progress: bool = True,
         trials_per_iter: int = TRIALS_PER_ITER, fine_tune: bool = False, search: dict | None = None,
         fine_tune_settings: dict | None = None, explore: dict | None = None,
         online: dict | None = None) -> dict:
    """Tune `tasks` on `platform` with `trials` measurements in all; the result dict of `tcl tune`
    (tasks with best latency and trials, weighted latency, seconds, the cost model's counters)
    plus ``curves`` (per task: trials, seconds, best after each batch) and ``stats``.
    `trials_per_iter`: the batch measured together, shrunk so each task gets one (`batch_for`).
    `fine_tune`: the KB (cost model tcl) fine-tunes on the run's measurements after each batch.
    `search`: settings of MetaSchedule's evolutionary search over `search_params()`'s;
    `fine_tune_settings`: the fine-tuning's over `fine_tune_params()`'s; `explore`: the KB's
    exploration (tcl.tuner.explore.explore_for: tcl's over params.yaml's; a peer refuses one); `online`:
    XGBoost learning beside the KB (tcl.tuner.online.online_for, the same way). Cost model
    tcl without `model` serves the family's registered KB (`tcl.registry.default_kb_uri`: its
    @production version, else its @candidate with a note in ``warnings``); ``model`` is the one used."""
    use_x86_intrinsics_only()
    from tvm.s_tir import meta_schedule as ms
    from tvm.target import Target

    from tcl.tuner.baselines import make_cost_model

    require_measurable(platform, here=rpc is None)
    if trials < 1:
        raise ValueError("--trials must be at least 1")
    settings = settings or MeasureSettings()
    search = search_params(search)
    explore = explore_for(cost_model, explore)
    online = online_for(cost_model, online)
    out = Path(out)
    # the search's threads: the target's cores, else the threads the platform measures with
    cores = max(1, int(platform.target.get("num-cores") or platform.threads or 1))
    per_iter, note = batch_for(trials, len(tasks), trials_per_iter)
    warnings = [note] if note else []
    if cost_model == "tcl" and model is None:  # the family's served KB; before a promotion, its candidate
        from tcl.registry import default_kb_uri

        model, note = default_kb_uri(platform.family)
        warnings += [note] if note else []
    cm, stats = make_cost_model(cost_model, model, platform.family, seed, threads=cores, fine_tune=fine_tune,
                                fine_tune_settings=fine_tune_settings, explore=explore, online=online)
    runner = GuardedRunner(platform.threads or 1, settings, rpc)  # an unreachable tracker fails here
    builder = make_builder(settings)
    database = open_database(out)
    _write_tasks_json(out, tasks)
    local_cpu = None if rpc is not None else local_cpu_model()  # where the latencies come from
    atomic_write_json(out / "tune.json", {
        "platform": platform.name, "family": platform.family, "target": platform.target,
        "threads": platform.threads, "cost_model": cost_model, "model": model, "fine_tune": fine_tune,
        "fine_tune_params": _fine_tune_params(fine_tune_settings) if fine_tune else None, "trials": trials,
        "trials_per_iter": per_iter, "seed": seed, "settings": settings.as_dict(), "search": search, "explore": explore,
        "online": online, "tasks": [t.name for t in tasks],
        "rpc": None if rpc is None else {"tracker": f"{rpc.tracker_host}:{rpc.tracker_port}", "key": rpc.key},
        "tvm_version": _tvm_version(),
        "host_cpu": local_cpu,
        "host_mismatch": None if local_cpu is None else host_mismatch(platform, local_cpu),
    })
    target = Target(dict(platform.target))
    strategy = ms.search_strategy.EvolutionarySearch(**search)
    contexts = [ms.TuneContext(mod=t.mod, target=target, space_generator="post-order-apply",
                               search_strategy=strategy, task_name=t.name,
                               rand_state=seed * 1_000_003 + i + 1, num_threads=cores).clone()
                for i, t in enumerate(tasks)]
    curves = [Curve() for _ in tasks]
    start = time.perf_counter()
    follow, bar = _progress_callback([t.name for t in tasks], curves, trials, start, progress)
    ms_builder, ms_runner = for_metaschedule(builder, runner)  # hung workers killed, a gone-bad runner replaced
    try:
        with tempfile.TemporaryDirectory(prefix="tcl-tune-") as work_dir:
            ms.tune_tasks(
                tasks=contexts, task_weights=[t.weight for t in tasks], work_dir=work_dir,
                max_trials_global=trials, max_trials_per_task=trials,
                num_trials_per_iter=per_iter, builder=ms_builder, runner=ms_runner,
                database=database, cost_model=cm,
                measure_callbacks=[*ms.measure_callback.MeasureCallback.create("default"), follow],
                task_scheduler="gradient")
    finally:
        bar.close()
        _shutdown(builder, runner.runner)
    seconds = time.perf_counter() - start
    rows = []
    for t, c in zip(tasks, curves):
        best = c.best[-1] if c.best and math.isfinite(c.best[-1]) else None
        rows.append({"task": t.name, "best_latency_s": best, "trials": c.trials[-1] if c.trials else 0})
    weighted = (sum(t.weight * r["best_latency_s"] for t, r in zip(tasks, rows))
                if all(r["best_latency_s"] is not None for r in rows) else None)
    missing = [r["task"] for r in rows if r["best_latency_s"] is None]
    if missing and len(tasks) > 1:
        warnings.append(f"{len(missing)} of {len(tasks)} tasks have no valid measurement ({', '.join(missing[:5])}"
                        f"{', ...' if len(missing) > 5 else ''}), so there is no weighted latency: give more --trials")
    s = stats.as_dict() if stats is not None else {}
    return {
        "tasks": rows, "weighted_latency_s": weighted, "seconds": seconds,
        "predict_calls": s.get("predict_calls"), "candidates_scored": s.get("candidates_scored"),
        "predict_seconds": s.get("predict_seconds"),
        "curves": {t.name: vars(c) for t, c in zip(tasks, curves)}, "stats": s, "model": model,
        "warnings": warnings, "runner_restarts": runner.restarts, "hung_runs": runner.hung,
    }


def batch_for(trials: int, n_tasks: int, trials_per_iter: int = TRIALS_PER_ITER) -> tuple[int, str | None]:
    """MetaSchedule's batch (``num_trials_per_iter``) for `trials` over `n_tasks` tasks, and a note
    when it is not `trials_per_iter`. The gradient task scheduler gives every task one batch in
    turn before it follows the gradient, and stops at the global budget: with batches of 64, a
    7-task network on 100 trials measures two tasks and has no network latency. So the batch
    shrinks to what gives every task one (``trials // n_tasks``, at least 1; under one trial a
    task, the tasks after the first `trials` get none). A batch that already fits is kept, without
    a note, so the batch this returns gives the same batch and no note again."""
    if trials_per_iter < 1:
        raise ValueError("--trials-per-iter must be at least 1")
    batch = min(trials_per_iter, trials)
    fitted = max(1, trials // n_tasks)
    if n_tasks <= 1 or trials >= n_tasks * batch or fitted == batch:
        return batch, None
    if trials < n_tasks:
        return 1, (f"--trials {trials} is under one measurement a task for {n_tasks} tasks: "
                   f"the last {n_tasks - trials} get none and the run has no weighted latency")
    return fitted, (f"batches of {fitted} candidates, not {trials_per_iter}, so that each of the {n_tasks} tasks "
                    f"gets one within --trials {trials} (MetaSchedule measures the tasks' first batches in turn)")


def search_params(overrides: dict | None = None) -> dict:
    """`DEFAULT_SEARCH`, then params.yaml ``tune.search``, then `overrides`; unknown keys raise."""
    from tcl.config import tune_settings

    return tune_settings("search", DEFAULT_SEARCH, overrides)


def _fine_tune_params(overrides: dict | None) -> dict:
    from tcl.tuner.fine_tune import fine_tune_params

    return fine_tune_params(overrides)


def _tvm_version() -> str:
    import tvm

    return tvm.__version__


def _shutdown(*pools) -> None:
    """Stop the builder's and runner's worker processes now (they outlive the run otherwise,
    until garbage collection reaches their pools)."""
    import gc

    for pool in pools:
        executor = getattr(pool, "pool", None) or getattr(pool, "executor", None)
        shutdown = getattr(executor, "shutdown", None)
        if shutdown is not None:
            try:
                shutdown(wait=True)
            except Exception:  # noqa: BLE001 - a pool already closed
                pass
    gc.collect()
