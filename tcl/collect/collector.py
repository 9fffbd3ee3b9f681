"""Drive measurement: tasks × programs × platforms into one MetaSchedule database per platform.

Layout of an output root (one folder per platform, each a MetaSchedule JSON database):

    <out>/<platform>/database_workload.json
    <out>/<platform>/database_tuning_record.json
    <out>/<platform>/tasks.json          task metadata MetaSchedule does not keep (name, weight, networks)
    <out>/<platform>/collect.json        measurement settings and target used

Programs are generated once per task (on the first platform's target) and measured on every
platform, so platforms are compared on matched programs. Builds are shared by platforms whose
code-generation target is the same (e.g. one ISA at 1 and 2 runtime threads). Work is committed
in chunks, so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

from ..hardware import Platform, host_mismatch, local_cpu_model, require_measurable
from ..io import atomic_write_json
from .measure import (
    GuardedRunner,
    MeasureSettings,
    RpcSettings,
    build_all,
    commit,
    existing_programs,
    make_builder,
    open_database,
    remove_artifacts,
    run_all,
    sample_programs,
    wait_for_quiet_cpu,
)
from .networks import Task
from .workloads import task_description, task_kind, task_module

CHUNK = 32  # programs built/run/committed together


def _task_meta(task: Task) -> dict:
    return {
        "name": task.name,
        "desc": task_description(task),
        "kind": task_kind(task),
        "weights": task.weights,
        "networks": task.networks,
        "weight": task.weight,
    }


def record_task(out: Path, shash: str, task: Task) -> None:
    path = out / "tasks.json"
    tasks = json.loads(path.read_text()) if path.exists() else {}
    if tasks.get(shash) != _task_meta(task):
        tasks[shash] = _task_meta(task)
        atomic_write_json(path, tasks)


def record_settings(out: Path, platform: Platform, settings: MeasureSettings, seed: int,
                     rpc: RpcSettings | None) -> None:
    import tvm

    local_cpu = None if rpc is not None else local_cpu_model()  # where the latencies come from
    atomic_write_json(out / "collect.json", {
        "platform": platform.name,
        "family": platform.family,
        "target": platform.target,
        "threads": platform.threads,
        "settings": settings.as_dict(),
        "seed": seed,
        "rpc": None if rpc is None else {"tracker": f"{rpc.tracker_host}:{rpc.tracker_port}", "key": rpc.key},
        "tvm_version": tvm.__version__,
        "host_cpu": local_cpu,
        "host_mismatch": None if local_cpu is None else host_mismatch(platform, local_cpu),
    })


def _target_key(target: dict) -> str:
    return json.dumps(target, sort_keys=True)


def collect(
    platforms: list[Platform],
    tasks: list[Task],
    n_programs: int,
    out_root: str | os.PathLike,
    settings: MeasureSettings | None = None,
    seed: int = 0,
    rpc: RpcSettings | None = None,
    per_platform_dirs: bool = True,
    progress: bool = True,
) -> dict:
    """Measure `n_programs` distinct programs of every task on every platform (resumable).

    With `per_platform_dirs=False` (a single platform), the database goes straight into
    `out_root`. Returns counts per platform: measured now, already present, failed by reason.
    """
    from tqdm import tqdm
    from tvm_ffi import structural_hash

    settings = settings or MeasureSettings()
    for p in platforms:
        require_measurable(p, here=rpc is None)
    out_root = Path(out_root)
    outs = {p.name: (out_root / p.name if per_platform_dirs else out_root) for p in platforms}
    dbs = {}
    for p in platforms:
        outs[p.name].mkdir(parents=True, exist_ok=True)
        record_settings(outs[p.name], p, settings, seed, rpc)
        dbs[p.name] = open_database(outs[p.name])

    builder = make_builder(settings)
    runners = {p.name: GuardedRunner(p.threads or 1, settings, rpc) for p in platforms}
    groups: dict[str, list[Platform]] = {}
    for p in platforms:
        groups.setdefault(_target_key(p.target), []).append(p)

    summary = {p.name: {"measured": 0, "present": 0, "failed": Counter(), "short_tasks": {},
                        "waited_for_quiet_cpu_s": 0.0} for p in platforms}
    bar = tqdm(total=len(tasks) * n_programs * len(platforms), disable=not progress,
               unit="meas", desc="collect")
    for t_index, task in enumerate(tasks):
        mod = task_module(task)
        shash = str(structural_hash(mod))
        for p in platforms:
            record_task(outs[p.name], shash, task)
        done = {p.name: existing_programs(dbs[p.name], mod) for p in platforms}
        programs = sample_programs(mod, platforms[0].target, n_programs, seed=seed * 1000 + t_index)
        for p in platforms:
            summary[p.name]["present"] += sum(pid in done[p.name] for _, _, pid in programs)
        bar.update(sum(pid in done[p.name] for _, _, pid in programs for p in platforms))
        bar.set_postfix_str(task.name)
        for start in range(0, len(programs), CHUNK):
            chunk = programs[start:start + CHUNK]
            for group in groups.values():
                todo = [prog for prog in chunk if any(prog[2] not in done[p.name] for p in group)]
                if not todo:
                    continue
                mods = [sch.mod for sch, _, _ in todo]
                builds = build_all(builder, mods, group[0].target)
                for p in group:
                    need = [i for i, prog in enumerate(todo) if prog[2] not in done[p.name]]
                    if rpc is None:
                        os.environ["TVM_NUM_THREADS"] = str(p.threads or 1)
                        summary[p.name]["waited_for_quiet_cpu_s"] += wait_for_quiet_cpu(settings)
                    outcomes = run_all(runners[p.name], [mods[i] for i in need],
                                       [builds[i] for i in need], p.target)
                    for i, (secs, err) in zip(need, outcomes):
                        sch, _, pid = todo[i]
                        commit(dbs[p.name], mod, sch.trace, secs, p.target)
                        done[p.name].add(pid)
                        summary[p.name]["measured"] += 1
                        if err:  # "build: ..." / "run: ...": count by stage and TVM's last line
                            stage, _, last = err.partition(": ")
                            summary[p.name]["failed"][f"{stage}: {last[:80]}"] += 1
                    bar.update(len(need))
                remove_artifacts(builds)
        if len(programs) < n_programs:  # a small design space: say so rather than loop forever
            for p in platforms:
                summary[p.name]["short_tasks"][task.name] = len(programs)
    bar.close()
    for p in platforms:  # what the runner's guard did: 0 and 0 on a healthy run
        summary[p.name]["runner_restarts"] = runners[p.name].restarts
        summary[p.name]["hung_runs"] = runners[p.name].hung
        runners[p.name].close()
    return {name: {**s, "failed": dict(s["failed"])} for name, s in summary.items()}
