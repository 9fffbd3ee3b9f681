"""Continual knowledge distillation: frozen teachers, EWC, Φ, the schedule and `tcl transfer`."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from click.testing import CliRunner

from tcl.continual import ewc as E
from tcl.continual.distill import phi_at, teacher_quality
from tcl.continual.schedule import PlatformData, cl_phase, kd_phase, run_schedule, settings
from tcl.models import load_model, new_model

from .conftest import fixture_path
from .test_training import F, make_fs

TINY = {"kb": {"d_model": 8, "n_layers": 1, "d_state": 4, "expand": 1, "d_conv": 2},
        "ac": {"d_model": 16, "n_layers": 1, "d_state": 4, "expand": 1, "d_conv": 2}}
TRAIN = {"seed": 0, "loss": "lambdarank", "lr": 0.01, "warmup_epochs": 0, "schedule": "cosine",
         "batch_size": 32, "epochs": 2, "patience": 5, "threads": 1}
PARAMS = {"models": {"mamba": TINY}, "train": TRAIN,
          "continual": {"phi": {"trust": 0.5, "floor": 0.1, "decay": 0.8}, "ac_init_epochs": 1,
                        "cl": {"epochs": 3}, "kd": {"lr": 0.003, "epochs": 2}}}


def _state(model) -> dict:
    return {k: v.detach().clone() for k, v in model.net.state_dict().items()}


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _model(role: str, seed: int = 0):
    torch.manual_seed(seed)
    return new_model("mamba", F, TINY[role], {"feature_version": "test-1", "max_len": 8, "n_features": F})


@pytest.fixture(scope="module")
def taught_kb(tmp_path_factory):
    """A tiny KB that ranks make_fs programs well (trained a few epochs on them)."""
    from tcl.training import train_model

    kb = _model("kb")
    train_model(kb, make_fs(seed=5, platform="p0"), [], {**TRAIN, "epochs": 6}, tmp_path_factory.mktemp("kb"))
    return kb


def _platform(name: str, seed: int) -> PlatformData:
    return PlatformData(name, make_fs(seed=seed, platform=name), make_fs(seed=seed + 100, n_tasks=4, platform=name))


def _write_splits(splits, names: list[str]) -> None:
    """`splits/<name>/{train,valid,test}.npz` of each platform, as the split stage writes them
    (the test split is the validation data: these tests read their structure, not its scores)."""
    for i, name in enumerate(names):
        d = splits / name
        d.mkdir(parents=True)
        data = _platform(name, i + 1)
        data.train.save(d / "train.npz")
        data.valid.save(d / "valid.npz")
        data.valid.save(d / "test.npz")


def test_cl_keeps_the_frozen_teacher_bit_identical(tmp_path, one_torch_thread, taught_kb):
    cfg, data = settings(PARAMS), _platform("p1", 1)
    ac = _model("ac")
    kb_before, ac_before = _state(taught_kb), _state(ac)
    res = cl_phase(ac, taught_kb, data, [data], cfg, TRAIN, tmp_path)
    assert _same(_state(taught_kb), kb_before)
    assert not _same(_state(ac), ac_before)  # the AC learned
    assert len(res["phi"]) == TRAIN["epochs"] and all("loss_distill" in r for r in res["epochs"])


def test_kd_keeps_the_ac_bit_identical_and_trains_the_kb_under_ewc(tmp_path, one_torch_thread, taught_kb):
    cfg, data = {**settings(PARAMS), "kd_guard": False}, _platform("p1", 1)
    ac, kb = _model("ac", seed=1), load_model_copy(taught_kb, tmp_path)
    earlier = E.absorb(None, kb, E.estimate_fisher(kb, make_fs(seed=5, platform="p0"), TRAIN), "p0")
    ac_before, kb_before = _state(ac), _state(kb)
    state, res = kd_phase(kb, ac, data, [data], earlier, cfg, TRAIN, tmp_path)
    assert _same(_state(ac), ac_before)
    assert not _same(_state(kb), kb_before)
    assert all(r["loss_task"] == 0 and r["loss_ewc"] >= 0 and "loss_distill" in r for r in res["epochs"])
    assert state.platforms == ["p0", "p1"]
    assert kb.feature_meta["platforms"] == ["p0", "p1"]


def test_kd_keeps_the_platforms_a_kb_without_ewc_state_already_knew(tmp_path, one_torch_thread, taught_kb):
    """A KB trained without CKD (no EWC state) names its platforms only in feature_meta: the KB
    after KD knows them and the target, not the target alone."""
    cfg, data = {**settings(PARAMS), "kd_guard": "none"}, _platform("p1", 1)
    kb = load_model_copy(taught_kb, tmp_path)
    kb.feature_meta = {**kb.feature_meta, "platforms": ["p0", "q0"]}
    kd_phase(kb, _model("ac", seed=1), data, [data], None, cfg, TRAIN, tmp_path / "kd")
    assert kb.feature_meta["platforms"] == ["p0", "q0", "p1"]


def _ordered_by(model, fs):
    """`fs` with its latencies re-measured as `model`'s order: the model ranks it perfectly."""
    fs.latency = np.exp(-model.predict_features(fs))
    fs.y = (np.array([fs.latency[fs.task == t].min() for t in fs.task]) / fs.latency).astype(np.float32)
    return fs


@pytest.mark.parametrize("select,guard", [("top1", "mean"), ("pairwise", "mean"), ("pairwise", "target")])
def test_kd_guard_keeps_the_starting_kb_when_the_ac_teaches_it_worse(tmp_path, one_torch_thread, taught_kb,
                                                                     select, guard):
    cfg, data = {**settings(PARAMS), "select": select, "kd_guard": guard}, _platform("p1", 1)
    kb = load_model_copy(taught_kb, tmp_path)
    # validation programs whose measured order is the KB's own: it starts at top-1 = 1, unbeatable
    _ordered_by(kb, data.valid)
    backwards = _negated(load_model_copy(taught_kb, tmp_path))  # an AC that ranks every task backwards
    earlier = E.absorb(None, kb, E.estimate_fisher(kb, make_fs(seed=5, platform="p0"), TRAIN), "p0")
    kb_before = _state(kb)
    state, res = kd_phase(kb, backwards, data, [data], earlier, cfg, {**TRAIN, "select": select}, tmp_path / "kd")
    assert res["kept_start"] and _same(_state(kb), kb_before)
    # the KB's own order: every metric at its maximum, which no KD epoch reaches
    assert res["select"] == select and res["start_valid"] == 1.0
    assert all(r[f"valid_{select}"] < 1.0 for r in res["epochs"])
    assert state.platforms == ["p0", "p1"]  # the platform is still finished (its Fisher added)


