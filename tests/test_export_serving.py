"""ONNX export (metadata, dynamic axes, parity with PyTorch) and onnxruntime serving."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tcl import registry, tracking
from tcl.export import export_onnx, read_metadata
from tcl.bench.serving import bench_serving
from tcl.serving import ModelMismatchError, load_predictor

F, L = 14, 16
CONFIG = {"d_model": 16, "n_layers": 1, "d_state": 4, "expand": 1, "d_conv": 4}
VOCAB = {"kinds": ["SP", "RE", "AN", "PR"], "strings": ["global", "local"]}
N_KINDS = 4


def feature_meta(version="test-fv1", n_features=F, max_len=L):
    return {"feature_version": version, "max_len": max_len, "n_features": n_features,
            "vocab": VOCAB}


def real_shaped(n, length=L, seed=0):
    """Step-sequence-like features: one-hot kind, log-scaled factors, padding after the steps."""
    rng = np.random.default_rng(seed)
    x = np.zeros((n, length, F), dtype=np.float32)
    steps = rng.integers(3, length + 1, size=n)
    mask = np.arange(length)[None, :] < steps[:, None]
    kinds = rng.integers(0, N_KINDS, size=(n, length))
    x[np.arange(n)[:, None], np.arange(length)[None, :], kinds] = 1.0
    x[:, :, N_KINDS:] = np.log2(1 + rng.integers(1, 512, size=(n, length, F - N_KINDS)))
    x[~mask] = 0.0
    return x, mask


def torch_scores(model, x, mask):
    import torch

    with torch.no_grad():
        return model(torch.from_numpy(x), torch.from_numpy(mask)).numpy()


@pytest.fixture(scope="module")
def kb(tmp_path_factory):
    import torch

    from tcl.models.checkpoint import save_checkpoint
    from tcl.models.nets import build_net, load_checkpoint

    d = tmp_path_factory.mktemp("kb")
    torch.manual_seed(0)
    model = build_net("mamba", F, **CONFIG)
    save_checkpoint(d / "kb.pt", model, "mamba", CONFIG, feature_meta())
    out = export_onnx(d / "kb.pt", d / "kb.onnx", "amd-zen4-avx512", source_run="run123")
    model, _ = load_checkpoint(d / "kb.pt")
    return d / "kb.pt", out, model.eval()




def test_export_metadata_and_dynamic_axes(kb):
    import onnx

    ckpt, path, _ = kb
    meta = read_metadata(path)
    assert meta["family"] == "amd-zen4-avx512"
    assert meta["feature_version"] == "test-fv1"
    assert (meta["max_len"], meta["n_features"]) == (L, F)
    assert meta["kind"] == "mamba" and meta["config"] == CONFIG
    assert meta["source_run"] == "run123"
    from tcl.features import vocabulary_hash

    assert meta["vocab_hash"] == vocabulary_hash(VOCAB)  # the featurizer's own hash
    assert meta["checkpoint_sha256"] == registry.file_sha256(ckpt)
    proto = onnx.load(str(path))
    assert proto.opset_import[0].version == 17 or any(
        o.version == 17 for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    dims = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]
            for i in proto.graph.input}
    assert isinstance(dims["x"][0], str) and isinstance(dims["x"][1], str) and dims["x"][2] == F
    assert isinstance(dims["mask"][0], str) and isinstance(dims["mask"][1], str)
    leftovers = [p for p in path.parent.iterdir() if p.name.startswith(".kb.onnx")]
    assert leftovers == []  # atomic write left no temp file


@pytest.mark.parametrize("fused", [True, False], ids=["tcl-ops", "standard-ops"])
def test_onnx_matches_pytorch(kb, fused):
    """Both serving graphs (TCL's fused operators, the exported standard-op Scan loop) agree with
    PyTorch on every batch shape, chunking, block size and session layout."""
    _, path, model = kb
    pred = load_predictor(path, fused=fused)
    assert pred.fused == (2 * CONFIG["n_layers"] if fused else 0)  # conv + scan per block
    for n, length, seed in ((256, L, 1), (3, L, 2), (5, L // 2, 3), (1, L, 4)):
        x, mask = real_shaped(n, length, seed)
        got, ref = pred.predict(x, mask), torch_scores(model, x, mask)
        assert got.shape == (n,) and got.dtype == np.float32
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5)
    # chunks, blocks, parallel sessions and modes change nothing; empty input, empty output
    x, mask = real_shaped(1000, seed=5)
    ref = torch_scores(model, x, mask)
    base = pred.predict(x, mask)
    np.testing.assert_allclose(base, ref, rtol=0, atol=1e-5)
    np.testing.assert_allclose(pred.predict(x, mask, chunk=7), base, rtol=0, atol=1e-6)
    np.testing.assert_allclose(pred.predict(x, mask, chunk=300, block=64), base, rtol=0, atol=1e-6)
    for mode, threads in (("blocks", 3), ("intra", 2), ("blocks", 1)):
        p = load_predictor(path, threads=threads, mode=mode, block=50, fused=fused)
        np.testing.assert_allclose(p.predict(x, mask), base, rtol=0, atol=1e-6)
        p.close()
    assert pred.predict(x[:0], mask[:0]).shape == (0,)


def test_fused_serving_needs_the_library(kb, monkeypatch):
    import tcl.models.mamba_onnx as mamba_onnx

    monkeypatch.setattr(mamba_onnx, "fused_library", lambda: None)
    from tcl.registry import TclRegistryError

    with pytest.raises(TclRegistryError, match="operator library is not built"):
        load_predictor(kb[1], fused=True)
    pred = load_predictor(kb[1])  # default: falls back to the exported graph
    assert pred.fused == 0
    x, mask = real_shaped(20, seed=9)
    np.testing.assert_allclose(pred.predict(x, mask), torch_scores(kb[2], x, mask), rtol=0, atol=1e-5)


def test_scan_exports_as_an_onnx_loop_over_the_input_length(kb):
    """The Mamba scan is one standard ONNX Scan node (no custom op left), and the graph runs any
    length up to max_len without padding: cropped inputs agree with PyTorch."""
    import onnx
    import onnxruntime as ort

    _, path, model = kb
    proto = onnx.load(str(path))
    assert [n.op_type for n in proto.graph.node].count("Scan") == CONFIG["n_layers"]
    assert all(n.domain in ("", "ai.onnx") for n in proto.graph.node)
    assert all(o.domain in ("", "ai.onnx") for o in proto.opset_import)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for length in (1, 2, 5, L):
        x, mask = real_shaped(6, L, seed=length)
        x, mask = np.ascontiguousarray(x[:, :length]), np.ascontiguousarray(mask[:, :length])
        got = sess.run(None, {"x": x, "mask": mask})[0]
        np.testing.assert_allclose(got, torch_scores(model, x, mask), rtol=0, atol=1e-5)


def test_valid_lengths_and_length_sorted_blocks(kb):
    from tcl.serving import valid_lengths

    mask = np.array([[1, 1, 0, 0], [0, 0, 0, 0], [1, 0, 1, 0], [1, 1, 1, 1]], dtype=bool)
    assert valid_lengths(mask).tolist() == [2, 0, 3, 4]
    # rows of every length (holes and empty rows too), shuffled: blocks are cropped per length,
    # and scores come back in input order
    _, path, model = kb
    x, mask = real_shaped(300, seed=11)
    mask[::17] = False
    mask[5::23, 1] = False
    x[~mask] = 0.0
    got = load_predictor(path, block=32).predict(x, mask)
    np.testing.assert_allclose(got, torch_scores(model, x, mask), rtol=0, atol=1e-5)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="binding threads needs Linux and two CPUs")
def test_worker_pool_binds_each_thread_to_its_own_cpu(monkeypatch):
    import threading

    from tcl.runtime import BIND_ENV, bound_cpus, worker_pool

    allowed = os.sched_getaffinity(0)

    def affinities(pool, n):
        barrier = threading.Barrier(n)  # every task holds its thread until all n have started

        def where():
            barrier.wait(timeout=30)
            return frozenset(os.sched_getaffinity(0))

        try:
            return [f.result() for f in [pool.submit(where) for _ in range(n)]]
        finally:
            pool.shutdown(wait=True)

    got = affinities(worker_pool(2, "test-bound"), 2)
    assert all(len(a) == 1 for a in got) and len(set(got)) == 2
    assert set().union(*got) <= allowed
    assert os.sched_getaffinity(0) == allowed  # the caller is left alone
    assert bound_cpus(1) is None and bound_cpus(len(allowed) + 1) is None
    monkeypatch.setenv(BIND_ENV, "0")
    assert bound_cpus(2) is None
    assert affinities(worker_pool(2, "test-free"), 2) == [frozenset(allowed)] * 2


def test_softplus_rewrite_is_exact():
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from tcl.export import rewrite_softplus

    g = helper.make_graph([helper.make_node("Softplus", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    assert rewrite_softplus(m) == 1
    assert "Softplus" not in {n.op_type for n in m.graph.node}
    x = np.concatenate([np.linspace(-100, 100, 200001), [-np.inf, np.inf, 0.0, 1e-30, -1e-30]])
    x = x.astype(np.float32)
    y = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    ref = np.logaddexp(0.0, x.astype(np.float64))
    normal = np.isfinite(ref) & (ref >= np.finfo(np.float32).tiny)  # float32 normal range
    assert np.max(np.abs(y[normal] - ref[normal]) / ref[normal]) < 1e-6
    assert np.max(np.abs(y[~normal & np.isfinite(ref)] - ref[~normal & np.isfinite(ref)])) < 1e-37
    assert y[-5] == 0.0 and y[-4] == np.inf


@pytest.mark.parametrize("kind", ["mamba", "mlp"])
def test_reexport_writes_each_update_s_weights_into_one_traced_graph(kind):
    """Reexporter (the fine-tuning tuner's export after every update): after the weights change,
    its bytes are the full export's byte for byte (a trained net), and an untrained net (equal
    initializers the exporter merges) gets a graph whose scores follow its weights."""
    import torch

    from tcl.export import Reexporter, export_bytes
    from tcl.models import new_model
    from tcl.serving import Predictor

    torch.manual_seed(0)
    model = new_model(kind, F, CONFIG if kind == "mamba" else {"hidden": 16, "n_layers": 2}, feature_meta())
    untrained = Reexporter(model, "fam")
    assert untrained.swaps
    x, mask = real_shaped(9, seed=3)
    for trained in (False, True):
        reexport = Reexporter(model, "fam") if trained else untrained
        with torch.no_grad():
            for q in model.net.parameters():
                q.add_(0.05 * torch.randn_like(q))
        data = reexport()
        np.testing.assert_allclose(Predictor(data, source="reexport").predict(x, mask), model.predict(x, mask),
                                   rtol=1e-4, atol=1e-5)
        if trained:  # every weight distinct: nothing merged, the traced graph is the export's
            assert reexport.exact
            assert data == export_bytes(model, "fam", None, reexport.opset)


def test_export_failure_leaves_target_untouched(tmp_path):
    out = tmp_path / "kb.onnx"
    out.write_bytes(b"previous export")
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(Exception):
        export_onnx(bad, out, "fam")
    assert out.read_bytes() == b"previous export"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.pt", "kb.onnx"]


def test_predict_refuses_wrong_shapes(kb):
    pred = load_predictor(kb[1])
    x, mask = real_shaped(4)
    with pytest.raises(ModelMismatchError, match=f"\\(N, L, {F}\\)"):
        pred.predict(x[:, :, :-1], mask)
    with pytest.raises(ModelMismatchError, match="mask"):
        pred.predict(x, mask[:, :-1])
    bad = x.copy()
    bad[2, 0, 5] = np.nan
    with pytest.raises(ModelMismatchError, match=r"non-finite feature values in 1 programs "
                                                  r"\(first row 2, feature columns \[5\]\)"):
        pred.predict(bad, mask)
    with pytest.raises(ModelMismatchError, match="exceed"):
        pred.predict(np.concatenate([x, x], 1), np.concatenate([mask, mask], 1))


def _platforms_by_family():
    from tcl.hardware import platforms

    out = {}
    for name, p in platforms().items():
        out.setdefault(p.family, name)
    return out


def test_feature_checks_refuse_mismatches(kb):
    pred = load_predictor(kb[1])
    own = _platforms_by_family()["amd-zen4-avx512"]
    other = next(p for f, p in _platforms_by_family().items() if f != "amd-zen4-avx512")
    pred.check_features(feature_meta(), own)  # matches: no error
    with pytest.raises(ModelMismatchError, match="feature version mismatch.*'test-fv2'"):
        pred.check_features(feature_meta(version="test-fv2"), own)
    with pytest.raises(ModelMismatchError, match="n_features mismatch"):
        pred.check_features(feature_meta(n_features=F + 1), own)
    with pytest.raises(ModelMismatchError, match="max_len mismatch"):
        pred.check_features(feature_meta(max_len=L * 2), own)
    with pytest.raises(ModelMismatchError, match="vocabulary"):
        pred.check_features({**feature_meta(), "vocab": {"kinds": ["SP"]}}, own)
    with pytest.raises(ModelMismatchError, match="family mismatch"):
        pred.check_features(feature_meta(), other)
    with pytest.raises(ModelMismatchError, match="unknown platform|cannot tell"):
        pred.check_features(feature_meta(), "no-such-platform")
    pred.check_features(feature_meta(), "no-such-platform", family="amd-zen4-avx512")


def featureset(platform, version="test-fv1", n=40, seed=7):
    from tcl.features import FeatureSet

    x, mask = real_shaped(n, seed=seed)
    return FeatureSet(
        x=x, mask=mask, y=np.ones(n, np.float32), latency=np.ones(n),
        task=np.repeat(np.arange(4, dtype=np.int32), n // 4),
        program_id=np.array([f"p{i}" for i in range(n)]),
        tasks=[f"t{i}" for i in range(4)], task_desc=[f"t{i}" for i in range(4)],
        task_weight=np.ones(4), task_networks=[["net"]] * 4, platform=platform,
        meta=feature_meta(version))


def test_predict_features_on_a_featureset(kb):
    _, path, model = kb
    pred = load_predictor(path)
    x, mask = real_shaped(40, seed=7)
    own = _platforms_by_family()["amd-zen4-avx512"]
    other = next(p for f, p in _platforms_by_family().items() if f != "amd-zen4-avx512")
    fs_for = featureset

    np.testing.assert_allclose(pred.predict_features(fs_for(own)), torch_scores(model, x, mask),
                               atol=1e-5, rtol=0)
    with pytest.raises(ModelMismatchError, match="feature version"):
        pred.predict_features(fs_for(own, "test-fv0"))
    with pytest.raises(ModelMismatchError, match="family mismatch"):
        pred.predict_features(fs_for(other))


def test_serving_from_registry_alias(store, kb, tmp_path):
    ckpt, path, model = kb
    with tracking.start_run("tcl-test") as run:
        run_id = run.info.run_id
    v = registry.register_kb(ckpt, "amd-zen4-avx512", ["znver4-avx512-t2"], run_id,
                             {"top1": 0.9, "top5": 1.0}, "E", "D", onnx_path=path)
    with pytest.raises(registry.TclRegistryError, match="no alias 'production'"):
        load_predictor("models:/tcl-kb-amd-zen4-avx512@production")
    registry.promote("amd-zen4-avx512", v)
    pred = load_predictor("models:/tcl-kb-amd-zen4-avx512@production",
                          expected_family="amd-zen4-avx512")
    assert pred.version == v and pred.family == "amd-zen4-avx512"
    x, mask = real_shaped(64, seed=9)
    np.testing.assert_allclose(pred.predict(x, mask), torch_scores(model, x, mask),
                               atol=1e-5, rtol=0)
    assert load_predictor(f"models:/tcl-kb-amd-zen4-avx512/{v}").version == v
    with pytest.raises(ModelMismatchError, match="family mismatch"):
        load_predictor("models:/tcl-kb-amd-zen4-avx512@production", expected_family="x86-sse")
    with pytest.raises(registry.TclRegistryError, match="unknown family"):
        load_predictor("models:/tcl-kb-x86-sse@production")
    with pytest.raises(registry.TclRegistryError, match="not a TCL KB model"):
        load_predictor("models:/other-model@production")


def test_registry_entry_whose_onnx_names_another_family_is_refused(store, tmp_path):
    """An ONNX exported for one family, registered by hand under another name, is refused."""
    import mlflow
    import onnx
    import torch

    from tcl.export import export_model
    from tcl.models import new_model

    torch.manual_seed(3)
    model = new_model("mamba", F, CONFIG, feature_meta())
    p = export_model(model, tmp_path / "m.onnx", "x86-avx2")
    with tracking.start_run("tcl-test"):
        info = mlflow.onnx.log_model(onnx.load(str(p)), name="kb", pip_requirements=["onnx"],
                                     save_as_external_data=False)
    mlflow.register_model(info.model_uri, "tcl-kb-x86-sse")
    with pytest.raises(ModelMismatchError, match="exported for family 'x86-avx2'"):
        load_predictor("models:/tcl-kb-x86-sse/1")


def test_onnx_without_tcl_metadata_is_refused(tmp_path):
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Identity", ["x"], ["score"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
                          [helper.make_tensor_value_info("score", TensorProto.FLOAT, [None])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    (tmp_path / "plain.onnx").write_bytes(m.SerializeToString())
    with pytest.raises(ModelMismatchError, match="lacks TCL export metadata"):
        load_predictor(tmp_path / "plain.onnx")


def test_cli_export_and_predict(kb, tmp_path):
    from click.testing import CliRunner

    from tcl.cli import main

    ckpt, _, model = kb
    out = tmp_path / "cli.onnx"
    res = CliRunner().invoke(main, ["export", str(ckpt), "--family", "amd-zen4-avx512",
                                    "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert read_metadata(out)["family"] == "amd-zen4-avx512"
    res = CliRunner().invoke(main, ["export", str(ckpt), "--family", "bad/fam", "--out",
                                    str(tmp_path / "x.onnx")])
    assert res.exit_code == 2 and "invalid hardware family" in res.output

    by_family = _platforms_by_family()
    fs = featureset(by_family["amd-zen4-avx512"], n=48, seed=11)
    fs.save(tmp_path / "fs.npz")
    res = CliRunner().invoke(main, ["predict", "--model", str(out), str(tmp_path / "fs.npz"),
                                    "--json", "--out", str(tmp_path / "scores.npy")])
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    ref = torch_scores(model, fs.x, fs.mask)
    np.testing.assert_allclose(got["scores"], ref, atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.load(tmp_path / "scores.npy"), ref, atol=1e-5, rtol=0)
    best0 = int(np.argmax(ref[:12]))
    assert got["top1_per_task"]["t0"]["index"] == best0
    res = CliRunner().invoke(main, ["predict", "--model", str(out), str(tmp_path / "fs.npz"),
                                    "--json", "--no-fused"])  # the exported standard-op graph
    assert res.exit_code == 0, res.output
    np.testing.assert_allclose(json.loads(res.stdout)["scores"], ref, atol=1e-5, rtol=0)
    other = next(p for f, p in by_family.items() if f != "amd-zen4-avx512")
    featureset(other, n=8).save(tmp_path / "other.npz")
    res = CliRunner().invoke(main, ["predict", "--model", str(out), str(tmp_path / "other.npz")])
    assert res.exit_code == 2 and "family mismatch" in res.output and "Traceback" not in res.output


def test_bench_serving_reports_both_engines(kb):
    res = bench_serving((1, 32), checkpoint=kb[0], seconds=0.15, sweep=False)
    assert [r["batch"] for r in res["rows"]] == [1, 32]
    for r in res["rows"]:
        assert r["onnx_pps"] > 0 and r["onnx_scan_pps"] > 0 and r["torch_pps"] > 0
    assert res["fused_ops"] == 2 * CONFIG["n_layers"]
    assert res["flops_per_prediction"] > 0
    assert res["matmul_gflops"]["peak"] > 0
    # two rates timed at different moments: on a shared machine either can drop, so no upper bound
    assert res["fraction_of_matmul_peak"] == pytest.approx(res["onnx_gflops_at_max_batch"] / res["matmul_gflops"]["peak"])
    assert res["fraction_of_matmul_peak"] > 0
