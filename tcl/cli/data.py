"""Data commands: hardware registry, measurement, ingest, featurize, split."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ..io import json_safe
from ..sampling import STRATEGIES as SAMPLING_STRATEGIES


def _load_params(path: str) -> dict:
    from ..config import ParamsError, load_params

    try:
        return load_params(path)
    except ParamsError as exc:
        _fail(str(exc), 1)


def _fail(message: str, code: int = 2):
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


@click.group()
def hardware() -> None:
    """The hardware registry: platform -> family."""


@hardware.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def hardware_list(as_json: bool) -> None:
    """Platforms of the packaged registry and of the project's own (`defined_in` says which)."""
    from ..hardware import PACKAGED, HardwareRegistryError, load_registry

    try:
        reg = load_registry()
    except HardwareRegistryError as exc:
        _fail(str(exc), 1)
    rows = [
        {"platform": p.name, "family": p.family, "vendor": p.vendor, "architecture": p.architecture,
         "isa": p.isa, "cpu": p.cpu, "cores": p.cores, "compute_capability": p.compute_capability,
         "source": p.source, "target": p.target, "threads": p.threads, "restricted": p.restricted,
         "host_cpu": p.host_cpu, "host_cpuid": p.host_cpuid, "defined_in": p.defined_in}
        for p in reg.platforms.values()
    ]
    if as_json:
        families = [{"family": f.name, "vendor": f.vendor, "architecture": f.architecture, "isa": f.isa,
                     "defined_in": f.defined_in} for f in reg.families.values()]
        click.echo(json.dumps({"version": reg.version, "user_registry": str(reg.user_path),
                               "families": families, "platforms": rows}))
        return
    n_user = sum(r["defined_in"] != PACKAGED for r in rows)
    state = f"{n_user} platform(s)" if reg.user_path.is_file() else "none yet"
    click.echo(f"hardware registry v{reg.version}; user registry {reg.user_path} ({state})")
    click.echo(f"{'platform':18} {'family':24} {'isa':36} {'cores':>5}  {'source':12} defined in")
    for r in rows:
        cores = r["cores"] if r["cores"] is not None else "-"
        where = "package" if r["defined_in"] == PACKAGED else "user"
        click.echo(f"{r['platform']:18} {r['family']:24} {r['isa'][:36]:36} {cores!s:>5}  "
                   f"{r['source']:12} {where}")


@hardware.command("add")
@click.argument("name")
@click.option("--family", required=True, help="Family from `tcl hardware list` (or `add-family` first).")
@click.option("--target", "target_json", default=None,
              help='TVM target JSON, e.g. \'{"kind": "llvm", "mcpu": "znver4", "num-cores": 2}\' '
                   "(makes the platform measurable by `tcl collect`).")
@click.option("--threads", type=int, default=None,
              help="TVM_NUM_THREADS when measuring (default: the target's num-cores, else 1).")
@click.option("--cpu", default="", help="What the hardware is, in words.")
@click.option("--cores", type=int, default=None)
@click.option("--restricted", default="", help="What differs from the full machine (ISA, threads).")
@click.option("--host-cpu", default="",
              help="Text the CPU model name of the host measuring this platform contains (e.g. 'EPYC 9R14'); "
                   "`tcl collect`/`tcl tune` warn when measuring it on another CPU without RPC. "
                   "'here': this host's model name, and its CPUID (vendor, family, model), checked too.")
def hardware_add(name, family, target_json, threads, cpu, cores, restricted, host_cpu) -> None:
    """Add platform NAME to the project's user registry (see `tcl hardware list` for its path)."""
    from ..hardware import HardwareRegistryError, add_platform, check_target, local_cpu_id, local_cpu_model

    try:
        target = None if target_json is None else check_target(target_json, "--target")
        if target is not None:
            _check_target_with_tvm(target)
        p = add_platform(name, family, target=target, threads=threads, cpu=cpu, cores=cores,
                         restricted=restricted,
                         host_cpu=local_cpu_model() if host_cpu == "here" else host_cpu,
                         host_cpuid=local_cpu_id() if host_cpu == "here" else "")
    except HardwareRegistryError as exc:
        _fail(str(exc))
    click.echo(f"added platform {p.name} (family {p.family}{', measurable' if p.measurable else ''}) "
               f"to {p.defined_in}")


