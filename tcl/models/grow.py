"""Grow a trained Mamba cost model into a larger one that computes (almost) the same function.

CKD's AC is larger than the KB (params.yaml ``models.mamba.ac`` vs ``kb``), so the KB's weights
cannot be loaded into it as they are. :func:`grow_mamba` writes them into the leading slices of a
freshly initialised larger net (wider residual stream ``d_model``, inner width ``d_inner``, state
``d_state``, ``dt_rank``, head and more layers) and shrinks every weight that connects a new unit
to the old ones by ``noise``:

* a new residual dimension starts at ~``noise`` (the embedding's new rows are scaled), so every
  old unit reads the old values; each pre-norm RMSNorm's old weights are scaled by
  sqrt(d_small / d_large) because the mean square now runs over more (near-zero) dimensions;
* a new inner channel or state dimension is fed through scaled weights and read through scaled
  weights, so its contribution is O(noise²); its own per-channel parameters (conv taps, dt bias,
  A, D) keep the fresh initialisation, ready to learn;
* a new layer's output projection is scaled, so the block adds ~``noise`` to the residual stream.

``noise = 0`` preserves the function exactly (up to RMSNorm's eps) but leaves the new units with
zero gradients (nothing reads them); a small positive ``noise`` keeps them trainable.
The growth follows Net2Net's function-preserving idea (Chen et al., 2016) for this one net.
"""

from __future__ import annotations

import math

import torch

from tcl.models.nets import MambaNet, RMSNorm


class GrowError(ValueError):
    """The larger net is not a superset of the smaller one."""


def _check(small: MambaNet, large: MambaNet) -> None:
    if not isinstance(small, MambaNet) or not isinstance(large, MambaNet):
        raise GrowError(f"growing needs two Mamba nets, not {type(small).__name__} -> {type(large).__name__}")
    if small.n_features != large.n_features:
        raise GrowError(f"feature widths differ: {small.n_features} vs {large.n_features}")
    if not all(isinstance(n, RMSNorm) for n in [*small.norms, *large.norms, small.norm_f, large.norm_f]):
        raise GrowError("growing needs RMSNorm nets (a LayerNorm's mean moves when dimensions are added)")
    sb, lb = small.blocks[0], large.blocks[0]
    sizes = {"d_model": (small.d_model, large.d_model), "d_inner": (sb.d_inner, lb.d_inner),
             "d_state": (sb.d_state, lb.d_state), "dt_rank": (sb.dt_rank, lb.dt_rank),
             "n_layers": (len(small.blocks), len(large.blocks)),
             "head_hidden": (small.head[0].out_features, large.head[0].out_features)}
    smaller = [f"{k} {s} > {g}" for k, (s, g) in sizes.items() if s > g]
    if smaller or sb.d_conv != lb.d_conv:
        raise GrowError("the larger net must be at least as large in every size and share d_conv: "
                        + ", ".join(smaller + ([f"d_conv {sb.d_conv} != {lb.d_conv}"] if sb.d_conv != lb.d_conv else [])))


def _connect(dst: torch.Tensor, src: torch.Tensor, noise: float, rows=None, cols=None) -> None:
    """dst (fresh) scaled by `noise`, then src pasted: src's rows at `rows` (default its leading
    rows) and columns at `cols` (default the leading ones)."""
    dst.mul_(noise)
    rows = torch.arange(src.shape[0]) if rows is None else rows
    if src.dim() == 1:
        dst[rows] = src
        return
    cols = torch.arange(src.shape[1]) if cols is None else cols
    dst[rows.unsqueeze(1), cols.unsqueeze(0)] = src


def _per_channel(dst: torch.Tensor, src: torch.Tensor, scale: float = 1.0) -> None:
    """src (times `scale`) into the leading entries along dim 0; new channels keep their init."""
    dst[: src.shape[0]] = src * scale


def _block(sb, lb, noise: float) -> None:
    """One Mamba block of the small net into the same layer of the large one."""
    E, El = sb.d_inner, lb.d_inner
    R, N, Rl, Nl = sb.dt_rank, sb.d_state, lb.dt_rank, lb.d_state
    # in_proj rows are [x | z]: the small x rows at 0.., its z rows at El..
    in_rows = torch.cat([torch.arange(E), El + torch.arange(E)])
    _connect(lb.in_proj.weight.data, sb.in_proj.weight.data, noise, rows=in_rows)
    if sb.in_proj.bias is not None and lb.in_proj.bias is not None:
        _connect(lb.in_proj.bias.data, sb.in_proj.bias.data, noise, rows=in_rows)
    _per_channel(lb.conv1d.weight.data, sb.conv1d.weight.data)
    if sb.conv1d.bias is not None and lb.conv1d.bias is not None:
        _per_channel(lb.conv1d.bias.data, sb.conv1d.bias.data)
    # x_proj rows are [dt | B | C]
    xp_rows = torch.cat([torch.arange(R), Rl + torch.arange(N), Rl + Nl + torch.arange(N)])
    _connect(lb.x_proj.weight.data, sb.x_proj.weight.data, noise, rows=xp_rows)
    _connect(lb.dt_proj.weight.data, sb.dt_proj.weight.data, noise)
    _per_channel(lb.dt_proj.bias.data, sb.dt_proj.bias.data)
    lb.A_log.data[:E, :N] = sb.A_log.data  # new state dims keep their fresh -log(n) decay
    _per_channel(lb.D.data, sb.D.data)
    _connect(lb.out_proj.weight.data, sb.out_proj.weight.data, noise)
    if sb.out_proj.bias is not None and lb.out_proj.bias is not None:
        _connect(lb.out_proj.bias.data, sb.out_proj.bias.data, noise)


@torch.no_grad()
def grow_mamba(small: MambaNet, large: MambaNet, noise: float = 0.01) -> MambaNet:
    """Write `small`'s weights into the freshly initialised `large` (in place; returns it) so that
    `large` scores as `small` does, its extra units scaled by `noise` (module docstring)."""
    _check(small, large)
    if not noise >= 0:
        raise GrowError(f"noise must be >= 0, not {noise!r}")
    rms_scale = math.sqrt(small.d_model / large.d_model)
    _connect(large.embed.weight.data, small.embed.weight.data, noise)
    _connect(large.embed.bias.data, small.embed.bias.data, noise)
    for i, (sn, sb) in enumerate(zip(small.norms, small.blocks)):
        _per_channel(large.norms[i].weight.data, sn.weight.data, rms_scale)
        _block(sb, large.blocks[i], noise)
    for lb in large.blocks[len(small.blocks):]:  # new layers: ~identity through the residual
        lb.out_proj.weight.data.mul_(noise)
        if lb.out_proj.bias is not None:
            lb.out_proj.bias.data.mul_(noise)
    _per_channel(large.norm_f.weight.data, small.norm_f.weight.data, rms_scale)
    _connect(large.head[0].weight.data, small.head[0].weight.data, noise)
    _connect(large.head[0].bias.data, small.head[0].bias.data, noise)
    _connect(large.head[2].weight.data, small.head[2].weight.data, noise)
    large.head[2].bias.data.copy_(small.head[2].bias.data)
    return large
