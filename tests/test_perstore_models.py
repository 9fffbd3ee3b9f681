"""The baselines on per-store features: MetaSchedule's XGBModel (xgb-ms) and Tenset's MLP
(mlp-tenset), trained on the real fixture databases' per-store features."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import fixture_path, run_tcl

pytest.importorskip("tvm")


@pytest.fixture(scope="module")
def perstore(tmp_path_factory):
    """(train, test) PerStoreSets of both fixture databases, split by program (every task in both)."""
    from tcl.features import featurize_file
    from tcl.perstore import extract_perstore
    from tcl.records.ingest import ingest

    root = fixture_path("metaschedule")
    tmp = tmp_path_factory.mktemp("perstore-models")
    ingest(root, "znver4-avx512-t2", tmp / "p.parquet")
    fs = featurize_file(tmp / "p.parquet", tmp / "p.npz")
    ps, _ = extract_perstore(fs, tmp / "p.parquet", root, workers=1)
    odd = np.arange(len(ps)) % 2 == 1
    return ps.subset(~odd), ps.subset(odd)


def _pairwise(scores, ps) -> float:
    from tcl import metrics as M

    return M.pairwise_accuracy(scores, ps.latency, ps.task)


def test_ms_xgb_is_metaschedules_pack_sum_model(perstore, tmp_path):
    """A program's score is the sum of the booster's scores of its stores (164 columns), and
    the booster is the one MetaSchedule's XGBModel trains on the same data."""
    from tvm.s_tir.meta_schedule.cost_model.xgb_model import XGBConfig, XGBModel
    import xgboost as xgb

    from tcl.models.ms_xgb import MSXGBCostModel

    train, test = perstore
    model = MSXGBCostModel(n_threads=1)
    rounds = model.fit([train], seed=43)
    assert rounds >= 1
    scores = model.predict(test)
    per_store = model.booster.predict(xgb.DMatrix(test.stores[:, :164]))
    expected = np.array([per_store[a:b].sum() for a, b in zip(test.offsets[:-1], test.offsets[1:])])
    np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-6)

    library = XGBModel(config=XGBConfig(nthread=1))  # XGBConfig's seed default is 43
    library._train(xs=[train.program(i)[:, :164] for i in range(len(train))], ys=train.y.astype(np.float32))
    np.testing.assert_allclose(library._predict(xs=[test.program(i)[:, :164] for i in range(len(test))]),
                               scores, rtol=1e-5, atol=1e-6)
    assert _pairwise(model.predict(train), train) > 0.7  # it learned the training ranking (0.5: chance)

    path = model.save(tmp_path / "model.json")
    back = MSXGBCostModel.load(path, n_threads=1)
    np.testing.assert_array_equal(back.predict(test), scores)
    assert back.info["kind"] == "xgb-ms"


def test_ms_xgb_scores_a_program_without_stores_last(perstore):
    from tcl.models.ms_xgb import MSXGBCostModel

    train, test = perstore
    model = MSXGBCostModel(n_threads=1)
    model.fit([train])
    empty = test.subset(np.arange(3))
    empty.stores = empty.stores[empty.offsets[1]:]
    empty.offsets = empty.offsets - empty.offsets[1]
    empty.offsets[0] = 0  # program 0 now has no stores
    scores = model.predict(empty)
    assert scores[0] == -np.inf and np.isfinite(scores[1:]).all()


def _reference_forward(model, ps) -> np.ndarray:
    """Tenset's SegmentSumMLP written out in float64 numpy from the state_dict."""
    sd = {k: v.double().numpy() for k, v in model.net.state_dict().items()}
    relu = lambda a: np.maximum(a, 0.0)  # noqa: E731
    lin = lambda a, name: a @ sd[f"{name}.weight"].T + sd[f"{name}.bias"]  # noqa: E731
    x = ps.stores[:, :len(model.norm)].astype(np.float64) / model.norm
    h = relu(lin(relu(lin(x, "encoder.0")), "encoder.2"))
    summed = np.stack([h[a:b].sum(axis=0) for a, b in zip(ps.offsets[:-1], ps.offsets[1:])])
    summed = relu(lin(summed, "layer0.0")) + summed
    summed = relu(lin(summed, "layer1.0")) + summed
    return lin(summed, "decoder")[:, 0]


def test_tenset_mlp_trains_predicts_and_round_trips(perstore, tmp_path):
    from tcl.models.tenset_mlp import TensetMLPCostModel

    train, test = perstore
    model = TensetMLPCostModel(config={"epochs": 30, "batch_size": 24, "lr": 0.005}, n_threads=1)
    history = model.fit([train], [test], seed=0)
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    assert "valid_top1" in history[0]
    # the normalisation is Tenset's: column maxima of the training stores (1 where not positive)
    expected_norm = train.stores.max(axis=0)
    np.testing.assert_array_equal(model.norm, np.where(expected_norm > 0, expected_norm, 1.0))
    scores = model.predict(test)
    np.testing.assert_allclose(scores, _reference_forward(model, test), rtol=1e-4, atol=1e-4)
    assert _pairwise(model.predict(train), train) > 0.8

    path = model.save(tmp_path / "model.pt")
    back = TensetMLPCostModel.load(path, n_threads=1)
    np.testing.assert_array_equal(back.predict(test), scores)
    np.testing.assert_array_equal(back.predict(test.subset([5])), scores[[5]])  # one program: no scalar


def test_tenset_mlp_reads_164_columns_without_the_workload_part(perstore):
    from tcl.models.tenset_mlp import TensetMLPCostModel

    train, _ = perstore
    model = TensetMLPCostModel(config={"epochs": 1, "workload_features": False}, n_threads=1)
    model.fit([train])
    assert model.net.encoder[0].in_features == 164 == len(model.norm)


def test_train_and_evaluate_commands_on_perstore_files(perstore, tmp_path, store):
    train, test = perstore
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


def test_a_model_refuses_the_other_kind_of_features(perstore, tmp_path):
    from tcl.training import train_model

    train, _ = perstore
    with pytest.raises(ValueError, match="reads step features"):
        train_model("xgb", train, None, {}, {"threads": 1}, tmp_path)