@pytest.mark.parametrize("tolerance", [0.0, 0.5, 1.0])
def test_kd_target_guard_keeps_the_best_target_epoch_within_the_sources_tolerance(tmp_path, one_torch_thread,
                                                                                  taught_kb, tolerance):
    """A source p0 the KB ranks perfectly and a target p1 ordered backwards to the KB, taught by an
    AC that ranks backwards: KD gains on the target and costs the source. The kept KB is the epoch
    best on the target's validation among those within `tolerance` on the source (recomputed
    from the per-epoch rows), else the start; the source never loses more than `tolerance`."""
    from tcl import metrics as M

    kb = load_model_copy(taught_kb, tmp_path)
    source, target = _platform("p0", 5), _platform("p1", 1)
    _ordered_by(kb, source.valid)
    backwards = _negated(load_model_copy(taught_kb, tmp_path / "ac"))
    _ordered_by(backwards, target.valid)
    _ordered_by(backwards, target.train)
    earlier = E.absorb(None, kb, E.estimate_fisher(kb, source.train, TRAIN), "p0")
    cfg = {**settings(PARAMS), "select": "pairwise", "kd_guard": "target", "kd_guard_tolerance": tolerance,
           "lambda_ewc": 0.0}
    params = {**TRAIN, "select": "pairwise", "epochs": 6, "patience": 100, "lr": 0.02}
    _, res = kd_phase(kb, backwards, target, [source, target], earlier, cfg, params, tmp_path / "kd")

    def pairwise(fs):
        return M.evaluate(kb.predict_features(fs), fs)["pairwise"]

    rows = res["epochs"]
    assert len(rows) == 6 and res["guard"] == "target" and res["start_sources"]["p0"] == pytest.approx(1.0)
    qualifying = [r for r in rows if r["guard_worst_source_drop"] <= tolerance
                  and r["guard_target"] > res["start_valid"]]
    if qualifying:
        best = max(qualifying, key=lambda r: r["guard_target"])
        assert not res["kept_start"] and res["kept_epoch"] == best["epoch"]
        assert pairwise(target.valid) == pytest.approx(best["guard_target"])
    else:
        assert res["kept_start"] and pairwise(target.valid) == pytest.approx(res["start_valid"])
    assert 1.0 - pairwise(source.valid) <= tolerance + 1e-9
    if tolerance == 1.0:  # anything goes on the source: KD must have learned the target
        assert not res["kept_start"]
    if tolerance == 0.5:  # the bound binds: the epoch best on the target alone costs the source more
        assert res["kept_epoch"] is not None and max(r["guard_target"] for r in rows) > res["end_valid"]
    if tolerance == 0.0:  # the source is perfect at the start: only an epoch that keeps it so may win
        assert pairwise(source.valid) == pytest.approx(1.0)


@pytest.mark.parametrize("min_gain_se", [0.5, 1e6])
def test_kd_target_guard_takes_an_epoch_only_when_its_target_gain_reaches_min_gain_se(tmp_path, one_torch_thread,
                                                                                     taught_kb, min_gain_se):
    """kd_guard_min_gain_se: KD learns a target ordered backwards to the KB (the sources free to
    lose), but an epoch is kept only when its mean per-task pairwise gain over the start on the
    target's 4 validation tasks is that many standard errors; recomputed by hand for the kept KB."""
    from tcl.continual import crossval

    kb = load_model_copy(taught_kb, tmp_path)
    source, target = _platform("p0", 5), _platform("p1", 1)
    backwards = _negated(load_model_copy(taught_kb, tmp_path / "ac"))
    _ordered_by(backwards, target.valid)
    _ordered_by(backwards, target.train)
    start_tasks = np.array(crossval.task_scores(kb, target.valid))
    earlier = E.absorb(None, kb, E.estimate_fisher(kb, source.train, TRAIN), "p0")
    cfg = {**settings(PARAMS), "select": "pairwise", "kd_guard": "target", "kd_guard_tolerance": 1.0,
           "lambda_ewc": 0.0, "kd_guard_min_gain_se": min_gain_se}
    params = {**TRAIN, "select": "pairwise", "epochs": 4, "patience": 100, "lr": 0.02}
    _, res = kd_phase(kb, backwards, target, [source, target], earlier, cfg, params, tmp_path / "kd")

    rows = res["epochs"]
    assert all("guard_gain_se" in r for r in rows) and res["min_gain_se"] == min_gain_se
    assert all(r["guard_gain_se"] >= min_gain_se for r in rows if r["guard_kept"])
    if min_gain_se == 1e6:  # no finite gain over 4 noisy tasks is a million standard errors
        assert res["kept_start"] and np.allclose(crossval.task_scores(kb, target.valid), start_tasks)
    else:  # the backwards target is learned plainly: an epoch qualifies, and the kept KB's gain does
        assert not res["kept_start"]
        gains = np.array(crossval.task_scores(kb, target.valid)) - start_tasks
        assert gains.mean() / (gains.std(ddof=1) / 2.0) >= min_gain_se


@pytest.mark.parametrize("change,message", [({"kd_guard_min_gain_se": -1}, "must be >= 0"),
                                            ({"kd_guard_min_gain_se": 2, "kd_guard_folds": 4}, "without kd_guard_folds"),
                                            ({"kd_guard_min_gain_se": 2, "kd_guard": "mean"}, "needs kd_guard: target")])
