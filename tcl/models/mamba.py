"""A pure-PyTorch Mamba (S6) block, parameter-compatible with ``mamba_ssm``.

``Mamba`` has exactly the parameters of ``mamba_ssm.modules.mamba_simple.Mamba`` (same names,
shapes and official initialisation), so a ``state_dict`` loads strictly in both directions.

Selective-scan implementations of the same recurrence

    h_t = exp(delta_t * A) * h_{t-1} + delta_t * B_t * u_t,     y_t = C_t . h_t + D * u_t

* ``selective_scan_ref`` -- the direct recurrence (a Python loop over time that materialises
  (B, E, L, N)); slow, used as the reference in tests and as the "naive" benchmark baseline.
* ``scan_sequential_tm`` -- the CPU path for training and inference.  Time-major layout
  (L, B, ...), the state kept as (B, N, E) so every element-wise op runs over a contiguous
  inner dimension of size E, one time step at a time, in place (no (B, L, E, N) tensor), and
  ``exp2`` instead of ``exp`` (about 3x cheaper on AVX-512).  Training goes through
  ``_SelectiveScanFn``: a hand-written backward that recomputes states from sqrt(L)
  checkpoints (exact; memory O(sqrt(L) B N E)).
* ``scan_unrolled_tm`` -- export form for short programs: pad to ``max_len`` steps, unrolled
  recurrence, crop back.  Dynamic batch and length (any L <= max_len), per-step tensors only.
* ``scan_parallel_tm`` -- export form for long programs: a fixed-step doubling (Hillis-Steele)
  scan of the linear recurrence with ``ceil(log2(max_len))`` steps, valid for any
  L <= max_len, no data-dependent control flow.

* ``loop`` -- export form for serving: one placeholder node for softplus, scan, D skip and gate,
  which ``tcl.models.mamba_onnx`` lowers to an ONNX ``Scan`` over exactly the input's steps (no
  padding, any length) and ``tcl.serving`` fuses back into TCL's onnxruntime operator.

Under the TorchScript ONNX exporter (``tcl.models.nets.export_onnx``) the block exports
``loop``.  Under torch.export (the dynamo exporter, a fallback) it picks ``unrolled`` when its
export length bound is <= ``UNROLL_MAX`` (128), else ``parallel``; all export with dynamic batch
and sequence axes.  The bound is the block's ``max_len``, or when that is None (the default) the
sequence length the export traces with -- so trace at the featurizer's max_len (``tcl.export`` does).

On CUDA, when ``mamba_ssm`` (and optionally ``causal_conv1d``) is importable, the block
dispatches to the official kernels; ``mamba_ssm`` stays an optional dependency.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "Mamba",
    "selective_scan_ref",
    "selective_scan",
    "scan_sequential_tm",
    "scan_parallel_tm",
    "scan_unrolled_tm",
    "cuda_kernels_available",
    "SCAN_METHODS",
]

SCAN_METHODS = ("auto", "fast", "parallel", "unrolled", "loop", "ref", "cuda")
UNROLL_MAX = 128  # export unrolled up to this max_len, as a doubling scan beyond
_LOG2E = 1.4426950408889634

# ---------------------------------------------------------------------------------------------
# optional official CUDA kernels (guarded, imported lazily on first CUDA forward)

_CUDA_KERNELS: Optional[tuple] = None


def _load_cuda_kernels() -> tuple:
    """(selective_scan_fn or None, causal_conv1d_fn or None); never raises."""
    global _CUDA_KERNELS
    if _CUDA_KERNELS is None:
        scan_fn = conv_fn = None
        try:  # pragma: no cover - needs mamba-ssm + CUDA
            from mamba_ssm.ops.selective_scan_interface import selective_scan_fn as scan_fn
        except Exception:  # ImportError, or its CUDA extension failing to load
            scan_fn = None
        try:  # pragma: no cover - needs causal-conv1d + CUDA
            from causal_conv1d import causal_conv1d_fn as conv_fn
        except Exception:
            conv_fn = None
        _CUDA_KERNELS = (scan_fn, conv_fn)
    return _CUDA_KERNELS


def cuda_kernels_available() -> bool:
    return torch.cuda.is_available() and _load_cuda_kernels()[0] is not None


def _dynamo_exporting() -> bool:
    """True while torch.export (the dynamo ONNX exporter) traces the model."""
    try:
        return bool(torch.compiler.is_exporting())
    except AttributeError:  # older torch
        return False


def _exporting() -> bool:
    """True while torch.onnx / torch.export traces the model."""
    return torch.onnx.is_in_onnx_export() or _dynamo_exporting()


# ---------------------------------------------------------------------------------------------
# selective scans


def selective_scan_ref(
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: Optional[torch.Tensor] = None,
    z: Optional[torch.Tensor] = None,
    delta_bias: Optional[torch.Tensor] = None,
    delta_softplus: bool = False,
) -> torch.Tensor:
    """Reference selective scan, in mamba_ssm's layout and argument convention.

    u, delta, z: (batch, E, L); A: (E, N); B, C: (batch, N, L); D, delta_bias: (E,).
    Returns (batch, E, L).  A plain loop over time, computed in float32.
    """
    dtype = u.dtype
    u, delta, A, B, C = u.float(), delta.float(), A.float(), B.float(), C.float()
    if delta_bias is not None:
        delta = delta + delta_bias.float()[:, None]
    if delta_softplus:
        delta = F.softplus(delta)
    batch, E, L = u.shape
    N = A.shape[1]
    # (batch, E, L, N): the memory-hungry part the fast paths avoid
    decay = torch.exp(delta.unsqueeze(-1) * A[:, None, :])
    drive = (delta * u).unsqueeze(-1) * B.transpose(1, 2).unsqueeze(1)
    h = u.new_zeros(batch, E, N)
    ys = []
    for t in range(L):
        h = decay[:, :, t] * h + drive[:, :, t]
        ys.append(torch.einsum("ben,bn->be", h, C[:, :, t]))
    y = torch.stack(ys, dim=-1)
    if D is not None:
        y = y + u * D.float()[:, None]
    if z is not None:
        y = y * F.silu(z.float())
    return y.to(dtype)


def _scan_forward(u, delta, A, B, C, ckpt_every: int = 0):
    """The in-place sequential scan (no autograd).  Returns (y (L, b, E), checkpoints) where
    checkpoints (n_chunks - 1, b, N, E) hold the state entering each chunk of `ckpt_every`
    steps after the first (None when ckpt_every is 0)."""
    L, batch, E = u.shape
    N = A.shape[1]
    a2 = (A * _LOG2E).t().contiguous()  # (N, E); exp(x) == exp2(x * log2 e), exp2 is ~3x cheaper
    du = (delta * u).unsqueeze(2)  # (L, b, 1, E)
    dl = delta.unsqueeze(2)  # (L, b, 1, E)
    Bn = B.unsqueeze(3)  # (L, b, N, 1)
    Cn = C.unsqueeze(2).contiguous()  # (L, b, 1, N)
    y = u.new_empty(L, batch, 1, E)
    ckpts = None
    if ckpt_every:
        ckpts = u.new_empty(max(0, -(-L // ckpt_every) - 1), batch, N, E)
    h = torch.mul(du[0], Bn[0]) if L else u.new_zeros(batch, N, E)
    dA = u.new_empty(batch, N, E)
    for t in range(L):
        if t:
            torch.mul(dl[t], a2, out=dA)
            dA.exp2_()
            h.mul_(dA).addcmul_(du[t], Bn[t])
        torch.bmm(Cn[t], h, out=y[t])
        if ckpts is not None and (t + 1) % ckpt_every == 0 and t + 1 < L:
            ckpts[(t + 1) // ckpt_every - 1].copy_(h)
    return y.squeeze(2), ckpts


class _SelectiveScanFn(torch.autograd.Function):
    """Sequential scan with a hand-written backward: the forward keeps only the inputs and the
    state every ~sqrt(L) steps; the backward recomputes each chunk's states and runs the
    reverse-time recurrence for the state gradient.  Memory O(sqrt(L) * b * N * E) instead of
    autograd's O(L * b * N * E) per saved intermediate."""

    @staticmethod
    def forward(ctx, u, delta, A, B, C):
        L = u.shape[0]
        K = max(1, math.ceil(math.sqrt(L)))
        with torch.no_grad():
            y, ckpts = _scan_forward(u, delta, A, B, C, ckpt_every=K)
        ctx.K = K
        ctx.save_for_backward(u, delta, A, B, C, ckpts)
        return y

    @staticmethod
    def backward(ctx, gy):
        u, delta, A, B, C, ckpts = ctx.saved_tensors
        K = ctx.K
        L, batch, E = u.shape
        N = A.shape[1]
        gy = gy.contiguous()
        At = A.t().contiguous()  # (N, E)
        a2 = At * _LOG2E
        du = delta * u  # (L, b, E)
        g_u = torch.empty_like(u)
        g_delta = torch.empty_like(delta)
        g_B = u.new_empty(L, batch, N)
        g_C = u.new_empty(L, batch, N)
        gh = u.new_zeros(batch, N, E)  # d loss / d h_t, carried backwards in time
        gA_acc = u.new_zeros(batch, N, E)
        n_chunks = -(-L // K)
        hs = u.new_empty(K + 1, batch, N, E)  # hs[i] = state before chunk step i
        As = u.new_empty(K, batch, N, E)  # decays of the chunk's steps
        tmp = u.new_empty(batch, N, E)
        for c in reversed(range(n_chunks)):
            t0, t1 = c * K, min(L, (c + 1) * K)
            if c == 0:
                hs[0].zero_()
            else:
                hs[0].copy_(ckpts[c - 1])
            for i, t in enumerate(range(t0, t1)):  # recompute the chunk's states
                torch.mul(delta[t].unsqueeze(1), a2, out=As[i])
                As[i].exp2_()
                torch.mul(hs[i], As[i], out=hs[i + 1])
                hs[i + 1].addcmul_(du[t].unsqueeze(1), B[t].unsqueeze(2))
            for i in reversed(range(t1 - t0)):
                t = t0 + i
                gh.addcmul_(C[t].unsqueeze(2), gy[t].unsqueeze(1))  # y_t = C_t . h_t
                torch.bmm(hs[i + 1], gy[t].unsqueeze(2), out=g_C[t].unsqueeze(2))
                s = torch.bmm(B[t].unsqueeze(1), gh).squeeze(1)  # (b, E): sum_n B_tn gh_n
                torch.mul(delta[t], s, out=g_u[t])
                torch.bmm(gh, du[t].unsqueeze(2), out=g_B[t].unsqueeze(2))
                torch.mul(u[t], s, out=g_delta[t])
                if t > 0:  # h_t = a_t * h_{t-1} + ...; h_{-1} = 0 has no decay gradient
                    torch.mul(gh, hs[i], out=tmp)
                    tmp.mul_(As[i])  # d loss / d (delta_t * A)
                    gA_acc.addcmul_(tmp, delta[t].unsqueeze(1))
                    g_delta[t].add_((tmp * At).sum(1))
                gh.mul_(As[i])
        g_A = gA_acc.sum(0).t()
        return g_u, g_delta, g_A, g_B, g_C


def scan_sequential_tm(
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    block_size: int = 0,
) -> torch.Tensor:
    """Time-major selective scan without the D skip / gate: returns sum_n C_tn h_tn, (L, b, E).

    u, delta: (L, b, E) (delta already positive); A: (E, N); B, C: (L, b, N).
    The state is (b, N, E): every element-wise op has a contiguous inner dimension E, the state
    is updated in place, and no (L, b, N, E) tensor exists.  With autograd, a custom backward
    (``_SelectiveScanFn``) recomputes states from sqrt(L) checkpoints.
    ``block_size`` > 0 processes the batch in blocks of that many rows.
    """
    L, batch, E = u.shape
    if block_size and batch > block_size:
        return torch.cat(
            [
                scan_sequential_tm(u[:, i : i + block_size], delta[:, i : i + block_size], A,
                                   B[:, i : i + block_size], C[:, i : i + block_size])
                for i in range(0, batch, block_size)
            ],
            dim=1,
        )
    if torch.is_grad_enabled() and any(t.requires_grad for t in (u, delta, A, B, C)):
        return _SelectiveScanFn.apply(u.contiguous(), delta.contiguous(), A.contiguous(),
                                      B.contiguous(), C.contiguous())
    return _scan_forward(u, delta, A, B, C)[0]


def _shift_time(x: torch.Tensor, d: int, fill: float) -> torch.Tensor:
    """x shifted d steps later along dim 0 (first d entries = fill); same length, any d >= 1."""
    pad = [0, 0] * (x.dim() - 1) + [d, 0]
    return F.pad(x, pad, value=fill)[: x.shape[0]]


def scan_parallel_tm(
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    max_len: int = 1024,
) -> torch.Tensor:
    """Time-major selective scan by a doubling (Hillis-Steele) parallel scan; (L, b, E).

    Composes the affine maps h -> a_t * h + b_t pairwise over offsets 1, 2, 4, ...:
    ceil(log2(max_len)) steps, correct for every L <= max_len.  No Python loop depends on L,
    so the ONNX graph keeps a dynamic sequence length.  In eager mode the loop stops as soon
    as the offset reaches L.
    """
    if not _exporting() and u.shape[0] > max_len:
        raise ValueError(f"sequence length {u.shape[0]} > max_len {max_len} of the parallel scan")
    a = torch.exp(delta.unsqueeze(2) * A.t())  # (L, b, N, E)
    b = (delta * u).unsqueeze(2) * B.unsqueeze(3)  # (L, b, N, E)
    steps = max(1, math.ceil(math.log2(max(max_len, 2))))
    tracing = _exporting()
    for k in range(steps):
        d = 1 << k
        if not tracing and d >= u.shape[0]:
            break
        b = a * _shift_time(b, d, 0.0) + b
        if k + 1 < steps:
            a = a * _shift_time(a, d, 1.0)
    return (b * C.unsqueeze(3)).sum(2)  # (L, b, E)


def scan_unrolled_tm(
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    max_len: int = 64,
) -> torch.Tensor:
    """Time-major selective scan for export: pad the sequence to ``max_len`` steps, run the
    recurrence unrolled over those ``max_len`` steps, crop back to L; (L, b, E).

    Valid for every L <= max_len with the length dynamic in the graph (the pad amount is
    ``max_len - L``); padding at the end cannot affect earlier steps (causality).  Each step
    works on a (b, N, E) slice, so the exported graph stays cache-friendly; its size grows
    with max_len (about 7 nodes per step), so it is meant for short programs (max_len <= 128).
    """
    L = u.shape[0]
    if not _exporting() and L > max_len:
        raise ValueError(f"sequence length {L} > max_len {max_len} of the unrolled scan")
    extra = max_len - L

    def pad(t: torch.Tensor) -> torch.Tensor:
        return F.pad(t, [0, 0] * (t.dim() - 1) + [0, extra])

    dl = pad(delta).unsqueeze(2)  # (T, b, 1, E)
    du = pad(delta * u).unsqueeze(2)  # (T, b, 1, E)
    Bn = pad(B).unsqueeze(3)  # (T, b, N, 1)
    Cn = pad(C).unsqueeze(2)  # (T, b, 1, N)
    At = A.t()  # (N, E)
    h = du[0] * Bn[0]
    ys = [torch.matmul(Cn[0], h)]
    for t in range(1, max_len):
        h = torch.exp(dl[t] * At) * h + du[t] * Bn[t]
        ys.append(torch.matmul(Cn[t], h))
    y = torch.cat(ys, dim=1)  # (b, T, E)
    return y.transpose(0, 1)[:L]


def selective_scan(
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: Optional[torch.Tensor] = None,
    z: Optional[torch.Tensor] = None,
    delta_bias: Optional[torch.Tensor] = None,
    delta_softplus: bool = False,
    method: str = "fast",
    max_len: int = 1024,
) -> torch.Tensor:
    """Selective scan in mamba_ssm's layout (see ``selective_scan_ref``) by ``method``:
    ``ref`` | ``fast`` (sequential, time-major) | ``parallel`` (doubling scan)."""
    if method == "ref":
        return selective_scan_ref(u, delta, A, B, C, D, z, delta_bias, delta_softplus)
    dtype = u.dtype
    u_tm = u.float().permute(2, 0, 1)  # (L, b, E)
    d_tm = delta.float().permute(2, 0, 1)
    if delta_bias is not None:
        d_tm = d_tm + delta_bias.float()
    if delta_softplus:
        d_tm = F.softplus(d_tm)
    B_tm = B.float().permute(2, 0, 1)  # (L, b, N)
    C_tm = C.float().permute(2, 0, 1)
    if method == "fast":
        y = scan_sequential_tm(u_tm.contiguous(), d_tm.contiguous(), A.float(), B_tm, C_tm)
    elif method == "parallel":
        y = scan_parallel_tm(u_tm, d_tm, A.float(), B_tm, C_tm, max_len=max_len)
    elif method == "unrolled":
        y = scan_unrolled_tm(u_tm, d_tm, A.float(), B_tm, C_tm, max_len=max_len)
    else:
        raise ValueError(f"unknown scan method {method!r}")
    if D is not None:
        y = y + u_tm * D.float()
    if z is not None:
        y = y * F.silu(z.float().permute(2, 0, 1))
    return y.permute(1, 2, 0).to(dtype)


# ---------------------------------------------------------------------------------------------
# the block


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


def _causal_conv_shifted(x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
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
        # F.conv1d, not _causal_conv_shifted: the tracer records this body too, and the shifted
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


class Mamba(nn.Module):
    """Mamba block with mamba_ssm's parameters: in_proj, conv1d, x_proj, dt_proj, A_log, D, out_proj.

    ``forward(x)`` takes (batch, L, d_model) like the upstream module; ``time_major=True`` takes
    and returns (L, batch, d_model), the layout the CPU fast path computes in.
    ``scan_method``: ``auto`` (CUDA kernels when available on CUDA tensors; ``loop`` under the
    TorchScript ONNX exporter, ``unrolled`` or ``parallel`` by ``max_len`` under torch.export;
    else ``fast``), or force ``fast`` | ``parallel`` | ``unrolled`` | ``loop`` | ``ref`` | ``cuda``.
    ``max_len`` bounds the sequence length of the unrolled/parallel export forms (and picks
    between them); None: the length traced at export.  ``fast``, ``loop`` and ``ref`` have no bound.
    """

    def __init__(
        self,
        d_model: int,
        d_state: int = 16,
        d_conv: int = 4,
        expand: int = 2,
        dt_rank: int | str = "auto",
        dt_min: float = 0.001,
        dt_max: float = 0.1,
        dt_init: str = "random",
        dt_scale: float = 1.0,
        dt_init_floor: float = 1e-4,
        conv_bias: bool = True,
        bias: bool = False,
        layer_idx: Optional[int] = None,
        device=None,
        dtype=None,
        scan_method: str = "auto",
        max_len: Optional[int] = None,
    ) -> None:
        factory = {"device": device, "dtype": dtype}
        super().__init__()
        self.d_model = d_model
        self.d_state = d_state
        self.d_conv = d_conv
        self.expand = expand
        self.d_inner = int(expand * d_model)
        self.dt_rank = math.ceil(d_model / 16) if dt_rank == "auto" else int(dt_rank)
        self.layer_idx = layer_idx
        if scan_method not in SCAN_METHODS:
            raise ValueError(f"scan_method must be one of {SCAN_METHODS}")
        self.scan_method = scan_method
        self.max_len = None if max_len is None else int(max_len)

        self.in_proj = nn.Linear(d_model, 2 * self.d_inner, bias=bias, **factory)
        self.conv1d = nn.Conv1d(
            self.d_inner, self.d_inner, kernel_size=d_conv, groups=self.d_inner,
            padding=d_conv - 1, bias=conv_bias, **factory,
        )
        self.x_proj = nn.Linear(self.d_inner, self.dt_rank + 2 * d_state, bias=False, **factory)
        self.dt_proj = nn.Linear(self.dt_rank, self.d_inner, bias=True, **factory)
        self.A_log = nn.Parameter(torch.empty(self.d_inner, d_state, **factory))
        self.D = nn.Parameter(torch.empty(self.d_inner, **factory))
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=bias, **factory)

        self._dt_init = (dt_init, dt_scale, dt_min, dt_max, dt_init_floor)
        self.reset_ssm_parameters()
        # as upstream: no weight decay on A_log / D, and the dt bias keeps its init
        self.A_log._no_weight_decay = True
        self.D._no_weight_decay = True
        self.dt_proj.bias._no_reinit = True

    @torch.no_grad()
    def reset_ssm_parameters(self) -> None:
        """The official Mamba initialisation of dt_proj, A_log and D."""
        dt_init, dt_scale, dt_min, dt_max, floor = self._dt_init
        std = self.dt_rank ** -0.5 * dt_scale
        if dt_init == "constant":
            nn.init.constant_(self.dt_proj.weight, std)
        elif dt_init == "random":
            nn.init.uniform_(self.dt_proj.weight, -std, std)
        else:
            raise NotImplementedError(dt_init)
        dev = self.dt_proj.bias.device
        dt = torch.exp(
            torch.rand(self.d_inner, device=dev) * (math.log(dt_max) - math.log(dt_min))
            + math.log(dt_min)
        ).clamp(min=floor)
        # inverse of softplus: softplus(inv_dt) == dt
        self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))
        A = torch.arange(1, self.d_state + 1, dtype=torch.float32, device=dev)
        self.A_log.copy_(torch.log(A).expand(self.d_inner, -1))
        self.D.fill_(1.0)

    # -- helpers --------------------------------------------------------------------------

    def _method(self, x: torch.Tensor, time_major: bool) -> str:
        m = self.scan_method
        if m != "auto":
            return m
        if torch.onnx.is_in_onnx_export() and not _dynamo_exporting():
            return "loop"  # the TorchScript exporter: an ONNX Scan loop (tcl.models.mamba_onnx)
        if _exporting():
            L = x.shape[0] if time_major else x.shape[1]
            return "unrolled" if self._export_len(L) <= UNROLL_MAX else "parallel"
        if x.is_cuda and _load_cuda_kernels()[0] is not None:
            return "cuda"
        return "fast"

    def _export_len(self, traced_len) -> int:
        """Length bound of the export forms: max_len, else the traced length (a plain int under
        the TorchScript exporter), else 1024 (symbolic length under torch.export)."""
        if self.max_len is not None:
            return self.max_len
        if isinstance(traced_len, torch.SymInt):
            return 1024
        return max(1, int(traced_len))  # an int, or a 0-dim tensor under the TorchScript tracer

    def _conv_tm(self, x: torch.Tensor) -> torch.Tensor:
        """Causal depthwise conv along dim 0 of (L, b, E): K shifted multiply-adds."""
        # (K, E) contiguous taps: a strided (E,) operand would drop the ops to a scalar loop (~4x slower)
        w = self.conv1d.weight[:, 0, :].t().contiguous()
        K = w.shape[0]
        L = x.shape[0]
        if self.conv1d.bias is not None:
            out = torch.addcmul(self.conv1d.bias, x, w[K - 1])
        else:
            out = x * w[K - 1]
        for j in range(1, min(K, L)):
            out[j:].addcmul_(x[: L - j], w[K - 1 - j])
        return out

    def _conv_tm_export(self, x: torch.Tensor) -> torch.Tensor:
        """The causal conv for torch.export: pad K-1 steps in front, K shifted slices (no Conv op
        and no transposes in the graph; the slices follow the dynamic length)."""
        return _causal_conv_shifted(x, self.conv1d.weight[:, 0, :].t(), self.conv1d.bias)

    # -- forward --------------------------------------------------------------------------

    def forward(self, x: torch.Tensor, time_major: bool = False) -> torch.Tensor:
        method = self._method(x, time_major)
        if method == "cuda":
            xb = x.transpose(0, 1) if time_major else x
            out = self._forward_cuda(xb)
            return out.transpose(0, 1) if time_major else out
        if method in ("ref",):
            xb = x.transpose(0, 1) if time_major else x
            out = self._forward_ref(xb)
            return out.transpose(0, 1) if time_major else out
        xt = x if time_major else x.transpose(0, 1)
        out = self._forward_tm(xt, method)
        return out if time_major else out.transpose(0, 1)

    def _forward_tm(self, x: torch.Tensor, method: str) -> torch.Tensor:
        """x: (L, b, d_model) -> (L, b, d_model)."""
        E, N, R = self.d_inner, self.d_state, self.dt_rank
        w_in = self.in_proj.weight
        b_in = self.in_proj.bias
        xi = F.linear(x, w_in[:E], None if b_in is None else b_in[:E])  # (L, b, E)
        z = F.linear(x, w_in[E:], None if b_in is None else b_in[E:])
        export = method in ("parallel", "unrolled")  # "loop" returns through its placeholders
        if method == "loop":  # conv + silu as one placeholder node (tcl.CausalConv1d)
            xc = causal_conv1d_placeholder(xi, self.conv1d.weight[:, 0, :].t(), self.conv1d.bias)
        else:
            xc = F.silu(self._conv_tm_export(xi) if export else self._conv_tm(xi))
        x_dbl = self.x_proj(xc)  # (L, b, R + 2N)
        dt, Bm, Cm = torch.split(x_dbl, [R, N, N], dim=-1)
        A = -torch.exp(self.A_log.float())
        if method == "loop":  # dt bias, softplus, scan, D skip and gate in one placeholder node
            y = selective_scan_placeholder(xc, F.linear(dt, self.dt_proj.weight), A, Bm, Cm, self.D, z,
                                           self.dt_proj.bias)
            return self.out_proj(y)
        delta = self.dt_proj(dt)  # (L, b, E)
        # onnxruntime's Softplus kernel is ~10x slower than this equivalent (|error| < 1e-7)
        delta = F.relu(delta) + torch.log1p(torch.exp(-delta.abs())) if export else F.softplus(delta)
        if method == "parallel":
            y = scan_parallel_tm(xc, delta, A, Bm, Cm, max_len=self._export_len(x.shape[0]))
        elif method == "unrolled":
            y = scan_unrolled_tm(xc, delta, A, Bm, Cm, max_len=self._export_len(x.shape[0]))
        elif method == "fast":
            y = scan_sequential_tm(xc, delta, A, Bm, Cm)
        else:
            raise ValueError(f"unknown scan method {method!r}")
        if torch.is_grad_enabled() or export:
            y = torch.addcmul(y, xc, self.D) * F.silu(z)
        else:  # inference: reuse the buffers
            y = y.addcmul_(xc, self.D).mul_(F.silu(z, inplace=True))
        return self.out_proj(y)

    def _ssm_inputs(self, x: torch.Tensor):
        """Upstream layout: x (b, L, d_model) -> u, z (b, E, L) after the conv, dt, B, C."""
        L = x.shape[1]
        xz = self.in_proj(x).transpose(1, 2)  # (b, 2E, L)
        u, z = xz.chunk(2, dim=1)
        return u, z, L

    def _forward_ref(self, x: torch.Tensor) -> torch.Tensor:
        """Upstream's slow path with the reference scan (b, L, d_model)."""
        u, z, L = self._ssm_inputs(x)
        u = F.silu(self.conv1d(u)[..., :L])
        dt, Bm, Cm = torch.split(self.x_proj(u.transpose(1, 2)), [self.dt_rank, self.d_state, self.d_state], -1)
        dt = F.linear(dt, self.dt_proj.weight).transpose(1, 2)  # bias goes in as delta_bias
        A = -torch.exp(self.A_log.float())
        y = selective_scan_ref(u, dt, A, Bm.transpose(1, 2), Cm.transpose(1, 2), self.D.float(), z,
                               self.dt_proj.bias.float(), delta_softplus=True)
        return self.out_proj(y.transpose(1, 2))

    def _forward_cuda(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - CUDA only
        scan_fn, conv_fn = _load_cuda_kernels()
        if scan_fn is None:
            raise RuntimeError("scan_method='cuda' needs mamba_ssm with its CUDA extension")
        u, z, L = self._ssm_inputs(x)
        if conv_fn is not None:
            u = conv_fn(u.contiguous(), self.conv1d.weight[:, 0, :], self.conv1d.bias, activation="silu")
        else:
            u = F.silu(self.conv1d(u)[..., :L])
        dt, Bm, Cm = torch.split(self.x_proj(u.transpose(1, 2)), [self.dt_rank, self.d_state, self.d_state], -1)
        dt = F.linear(dt, self.dt_proj.weight).transpose(1, 2).contiguous()
        A = -torch.exp(self.A_log.float())
        y = scan_fn(u.contiguous(), dt, A, Bm.transpose(1, 2).contiguous(), Cm.transpose(1, 2).contiguous(),
                    self.D.float(), z=z.contiguous(), delta_bias=self.dt_proj.bias.float(), delta_softplus=True)
        return self.out_proj(y.transpose(1, 2))

    # -- accounting ---------------------------------------------------------------------------

    def flops(self, seq_len: int) -> int:
        """Analytic FLOPs (2 x multiply-adds; element-wise products count 1) of one sequence."""
        D, E, N, R, K = self.d_model, self.d_inner, self.d_state, self.dt_rank, self.d_conv
        per_token = (
            2 * D * 2 * E          # in_proj
            + 2 * K * E            # depthwise causal conv
            + 2 * E * (R + 2 * N)  # x_proj
            + 2 * R * E            # dt_proj
            + E * N                # delta * A (then exp)
            + 2 * E * N            # delta * u * B
            + 2 * E * N            # h = dA * h + dBu
            + 2 * E * N            # y = C . h
            + 2 * E + E            # + D * u, * silu(z)
            + 2 * E * D            # out_proj
        )
        return int(per_token * seq_len)
