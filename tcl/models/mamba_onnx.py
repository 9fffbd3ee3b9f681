"""The Mamba block's sequence ops in ONNX: one graph for every length, standard ops or fused ops.

The unrolled export form (``scan_unrolled_tm``) pads every input to the traced length, so a batch
of 30-step programs pays for 48 steps. Here the export traces a placeholder node
(``tcl.models.onnx_placeholders.selective_scan_placeholder``)

    tcl.SelectiveScan(u, delta, A, B, C, D, z, delta_bias; delta_softplus=1)  ->  y   (time-major)

with the semantics of mamba-ssm's ``selective_scan_fn(..., delta_bias, delta_softplus=True)``:

    delta_t = softplus(delta_t + delta_bias)
    h_t = exp(delta_t * A) * h_{t-1} + (delta_t * u_t) * B_t,      y_t = (C_t . h_t + D u_t) * silu(z_t)

and :func:`lower_selective_scan` replaces it with standard ops, so any ONNX runtime runs the
exported file: the per-step inputs are prepared once over all steps, then an ONNX ``Scan`` runs
the recurrence for exactly as many steps as the input has, with the state (b, N, E) as its
loop-carried value. Together with length-sorted blocks in the server (``tcl.serving``), a block of
short programs costs only its own length. The block's depthwise causal conv + SiLU is traced the
same way (``tcl.CausalConv1d(x, w (K, E), bias; silu=1, kernel_size=K)``) and lowered to a pad
and K shifted slices.

The lowered nodes keep a record of the node they replace, and :func:`fuse_selective_scan` puts
those nodes back: onnxruntime then runs each as one CPU operator from TCL's own library
(``tcl/csrc/ortops.cc``, built at install; :func:`fused_library`), a single pass per row
instead of a dozen small ops per step.

No torch here: the server (``tcl.serving`` via ``tcl.runtime``) fuses graphs without importing it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

__all__ = ["lower_selective_scan", "fuse_selective_scan", "fused_library", "DOMAIN", "OP_TYPE",
           "CONV_OP_TYPE"]

DOMAIN = "tcl"
OP_TYPE = "SelectiveScan"
CONV_OP_TYPE = "CausalConv1d"
INPUTS = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")
_PREFIX = re.compile(r"^tcl_(scan|conv)(\d+)_")
_MARK = "tcl.fusable"  # key of the JSON record in a lowered group's first node's doc_string


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


def _attr_int(node, name: str, default: int) -> int:
    for a in node.attribute:
        if a.name == name:
            return int(a.i)
    return default


class _Builder:
    """Makes the nodes of one lowered group: every name starts with `prefix`."""

    def __init__(self, prefix: str):
        from onnx import TensorProto, helper

        self.prefix, self.helper, self.tp = prefix, helper, TensorProto

    def t(self, s: str) -> str:
        return self.prefix + s

    def op(self, kind, inputs, out, **kw):
        return self.helper.make_node(kind, inputs, [self.t(out)], name=self.t(out), **kw)

    def const(self, name, dtype, dims, vals):
        h = self.helper
        return h.make_node("Constant", [], [self.t(name)], name=self.t(name),
                           value=h.make_tensor(self.t(name) + "_value", dtype, dims, vals))


def _lower_scan(node, prefix: str) -> list:
    """Standard-op nodes computing a SelectiveScan node's output (L, b, E) from its inputs."""
    from onnx import helper

    nb = _Builder(prefix)
    t, op, F, I64 = nb.t, nb.op, nb.tp.FLOAT, nb.tp.INT64
    ins = list(node.input) + [""] * (len(INPUTS) - len(node.input))
    u, delta, A, B, C, D, z, delta_bias = ins
    y = node.output[0]
    nodes = [nb.const("axis2", I64, [1], [2]), nb.const("axis3", I64, [1], [3]),
             nb.const("first", I64, [], [0]), nb.const("zero", F, [], [0.0])]
    if delta_bias:
        nodes.append(op("Add", [delta, delta_bias], "delta_biased"))
        delta = t("delta_biased")
    if _attr_int(node, "delta_softplus", 0):
        # relu(x) + log(1 + exp(-|x|)): exact to < 1e-7, ~10x faster than onnxruntime's Softplus
        nodes += [nb.const("one", F, [], [1.0]),
                  op("Relu", [delta], "sp_relu"), op("Abs", [delta], "sp_abs"),
                  op("Neg", [t("sp_abs")], "sp_neg"), op("Exp", [t("sp_neg")], "sp_exp"),
                  op("Add", [t("sp_exp"), t("one")], "sp_1p"), op("Log", [t("sp_1p")], "sp_log"),
                  op("Add", [t("sp_relu"), t("sp_log")], "delta")]
        delta = t("delta")
    nodes += [
        op("Transpose", [A], "At", perm=[1, 0]),                     # (N, E)
        op("Unsqueeze", [delta, t("axis2")], "dl"),                  # (L,b,1,E)
        op("Mul", [delta, u], "du3"),
        op("Unsqueeze", [t("du3"), t("axis2")], "du"),               # (L,b,1,E)
        op("Unsqueeze", [B, t("axis3")], "Bn"),                      # (L,b,N,1)
        op("Unsqueeze", [C, t("axis2")], "Cn"),                      # (L,b,1,N)
        # h_{-1} = zeros (b, N, E), shaped by broadcasting zeros (b,1,E) + zeros (N,E)
        op("Gather", [t("dl"), t("first")], "dl0", axis=0),
        op("Mul", [t("dl0"), t("zero")], "zb"),
        op("Mul", [t("At"), t("zero")], "zne"),
        op("Add", [t("zb"), t("zne")], "h0"),
        helper.make_node("Scan", [t("h0"), t("dl"), t("du"), t("Bn"), t("Cn")], [t("hT"), t("Y")],
                         num_scan_inputs=4, body=_body(prefix, t("At")), name=t("scan")),
        op("Squeeze", [t("Y"), t("axis2")], "Ys"),                  # (L,b,E)
    ]
    out = t("Ys")
    if D:
        nodes += [op("Mul", [u, D], "Du"), op("Add", [out, t("Du")], "yD")]
        out = t("yD")
    if z:
        nodes += [op("Sigmoid", [z], "zsig"), op("Mul", [z, t("zsig")], "silu"),
                  helper.make_node("Mul", [out, t("silu")], [y], name=t("y"))]
    else:
        nodes.append(helper.make_node("Identity", [out], [y], name=t("y")))
    return nodes