def test_kd_guard_min_gain_se_settings_are_checked(change, message):
    from tcl.continual.schedule import ContinualError

    with pytest.raises(ContinualError, match=message):
        settings({**PARAMS, "continual": {**PARAMS["continual"], **change}})


def test_kd_target_guard_judges_the_sources_training_programs_with_kd_guard_splits_and_metric(tmp_path, one_torch_thread,
                                                                                        taught_kb):
    """kd_guard_splits: a source without a validation split is not judged under [valid] (KD learns
    the backwards target at the source's cost), and under [valid, train] its training programs are
    judged: at tolerance 0 the kept KB still ranks them as perfectly as the start did."""
    from tcl import metrics as M
    from tcl.continual.schedule import ContinualError

    source, target = _platform("p0", 5), _platform("p1", 1)
    source.valid = None
    _ordered_by(taught_kb, source.train)
    backwards = _negated(load_model_copy(taught_kb, tmp_path / "ac"))
    _ordered_by(backwards, target.valid)
    _ordered_by(backwards, target.train)
    params = {**TRAIN, "select": "pairwise", "epochs": 6, "patience": 100, "lr": 0.02}

    def kd(splits, metric="pairwise"):
        tag = "-".join(splits) + metric
        kb = load_model_copy(taught_kb, tmp_path / tag)
        earlier = E.absorb(None, kb, E.estimate_fisher(kb, source.train, TRAIN), "p0")
        cfg = settings({**PARAMS, "continual": {**PARAMS["continual"], "select": "pairwise", "kd_guard": "target",
                                                "kd_guard_tolerance": 0.0, "lambda_ewc": 0.0,
                                                "kd_guard_splits": splits, "kd_guard_metric": metric}})
        _, res = kd_phase(kb, backwards, target, [source, target], earlier, cfg, params, tmp_path / tag / "kd")
        return M.evaluate(kb.predict_features(source.train), source.train)[metric], res

    forgot, res = kd(["valid"])
    assert res["start_sources"] == {} and not res["kept_start"] and forgot < 1.0
    kept, res = kd(["train", "valid"])
    assert res["source_splits"] == ["valid", "train"] and res["start_sources"] == {"p0/train": pytest.approx(1.0)}
    assert kept == pytest.approx(1.0)
    assert all(r["guard_worst_source_drop_train"] == r["guard_worst_source_drop"] for r in res["epochs"])
    assert any(r["guard_worst_source_drop"] > 0 and not r["guard_kept"] for r in res["epochs"])
    # the sources' loss in another metric than the target's (kd_guard_metric): top-1 on the training programs
    kept, res = kd(["train"], "top1")
    assert res["source_metric"] == "top1" and res["start_sources"] == {"p0/train": pytest.approx(1.0)}
    assert kept == pytest.approx(1.0) and res["select"] == "pairwise"
    assert settings({"continual": {"kd_guard_splits": "train,valid"}})["kd_guard_splits"] == ["valid", "train"]
    with pytest.raises(ContinualError, match="kd_guard_metric"):
        settings({"continual": {"kd_guard_metric": "fastest"}})
    for bad in (["test"], []):
        with pytest.raises(ContinualError, match="kd_guard_splits"):
            settings({"continual": {"kd_guard_splits": bad}})


def test_kd_task_term_adds_alpha_times_the_kb_label_loss(tmp_path, one_torch_thread, taught_kb):
    """α·L_task(KB, D_t) beside L_distill: at lr 0 the KB stays put, so the epoch's reported
    loss_task is α times the mean LambdaRank of the KB's scores against the labels over the same
    batches, computed here with the loss function directly (float64 sums of the batch losses)."""
    from tcl.losses import lambdarank_loss
    from tcl.training import epoch_batches, epoch_seed

    data, alpha = _platform("p1", 1), 0.7
    params = {**TRAIN, "lr": 0.0, "epochs": 1}
    cfg = {**settings(PARAMS), "alpha_task": alpha}
    kb = load_model_copy(taught_kb, tmp_path)
    _, res = kd_phase(kb, _model("ac", seed=1), data, [data], None, cfg, params, tmp_path / "kd")
    scores = torch.from_numpy(kb.predict_features(data.train).astype(np.float32))
    fs = data.train
    batches = epoch_batches([fs], params["batch_size"], np.random.default_rng(epoch_seed(0, 0)), by_task=True)
    total = sum(float(lambdarank_loss(scores[np.sort(i)], torch.from_numpy(fs.y[np.sort(i)]),
                                      torch.from_numpy(fs.task[np.sort(i)].astype(np.int64)))) * len(i)
                for _, i in batches)
    row = res["epochs"][0]
    assert row["loss_task"] == pytest.approx(alpha * total / len(fs), rel=1e-4)
    assert row["loss_distill"] > 0


def _relabelled(fs, seed: int):
    """`fs` with its latencies (and labels) shuffled: other measurements of the same programs."""
    out = fs.subset(np.arange(len(fs)))
    order = np.random.default_rng(seed).permutation(len(out))
    out.latency, out.y = out.latency[order], out.y[order]
    return out


