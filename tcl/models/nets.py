"""Neural cost models over step sequences: Mamba (TCL), Tenset-MLP and TLP (attention).

Each kind is a ``torch.nn.Module`` (``MambaNet``, ``MLPNet``, ``TLPNet``) mapping ``x`` (B, L, F)
float32 and ``mask`` (B, L) bool (True on real steps, padding at the end) to a score (B,) float32,
higher = faster, read by a head from ``net.pool(x, mask)`` (B, D); and a ``CostModel``
(``MambaModel``, ``MLPModel``, ``TLPModel``, tcl.models.base) that wraps the net with
predict/embed/fit/save/load. All export to ONNX (opset 17) with dynamic batch and sequence axes;
see :func:`export_onnx`.

``build_net(kind, n_features, **config)`` builds a net; ``flops_per_prediction(net, seq_len)`` is
an analytic FLOP count (2 x multiply-adds; element-wise products count 1) of one forward pass.
Checkpoints: ``save_checkpoint`` (tcl.models.checkpoint) / :func:`load_checkpoint`.
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path
from typing import Optional

import numpy as np

import torch
import torch.nn.functional as F
from torch import nn

from tcl.models.base import CostModel
from tcl.models.checkpoint import read_checkpoint, save_checkpoint
from tcl.models.mamba import Mamba, exporting

__all__ = [
    "DEFAULTS",
    "build_net",
    "load_checkpoint",
    "count_parameters",
    "model_size_mb",
    "flops_per_prediction",
    "export_onnx",
    "MambaNet",
    "MLPNet",
    "TLPNet",
    "NetCostModel",
    "MambaModel",
    "MLPModel",
    "TLPModel",
    "RMSNorm",
]

DEFAULTS: dict[str, dict] = {
    "mamba": {"d_model": 64, "n_layers": 1, "d_state": 8, "expand": 1, "d_conv": 4,
              "norm": "rms", "head_hidden": None, "dropout": 0.0, "max_len": None,
              "block_rows": None},
    "mlp": {"hidden": 256, "n_layers": 3, "dropout": 0.0},
    "tlp": {"d_model": 128, "n_heads": 4, "n_layers": 2, "ff_mult": 2, "dropout": 0.0,
            "max_len": 256},
}


class RMSNorm(nn.Module):
    """Root-mean-square norm (torch's fused kernel in eager, written out for ONNX export)."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if exporting():  # opset 17 has no RMSNormalization: the written-out form
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)  # fused: ~10x faster on CPU


def _norm(kind: str, dim: int) -> nn.Module:
    if kind == "rms":
        return RMSNorm(dim)
    if kind == "layer":
        return nn.LayerNorm(dim)
    raise ValueError(f"norm must be 'rms' or 'layer', not {kind!r}")


def _valid_lens(mask: torch.Tensor) -> torch.Tensor:
    """Per row, one past its last valid step (0 for a row with none)."""
    m = mask.bool()
    L = m.shape[1]
    return torch.where(m.any(1), L - m.flip(1).int().argmax(1), 0)


def _valid_len(mask: torch.Tensor) -> int:
    """One past the last valid step of any row."""
    return int(_valid_lens(mask).max()) if mask.shape[0] else 0


def _masked_mean(h: torch.Tensor, m: torch.Tensor, dim: int) -> torch.Tensor:
    """Mean of h over `dim` where m (same rank, float, size-1 last dim) is 1."""
    return (h * m).sum(dim) / m.sum(dim).clamp(min=1.0)


def _linear_flops(layer: nn.Linear) -> int:
    return 2 * layer.in_features * layer.out_features + (layer.out_features if layer.bias is not None else 0)


def _norm_flops(dim: int) -> int:
    return 4 * dim


# ---------------------------------------------------------------------------------------------
# Mamba