def _check_target_with_tvm(target: dict) -> None:
    """TVM's own parse of the target, when TVM is installed (an unknown kind or option fails)."""
    from ..hardware import HardwareRegistryError

    try:
        import tvm
    except ImportError:
        return
    try:
        tvm.target.Target(target)
    except Exception as exc:  # noqa: BLE001 - TVM reports a bad target with several kinds
        raise HardwareRegistryError(f"--target: TVM refuses {json.dumps(target)}: "
                                    f"{str(exc).splitlines()[0]}") from None


@hardware.command("add-family")
@click.argument("name")
@click.option("--vendor", required=True)
@click.option("--architecture", required=True)
@click.option("--isa", required=True, help="Instruction set the code is generated for.")
def hardware_add_family(name, vendor, architecture, isa) -> None:
    """Add hardware family NAME to the project's user registry."""
    from ..hardware import HardwareRegistryError, add_family

    try:
        f = add_family(name, vendor, architecture, isa)
    except HardwareRegistryError as exc:
        _fail(str(exc))
    click.echo(f"added family {f.name} to {f.defined_in}")


def _settings(measure: dict | None):
    from ..collect.measure import MeasureSettings

    return MeasureSettings(**(measure or {}))


def rpc_settings(tracker: str | None, key: str | None):
    """`--rpc-tracker`/`--rpc-key` as RpcSettings (None: measure here); a usage error if malformed."""
    from ..collect.measure import RpcSettings

    try:
        return RpcSettings.from_options(tracker, key)
    except ValueError as e:
        _fail(str(e))


def warn_if_other_host(platform, rpc) -> list[str]:
    """Warn (stderr) when measuring `platform` here, without RPC, on a CPU that is not its own
    (hardware registry ``host_cpu``) or that lacks some of its target's later ISA extensions; the
    warnings given. The JSON lines keep their contracts: the mismatch is recorded in the
    database's collect.json and the tuning run's MLflow tags."""
    from ..hardware import host_mismatch, isa_warning

    if rpc is not None:
        return []
    warnings = [w for w in (host_mismatch(platform), isa_warning(platform)) if w]
    for why in warnings:
        click.echo(f"warning: {why}", err=True)
    return warnings


def _list_tasks(ctx, _param, value) -> None:
    """`tcl collect --list-tasks`: the names `--workload` resolves, then exit (before the required options)."""
    if not value or ctx.resilient_parsing:
        return
    from ..collect.networks import NETWORKS, network_tasks
    from ..collect.workloads import SHAPE_FORMS, SMALL_WORKLOADS

    click.echo("small workloads: " + ", ".join(SMALL_WORKLOADS))
    click.echo(f"any operator by its shape: {SHAPE_FORMS}")
    for name, task in network_tasks().items():
        nets = ", ".join(f"{n} x{c}" for n, c in sorted(task.weights.items()))
        click.echo(f"{name}  ({nets})")
    click.echo(f"networks (--network): {', '.join(NETWORKS)}")
    ctx.exit()


@click.command()
@click.option("--platform", "platform_name", required=True, help="Platform from `tcl hardware list`.")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="MetaSchedule database folder.")
@click.option("--workload", multiple=True,
              help="Workload/task name, or an operator by its shape, e.g. dense_512_1024_256 "
                   "(`--list-tasks` gives the forms; repeatable).")
@click.option("--network", multiple=True, help="All tasks of a network (repeatable).")
@click.option("--workload-db", default=None, type=click.Path(exists=True),
              help="Every workload of a MetaSchedule database (its folder or database_workload.json; e.g. a "
                   "model's tasks as TVM extracted them), as `tcl tune --workload-db` reads it.")