def test_unmeasured_programs_extend_distillation_and_their_labels_are_never_read(tmp_path, one_torch_thread,
                                                                                taught_kb):
    """A platform's pool of unmeasured programs joins every distillation term (CL's AC <- KB, KD's
    KB <- AC, with α > 0 beside KD's task term): the phases learn something else with it, and
    nothing of its latencies: shuffling them (even without `unmeasured` blanking them) changes no
    weight, bit for bit. The task terms still read the measured programs."""
    from tcl.continual.schedule import unmeasured

    cfg = {**settings(PARAMS), "kd_guard": "none", "alpha_task": 0.5}
    pool = make_fs(seed=7, platform="p1")

    def run(pool_fs, tag):
        data = _platform("p1", 1)
        data.pool = pool_fs
        ac = _model("ac")
        cl = cl_phase(ac, taught_kb, data, [data], cfg, TRAIN, tmp_path / f"cl-{tag}")
        (tmp_path / tag).mkdir()
        kb = load_model_copy(taught_kb, tmp_path / tag)
        _, kd = kd_phase(kb, ac, data, [data], None, cfg, TRAIN, tmp_path / f"kd-{tag}")
        return _state(ac), _state(kb), cl, kd

    ac_a, kb_a, cl_a, kd_a = run(pool, "a")
    ac_b, kb_b, _, _ = run(_relabelled(pool, 1), "b")
    assert _same(ac_a, ac_b) and _same(kb_a, kb_b)
    ac_c, kb_c, _, _ = run(unmeasured(pool), "c")
    assert _same(ac_a, ac_c) and _same(kb_a, kb_c)
    ac_none, kb_none, _, _ = run(None, "none")
    assert not _same(ac_a, ac_none) and not _same(kb_a, kb_none)  # the pool was learned from
    # the measured programs' task loss is there, in both phases
    assert all(r["loss_task"] > 0 and r["loss_distill"] > 0 for r in cl_a["epochs"] + kd_a["epochs"])
    blank = unmeasured(pool)
    assert not blank.y.any() and np.isnan(blank.latency).all() and blank.meta["unmeasured"]
    assert np.array_equal(blank.x, pool.x) and np.array_equal(blank.task, pool.task)


def test_a_phase_keeps_the_epoch_best_on_continual_select(tmp_path, one_torch_thread, taught_kb):
    """continual.select reaches each phase's early stopping: the AC kept after CL is the epoch with
    the highest mean validation pairwise accuracy (recomputed here), not the best top-1."""
    from tcl import metrics as M
    from tcl.continual.schedule import phase_params

    cfg, data = {**settings(PARAMS), "select": "pairwise"}, _platform("p1", 1)
    params = {**phase_params(PARAMS, cfg, "cl"), "epochs": 4, "patience": 10}
    assert params["select"] == "pairwise"
    ac = _model("ac")
    res = cl_phase(ac, taught_kb, data, [data], cfg, params, tmp_path)
    history = [r["valid_pairwise"] for r in res["epochs"]]
    assert M.evaluate(ac.predict_features(data.valid), data.valid)["pairwise"] == pytest.approx(max(history))


def test_bad_selection_metric_and_negative_alpha_are_refused():
    from tcl.continual.schedule import ContinualError

    with pytest.raises(ContinualError, match="select"):
        settings({**PARAMS, "continual": {"select": "accuracy"}})
    with pytest.raises(ContinualError, match="alpha_task"):
        settings({**PARAMS, "continual": {"alpha_task": -1}})


def test_ac_init_grow_starts_the_ac_as_the_kb_and_the_schedule_records_it(tmp_path, one_torch_thread, taught_kb):
    """continual.ac_init grow: the AC starts from the KB's weights (tcl.models.grow), scoring as
    the KB does before CL; the schedule skips the distilled start and records the growth."""
    from tcl.continual.schedule import ContinualError, grow_ac

    data = _platform("p1", 1)
    ac = _model("ac")
    assert grow_ac(ac, taught_kb, 0.0) == {"noise": 0.0}
    kb_scores, ac_scores = taught_kb.predict_features(data.valid), ac.predict_features(data.valid)
    assert np.abs(ac_scores - kb_scores).max() < 1e-4 * max(1.0, float(np.std(kb_scores)))

    params = {**PARAMS, "continual": {**PARAMS["continual"], "ac_init": "grow"}}
    summary = run_schedule("fam", [_platform("p1", 1), _platform("p2", 2)], params, tmp_path / "out", track=False)
    first, second = summary["per_platform"]
    assert "ac_grown" not in first  # no KB yet: a fresh AC
    assert second["ac_grown"] == {"noise": settings(params)["ac_grow_noise"]} and "ac_init" not in second
    for bad in ({"ac_init": "copy"}, {"ac_grow_noise": -0.1}):
        with pytest.raises(ContinualError, match=next(iter(bad))):
            settings({**PARAMS, "continual": bad})


def test_replay_draws_earlier_platforms_programs_and_both_phases_learn_from_them(tmp_path, one_torch_thread):
    """continual.replay: a later platform's CL and KD also train on up to replay x |D_t| of each
    earlier platform's measured training programs (seeded draws of that platform's own programs,
    one set per platform); the schedule records what it rehearsed, and the KB it ends with differs
    from the one without rehearsal. The first platform rehearses nothing (nothing came before)."""
    from tcl.continual.schedule import ContinualError, replay_sets

    p1, p2, p3 = _platform("p1", 1), _platform("p2", 2), _platform("p3", 3)
    p3.train = p3.train.subset(np.arange(40))
    sets = replay_sets(p3, [p1, p2, p3], 0.5, seed=0)
    assert [fs.platform for fs in sets] == ["p1", "p2"] and [len(fs) for fs in sets] == [20, 20]
    rows = {tuple(r) for r in p1.train.x.reshape(len(p1.train), -1).tolist()}
    assert all(tuple(r) in rows for r in sets[0].x.reshape(20, -1).tolist())  # p1's own programs
    again, other = replay_sets(p3, [p1, p2, p3], 0.5, seed=0), replay_sets(p3, [p1, p2, p3], 0.5, seed=1)
    assert np.array_equal(again[0].x, sets[0].x) and not np.array_equal(other[0].x, sets[0].x)
    assert [len(fs) for fs in replay_sets(p3, [p1, p3], 100.0, seed=0)] == [len(p1.train)]  # at most all
    assert replay_sets(p3, [p1, p3], 0.0, seed=0) == []

    def schedule(replay, tag):
        params = {**PARAMS, "continual": {**PARAMS["continual"], "replay": replay, "kd_guard": "none"}}
        return run_schedule("fam", [_platform("p1", 1), _platform("p2", 2)], params, tmp_path / tag, track=False)

    with_replay, without = schedule(0.5, "replay"), schedule(0.0, "plain")
    first, second = with_replay["per_platform"]
    assert "replay" not in first and second["replay"] == {"p1": round(0.5 * len(_platform("p2", 2).train))}
    assert "replay" not in without["per_platform"][1]
    kb_replay, kb_plain = load_model(with_replay["checkpoint"]), load_model(without["checkpoint"])
    assert not _same(_state(kb_replay), _state(kb_plain))
    with pytest.raises(ContinualError, match="replay"):
        settings({**PARAMS, "continual": {"replay": -1}})


