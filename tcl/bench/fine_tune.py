"""`tcl bench fine-tune`: what the KB's fine-tuning updates (`tcl tune --fine-tune`) cost a run.

A tuning run with `--fine-tune` calls `KBFineTuner.update` after every measured batch: `steps`
Adam steps on every measurement so far, then an ONNX export. Inside 256-trial runs on 2 cores
those updates took 6.5-15 % of the run's wall time (docs/tuning.md), more than predict itself.
This replays a run's updates outside tuning, on real programs of a feature file: `trials`
programs drawn at random (seeded), handed to the fine-tuner `trials_per_iter` at a time as one
task's measurements, an update after each hand-over. Once per setup, every combination of
* torch threads (`threads`),
* the Mamba scan (`scans`: "fused", the C++ forward and backward, or "fast", the same as torch ops),
* the export after an update (`exports`: "reexport", the new weights written into the graph
  traced once, or "full", traced and checked again each time);
the first setup is the baseline the others are compared with, in the same process.
"""

from __future__ import annotations

import time

import numpy as np


def bench_fine_tune(model: str, data: str, trials: int = 256, trials_per_iter: int = 16,
                    threads: tuple[int, ...] = (2,), seed: int = 0, scans: tuple[str, ...] = ("fast", "fused"),
                    exports: tuple[str, ...] = ("full", "reexport")) -> dict:
    """Per setup (threads x scans x exports): the updates' seconds (train, export), the final
    loss; and each setup's speedup over the first."""
    import itertools

    from tcl.features import FeatureSet
    from tcl.hardware import family_of
    from tcl.tuner.fine_tune import KBFineTuner

    fs = FeatureSet.load(data)
    ok = np.flatnonzero(np.isfinite(fs.latency) & (fs.latency > 0))
    if len(ok) < trials:
        raise ValueError(f"{data}: {len(ok)} measured programs, fewer than --trials {trials}")
    rows = np.sort(np.random.default_rng(seed).choice(ok, trials, replace=False))
    order = np.random.default_rng(seed + 1).permutation(rows)  # the order a run would measure them in
    family = family_of(fs.platform)
    for export in exports:
        if export not in ("full", "reexport"):
            raise ValueError(f"export {export!r}: full or reexport")
    runs = []
    for n_threads, scan, export in itertools.product(threads, scans, exports):
        tuner = KBFineTuner.from_source(model, family, {"threads": int(n_threads), "seed": seed})
        tuner.model.net.set_scan_method(scan)  # ValueError for a scan the net does not know
        tuner.full_exports = export == "full"
        seconds = 0.0
        for start in range(0, trials, trials_per_iter):
            batch = order[start:start + trials_per_iter]
            tuner.add("bench", fs.x[batch], fs.mask[batch], fs.latency[batch])
            t0 = time.perf_counter()
            tuner.update()
            seconds += time.perf_counter() - t0
        h = tuner.history
        runs.append({"threads": int(n_threads), "scan": scan, "export": export, "updates": len(h), "seconds": seconds,
                     "train_seconds": sum(u["train_seconds"] for u in h),
                     "export_seconds": sum(u["export_seconds"] for u in h),
                     "final_loss": tuner.loss()})
    base = runs[0]["seconds"]
    for r in runs:
        r["speedup"] = base / r["seconds"] if r["seconds"] else None
    return {"model": str(model), "data": str(data), "platform": fs.platform, "trials": trials,
            "trials_per_iter": trials_per_iter, "seed": seed, "runs": runs}


def format_fine_tune(report: dict) -> str:
    lines = [f"{report['trials']} programs of {report['data']} ({report['platform']}), "
             f"{report['trials_per_iter']} a batch: the updates of a {report['trials']}-trial `tcl tune --fine-tune` run"]
    base = report["runs"][0]
    for r in report["runs"]:
        lines.append(f"  threads {r['threads']}, scan {r['scan']:5s}, export {r['export']:8s}: {r['updates']} updates in "
                     f"{r['seconds']:.2f} s (train {r['train_seconds']:.2f} s, export {r['export_seconds']:.2f} s), "
                     f"final loss {r['final_loss']:.6f}, {r['speedup']:.2f}x the baseline "
                     f"({base['threads']}, {base['scan']}, {base['export']})")
    return "\n".join(lines)
