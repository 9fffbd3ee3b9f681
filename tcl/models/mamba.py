"""A pure-PyTorch Mamba (S6) block, parameter-compatible with ``mamba_ssm``.

``Mamba`` has exactly the parameters of ``mamba_ssm.modules.mamba_simple.Mamba`` (same names,
shapes and official initialisation), so a ``state_dict`` loads strictly in both directions.

The selective scans live in ``tcl.models.scans`` and the ONNX placeholders in
``tcl.models.onnx_placeholders``; the one switch here (``Mamba._method``) picks:

* ``fused`` -- on CPU where ``tcl/csrc/scan_grad.cc`` is built: the causal conv with its SiLU and
  the sequential time-major scan, forward and backward, in C++ (``tcl.models.fused_ops``;
  training and inference);
* ``fast`` -- the same scan as torch ops (CPU without the library; the fallback);
* ``loop`` -- under the TorchScript ONNX exporter (``tcl.models.nets.export_onnx``): placeholder
  nodes that ``tcl.models.mamba_onnx`` lowers to an ONNX ``Scan`` over exactly the input's steps
  and ``tcl.runtime`` fuses back into TCL's onnxruntime operators;
* ``unrolled`` / ``parallel`` -- under torch.export (the dynamo exporter, a fallback): unrolled
  when the export length bound is <= ``UNROLL_MAX`` (128), else a doubling scan. The bound is
  the block's ``max_len``, or when that is None the traced length -- so trace at the
  featurizer's max_len (``tcl.export`` does);
* ``cuda`` -- mamba-ssm's kernels on CUDA tensors when ``mamba_ssm`` is importable (an optional
  dependency); ``ref`` -- the reference loop.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from tcl.models.onnx_placeholders import (causal_conv1d_placeholder, causal_conv_shifted,
                                          selective_scan_placeholder)
from tcl.models import fused_ops
from tcl.models.scans import (dynamo_exporting, exporting, scan_parallel_tm, scan_sequential_tm,
                              scan_unrolled_tm, selective_scan_ref)

__all__ = ["Mamba", "exporting", "SCAN_METHODS"]

SCAN_METHODS = ("auto", "fused", "fast", "parallel", "unrolled", "loop", "ref", "cuda")
EAGER_CPU_METHODS = ("fused", "fast")  # no graph to export: under the exporters, "auto" picks
UNROLL_MAX = 128  # export unrolled up to this max_len, as a doubling scan beyond

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


class Mamba(nn.Module):
    """Mamba block with mamba_ssm's parameters: in_proj, conv1d, x_proj, dt_proj, A_log, D, out_proj.

    ``forward(x)`` takes (batch, L, d_model) like the upstream module; ``time_major=True`` takes
    and returns (L, batch, d_model), the layout the CPU fast path computes in.
    ``scan_method``: ``auto`` (CUDA kernels when available on CUDA tensors; ``loop`` under the
    TorchScript ONNX exporter, ``unrolled`` or ``parallel`` by ``max_len`` under torch.export;
    else ``fused`` where its library is built, ``fast`` where not), or force ``fused`` | ``fast`` |
    ``parallel`` | ``unrolled`` | ``loop`` | ``ref`` | ``cuda``.
    ``max_len`` bounds the sequence length of the unrolled/parallel export forms (and picks
    between them); None: the length traced at export.  ``fused``, ``fast``, ``loop`` and ``ref``
    have no bound.
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
        if m != "auto" and not (m in EAGER_CPU_METHODS and exporting()):
            return m  # fused/fast are eager scans: an export of a net set to one traces its export form
        if torch.onnx.is_in_onnx_export() and not dynamo_exporting():
            return "loop"  # the TorchScript exporter: an ONNX Scan loop (tcl.models.mamba_onnx)
        if exporting():
            L = x.shape[0] if time_major else x.shape[1]
            return "unrolled" if self._export_len(L) <= UNROLL_MAX else "parallel"
        if x.is_cuda and _load_cuda_kernels()[0] is not None:
            return "cuda"
        return "fused" if fused_ops.available() and not x.is_cuda else "fast"

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
        return causal_conv_shifted(x, self.conv1d.weight[:, 0, :].t(), self.conv1d.bias)

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
        elif method == "fused":
            xc = fused_ops.conv_silu_fused_tm(xi, self.conv1d.weight[:, 0, :].t(), self.conv1d.bias)
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
        elif method == "fused":
            y = fused_ops.scan_fused_tm(xc, delta, A, Bm, Cm)
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