@click.option("--task-index", type=int, default=None, help="Only workload I (0-based) of --workload-db.")
@click.option("--trials", type=int, default=None, help="Distinct programs per task (required without --sample).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--rpc-tracker", default=None, help="HOST:PORT of a TVM RPC tracker.")
@click.option("--rpc-key", default=None, help="Device key registered with the tracker.")
@click.option("--number", type=int, default=1, show_default=True)
@click.option("--repeat", type=int, default=3, show_default=True)
@click.option("--min-repeat-ms", type=int, default=20, show_default=True)
@click.option("--sample", "strategy", type=click.Choice(list(SAMPLING_STRATEGIES)), default=None,
              help="Active collection: generate candidates without measuring them and measure only the "
                   "ones this strategy chooses, round by round (needs --budget; docs/sampling.md).")
@click.option("--budget", type=int, default=None, help="With --sample: programs to measure in all.")
@click.option("--rounds", type=int, default=None, help="With --sample: rounds of choose -> measure -> retrain "
                                                       "(default: params.yaml sample.rounds).")
@click.option("--pool-size", type=int, default=256, show_default=True,
              help="With --sample: candidate programs generated per task.")
@click.option("--model", "model_refs", multiple=True,
              help="With --sample: a cost model whose embedding and uncertainty serve from the first round "
                   "(checkpoint, training dir or MLflow URI, as `tcl evaluate --model`); repeated: an "
                   "ensemble, as `tcl sample --model`.")
@click.option("--params", "params_path", default="params.yaml", show_default=True,
              help="With --sample: params.yaml with the sample: section (and featurize.max_len).")
@click.option("--json", "as_json", is_flag=True)
@click.option("--list-tasks", is_flag=True, is_eager=True, expose_value=False, callback=_list_tasks,
              help="Print the workload and network task names --workload takes, and exit.")
def collect(platform_name, out, workload, network, workload_db, task_index, trials, seed, rpc_tracker, rpc_key,
            number, repeat, min_repeat_ms, strategy, budget, rounds, pool_size, model_refs, params_path,
            as_json) -> None:
    """Measure real programs with TVM MetaSchedule into a MetaSchedule database (resumable).

    With --sample, only the programs a sampler chooses from --pool-size candidates per task are
    measured, round by round, until --budget is spent."""
    from ..collect.networks import Task, network_tasks
    from ..collect.workloads import database_workloads, resolve_workload
    from ..hardware import get_platform

    try:
        platform = get_platform(platform_name)
    except (KeyError, ValueError) as exc:
        _fail(exc.args[0])
    if not workload and not network and workload_db is None:
        _fail("give --workload NAME, --network NAME or --workload-db PATH")
    if task_index is not None and workload_db is None:
        _fail("--task-index goes with --workload-db")
    if strategy is None and trials is None:
        _fail("give --trials N (or --sample STRATEGY --budget N)")
    if strategy is not None and budget is None:
        _fail("--sample needs --budget N (programs to measure)")
    if strategy is None and (budget is not None or rounds is not None or model_refs):
        _fail("--budget, --rounds and --model need --sample STRATEGY")
    if strategy is not None and trials is not None:  # it would be silently ignored
        _fail("--trials is a plain collection's programs per task; with --sample, --budget and "
              "--pool-size say how many are measured and offered")
    tasks: dict = {}
    try:
        for name in workload:
            op = resolve_workload(name)
            tasks[op.key] = network_tasks().get(op.key) or Task(op.key, op, {})
        if network:
            tasks.update(network_tasks(list(network)))
        if workload_db is not None:
            tasks.update({w.name: w.task() for w in database_workloads(workload_db, task_index)})
    except (KeyError, ValueError, FileNotFoundError) as exc:
        _fail(exc.args[0] if exc.args else str(exc))
    settings = _settings({"number": number, "repeat": repeat, "min_repeat_ms": min_repeat_ms})
    rpc = rpc_settings(rpc_tracker, rpc_key)
    warn_if_other_host(platform, rpc)
    if strategy is not None:
        result = _collect_active(platform, list(tasks.values()), out, settings, rpc,
                                 strategy, budget, rounds, pool_size, seed, model_refs, params_path)
        click.echo(json.dumps(json_safe(result)) if as_json else
                   f"{platform.name}: {result['measured']} measured now, {result['present']} already present "
                   f"(budget {result['budget']} of a pool of {result['pool']}, {result['strategy']}, "
                   f"{len(result['rounds'])} round(s) now), failures: {result['failed'] or 'none'}")
        return
    from ..collect.collector import collect as run_collect

    try:
        summary = run_collect([platform], list(tasks.values()), trials, out, settings=settings, seed=seed,
                              rpc=rpc, per_platform_dirs=False)
    except (ValueError, ConnectionError) as exc:
        _fail(str(exc))
    s = summary[platform.name]
    result = {"platform": platform.name, "tasks": len(tasks), **s}
    click.echo(json.dumps(result) if as_json else
               f"{platform.name}: {s['measured']} measured now, {s['present']} already present, "
               f"failures: {s['failed'] or 'none'}")


