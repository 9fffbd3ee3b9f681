"""The KD guard's cross-validated view of the target (continual.kd_guard_folds, tcl.continual.crossval)."""

from __future__ import annotations

import numpy as np
import pytest

from tcl import metrics as M
from tcl.continual import crossval
from tcl.continual.schedule import ContinualError, learn_platform, run_schedule, settings
from tcl.models import load_model

from .test_continual import PARAMS, _platform
from .test_training import make_fs


def _params(folds: int, kd_epochs: int = 4, kd_patience: int | None = None) -> dict:
    kd = {"lr": 0.003, "epochs": kd_epochs, **({"patience": kd_patience} if kd_patience else {})}
    return {**PARAMS, "continual": {**PARAMS["continual"], "select": "pairwise", "kd_guard": "target",
                                    "kd_guard_folds": folds, "kd": kd}}


def test_task_folds_deal_whole_tasks_into_disjoint_seeded_folds():
    task = np.repeat(np.arange(7), 5)
    folds = crossval.task_folds(task, 3, seed=0)
    assert len(folds) == 3 and sorted(np.concatenate(folds).tolist()) == list(range(len(task)))
    fold_tasks = [set(task[f].tolist()) for f in folds]
    assert all(not (a & b) for i, a in enumerate(fold_tasks) for b in fold_tasks[i + 1:])  # whole tasks
    assert sorted(len(t) for t in fold_tasks) == [2, 2, 3]
    assert all(np.array_equal(a, b) for a, b in zip(folds, crossval.task_folds(task, 3, seed=0)))
    assert any(not np.array_equal(a, b) for a, b in zip(folds, crossval.task_folds(task, 3, seed=1)))
    assert len(crossval.task_folds(task[:10], 4, seed=0)) == 2  # never more folds than tasks


def test_the_guard_scores_each_task_once_whatever_its_programs():
    a = make_fs(seed=1, n_tasks=3, per_task=40)
    b = make_fs(seed=2, n_tasks=2, per_task=6)
    rng = np.random.default_rng(0)
    sa, sb = rng.standard_normal(len(a)), rng.standard_normal(len(b))
    by_task = M.pairwise_by_task(sa, a.latency, a.task)
    assert sorted(by_task) == [0, 1, 2]
    for t, acc in by_task.items():
        rows = a.task == t
        assert acc == pytest.approx(M.pairwise_accuracy(sa[rows], a.latency[rows], a.task[rows]))
    per_task = list(by_task.values()) + list(M.pairwise_by_task(sb, b.latency, b.task).values())
    assert crossval.pooled(list(by_task.values()), per_task[3:]) == pytest.approx(np.mean(per_task))
    assert np.isnan(crossval.pooled([], []))


class _Scores:
    """A model whose scores are given (crossval.task_scores reads predict_features only)."""

    def __init__(self, scores):
        self.scores = scores

    def predict_features(self, fs):
        return self.scores


def test_task_top1_and_top5_scores_are_the_best_latency_over_the_top_picks():
    fs = make_fs(seed=3, n_tasks=4, per_task=9)
    scores = np.random.default_rng(1).standard_normal(len(fs))
    for metric, k in (("task_top1", 1), ("task_top5", 5)):
        got = crossval.task_scores(_Scores(scores), fs, metric)
        hand = []
        for t in range(4):
            rows = np.flatnonzero(fs.task == t)
            picks = rows[np.argsort(-scores[rows], kind="stable")[:k]]
            hand.append(fs.latency[rows].min() / fs.latency[picks].min())
        assert got == pytest.approx(hand)
        assert np.mean(got) == pytest.approx(M.task_top_k_means(scores, fs.latency, fs.task, (k,))[f"task_top{k}"])


