"""The baselines on per-store features as CostModel kinds: MetaSchedule's XGBModel (xgb-ms) and
Tenset's MLP (mlp-tenset), trained on the real fixture databases' per-store features and checked
against the library trained directly and a float64 forward pass written out."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import fixture_path, run_tcl

pytest.importorskip("tvm")

TRAIN = {"seed": 0, "threads": 1}


@pytest.fixture(scope="module")
def perstore(tmp_path_factory):
    """(train, test) PerStoreSets of both fixture databases, split by program (every task in both)."""
    from tcl.features import featurize_file
    from tcl.perstore_extract import extract_perstore
    from tcl.records.ingest import ingest

    root = fixture_path("metaschedule")
    tmp = tmp_path_factory.mktemp("perstore-models")
    ingest(root, "znver4-avx512-t2", tmp / "p.parquet")
    fs = featurize_file(tmp / "p.parquet", tmp / "p.npz")
    ps, _ = extract_perstore(fs, tmp / "p.parquet", root, workers=1)
    odd = np.arange(len(ps)) % 2 == 1
    return ps.subset(~odd), ps.subset(odd), fs


def _pairwise(scores, ps) -> float:
    from tcl import metrics as M

    return M.pairwise_accuracy(scores, ps.latency, ps.task)


def test_both_kinds_are_in_the_one_registry():
    from tcl.models import KINDS, model_class, parse_model_name

    assert {"xgb-ms", "mlp-tenset"} <= set(KINDS)
    assert model_class("xgb-ms").kind == "xgb-ms" and model_class("mlp-tenset").kind == "mlp-tenset"
    assert parse_model_name("xgb-ms") == ("xgb-ms", None) and parse_model_name("mamba-kb") == ("mamba", "kb")


def test_ms_xgb_is_metaschedules_pack_sum_model(perstore, tmp_path):
    """A program's score is the sum of the booster's scores of its stores (164 columns), and
    the booster is the one MetaSchedule's XGBModel trains on the same data."""
    from tvm.s_tir.meta_schedule.cost_model.xgb_model import XGBConfig, XGBModel
    import xgboost as xgb

    from tcl.models import load_model, new_model

    train, test, _ = perstore
    model = new_model("xgb-ms", 172)
    history = model.fit([train], [test], {"seed": 43, "threads": 1}, tmp_path / "fit")
    assert history[-1]["epoch"] >= 1 and "valid_top1" in history[-1]
    scores = model.predict_features(test)
    per_store = model.booster.predict(xgb.DMatrix(test.stores[:, :164]))
    expected = np.array([per_store[a:b].sum() for a, b in zip(test.offsets[:-1], test.offsets[1:])])
    np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-6)

    library = XGBModel(config=XGBConfig(nthread=1))  # XGBConfig's seed default is 43
    library._train(xs=[train.program(i)[:, :164] for i in range(len(train))], ys=train.y.astype(np.float32))
    np.testing.assert_allclose(library._predict(xs=[test.program(i)[:, :164] for i in range(len(test))]),
                               scores, rtol=1e-5, atol=1e-6)
    assert _pairwise(model.predict_features(train), train) > 0.7  # it learned the training ranking (0.5: chance)

    # embed: the pack of store rows the scores add over, summed per program
    z = model.embed_features(test, batch_size=5)
    np.testing.assert_allclose(z, np.stack([test.program(i)[:, :164].sum(axis=0) for i in range(len(test))]),
                               rtol=1e-6)

    back = load_model(tmp_path / "fit")  # the model.json fit wrote
    assert type(back) is type(model) and back.kind == "xgb-ms" and back.config == model.config
    np.testing.assert_array_equal(back.predict_features(test, batch_size=7), scores)


def test_ms_xgb_scores_a_program_without_stores_last(perstore, tmp_path):
    from tcl.models import new_model

    train, test, _ = perstore
    model = new_model("xgb-ms", 172)
    model.fit([train], [], TRAIN, tmp_path)
    empty = test.subset(np.arange(3))
    empty.stores = empty.stores[empty.offsets[1]:]
    empty.offsets = empty.offsets - empty.offsets[1]
    empty.offsets[0] = 0  # program 0 now has no stores
    scores = model.predict_features(empty)
    assert scores[0] == -np.inf and np.isfinite(scores[1:]).all()