def _lower_conv(node, prefix: str) -> list:
    """Standard-op nodes of a CausalConv1d node: pad K-1 steps in front, K shifted slices times
    their tap (the slice ends count from the end, so the graph follows the dynamic length)."""
    from onnx import helper

    nb = _Builder(prefix)
    t, op, I64 = nb.t, nb.op, nb.tp.INT64
    x, w = node.input[0], node.input[1]
    bias = node.input[2] if len(node.input) > 2 else ""
    y = node.output[0]
    K = _attr_int(node, "kernel_size", 0)
    if K < 1:
        raise ValueError(f"{node.name or CONV_OP_TYPE}: kernel_size attribute missing")
    nodes = [nb.const("pads", I64, [6], [K - 1, 0, 0, 0, 0, 0]), nb.const("axis0", I64, [1], [0]),
             op("Pad", [x, t("pads")], "xp")]
    out = None
    for k in range(K):
        nodes += [nb.const(f"start{k}", I64, [1], [k]),
                  nb.const(f"end{k}", I64, [1], [k - (K - 1) if k < K - 1 else 2**62]),
                  nb.const(f"tap{k}", I64, [], [k]),
                  op("Slice", [t("xp"), t(f"start{k}"), t(f"end{k}"), t("axis0")], f"xs{k}"),
                  op("Gather", [w, t(f"tap{k}")], f"w{k}", axis=0),
                  op("Mul", [t(f"xs{k}"), t(f"w{k}")], f"p{k}")]
        if out is None:
            out = t(f"p{k}")
        else:
            nodes.append(op("Add", [out, t(f"p{k}")], f"s{k}"))
            out = t(f"s{k}")
    if bias:
        nodes.append(op("Add", [out, bias], "biased"))
        out = t("biased")
    if _attr_int(node, "silu", 0):
        nodes += [op("Sigmoid", [out], "sig"), helper.make_node("Mul", [out, t("sig")], [y], name=t("y"))]
    else:
        nodes.append(helper.make_node("Identity", [out], [y], name=t("y")))
    return nodes


