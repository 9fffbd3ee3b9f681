"""Generate and measure programs with TVM MetaSchedule, writing a MetaSchedule JSON database.

Two entry points, both resumable (what the database already holds is never measured again):

- `sample_and_measure`: draw random programs from MetaSchedule's design space for a task (the
  replay-trace idea: re-sample every decision of a design-space trace, then run the
  postprocessors) and measure them on one platform.
- `replay_and_measure`: measure programs already in a source database on another platform, so
  platforms are compared on matched programs (the way Tenset measured its dataset).

The builder and runner are MetaSchedule's own (LocalBuilder/LocalRunner, or RPCRunner through a
TVM RPC tracker); only the build function is ours, see `build_module`.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import signal
import sys
import threading
import time
import types
from dataclasses import dataclass
from pathlib import Path

FAILED_RUN_SECS = 1e10  # how MetaSchedule stores a failed build/run
# How long past its own timeout a build or run may go without an answer before its worker is
# taken for hung and killed (a worker enforces the timeout itself, so a stuck one never reports);
# it also covers a new worker's start (importing TVM: seconds).
HUNG_GRACE_S = 30.0


@dataclass
class MeasureSettings:
    number: int = 2
    repeat: int = 3
    min_repeat_ms: int = 0
    enable_cpu_cache_flush: bool = False
    build_timeout_s: float = 60.0
    run_timeout_s: float = 30.0
    builder_workers: int = 2
    # Before each batch of runs, wait while other processes keep the CPU busier than this (percent
    # of all cores, sampled while our own workers are idle): timings taken beside other work are
    # what made the first bundled 2-thread measurements noisy. None: never wait.
    max_busy_cpu_percent: float | None = None
    max_wait_s: float = 1800.0

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class RpcSettings:
    tracker_host: str
    tracker_port: int
    key: str
    session_timeout_s: float = 60.0

    @classmethod
    def from_options(cls, tracker: str | None, key: str | None) -> "RpcSettings | None":
        """`--rpc-tracker HOST:PORT` and `--rpc-key KEY` -> settings (None without either)."""
        if not tracker:
            if key:  # measuring here while the user thinks a remote device is used
                raise ValueError("--rpc-key needs --rpc-tracker HOST:PORT (without it the programs "
                                 "would be measured on this machine)")
            return None
        if not key:
            raise ValueError("--rpc-tracker needs --rpc-key")
        host, _, port = tracker.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"--rpc-tracker must be HOST:PORT, got {tracker!r}")
        return cls(host, int(port), key)


def use_x86_intrinsics_only() -> None:
    """Make `tvm.s_tir.tensor_intrin` importable without its package __init__.

    The __init__ parses the CUDA tensor intrinsics as TVMScript (~40 s on this machine), which
    every builder worker and every TuneContext would pay — longer than the build timeout. CPU
    targets only need the x86 intrinsics, so register the package empty and import just those.
    """
    name = "tvm.s_tir.tensor_intrin"
    if name in sys.modules:
        return
    import tvm.s_tir  # noqa: F401  (parent package must exist first)

    spec = importlib.util.find_spec(name)
    package = types.ModuleType(name)
    package.__path__ = list(spec.submodule_search_locations)
    package.__spec__ = spec
    sys.modules[name] = package
    importlib.import_module(name + ".x86")


def build_module(mod, target, _params):
    """MetaSchedule `f_build` for CPU targets (the default one imports every intrinsic)."""
    use_x86_intrinsics_only()
    from tvm.driver import build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return build(mod, target=target)


def program_id(trace_json) -> str:
    """Stable id of a program: sha1 of its trace JSON (instructions + decisions).

    The readers compute the same id from the database file, so the id matches a program
    across platforms and across the measure/ingest boundary.
    """
    return hashlib.sha1(json.dumps(trace_json, separators=(",", ":")).encode()).hexdigest()


def to_python(obj):
    """TVM FFI containers/immediates (as `Trace.as_json()` returns them) -> plain JSON values.

    Booleans become 0/1: that is how the database file stores them, and a program's id must be
    the same before and after the database round trip (resuming depends on it).
    """
    if isinstance(obj, bool):
        return int(obj)
    if isinstance(obj, (int, float, str)) or obj is None:
        return obj
    if hasattr(obj, "value") and not isinstance(obj, (list, tuple)):
        return obj.value
    if isinstance(obj, dict) or hasattr(obj, "items"):
        return {str(k): to_python(v) for k, v in obj.items()}
    return [to_python(x) for x in obj]


def _target(target_json: dict):
    from tvm.target import Target

    return Target(dict(target_json))


def drop_partial_last_line(path: Path) -> None:
    """Cut a line left half-written by a killed run (the database appends one line per record),
    so resuming does not trip over it; that program is simply measured again."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as f:
        f.seek(-1, os.SEEK_END)
        if f.read(1) == b"\n":
            return
        f.seek(0)
        content = f.read()
        f.truncate(content.rfind(b"\n") + 1)


