"""pipelines/tuning/pool_runs.py: runs of several occasions read back from their tuning databases
(MetaSchedule's record lines, in measurement order) and pooled into one curve per cost model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "pipelines" / "tuning" / "pool_runs.py"


def write_run(root: Path, task: str, run: str, latencies: list[float]) -> None:
    """A tuning database of one run: a record line per trial ([workload, [trace, run_secs, ...]])."""
    d = root / task / run
    d.mkdir(parents=True)
    lines = [json.dumps([0, [[[], []], [s, s], {"kind": "llvm"}, []]]) for s in latencies]
    (d / "database_tuning_record.json").write_text("\n".join(lines) + "\n")


def test_pool_runs_pools_occasions_and_counts_trials_to_the_baseline_latency(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    # tcl reaches 2 ms at its 2nd trial in both occasions; xgb first at its 4th (a failure, 1e10,
    # never counts); pooled geometric means: tcl 2 ms from trial 2, xgb 2 ms from trial 4
    write_run(old, "dense", "tcl-seed0", [4e-3, 2e-3, 3e-3, 2e-3])
    write_run(new, "dense", "tcl-seed0", [4e-3, 2e-3, 2e-3, 2e-3])
    write_run(old, "dense", "xgb-seed0", [5e-3, 1e10, 3e-3, 2e-3])
    write_run(new, "dense", "xgb-seed0", [8e-3, 4e-3, 4e-3, 2e-3])
    out = tmp_path / "pooled.md"
    proc = subprocess.run([sys.executable, str(SCRIPT), str(old), str(new), "--every", "1", "--markdown", str(out)],
                          capture_output=True, text=True, cwd=ROOT, check=True)
    rows = [line for line in out.read_text().splitlines() if line.startswith("| dense |")]
    assert rows == ["| dense | tcl | xgb | 2 / 2 | 2000.0 / 2000.0 | 2.00x | 1.000 |"], proc.stdout
    assert "| tcl | xgb | 1 | 1 | 2.00x | 2.00x | 1.000 |" in out.read_text()


def test_a_metrics_report_pools_as_its_seeds_runs_and_models_filter(tmp_path):
    """A `tcl bench tune --json` report (per-model curves: the geometric mean over its seeds)
    counts as that many runs: pooled with other runs it gives the table the runs themselves give.
    `--models` keeps only the named cost models."""
    runs, report_dir, other = tmp_path / "runs", tmp_path / "metrics", tmp_path / "other"
    curves = {"tcl": ([4e-3, 2e-3], [4e-3, 1e-3]), "xgb": ([8e-3, 4e-3], [2e-3, 2e-3]),
              "random": ([9e-3, 9e-3], [9e-3, 9e-3])}
    report = {"workload": "dense", "seeds": [0, 1], "curves": {}}
    for model, (a, b) in curves.items():
        write_run(runs, "dense", f"{model}-seed0", a)
        write_run(runs, "dense", f"{model}-seed1", b)
        report["curves"][model] = {"trials": [1, 2], "seconds": [1.0, 2.0],
                                   "best_latency_s": [min(a[:i + 1]) ** 0.5 * min(b[:i + 1]) ** 0.5 for i in range(2)]}
    report_dir.mkdir()
    (report_dir / "dense.json").write_text(json.dumps(report))
    write_run(other, "dense", "tcl-seed2", [3e-3, 3e-3])
    write_run(other, "dense", "xgb-seed2", [5e-3, 2e-3])
    write_run(other, "dense", "random-seed2", [9e-3, 9e-3])

    def table(*roots, models=None):
        out = tmp_path / "pooled.md"
        args = [sys.executable, str(SCRIPT), *map(str, roots), "--every", "1", "--markdown", str(out)]
        subprocess.run(args + (["--models", models] if models else []), capture_output=True, text=True,
                       cwd=ROOT, check=True)
        return out.read_text()

    from_runs = table(runs, other)
    assert table(report_dir, other) == from_runs
    assert "| dense | tcl | xgb | 3 / 3 |" in from_runs and "| dense | tcl | random | 3 / 3 |" in from_runs
    filtered = table(report_dir, other, models="tcl,xgb")
    assert "random" not in filtered and "| dense | tcl | xgb | 3 / 3 |" in filtered
    # PATH=MODELS: only those models from that root (other's tcl run, runs' peers): 1 / 2 runs
    mixed = table(f"{other}=tcl", f"{runs}=xgb,random")
    assert "| dense | tcl | xgb | 1 / 2 |" in mixed and "| dense | tcl | random | 1 / 2 |" in mixed, mixed


def test_bootstrap_intervals_count_a_task_not_reached_at_its_upper_bound(tmp_path):
    """--bootstrap: per task and over all tasks, the speedup's resampled interval; where TCL never
    reaches the baseline's final latency the task counts at the speedup's upper bound (the
    baseline's trials to its final latency / TCL's budget). With one run a cell every resample is
    the point estimate. A metrics folder (one mean curve, not one per run) is refused."""
    runs = tmp_path / "runs"
    write_run(runs, "dense", "tcl-seed0", [4e-3, 2e-3, 2e-3, 2e-3])   # reaches xgb's 2 ms at trial 2
    write_run(runs, "dense", "xgb-seed0", [8e-3, 4e-3, 4e-3, 2e-3])   # its final 2 ms at trial 4: 2x
    write_run(runs, "conv", "tcl-seed0", [5e-3, 5e-3, 5e-3, 5e-3])    # never reaches 3 ms
    write_run(runs, "conv", "xgb-seed0", [6e-3, 4e-3, 3e-3, 3e-3])    # 3 ms at trial 3: at most 3/4
    out = tmp_path / "pooled.md"
    subprocess.run([sys.executable, str(SCRIPT), str(runs), "--every", "1", "--bootstrap", "50",
                    "--markdown", str(out)], capture_output=True, text=True, cwd=ROOT, check=True)
    text = out.read_text()
    assert "| conv | tcl | xgb | 1 / 1 | 5000.0 / 3000.0 | not reached | 0.600 |" in text
    assert "| tcl | xgb | conv | 1 / 1 | 0.75x | 0.75x | 0.75x - 0.75x | 0% |" in text
    assert "| tcl | xgb | dense | 1 / 1 | 2.00x | 2.00x | 2.00x - 2.00x | 0% |" in text
    assert "| tcl | xgb | all 2 (geometric mean) |  | 1.22x | 1.22x | 1.22x - 1.22x | 0% |" in text
    # the summary row says the same over all tasks without the bootstrap: sqrt(2 x 0.75)
    assert "| tcl | xgb | 2 | 1 | 2.00x | 1.22x | 0.775 |" in text

    report_dir = tmp_path / "metrics"
    report_dir.mkdir()
    (report_dir / "dense.json").write_text(json.dumps({"workload": "dense", "seeds": [0], "curves": {}}))
    proc = subprocess.run([sys.executable, str(SCRIPT), str(report_dir), "--every", "1", "--bootstrap", "50"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode != 0 and "not one per run" in proc.stderr


def test_kb_ranks_locates_each_runs_programs_and_the_fastest_in_the_kbs_ranking(tmp_path):
    """pipelines/tuning/kb_ranks.py on real MetaSchedule records (the dense_256 fixture, its 24
    measured programs split into two runs): every program read back and scored, each run's mean
    percentile in the KB's ranking, and the pool's fastest programs located; the figures agree
    with scoring the same features directly."""
    import numpy as np
    import torch

    from tcl.features import Featurizer, featurize_file
    from tcl.models import new_model
    from tcl.records.ingest import ingest
    from .conftest import fixture_path

    src = fixture_path("metaschedule/dense_256")
    lines = (src / "database_tuning_record.json").read_text().splitlines()
    runs = tmp_path / "runs"
    for name, part in (("tcl-seed0", lines[:12]), ("xgb-seed0", lines[12:])):
        d = runs / "dense_256" / name
        d.mkdir(parents=True)
        (d / "database_workload.json").write_text((src / "database_workload.json").read_text())
        (d / "database_tuning_record.json").write_text("\n".join(part) + "\n")
    torch.manual_seed(0)
    featurizer = Featurizer(48)
    model = new_model("mlp", featurizer.n_features, {"hidden": 16, "n_layers": 1}, feature_meta=featurizer.meta)
    model.save(tmp_path / "kb.pt")
    out = tmp_path / "ranks.md"
    subprocess.run([sys.executable, str(ROOT / "pipelines" / "tuning" / "kb_ranks.py"), str(runs), "--model",
                    str(tmp_path / "kb.pt"), "--platform", "znver4-avx512-t2", "--top", "3", "--markdown", str(out)],
                   capture_output=True, text=True, cwd=ROOT, check=True)
    row = [line for line in out.read_text().splitlines() if line.startswith("| dense_256 |")]
    assert len(row) == 1 and "| 24 |" in row[0]

    # the same figures from the features scored directly
    ingest(src, "znver4-avx512-t2", tmp_path / "all.parquet")
    fs = featurize_file(tmp_path / "all.parquet", tmp_path / "all.npz", 48)
    latency = np.asarray(fs.latency, np.float64)
    score = model.predict(fs.x, fs.mask)
    rank = np.empty(len(score))
    rank[np.argsort(-score, kind="stable")] = np.arange(len(score))
    percentile = rank / (len(score) - 1)
    # the fixture's records are read in file order: the first 12 are run tcl-seed0's
    assert f"tcl-seed0: {1e6 * latency[:12].min():.1f}, {percentile[:12].mean():.2f}" in row[0]
    assert f"xgb-seed0: {1e6 * latency[12:].min():.1f}, {percentile[12:].mean():.2f}" in row[0]
    fastest = np.argsort(latency, kind="stable")[:3]
    p = percentile[fastest]
    assert row[0].endswith(f"| {np.median(p):.2f} [{p.min():.2f}, {p.max():.2f}] |")


def test_validation_summary_reads_each_settings_final_against_the_baseline_over_shared_seeds(tmp_path):
    """pipelines/tuning/validation_study.py summary: the seeds pooled are those every kept setting
    of a task ran (geometric mean of the curves), and the rule's figures are the geometric mean
    over the tasks of a setting's final over the baseline's and its worst task."""
    def row(task, name, seed, best):
        return {"task": task, "name": name, "seed": seed, "seconds": 10.0,
                "curve": {"trials": [16, 32], "best": best, "seconds": [5.0, 10.0]}}
    rows = [row("conv", "base", 0, [4e-6, 2e-6]), row("conv", "base", 1, [4e-6, 8e-6]),
            row("conv", "wide", 0, [4e-6, 1e-6]), row("conv", "wide", 1, [2e-6, 2e-6]),
            row("dense", "base", 0, [9e-6, 9e-6]), row("dense", "wide", 0, [9e-6, 9.9e-6]),
            row("conv", "ref", 0, [5e-6, 5e-6])]  # ref ran seed 0 only
    rows[2]["explore_readings"] = [{"share": 0.0}, {"share": 0.2}]  # wide explored after one of two batches
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    script = ROOT / "pipelines" / "tuning" / "validation_study.py"

    def summary(*extra):
        return subprocess.run([sys.executable, str(script), "summary", str(path), "--baseline", "base",
                               "--reference", "ref", *extra], capture_output=True, text=True, cwd=ROOT,
                              check=True).stdout

    # base and wide alone: conv pools seeds 0-1 (finals 4 µs and 1.41 µs: 0.354; wide's curve is
    # at base's final from trial 16, within 1 % of the best from 32), dense seed 0 (1.1)
    out = summary("--names", "base,wide")
    assert "| conv | wide | 1.41 [1.0, 2.0] | 16 | ? | 32 / 32 |" in out, out
    assert "wide over base, final latency on 2 tasks: geometric mean 0.6236, worst 1.1000 (dense)" in out, out
    assert "wide: ranking at random after 1 of 2 measured batches" in out and "base: ranking" not in out, out
    # every setting: conv pools seed 0 only, the one ref ran (2 µs, 1 µs, 5 µs)
    out = summary()
    assert "wide over base, final latency on 2 tasks: geometric mean 0.7416, worst 1.1000 (dense)" in out, out
    assert "ref over base, final latency on 1 tasks: geometric mean 2.5000, worst 2.5000 (conv)" in out, out
