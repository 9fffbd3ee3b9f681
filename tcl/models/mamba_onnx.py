"""The selective scan as an ONNX ``Scan`` loop: one graph for every sequence length.

The unrolled export form (``scan_unrolled_tm``) pads every input to the traced length, so a batch
of 30-step programs pays for 48 steps. Here the export traces a placeholder node
``tcl.SelectiveScan(u, delta, A, B, C)`` (time-major, as ``scan_sequential_tm``) and
:func:`lower_selective_scan` replaces it with standard ops: the per-step inputs are prepared once
over all steps, then an ONNX ``Scan`` runs the recurrence

    h_t = exp(delta_t * A) * h_{t-1} + (delta_t * u_t) * B_t,      y_t = C_t . h_t

for exactly as many steps as the input has, with the state (b, N, E) as its loop-carried value.
Together with length-sorted blocks in the server (``tcl.serving``), a block of short programs
costs only its own length.
"""

from __future__ import annotations

import torch

__all__ = ["selective_scan_placeholder", "lower_selective_scan", "DOMAIN", "OP_TYPE"]

DOMAIN = "tcl"
OP_TYPE = "SelectiveScan"


class _SelectiveScanOp(torch.autograd.Function):
    """Eager: the sequential scan; under the TorchScript ONNX exporter: one placeholder node."""

    @staticmethod
    def forward(ctx, u, delta, A, B, C):
        from tcl.models.mamba import _scan_forward

        return _scan_forward(u, delta, A, B, C)[0]

    @staticmethod
    def symbolic(g, u, delta, A, B, C):
        out = g.op(f"{DOMAIN}::{OP_TYPE}", u, delta, A, B, C)
        out.setType(u.type())
        return out


def selective_scan_placeholder(u, delta, A, B, C):
    """(L, b, E) like ``scan_sequential_tm``; exports as a ``tcl.SelectiveScan`` node that
    :func:`lower_selective_scan` must replace before onnxruntime can run the graph."""
    return _SelectiveScanOp.apply(u, delta, A, B, C)


def _body(prefix: str, a_t: str):
    """Scan body: (h, dl_t, du_t, B_t, C_t) -> (h', y_t) with A^T (N, E) from the outer graph."""
    from onnx import TensorProto, helper

    def vi(name):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, None)

    nodes = [
        helper.make_node("Mul", ["dl_t", a_t], ["dA"]),        # (b,1,E) x (N,E) -> (b,N,E)
        helper.make_node("Exp", ["dA"], ["decay"]),
        helper.make_node("Mul", ["decay", "h"], ["kept"]),
        helper.make_node("Mul", ["du_t", "B_t"], ["drive"]),   # (b,1,E) x (b,N,1) -> (b,N,E)
        helper.make_node("Add", ["kept", "drive"], ["h_next"]),
        helper.make_node("MatMul", ["C_t", "h_next"], ["y_t"]),  # (b,1,N) @ (b,N,E) -> (b,1,E)
    ]
    return helper.make_graph(nodes, f"{prefix}body", [vi(n) for n in ("h", "dl_t", "du_t", "B_t", "C_t")],
                             [vi("h_next"), vi("y_t")])


def _lowered(node, prefix: str) -> list:
    """Standard-op nodes computing `node`'s output (L, b, E) from its inputs."""
    from onnx import TensorProto, helper

    u, delta, A, B, C = node.input
    y = node.output[0]

    def t(s: str) -> str:
        return prefix + s

    def const(name, dtype, dims, vals):
        return helper.make_node("Constant", [], [t(name)], name=t(name),
                                value=helper.make_tensor(t(name) + "_value", dtype, dims, vals))

    return [
        const("axis2", TensorProto.INT64, [1], [2]),
        const("axis3", TensorProto.INT64, [1], [3]),
        const("first", TensorProto.INT64, [], [0]),
        const("zero", TensorProto.FLOAT, [], [0.0]),
        helper.make_node("Transpose", [A], [t("At")], perm=[1, 0], name=t("At")),           # (N, E)
        helper.make_node("Unsqueeze", [delta, t("axis2")], [t("dl")], name=t("dl")),        # (L,b,1,E)
        helper.make_node("Mul", [delta, u], [t("du3")], name=t("du3")),
        helper.make_node("Unsqueeze", [t("du3"), t("axis2")], [t("du")], name=t("du")),     # (L,b,1,E)
        helper.make_node("Unsqueeze", [B, t("axis3")], [t("Bn")], name=t("Bn")),            # (L,b,N,1)
        helper.make_node("Unsqueeze", [C, t("axis2")], [t("Cn")], name=t("Cn")),            # (L,b,1,N)
        # h_{-1} = zeros (b, N, E), shaped by broadcasting zeros (b,1,E) + zeros (N,E)
        helper.make_node("Gather", [t("dl"), t("first")], [t("dl0")], axis=0, name=t("dl0")),
        helper.make_node("Mul", [t("dl0"), t("zero")], [t("zb")], name=t("zb")),
        helper.make_node("Mul", [t("At"), t("zero")], [t("zne")], name=t("zne")),
        helper.make_node("Add", [t("zb"), t("zne")], [t("h0")], name=t("h0")),
        helper.make_node("Scan", [t("h0"), t("dl"), t("du"), t("Bn"), t("Cn")], [t("hT"), t("Y")],
                         num_scan_inputs=4, body=_body(prefix, t("At")), name=t("scan")),
        helper.make_node("Squeeze", [t("Y"), t("axis2")], [y], name=t("y")),               # (L,b,E)
    ]


def lower_selective_scan(proto) -> int:
    """Replace every ``tcl.SelectiveScan`` node of `proto` (in place) by standard ONNX ops and
    drop the ``tcl`` opset import; returns the number of nodes replaced."""
    g = proto.graph
    nodes, count = [], 0
    for node in g.node:
        if node.op_type == OP_TYPE and node.domain == DOMAIN:
            nodes += _lowered(node, f"tcl_scan{count}_")
            count += 1
        else:
            nodes.append(node)
    if count:
        del g.node[:]
        g.node.extend(nodes)
        keep = [op for op in proto.opset_import if op.domain != DOMAIN]
        del proto.opset_import[:]
        proto.opset_import.extend(keep)
    return count