def _collect_active(platform, tasks, out, settings, rpc, strategy, budget, rounds, pool_size, seed,
                    model_refs, params_path) -> dict:
    """`tcl collect --sample`: the work is in tcl.sampling.active."""
    import tempfile

    from ..sampling import SampleSettings, SamplingError
    from ..sampling.active import ActiveSettings, collect_active
    from ..sampling.subset import run_settings
    from .models import _params, load_model_refs

    params = _params(params_path)
    try:
        sample_settings = SampleSettings.from_params(params)
    except ValueError as exc:
        _fail(f"{params_path}: {exc}")
    active = ActiveSettings(strategy=strategy, budget=budget, pool_size=pool_size, seed=seed,
                            rounds=run_settings(params)["rounds"] if rounds is None else rounds,
                            max_len=int((params.get("featurize") or {}).get("max_len", 48)))
    with tempfile.TemporaryDirectory(prefix="tcl-collect-") as tmp:
        model, _ = load_model_refs(model_refs, tmp)
        try:
            return collect_active(platform, tasks, out, active, sample_settings, model=model,
                                  settings=settings, rpc=rpc)
        except (SamplingError, ValueError, ConnectionError) as exc:
            _fail(str(exc))


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
    spec = params.get("dataset")
    if not isinstance(spec, dict) or "platforms" not in params or \
            any(k not in spec for k in ("tasks", "programs_per_task", "out")):
        _fail(f"{params_path}: collect needs `platforms` and `dataset.tasks`, "
              "`dataset.programs_per_task`, `dataset.out`", 1)
    task_names, platform_names = spec["tasks"], params["platforms"]
    all_tasks = network_tasks()
    unknown = [name for name in task_names if name not in all_tasks]
    if unknown:
        _fail(f"{params_path}: unknown task(s) {', '.join(unknown)} in dataset.tasks", 1)
    tasks = [all_tasks[name] for name in task_names][:max_tasks]
    try:
        platforms = [get_platform(name) for name in platform_names]
    except (KeyError, ValueError) as exc:
        _fail(f"{params_path}: {exc.args[0]}", 1)
    for platform in platforms:
        warn_if_other_host(platform, None)
    try:  # a platform this host cannot run is refused before anything is measured
        summary = run_collect(platforms, tasks, spec["programs_per_task"], spec["out"],
                              settings=_settings(spec.get("measure")), seed=spec.get("seed", 0))
    except ValueError as exc:
        _fail(str(exc), 1)
    click.echo(json.dumps(summary, indent=2))


