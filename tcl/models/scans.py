"""Selective scans of the Mamba recurrence (one file: the block in ``mamba.py`` picks one)

    h_t = exp(delta_t * A) * h_{t-1} + delta_t * B_t * u_t,     y_t = C_t . h_t + D * u_t

* ``selective_scan_ref`` -- the direct recurrence (a Python loop over time that materialises
  (B, E, L, N)); slow, used as the reference in tests and as the "naive" benchmark baseline.
* ``scan_sequential_tm`` -- the CPU path for training and inference.  Time-major layout
  (L, B, ...), the state kept as (B, N, E) so every element-wise op runs over a contiguous
  inner dimension of size E, one time step at a time, in place (no (B, L, E, N) tensor), and
  ``exp2`` instead of ``exp`` (about 3x cheaper on AVX-512).  Training goes through
  ``_SelectiveScanFn``: a hand-written backward that recomputes states from sqrt(L)
  checkpoints (exact; memory O(sqrt(L) B N E)).
* ``tcl.models.fused_ops.scan_fused_tm`` -- the same scan as ``scan_sequential_tm`` in C++, forward
  and backward (the Mamba block's default on CPU where the library is built).
* ``scan_unrolled_tm`` -- export form for short programs: pad to ``max_len`` steps, unrolled
  recurrence, crop back.  Dynamic batch and length (any L <= max_len), per-step tensors only.
* ``scan_parallel_tm`` -- export form for long programs: a fixed-step doubling (Hillis-Steele)
  scan of the linear recurrence with ``ceil(log2(max_len))`` steps, valid for any
  L <= max_len, no data-dependent control flow.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

__all__ = ["selective_scan_ref", "selective_scan", "scan_sequential_tm", "scan_parallel_tm",
           "scan_unrolled_tm", "exporting", "dynamo_exporting"]

_LOG2E = 1.4426950408889634


def dynamo_exporting() -> bool:
    """True while torch.export (the dynamo ONNX exporter) traces the model."""
    try:
        return bool(torch.compiler.is_exporting())
    except AttributeError:  # older torch
        return False


def exporting() -> bool:
    """True while torch.onnx / torch.export traces the model."""
    return torch.onnx.is_in_onnx_export() or dynamo_exporting()


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
    if not exporting() and u.shape[0] > max_len:
        raise ValueError(f"sequence length {u.shape[0]} > max_len {max_len} of the parallel scan")
    a = torch.exp(delta.unsqueeze(2) * A.t())  # (L, b, N, E)
    b = (delta * u).unsqueeze(2) * B.unsqueeze(3)  # (L, b, N, E)
    steps = max(1, math.ceil(math.log2(max(max_len, 2))))
    tracing = exporting()
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
    if not exporting() and L > max_len:
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
    ``ref`` | ``fast`` (sequential, time-major) | ``parallel`` (doubling scan) | ``unrolled``.
    The C++ scan (``tcl.models.fused_ops.scan_fused_tm``) takes the time-major layout directly."""
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