def _negated(model):
    with torch.no_grad():  # the same net with negated scores: it ranks every task backwards
        model.net.head[-1].weight.neg_()
        model.net.head[-1].bias.neg_()
    return model


def load_model_copy(model, tmp_path):
    model.save(tmp_path / "copy.pt")
    return load_model(tmp_path / "copy.pt")


def test_ewc_penalty_equals_a_float64_hand_computation_and_is_zero_at_the_anchor(one_torch_thread):
    kb = _model("kb")
    names = [n for n, _ in kb.net.named_parameters()]
    gen = torch.Generator().manual_seed(7)
    fisher = {n: torch.rand(p.shape, generator=gen) for n, p in kb.net.named_parameters()}
    state = E.absorb(None, kb, fisher, "p0")
    assert float(state.penalty(kb.net).detach()) == 0.0
    with torch.no_grad():
        for p in kb.net.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=gen))
    hand = sum(float(((fisher[n].double() * (p.detach().double() - state.anchor[n].double()) ** 2)).sum())
               for n, p in zip(names, kb.net.parameters()))
    assert hand > 0
    assert float(state.penalty(kb.net).detach()) == pytest.approx(hand, rel=1e-5)


def test_fisher_accumulates_across_two_platforms_and_survives_save_load(tmp_path, one_torch_thread):
    kb = _model("kb")
    a, b = make_fs(seed=1, platform="p1"), make_fs(seed=2, platform="p2")
    fa = E.estimate_fisher(kb, a, TRAIN)
    state = E.absorb(None, kb, fa, "p1")
    with torch.no_grad():  # the KB moves on between the platforms
        for p in kb.net.parameters():
            p.mul_(1.01)
    fb = E.estimate_fisher(kb, b, TRAIN)
    state = E.absorb(state, kb, fb, "p2")
    assert any(float(v.abs().sum()) > 0 for v in fa.values())
    for name in fa:
        torch.testing.assert_close(state.fisher[name], fa[name] + fb[name], rtol=0, atol=0)
        torch.testing.assert_close(state.anchor[name], dict(kb.net.named_parameters())[name].detach(), rtol=0, atol=0)
    state.attach(kb)
    kb.save(tmp_path / "kb.pt", extra=state.extra())
    loaded = E.EWCState.from_model(load_model(tmp_path / "kb.pt"))
    assert loaded.platforms == ["p1", "p2"]
    assert _same(loaded.fisher, state.fisher) and _same(loaded.anchor, state.anchor)
    assert E.EWCState.from_model(_model("kb")) is None


def test_phi_falls_for_a_teacher_that_ranks_badly_and_respects_its_floor(tmp_path, one_torch_thread, taught_kb):
    cfg, data = settings(PARAMS), _platform("p1", 1)
    bad = _negated(load_model_copy(taught_kb, tmp_path))
    good_q, bad_q = teacher_quality(taught_kb, data.train), teacher_quality(bad, data.train)
    assert good_q > 0.3 and bad_q == pytest.approx(-good_q)
    good = cl_phase(_model("ac"), taught_kb, data, [data], cfg, TRAIN, tmp_path / "good")
    worse = cl_phase(_model("ac"), bad, data, [data], cfg, TRAIN, tmp_path / "bad")
    floor, decay = PARAMS["continual"]["phi"]["floor"], PARAMS["continual"]["phi"]["decay"]
    assert worse["phi"] == [floor] * TRAIN["epochs"]
    start = min(good_q / 0.5, 1.0)
    assert good["phi"] == pytest.approx([max(floor, start * decay ** e) for e in range(TRAIN["epochs"])])
    assert good["phi"][0] > floor and good["phi"][1] < good["phi"][0]
    assert phi_at(100, good_q, cfg["phi"]) == floor  # decayed to the floor, never below


def test_schedule_runs_source_cl_kd_then_target_cl_kd_as_nested_mlflow_runs(tmp_path, store, one_torch_thread):
    import mlflow

    platforms = [_platform("p1", 1), _platform("p2", 2)]
    summary = run_schedule("fam", platforms, PARAMS, tmp_path / "out")
    client = mlflow.MlflowClient()
    parent = client.get_run(summary["run_id"])
    children = client.search_runs([parent.info.experiment_id],
                                  filter_string=f"tags.mlflow.parentRunId = '{summary['run_id']}'",
                                  order_by=["attributes.start_time ASC"])
    assert [r.info.run_name for r in children] == ["cl-p1", "kd-p1", "ac-init-p2", "cl-p2", "kd-p2"]
    by_name = {r.info.run_name: r for r in children}
    cl2, kd2 = by_name["cl-p2"].info.run_id, by_name["kd-p2"].info.run_id
    cl_epochs = PARAMS["continual"]["cl"]["epochs"]
    for name in ("phi", "loss_task", "loss_distill", "seen_p1_top1", "seen_p2_top5"):
        assert [m.step for m in client.get_metric_history(cl2, name)] == list(range(cl_epochs)), name
    for name in ("loss_distill", "loss_ewc", "seen_p1_top1", "seen_p2_top1"):
        assert len(client.get_metric_history(kd2, name)) == PARAMS["continual"]["kd"]["epochs"], name
    assert "loss_ewc" not in client.get_run(by_name["kd-p1"].info.run_id).data.metrics  # nothing to protect yet
    phi = [m.value for m in client.get_metric_history(cl2, "phi")]
    assert phi == pytest.approx(summary["phi"]["p2"]) and summary["phi"]["p1"] == []
    kb = load_model(summary["checkpoint"])
    assert E.EWCState.from_model(kb).platforms == ["p1", "p2"] and kb.config == TINY["kb"]
    assert set(summary["kb_held_out"]) == {"p1", "p2"}


