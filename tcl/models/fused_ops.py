"""The Mamba block's sequence ops for torch training on CPU in C++ (``tcl/csrc/scan_grad.cc``).

    y  = scan_fused_tm(u, delta, A, B, C)      # scans.scan_sequential_tm's scan
    xc = conv_silu_fused_tm(x, w, bias)        # silu(depthwise causal conv), (L, b, E)

Each forward and backward is one pass over the data, with autograd through a hand-written
backward, where the torch versions run a dozen small ops per step (the scan) or per tap (the
conv), each over the whole batch, and autograd keeps their intermediates. The library is a plain
shared object built by ``pip install`` (setup.py), loaded with ctypes, which releases the GIL;
rows are split over torch's intra-op thread count. Where it was not built (no C++ compiler), or
for tensors that are not float32 on the CPU, both functions run the torch ops instead
(``scan_method`` "fast" in ``tcl.models.mamba``, which picks "fused" by default where
`available()`). Same results as the torch ops to float rounding (tests/test_mamba.py).
"""

from __future__ import annotations

import ctypes
import functools
from typing import Optional

import torch
import torch.nn.functional as F

from tcl.models.libraries import compiled_library
from tcl.models.onnx_placeholders import causal_conv_shifted
from tcl.models.scans import scan_sequential_tm

__all__ = ["available", "scan_fused_tm", "conv_silu_fused_tm"]


@functools.lru_cache(maxsize=1)
def _library():
    path = compiled_library("_scan_grad")
    if path is None:
        return None
    lib = ctypes.CDLL(str(path))
    i64, f32p, cint = ctypes.c_int64, ctypes.POINTER(ctypes.c_float), ctypes.c_int
    lib.tcl_scan_forward.argtypes = [i64] * 4 + [f32p] * 6 + [cint]
    lib.tcl_scan_backward.argtypes = [i64] * 4 + [f32p] * 11 + [cint]
    lib.tcl_conv_forward.argtypes = [i64] * 4 + [f32p] * 4 + [cint]
    lib.tcl_conv_backward.argtypes = [i64] * 4 + [f32p] * 7 + [cint]
    for fn in (lib.tcl_scan_forward, lib.tcl_scan_backward, lib.tcl_conv_forward, lib.tcl_conv_backward):
        fn.restype = cint
    return lib


def available() -> bool:
    """True where ``tcl/csrc/scan_grad.cc`` was built."""
    return _library() is not None


def _ptr(t: Optional[torch.Tensor]):
    if t is None:
        return None
    return ctypes.cast(t.data_ptr(), ctypes.POINTER(ctypes.c_float))


def _native(*tensors: Optional[torch.Tensor]) -> bool:
    return available() and all(t is None or (t.dtype == torch.float32 and t.device.type == "cpu") for t in tensors)


def _grad_wanted(*tensors: Optional[torch.Tensor]) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


# ---------------------------------------------------------------------------------------------
# the selective scan


def _scan_forward(u, delta, A, B, C) -> torch.Tensor:
    L, batch, E = u.shape
    y = u.new_empty(L, batch, E)
    _library().tcl_scan_forward(L, batch, E, A.shape[1], _ptr(u), _ptr(delta), _ptr(A), _ptr(B), _ptr(C),
                                _ptr(y), torch.get_num_threads())
    return y


class _ScanFn(torch.autograd.Function):
    """The forward keeps only its inputs; the backward recomputes each row's states."""

    @staticmethod
    def forward(ctx, u, delta, A, B, C):
        ctx.save_for_backward(u, delta, A, B, C)
        return _scan_forward(u, delta, A, B, C)

    @staticmethod
    def backward(ctx, gy):
        u, delta, A, B, C = ctx.saved_tensors
        L, batch, E = u.shape
        gy = gy.contiguous()
        g_u, g_delta, g_A, g_B, g_C = (torch.empty_like(t) for t in (u, delta, A, B, C))
        _library().tcl_scan_backward(L, batch, E, A.shape[1], _ptr(u), _ptr(delta), _ptr(A), _ptr(B), _ptr(C),
                                     _ptr(gy), _ptr(g_u), _ptr(g_delta), _ptr(g_A), _ptr(g_B), _ptr(g_C),
                                     torch.get_num_threads())
        return g_u, g_delta, g_A, g_B, g_C


def scan_fused_tm(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                  C: torch.Tensor) -> torch.Tensor:
    """``scans.scan_sequential_tm(u, delta, A, B, C)``: u, delta (L, b, E), delta positive; A (E, N);
    B, C (L, b, N); returns sum_n C_tn h_tn, (L, b, E)."""
    if not _native(u, delta, A, B, C):
        return scan_sequential_tm(u, delta, A, B, C)
    u, delta, A, B, C = (t.contiguous() for t in (u, delta, A, B, C))
    if _grad_wanted(u, delta, A, B, C):
        return _ScanFn.apply(u, delta, A, B, C)
    return _scan_forward(u, delta, A, B, C)


# ---------------------------------------------------------------------------------------------
# the causal conv and its SiLU


def _conv_forward(x, w, bias) -> torch.Tensor:
    L, batch, E = x.shape
    y = x.new_empty(L, batch, E)
    _library().tcl_conv_forward(L, batch, E, w.shape[0], _ptr(x), _ptr(w), _ptr(bias), _ptr(y),
                                torch.get_num_threads())
    return y


class _ConvFn(torch.autograd.Function):
    """The forward keeps only its inputs; the backward recomputes the pre-activations."""

    @staticmethod
    def forward(ctx, x, w, bias):
        ctx.save_for_backward(x, w, bias)
        return _conv_forward(x, w, bias)

    @staticmethod
    def backward(ctx, gy):
        x, w, bias = ctx.saved_tensors
        L, batch, E = x.shape
        gy = gy.contiguous()
        g_x, g_w = torch.empty_like(x), torch.empty_like(w)
        g_bias = None if bias is None else torch.empty_like(bias)
        _library().tcl_conv_backward(L, batch, E, w.shape[0], _ptr(x), _ptr(w), _ptr(bias), _ptr(gy), _ptr(g_x),
                                     _ptr(g_w), _ptr(g_bias), torch.get_num_threads())
        return g_x, g_w, g_bias


def conv_silu_fused_tm(x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """silu(bias + sum_k w_k x_{t-K+1+k}) along dim 0 of x (L, b, E), x_s = 0 for s < 0; w (K, E)
    taps, the last one on the current step; bias (E,) or None."""
    if not _native(x, w, bias):
        return F.silu(causal_conv_shifted(x, w, bias))
    x, w = x.contiguous(), w.contiguous()
    bias = None if bias is None else bias.contiguous()
    if _grad_wanted(x, w, bias):
        return _ConvFn.apply(x, w, bias)
    return _conv_forward(x, w, bias)
