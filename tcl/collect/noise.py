"""Measurement noise of the bundled dataset (`tcl dataset noise`).

Draw random valid programs from one platform's database, measure them again exactly as the
collection did (the target, runtime threads and evaluator settings recorded in its
`collect.json`; MetaSchedule's builder and runner through `tcl.collect.measure`), and compare
each new latency with the stored one: `|new - old| / old`. The median of that is the noise
figure of the dataset; the spread of `new / old` shows any drift (background load, frequency).

A stored program is rebuilt from its database line: the workload IRModule from
`database_workload.json(.gz)`, the trace from the tuning record, replayed on the workload
with its post-processing steps (as MetaSchedule applies a database record).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import platform as pyplatform
import random
import statistics
import subprocess
import time
from pathlib import Path

import orjson

from ..hardware import get_platform, host_mismatch, local_cpu_model, require_runnable_here
from ..records import check_latencies, steps_id, steps_json
from ..records.metaschedule import trace_to_steps
from .measure import (
    GuardedRunner,
    MeasureSettings,
    build_all,
    make_builder,
    remove_artifacts,
    run_all,
    use_x86_intrinsics_only,
)
from .stats import _open, read_task_meta

CHUNK = 32


def machine_info() -> dict:
    """CPU model, ISA flags, cores and memory of this machine (where measurements run)."""
    info: dict = {"kernel": pyplatform.release(), "python": pyplatform.python_version()}
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    flags = []
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            flags = value.split()
            break
    info["cpu_model"] = local_cpu_model()
    simd = ("sse", "ssse", "avx", "fma", "f16c", "amx", "vnni", "bmi")
    info["isa_flags"] = sorted(f for f in flags if f.startswith(simd))
    info["logical_cpus"] = os.cpu_count()
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        info["memory_gib"] = round(pages / 2**30, 1)
    except (ValueError, OSError):
        info["memory_gib"] = None
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        keep = ("Architecture", "CPU(s)", "Thread(s) per core", "Core(s) per socket", "Socket(s)",
                "Vendor ID", "Model name", "CPU family", "Model", "Hypervisor vendor", "Virtualization type", "L1d cache",
                "L2 cache", "L3 cache", "CPU max MHz")
        info["lscpu"] = {k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in out.splitlines())
                         if k.strip() in keep}
    except (OSError, subprocess.SubprocessError):
        info["lscpu"] = {}
    return info


def package_versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("apache-tvm", "apache-tvm-ffi"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def read_programs(db_dir: str | Path) -> tuple[list, list[dict]]:
    """(workload lines, programs): every tuning record of a database with its task, program id,
    stored latency (None when it failed) and its raw line body."""
    db_dir = Path(db_dir)
    with _open(db_dir / "database_workload.json") as f:
        workloads = [orjson.loads(line) for line in f if line.strip()]
    meta = read_task_meta(db_dir)
    programs = []
    with _open(db_dir / "database_tuning_record.json") as f:
        for line in f:
            if not line.strip():
                continue
            wl_index, body = orjson.loads(line)
            steps = trace_to_steps(body[0])
            shash = str(workloads[wl_index][0])
            ok = check_latencies(body[1]) is None
            programs.append({
                "task": meta.get(shash, {}).get("name", shash),
                "program_id": steps_id(steps_json(steps)) if not isinstance(steps, str) else None,
                "old_s": sum(body[1]) / len(body[1]) if ok else None,
                "wl_index": wl_index,
                "body": body,
            })
    return workloads, programs


class _LoadMonitor:
    """How busy the machine was with other work while we measured: busy CPU time of the whole
    machine minus that of this process and its (builder/runner worker) children."""

    def __init__(self):
        import psutil

        self.me = psutil.Process()
        self.busy0 = self._busy()
        self.mine0 = self._mine()

    @staticmethod
    def _busy() -> float:
        import psutil

        t = psutil.cpu_times()  # guest time is already inside user/nice; steal is not ours
        return t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)

    def _mine(self) -> float:
        import psutil

        # user + system, and children_user + children_system: workers that already exited
        # (a builder pool is shut down after each batch) are counted through their parent
        total = sum(self.me.cpu_times()[:4])
        for child in self.me.children(recursive=True):
            try:
                total += sum(child.cpu_times()[:4])
            except psutil.Error:
                pass
        return total

    def other_cores(self, wall: float) -> float | None:
        if wall <= 0:
            return None
        return max(0.0, (self._busy() - self.busy0) - (self._mine() - self.mine0)) / wall


def replay(workloads: list, programs: list[dict]) -> list:
    """The scheduled IRModule of each stored program: its trace (post-processing included)
    applied to its workload, as MetaSchedule applies a database record."""
    use_x86_intrinsics_only()
    from tvm.s_tir import Schedule
    from tvm.s_tir.meta_schedule.database import TuningRecord, Workload

    cache: dict[int, object] = {}
    mods = []
    for p in programs:
        if p["wl_index"] not in cache:
            cache[p["wl_index"]] = Workload.from_json(workloads[p["wl_index"]])
        workload = cache[p["wl_index"]]
        record = TuningRecord.from_json(p["body"], workload)
        sch = Schedule(workload.mod, debug_mask=0)
        record.trace.apply_to_schedule(sch, remove_postproc=False)
        mods.append(sch.mod)
    return mods


def _settings(recorded: dict) -> MeasureSettings:
    known = {f.name for f in dataclasses.fields(MeasureSettings)}
    return MeasureSettings(**{k: v for k, v in recorded.items() if k in known})


def _pct(xs: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100])."""
    xs = sorted(xs)
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _r(x, digits: int = 4):
    return None if x is None else float(f"{x:.{digits}g}")