_LOWERINGS = {OP_TYPE: ("scan", _lower_scan), CONV_OP_TYPE: ("conv", _lower_conv)}


def lower_selective_scan(proto) -> int:
    """Replace every TCL placeholder node of `proto` (``tcl.SelectiveScan``, ``tcl.CausalConv1d``;
    in place) by standard ONNX ops and drop the ``tcl`` opset import; returns the number of
    nodes replaced. Each lowered group keeps a record of its node for :func:`fuse_selective_scan`."""
    g = proto.graph
    nodes, counts = [], {}
    for node in g.node:
        if node.domain == DOMAIN and node.op_type in _LOWERINGS:
            tag, lower = _LOWERINGS[node.op_type]
            group = lower(node, f"tcl_{tag}{counts.get(tag, 0)}_")
            counts[tag] = counts.get(tag, 0) + 1
            group[0].doc_string = json.dumps({_MARK: {
                "op_type": node.op_type, "inputs": list(node.input), "output": node.output[0],
                "attributes": {a.name: int(a.i) for a in node.attribute}}})
            nodes += group
        else:
            nodes.append(node)
    count = sum(counts.values())
    if count:
        del g.node[:]
        g.node.extend(nodes)
        _set_opset(proto, keep_tcl=False)
    return count


def _set_opset(proto, keep_tcl: bool) -> None:
    from onnx import helper

    keep = [op for op in proto.opset_import if op.domain != DOMAIN]
    del proto.opset_import[:]
    proto.opset_import.extend(keep)
    if keep_tcl:
        proto.opset_import.append(helper.make_opsetid(DOMAIN, 1))


def fuse_selective_scan(proto) -> int:
    """Undo :func:`lower_selective_scan` on `proto` (in place): each lowered group that carries
    its record becomes its ``tcl`` node again. Returns the number of nodes fused; 0 for graphs
    exported before the records existed, which then keep their standard ops."""
    from onnx import helper

    records: dict[str, dict] = {}
    for node in proto.graph.node:
        m = _PREFIX.match(node.name)
        if m and node.doc_string and m.group(0) not in records:
            rec = json.loads(node.doc_string).get(_MARK)
            if rec:
                records[m.group(0)] = rec
    if not records:
        return 0
    nodes, placed = [], set()
    for node in proto.graph.node:
        m = _PREFIX.match(node.name)
        if not (m and m.group(0) in records):
            nodes.append(node)
        elif m.group(0) not in placed:  # the group's first node: its fused node takes the place
            placed.add(m.group(0))
            rec = records[m.group(0)]
            nodes.append(helper.make_node(rec["op_type"], rec["inputs"], [rec["output"]], domain=DOMAIN,
                                          name=m.group(0) + "fused", **rec["attributes"]))
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)
    _set_opset(proto, keep_tcl=True)
    return len(placed)


def fused_library() -> Path | None:
    """Path of TCL's onnxruntime operator library (built by ``pip install`` from
    ``tcl/csrc/ortops.cc``), or None where it was not built (no C++ compiler)."""
    from tcl.models.libraries import compiled_library

    return compiled_library("_ortops")
