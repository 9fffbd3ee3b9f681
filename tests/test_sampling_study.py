"""The sampling study's summary (pipelines/sampling/summarize_study.py): mean ± sd over seeds per
strategy and ratio, the sampler's seconds read from each subset's meta["sample"], checked by hand."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tcl.sampling.subset import sample_features
from tests.test_training import make_fs

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "pipelines" / "sampling" / "summarize_study.py"


def _write_study(tmp_path, runs):
    """runs: (stem, label, top1, sampler seconds or None) -> metrics/ and subsets/ as the pipeline writes them."""
    metrics, subsets = tmp_path / "metrics", tmp_path / "subsets"
    metrics.mkdir()
    subsets.mkdir()
    fs = make_fs(n_tasks=4, per_task=10, seed=1, platform="p")
    for stem, label, top1, seconds in runs:
        (metrics / f"{stem}.json").write_text(json.dumps(
            {"platform": "p", "label": label, "kind": "mamba", "top1": top1, "top5": 0.9,
             "task_top1": top1 / 2, "task_top5": 1.0, "pairwise": 0.5, "spearman": 0.1, "per_network": {}}))
        if seconds is not None:
            sub, _ = sample_features(fs, 0.25, "random", {"sample": {"retrain": {"kind": "none"}}}, seed=0)
            sub.meta["sample"]["seconds"] = seconds
            sub.save(subsets / f"{stem}.npz")
    return metrics, subsets


def _summarize(tmp_path, metrics, subsets):
    out = tmp_path / "out"
    cmd = [sys.executable, str(SCRIPT), "--metrics", str(metrics), "--subsets", str(subsets),
           "--out", str(out / "s.json"), "--markdown", str(out / "s.md"), "--plot", str(out / "p.json"),
           "--png", str(out / "img" / "p.png")]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}), out


def test_study_summary_mean_sd_and_sampler_seconds_by_hand(tmp_path):
    metrics, subsets = _write_study(tmp_path, [
        ("p-random-0.1-s0", "random-0.1", 0.2, 1.0), ("p-random-0.1-s1", "random-0.1", 0.4, 3.0),
        ("p-rdu-0.05-s0", "rdu-0.05", 0.5, 2.0),
        ("p-full-s0", "full-1.0", 0.6, None), ("p-full-s1", "full-1.0", 0.8, None)])
    proc, out = _summarize(tmp_path, metrics, subsets)
    assert proc.returncode == 0, proc.stderr
    lines = (out / "s.md").read_text().splitlines()
    # ordered by ratio; sample sd (ddof 1) of {0.2, 0.4} = 0.1414, of {1, 3} s = 1.414; full has no sampler
    assert lines[2] == "| p | rdu | 5% | 1 | 0.500 ± 0.000 | 0.900 ± 0.000 | 0.250 ± 0.000 | 1.000 ± 0.000 | 2.00 ± 0.00 |"
    assert lines[3] == "| p | random | 10% | 2 | 0.300 ± 0.141 | 0.900 ± 0.000 | 0.150 ± 0.071 | 1.000 ± 0.000 | 2.00 ± 1.41 |"
    assert lines[4].startswith("| p | full | 100% | 2 | 0.700 ± 0.141 |") and lines[4].endswith("| - |")
    summary = json.loads((out / "s.json").read_text())
    assert summary["p"]["random-0.1"]["top1"] == pytest.approx(0.3)
    assert summary["p"]["random-0.1"]["top1_sd"] == pytest.approx(round(math.sqrt(0.02), 4))
    assert summary["p"]["random-0.1"]["sampler_seconds"] == pytest.approx(2.0)
    assert "sampler_seconds" not in summary["p"]["full-1.0"]
    # dvc plots rows: ratio in %, one field per strategy, the 100% mean beside each ratio
    assert json.loads((out / "p.json").read_text()) == [{"ratio": 5.0, "rdu": 0.5, "full": 0.7},
                                                       {"ratio": 10.0, "random": 0.3, "full": 0.7}]
    assert (out / "img" / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_study_summary_names_a_metrics_file_without_a_ratio_label(tmp_path):
    metrics, subsets = _write_study(tmp_path, [("p-x-s0", "no_ratio", 0.2, None)])
    proc, _ = _summarize(tmp_path, metrics, subsets)
    assert proc.returncode != 0 and "p-x-s0.json" in proc.stderr and "'<strategy>-<ratio>'" in proc.stderr


CV_SCRIPT = ROOT / "pipelines" / "sampling" / "cv_settings.py"


def _cv_summary(tmp_path: Path, runs: Path | list[Path], study: Path) -> tuple[dict, Path]:
    """`cv_settings.py summary` over the `run` outputs in `runs` (a folder, or several: `--runs` each):
    its JSON and the markdown's path."""
    out, md = tmp_path / "cv.json", tmp_path / "cv.md"
    folders = [a for r in (runs if isinstance(runs, list) else [runs]) for a in ("--runs", str(r))]
    subprocess.run([sys.executable, str(CV_SCRIPT), "summary", *folders, "--study-params", str(study),
                    "--out", str(out), "--markdown", str(md)], check=True, cwd=ROOT, capture_output=True)
    return json.loads(out.read_text()), md


