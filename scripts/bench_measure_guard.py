"""What the measuring guard costs (tcl.collect.measure.GuardedRunner against MetaSchedule's
LocalRunner as it is), timed in the same run on the same built programs.

    python scripts/bench_measure_guard.py [--programs 32] [--rounds 3] [--workload dense_64]

Builds `--programs` real programs of one workload once, then runs all of them `--rounds` times
through each runner, alternating which goes first, with the collection's settings (2 runs of 3
repeats, no minimum time: the shortest runs, where a per-run overhead shows most). Prints each
runner's seconds a program (median over rounds) and the ratio guarded / plain; the latencies
measured are the programs', so both rows should agree on them too (median relative difference).
"""

from __future__ import annotations

import argparse
import statistics
import time

from tcl.collect.measure import (GuardedRunner, MeasureSettings, build_all, make_builder, make_runner,
                                 remove_artifacts, run_all, sample_programs)
from tcl.collect.workloads import build_workload, resolve_workload
from tcl.hardware import get_platform


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--programs", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workload", default="dense_64")
    ap.add_argument("--platform", default="znver4-avx512-t2")
    args = ap.parse_args()

    platform = get_platform(args.platform)
    op = resolve_workload(args.workload)  # the small test workloads too
    settings = MeasureSettings()
    mods = [s.mod for s, _, _ in sample_programs(build_workload(op), platform.target, args.programs, seed=0)]
    builds = build_all(make_builder(settings), mods, platform.target)
    threads = platform.threads or 1
    plain, guarded = make_runner(threads, settings), GuardedRunner(threads, settings)
    seconds = {"plain": [], "guarded": []}
    latency = {"plain": [], "guarded": []}
    try:
        for r in range(args.rounds):
            order = [("plain", plain), ("guarded", guarded)]
            for name, runner in (order if r % 2 == 0 else order[::-1]):
                start = time.perf_counter()
                outcomes = run_all(runner, mods, builds, platform.target)
                seconds[name].append((time.perf_counter() - start) / len(mods))
                latency[name].append([sum(s) / len(s) if s else None for s, _ in outcomes])
    finally:
        guarded.close()
        plain.pool.shutdown(wait=True)
        remove_artifacts(builds)
    ok = [i for i in range(len(mods)) if all(lat[i] for rows in latency.values() for lat in rows)]
    rel = [abs(statistics.median(l[i] for l in latency["guarded"]) / statistics.median(l[i] for l in latency["plain"]) - 1)
           for i in ok]
    p, g = statistics.median(seconds["plain"]), statistics.median(seconds["guarded"])
    print(f"{len(mods)} programs of {args.workload} on {args.platform} ({threads} threads), {args.rounds} rounds")
    print(f"LocalRunner as it is : {1e3 * p:.1f} ms a program (rounds: {', '.join(f'{1e3 * s:.1f}' for s in seconds['plain'])})")
    print(f"GuardedRunner        : {1e3 * g:.1f} ms a program (rounds: {', '.join(f'{1e3 * s:.1f}' for s in seconds['guarded'])})")
    print(f"ratio guarded / plain: {g / p:.3f}; latencies measured, median relative difference "
          f"{statistics.median(rel):.3f} over {len(ok)} programs; runner restarts {guarded.restarts}, hung {guarded.hung}")


if __name__ == "__main__":
    main()