@click.command()
@click.argument("src", type=click.Path())
@click.option("--platform", "platform_name", required=True)
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Output .parquet file.")
@click.option("--format", "fmt", type=click.Choice(["auto", "ansor", "metaschedule"]), default="auto",
              show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Last line printed is one JSON summary object.")
@click.option("--progress/--no-progress", default=False)
def ingest(src, platform_name, out, fmt, as_json, progress) -> None:
    """Read measure records (Ansor JSON lines or MetaSchedule databases) into FILE.parquet.

    Bad records are skipped, counted by reason and kept in OUT.rejects.jsonl; exit status is
    non-zero only when no valid record remains.
    """
    from ..hardware import get_platform
    from ..records.ingest import NoValidRecords, ingest as run_ingest

    try:
        get_platform(platform_name)
        report = run_ingest(src, platform_name, out, fmt, progress=progress)
    except (KeyError, FileNotFoundError, NoValidRecords, ValueError) as exc:
        _fail(exc.args[0] if exc.args else str(exc), 1)
    summary = report.as_dict()
    rejected = sum(summary["rejected"].values())
    click.echo(f"{platform_name}: {report.records} records of {report.tasks} tasks -> {out}", err=as_json)
    if rejected:
        detail = ", ".join(f"{k}: {v}" for k, v in summary["rejected"].items())
        click.echo(f"rejected {rejected} ({detail}); kept in {report.rejects_path}", err=as_json)
    if as_json:
        click.echo(json.dumps(summary))


@click.command()
@click.argument("records", type=click.Path(exists=True, dir_okay=False))
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Output .npz feature file.")
@click.option("--max-len", type=int, default=48, show_default=True, help="Steps kept per program (L).")
@click.option("--perstore-from", "database", default=None, type=click.Path(exists=True, file_okay=False),
              help="Also write MetaSchedule's per-store features (OUT's .perstore.npz sibling), from this "
                   "MetaSchedule database: the one RECORDS was ingested from.")
@click.option("--workers", type=int, default=2, show_default=True, help="Processes extracting per-store features.")
@click.option("--cache-dir", default=None, type=click.Path(file_okay=False),
              help="Reuse per-store features computed for another platform with the same kind of target.")
@click.option("--progress/--no-progress", default=False)
@click.option("--json", "as_json", is_flag=True)
def featurize(records, out, max_len, database, workers, cache_dir, progress, as_json) -> None:
    """Turn a records Parquet file into a step-sequence feature set (.npz) with labels."""
    import time

    from ..features import featurize_file

    try:
        fs = featurize_file(records, out, max_len)
    except ValueError as exc:
        _fail(str(exc), 1)
    summary = {"programs": len(fs), "tasks": len(fs.tasks), "shape": list(fs.x.shape),
               "feature_version": fs.meta["feature_version"], "cropped": int((fs.mask.sum(1) == max_len).sum())}
    click.echo(f"{records}: {len(fs)} programs, {len(fs.tasks)} tasks, features {tuple(fs.x.shape)} "
               f"({fs.meta['feature_version']}) -> {out}", err=as_json)
    if database:
        from ..perstore import perstore_path
        from ..perstore_extract import extract_perstore

        start = time.perf_counter()
        try:
            ps, n_cached = extract_perstore(fs, records, database, workers=workers, cache_dir=cache_dir,
                                            progress=progress)
        except (ValueError, FileNotFoundError) as exc:
            _fail(str(exc), 1)
        seconds = time.perf_counter() - start
        ps.save(perstore_path(out))
        summary["perstore"] = {"stores": int(len(ps.stores)), "n_features": ps.meta["n_features"],
                               "failed": len(ps.meta["failed"]), "cached": n_cached,
                               "seconds": round(seconds, 2), "programs_per_s": round(len(ps) / max(seconds, 1e-9), 1)}
        p = summary["perstore"]
        click.echo(f"per-store features: {p['stores']} stores x {p['n_features']} of {len(ps)} programs "
                   f"({p['cached']} from the cache, {p['failed']} failed) in {p['seconds']} s, "
                   f"{p['programs_per_s']} programs/s -> {perstore_path(out)}", err=as_json)
        for bad in ps.meta["failed"][:5]:
            click.echo(f"  not extracted: row {bad['row']} ({bad['task']}): {bad['error']}", err=True)
    if as_json:
        click.echo(json.dumps(summary))


@click.command()
@click.argument("features", type=click.Path(exists=True, dir_okay=False))
@click.option("--out-dir", required=True, type=click.Path(file_okay=False))
@click.option("--test-networks", default="resnet50,bert_base", show_default=True)
@click.option("--valid-fraction", type=float, default=0.1, show_default=True)
@click.option("--test-fraction", type=float, default=0.0, show_default=True,
              help="Also hold out this share of the other tasks for test (for records that name no network).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def split(features, out_dir, test_networks, valid_fraction, test_fraction, seed, as_json) -> None:
    """Split a feature set into train/valid/test, holding out whole networks (and a share of the
    other tasks with --test-fraction) for test."""
    from ..features import load_feature_set
    from ..perstore import load_perstore_set, perstore_path
    from ..split import split_by_network

    networks = [n for n in test_networks.split(",") if n]
    per_store = perstore_path(features)
    try:
        fs = load_feature_set(features, finite_only=False)  # the per-store set beside it keeps every program too
        parts = split_by_network(fs, networks, valid_fraction, seed, test_fraction)
        # the per-store features beside it are split alike: the same tasks, hence the same programs
        ps = load_perstore_set(per_store) if per_store.is_file() else None
        ps_parts = split_by_network(ps, networks, valid_fraction, seed, test_fraction) if ps is not None else {}
    except ValueError as exc:
        _fail(str(exc) if str(exc).startswith((features, str(per_store))) else f"{features}: {exc}", 1)
    if ps is not None and (list(ps.program_id) != list(fs.program_id) or ps.tasks != fs.tasks):
        _fail(f"{per_store}: its programs are not those of {features}; featurize again", 1)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    summary = {}
    for name, part in parts.items():
        part.save(Path(out_dir) / f"{name}.npz")
        if name in ps_parts:
            ps_parts[name].save(perstore_path(Path(out_dir) / f"{name}.npz"))
        else:  # one left by an earlier split would describe other programs
            perstore_path(Path(out_dir) / f"{name}.npz").unlink(missing_ok=True)
        summary[name] = {"programs": len(part), "tasks": len(part.tasks), "networks": part.networks()}
    click.echo(json.dumps(summary) if as_json else
               "\n".join(f"{k}: {v['programs']} programs, {v['tasks']} tasks" for k, v in summary.items()))


@dataset.command("pack")
@click.option("--params", "params_path", default="params.yaml", show_default=True)
@click.option("--out", default="data/raw", show_default=True)
@click.option("--tasks", "max_tasks", type=int, default=None,
              help="Only the first N tasks of dataset.tasks (leave out tasks still being measured).")
def dataset_pack(params_path: str, out: str, max_tasks: int | None) -> None:
    """Copy the matched programs of the working databases into the bundled dataset (gzip)."""
    _ship("pack", params_path, out, max_tasks=max_tasks)


@dataset.command("snapshot")
@click.option("--params", "params_path", default="params.yaml", show_default=True)
@click.option("--out", default="data/collecting", show_default=True)
def dataset_snapshot(params_path: str, out: str) -> None:
    """Save every record of the working databases (matched or not), gzip, to resume later."""
    _ship("snapshot", params_path, out)


def _ship(command: str, params_path: str, out: str, max_tasks: int | None = None) -> None:
    """`dataset pack` (matched programs of the first `max_tasks` tasks) or `dataset snapshot`
    (every record) of the working databases named by params.yaml."""
    from ..collect.pack import pack

    params = _load_params(params_path)
    try:
        work, platforms = params["dataset"]["out"], params["platforms"]
        only = None if max_tasks is None else set(params["dataset"]["tasks"][:max_tasks])
    except (KeyError, TypeError):
        _fail(f"{params_path}: {command} needs `dataset.out` and `platforms`", 1)
    try:
        summary = pack(work, platforms, out, matched_only=command == "pack", task_names=only)
    except (OSError, ValueError) as exc:
        _fail(f"{command} failed, {out} left as it was: {exc}", 1)
    click.echo(json.dumps(summary, indent=2))


@dataset.command("unpack")
@click.option("--params", "params_path", default="params.yaml", show_default=True)
@click.option("--raw", "raw_root", default="data/raw", show_default=True, type=click.Path(file_okay=False))
@click.option("--force", is_flag=True, help="Replace working databases that already exist.")
def dataset_unpack(params_path: str, raw_root: str, force: bool) -> None:
    """Restore the working databases (params.yaml dataset.out) from the bundle, to resume collecting."""
    from ..collect.pack import unpack

    params = _load_params(params_path)
    try:
        summary = unpack(raw_root, params["platforms"], params["dataset"]["out"], force=force)
    except FileExistsError as exc:
        _fail(str(exc), 1)
    click.echo(json.dumps(summary, indent=2))


@dataset.command("stats")
@click.option("--raw", "raw_root", default="data/raw", show_default=True, type=click.Path(file_okay=False),
              help="Bundled dataset root: one MetaSchedule database per platform.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as one JSON object.")
@click.option("--out", default=None, type=click.Path(dir_okay=False),
              help="Also write the JSON there (e.g. data/stats/stats.json).")
@click.option("--noise", "noise_glob", default="data/stats/noise-*.json", show_default=True,
              help="Re-measure noise reports (`tcl dataset noise --out`) to show per platform (glob).")
def dataset_stats(raw_root: str, as_json: bool, out: str | None, noise_glob: str) -> None:
    """Counts per platform, re-measure noise and cross-platform rank agreement on matched programs."""
    import glob

    from ..collect.stats import dataset_stats as compute, format_stats, noise_summary
    from ..io import atomic_write_json

    try:
        stats = compute(raw_root)
        reports = [json.loads(Path(p).read_text()) for p in sorted(glob.glob(noise_glob))]
    except (FileNotFoundError, KeyError) as exc:
        _fail(exc.args[0] if exc.args else str(exc), 1)
    stats["noise"] = {p: n for p, n in noise_summary(reports).items() if p in stats["platforms"]}
    if out:
        atomic_write_json(out, stats)
    click.echo(json.dumps(stats, indent=1) if as_json else format_stats(stats))


@dataset.command("noise")
@click.option("--platform", "platform_name", required=True, help="Platform whose database is re-measured.")
@click.option("--raw", "raw_root", default="data/raw", show_default=True, type=click.Path(file_okay=False),
              help="Dataset root; the database is RAW/PLATFORM.")
@click.option("--programs", type=int, default=100, show_default=True, help="Random valid programs to re-measure.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--out", default=None, type=click.Path(dir_okay=False),
              help="Write the report (JSON) there (e.g. data/stats/noise-PLATFORM.json).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--progress/--no-progress", default=True)
def dataset_noise(platform_name, raw_root, programs, seed, out, as_json, progress) -> None:
    """Re-measure random programs with the recorded settings: median |new-old|/old."""
    from ..collect.noise import format_noise, remeasure
    from ..hardware import get_platform
    from ..io import atomic_write_json

    try:
        platform = get_platform(platform_name)
    except (KeyError, ValueError) as exc:
        _fail(exc.args[0] if exc.args else str(exc), 1)
    # re-measuring on another CPU compares that CPU's latencies with the platform's: say so
    warn_if_other_host(platform, None)
    try:
        report = remeasure(Path(raw_root) / platform_name, platform_name, programs, seed, progress=progress)
    except (FileNotFoundError, ValueError) as exc:
        _fail(exc.args[0] if exc.args else str(exc), 1)
    if out:
        atomic_write_json(out, report)
    click.echo(json.dumps({k: v for k, v in report.items() if k != "detail"}) if as_json else format_noise(report))


@dataset.command("datasheet")
@click.option("--stats", "stats_path", default="data/stats/stats.json", show_default=True)
@click.option("--noise", "noise_glob", default="data/stats/noise-*.json", show_default=True,
              help="Noise reports to include (glob).")
@click.option("--raw", "raw_root", default="data/raw", show_default=True, type=click.Path(file_okay=False))
@click.option("--params", "params_path", default="params.yaml", show_default=True)
@click.option("--collected", default=None, help="When and how the data was collected (free text); default: "
              "params.yaml dataset.collected, else derived from the noise reports.")
@click.option("--out", default="data/DATASHEET.md", show_default=True, type=click.Path(dir_okay=False))
def dataset_datasheet(stats_path, noise_glob, raw_root, params_path, collected, out) -> None:
    """Write the dataset's datasheet from the stats/noise JSON files."""
    import glob

    from ..collect.datasheet import write_datasheet

    try:
        params = _load_params(params_path)
        collected = collected or (params.get("dataset") or {}).get("collected")
        write_datasheet(stats_path, [Path(p) for p in glob.glob(noise_glob)], params, raw_root, out,
                        collected=collected)
    except FileNotFoundError as exc:
        _fail(exc.args[0], 1)
    click.echo(f"wrote {out}")