def _real_features(tmp_path):
    """Features of two real MetaSchedule databases, as a source and a target platform of x86-sse."""
    from tcl.features import featurize_file
    from tcl.records.ingest import ingest

    out = {}
    for name, platform in (("dense_256", "x86-sse-t1"), ("conv2d_small", "x86-sse-t2")):
        ingest(fixture_path(f"metaschedule/{name}"), platform, tmp_path / f"{platform}.parquet")
        featurize_file(tmp_path / f"{platform}.parquet", tmp_path / f"{platform}.npz")
        out[platform] = tmp_path / f"{platform}.npz"
    return out


def test_transfer_cli_json_contract_on_real_data(tmp_path, store, one_torch_thread):
    import mlflow

    from tcl.cli import main
    from tcl.features import FeatureSet
    from tcl.training import train_model

    files = _real_features(tmp_path)
    source = FeatureSet.load(files["x86-sse-t1"])
    splits = tmp_path / "splits" / "x86-sse-t1"
    splits.mkdir(parents=True)
    for part in ("train", "valid", "test"):
        source.save(splits / f"{part}.npz")
    torch.manual_seed(0)
    kb = new_model("mamba", int(source.x.shape[2]), TINY["kb"], source.meta)
    train_model(kb, source, [], TRAIN, tmp_path / "kb")  # a KB trained from scratch: no EWC state
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(PARAMS))

    args = ["transfer", "--family", "x86-sse", "--target-data", files["x86-sse-t2"],
            "--target-valid", files["x86-sse-t2"], "--target-pool", files["x86-sse-t2"], "--from", tmp_path / "kb",
            "--sources", "x86-sse-t1,x86-avx2-t2", "--splits", tmp_path / "splits",
            "--params", tmp_path / "params.yaml", "--out", tmp_path / "new", "--register", "--json"]
    res = CliRunner().invoke(main, [str(a) for a in args])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert "source 'x86-avx2-t2' belongs to family 'x86-avx2', not 'x86-sse'" in res.stderr
    assert "Fisher information estimated on the training splits of x86-sse-t1" in res.stderr
    assert out["sources"] == ["x86-sse-t1"] and out["target"] == "x86-sse-t2"
    assert set(out["sources_top1_before"]) == set(out["sources_top1_after"]) == {"x86-sse-t1"}
    assert len(out["phi"]) == PARAMS["continual"]["cl"]["epochs"] and all(0.1 <= p <= 1 for p in out["phi"])
    assert out["subset_hash"] == hashlib.md5(files["x86-sse-t2"].read_bytes()).hexdigest()
    assert out["pool_programs"] == len(FeatureSet.load(files["x86-sse-t2"]))

    # the run: a parent with the target's phases nested under it
    client = mlflow.MlflowClient()
    children = client.search_runs([client.get_run(out["run_id"]).info.experiment_id],
                                  filter_string=f"tags.mlflow.parentRunId = '{out['run_id']}'")
    assert sorted(r.info.run_name for r in children) == ["ac-init-x86-sse-t2", "cl-x86-sse-t2", "kd-x86-sse-t2"]

    # the new KB: what `tcl evaluate` reads, with the EWC state of the source and the target
    new = load_model(out["checkpoint"])
    assert E.EWCState.from_model(new).platforms == ["x86-sse-t1", "x86-sse-t2"]
    ev = CliRunner().invoke(main, ["evaluate", "--model", str(tmp_path / "new"), "--data",
                                   str(files["x86-sse-t2"]), "--json"])
    assert ev.exit_code == 0, ev.output
    assert json.loads(ev.stdout.strip().splitlines()[-1])["top1"] == pytest.approx(out["target_top1_after"])

    # registered as a candidate, tagged with the sources, the target and the subset's hash
    mv = client.get_model_version_by_alias("tcl-kb-x86-sse", "candidate")
    assert int(mv.version) == out["version"]
    assert mv.tags["sources"] == "x86-sse-t1" and mv.tags["target"] == "x86-sse-t2"
    assert mv.tags["subset_hash"] == out["subset_hash"] and mv.run_id == out["run_id"]

    # a later transfer starts from the registered KB (no --from) and continues its EWC state
    later = ["transfer", "--family", "x86-sse", "--target-data", files["x86-sse-t2"], "--target-valid",
             files["x86-sse-t2"], "--splits", tmp_path / "splits", "--params", tmp_path / "params.yaml",
             "--out", tmp_path / "next", "--seed", "7", "--json"]
    again = CliRunner().invoke(main, [str(a) for a in later])
    assert again.exit_code == 0, again.output
    nxt = json.loads(again.stdout.strip().splitlines()[-1])
    assert client.get_run(nxt["runs"]["cl"]).data.params["train.seed"] == "7"  # --seed over the params' 0
    assert client.get_run(out["runs"]["cl"]).data.params["train.seed"] == str(PARAMS["train"]["seed"])
    assert nxt["start"] == "models:/tcl-kb-x86-sse@candidate" and "Fisher" not in again.stderr
    assert nxt["pool_programs"] == 0 and nxt["replay_programs"] == {}  # continual.replay 0: none rehearsed
    assert E.EWCState.from_model(load_model(nxt["checkpoint"])).platforms == ["x86-sse-t1", "x86-sse-t2", "x86-sse-t2"]
    assert not any("--target-valid" in w for w in nxt["warnings"])

    # without validation programs it still runs, and says what is judged on what; --from takes a
    # runs:/ URI as `tcl evaluate --model` does
    with mlflow.start_run(run_name="a-kb-artifact") as run:
        mlflow.log_artifact(str(tmp_path / "new" / "model.pt"), artifact_path="kb")
    from_run = f"runs:/{run.info.run_id}/kb/model.pt"
    bare = ["transfer", "--family", "x86-sse", "--target-data", files["x86-sse-t2"], "--splits", tmp_path / "splits",
            "--params", tmp_path / "params.yaml", "--out", tmp_path / "bare", "--from", from_run, "--no-track", "--json"]
    res = CliRunner().invoke(main, [str(a) for a in bare])
    assert res.exit_code == 0, res.output
    assert "warning: no --target-valid: the KD guard judges the target on its training programs" in res.stderr
    bare_out = json.loads(res.stdout.strip().splitlines()[-1])
    assert any("no --target-valid" in w for w in bare_out["warnings"]) and bare_out["start"] == from_run


