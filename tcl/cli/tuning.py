"""`tcl tune`: MetaSchedule tuning steered by a cost model (tcl.tuner.tune), as an MLflow run."""

from __future__ import annotations

import json
import sys

import click

from ..tuner.tune import TRIALS_PER_ITER, batch_for

TUNE_EXPERIMENT = "tcl-tune"


def _fail(message: str, code: int = 2):
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def _tasks(workload, workload_db, task_index, network):
    """The TuneTasks of exactly one of --workload / --workload-db / --network."""
    from ..collect.networks import network_tasks
    from ..collect.workloads import build_workload, describe, resolve_workload
    from ..tuner.tune import TuneTask, workload_tasks

    if sum(x is not None for x in (workload, workload_db, network)) != 1:
        _fail("give exactly one of --workload NAME, --workload-db PATH, --network NET")
    if task_index is not None and workload_db is None:
        _fail("--task-index goes with --workload-db")
    try:
        if workload is not None:
            op = resolve_workload(workload)
            known = network_tasks().get(op.key)
            return [TuneTask(workload, build_workload(op), 1.0, describe(op),
                             dict(known.weights) if known else {})]
        if network is not None:
            tasks = network_tasks([network])
            return [TuneTask(t.name, build_workload(t.op), float(t.weights[network]), describe(t.op),
                             dict(t.weights)) for t in tasks.values()]
        return workload_tasks(workload_db, task_index)
    except (KeyError, ValueError, FileNotFoundError) as exc:
        _fail(exc.args[0] if exc.args else str(exc))


@click.command()
@click.option("--platform", "platform_name", required=True, help="Platform from `tcl hardware list`.")
@click.option("--workload", default=None, help="One workload/task name, or an operator by its shape (dense_512_1024_256; "
                   "`tcl collect --list-tasks` gives the names and forms).")
@click.option("--workload-db", default=None, type=click.Path(exists=True),
              help="Every workload of a MetaSchedule database (its folder or database_workload.json).")
@click.option("--task-index", type=int, default=None, help="Only workload I (0-based) of --workload-db.")
@click.option("--network", default=None, help="Every task of a network, weighted by its occurrences.")
@click.option("--trials", type=click.IntRange(min=1), required=True,
              help="Measurements in all (MetaSchedule's global budget).")
@click.option("--cost-model", "cost_model", type=click.Choice(["tcl", "xgb", "mlp", "random"]), required=True)
@click.option("--model", default=None,
              help="tcl: a models:/ URI or .onnx file (default models:/tcl-kb-<family>@production, else "
                   "@candidate with a warning); "
                   "mlp: a trained mlp-tenset model.")
@click.option("--trials-per-iter", type=click.IntRange(min=1), default=TRIALS_PER_ITER, show_default=True,
              help="Candidates measured together (MetaSchedule's batch); smaller when --trials cannot give "
                   "every task one batch.")
@click.option("--fine-tune", is_flag=True,
              help="tcl: fine-tune the KB on the run's measurements after each batch (needs its checkpoint: "
                   "a models:/ URI or a checkpoint file/directory as --model; params.yaml tune.fine_tune).")
@click.option("--explore", "explore_share", type=click.FloatRange(0, 1), default=None,
              help="tcl: rank this share of the candidates at random while the run's "
                   "measured batches stop lowering the best latency (default params.yaml tune.explore share_max; 0: off).")
@click.option("--online-weight", "online_weight", type=click.FloatRange(0, 1), default=None,
              help="tcl: MetaSchedule's XGBoost learns the run's measurements beside the KB and, once trained, "
                   "takes this share of the ranking (default params.yaml tune.online weight; 0: off).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--out", required=True, type=click.Path(file_okay=False), help="MetaSchedule database folder.")
