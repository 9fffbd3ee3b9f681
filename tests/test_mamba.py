"""The pure-PyTorch Mamba block: scans, upstream parameter layout, official init, export forms."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tcl.models.mamba import Mamba
from tcl.models.fused_ops import available as fused_scan_available
from tcl.models.fused_ops import scan_fused_tm
from tcl.models.scans import (
    scan_parallel_tm,
    scan_sequential_tm,
    scan_unrolled_tm,
    selective_scan,
    selective_scan_ref,
)


pytestmark = pytest.mark.usefixtures("one_torch_thread")



def _scan_inputs(batch=3, E=12, N=5, L=23, seed=0, big_dt=False):
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(batch, E, L, generator=g)
    delta = torch.randn(batch, E, L, generator=g) * (3.0 if big_dt else 1.0)
    A = -torch.exp(torch.randn(E, N, generator=g))
    B = torch.randn(batch, N, L, generator=g)
    C = torch.randn(batch, N, L, generator=g)
    D = torch.randn(E, generator=g)
    z = torch.randn(batch, E, L, generator=g)
    dbias = torch.randn(E, generator=g)
    return u, delta, A, B, C, D, z, dbias


def _loop_recurrence(u, delta, A, B, C):
    """The recurrence written out element by element in float64 (independent of the ref)."""
    u, delta, A, B, C = (t.double() for t in (u, delta, A, B, C))
    batch, E, L = u.shape
    h = torch.zeros(batch, E, A.shape[1], dtype=torch.float64)
    out = torch.zeros(batch, E, L, dtype=torch.float64)
    for t in range(L):
        for e in range(E):
            decay = torch.exp(delta[:, e, t, None] * A[e])
            h[:, e] = decay * h[:, e] + delta[:, e, t, None] * B[:, :, t] * u[:, e, t, None]
            out[:, e, t] = (h[:, e] * C[:, :, t]).sum(-1)
    return out


def test_reference_scan_is_the_recurrence():
    u, delta, A, B, C, *_ = _scan_inputs(batch=2, E=3, N=4, L=9)
    delta = F.softplus(delta)
    got = selective_scan_ref(u, delta, A, B, C)
    torch.testing.assert_close(got.double(), _loop_recurrence(u, delta, A, B, C), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("method", ["fast", "parallel", "unrolled"])
@pytest.mark.parametrize("big_dt", [False, True])
def test_scans_match_reference(method, big_dt):
    u, delta, A, B, C, D, z, dbias = _scan_inputs(big_dt=big_dt)
    ref = selective_scan_ref(u, delta, A, B, C, D, z, dbias, delta_softplus=True)
    got = selective_scan(u, delta, A, B, C, D, z, dbias, delta_softplus=True, method=method, max_len=32)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    assert torch.isfinite(got).all()


@pytest.mark.parametrize("fn", [scan_fused_tm, scan_sequential_tm, scan_parallel_tm, scan_unrolled_tm])
def test_scan_padding_at_end_does_not_touch_real_steps(fn):
    u, delta, A, B, C, *_ = _scan_inputs(batch=2, E=8, N=4, L=20, seed=3)
    delta = F.softplus(delta)
    tm = lambda t: t.permute(2, 0, 1).contiguous()  # noqa: E731 - (b, *, L) -> (L, b, *)
    kw = {} if fn in (scan_sequential_tm, scan_fused_tm) else {"max_len": 32}
    full = fn(tm(u), tm(delta), A, tm(B), tm(C), **kw)
    # garbage in the last 7 steps ("padding") must leave the first 13 outputs unchanged
    u2, d2, B2 = u.clone(), delta.clone(), B.clone()
    u2[..., 13:] = 1e3
    d2[..., 13:] = 5.0
    B2[..., 13:] = -7.0
    padded = fn(tm(u2), tm(d2), A, tm(B2), tm(C), **kw)
    torch.testing.assert_close(padded[:13], full[:13], rtol=1e-6, atol=1e-6)
    short = fn(tm(u[..., :13]), tm(delta[..., :13]), A, tm(B[..., :13]), tm(C[..., :13]), **kw)
    torch.testing.assert_close(short, full[:13], rtol=1e-6, atol=1e-6)


def test_sequential_scan_blocks_and_gradients():
    u, delta, A, B, C, *_ = _scan_inputs(batch=5, E=6, N=3, L=11, seed=4)
    delta = F.softplus(delta)
    tm = lambda t: t.permute(2, 0, 1).contiguous()  # noqa: E731
    whole = scan_sequential_tm(tm(u), tm(delta), A, tm(B), tm(C))
    blocked = scan_sequential_tm(tm(u), tm(delta), A, tm(B), tm(C), block_size=2)
    torch.testing.assert_close(blocked, whole, rtol=1e-6, atol=1e-6)
    # autograd path (out of place) agrees with the reference's gradients
    leaves = [t.clone().requires_grad_(True) for t in (u, delta, A, B, C)]
    ref = selective_scan_ref(*leaves)
    (ref * torch.linspace(-1, 1, ref.numel()).reshape(ref.shape)).sum().backward()
    ref_grads = [t.grad.clone() for t in leaves]
    leaves2 = [t.clone().requires_grad_(True) for t in (u, delta, A, B, C)]
    got = scan_sequential_tm(*(tm(t) if t.dim() == 3 else t for t in leaves2)).permute(1, 2, 0)
    (got * torch.linspace(-1, 1, got.numel()).reshape(got.shape)).sum().backward()
    for g1, t2 in zip(ref_grads, leaves2):
        torch.testing.assert_close(t2.grad, g1, rtol=1e-4, atol=1e-5)


def test_parallel_scan_refuses_lengths_beyond_max_len():
    u, delta, A, B, C, *_ = _scan_inputs(L=20)
    with pytest.raises(ValueError):
        selective_scan(u, F.softplus(delta), A, B, C, method="parallel", max_len=16)
    with pytest.raises(ValueError):
        selective_scan(u, F.softplus(delta), A, B, C, method="unrolled", max_len=16)


def upstream_shapes(d_model, d_state, d_conv, expand):
    """Parameter shapes of mamba_ssm.modules.mamba_simple.Mamba (bias=False, conv_bias=True),
    written out from its definition."""
    d_inner = expand * d_model
    dt_rank = math.ceil(d_model / 16)
    return {
        "A_log": (d_inner, d_state),
        "D": (d_inner,),
        "in_proj.weight": (2 * d_inner, d_model),
        "conv1d.weight": (d_inner, 1, d_conv),
        "conv1d.bias": (d_inner,),
        "x_proj.weight": (dt_rank + 2 * d_state, d_inner),
        "dt_proj.weight": (d_inner, dt_rank),
        "dt_proj.bias": (d_inner,),
        "out_proj.weight": (d_model, d_inner),
    }


@pytest.mark.parametrize("cfg", [(64, 8, 4, 1), (40, 16, 2, 2), (16, 4, 3, 3)])
def test_state_dict_matches_upstream_layout_both_ways(cfg):
    d_model, d_state, d_conv, expand = cfg
    shapes = upstream_shapes(*cfg)
    block = Mamba(d_model, d_state=d_state, d_conv=d_conv, expand=expand)
    own = {k: tuple(v.shape) for k, v in block.state_dict().items()}
    assert own == shapes
    # an "upstream" state dict of those names loads strictly and is returned unchanged
    g = torch.Generator().manual_seed(1)
    upstream = {k: torch.randn(s, generator=g) for k, s in shapes.items()}
    block.load_state_dict(upstream, strict=True)
    for k, v in block.state_dict().items():
        assert torch.equal(v, upstream[k]), k
    # and our weights load into a fresh block of the same config (the other direction)
    other = Mamba(d_model, d_state=d_state, d_conv=d_conv, expand=expand)
    other.load_state_dict(block.state_dict(), strict=True)
    x = torch.randn(2, 7, d_model)
    with torch.no_grad():
        torch.testing.assert_close(other(x), block(x), rtol=0, atol=0)
    assert block.dt_rank == math.ceil(d_model / 16)
    assert block.conv1d.padding == (d_conv - 1,) and block.conv1d.groups == expand * d_model


def test_official_initialisation():
    torch.manual_seed(0)
    block = Mamba(64, d_state=8, d_conv=4, expand=4)  # d_inner 256: enough dt samples
    E, N, R = 256, 8, 4
    expected_A_log = torch.log(torch.arange(1, N + 1, dtype=torch.float32)).expand(E, N)
    torch.testing.assert_close(block.A_log.data, expected_A_log, rtol=0, atol=0)
    assert torch.equal(block.D.data, torch.ones(E))
    dt = F.softplus(block.dt_proj.bias.data.double())
    assert dt.min() >= 1e-3 * (1 - 1e-5) and dt.max() <= 0.1 * (1 + 1e-5)
    # log-uniform in [1e-3, 0.1]: the log10 values spread over [-3, -1] with mean near -2
    logdt = torch.log10(dt)
    assert logdt.min() < -2.7 and logdt.max() > -1.3 and abs(logdt.mean().item() + 2) < 0.15
    bound = R ** -0.5
    w = block.dt_proj.weight.data
    assert w.abs().max() <= bound and w.abs().max() > 0.9 * bound and abs(w.mean().item()) < 0.05
    assert block.A_log._no_weight_decay and block.D._no_weight_decay
    assert block.dt_proj.bias._no_reinit
    assert block.in_proj.bias is None and block.out_proj.bias is None
    assert block.conv1d.bias is not None and block.dt_proj.bias is not None
    # dt floor: with dt_min below the floor, nothing goes under 1e-4
    tiny = Mamba(32, d_state=4, dt_min=1e-6, dt_max=1e-5)
    torch.testing.assert_close(F.softplus(tiny.dt_proj.bias.data), torch.full((64,), 1e-4), rtol=1e-4, atol=0)


def test_block_forward_paths_agree_and_train():
    torch.manual_seed(0)
    block = Mamba(32, d_state=8, d_conv=4, expand=2)
    x = torch.randn(3, 19, 32)
    outs = {}
    with torch.no_grad():
        for m in ("ref", "fused", "fast", "parallel", "unrolled"):
            block.scan_method = m
            outs[m] = block(x)
        block.scan_method = "fast"
        tm = block(x.transpose(0, 1).contiguous(), time_major=True).transpose(0, 1)
    for m in ("fused", "fast", "parallel", "unrolled"):
        torch.testing.assert_close(outs[m], outs["ref"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(tm, outs["ref"], rtol=1e-5, atol=1e-5)
    # gradients of the training paths equal the reference path's
    grads = {}
    for m in ("ref", "fused", "fast"):
        block.zero_grad()
        block.scan_method = m
        block(x).pow(2).mean().backward()
        grads[m] = {k: p.grad.clone() for k, p in block.named_parameters()}
    for m in ("fused", "fast"):
        for k in grads["ref"]:
            torch.testing.assert_close(grads[m][k], grads["ref"][k], rtol=1e-4, atol=1e-6)


def test_block_is_causal():
    torch.manual_seed(0)
    block = Mamba(16, d_state=4, d_conv=4, expand=2).eval()
    x = torch.randn(2, 12, 16)
    x2 = x.clone()
    x2[:, 8:] = torch.randn(2, 4, 16) * 10
    with torch.no_grad():
        y, y2 = block(x), block(x2)
    torch.testing.assert_close(y2[:, :8], y[:, :8], rtol=0, atol=1e-6)
    assert not torch.allclose(y2[:, 8:], y[:, 8:])


def test_against_official_mamba_ssm():
    mamba_simple = pytest.importorskip("mamba_ssm.modules.mamba_simple")
    if not torch.cuda.is_available():
        pytest.skip("mamba_ssm's kernels need CUDA")
    torch.manual_seed(0)
    official = mamba_simple.Mamba(64, d_state=8, d_conv=4, expand=2).cuda()
    ours = Mamba(64, d_state=8, d_conv=4, expand=2).cuda()
    ours.load_state_dict(official.state_dict(), strict=True)
    official.load_state_dict(ours.state_dict(), strict=True)
    x = torch.randn(4, 33, 64, device="cuda")
    with torch.no_grad():
        ref = official(x)
        for m in ("cuda", "fast", "ref"):
            ours.scan_method = m
            torch.testing.assert_close(ours(x), ref, rtol=1e-4, atol=1e-4)


def test_cuda_matches_cpu():
    """On a GPU the block and the cost model run on CUDA tensors (through mamba-ssm's kernels when
    installed, else the PyTorch scans) and agree with the CPU reference, gradients included."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from tcl.models.nets import build_net

    torch.manual_seed(0)
    cpu = Mamba(32, d_state=8, d_conv=4, expand=2)
    gpu = Mamba(32, d_state=8, d_conv=4, expand=2).cuda()
    gpu.load_state_dict(cpu.state_dict())
    x = torch.randn(4, 29, 32)
    cpu.scan_method = "ref"
    ref = cpu(x)
    ref.square().mean().backward()
    for method in ("auto", "fast", "ref"):
        gpu.scan_method = method
        gpu.zero_grad()
        out = gpu(x.cuda())
        out.square().mean().backward()
        torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-4, msg=method)
        for (name, p), q in zip(gpu.named_parameters(), cpu.parameters()):
            torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-3, atol=1e-4,
                                       msg=f"{method}: grad of {name}")
    model = build_net("mamba", 20, d_model=32, n_layers=1, d_state=8, expand=1, d_conv=4).eval()
    xs = torch.randn(16, 24, 20)
    mask = torch.arange(24)[None, :] < torch.randint(1, 25, (16, 1))
    with torch.no_grad():
        want = model(xs, mask)
        got = model.cuda()(xs.cuda(), mask.cuda()).cpu()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_fused_scan_is_built_where_the_operator_library_is():
    """setup.py builds both C++ libraries with the same compiler: one without the other is a
    broken build, not a machine without a compiler (the fused scan would silently fall back)."""
    from tcl.models.mamba_onnx import fused_library

    assert fused_scan_available() == (fused_library() is not None), (
        f"tcl/_ortops built: {fused_library() is not None}, tcl/_scan_grad (tcl/csrc/scan_grad.cc) built: "
        f"{fused_scan_available()}; `pip install -e .` builds both")


