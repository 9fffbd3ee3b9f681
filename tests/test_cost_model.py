"""The CostModel interface (tcl.models.base) of every kind, and the training loop's hooks:
warm start, frozen parameters, extra loss terms."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.test_training import F, L, make_fs

CONFIGS = {
    "mamba": {"d_model": 8, "n_layers": 1, "d_state": 4, "expand": 1, "d_conv": 2},
    "mlp": {"hidden": 16, "n_layers": 2},
    "tlp": {"d_model": 8, "n_heads": 2, "n_layers": 1, "max_len": 16},
    "xgb": {"n_estimators": 6, "max_depth": 3},
}
EMBED_DIM = {"mamba": 8, "mlp": 16, "tlp": 8, "xgb": 2 * F + 1}
TRAIN = {"seed": 1, "loss": "lambdarank", "lr": 3e-3, "warmup_epochs": 0, "schedule": "cosine",
         "batch_size": 64, "epochs": 2, "patience": 5, "threads": 1}


def new(kind, config=None, seed=0, meta=None):
    from tcl.models import new_model

    torch.manual_seed(seed)
    return new_model(kind, F, config or CONFIGS[kind], meta or make_fs(seed=0).meta)


def state(model) -> dict:
    return {k: v.detach().clone() for k, v in model.net.state_dict().items()}


def test_every_kind_is_registered_and_unknown_kinds_are_refused():
    from tcl.models import KINDS, model_class, model_config

    assert set(KINDS) == {"mamba", "mlp", "tlp", "xgb", "xgb-ms", "mlp-tenset", "mtl"}
    assert all(model_class(k).kind == k for k in KINDS)
    with pytest.raises(ValueError, match="unknown model kind 'rnn'"):
        model_class("rnn")
    params = {"models": {"mamba": {"kb": {"d_model": 4}}, "mlp": {"hidden": 8}}}
    assert model_config("mamba", params) == {"d_model": 4}  # Mamba's default preset: kb
    assert model_config("mlp", params) == {"hidden": 8}
    with pytest.raises(KeyError, match="no mamba preset 'ac'.*presets: kb"):
        model_config("mamba", params, "ac")


@pytest.mark.parametrize("kind", ["mamba", "mlp", "tlp", "xgb"])
def test_embed_shape_and_save_load_round_trip(kind, tmp_path):
    from tcl.models import load_model

    train, valid = make_fs(seed=0), make_fs(seed=1, n_tasks=4)
    model = new(kind)
    if kind == "xgb":  # trees exist only after a fit
        model.fit([train], [], TRAIN, tmp_path / "fit")
    x, mask = valid.x[:10], valid.mask[:10]
    z = model.embed(x, mask)
    assert z.shape == (10, EMBED_DIM[kind]) and z.dtype == np.float32 and np.isfinite(z).all()
    np.testing.assert_allclose(model.embed_features(valid, batch_size=7)[:10], z, rtol=1e-5, atol=1e-6)
    if kind != "xgb":  # the score is the head's reading of the embedding
        head = model.net.decoder if kind == "mlp" else model.net.head
        with torch.no_grad():
            from_embedding = head(torch.from_numpy(z)).squeeze(-1).double().numpy()
        np.testing.assert_allclose(model.predict(x, mask), from_embedding, rtol=1e-5, atol=1e-6)

    path = model.save(tmp_path / f"model{model.file_suffix}", extra={"note": "round trip"})
    loaded = load_model(path)
    assert type(loaded) is type(model) and loaded.kind == kind
    assert loaded.config == model.config and loaded.feature_meta == model.feature_meta
    assert loaded.extra["note"] == "round trip" and loaded.n_features == F
    np.testing.assert_array_equal(loaded.predict_features(valid), model.predict_features(valid))
    np.testing.assert_array_equal(loaded.embed(x, mask), z)


def test_mc_dropout_samples_differ_and_plain_predictions_do_not():
    model = new("mlp", {"hidden": 16, "n_layers": 2, "dropout": 0.5})
    fs = make_fs(seed=2, n_tasks=2)
    model.net.train()  # whatever mode the net was in comes back
    plain = [model.predict(fs.x, fs.mask) for _ in range(2)]
    mc = [model.predict(fs.x, fs.mask, dropout=True) for _ in range(2)]
    np.testing.assert_array_equal(plain[0], plain[1])
    assert not np.array_equal(mc[0], mc[1]) and not np.array_equal(mc[0], plain[0])
    assert model.net.training


@pytest.mark.parametrize("kind", ["mamba", "mlp"])
def test_warm_start_reproduces_the_given_weights_before_training(kind, tmp_path):
    from tcl import metrics as M
    from tcl.models import load_model
    from tcl.training import train_model

    train, valid = make_fs(seed=0), make_fs(seed=1, n_tasks=6)
    teacher, _ = train_model(new(kind), train, valid, TRAIN, tmp_path / "a")
    expected = teacher.predict_features(valid)
    warm = load_model(tmp_path / "a")
    np.testing.assert_array_equal(warm.predict_features(valid), expected)
    # lr 0: the training loop runs (batches, optimizer, validation) but moves no weight, so what
    # it validates and keeps is exactly the given model
    _, history = train_model(warm, train, valid, {**TRAIN, "lr": 0.0, "epochs": 1}, tmp_path / "b")
    assert history[0]["valid_top1"] == pytest.approx(M.evaluate(expected, valid)["top1"])
    np.testing.assert_array_equal(warm.predict_features(valid), expected)
    np.testing.assert_array_equal(load_model(tmp_path / "b").predict_features(valid), expected)
    # a fresh model of the same seed scores differently: the warm start is what carried the weights
    assert not np.allclose(new(kind).predict_features(valid), expected)


def test_xgb_warm_start_adds_rounds_to_the_loaded_trees(tmp_path):
    from tcl.models import load_model

    train, valid = make_fs(seed=0), make_fs(seed=1, n_tasks=4)
    first = new("xgb")
    first.fit([train], [], TRAIN, tmp_path / "a")
    warm = load_model(tmp_path / "a")
    np.testing.assert_array_equal(warm.predict_features(valid), first.predict_features(valid))
    warm.config["n_estimators"] = 3
    warm.fit([train], [], TRAIN, tmp_path / "b")
    assert warm.booster.num_boosted_rounds() == CONFIGS["xgb"]["n_estimators"] + 3


def test_frozen_parameters_stay_bit_identical(tmp_path):
    from tcl.training import train_model

    model = new("mamba")
    before = state(model)
    frozen = ("embed.", "blocks.0.in_proj.")
    train_model(model, make_fs(seed=0), make_fs(seed=1, n_tasks=4), TRAIN, tmp_path,
                trainable=lambda name, p: not name.startswith(frozen))
    after = state(model)
    for name in before:
        same = torch.equal(before[name], after[name])
        assert same == name.startswith(frozen), name  # frozen: identical; trained: moved
    assert all(p.requires_grad for p in model.net.parameters())  # the filter is not left behind


def test_an_extra_loss_term_is_reported_and_changes_the_gradient(tmp_path):
    from tcl.training import train_model

    train = make_fs(seed=0)
    base, hist_base = train_model(new("mlp"), train, None, TRAIN, tmp_path / "base")

    # a constant term: reported exactly, and no gradient, so the weights are those of `base`
    const, hist_const = train_model(new("mlp"), train, None, TRAIN, tmp_path / "const",
                                    extra_losses={"const": lambda batch, scores, model: scores.new_tensor(1.5)})
    for h, hb in zip(hist_const, hist_base):
        assert h["loss_const"] == pytest.approx(1.5)
        assert h["loss_task"] == pytest.approx(hb["train_loss"], rel=1e-6)
        assert h["train_loss"] == pytest.approx(h["loss_task"] + 1.5, rel=1e-6)
    for k, v in state(base).items():
        assert torch.equal(v, state(const)[k]), k

    # a penalty on the scores (a stand-in for a teacher's distillation term): its value, computed
    # here in float64 from the batch the loop hands over, is what gets reported, and it moves the weights
    seen = []

    def penalty(batch, scores, model):
        assert batch.x.shape[0] == batch.y.shape[0] == len(batch.rows) and batch.platform == 0
        value = 0.1 * scores.pow(2).mean()
        seen.append((float(0.1 * (scores.detach().double() ** 2).mean()), len(batch.rows)))
        return value

    pen, hist_pen = train_model(new("mlp"), train, None, {**TRAIN, "epochs": 1}, tmp_path / "pen",
                                extra_losses={"scores_l2": penalty})
    weighted = sum(v * n for v, n in seen) / sum(n for _, n in seen)
    assert hist_pen[0]["loss_scores_l2"] == pytest.approx(weighted, rel=1e-5)
    assert any(not torch.equal(v, state(pen)[k]) for k, v in state(base).items())


def test_resume_refuses_a_different_start(tmp_path):
    """A warm start from other weights is another job: its output dir does not resume."""
    from tcl.training import train_model

    train = make_fs(seed=0)
    train_model(new("mlp", seed=0), train, None, TRAIN, tmp_path)
    with pytest.raises(RuntimeError, match="different training job"):
        train_model(new("mlp", seed=5), train, None, TRAIN, tmp_path)


def test_a_kind_reading_other_arrays_trains_and_predicts_through_the_interface(tmp_path):
    """A kind over other FeatureSet arrays needs only `inputs` (here: the features reversed in
    time, standing in for e.g. per-store rows); training and evaluation follow it."""
    from tcl.models.nets import MLPModel
    from tcl.training import train_model

    class ReversedMLP(MLPModel):
        kind = "mlp-reversed"

        @classmethod
        def inputs(cls, fs):
            return fs.x[:, ::-1], fs.mask[:, ::-1]

    torch.manual_seed(0)
    model = ReversedMLP(F, {"hidden": 16, "n_layers": 2}, make_fs(seed=0).meta)
    valid = make_fs(seed=1, n_tasks=4)
    _, history = train_model(model, make_fs(seed=0), valid, TRAIN, tmp_path)
    assert history[-1]["valid_pairwise"] > 0.5
    np.testing.assert_array_equal(model.predict_features(valid),
                                  model.predict(valid.x[:, ::-1], valid.mask[:, ::-1]))
    assert L == valid.x.shape[1]


class _Exploit:
    """A pickle that would run code when unpickled (it must never be)."""

    def __reduce__(self):
        return (exec, ("import pathlib; pathlib.Path('PWNED').write_text('x')",))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_a_checkpoint_of_pickled_code_or_an_onnx_export_is_refused_by_name(tmp_path, monkeypatch):
    import pickle

    from tcl.models import load_model

    monkeypatch.chdir(tmp_path)
    evil = tmp_path / "model.pt"
    torch.save({"format": "tcl-checkpoint", "payload": _Exploit()}, evil)
    with pytest.raises(ValueError, match=r"model\.pt: not a readable tcl-checkpoint file .*never loaded"):
        load_model(evil)
    plain = tmp_path / "plain.pt"
    plain.write_bytes(pickle.dumps(_Exploit()))
    with pytest.raises(ValueError, match="plain.pt: not a readable tcl-checkpoint file"):
        load_model(plain)
    assert not (tmp_path / "PWNED").exists()
    onnx = tmp_path / "kb.onnx"
    onnx.write_bytes(b"\x08\x07\x12\x07pytorch")   # the first bytes of an ONNX ModelProto
    with pytest.raises(ValueError, match=r"kb\.onnx: an ONNX export is what serving .* needs the model's tcl-checkpoint"):
        load_model(onnx)