class MambaNet(nn.Module):
    """Linear embedding -> n_layers x (pre-norm Mamba block + residual) -> norm -> masked mean
    (the pooled representation) -> MLP head -> score.

    Internally time-major (L, B, d): one transpose of the input, contiguous per-step slices for
    the scan.  In CPU inference (no autograd) rows are sorted by valid length and run in blocks
    of ``block_rows`` programs, each cropped to its longest row, so intermediates stay in cache
    and padding is not computed (same results, row by row); None: 128 per intra-op thread
    (64..512), 0: one block.
    """

    kind = "mamba"
    skips_padding = True  # CPU inference computes each block only up to its longest row

    def __init__(self, n_features: int, d_model: int = 64, n_layers: int = 1, d_state: int = 8,
                 expand: int = 1, d_conv: int = 4, norm: str = "rms", head_hidden: Optional[int] = None,
                 dropout: float = 0.0, max_len: Optional[int] = None, block_rows: Optional[int] = None,
                 dt_rank: int | str = "auto") -> None:
        super().__init__()
        self.n_features = n_features
        self.d_model = d_model
        self.block_rows = None if block_rows is None else int(block_rows)
        head_hidden = int(head_hidden or d_model)
        self.embed = nn.Linear(n_features, d_model)
        self.norms = nn.ModuleList([_norm(norm, d_model) for _ in range(n_layers)])
        self.blocks = nn.ModuleList([
            Mamba(d_model, d_state=d_state, d_conv=d_conv, expand=expand, dt_rank=dt_rank,
                  layer_idx=i, max_len=max_len)
            for i in range(n_layers)
        ])
        self.norm_f = _norm(norm, d_model)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Sequential(nn.Linear(d_model, head_hidden), nn.SiLU(), nn.Linear(head_hidden, 1))

    def set_scan_method(self, method: str) -> None:
        for b in self.blocks:
            b.scan_method = method

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.head(self.dropout(self.pool(x, mask))).squeeze(-1)

    def pool(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The pooled representation (B, d_model) the head scores."""
        if x.is_cuda or exporting() or x.shape[0] == 0:
            return self._pool(x, mask)
        if torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters()):
            # training: cropped to the batch's longest row (a task's programs are often well
            # under max_len); the steps after it are masked out, so they change no score or gradient
            n = max(1, _valid_len(mask))
            return self._pool(x[:, :n], mask[:, :n])
        return self._pool_blocks(x, mask)

    def _pool_blocks(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """CPU inference: rows sorted by valid length, in blocks of ``block_rows``, each block
        cropped to its longest row. Same result as ``_pool``: the scan is causal and pooling
        masked, so steps after a row's last valid one change nothing; they are just not computed."""
        bs, L = mask.shape
        rows = self.block_rows
        if rows is None:
            rows = min(512, max(64, 128 * torch.get_num_threads()))
        rows = rows or bs
        lengths = _valid_lens(mask)
        if bs <= rows:  # one block: crop, no reordering
            n = max(1, int(lengths.max()))
            return self._pool(x[:, :n], mask[:, :n])
        order = torch.argsort(lengths, stable=True)
        out = x.new_empty(bs, self.d_model)
        for i in range(0, bs, rows):
            idx = order[i:i + rows]
            n = max(1, int(lengths[idx[-1]]))
            out[idx] = self._pool(x[idx, :n], mask[idx, :n])
        return out

    def _pool(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.embed(x.transpose(0, 1))  # (L, B, d)
        for norm, block in zip(self.norms, self.blocks):
            h = h + block(norm(h), time_major=True)
        h = self.norm_f(h)
        m = mask.transpose(0, 1).unsqueeze(-1).to(h.dtype)  # (L, B, 1)
        return _masked_mean(h, m, 0)  # (B, d)

    def flops(self, seq_len: int) -> int:
        d = self.d_model
        per_token = _linear_flops(self.embed) + len(self.blocks) * (_norm_flops(d) + d) + _norm_flops(d) + 2 * d
        total = per_token * seq_len + sum(b.flops(seq_len) for b in self.blocks)
        total += sum(_linear_flops(m) for m in self.head if isinstance(m, nn.Linear))
        return int(total)


# ---------------------------------------------------------------------------------------------
# Tenset-MLP


class MLPNet(nn.Module):
    """Tenset-MLP: per-step MLP encoder -> masked SUM over steps -> LayerNorm -> 2 residual
    layers -> linear decoder (Tenset uses BatchNorm there; LayerNorm keeps train/eval equal)."""

    kind = "mlp"

    def __init__(self, n_features: int, hidden: int = 256, n_layers: int = 3, dropout: float = 0.0) -> None:
        super().__init__()
        self.n_features = n_features
        self.hidden = hidden
        layers: list[nn.Module] = []
        dim = n_features
        for _ in range(max(1, n_layers)):
            layers += [nn.Linear(dim, hidden), nn.ReLU()]
            dim = hidden
        self.encoder = nn.Sequential(*layers)
        self.norm = nn.LayerNorm(hidden)
        self.l0 = nn.Linear(hidden, hidden)
        self.l1 = nn.Linear(hidden, hidden)
        self.dropout = nn.Dropout(dropout)
        self.decoder = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.dropout(self.pool(x, mask))).squeeze(-1)

    def pool(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The representation (B, hidden) the decoder scores."""
        h = self.encoder(x)  # (B, L, H)
        h = (h * mask.unsqueeze(-1).to(h.dtype)).sum(1)
        h = self.norm(h)
        h = F.relu(self.l0(h)) + h
        return F.relu(self.l1(h)) + h

    def flops(self, seq_len: int) -> int:
        enc = sum(_linear_flops(m) for m in self.encoder if isinstance(m, nn.Linear))
        H = self.hidden
        head = _norm_flops(H) + _linear_flops(self.l0) + _linear_flops(self.l1) + 2 * H + _linear_flops(self.decoder)
        return int(seq_len * (enc + 2 * H) + head)


# ---------------------------------------------------------------------------------------------
# TLP


class EncoderLayer(nn.Module):
    """Pre-norm transformer encoder layer with the attention written out (softmax(QK^T/sqrt(d)
    + key bias) V), so the traced ONNX graph keeps batch and length dynamic (torch's fused MHA /
    encoder fast path bakes them in or has no ONNX form)."""

    def __init__(self, d_model: int, n_heads: int, ff: int, dropout: float = 0.0) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model {d_model} is not a multiple of n_heads {n_heads}")
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.norm1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.ff = nn.Sequential(nn.Linear(d_model, ff), nn.GELU(), nn.Dropout(dropout), nn.Linear(ff, d_model))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, key_bias: torch.Tensor) -> torch.Tensor:
        """x (B, L, d); key_bias (B, L) additive (0 or -inf) on the keys."""
        B, L, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(B, L, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        att = torch.matmul(q, k.transpose(-1, -2)) * (self.head_dim ** -0.5) + key_bias[:, None, None, :]
        att = self.drop(torch.softmax(att, dim=-1))
        a = torch.matmul(att, v).transpose(1, 2).reshape(B, L, d)
        x = x + self.drop(self.out(a))
        return x + self.drop(self.ff(self.norm2(x)))


class TLPNet(nn.Module):
    """TLP-style attention model: linear embedding + learned positions -> n_layers pre-norm
    transformer encoder layers (key padding mask from `mask`) -> LayerNorm -> masked mean ->
    MLP head."""

    kind = "tlp"

    def __init__(self, n_features: int, d_model: int = 128, n_heads: int = 4, n_layers: int = 2,
                 ff_mult: int = 2, dropout: float = 0.0, max_len: int = 256) -> None:
        super().__init__()
        self.n_features = n_features
        self.d_model = d_model
        self.n_layers = n_layers
        self.ff = ff_mult * d_model
        self.max_len = max_len
        self.embed = nn.Linear(n_features, d_model)
        self.pos = nn.Parameter(torch.zeros(max_len, d_model))
        nn.init.normal_(self.pos, std=0.02)
        self.layers = nn.ModuleList([EncoderLayer(d_model, n_heads, self.ff, dropout) for _ in range(n_layers)])
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Sequential(nn.Linear(d_model, d_model), nn.ReLU(), nn.Linear(d_model, 1))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.head(self.pool(x, mask)).squeeze(-1)

    def pool(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The masked mean (B, d_model) of the encoded steps, which the head scores."""
        L = x.shape[1]
        h = self.embed(x) + self.pos[:L]
        # a program with no real step attends over its padding (finite output, pooled to 0)
        pad = torch.logical_and(~mask, mask.any(1, keepdim=True))
        bias = torch.zeros_like(pad, dtype=h.dtype).masked_fill(pad, float("-inf"))
        for layer in self.layers:
            h = layer(h, bias)
        h = self.norm(h)
        return _masked_mean(h, mask.unsqueeze(-1).to(h.dtype), 1)

    def flops(self, seq_len: int) -> int:
        d, L, ff = self.d_model, seq_len, self.ff
        per_layer_token = (
            2 * _norm_flops(d)
            + 2 * d * 3 * d       # qkv projection
            + 2 * L * d * 2       # scores + weighted sum over L keys
            + 2 * d * d           # output projection
            + 2 * d * ff * 2      # feed-forward
        )
        per_token = _linear_flops(self.embed) + d + self.n_layers * per_layer_token + _norm_flops(d) + 2 * d
        head = sum(_linear_flops(m) for m in self.head if isinstance(m, nn.Linear))
        return int(per_token * L + head)


# ---------------------------------------------------------------------------------------------
# construction, presets, accounting


def build_net(kind: str, n_features: int, **config) -> nn.Module:
    """A net of `kind` (mamba | mlp | tlp) for F = n_features; unknown config keys raise."""
    if kind not in NET_MODELS:
        raise ValueError(f"unknown net kind {kind!r}; expected one of {tuple(NET_MODELS)}")
    return NET_MODELS[kind].build_net(n_features, config)


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu"
                    ) -> tuple[nn.Module, dict]:
    """(net in eval mode, info) from a checkpoint written by ``save_checkpoint``; the net is
    rebuilt from the recorded kind and config and its tensors loaded strictly."""
    state, info = read_checkpoint(path, map_location)
    net = build_net(info["kind"], int(info["n_features"]), **info["config"])
    net.load_state_dict(state, strict=True)
    net.eval()
    return net, info


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    return int(sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only))