def test_cv_summary_pools_platforms_and_pairs_within_platform_fold_and_seed(tmp_path):
    """Two platforms' `run` outputs, scores by hand: the pooled means, and the paired difference
    taken against the reference of the same platform, fold and seed only."""
    def row(platform, candidate, fold, seed, task_top1):
        return {"platform": platform, "candidate": candidate, "ratio": 0.1, "seed": seed, "fold": fold,
                "selected": 10, "held_tasks": [], "sampler_seconds": 1.0, "task_top1": task_top1,
                "task_top5": 0.9, "top1": task_top1, "top5": 0.9, "pairwise": 0.6, "seconds": 2.0}

    # platform a is easy (random 0.8), b hard (random 0.2); rdu is +0.1 on a, -0.05 on b
    # rdu2 against rdu (`cv.pairs`): +0.1, 0 on a; 0, +0.1 on b
    scores = {("a", "random"): [0.8, 0.7], ("a", "rdu"): [0.9, 0.8], ("a", "rdu2"): [1.0, 0.8],
              ("b", "random"): [0.2, 0.3], ("b", "rdu"): [0.15, 0.25], ("b", "rdu2"): [0.15, 0.35]}
    runs = tmp_path / "cv"
    runs.mkdir()
    for platform in ("a", "b"):
        rows = [row(platform, cand, fold, 0, v) for (p, cand), vs in scores.items() if p == platform
                for fold, v in enumerate(vs)]
        (runs / f"{platform}.json").write_text(json.dumps(
            {"platform": platform, "cv": {}, "train_programs": 40, "train_tasks": 4, "runs": rows}))
    # a stale file of a platform params.yaml no longer lists is not read
    (runs / "gone.json").write_text(json.dumps({"platform": "gone", "runs": [row("gone", "rdu", 0, 0, 0.0)]}))
    study = tmp_path / "params.yaml"
    study.write_text("cv:\n  platforms: [a, b]\n  folds: 2\n  fold_seed: 0\n  ratios: [0.1]\n  seeds: [0]\n"
                     "  reference: random\n  candidates: {rdu: {}, rdu2: {}, random: {strategy: random}}\n"
                     "  pairs: [[rdu2, rdu]]\n")
    summary, md = _cv_summary(tmp_path, runs, study)
    cells = {c["candidate"]: c for c in summary["summary"]}
    assert cells["rdu"]["runs"] == 4 and cells["rdu"]["task_top1"] == pytest.approx((0.9 + 0.8 + 0.15 + 0.25) / 4)
    assert cells["random"]["task_top1"] == pytest.approx(0.5)
    diff = next(d for d in summary["paired"] if d["candidate"] == "rdu")
    assert diff["candidate"] == "rdu" and diff["runs"] == 4 and diff["wins"] == 2
    assert diff["mean"] == pytest.approx((0.1 + 0.1 - 0.05 - 0.05) / 4)
    per = {p: next(x["mean"] for x in d if x["candidate"] == "rdu") for p, d in summary["paired_per_platform"].items()}
    assert per == {"a": pytest.approx(0.1), "b": pytest.approx(-0.05)}
    assert set(summary["platforms"]) == {"a", "b"}
    text = md.read_text()
    assert "a (40 programs, 4 tasks), b (40 programs, 4 tasks)" in text and "+0.100 ± 0.000" in text
    (pair,) = summary["pairs"]
    assert (pair["candidate"], pair["reference"], pair["runs"], pair["wins"]) == ("rdu2", "rdu", 4, 2)
    assert pair["mean"] == pytest.approx(0.05)
    assert "| 10% | rdu2 − rdu | 4 | +0.050 |" in text


