"""The Mamba block's ONNX placeholders: torch ops that trace as one custom node each.

Under the TorchScript ONNX exporter the block's conv + SiLU traces as ``tcl.CausalConv1d`` and its
dt bias, softplus, scan, D skip and gate as ``tcl.SelectiveScan``; ``tcl.models.mamba_onnx``
lowers both to standard ops (and fuses them back for serving). In eager mode they compute the
same thing with the sequential scan.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from tcl.models.scans import _scan_forward

__all__ = ["selective_scan_placeholder", "causal_conv1d_placeholder", "causal_conv_shifted"]


class _SelectiveScanPlaceholder(torch.autograd.Function):
    """Eager: softplus, sequential scan, D skip and gate; under the TorchScript ONNX exporter: one
    ``tcl.SelectiveScan`` node (``tcl.models.mamba_onnx`` lowers it to standard ops)."""

    @staticmethod
    def forward(ctx, u, delta, A, B, C, D, z, delta_bias):
        y = _scan_forward(u, F.softplus(delta + delta_bias), A, B, C)[0]
        return torch.addcmul(y, u, D) * F.silu(z)

    @staticmethod
    def symbolic(g, u, delta, A, B, C, D, z, delta_bias):
        from tcl.models.mamba_onnx import DOMAIN, OP_TYPE

        out = g.op(f"{DOMAIN}::{OP_TYPE}", u, delta, A, B, C, D, z, delta_bias, delta_softplus_i=1)
        out.setType(u.type())
        return out


def selective_scan_placeholder(u, delta, A, B, C, D, z, delta_bias):
    """u, delta (before bias and softplus), z (L, b, E); A (E, N); B, C (L, b, N); D, delta_bias
    (E,) -> y (L, b, E), as mamba-ssm's ``selective_scan_fn(..., delta_bias,
    delta_softplus=True)`` time-major. Exports as one
    ``tcl.SelectiveScan`` node that ``tcl.models.mamba_onnx.lower_selective_scan`` replaces by
    standard ops."""
    return _SelectiveScanPlaceholder.apply(u, delta, A, B, C, D, z, delta_bias)


def causal_conv_shifted(x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """Depthwise causal conv along dim 0 of x (L, b, E) with taps w (K, E): pad K-1 steps in
    front, add K shifted slices times their tap."""
    K, L = w.shape[0], x.shape[0]
    xp = F.pad(x, [0, 0, 0, 0, K - 1, 0])
    out = xp[K - 1:] * w[K - 1]
    if bias is not None:
        out = out + bias
    for k in range(K - 1):
        out = out + xp[k:k + L] * w[k]
    return out


class _CausalConvPlaceholder(torch.autograd.Function):
    """Eager: silu(causal conv); under the TorchScript ONNX exporter: one ``tcl.CausalConv1d``
    node (``tcl.models.mamba_onnx`` lowers it to standard ops)."""

    @staticmethod
    def forward(ctx, x, w, bias, kernel_size):
        # F.conv1d, not causal_conv_shifted: the tracer records this body too, and the shifted
        # slices' trace broke the TorchScript exporter when a second placeholder followed
        L, E = x.shape[0], x.shape[2]
        y = F.conv1d(x.permute(1, 2, 0), w.t().unsqueeze(1), bias, padding=kernel_size - 1, groups=E)
        return F.silu(y[..., :L].permute(2, 0, 1))

    @staticmethod
    def symbolic(g, x, w, bias, kernel_size):
        from tcl.models.mamba_onnx import CONV_OP_TYPE, DOMAIN

        inputs = (x, w) if bias is None else (x, w, bias)
        out = g.op(f"{DOMAIN}::{CONV_OP_TYPE}", *inputs, silu_i=1, kernel_size_i=int(kernel_size))
        out.setType(x.type())
        return out


def causal_conv1d_placeholder(x, w, bias):
    """silu(depthwise causal conv) of x (L, b, E) with taps w (K, E) and bias (E,) or None.
    Exports as one ``tcl.CausalConv1d`` node (lowered like ``tcl.SelectiveScan``)."""
    return _CausalConvPlaceholder.apply(x, w, bias, int(w.shape[0]))