def remeasure(db_dir: str | Path, platform: str, n_programs: int = 100, seed: int = 0,
              progress: bool = True) -> dict:
    """Measure `n_programs` random valid programs of a database again; return the noise report."""
    from tqdm import tqdm

    db_dir = Path(db_dir)
    collect_path = db_dir / "collect.json"
    if not collect_path.exists():
        raise FileNotFoundError(f"{collect_path}: missing (it records how the database was measured)")
    recorded = orjson.loads(collect_path.read_bytes())
    if recorded.get("platform") not in (None, platform):
        raise ValueError(f"{db_dir} was measured for platform {recorded['platform']!r}, not {platform!r}")
    if recorded.get("rpc"):
        raise ValueError(f"{db_dir} was measured through an RPC tracker; re-measure on that device")
    target, threads = recorded["target"], int(recorded.get("threads") or 1)
    require_runnable_here(platform, target)
    settings = _settings(recorded.get("settings", {}))

    workloads, programs = read_programs(db_dir)
    valid = [p for p in programs if p["old_s"] is not None and p["program_id"] is not None]
    if not valid:
        raise ValueError(f"{db_dir}: no valid program to re-measure")
    chosen = random.Random(seed).sample(valid, min(n_programs, len(valid)))

    mods = replay(workloads, chosen)

    load_before = os.getloadavg()
    monitor = _LoadMonitor()
    started = time.time()
    builder = make_builder(settings)
    runner = GuardedRunner(threads, settings)
    os.environ["TVM_NUM_THREADS"] = str(threads)
    outcomes = []
    bar = tqdm(total=len(chosen), disable=not progress, unit="prog", desc=f"noise {platform}")
    for start in range(0, len(mods), CHUNK):
        chunk = mods[start:start + CHUNK]
        builds = build_all(builder, chunk, target)
        outcomes += run_all(runner, chunk, builds, target)
        remove_artifacts(builds)
        bar.update(len(chunk))
    bar.close()
    runner.close()
    wall = time.time() - started
    others = monitor.other_cores(wall)
    load_after = os.getloadavg()

    detail, rel, ratio, errors = [], [], [], {}
    for p, (secs, err) in zip(chosen, outcomes):
        new = sum(secs) / len(secs) if secs else None
        row = {"task": p["task"], "program_id": p["program_id"], "old_s": p["old_s"], "new_s": new}
        if new is None:
            row["error"] = err
            errors[err] = errors.get(err, 0) + 1
        else:
            row["rel_diff"] = abs(new - p["old_s"]) / p["old_s"]
            rel.append(row["rel_diff"])
            ratio.append(new / p["old_s"])
        detail.append(row)
    per_task: dict[str, list[float]] = {}
    for row in detail:
        if "rel_diff" in row:
            per_task.setdefault(row["task"], []).append(row["rel_diff"])
    here = local_cpu_model()
    return {
        "platform": platform,
        "db": str(db_dir),
        # the CPU the re-measurement ran on, and why it is not the platform's (None: it is)
        "host_cpu": here,
        "host_mismatch": host_mismatch(get_platform(platform), here),
        "target": target,
        "threads": threads,
        "settings": {k: recorded.get("settings", {}).get(k) for k in ("number", "repeat", "min_repeat_ms",
                                                                       "enable_cpu_cache_flush")},
        "seed": seed,
        "programs_requested": n_programs,
        "programs": len(chosen),
        "measured": len(rel),
        "failed_now": len(chosen) - len(rel),
        "failures": errors,
        "tasks": len({p["task"] for p in chosen}),
        "median_rel_diff": _r(statistics.median(rel)) if rel else None,
        "mean_rel_diff": _r(statistics.fmean(rel)) if rel else None,
        "percentiles_rel_diff": ({f"p{q}": _r(_pct(rel, q)) for q in (10, 25, 50, 75, 90, 95, 99)}
                                 | {"max": _r(max(rel))}) if rel else {},
        "within_5pct": _r(sum(r <= 0.05 for r in rel) / len(rel)) if rel else None,
        "within_10pct": _r(sum(r <= 0.10 for r in rel) / len(rel)) if rel else None,
        "median_ratio_new_old": _r(statistics.median(ratio)) if ratio else None,
        # a whole measurement taken while another process held a core: about 2x off on 2 threads
        "off_by_1_5x": _r(sum(max(x, 1 / x) >= 1.5 for x in ratio) / len(ratio)) if ratio else None,
        "per_task_median_rel_diff": {t: _r(statistics.median(v)) for t, v in sorted(per_task.items())},
        "measured_at": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "wall_s": round(wall, 1),
        "loadavg_1_5_15_before": [round(x, 2) for x in load_before],
        "loadavg_1_5_15_after": [round(x, 2) for x in load_after],
        # CPU used by processes other than this one and its workers, in cores, averaged over the run
        "other_processes_cores": None if others is None else round(others, 2),
        "machine": machine_info(),
        "packages": package_versions(),
        "detail": [{k: (_r(v, 6) if isinstance(v, float) else v) for k, v in row.items()} for row in detail],
    }


def format_noise(r: dict) -> str:
    if not r["measured"]:
        return f"{r['platform']}: none of {r['programs']} programs measured ({r['failures']})"
    pc = r["percentiles_rel_diff"]
    return (f"{r['platform']}: {r['measured']} of {r['programs']} programs re-measured over {r['tasks']} tasks "
            f"({r['failed_now']} failed now) in {r['wall_s']} s\n"
            f"  |new-old|/old: median {r['median_rel_diff']:.2%}, p25 {pc['p25']:.2%}, p75 {pc['p75']:.2%}, "
            f"p90 {pc['p90']:.2%}, p95 {pc['p95']:.2%}, max {pc['max']:.2%}; "
            f"within 5%: {r['within_5pct']:.0%}, within 10%: {r['within_10pct']:.0%}\n"
            f"  median new/old: {r['median_ratio_new_old']:.3f}; off by >= 1.5x: {r['off_by_1_5x']:.0%}; "
            f"other processes used {r['other_processes_cores']} cores on average (load average before "
            f"{r['loadavg_1_5_15_before'][0]}, after {r['loadavg_1_5_15_after'][0]})")