def open_database(out_dir: str | os.PathLike):
    from tvm.s_tir import meta_schedule as ms

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in ("database_workload.json", "database_tuning_record.json"):
        drop_partial_last_line(out_dir / name)
    return ms.database.JSONDatabase(
        path_workload=str(out_dir / "database_workload.json"),
        path_tuning_record=str(out_dir / "database_tuning_record.json"),
        allow_missing=True,
    )


def existing_programs(db, mod) -> set[str]:
    """Program ids already recorded for this workload, failed ones included (resume skips them)."""
    return set(existing_latencies(db, mod))


def existing_latencies(db, mod) -> dict[str, float]:
    """Program id -> mean recorded run seconds (FAILED_RUN_SECS for a failed one) of this workload."""
    if not db.has_workload(mod):
        return {}
    from tvm_ffi import structural_hash

    shash = structural_hash(mod)
    out = {}
    for rec in db.get_all_tuning_records():
        if structural_hash(rec.workload.mod) == shash:
            secs = [float(s) for s in to_python(rec.run_secs)] if rec.run_secs is not None else []
            out[program_id(to_python(rec.trace.as_json()))] = sum(secs) / len(secs) if secs else FAILED_RUN_SECS
    return out


def make_builder(settings: MeasureSettings):
    from tvm.s_tir import meta_schedule as ms

    return ms.builder.LocalBuilder(
        f_build=build_module,
        max_workers=settings.builder_workers,
        timeout_sec=settings.build_timeout_s,
    )


def make_runner(threads: int, settings: MeasureSettings, rpc: RpcSettings | None = None):
    """A MetaSchedule runner whose workers run with `threads` runtime threads."""
    from tvm.s_tir import meta_schedule as ms

    evaluator = ms.runner.EvaluatorConfig(
        number=settings.number,
        repeat=settings.repeat,
        min_repeat_ms=settings.min_repeat_ms,
        enable_cpu_cache_flush=settings.enable_cpu_cache_flush,
    )
    if rpc is not None:  # the remote server's own TVM_NUM_THREADS applies there
        check_tracker(rpc)
        return ms.runner.RPCRunner(
            rpc_config=ms.runner.RPCConfig(
                tracker_host=rpc.tracker_host,
                tracker_port=rpc.tracker_port,
                tracker_key=rpc.key,
                session_timeout_sec=int(rpc.session_timeout_s),
            ),
            evaluator_config=evaluator,
            max_workers=1,
        )
    # The local runner's worker inherits this environment when it starts: TVM_NUM_THREADS
    # fixes the runtime thread pool of the platform being emulated.
    os.environ["TVM_NUM_THREADS"] = str(threads)
    return ms.runner.LocalRunner(timeout_sec=settings.run_timeout_s, evaluator_config=evaluator)


TRACKER_PROBE_S = 5.0  # seconds a TCP connect to the tracker may take before it counts as unreachable


