"""Data commands: hardware registry, measurement, ingest, featurize, split."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click


def _load_params(path: str) -> dict:
    import yaml

    with open(path) as f:
        return yaml.safe_load(f)


def _fail(message: str, code: int = 2):
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


@click.group()
def hardware() -> None:
    """The hardware registry: platform -> family."""


@hardware.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def hardware_list(as_json: bool) -> None:
    from ..hardware import PLATFORMS, REGISTRY_VERSION

    rows = [
        {"platform": p.name, "family": p.family, "vendor": p.vendor, "architecture": p.architecture,
         "isa": p.isa, "cpu": p.cpu, "cores": p.cores, "compute_capability": p.compute_capability,
         "source": p.source, "target": p.target, "threads": p.threads, "restricted": p.restricted}
        for p in PLATFORMS.values()
    ]
    if as_json:
        click.echo(json.dumps({"version": REGISTRY_VERSION, "platforms": rows}))
        return
    click.echo(f"hardware registry v{REGISTRY_VERSION}")
    click.echo(f"{'platform':18} {'family':24} {'isa':36} {'cores':>5}  source")
    for r in rows:
        cores = r["cores"] if r["cores"] is not None else "-"
        click.echo(f"{r['platform']:18} {r['family']:24} {r['isa'][:36]:36} {cores!s:>5}  {r['source']}")


def _settings(measure: dict | None):
    from ..collect.measure import MeasureSettings

    return MeasureSettings(**(measure or {}))


def _rpc(tracker: str | None, key: str | None):
    from ..collect.measure import RpcSettings

    if not tracker:
        return None
    if not key:
        _fail("--rpc-tracker needs --rpc-key")
    host, _, port = tracker.rpartition(":")
    if not host or not port.isdigit():
        _fail(f"--rpc-tracker must be HOST:PORT, got {tracker!r}")
    return RpcSettings(host, int(port), key)


@click.command()
@click.option("--platform", "platform_name", required=True, help="Platform from `tcl hardware list`.")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="MetaSchedule database folder.")
@click.option("--workload", multiple=True, help="Workload/task name (repeatable).")
@click.option("--network", multiple=True, help="All tasks of a network (repeatable).")
@click.option("--trials", type=int, required=True, help="Distinct programs per task.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--rpc-tracker", default=None, help="HOST:PORT of a TVM RPC tracker.")
@click.option("--rpc-key", default=None, help="Device key registered with the tracker.")
@click.option("--number", type=int, default=1, show_default=True)
@click.option("--repeat", type=int, default=3, show_default=True)
@click.option("--min-repeat-ms", type=int, default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def collect(platform_name, out, workload, network, trials, seed, rpc_tracker, rpc_key,
            number, repeat, min_repeat_ms, as_json) -> None:
    """Measure real programs with TVM MetaSchedule into a MetaSchedule database (resumable)."""
    from ..collect.networks import Task, network_tasks
    from ..collect.workloads import resolve_workload
    from ..hardware import get_platform

    try:
        platform = get_platform(platform_name)
    except KeyError as exc:
        _fail(exc.args[0])
    if not workload and not network:
        _fail("give --workload NAME or --network NAME")
    tasks: dict = {}
    try:
        for name in workload:
            op = resolve_workload(name)
            tasks[op.key] = network_tasks().get(op.key) or Task(op.key, op, {})
        if network:
            tasks.update(network_tasks(list(network)))
    except KeyError as exc:
        _fail(exc.args[0])
    from ..collect.collector import collect as run_collect

    settings = _settings({"number": number, "repeat": repeat, "min_repeat_ms": min_repeat_ms})
    summary = run_collect([platform], list(tasks.values()), trials, out, settings=settings, seed=seed,
                          rpc=_rpc(rpc_tracker, rpc_key), per_platform_dirs=False)
    s = summary[platform.name]
    result = {"platform": platform.name, "tasks": len(tasks), **s}
    click.echo(json.dumps(result) if as_json else
               f"{platform.name}: {s['measured']} measured now, {s['present']} already present, "
               f"failures: {s['failed'] or 'none'}")


@click.group()
def dataset() -> None:
    """The bundled multi-platform dataset (measured outside the pipeline)."""


@dataset.command("collect")
@click.option("--params", "params_path", default="params.yaml", show_default=True)
@click.option("--tasks", "max_tasks", type=int, default=None, help="Only the first N tasks of the list.")
def dataset_collect(params_path: str, max_tasks: int | None) -> None:
    """Measure `dataset.tasks` × `dataset.programs_per_task` on every platform (resumable)."""
    from ..collect.collector import collect as run_collect
    from ..collect.networks import network_tasks
    from ..hardware import get_platform

    params = _load_params(params_path)
    spec = params["dataset"]
    all_tasks = network_tasks()
    tasks = [all_tasks[name] for name in spec["tasks"]][:max_tasks]
    platforms = [get_platform(name) for name in params["platforms"]]
    summary = run_collect(platforms, tasks, spec["programs_per_task"], spec["out"],
                          settings=_settings(spec.get("measure")), seed=spec.get("seed", 0))
    click.echo(json.dumps(summary, indent=2))