@pytest.fixture(params=[1, 2, 3])
def fused_threads(request):
    """torch's thread count for a fused-op test (rows split over that many threads; 3: more
    threads than some batches have rows), given back after it; skips where the library is not built."""
    if not fused_scan_available():
        pytest.skip("tcl/csrc/scan_grad.cc not built (no C++ compiler)")
    prev = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(prev)


def _fused_against_float64(fused, reference, inputs, gy, names):
    """Outputs and input gradients of sum(y * gy): `fused` in float32 against `reference` in
    float64 (None inputs pass through)."""
    results = []
    for fn, dtype in ((fused, torch.float32), (reference, torch.float64)):
        leaves = [None if t is None else t.detach().to(dtype).clone().requires_grad_() for t in inputs]
        y = fn(*leaves)
        (y * gy.to(dtype)).sum().backward()
        results.append([y.detach().double()] + [t.grad.double() for t in leaves if t is not None])
    for name, got, want in zip(names, *results):
        torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5, msg=name)


def test_fused_scan_gradients_match_the_exact_backward(fused_threads):
    """scan_fused_tm's C++ backward against _SelectiveScanFn's (exact: gradcheck below) in float64,
    over lengths (one step, odd), batches of one row to more rows than threads, and large steps."""
    from tcl.models.scans import _SelectiveScanFn

    g = torch.Generator().manual_seed(fused_threads)
    for L, b, E, N, dt_max in [(1, 2, 3, 2, 2), (7, 1, 5, 3, 2), (13, 5, 16, 8, 2), (30, 9, 32, 4, 2), (20, 3, 8, 4, 12)]:
        u, d = torch.randn(L, b, E, generator=g), torch.rand(L, b, E, generator=g) * dt_max  # 12: decays to ~e^-36
        A = -3 * torch.rand(E, N, generator=g)
        B, C = torch.randn(L, b, N, generator=g), torch.randn(L, b, N, generator=g)
        _fused_against_float64(scan_fused_tm, _SelectiveScanFn.apply, (u, d, A, B, C),
                               torch.randn(L, b, E, generator=g),
                               [f"{n} at L={L} b={b}" for n in ("y", "u", "delta", "A", "B", "C")])


