"""TCL's onnxruntime operators (tcl/csrc/ortops.cc): the library built at install, each op
against a float64 reference, shape errors, the lower/fuse round trip, and serving with them."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from tcl.models.mamba_onnx import (CONV_OP_TYPE, DOMAIN, OP_TYPE, fuse_selective_scan,
                                   fused_library, lower_selective_scan)


@pytest.fixture(scope="module")
def library():
    lib = fused_library()
    assert lib is not None, ("tcl/_ortops*.so was not built: `pip install -e .` compiles "
                             "tcl/csrc/ortops.cc (needs g++)")
    return str(lib)


def _session(model_bytes: bytes, library: str | None):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    if library:
        so.register_custom_ops_library(library)
    return ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])


def _one_node_model(op_type: str, inputs: dict, **attrs) -> bytes:
    """A graph of one tcl node whose inputs are the graph inputs (names -> arrays; None = absent)."""
    names = [k if v is not None else "" for k, v in inputs.items()]
    while names and not names[-1]:
        names.pop()
    node = helper.make_node(op_type, names, ["y"], domain=DOMAIN, **attrs)
    vis = [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v.shape))
           for k, v in inputs.items() if v is not None]
    graph = helper.make_graph([node], "g", vis, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])
    return model.SerializeToString()


def _scan_reference(u, delta, A, B, C, D, z, delta_bias, softplus):
    """The recurrence in float64, step by step (time-major inputs)."""
    u, delta, A, B, C = (np.asarray(t, np.float64) for t in (u, delta, A, B, C))
    if delta_bias is not None:
        delta = delta + delta_bias
    if softplus:
        delta = np.logaddexp(0.0, delta)
    L, b, E = u.shape
    h = np.zeros((b, E, A.shape[1]))
    y = np.zeros((L, b, E))
    for t in range(L):
        h = np.exp(delta[t][..., None] * A) * h + (delta[t] * u[t])[..., None] * B[t][:, None, :]
        y[t] = (h * C[t][:, None, :]).sum(-1)
    if D is not None:
        y = y + D * u
    if z is not None:
        y = y * (z / (1.0 + np.exp(-z)))
    return y


def _scan_inputs(L, b, E, N, seed=0):
    rng = np.random.default_rng(seed)
    f = np.float32
    return {"u": rng.standard_normal((L, b, E)).astype(f),
            "delta": (2 * rng.standard_normal((L, b, E))).astype(f),
            "A": (-np.exp(rng.standard_normal((E, N)))).astype(f),
            "B": rng.standard_normal((L, b, N)).astype(f),
            "C": rng.standard_normal((L, b, N)).astype(f),
            "D": rng.standard_normal(E).astype(f),
            "z": rng.standard_normal((L, b, E)).astype(f),
            "delta_bias": rng.standard_normal(E).astype(f)}


@pytest.mark.parametrize("L,b,E,N", [(1, 1, 1, 1), (7, 3, 13, 5), (36, 64, 64, 8), (40, 2, 33, 16)])
def test_selective_scan_op_matches_the_recurrence(library, L, b, E, N):
    full = _scan_inputs(L, b, E, N, seed=L + E)
    for softplus in (1, 0):
        for optional in ("D,z,delta_bias", "D,delta_bias", "D,z", "D", ""):
            ins = dict(full)
            if not softplus:  # the step sizes as given: positive
                ins["delta"], ins["delta_bias"] = np.abs(full["delta"]), np.abs(full["delta_bias"])
            for k in ("D", "z", "delta_bias"):
                if k not in optional:
                    ins[k] = None
            got = _session(_one_node_model(OP_TYPE, ins, delta_softplus=softplus), library).run(
                None, {k: v for k, v in ins.items() if v is not None})[0]
            ref = _scan_reference(*(ins[k] for k in ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")),
                                  softplus)
            assert got.shape == (L, b, E) and got.dtype == np.float32
            np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-5 * (1 + np.abs(ref).max()),
                                       err_msg=f"softplus={softplus} optional={optional!r}")


def test_selective_scan_op_extreme_steps(library):
    """Huge deltas (decay underflows to 0), tiny and negative raw deltas (softplus near 0 and
    its linear tail) stay finite and exact."""
    ins = _scan_inputs(12, 4, 16, 4, seed=3)
    ins["delta"][0] = 60.0
    ins["delta"][1] = -60.0
    ins["delta"][2] = 1e-30
    ins["A"][0, 0] = -1e4
    got = _session(_one_node_model(OP_TYPE, ins, delta_softplus=1), library).run(None, ins)[0]
    ref = _scan_reference(*ins.values(), softplus=True)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-5 * (1 + np.abs(ref).max()))


def _conv_reference(x, w, bias, silu):
    L = x.shape[0]
    K = w.shape[0]
    xp = np.concatenate([np.zeros((K - 1,) + x.shape[1:]), x.astype(np.float64)])
    y = sum(xp[k:k + L] * w[k] for k in range(K))
    if bias is not None:
        y = y + bias
    return y / (1.0 + np.exp(-y)) if silu else y


@pytest.mark.parametrize("L,K", [(1, 4), (3, 4), (20, 4), (9, 1), (5, 6)])
def test_causal_conv_op_matches_reference(library, L, K):
    rng = np.random.default_rng(L * 10 + K)
    x = rng.standard_normal((L, 3, 11)).astype(np.float32)
    w = rng.standard_normal((K, 11)).astype(np.float32)
    bias = rng.standard_normal(11).astype(np.float32)
    for silu in (1, 0):
        for b in (bias, None):
            ins = {"x": x, "w": w, "bias": b}
            got = _session(_one_node_model(CONV_OP_TYPE, ins, silu=silu, kernel_size=K), library).run(
                None, {k: v for k, v in ins.items() if v is not None})[0]
            np.testing.assert_allclose(got, _conv_reference(x, w, b, silu), rtol=1e-5, atol=1e-5)


def test_bad_shapes_are_named(library):
    ins = _scan_inputs(5, 2, 8, 4)
    ins["B"] = ins["B"][:, :, :3]  # N = 3 where A says 4
    sess = _session(_one_node_model(OP_TYPE, ins), library)
    with pytest.raises(Exception, match=r"tcl\.SelectiveScan: input B is \(5, 2, 3\), expected \(5, 2, 4\)"):
        sess.run(None, ins)
    conv = {"x": np.zeros((4, 2, 8), np.float32), "w": np.zeros((4, 7), np.float32)}
    sess = _session(_one_node_model(CONV_OP_TYPE, conv, kernel_size=4), library)
    with pytest.raises(Exception, match=r"tcl\.CausalConv1d: x must be \(L, b, E\) and w \(K, E\)"):
        sess.run(None, conv)


def _placeholder_graph():
    """A graph holding the two tcl placeholder nodes between standard ones, as exported."""
    f = TensorProto.FLOAT
    E, N, K = 8, 4, 4
    rng = np.random.default_rng(0)
    inits = [helper.make_tensor("w", f, [K, E], rng.standard_normal(K * E).tolist()),
             helper.make_tensor("bias", f, [E], rng.standard_normal(E).tolist()),
             helper.make_tensor("A", f, [E, N], (-np.exp(rng.standard_normal(E * N))).tolist()),
             helper.make_tensor("D", f, [E], rng.standard_normal(E).tolist()),
             helper.make_tensor("dt_bias", f, [E], rng.standard_normal(E).tolist()),
             helper.make_tensor("sizes", TensorProto.INT64, [3], [E, N, N])]
    nodes = [helper.make_node(CONV_OP_TYPE, ["x", "w", "bias"], ["xc"], domain=DOMAIN, silu=1, kernel_size=K),
             helper.make_node("Concat", ["x", "xB", "xB"], ["dbc"], axis=2),
             helper.make_node("Split", ["dbc", "sizes"], ["delta", "B", "C"], axis=2),
             helper.make_node(OP_TYPE, ["xc", "delta", "A", "B", "C", "D", "z", "dt_bias"], ["y"], domain=DOMAIN,
                              delta_softplus=1)]
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(nodes, "g", [vi("x", f, ["L", "b", E]), vi("xB", f, ["L", "b", N]),
                                           vi("z", f, ["L", "b", E])],
                              [vi("y", f, ["L", "b", E])], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])


def test_lower_then_fuse_restores_the_nodes(library):
    """lower_selective_scan gives a standard graph any runtime runs; fuse_selective_scan turns
    it back into exactly the placeholder nodes, and both graphs compute the same."""
    model = _placeholder_graph()
    original = [(n.op_type, n.domain, list(n.input), list(n.output),
                 sorted((a.name, a.i) for a in n.attribute)) for n in model.graph.node if n.domain == DOMAIN]
    lowered = onnx.ModelProto()
    lowered.CopyFrom(model)
    assert lower_selective_scan(lowered) == 2
    assert all(n.domain == "" for n in lowered.graph.node)
    assert DOMAIN not in [o.domain for o in lowered.opset_import]
    onnx.checker.check_model(lowered)

    fused = onnx.ModelProto()
    fused.CopyFrom(lowered)
    assert fuse_selective_scan(fused) == 2
    back = [(n.op_type, n.domain, list(n.input), list(n.output),
             sorted((a.name, a.i) for a in n.attribute)) for n in fused.graph.node if n.domain == DOMAIN]
    assert back == original
    assert not any(n.name.startswith("tcl_") and n.domain == "" for n in fused.graph.node)

    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal((9, 3, 8)).astype(np.float32),
             "xB": rng.standard_normal((9, 3, 4)).astype(np.float32),
             "z": rng.standard_normal((9, 3, 8)).astype(np.float32)}
    want = _session(lowered.SerializeToString(), None).run(None, feeds)[0]
    got = _session(fused.SerializeToString(), library).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_graphs_without_records_are_left_alone():
    model = _placeholder_graph()
    lower_selective_scan(model)
    for n in model.graph.node:  # an export from before the records existed
        if n.doc_string and "tcl.fusable" in n.doc_string:
            assert json.loads(n.doc_string)
            n.doc_string = ""
    before = model.SerializeToString()
    assert fuse_selective_scan(model) == 0
    assert model.SerializeToString() == before