@click.option("--rpc-tracker", default=None, help="HOST:PORT of a TVM RPC tracker.")
@click.option("--rpc-key", default=None, help="Device key registered with the tracker.")
@click.option("--number", type=int, default=1, show_default=True)
@click.option("--repeat", type=int, default=3, show_default=True)
@click.option("--min-repeat-ms", type=int, default=20, show_default=True)
@click.option("--experiment", default=TUNE_EXPERIMENT, show_default=True, help="MLflow experiment.")
@click.option("--progress/--no-progress", default=True, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON line last.")
def tune(platform_name, workload, workload_db, task_index, network, trials, trials_per_iter, cost_model, model, fine_tune,
         explore_share, online_weight, seed, out, rpc_tracker, rpc_key, number, repeat, min_repeat_ms, experiment, progress, as_json) -> None:
    """Tune a workload, a database's workloads or a network with MetaSchedule; write the database."""
    from ..collect.measure import MeasureSettings
    from ..hardware import get_platform, require_measurable
    from .data import rpc_settings, warn_if_other_host

    rpc = rpc_settings(rpc_tracker, rpc_key)
    try:
        platform = get_platform(platform_name)
        require_measurable(platform, here=rpc is None)  # before an MLflow run is opened for a job that cannot start
    except (KeyError, ValueError) as exc:
        _fail(exc.args[0])
    tasks = _tasks(workload, workload_db, task_index, network)
    warnings = warn_if_other_host(platform, rpc)
    batch, batch_note = batch_for(trials, len(tasks), trials_per_iter)  # tune() keeps a batch that fits
    if batch_note:  # now, not after a long run
        click.echo(f"warning: {batch_note}", err=True)
    settings = MeasureSettings(number=number, repeat=repeat, min_repeat_ms=min_repeat_ms)
    from .. import tracking
    from ..io import json_safe
    from ..registry import TclRegistryError
    from ..tuner.tune import search_params
    from ..tuner.tune import tune as run_tune

    fine_tune_settings = {}
    explore = None if explore_share is None else {"share_max": explore_share}
    online = None if online_weight is None else {"weight": online_weight}
    try:  # a misspelt setting in params.yaml fails here, before a run is opened
        search_settings = {f"search_{k}": v for k, v in search_params().items()}
        if fine_tune:
            from ..tuner.fine_tune import fine_tune_params

            fine_tune_settings = {f"fine_tune_{k}": v for k, v in fine_tune_params().items()}
        from ..tuner.explore import explore_for

        explore_settings = {f"explore_{k}": v for k, v in (explore_for(cost_model, explore) or {}).items()}
        from ..tuner.online import online_for

        online_settings = {f"online_{k}": v for k, v in (online_for(cost_model, online) or {}).items()}
    except ValueError as exc:
        _fail(str(exc))
    params = {"platform": platform.name, "cost_model": cost_model, "model": model or "", "fine_tune": fine_tune,
              **fine_tune_settings, **explore_settings, **online_settings, **search_settings, "trials": trials,
              "trials_per_iter": trials_per_iter, "seed": seed, "tasks": len(tasks),
              "out": out, "rpc_key": rpc_key or ""}
    with tracking.start_run(experiment, run_name=f"tune-{cost_model}-{platform.name}") as run:
        import mlflow

        mlflow.log_params(params)
        if warnings:  # why this host's latencies may not be the platform's: another CPU, a lacking ISA extension
            mlflow.set_tag("host_mismatch", "; ".join(warnings)[:500])
        try:
            result = run_tune(platform, tasks, trials, cost_model, out, model=model, seed=seed, rpc=rpc,
                              settings=settings, progress=progress, fine_tune=fine_tune, explore=explore, online=online,
                              trials_per_iter=batch)
        except (ValueError, ConnectionError, TclRegistryError, NotImplementedError) as exc:
            mlflow.set_tag("error", str(exc)[:500])
            _fail(str(exc), 1)
        except (OSError, RuntimeError) as exc:  # a missing model file; TVM's errors (a build, the RPC link)
            text = "\n".join(str(exc).strip().splitlines()[:8])
            mlflow.set_tag("error", text[:500])
            _fail(f"{type(exc).__name__}: {text}", 1)
        if batch_note:
            mlflow.set_tag("batch", batch_note[:500])
        for note in result["warnings"]:
            click.echo(f"warning: {note}", err=True)
            mlflow.set_tag("warning", note[:500])
        mlflow.set_tag("model", str(result["model"] or ""))
        for i, row in enumerate(result["tasks"]):
            if row["best_latency_s"] is not None:
                mlflow.log_metric("best_latency_s", row["best_latency_s"], step=i)
        metrics = {k: result[k] for k in ("weighted_latency_s", "seconds", "predict_calls", "candidates_scored",
                                          "predict_seconds", "runner_restarts", "hung_runs") if result[k] is not None}
        mlflow.log_metrics(metrics)
        mlflow.log_dict(json_safe({"curves": result["curves"], "stats": result["stats"]}), "tune_curves.json")
        run_id = run.info.run_id
    line = {k: result[k] for k in ("tasks", "weighted_latency_s", "seconds", "predict_calls",
                                   "candidates_scored", "predict_seconds")}
    if as_json:
        click.echo(f"tuning database: {out} (MLflow run {run_id})", err=True)
        click.echo(json.dumps(line))
        return
    for row in result["tasks"]:
        best = "none valid" if row["best_latency_s"] is None else f"{row['best_latency_s'] * 1e6:.2f} us"
        click.echo(f"{row['task']}: best {best} after {row['trials']} trials")
    if result["weighted_latency_s"] is not None:
        click.echo(f"weighted latency {result['weighted_latency_s'] * 1e3:.4f} ms")
    click.echo(f"{result['seconds']:.1f} s; database {out}; MLflow run {run_id}")
    if result["predict_calls"]:
        click.echo(f"cost model: {result['predict_calls']} predict calls, {result['candidates_scored']} "
                   f"candidates in {result['predict_seconds']:.2f} s "
                   f"({result['candidates_scored'] / max(result['predict_seconds'], 1e-9):.0f}/s, "
                   f"{100 * result['predict_seconds'] / max(result['seconds'], 1e-9):.1f}% of the run)")