def test_pipeline_ckd_stage_writes_the_family_kb_and_its_plots(tmp_path, store, one_torch_thread):
    from tcl.pipeline import main as pipeline

    names = ["x86-sse-t1", "x86-sse-t2"]
    _write_splits(tmp_path / "splits", names)
    continual = {**PARAMS["continual"], "kd": {"lr": 0.003}}  # KD epochs: train's, set below
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({**PARAMS, "continual": continual,
                                                          "families": {"x86-sse": names}}))
    res = CliRunner().invoke(pipeline, ["ckd", "x86-sse", "--out", str(tmp_path / "kb"), "--loss-plot",
                                        str(tmp_path / "loss.json"), "--valid-plot", str(tmp_path / "valid.json"),
                                        "--params", str(tmp_path / "params.yaml"), "--splits",
                                        str(tmp_path / "splits"), "--epochs", "1"])
    assert res.exit_code == 0, res.output
    kb = load_model(tmp_path / "kb")  # what the evaluate / export / register stages read
    assert kb.config == TINY["kb"] and E.EWCState.from_model(kb).platforms == names
    loss = json.loads((tmp_path / "loss.json").read_text())
    assert [r["epoch"] for r in loss] == [0, 1]  # one KD epoch per platform (--epochs 1 over pipeline.train)
    assert json.loads((tmp_path / "kb" / "mlflow_run.json").read_text())["run_id"] in res.output


def test_pipeline_ckd_stage_learns_later_platforms_from_their_sampled_subsets(tmp_path, store, one_torch_thread):
    """The main job's ckd stage: the first platform from its whole training split, the later one
    from the sample stage's subset (continual.target_ratio), logged as an artifact of the parent
    run; evaluate puts the from-scratch model beside it; a missing subset is a clear error."""
    import mlflow

    from tcl.features import FeatureSet
    from tcl.pipeline import main as pipeline
    from tcl.sampling.subset import sample_features

    names = ["x86-sse-t1", "x86-sse-t2"]
    _write_splits(tmp_path / "splits", names)
    full = FeatureSet.load(tmp_path / "splits" / "x86-sse-t2" / "train.npz")
    subset, _ = sample_features(full, 0.25, "random", {}, seed=3)
    subset_path = tmp_path / "subsets" / "x86-sse-t2" / "random-0.25.npz"
    subset_path.parent.mkdir(parents=True)
    subset.save(subset_path)
    continual = {**PARAMS["continual"], "kd": {"lr": 0.003}, "kd_first": {"lr": 0.02}, "target_ratio": 0.25}
    params = {**PARAMS, "continual": continual, "families": {"x86-sse": names},
              "sample": {"strategy": "random", "ratios": [0.1, 0.25]}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    common = ["--params", str(tmp_path / "params.yaml"), "--splits", str(tmp_path / "splits")]
    args = ["ckd", "x86-sse", "--out", str(tmp_path / "kb"), "--loss-plot", str(tmp_path / "loss.json"),
            "--valid-plot", str(tmp_path / "valid.json"), "--subsets", str(tmp_path / "subsets"), *common,
            "--epochs", "1"]
    res = CliRunner().invoke(pipeline, args)
    assert res.exit_code == 0, res.output

    summary = json.loads((tmp_path / "kb" / "continual.json").read_text())
    md5 = lambda p: hashlib.md5(p.read_bytes(), usedforsecurity=False).hexdigest()  # noqa: E731
    t1, t2 = summary["train_data"]["x86-sse-t1"], summary["train_data"]["x86-sse-t2"]
    assert t1["file"] == str(tmp_path / "splits" / "x86-sse-t1" / "train.npz") and "sample" not in t1
    assert t1["programs"] == len(FeatureSet.load(t1["file"]))
    assert t2["file"] == str(subset_path) and t2["hash"] == md5(subset_path)
    assert t2["programs"] == len(subset) == round(0.25 * len(full))
    assert t2["sample"]["strategy"] == "random" and t2["sample"]["seed"] == 3
    assert "unmeasured_programs" not in t2  # continual.target_pool is off by default
    # the KD phase of the later platform trained on the subset's programs, not the whole split
    client = mlflow.MlflowClient()
    kd_run = client.get_run(summary["per_platform"][1]["runs"]["kd"])
    assert kd_run.data.params["data"] == str(subset_path)
    # KD of the fresh KB (first platform) at kd_first's rate, of the taught KB at kd's
    first_kd = client.get_run(summary["per_platform"][0]["runs"]["kd"])
    assert (first_kd.data.params["train.lr"], kd_run.data.params["train.lr"]) == ("0.02", "0.003")
    # the subset is an artifact of the parent run (the KB's run), byte for byte
    run_id = summary["run_id"]
    assert client.get_run(run_id).data.params["data.x86-sse-t2"] == str(subset_path)
    got = Path(client.download_artifacts(run_id, "subsets/x86-sse-t2/random-0.25.npz", str(tmp_path / "dl")))
    assert md5(got) == md5(subset_path)
    assert [a.path for a in client.list_artifacts(run_id, "subsets")] == ["subsets/x86-sse-t2"]

    # evaluate: the KB's fields as before, the from-scratch model beside it
    scratch = ["train", "x86-sse", "--out", str(tmp_path / "scratch"), "--loss-plot", str(tmp_path / "sl.json"),
               "--valid-plot", str(tmp_path / "sv.json"), "--run-name", "scratch-x86-sse", *common, "--epochs", "1"]
    assert CliRunner().invoke(pipeline, scratch).exit_code == 0
    ev = ["evaluate", "x86-sse", "--model", str(tmp_path / "kb"), "--scratch", str(tmp_path / "scratch"),
          "--out", str(tmp_path / "m.json"), "--plot", str(tmp_path / "topk.json"), *common]
    res = CliRunner().invoke(pipeline, ev)
    assert res.exit_code == 0, res.output
    m = json.loads((tmp_path / "m.json").read_text())
    test_fs = FeatureSet.load(tmp_path / "splits" / "x86-sse-t1" / "test.npz")
    from tcl import metrics as M

    for key, model_dir in (("kb", "kb"), ("scratch", "scratch")):  # an independent evaluation of each
        ref = M.evaluate(load_model(tmp_path / model_dir).predict_features(test_fs), test_fs)["top1"]
        got_top1 = (m if key == "kb" else m["scratch"])["per_platform"]["x86-sse-t1"]["top1"]
        assert got_top1 == pytest.approx(ref)
    assert m["model"] == "ckd" and m["train_data"] == summary["train_data"]
    assert m["ckd_minus_scratch"]["top1"] == pytest.approx(m["top1"] - m["scratch"]["top1"])
    rows = json.loads((tmp_path / "topk.json").read_text())
    assert {r["model"] for r in rows} == {"kb", "scratch"} and len({frozenset(r) for r in rows}) == 1
    scratch_rows = [r for r in rows if r["model"] == "scratch"]
    assert len(scratch_rows) == len(rows) / 2 and all(r["label"].startswith("scratch: ") for r in scratch_rows)

    # continual.target_pool: the later platform's whole training split joins as unmeasured programs
    pooled = {**params, "continual": {**continual, "target_pool": True}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(pooled))
    res = CliRunner().invoke(pipeline, [*args[:2], "--out", str(tmp_path / "kb-pool"), *args[4:]])
    assert res.exit_code == 0, res.output
    pooled_data = json.loads((tmp_path / "kb-pool" / "continual.json").read_text())["train_data"]
    assert pooled_data["x86-sse-t2"]["unmeasured_programs"] == len(full)
    assert pooled_data["x86-sse-t2"]["programs"] == len(subset) and "unmeasured_programs" not in pooled_data["x86-sse-t1"]

    # the ratio must be one the sample stage makes, and the subset must exist
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({**params, "continual": {**continual, "target_ratio": 0.5}}))
    res = CliRunner().invoke(pipeline, args)
    assert res.exit_code != 0 and "target_ratio 0.5 is not one of sample.ratios" in res.output
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({**params, "continual": {**continual, "target_ratio": 0.1}}))
    res = CliRunner().invoke(pipeline, args)
    assert res.exit_code != 0 and "missing subset" in res.output and "random-0.1.npz" in res.output
    # a subset of another platform under the target's name
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    FeatureSet.load(tmp_path / "splits" / "x86-sse-t1" / "train.npz").save(subset_path)
    res = CliRunner().invoke(pipeline, args)
    assert res.exit_code != 0 and "holds programs of platform 'x86-sse-t1', not 'x86-sse-t2'" in res.output