def test_cv_summary_averages_a_subsets_training_runs_before_comparing(tmp_path):
    """`train_runs`: each subset's runs (rows differing only in `train_seed`) count once, as their mean;
    the paired difference and its se are over subsets; `train sd` is the sd between a subset's runs."""
    def row(candidate, fold, train_seed, task_top1):
        return {"platform": "a", "candidate": candidate, "ratio": 0.1, "seed": 0, "fold": fold,
                "train_seed": train_seed, "selected": 10, "held_tasks": [], "sampler_seconds": 1.0,
                "task_top1": task_top1, "task_top5": 0.9, "top1": task_top1, "top5": 0.9, "pairwise": 0.6,
                "seconds": 2.0}

    # fold 0: rdu runs 0.6 / 0.8 (mean 0.7), random 0.5 / 0.5; fold 1: rdu 0.4 / 0.4, random 0.2 / 0.4 (0.3)
    scores = {("rdu", 0): [0.6, 0.8], ("random", 0): [0.5, 0.5], ("rdu", 1): [0.4, 0.4], ("random", 1): [0.2, 0.4]}
    runs = tmp_path / "cv"
    runs.mkdir()
    rows = [row(cand, fold, 100 * r, v) for (cand, fold), vs in scores.items() for r, v in enumerate(vs)]
    (runs / "a.json").write_text(json.dumps(
        {"platform": "a", "cv": {}, "train_programs": 40, "train_tasks": 4, "runs": rows}))
    study = tmp_path / "params.yaml"
    study.write_text("cv:\n  platforms: [a]\n  folds: 2\n  fold_seed: 0\n  ratios: [0.1]\n  seeds: [0]\n"
                     "  train_runs: 2\n  reference: random\n  candidates: {rdu: {}, random: {strategy: random}}\n")
    summary, md = _cv_summary(tmp_path, runs, study)
    cells = {c["candidate"]: c for c in summary["summary"]}
    assert cells["rdu"]["runs"] == 2 and cells["rdu"]["train_runs"] == 2
    assert cells["rdu"]["task_top1"] == pytest.approx(0.55)
    assert cells["rdu"]["task_top1_sd"] == pytest.approx(np.std([0.7, 0.4], ddof=1))
    # the sd between a subset's runs, averaged over subsets: rdu (0.1414 + 0) / 2, random (0 + 0.1414) / 2
    assert cells["rdu"]["task_top1_train_sd"] == pytest.approx(np.std([0.6, 0.8], ddof=1) / 2)
    (diff,) = summary["paired"]
    assert diff["runs"] == 2 and diff["mean"] == pytest.approx((0.2 + 0.1) / 2)
    assert diff["se"] == pytest.approx(np.std([0.2, 0.1], ddof=1) / np.sqrt(2))
    assert "Each subset trained 2 times" in md.read_text()


def test_cv_summary_pools_an_earlier_studys_runs_with_its_own(tmp_path):
    """`--runs` twice: a later study's new candidate in its own folder, the reference from an earlier
    study's folder; a candidate the section does not list (left in the earlier folder) is not read."""
    def row(candidate, fold, task_top1):
        return {"platform": "a", "candidate": candidate, "ratio": 0.1, "seed": 0, "fold": fold, "selected": 10,
                "held_tasks": [], "sampler_seconds": 1.0, "task_top1": task_top1, "task_top5": 0.9,
                "top1": task_top1, "top5": 0.9, "pairwise": 0.6, "seconds": 2.0}

    earlier, later = tmp_path / "earlier", tmp_path / "later"
    for folder, rows in ((earlier, [row("random", 0, 0.5), row("random", 1, 0.3), row("other", 0, 0.0)]),
                         (later, [row("new", 0, 0.6), row("new", 1, 0.5)])):
        folder.mkdir()
        (folder / "a.s0.json").write_text(json.dumps(
            {"platform": "a", "cv": {}, "train_programs": 40, "train_tasks": 4, "runs": rows}))
    study = tmp_path / "params.yaml"
    study.write_text("cv:\n  platforms: [a]\n  folds: 2\n  fold_seed: 0\n  ratios: [0.1]\n  seeds: [0]\n"
                     "  reference: random\n  candidates: {new: {}, random: {strategy: random}}\n")
    summary, _ = _cv_summary(tmp_path, [earlier, later], study)
    assert {c["candidate"] for c in summary["summary"]} == {"new", "random"}
    (diff,) = summary["paired"]
    assert (diff["candidate"], diff["runs"]) == ("new", 2) and diff["mean"] == pytest.approx((0.1 + 0.2) / 2)


EQUAL_STEPS_SCRIPT = ROOT / "pipelines" / "sampling" / "equal_steps.py"