@pytest.mark.parametrize("with_bias", [True, False])
def test_fused_conv_matches_the_torch_conv_and_its_gradients(fused_threads, with_bias):
    """conv_silu_fused_tm (C++ forward and backward) against silu(causal_conv_shifted) in float64:
    lengths shorter than the kernel, one row, more threads than rows."""
    from tcl.models.fused_ops import conv_silu_fused_tm
    from tcl.models.onnx_placeholders import causal_conv_shifted

    g = torch.Generator().manual_seed(fused_threads)
    for L, b, E, K in [(1, 2, 3, 4), (3, 1, 5, 4), (13, 5, 16, 4), (30, 9, 32, 2)]:
        x, w = torch.randn(L, b, E, generator=g), torch.randn(K, E, generator=g)
        bias = torch.randn(E, generator=g) if with_bias else None
        _fused_against_float64(conv_silu_fused_tm, lambda *a: F.silu(causal_conv_shifted(*a)), (x, w, bias),
                               torch.randn(L, b, E, generator=g),
                               [f"{n} at L={L} b={b}" for n in ("y", "x", "w", "bias")])


def test_scan_backward_gradcheck():
    """The hand-written backward of the sequential scan (chunked recompute) is exact."""
    from tcl.models.scans import _SelectiveScanFn

    g = torch.Generator().manual_seed(0)
    for L in (1, 5, 10):  # chunk size ceil(sqrt(L)): one chunk, a partial last chunk, exact chunks
        b, E, N = 2, 3, 2
        u = torch.randn(L, b, E, dtype=torch.double, generator=g).requires_grad_()
        d = torch.rand(L, b, E, dtype=torch.double, generator=g).mul(2).requires_grad_()
        A = (-3 * torch.rand(E, N, dtype=torch.double, generator=g)).requires_grad_()
        B = torch.randn(L, b, N, dtype=torch.double, generator=g).requires_grad_()
        C = torch.randn(L, b, N, dtype=torch.double, generator=g).requires_grad_()
        assert torch.autograd.gradcheck(_SelectiveScanFn.apply, (u, d, A, B, C))
