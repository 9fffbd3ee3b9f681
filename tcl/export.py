"""Export a cost model (``tcl.models.base.CostModel`` with ``to_onnx``) to ONNX for serving.

The graph takes ``x`` (batch, length, n_features) float32 and ``mask`` (batch, length) bool and
returns ``score`` (batch,) float32, with batch and length dynamic. The file's ``metadata_props``
carry what a server needs to refuse a mismatched featurizer or family:

=================  ==========================================================================
family             hardware family the model serves (``tcl-kb-<family>``)
feature_version    ``tcl.features.FEATURE_VERSION`` the model was trained on
max_len            L of the training features (sequences are padded/cropped to it)
n_features         F
vocab_hash         hash of the featurizer vocabulary (``tcl.features.vocabulary_hash``), ""
                   if the features had none
kind               the model kind (tcl.models.KINDS) that exported it
config             model config, JSON
source_run         MLflow run id that trained the model ("" if unknown)
checkpoint_sha256  sha256 of the checkpoint file exported
opset              ONNX opset
tcl_version        version of the tcl package that exported
=================  ==========================================================================

The export is checked against the model's own ``predict`` on random real-shaped inputs before
the file is written (atomically, via :func:`tcl.io.atomic_path`). No torch at import: the
server reads the metadata with :func:`parse_metadata`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from tcl.features import features_vocab_hash
from tcl.io import atomic_path, file_sha256

INT_KEYS = ("max_len", "n_features", "opset")


class ExportError(RuntimeError):
    pass


def default_opset() -> int:
    """params.yaml ``export.opset`` (17 when unset)."""
    from tcl.config import ParamsError, load_params

    try:
        return int((load_params(required=False).get("export") or {}).get("opset", 17))
    except (ParamsError, ValueError, TypeError):
        return 17


def example_inputs(batch: int, length: int, n_features: int, seed: int = 0, min_length: int = 1):
    """Random real-shaped inputs: one-hot-ish step rows with numeric args, prefix masks of
    lengths uniform in [min_length, length] (the first row full)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, length, n_features)).astype(np.float32)
    lengths = rng.integers(max(1, min(min_length, length)), length + 1, size=batch)
    lengths[0] = length  # at least one full sequence
    mask = np.arange(length)[None, :] < lengths[:, None]
    x[~mask] = 0.0
    return x, mask


def rewrite_softplus(proto) -> int:
    """Replace every ``Softplus`` node by an equivalent chain of vectorised element-wise ops.

    onnxruntime's CPU Softplus is a scalar loop (~20 ns/element here: a fifth of the KB model's
    serving time on the (L, B, E) dt tensor); MLAS's Exp/Log/Add are vectorised. Computed as
    ``relu(x) + log1p(exp(-|x|))`` with log1p(w) = w * log(1 + w) / ((1 + w) - 1) (exact to float
    rounding, Goldberg's trick) and w itself where 1 + w rounds to 1. Returns the number replaced.
    """
    from onnx import helper, numpy_helper

    g = proto.graph
    if not any(n.op_type == "Softplus" for n in g.node):
        return 0
    one = "tcl_softplus_one"
    g.initializer.append(numpy_helper.from_array(np.array(1.0, dtype=np.float32), one))
    nodes, count = [], 0
    for node in g.node:
        if node.op_type != "Softplus":
            nodes.append(node)
            continue
        x, y = node.input[0], node.output[0]
        pre = f"tcl_softplus{count}"

        def t(s: str, pre: str = pre) -> str:
            return f"{pre}_{s}"

        nodes += [
            helper.make_node("Abs", [x], [t("abs")], name=t("Abs")),
            helper.make_node("Neg", [t("abs")], [t("nabs")], name=t("Neg")),
            helper.make_node("Exp", [t("nabs")], [t("w")], name=t("Exp")),
            helper.make_node("Add", [t("w"), one], [t("v")], name=t("Add1")),
            helper.make_node("Log", [t("v")], [t("logv")], name=t("Log")),
            helper.make_node("Sub", [t("v"), one], [t("vm1")], name=t("Sub")),
            helper.make_node("Div", [t("w"), t("vm1")], [t("ratio")], name=t("Div")),
            helper.make_node("Mul", [t("logv"), t("ratio")], [t("l1p")], name=t("Mul")),
            helper.make_node("Equal", [t("v"), one], [t("tiny")], name=t("Equal")),
            helper.make_node("Where", [t("tiny"), t("w"), t("l1p")], [t("log1p")], name=t("Where")),
            helper.make_node("Relu", [x], [t("relu")], name=t("Relu")),
            helper.make_node("Add", [t("relu"), t("log1p")], [y], name=t("Add2")),
        ]
        count += 1
    del g.node[:]
    g.node.extend(nodes)
    return count