def test_equal_steps_variant_summary_pairs_by_run_and_training(tmp_path):
    """A variant's per-task top-1 minus rdu's / random's of the same (platform, fold, seed) and
    training, from a `run` rows file and from the variant file's own rdu / random rows (`self`)."""
    def scores(v):
        return {"task_top1": v, "top1": v, "top5": 0.9, "task_top5": 0.9}

    pair = [{"platform": "a", "fold": f, "seed": 0, "full": scores(0.9),
             "rdu": scores(0.5), "rdu-steps": scores(0.6), "random": scores(0.4 + 0.1 * f),
             "random-steps": scores(0.7)} for f in (0, 1)]
    variants = [{"name": "v", "platform": "a", "fold": f, "seed": 0, "default": scores(0.6), "steps": scores(0.65)}
                for f in (0, 1)]
    variants.append({"name": "v", "platform": "gone", "fold": 0, "seed": 0, "steps": scores(0.0)})  # no pair row
    (tmp_path / "pair.jsonl").write_text("".join(json.dumps(r) + "\n" for r in pair))
    (tmp_path / "v.jsonl").write_text("".join(json.dumps(r) + "\n" for r in variants))
    run = [sys.executable, str(EQUAL_STEPS_SCRIPT), "variant-summary", str(tmp_path / "v.jsonl")]
    text = subprocess.run(run + ["--pair", str(tmp_path / "pair.jsonl")], check=True, cwd=ROOT,
                          capture_output=True, text=True).stdout
    # default: 0.6 - rdu 0.5 = +0.1; - random (0.4, 0.5): +0.2, +0.1 (se 0.05), both runs above
    assert "| v | default | 2 | 0.600 ± 0.000 | +0.100 ± 0.000 | +0.150 ± 0.050 | 2/2 |" in text
    # steps: against rdu-steps 0.6 and random-steps 0.7; the unpaired platform is left out
    assert "| v | steps | 2 | 0.650 ± 0.000 | +0.050 ± 0.000 | -0.050 ± 0.000 | 0/2 |" in text

    own = [{"name": n, "platform": "a", "fold": 0, "seed": s, "default": scores(v)}
           for n, v in (("rdu", 0.5), ("random", 0.3), ("v", 0.6)) for s in (2, 3)]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in own))
    text = subprocess.run([sys.executable, str(EQUAL_STEPS_SCRIPT), "variant-summary", str(tmp_path / "c.jsonl"),
                           "--pair", "self"], check=True, cwd=ROOT, capture_output=True, text=True).stdout
    assert "| v | default | 2 | 0.600 ± 0.000 | +0.100 ± 0.000 | +0.300 ± 0.000 | 2/2 |" in text


def test_task_share_subset_spreads_the_budget_evenly_over_a_share_of_the_tasks():
    """pipelines/sampling/task_share.py: round(share x tasks) tasks, the budget dealt evenly over
    them (a task smaller than its part gives all it has, the rest to the others), seeded."""
    sys.path.insert(0, str(ROOT / "pipelines" / "sampling"))
    try:
        from task_share import task_share_subset
    finally:
        sys.path.remove(str(ROOT / "pipelines" / "sampling"))
    pool = make_fs(n_tasks=8, per_task=24)
    small = pool.subset(np.flatnonzero((pool.task != 0) | (np.arange(len(pool)) % 24 < 2)))  # task 0: 2 programs
    for share, tasks in ((1.0, 8), (0.5, 4), (0.25, 2)):
        sub = task_share_subset(pool, 0.25, share, seed=0)
        counts = np.bincount(sub.task)
        assert len(sub) == 48 and len(sub.tasks) == tasks and counts.max() - counts.min() <= 1
        again = task_share_subset(pool, 0.25, share, seed=0)
        assert list(again.program_id) == list(sub.program_id)
    sub = task_share_subset(small, 0.3, 1.0, seed=0)  # 51 of 170: task 0 gives its 2, the others 7
    counts = dict(zip(sub.tasks, np.bincount(sub.task)))
    assert len(sub) == 51 and sorted(counts.values()) == [2, 7, 7, 7, 7, 7, 7, 7]
    assert task_share_subset(pool, 0.25, 0.5, seed=1).tasks != task_share_subset(pool, 0.25, 0.5, seed=0).tasks


def test_regularize_changes_only_the_main_job_s_preset_of_a_copy():
    """pipelines/sampling/regularize.py: a dropout setting updates the preset the subsets' models
    train with (pipeline.preset) in a copy of the params, nothing else."""
    sys.path.insert(0, str(ROOT / "pipelines" / "sampling"))
    try:
        from regularize import SETTINGS, with_model
    finally:
        sys.path.remove(str(ROOT / "pipelines" / "sampling"))
    params = {"pipeline": {"preset": "kb"}, "models": {"mamba": {"kb": {"d_model": 64}, "ac": {"d_model": 128}}}}
    out = with_model(params, SETTINGS["drop0.1"][1])
    assert out["models"]["mamba"] == {"kb": {"d_model": 64, "dropout": 0.1}, "ac": {"d_model": 128}}
    assert params["models"]["mamba"]["kb"] == {"d_model": 64}  # the caller's params untouched
    assert SETTINGS["wd1e-3"] == ({"weight_decay": 1e-3}, {}) and SETTINGS["none"] == ({}, {})
