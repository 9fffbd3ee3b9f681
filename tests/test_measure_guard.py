"""The measuring path survives a worker that hangs or goes bad (`tcl.collect.measure`).

Real TVM builds and runs of a small dense program; the faults are injected into MetaSchedule's own
LocalBuilder/LocalRunner through their documented hooks (`f_build`, `f_run_evaluator`): a worker
that stops itself (SIGSTOP: it can no longer report its own timeout, the way a stuck worker
blocked a collection for good on 2026-12-06) and one whose every run fails.
"""

import time

import psutil
import pytest

from tcl.collect.measure import (GuardedRunner, MeasureSettings, build_all, for_metaschedule, make_builder,
                                 remove_artifacts, run_all, sample_programs)
from tcl.collect.workloads import SMALL_WORKLOADS, build_workload
from tcl.hardware import get_platform

from .conftest import LOCAL_PLATFORM

pytestmark = pytest.mark.slow

PLATFORM = LOCAL_PLATFORM  # measured on this host


@pytest.fixture(scope="module")
def built():
    """Three real dense_64 programs, built: (target, mods, builds)."""
    target = get_platform(PLATFORM).target
    mods = [sch.mod for sch, _, _ in sample_programs(build_workload(SMALL_WORKLOADS["dense_64"]), target, 3, seed=0)]
    builds = build_all(make_builder(MeasureSettings()), mods, target)
    assert all(path for path, _ in builds)
    yield target, mods, builds
    remove_artifacts(builds)


def _local_runner(f_run_evaluator, timeout_s=2.0):
    from tvm.s_tir import meta_schedule as ms

    return ms.runner.LocalRunner(timeout_sec=timeout_s, f_run_evaluator=f_run_evaluator,
                                 evaluator_config=ms.runner.EvaluatorConfig(number=1, repeat=1))


def _stops_the_first_time(flag):
    """A run evaluator whose first run (across workers: `flag` is a file) stops its worker
    (SIGSTOP: not even the worker's own timeout can report), and whose later runs measure."""
    flag = str(flag)

    def evaluate(rt_mod, device, evaluator_config, repeated_args):
        import os
        import signal

        from tvm.s_tir.meta_schedule.runner.local_runner import default_run_evaluator

        if not os.path.exists(flag):
            open(flag, "w").close()
            os.kill(os.getpid(), signal.SIGSTOP)
        return default_run_evaluator(rt_mod, device, evaluator_config, repeated_args)

    return evaluate


def _workers() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True)
            if "tvm.exec.popen_worker" in " ".join(p.cmdline())]


def test_a_run_that_never_answers_is_killed_and_the_next_one_runs(built, tmp_path):
    target, mods, builds = built

    guard = GuardedRunner(1, MeasureSettings(run_timeout_s=2.0), grace_s=10.0,
                          make=lambda: _local_runner(_stops_the_first_time(tmp_path / "stopped-once")))
    started = time.time()
    outcomes = run_all(guard, mods, builds, target)
    assert time.time() - started < 60
    (secs0, err0), *rest = outcomes
    assert secs0 is None and err0.startswith("run: hung: no answer 12 s after the run started")
    assert all(secs and 0 < secs[0] < 1 and err is None for secs, err in rest), rest  # the pool went on
    assert guard.hung == 1 and guard.restarts == 0
    guard.close()
    time.sleep(0.5)
    assert not any(p.status() == psutil.STATUS_STOPPED for p in _workers())  # nothing left stopped


def test_a_batch_that_fails_whole_gets_a_new_runner_and_one_more_try(built):
    target, mods, builds = built

    def always_fails(rt_mod, device, evaluator_config, repeated_args):
        raise RuntimeError("a worker gone bad")

    made = []

    def bad_then_good():  # the first runner's worker fails every run, the next one is healthy
        made.append(_local_runner(always_fails if not made else None))
        return made[-1]

    guard = GuardedRunner(1, MeasureSettings(), make=bad_then_good)
    outcomes = run_all(guard, mods, builds, target)
    assert all(secs and err is None for secs, err in outcomes)
    assert guard.restarts == 1 and len(made) == 2
    guard.close()

    # programs that fail on a fresh runner too are failures: kept as such after one more try
    guard = GuardedRunner(1, MeasureSettings(), make=lambda: _local_runner(always_fails))
    outcomes = run_all(guard, mods, builds, target)
    assert all(secs is None and "a worker gone bad" in err for secs, err in outcomes)
    assert guard.restarts == 1
    guard.close()


def test_a_build_that_never_answers_is_killed(built):
    from tvm.s_tir import meta_schedule as ms

    target, mods, _ = built

    def stops(mod, target, params):
        import os
        import signal

        os.kill(os.getpid(), signal.SIGSTOP)

    builder = ms.builder.LocalBuilder(f_build=stops, max_workers=1, timeout_sec=2.0)
    started = time.time()
    builds = build_all(builder, mods[:1], target, grace_s=10.0)
    assert time.time() - started < 60
    assert builds[0][0] is None and builds[0][1].startswith("build: hung workers killed 12 s into the builds")


def test_metaschedule_s_builder_and_runner_interfaces_go_through_the_guard(built, tmp_path):
    """What `tcl tune` hands `ms.tune_tasks`: a build, then a run that never answers and one that does."""
    from tvm.s_tir import meta_schedule as ms
    from tvm.target import Target

    target, mods, _ = built

    guard = GuardedRunner(1, MeasureSettings(run_timeout_s=2.0), grace_s=10.0,
                          make=lambda: _local_runner(_stops_the_first_time(tmp_path / "stopped-once")))
    ms_builder, ms_runner = for_metaschedule(make_builder(MeasureSettings()), guard)
    tvm_target = Target(dict(target))
    built_now = ms_builder.build([ms.builder.BuilderInput(m, tvm_target) for m in mods[:2]])
    assert all(b.error_msg is None and b.artifact_path for b in built_now)
    inputs = [ms.runner.RunnerInput(b.artifact_path, device_type="cpu",
                                    args_info=ms.arg_info.ArgInfo.from_entry_func(m, remove_preproc=True))
              for b, m in zip(built_now, mods)]
    first, second = [f.result() for f in ms_runner.run(inputs)]
    assert first.run_secs is None and str(first.error_msg).startswith("hung: no answer 12 s")
    assert second.error_msg is None and 0 < float(second.run_secs[0]) < 1
    assert guard.hung == 1
    guard.close()
    remove_artifacts([(b.artifact_path, None) for b in built_now])