def _reference(model, ps) -> tuple[np.ndarray, np.ndarray]:
    """Tenset's SegmentSumMLP written out in float64 numpy from the state_dict: (pooled, scores)."""
    sd = {k: v.double().numpy() for k, v in model.net.state_dict().items()}
    relu = lambda a: np.maximum(a, 0.0)  # noqa: E731
    lin = lambda a, name: a @ sd[f"mlp.{name}.weight"].T + sd[f"mlp.{name}.bias"]  # noqa: E731
    x = ps.stores[:, :len(sd["norm"])].astype(np.float64) / sd["norm"]
    h = relu(lin(relu(lin(x, "encoder.0")), "encoder.2"))
    pooled = np.stack([h[a:b].sum(axis=0) for a, b in zip(ps.offsets[:-1], ps.offsets[1:])])
    out = relu(lin(pooled, "layer0.0")) + pooled
    out = relu(lin(out, "layer1.0")) + out
    return pooled, lin(out, "decoder")[:, 0]


def test_tenset_mlp_trains_predicts_and_round_trips(perstore, tmp_path):
    from tcl.models import load_model, new_model

    train, test, _ = perstore
    model = new_model("mlp-tenset", 172, {"epochs": 30, "batch_size": 24, "lr": 0.005})
    history = model.fit([train], [test], TRAIN, tmp_path / "fit")
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    assert "valid_top1" in history[0]
    # the normalisation is Tenset's: column maxima of the training stores (1 where not positive)
    expected_norm = train.stores.max(axis=0)
    np.testing.assert_array_equal(model.net.norm.numpy(), np.where(expected_norm > 0, expected_norm, 1.0))
    scores = model.predict_features(test)
    pooled, reference = _reference(model, test)
    np.testing.assert_allclose(scores, reference, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(model.embed_features(test, batch_size=5), pooled, rtol=1e-4, atol=1e-3)
    assert _pairwise(model.predict_features(train), train) > 0.8

    back = load_model(tmp_path / "fit")  # the model.pt fit wrote
    assert type(back) is type(model) and back.config == model.config
    np.testing.assert_array_equal(back.predict_features(test), scores)
    one = back.predict_features(test.subset([5]))  # one program: an array of one, not a scalar
    assert one.shape == (1,)
    # the same score up to rounding: BLAS may take another kernel for one row (bit-equal on the
    # AMD host, 2e-7 apart on an Intel AVX-512 one)
    np.testing.assert_allclose(one, scores[[5]], rtol=1e-5)


def test_tenset_mlp_reads_164_columns_without_the_workload_part(perstore, tmp_path):
    from tcl.models import new_model

    train, _, _ = perstore
    model = new_model("mlp-tenset", 172, {"epochs": 1, "workload_features": False})
    model.fit([train], [], TRAIN, tmp_path)
    assert model.net.mlp.encoder[0].in_features == 164 == len(model.net.norm)


def test_a_kind_refuses_the_other_kind_of_features(perstore):
    from tcl.features import FeatureKindError
    from tcl.models import model_class

    train, _, fs = perstore
    with pytest.raises(FeatureKindError, match="'xgb' reads step-sequence features"):
        model_class("xgb").inputs(train)
    with pytest.raises(FeatureKindError, match="'mlp-tenset' reads MetaSchedule's per-store features"):
        model_class("mlp-tenset").inputs(fs)


def test_train_and_evaluate_commands_on_perstore_files(perstore, tmp_path, store):
    train, test, fs = perstore
    train.save(tmp_path / "train.perstore.npz")
    test.save(tmp_path / "test.perstore.npz")
    for kind, overrides in (("xgb-ms", []), ("mlp-tenset", ["--set", "epochs=3"])):
        out = tmp_path / kind
        run_tcl("train", "--model", kind, "--data", tmp_path / "train.perstore.npz", "--valid",
                tmp_path / "test.perstore.npz", "--train-set", "threads=1", *overrides, "--out", out, "--no-progress")
        result = run_tcl("evaluate", "--model", out, "--data", tmp_path / "test.perstore.npz", "--json")
        metrics = json.loads(result.stdout.strip().splitlines()[-1])
        assert metrics["kind"] == kind and metrics["n_programs"] == len(test)
        assert 0.0 < metrics["top1"] <= 1.0
    # the other kind of features, or a warm start of a kind that retrains from scratch: clean errors
    fs.save(tmp_path / "steps.npz")
    refused = [
        (("evaluate", "--model", tmp_path / "xgb-ms", "--data", tmp_path / "steps.npz"), "steps.npz: model kind 'xgb-ms' reads"),
        (("train", "--model", "xgb", "--data", tmp_path / "train.perstore.npz", "--out", tmp_path / "x"),
         "train.perstore.npz: model kind 'xgb' reads step-sequence"),
        (("train", "--model", "xgb-ms", "--data", tmp_path / "train.perstore.npz", "--init", tmp_path / "xgb-ms",
          "--out", tmp_path / "y"), "retrain from scratch"),
    ]
    for args, message in refused:
        proc = run_tcl(*args, check=False)
        assert proc.returncode != 0 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