def _check_parity(model, onnx_bytes: bytes, n_features: int, max_len: int,
                  atol: float = 1e-5) -> float:
    """Max |onnx - model.predict| over a few batch sizes and lengths; raises ExportError beyond
    atol * max(1, max |score|). Checks the exported graph and, where TCL's operator library
    is built, the graph the server runs (its fusable groups as tcl operators)."""
    from tcl.runtime import fuse_ops, inference_session

    sessions = [("exported", inference_session(onnx_bytes, threads=1))]
    fused_bytes, library, n_fused = fuse_ops(onnx_bytes, None)
    if n_fused:
        sessions.append(("fused", inference_session(fused_bytes, threads=1, library=library)))
    worst = 0.0
    lengths = sorted({max_len, max(1, max_len // 2)})
    for seed, (b, length) in enumerate([(1, max_len), (7, max_len)]
                                       + [(5, n) for n in lengths if n != max_len]):
        x, mask = example_inputs(b, length, n_features, seed=100 + seed)
        ref = model.predict(x, mask)
        for name, sess in sessions:
            try:
                got = sess.run(None, {"x": x, "mask": mask})[0]
            except Exception as exc:  # noqa: BLE001
                raise ExportError(f"{name} graph fails at batch={b} length={length}: {exc}") from exc
            if got.shape != ref.shape:
                raise ExportError(f"{name} graph returns shape {got.shape}, the model {ref.shape}")
            err = float(np.max(np.abs(got.astype(np.float64) - ref.astype(np.float64))))
            err /= max(1.0, float(np.max(np.abs(ref))))
            if not err <= atol:
                raise ExportError(f"ONNX ({name} graph) and the model disagree by {err:.3g} (> {atol})")
            worst = max(worst, err)
    return worst


def _tcl_version() -> str:
    try:
        from importlib.metadata import version

        return version("tcl")
    except Exception:  # noqa: BLE001 - not installed as a distribution
        return "unknown"


def export_bytes(model, family: str, source_run: str | None = None, opset: int | None = None,
                 checkpoint_sha256: str = "", fast_ops: bool = True) -> bytes:
    """An in-memory CostModel as the bytes of a checked ONNX file with TCL's metadata (what
    :func:`export_model` writes; the tuner's fine-tuning serves them without a file).

    The input shape comes from ``model.feature_meta`` (max_len, n_features). `fast_ops` rewrites
    slow onnxruntime kernels into equivalent fast ones (:func:`rewrite_softplus`); the parity
    check runs on the rewritten graph.
    """
    return _export_proto(model, family, source_run, opset, checkpoint_sha256, fast_ops).SerializeToString()


def _export_proto(model, family: str, source_run: str | None = None, opset: int | None = None,
                  checkpoint_sha256: str = "", fast_ops: bool = True, check: bool = True):
    """`export_bytes` as an onnx ModelProto; `check` False skips the parity check (the graph is
    still run through onnx's checker)."""
    import onnx

    if not model.onnx_export:
        raise ExportError(f"{model.kind} models have no ONNX export (kinds with one serve from tcl.serving)")
    n_features = int(model.feature_meta.get("n_features", model.n_features))
    max_len = int(model.feature_meta["max_len"])
    opset = int(opset or default_opset())
    try:
        raw = model.to_onnx(max_len, opset)
    except RuntimeError as exc:
        raise ExportError(str(exc)) from None
    proto = onnx.load_from_string(raw)
    if fast_ops and rewrite_softplus(proto):
        raw = proto.SerializeToString()
    if check:
        _check_parity(model, raw, n_features, max_len)
    props = {
        "family": family,
        "feature_version": str(model.feature_meta.get("feature_version", "")),
        "max_len": str(max_len),
        "n_features": str(n_features),
        "vocab_hash": features_vocab_hash(model.feature_meta),
        "kind": model.kind,
        "config": json.dumps(model.config or {}, sort_keys=True),
        "source_run": source_run or "",
        "checkpoint_sha256": checkpoint_sha256,
        "opset": str(opset),
        "tcl_version": _tcl_version(),
    }
    del proto.metadata_props[:]
    for k, v in props.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = k, v
    proto.producer_name = "tcl"
    onnx.checker.check_model(proto)
    return proto


class Reexporter:
    """`export_bytes` of one model again and again as its weights change (the tuner's fine-tuning
    serves its KB anew after every update), without tracing it again.

        reexport = Reexporter(model, family)   # one full export, checked
        ...                                    # train model.net
        onnx_bytes = reexport()                # the same graph with the current weights

    A full export traces the net (~0.1 s), checks it against torch on onnxruntime (~0.03 s) and
    reads params.yaml; an update's weights change nothing but the graph's initializers. Here the
    net is traced once more, as a copy whose weights are their own positions (exact float32
    integers from 2^22): an initializer that is a slice, a transpose or a copy of weights then
    reads as the positions it gathers, and every call gathers the current weights into that
    graph. It is kept where, with the real weights, it is the full export byte for byte
    (`exact`), or else passes the same parity check against torch (the exporter merges
    initializers that happen to be equal, e.g. an untrained net's ones, which the positions
    never are: a graph every later weight fits). Where neither holds (the exporter computed an
    initializer from weights) every call is a full export (`swaps` False).
    """

    _OFFSET = 1 << 22  # positions + offset: exact float32 integers no graph constant comes near

    def __init__(self, model, family: str, source_run: str | None = None):
        self.model, self.family, self.source_run = model, family, source_run
        first = _export_proto(model, family, source_run)
        self.opset = int(dict((e.key, e.value) for e in first.metadata_props)["opset"])
        self.template, self.gathers, self.exact = self._weight_map(first)
        self.swaps = self.template is not None

    def __call__(self) -> bytes:
        if self.template is None:
            return export_bytes(self.model, self.family, self.source_run, self.opset)
        return _gather_weights(self.template, self.gathers, _flat_weights(self.model.net)).SerializeToString()

    def _weight_map(self, first):
        """(the positions' graph, per top-level initializer its gather index or None for a
        constant, whether it is `first` byte for byte with the real weights), or (None, None,
        False) where that graph does not serve the real weights."""
        import copy

        import onnx
        from onnx import numpy_helper

        probe = copy.deepcopy(self.model)
        n_weights = _flat_weights(probe.net).size
        if n_weights >= (1 << 24) - self._OFFSET:
            return None, None, False  # positions no longer exact in float32
        positions = np.arange(n_weights, dtype=np.float32) + self._OFFSET
        offset = 0
        for value in probe.net.state_dict().values():
            if value.is_floating_point():
                n = value.numel()
                value.copy_(_torch().from_numpy(positions[offset:offset + n].reshape(tuple(value.shape))))
                offset += n
        try:
            template = _export_proto(probe, self.family, self.source_run, self.opset, check=False)
        except ExportError:
            return None, None, False
        gathers = []
        for init in template.graph.initializer:
            if init.data_type != onnx.TensorProto.FLOAT:
                gathers.append(None)  # weights are float32: shapes, indices
                continue
            seen = numpy_helper.to_array(init).astype(np.float64)
            index = seen - self._OFFSET
            gathered = (index >= 0) & (index < n_weights) & (index == np.round(index))
            if not gathered.any():
                gathers.append(None)  # a constant of the graph (or computed: the checks below tell)
            elif gathered.all():
                gathers.append(index.astype(np.int64))
            else:
                return None, None, False
        data = _gather_weights(template, gathers, _flat_weights(self.model.net)).SerializeToString()
        if data == first.SerializeToString():
            return template, gathers, True
        meta = self.model.feature_meta
        try:
            _check_parity(self.model, data, int(meta.get("n_features", self.model.n_features)), int(meta["max_len"]))
        except ExportError:
            return None, None, False
        return template, gathers, False


def _gather_weights(template, gathers: list, flat: np.ndarray):
    """`template` with each gathered initializer set to `flat` at its positions (in place)."""
    from onnx import numpy_helper

    for init, index in zip(template.graph.initializer, gathers):
        if index is not None:
            init.CopyFrom(numpy_helper.from_array(flat[index], init.name))
    return template


def _torch():
    import torch

    return torch


def _flat_weights(net) -> np.ndarray:
    """Every floating tensor of the net's state_dict, in its order, as one float32 vector."""
    parts = [v.detach().reshape(-1).to(dtype=_torch().float32).numpy()
             for v in net.state_dict().values() if v.is_floating_point()]
    return np.concatenate(parts) if parts else np.zeros(0, np.float32)


def export_model(model, out_path: str | os.PathLike, family: str, source_run: str | None = None,
                 opset: int | None = None, checkpoint_sha256: str = "", fast_ops: bool = True) -> Path:
    """Export an in-memory CostModel to `out_path` (:func:`export_bytes`, written atomically; see
    :func:`export_onnx` for the saved-model entry point)."""
    data = export_bytes(model, family, source_run, opset, checkpoint_sha256, fast_ops)
    out = Path(out_path)
    with atomic_path(out, suffix=".onnx") as tmp:
        Path(tmp).write_bytes(data)
    return out


def export_onnx(checkpoint_path: str | os.PathLike, out_path: str | os.PathLike, family: str,
                source_run: str | None = None, opset: int | None = None) -> Path:
    """Export a saved model (``tcl.models.load_model``) to ONNX at `out_path`; return the path.

    `source_run` defaults to the ``run_id`` stored in the model's extra info, if any.
    """
    from tcl.models import load_model, resolve_model_path

    try:
        checkpoint_path = resolve_model_path(checkpoint_path)
        model = load_model(checkpoint_path)
    except (ValueError, FileNotFoundError) as exc:
        raise ExportError(str(exc)) from None
    source_run = source_run or model.extra.get("run_id") or ""
    return export_model(model, out_path, family, source_run=source_run, opset=opset,
                        checkpoint_sha256=file_sha256(checkpoint_path))


def read_metadata(onnx_path_or_bytes) -> dict:
    """metadata_props of an ONNX file as a dict (ints for max_len/n_features/opset, config dict)."""
    import onnx

    if isinstance(onnx_path_or_bytes, (bytes, bytearray)):
        proto = onnx.load_from_string(bytes(onnx_path_or_bytes), load_external_data=False)
    else:
        proto = onnx.load(str(onnx_path_or_bytes), load_external_data=False)
    return parse_metadata({p.key: p.value for p in proto.metadata_props})


def parse_metadata(props: dict) -> dict:
    meta = dict(props)
    for k in INT_KEYS:
        if k in meta and str(meta[k]).strip():
            meta[k] = int(meta[k])
    if "config" in meta:
        try:
            meta["config"] = json.loads(meta["config"])
        except ValueError:
            pass
    return meta