def check_tracker(rpc: RpcSettings) -> None:
    """Fail fast, with a reason, when the tracker is unreachable or has no server for the key
    (MetaSchedule's RPC runner would otherwise wait for one forever)."""
    import socket

    from tvm import rpc as tvm_rpc

    where = f"{rpc.tracker_host}:{rpc.tracker_port}"
    # TVM's own connect retries for 60 s; a plain connect tells a dead address in a moment
    try:
        socket.create_connection((rpc.tracker_host, rpc.tracker_port), timeout=TRACKER_PROBE_S).close()
    except OSError as exc:
        raise ConnectionError(f"RPC tracker {where} is unreachable: {exc}") from None
    try:
        summary = tvm_rpc.connect_tracker(rpc.tracker_host, rpc.tracker_port).summary()
    except Exception as exc:  # noqa: BLE001 - TVM raises several kinds for a dead socket
        raise ConnectionError(f"RPC tracker {where} is unreachable: {exc}") from None
    if rpc.key not in summary.get("queue_info", {}):
        known = ", ".join(summary.get("queue_info", {})) or "none"
        raise ConnectionError(f"RPC tracker {where} has no server registered with key {rpc.key!r} "
                              f"(keys: {known}); start one with `python -m tvm.exec.rpc_server "
                              f"--tracker {where} --key {rpc.key}`")


def wait_for_quiet_cpu(settings: MeasureSettings, sample_s: float = 0.5) -> float:
    """Block until the machine is quiet enough to time programs; returns seconds waited."""
    if settings.max_busy_cpu_percent is None:
        return 0.0
    import psutil

    waited = 0.0
    while psutil.cpu_percent(interval=sample_s) > settings.max_busy_cpu_percent:
        waited += sample_s
        if waited >= settings.max_wait_s:
            break  # measure anyway; the noise check will show it
        time.sleep(sample_s)
        waited += sample_s
    return waited


Outcome = tuple  # (run_secs: list[float] | None, error: str | None)


def build_all(builder, mods: list, target_json: dict,
              grace_s: float = HUNG_GRACE_S) -> list[tuple[str | None, str | None]]:
    """Build scheduled IRModules for a target: (artifact_path, error) per module (guarded as
    `guarded_build` says)."""
    from tvm.s_tir import meta_schedule as ms

    target = _target(target_json)
    results, killed_at = guarded_build(builder, [ms.builder.BuilderInput(m, target) for m in mods], grace_s)
    hung = f"hung workers killed {killed_at:.0f} s into the builds: " if killed_at else ""
    return [
        (None, "build: " + hung + _error_summary(r.error_msg)) if r.error_msg else (r.artifact_path, None)
        for r in results
    ]


