"""Cost-model nets: shapes, masking, ONNX export (dynamic batch + length), checkpoints, presets."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch

from tcl.models import model_config
from tcl.models.checkpoint import save_checkpoint
from tcl.models.nets import build_net as build_model
from tcl.models.nets import load_checkpoint
from tcl.models.nets import count_parameters, export_onnx, flops_per_prediction, model_size_mb

F_ = 12
SMALL = {
    "mamba": {"d_model": 16, "n_layers": 2, "d_state": 4, "expand": 2, "d_conv": 4},
    "mlp": {"hidden": 24, "n_layers": 2},
    "tlp": {"d_model": 16, "n_heads": 4, "n_layers": 2},
}
REPO = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("one_torch_thread")



def _inputs(batch, length, seed=0, n_features=F_):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, length, n_features, generator=g)
    lengths = torch.randint(1, length + 1, (batch,), generator=g)
    lengths[0] = length
    mask = torch.arange(length)[None, :] < lengths[:, None]
    return x, mask


def _model(kind, **over):
    torch.manual_seed(0)
    return build_model(kind, F_, **{**SMALL[kind], **over}).eval()


@pytest.mark.parametrize("kind", list(SMALL))
def test_forward_shape_dtype_and_masking(kind):
    model = _model(kind)
    x, mask = _inputs(5, 9)
    with torch.no_grad():
        y = model(x, mask)
        assert y.shape == (5,) and y.dtype == torch.float32 and torch.isfinite(y).all()
        # values at padded positions do not change any score
        x2 = x.clone()
        x2[~mask] = torch.randn(int((~mask).sum()), F_) * 100
        torch.testing.assert_close(model(x2, mask), y, rtol=1e-5, atol=1e-6)
        # extra padding at the end does not either
        xp = torch.cat([x, torch.randn(5, 4, F_)], 1)
        mp = torch.cat([mask, torch.zeros(5, 4, dtype=torch.bool)], 1)
        torch.testing.assert_close(model(xp, mp), y, rtol=1e-5, atol=1e-6)
        # scores of a row do not depend on the other rows of the batch
        torch.testing.assert_close(model(x[2:3], mask[2:3]), y[2:3], rtol=1e-5, atol=1e-6)
        # and the real steps do matter
        x3 = x.clone()
        x3[0, 0] += 1.0
        assert not torch.allclose(model(x3, mask)[0], y[0])


def test_program_without_steps_gives_finite_score():
    x, mask = _inputs(3, 6)
    mask[1] = False
    for kind in SMALL:
        with torch.no_grad():
            assert torch.isfinite(_model(kind)(x, mask)).all(), kind


def test_mamba_length_sorted_cropped_blocks_equal_one_pass():
    """Inference sorts rows by valid length and crops each block: the scores are those of one
    uncropped pass over the padded batch, in input order (holes and empty rows included)."""
    model = _model("mamba", block_rows=4)
    x, mask = _inputs(11, 7, seed=2)
    mask[3] = False
    mask[5, 1] = False
    with torch.no_grad():
        whole = model.head(model._pool(x, mask)).squeeze(-1)
        blocked = model(x, mask)
        model.block_rows = 0
        one_block = model(x, mask)
    torch.testing.assert_close(blocked, whole, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(one_block, whole, rtol=1e-5, atol=1e-6)


def test_mamba_net_scan_methods_agree():
    model = _model("mamba")
    x, mask = _inputs(4, 10, seed=5)
    outs = {}
    with torch.no_grad():
        for m in ("ref", "fused", "fast", "parallel", "unrolled", "loop"):
            model.set_scan_method(m)
            outs[m] = model(x, mask)
    for m in ("fused", "fast", "parallel", "unrolled"):
        torch.testing.assert_close(outs[m], outs["ref"], rtol=1e-5, atol=1e-5)


def _onnx(model, max_len=40, **kw):
    """(exported ModelProto, onnxruntime session) traced at batch 2, length max_len."""
    ort = pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    buf = io.BytesIO()
    export_onnx(model, buf, F_, max_len=max_len, **kw)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(buf.getvalue(), so, providers=["CPUExecutionProvider"])
    return onnx.load_from_string(buf.getvalue()), sess


def _check_onnx(model, sess, cases):
    for seed, (batch, length) in enumerate(cases):
        x, mask = _inputs(batch, length, seed=10 + seed)
        with torch.no_grad():
            ref = model(x, mask).numpy()
        got = sess.run(None, {"x": x.numpy(), "mask": mask.numpy()})[0]
        assert got.shape == (batch,)
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def _count(proto, op):
    return sum(n.op_type == op for n in proto.graph.node)


@pytest.mark.parametrize("kind", list(SMALL))
def test_onnx_export_dynamic_batch_and_length(kind):
    model = _model(kind)
    proto, sess = _onnx(model, max_len=40)
    # traced at (2, 40): other batch sizes and lengths, longer ones too (no length bound: the
    # Mamba scan is an ONNX Scan loop over the input's steps)
    _check_onnx(model, sess, [(1, 40), (7, 31), (3, 3), (16, 17), (2, 90)])
    if kind == "mamba":
        assert _count(proto, "Scan") == SMALL["mamba"]["n_layers"]
        assert all(n.domain in ("", "ai.onnx") for n in proto.graph.node)  # placeholder lowered


def test_mamba_onnx_unrolled_and_doubling_scan_forms():
    """The torch.export fallback forms: unrolled up to the traced length, doubling beyond 128."""
    model = _model("mamba")
    model.set_scan_method("unrolled")
    proto, sess = _onnx(model, max_len=40)
    assert _count(proto, "MatMul") >= 2 * 40  # per step and layer: C_t . h_t
    _check_onnx(model, sess, [(1, 40), (7, 31), (3, 3)])
    model = _model("mamba", max_len=256)
    model.set_scan_method("parallel")
    proto, sess = _onnx(model, max_len=6)
    assert _count(proto, "MatMul") < 20  # no per-step nodes
    _check_onnx(model, sess, [(1, 5), (9, 48), (2, 130), (3, 256)])


def test_checkpoint_round_trip(tmp_path):
    for kind in SMALL:
        model = _model(kind)
        meta = {"n_features": F_, "max_len": 9, "feature_version": "t1", "vocab": {"SP": 1}}
        path = tmp_path / kind / "model.pt"
        save_checkpoint(path, model, kind, SMALL[kind], meta, extra={"epoch": 3, "top1": np.float32(0.5)})
        assert sorted(p.name for p in path.parent.iterdir()) == ["model.pt"]  # no temp files left
        loaded, info = load_checkpoint(path)
        assert type(loaded) is type(model) and not loaded.training
        assert info["kind"] == kind and info["config"] == SMALL[kind] and info["feature_meta"] == meta
        assert info["extra"] == {"epoch": 3, "top1": 0.5} and info["n_features"] == F_
        x, mask = _inputs(4, 9)
        with torch.no_grad():
            torch.testing.assert_close(loaded(x, mask), model(x, mask), rtol=0, atol=0)
        # plain weights-only load works (no pickled objects inside)
        raw = torch.load(path, weights_only=True)
        assert set(raw) == {"format", "format_version", "info_json", "state_dict"}


def test_checkpoint_rejects_non_json_metadata(tmp_path):
    model = _model("mlp")
    with pytest.raises(TypeError):
        save_checkpoint(tmp_path / "m.pt", model, "mlp", SMALL["mlp"], {"n_features": F_}, extra={"f": object()})
    assert not (tmp_path / "m.pt").exists()


def test_presets_sizes_and_flops():
    import yaml

    params = yaml.safe_load((REPO / "params.yaml").read_text())
    kb, ac = model_config("mamba", params), model_config("mamba", params, "ac")
    assert kb == {"d_model": 64, "n_layers": 1, "d_state": 8, "expand": 1, "d_conv": 4}
    assert ac["d_model"] > kb["d_model"]
    with pytest.raises(KeyError):
        model_config("mamba", params, "nope")
    m_kb, m_ac = build_model("mamba", 64, **kb), build_model("mamba", 64, **ac)
    assert model_size_mb(m_kb) == pytest.approx(count_parameters(m_kb) * 4 / 1e6)
    assert 0.05 < model_size_mb(m_kb) < model_size_mb(m_ac)
    f48, f24 = flops_per_prediction(m_kb, 48), flops_per_prediction(m_kb, 24)
    assert f48 > 2 * 2 * count_parameters(m_kb.blocks) * 0.9  # every block weight used per step
    assert 1.9 < f48 / f24 < 2.01  # linear in the length (plus a constant head)
    # Tenset-MLP by hand: encoder F->4->4, masked sum, norm, two residual 4->4, decoder 4->1
    mlp = build_model("mlp", 3, hidden=4, n_layers=2)
    per_step = (2 * 3 * 4 + 4) + (2 * 4 * 4 + 4) + 2 * 4
    head = 4 * 4 + 2 * (2 * 4 * 4 + 4) + 2 * 4 + (2 * 4 * 1 + 1)
    assert flops_per_prediction(mlp, 10) == 10 * per_step + head
    with pytest.raises(ValueError):
        build_model("mamba", 8, d_modle=3)
    with pytest.raises(ValueError):
        build_model("rnn", 8)


@pytest.mark.parametrize("kind", list(SMALL))
def test_models_learn(kind):
    """A few Adam steps fit a length-and-order dependent target better than the start."""
    torch.manual_seed(0)
    model = build_model(kind, F_, **SMALL[kind])
    x, mask = _inputs(64, 8, seed=7)
    target = (x[:, :, 0] * mask).sum(1) * 0.3 + x[:, 0, 1]
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(40):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x, mask), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_bench_predict_rows_and_flops_at_mean_length():
    from tcl.bench.predict import MATMUL, NAIVE, bench_predict, format_table, model_for
    from tcl.config import load_params
    from tcl.models.nets import flops_per_prediction

    params = load_params(REPO / "params.yaml")
    rows = bench_predict(kinds="mamba-kb,mlp", batch_sizes=(8,), seq_len=10, n_features=F_, seconds=0.05,
                         threads=1, params=params)
    by = {r["model"]: r for r in rows}
    assert set(by) == {"mamba-kb", "mlp", NAIVE, MATMUL}
    assert all(r["programs_per_s"] > 0 for r in rows if r["model"] != MATMUL)
    kb = by["mamba-kb"]
    full = flops_per_prediction(model_for("mamba-kb", F_, params)[2], 10)
    # Mamba skips padding: FLOPs at the mean valid length (lengths in [5, 10]); MLP pays for all 10
    assert full / 2 <= kb["flops_per_prediction"] < full
    assert by["mlp"]["flops_per_prediction"] == flops_per_prediction(model_for("mlp", F_, params)[2], 10)
    assert kb["speedup_vs_naive"] > 0 and "mamba-kb" in format_table(rows)