def model_size_mb(model: nn.Module) -> float:
    """Size of the parameters and buffers as fp32, in MB (1e6 bytes)."""
    n = count_parameters(model) + sum(b.numel() for b in model.buffers())
    return n * 4 / 1e6


def flops_per_prediction(model: nn.Module, seq_len: int) -> int:
    """Analytic FLOPs of one program of `seq_len` steps (2 x multiply-adds of the layers,
    element-wise products 1 each; exp/log/sigmoid not counted)."""
    fn = getattr(model, "flops", None)
    if fn is None:
        raise TypeError(f"{type(model).__name__} has no analytic FLOP count")
    return int(fn(int(seq_len)))


def export_onnx(model: nn.Module, f, n_features: int, max_len: int = 48, opset: int = 17,
                dynamo: bool = False) -> None:
    """torch.onnx.export with inputs ``x``/``mask``, output ``score``, dynamic batch and length.

    Traced at length `max_len`. Mamba blocks export their scan as an ONNX ``Scan`` loop over the
    input's steps (``tcl.models.mamba_onnx``; any length); under the dynamo exporter, unrolled
    for L <= max_len (a doubling scan beyond 128). MLP/TLP graphs take any length (TLP up to its
    position table).  `f` is a path or a binary file object.
    """
    import warnings

    import onnx

    from tcl.models.mamba_onnx import lower_selective_scan

    model = model.eval()
    x = torch.randn(2, max_len, n_features)
    mask = torch.ones(2, max_len, dtype=torch.bool)
    mask[1, max(1, max_len // 2):] = False
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if dynamo:
            batch, length = torch.export.Dim("batch"), torch.export.Dim("length", max=1024)
            prog = torch.onnx.export(model, (x, mask), input_names=["x", "mask"], output_names=["score"],
                                     opset_version=opset, dynamo=True, external_data=False,
                                     dynamic_shapes={"x": {0: batch, 1: length}, "mask": {0: batch, 1: length}})
            data = prog.model_proto.SerializeToString()
        else:
            buf = io.BytesIO()
            torch.onnx.export(model, (x, mask), buf, input_names=["x", "mask"], output_names=["score"],
                              opset_version=opset, dynamo=False, do_constant_folding=True,
                              dynamic_axes={"x": {0: "batch", 1: "length"},
                                            "mask": {0: "batch", 1: "length"}, "score": {0: "batch"}})
            proto = onnx.load_from_string(buf.getvalue())
            lower_selective_scan(proto)  # Mamba blocks trace their scan as a placeholder node
            data = proto.SerializeToString()
    if hasattr(f, "write"):
        f.write(data)
    else:
        Path(f).write_bytes(data)


# ---------------------------------------------------------------------------------------------
# the nets as CostModels (tcl.models.base)


@contextlib.contextmanager
def _inference(net: nn.Module, dropout: bool | float):
    """Eval mode and no autograd; with `dropout`, the Dropout layers stay on (MC dropout), and a
    rate (a float, not True) runs the layers at p 0 at that rate (restored after)."""
    was_training = net.training
    net.eval()
    switched = []
    if dropout:
        for m in net.modules():
            if isinstance(m, nn.Dropout):
                m.train()
                if not isinstance(dropout, bool) and m.p == 0:
                    m.p = float(dropout)
                    switched.append(m)
    try:
        with torch.inference_mode():
            yield
    finally:
        for m in switched:
            m.p = 0.0
        net.train(was_training)


@contextlib.contextmanager
def _scan_bound(net: nn.Module, max_len: int):
    """Bound the Mamba blocks' export scan to the features' max_len while exporting: a block
    built with a larger bound (e.g. 1024) would export the doubling scan instead of the per-step
    one, for nothing (the server refuses inputs longer than the features' max_len)."""
    saved = [(m, m.max_len) for m in net.modules()
             if isinstance(m, Mamba) and (m.max_len or 0) > max_len]
    for m, _ in saved:
        m.max_len = int(max_len)
    try:
        yield
    finally:
        for m, v in saved:
            m.max_len = v


class NetCostModel(CostModel):
    """A torch net behind the CostModel interface; trained by ``tcl.training.fit_net``.
    A subclass names its ``net_class`` and the ``defaults`` of its config."""

    onnx_export = True
    net_class: type[nn.Module]
    defaults: dict = {}
    optional_keys: frozenset = frozenset()  # config keys accepted without a default

    def __init__(self, n_features: int, config: dict | None = None, feature_meta: dict | None = None,
                 net: nn.Module | None = None):
        super().__init__(n_features, config, feature_meta)
        self.net = net if net is not None else self.build_net(self.n_features, self.config)
        # named tensors saved with the weights (continual learning's EWC state); not the net's
        self.aux_tensors: dict[str, torch.Tensor] = {}

    @classmethod
    def build_net(cls, n_features: int, config: dict) -> nn.Module:
        """The net for F = n_features; unknown config keys raise."""
        allowed = set(cls.defaults) | set(cls.optional_keys)
        unknown = set(config) - allowed
        if unknown:
            raise ValueError(f"unknown {cls.kind} config keys: {sorted(unknown)} (allowed: {sorted(allowed)})")
        return cls.net_class(int(n_features), **{**cls.defaults, **config})

    @staticmethod
    def _tensors(x, mask) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)),
                torch.from_numpy(np.ascontiguousarray(mask, dtype=bool)))

    def predict(self, x, mask, dropout: bool | float = False) -> np.ndarray:
        xt, mt = self._tensors(x, mask)
        with _inference(self.net, dropout):
            return self.net(xt, mt).double().numpy()

    def embed(self, x, mask) -> np.ndarray:
        xt, mt = self._tensors(x, mask)
        with _inference(self.net, False):
            return self.net.pool(xt, mt).float().numpy()

    def score_batch(self, x: torch.Tensor, mask: torch.Tensor, platform: str | None = None) -> torch.Tensor:
        """Scores (B,) of a training batch of one platform's programs, with autograd (a kind with
        one head per platform, tcl.models.multihead, scores with `platform`'s)."""
        return self.net(x, mask)

    def fit(self, train_sets, valid_sets, train_params, out_dir, run=None, progress=None,
            resume=True, trainable=None, extra_losses=None) -> list[dict]:
        from tcl.training import fit_net

        return fit_net(self, train_sets, valid_sets, train_params, out_dir, run=run,
                       progress=progress, resume=resume, trainable=trainable,
                       extra_losses=extra_losses)

    def save(self, path, extra: dict | None = None) -> Path:
        return save_checkpoint(path, self.net, self.kind, self.config, self.feature_meta, extra,
                               aux_tensors=self.aux_tensors)

    @classmethod
    def load(cls, path) -> "NetCostModel":
        state, info = read_checkpoint(path)
        model_cls = cls if info["kind"] == cls.kind else NET_MODELS.get(info["kind"])
        if model_cls is None or not issubclass(model_cls, cls):
            raise ValueError(f"{path} holds a {info['kind']} model, not {cls.kind}")
        model = model_cls(int(info["n_features"]), info.get("config"), info.get("feature_meta"))
        model.net.load_state_dict(state, strict=True)
        model.net.eval()
        model.extra = dict(info.get("extra") or {})
        model.aux_tensors = dict(info["aux_tensors"])
        return model

    def to_onnx(self, max_len: int, opset: int = 17) -> bytes:
        """The TorchScript exporter first (small graphs, honours the opset), torch.export if it
        fails; traced at `max_len` (the Mamba export scan is valid for L <= it)."""
        import warnings

        errors = []
        self.net.eval()
        for dynamo in (False, True):
            buf = io.BytesIO()
            try:
                with warnings.catch_warnings(), _scan_bound(self.net, max_len):
                    warnings.simplefilter("ignore")
                    export_onnx(self.net, buf, self.n_features, max_len, opset=opset, dynamo=dynamo)
                return buf.getvalue()
            except Exception as exc:  # noqa: BLE001 - try the other exporter, report both
                errors.append(f"{'dynamo' if dynamo else 'torchscript'}: {type(exc).__name__}: {exc}")
        raise RuntimeError("ONNX export failed:\n  " + "\n  ".join(errors))


class MambaModel(NetCostModel):
    kind = "mamba"
    net_class = MambaNet
    defaults = DEFAULTS["mamba"]
    optional_keys = frozenset({"dt_rank"})
    default_preset = "kb"  # params.yaml models.mamba.kb: the deployed KB


class MLPModel(NetCostModel):
    kind = "mlp"
    net_class = MLPNet
    defaults = DEFAULTS["mlp"]


class TLPModel(NetCostModel):
    kind = "tlp"
    net_class = TLPNet
    defaults = DEFAULTS["tlp"]


NET_MODELS: dict[str, type[NetCostModel]] = {m.kind: m for m in (MambaModel, MLPModel, TLPModel)}