def guarded_build(builder, inputs: list, grace_s: float = HUNG_GRACE_S) -> tuple[list, float | None]:
    """`builder.build(inputs)`, with its workers killed (and those they started) if it has not
    answered `grace_s` after every build could have timed out: the builds of a killed worker fail
    instead of blocking forever. Returns the results and the seconds at which workers were killed
    (None: none was)."""
    waves = -(-len(inputs) // max(1, getattr(builder, "max_workers", 1) or 1))
    deadline_s = waves * float(getattr(builder, "timeout_sec", 60.0)) + grace_s
    before = _popen_workers()  # the runner's worker(s): not this call's to kill
    with _Watchdog(deadline_s, lambda: _popen_workers() - before) as watchdog:
        results = builder.build(inputs)
    return results, (deadline_s if watchdog.fired else None)


def run_all(runner, mods: list, builds: list, target_json: dict) -> list[Outcome]:
    """Run built artifacts; failed builds pass their error through."""
    from tvm.s_tir import meta_schedule as ms

    kind = _target(target_json).kind.name
    device_type = "cpu" if kind == "llvm" else kind
    results: list[Outcome] = [(None, err) for _, err in builds]
    index = [i for i, (path, _) in enumerate(builds) if path]
    inputs = [
        ms.runner.RunnerInput(
            builds[i][0], device_type=device_type,
            # the runner allocates arguments in the layout the scheduled function takes
            args_info=ms.arg_info.ArgInfo.from_entry_func(mods[i], remove_preproc=True),
        )
        for i in index
    ]
    for i, future in zip(index, runner.run(inputs) if inputs else []):
        res = future.result()
        if res.error_msg:
            results[i] = (None, "run: " + _error_summary(res.error_msg))
        else:
            results[i] = ([float(s) for s in res.run_secs], None)
    return results


class _Watchdog:
    """Kill the processes `pids()` names each time the `with` block has run another `seconds`
    (a worker the pool restarts after a kill can hang again)."""

    def __init__(self, seconds: float, pids):
        self.fired = False
        self._seconds = seconds
        self._pids = pids
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._done.wait(self._seconds):
            self.fired = True
            for pid in self._pids():
                _kill_tree(pid)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()


def _popen_workers() -> set[int]:
    """Pids of this process's TVM pool workers (`python -m tvm.exec.popen_worker`)."""
    import psutil

    found = set()
    for child in psutil.Process().children(recursive=False):
        try:
            if "tvm.exec.popen_worker" in " ".join(child.cmdline()):
                found.add(child.pid)
        except psutil.Error:  # exited meanwhile
            pass
    return found


def _kill_tree(pid: int) -> None:
    """SIGKILL a worker and the processes it started (SIGKILL also ends a stopped process)."""
    from tvm.support.popen_pool import kill_child_processes

    kill_child_processes(pid)
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:  # exited meanwhile
        pass


@dataclass
class _Ran:
    """A finished run, shaped like MetaSchedule's runner future and its result (for `run_all`)."""

    run_secs: list | None
    error_msg: str | None

    def result(self) -> "_Ran":
        return self


class GuardedRunner:
    """MetaSchedule's runner for measurements that run for hours unattended (`tcl collect`, `tcl tune`).

    Two ways the local runner stopped a 13,824-program collection (2026-12-06): its worker fell
    into a state where every run failed (392 in a row; a new runner measured all of them without a
    failure), and later a run never answered (a worker enforces its timeout itself, so a stuck one
    blocks the runner forever, at 0 % CPU). So:

    - a local run with no answer `grace_s` past the runner's timeout has its worker killed and
      fails as hung; MetaSchedule's pool starts a new worker for the next run;
    - a batch of two or more runs that all failed, none by a timeout, restarts the runner and runs
      once more; what fails again is a failure of the programs and is kept as one.

    `run` takes and returns what MetaSchedule's `Runner.run` does, so `run_all` serves both.
    A remote (RPC) runner is used as it is: its session timeout bounds a run there.
    """

    def __init__(self, threads: int, settings: MeasureSettings, rpc: RpcSettings | None = None,
                 grace_s: float = HUNG_GRACE_S, make=None):
        self._make = make or (lambda: make_runner(threads, settings, rpc))
        self.runner = self._make()
        self.deadline_s = settings.run_timeout_s + grace_s
        self.restarts = 0  # runners replaced after a batch that failed whole
        self.hung = 0  # runs whose worker was killed

    def run(self, inputs: list) -> list[_Ran]:
        ran = self._run_once(inputs)
        if len(ran) >= 2 and all(r.error_msg and "Timeout" not in r.error_msg
                                 and not r.error_msg.startswith("hung") for r in ran):
            self.restart()
            ran = self._run_once(inputs)
        return ran

    def restart(self) -> None:
        self.close()
        self.runner = self._make()
        self.restarts += 1

    def _run_once(self, inputs: list) -> list[_Ran]:
        if getattr(self.runner, "pool", None) is None:  # remote
            results = [f.result() for f in self.runner.run(inputs)]
            return [_Ran(r.run_secs, r.error_msg) for r in results]
        out = []
        for one in inputs:  # the local runner runs one at a time anyway: a deadline per run
            with _Watchdog(self.deadline_s, self._worker_pids) as watchdog:
                res = self.runner.run([one])[0].result()
            if watchdog.fired and res.error_msg:  # (an answer that came as it fired stands)
                self.hung += 1
                out.append(_Ran(None, f"hung: no answer {self.deadline_s:.0f} s after the run "
                                      "started; its worker was killed"))
            else:
                out.append(_Ran(res.run_secs, res.error_msg))
        return out

    def _worker_pids(self) -> list[int]:
        # TVM's pool keeps one PopenWorker per thread (pinned TVM: PopenPoolExecutor._worker_map)
        workers = getattr(self.runner.pool, "_worker_map", {}).values()
        return [w._proc.pid for w in workers if getattr(w, "_proc", None) is not None]

    def close(self) -> None:
        pool = getattr(self.runner, "pool", None)
        if pool is not None:
            pool.shutdown(wait=False)  # kills its worker


def for_metaschedule(builder, runner: GuardedRunner):
    """`builder` (guarded as `guarded_build` says) and `runner` as MetaSchedule's own builder and
    runner interfaces, for a search that measures as it goes (`ms.tune_tasks`)."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.builder import PyBuilder
    from tvm.s_tir.meta_schedule.runner import PyRunner
    from tvm.s_tir.meta_schedule.runner.local_runner import LocalRunnerFuture

    @derived_object
    class _GuardedBuilder(PyBuilder):
        def build(self, build_inputs):
            return guarded_build(builder, list(build_inputs))[0]

    @derived_object
    class _GuardedRunner(PyRunner):
        def run(self, runner_inputs):
            return [LocalRunnerFuture(res=None if r.run_secs is None else [float(s) for s in r.run_secs],
                                      error_message=r.error_msg)
                    for r in runner.run(list(runner_inputs))]

    return _GuardedBuilder(), _GuardedRunner()


def remove_artifacts(builds: list) -> None:
    for path, _ in builds:
        if path:
            _remove_artifact(path)


def _error_summary(msg: str) -> str:
    """The last non-empty line of a TVM error: its traceback ends with the most specific one."""
    lines = [ln.strip() for ln in str(msg).splitlines() if ln.strip()]
    return (lines[-1] if lines else "unknown")[:200]


def _remove_artifact(path: str) -> None:
    """The build (`<dir>/tvm_tmp_mod.tar`), the shared library a local runner links from it when it
    loads it (`<path>.so`, beside it) and the temporary directory the builder made for them."""
    for file in (path, path + ".so"):
        try:
            os.remove(file)
        except OSError:  # not there (a remote runner links on its own side)
            pass
    try:
        os.rmdir(os.path.dirname(path))
    except OSError:
        pass


def design_space(mod, target_json: dict, seed: int):
    """MetaSchedule's default design space for a CPU target: (context, list of schedules)."""
    use_x86_intrinsics_only()
    from tvm.s_tir import meta_schedule as ms

    ctx = ms.TuneContext(
        mod=mod,
        target=_target(target_json),
        space_generator="post-order-apply",
        search_strategy="replay-trace",
        task_name="main",
        rand_state=seed + 1,
        num_threads=1,
    )
    spaces = ctx.space_generator.generate_design_space(mod)
    return ctx, spaces


def sample_programs(mod, target_json: dict, n: int, seed: int, skip: set[str] = frozenset(),
                    max_attempts_factor: int = 20):
    """Draw `n` distinct random programs (schedule, trace json, id) from the design space.

    Deterministic for a seed: resuming regenerates the same sequence and `skip` drops the
    programs the database already holds.
    """
    from tvm.s_tir import Schedule, Trace

    ctx, spaces = design_space(mod, target_json, seed)
    postprocs = ctx.space_generator.postprocs
    out, seen = [], set()
    for attempt in range(n * max_attempts_factor):
        if len(out) + len(skip & seen) >= n:
            break
        space = spaces[attempt % len(spaces)]
        sch = Schedule(mod, seed=(seed * 100003 + attempt) % 2147483646 + 1, debug_mask=0)
        try:
            # the space's instructions without its decisions: every sample is drawn afresh
            Trace(space.trace.insts, {}).apply_to_schedule(sch, remove_postproc=True)
            if not all(p.apply(sch) for p in postprocs):
                continue
        except Exception:  # an invalid sample of the space: MetaSchedule discards these too
            continue
        trace_json = to_python(sch.trace.as_json())
        pid = program_id(trace_json)
        if pid in seen:
            continue
        seen.add(pid)
        if pid in skip:
            continue
        out.append((sch, trace_json, pid))
    return out


def commit(db, mod, sch_trace, run_secs, target_json: dict):
    from tvm.s_tir import meta_schedule as ms

    workload = db.commit_workload(mod)
    db.commit_tuning_record(
        ms.database.TuningRecord(
            sch_trace,
            workload,
            run_secs=run_secs if run_secs is not None else [FAILED_RUN_SECS],
            target=_target(target_json),
            args_info=ms.arg_info.ArgInfo.from_prim_func(mod["main"]),
        )
    )
