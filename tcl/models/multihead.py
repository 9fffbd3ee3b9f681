"""Multi-task heads (MTL-TLP's transfer baseline): one shared Mamba backbone, one head per platform.

    model = new_model("mtl", n_features, {**kb_config, "platforms": ["src", "target"]}, meta)
    train_model(model, [src_train, target_subset], [target_valid], train_params, out)
    model.predict_features(fs)       # scored by the head of fs.platform (the last platform's when
                                     # the model has no head for it)

The backbone is a ``MambaNet`` (tcl.models.nets) of the given config; its pooled representation
(B, d_model) is shared and each platform's head, the backbone's own head shape, scores it. In
training each batch holds one platform's programs (tcl.training never mixes platforms) and goes
through that platform's head (``score_batch``), so the backbone learns from every platform and
each head from its own. The config's ``platforms`` name the heads in order; the last is the
default head (the target's) that ``predict`` and ``embed`` read when no platform is named.
"""

from __future__ import annotations

import contextlib
import copy

import torch
from torch import nn

from tcl.models.nets import DEFAULTS, MambaNet, NetCostModel


class MultiHeadNet(nn.Module):
    """A ``MambaNet`` backbone whose head is replaced by one head per platform."""

    kind = "mtl"

    def __init__(self, n_features: int, platforms: list[str] | tuple[str, ...] = (), **backbone) -> None:
        super().__init__()
        if not platforms or len(set(platforms)) != len(platforms):
            raise ValueError(f"mtl needs distinct platform names, one head each (got {list(platforms)!r})")
        self.platforms = [str(p) for p in platforms]
        self.backbone = MambaNet(n_features, **backbone)
        head = self.backbone.head
        self.backbone.head = nn.Identity()  # the per-platform heads below score the pooled representation
        self.heads = nn.ModuleList([_fresh_copy(head) for _ in self.platforms])
        self.active = len(self.platforms) - 1  # the head `forward` uses: the last platform's (the target)

    def head_index(self, platform: str | None) -> int:
        """The head of `platform`; the default head when None or not one of the model's platforms."""
        return self.platforms.index(platform) if platform in self.platforms else len(self.platforms) - 1

    def pool(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.backbone.pool(x, mask)  # (B, d_model)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.heads[self.active](self.backbone.dropout(self.pool(x, mask))).squeeze(-1)  # (B,)


def _fresh_copy(module: nn.Module) -> nn.Module:
    """A copy of `module` with its own freshly drawn initial weights (torch's global RNG)."""
    out = copy.deepcopy(module)
    for m in out.modules():
        if hasattr(m, "reset_parameters"):
            m.reset_parameters()
    return out


class MultiHeadModel(NetCostModel):
    """MTL-TLP-style baseline behind the CostModel interface (not exported to ONNX: a transfer
    baseline, never served)."""

    kind = "mtl"
    net_class = MultiHeadNet
    defaults = {"platforms": [], **DEFAULTS["mamba"]}
    optional_keys = frozenset({"dt_rank"})
    onnx_export = False

    @contextlib.contextmanager
    def head_of(self, platform: str | None):
        """`forward` scores with `platform`'s head inside the block (the default head when the
        model has none for it)."""
        before = self.net.active
        self.net.active = self.net.head_index(platform)
        try:
            yield
        finally:
            self.net.active = before

    def score_batch(self, x, mask, platform: str | None = None):
        with self.head_of(platform):
            return self.net(x, mask)

    def predict_features(self, fs, batch_size: int = 4096, dropout: bool = False):
        with self.head_of(getattr(fs, "platform", None)):
            return super().predict_features(fs, batch_size, dropout)

    def to_onnx(self, max_len: int, opset: int = 17) -> bytes:
        raise NotImplementedError("mtl models (a transfer baseline) have no ONNX export")