def test_kd_guard_folds_judges_every_kd_epoch_on_the_validation_split_and_the_held_out_folds(tmp_path, monkeypatch,
                                                                                             one_torch_thread):
    """A two-platform schedule whose target KD is guarded with 3 folds of the target's 12 tasks:
    every probe run trains without its fold (whole tasks) and scores it; KD runs every epoch (early
    stopping off, though patience is 1); the guard's score of an epoch is the mean over the
    validation split's tasks and the folds' tasks; the probes leave the real run as it is without them."""
    source, target = _platform("p0", 5), _platform("p1", 1)
    seen_by_probes = []

    def spy(kb, data, seen, params, cfg, out_dir, step, probe=None):
        held_out = set(probe.fold.program_id.tolist())
        seen_by_probes.append((held_out, set(data.train.program_id.tolist()), set(probe.fold.tasks)))
        return learn_platform(kb, data, seen, params, cfg, out_dir, step, probe=probe)

    real_target_cv = crossval.target_cv  # the real probe runs, watched on their way in
    monkeypatch.setattr(crossval, "target_cv", lambda *a: real_target_cv(*a[:-1], spy))
    summary = run_schedule("fam", [source, target], _params(3, kd_patience=1), tmp_path / "cv", track=False)
    kd = summary["per_platform"][-1]["kd"]
    cv = kd["cv"]
    assert cv["folds"] == 3 and cv["tasks"] == 12 and len(cv["epochs"]) == 4
    assert len(kd["epochs"]) == 4 and kd["target_split"] == "valid+folds"  # no early stop at patience 1

    assert len(seen_by_probes) == 3
    subset_ids = set(target.train.program_id.tolist())
    assert set().union(*(held for held, _, _ in seen_by_probes)) == subset_ids
    for held, trained, tasks in seen_by_probes:
        assert trained == subset_ids - held  # the fold is out of its probe's training data
        assert all(not (tasks & other) for h, _, other in seen_by_probes if h is not held)

    rows = kd["epochs"]
    assert [r["guard_cv"] for r in rows] == pytest.approx(cv["epochs"])
    qualifying = [r for r in rows if r["guard_worst_source_drop"] <= 0.01 and r["guard_target"] > kd["start_valid"]]
    if qualifying:
        assert kd["kept_epoch"] == max(qualifying, key=lambda r: r["guard_target"])["epoch"]
    else:
        assert kd["kept_start"] and kd["end_valid"] == kd["start_valid"]
    # the kept KB's score: its validation tasks' with the folds' tasks of its epoch, each task once
    kb = load_model(tmp_path / "cv" / "model.pt")
    valid_tasks = list(M.pairwise_by_task(kb.predict_features(target.valid), target.valid.latency,
                                          target.valid.task).values())
    folds = cv["start"] if kd["kept_epoch"] is None else cv["epochs"][kd["kept_epoch"]]
    assert len(valid_tasks) == 4 and kd["end_valid"] == pytest.approx(
        (sum(valid_tasks) + cv["tasks"] * folds) / (len(valid_tasks) + cv["tasks"]))

    # the probes train copies: the real run's KD is the one a run without folds makes
    plain = run_schedule("fam", [source, target], _params(0, kd_patience=100), tmp_path / "plain", track=False)
    plain_rows = plain["per_platform"][-1]["kd"]["epochs"]
    assert [r["train_loss"] for r in rows] == [r["train_loss"] for r in plain_rows]
    assert [r["valid_pairwise"] for r in rows] == [r["valid_pairwise"] for r in plain_rows]


def test_kd_guard_folds_without_a_validation_split_judge_the_target_on_the_folds_alone(tmp_path,
                                                                                      one_torch_thread):
    source, target = _platform("p0", 5), _platform("p1", 1)
    target.valid = None
    summary = run_schedule("fam", [source, target], _params(2, kd_epochs=2), tmp_path, track=False)
    kd = summary["per_platform"][-1]["kd"]
    assert kd["target_split"] == "folds" and kd["cv"]["folds"] == 2
    assert [r["guard_target"] for r in kd["epochs"]] == pytest.approx(kd["cv"]["epochs"])
    assert kd["start_valid"] == pytest.approx(kd["cv"]["start"])


@pytest.mark.parametrize("change, message", [
    ({"kd_guard_folds": 1}, r"0 \(off\) or a number of folds >= 2"),
    ({"kd_guard_folds": -2}, r"0 \(off\) or a number of folds >= 2"),
    ({"kd_guard_folds": 3, "kd_guard": "mean"}, "kd_guard: target"),
    ({"kd_guard_folds": 3, "kd_guard_fold_metric": "top1"}, "pairwise, task_top1, task_top5"),
])
def test_kd_guard_folds_settings_are_checked(change, message):
    with pytest.raises(ContinualError, match=message):
        settings({"continual": {"select": "pairwise", **change}})