def test_teacher_targets_keep_the_teachers_order_within_each_task_in_0_1():
    from tcl.continual.distill import teacher_targets

    scores = np.array([3.0, 1.0, 2.0, -5.0, 10.0, 0.0])
    task = np.array([0, 0, 0, 1, 1, 1])
    got = teacher_targets(scores, task, sharpness=2.0)
    for t in (0, 1):  # a hand computation: exp(2 * (z - max z)), z standardised within the task
        s = scores[task == t]
        z = (s - s.mean()) / s.std()
        np.testing.assert_allclose(got[task == t], np.exp(2.0 * (z - z.max())), rtol=1e-6)
    assert got.max() == 1.0 and got.min() > 0
    assert teacher_targets(np.array([1.0, 1.0]), np.array([0, 0])).tolist() == [1.0, 1.0]  # a tie: no order


def test_a_source_or_starting_kb_of_another_family_warns_and_says_why():
    from tcl.continual.schedule import family_warnings

    notes = family_warnings("x86-sse", ["znver4-avx512-t1"], ["x86-sse-t1", "x86-avx2-t2", "my-cpu"],
                            start_family="amd-zen4-avx512")
    assert len(notes) == 4
    assert "registered KB of family 'amd-zen4-avx512', not 'x86-sse'" in notes[0]
    assert "learned platform 'znver4-avx512-t1' of family 'amd-zen4-avx512'" in notes[1]
    assert "source 'x86-avx2-t2' belongs to family 'x86-avx2'" in notes[2] and "Table 5" in notes[2]
    assert "'my-cpu' is not in the hardware registry" in notes[3] and "tcl hardware add my-cpu" in notes[3]
    assert family_warnings("x86-sse", ["x86-sse-t1"], ["x86-sse-t2"], target="x86-sse-t2") == []
    (note,) = family_warnings("x86-sse", [], [], target="znver4-avx512-t2")
    assert "the target 'znver4-avx512-t2' belongs to family 'amd-zen4-avx512'" in note
    (note,) = family_warnings("x86-sse", [], [], target="new-box")
    assert "'new-box' is not in the hardware registry" in note and "tcl hardware add new-box --family x86-sse" in note


def test_transfer_refuses_an_unknown_family_and_a_file_that_is_not_features(tmp_path):
    from click.testing import CliRunner

    from tcl.cli import main

    bad = tmp_path / "subset.npz"
    bad.write_bytes(b"not a feature file")
    runner = CliRunner()
    res = runner.invoke(main, ["transfer", "--family", "x86-ss", "--target-data", str(bad), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "unknown family 'x86-ss'" in res.output and "x86-sse" in res.output
    res = runner.invoke(main, ["transfer", "--family", "x86-sse", "--target-data", str(bad), "--from", str(bad),
                               "--out", str(tmp_path / "o"), "--no-track"])
    assert res.exit_code == 1 and f"{bad}: not a TCL checkpoint" in res.output and res.exception is not None
    assert not (tmp_path / "o").exists()
    # --register with nothing held out is refused before any training (it used to fail after it)
    res = runner.invoke(main, ["transfer", "--family", "x86-sse", "--target-data", str(bad), "--from", str(bad),
                               "--out", str(tmp_path / "o"), "--register"])
    assert res.exit_code == 2 and "--register needs held-out metrics" in res.output
    assert not (tmp_path / "o").exists()
