"""Prediction throughput of the cost models (PyTorch, CPU), with this machine's baselines.

``bench_predict()`` times ``model(x, mask)`` under ``torch.inference_mode()`` for each model and
batch size, and in the same run measures two baselines so the numbers can be judged on any
machine:

* ``matmul``: fp32 GFLOP/s of ``torch.mm`` on 1024 x 1024 matrices (the practical peak);
* ``mamba-kb (naive scan)``: the KB model with the reference selective scan (a loop over time
  that materialises (B, E, L, N)), the usual pure-PyTorch implementation.

Each model row carries ``frac_matmul_peak`` (its GFLOP/s over the matmul's) and Mamba-KB rows
``speedup_vs_naive``.  ``format_table(rows)`` renders the rows for the terminal.

Other processes on the same cores distort every number here; ``loadavg`` in each row records
the 1-minute load average when the run started.
"""

from __future__ import annotations

import os
import time
from typing import Iterable, Sequence

__all__ = ["bench_predict", "format_table", "default_n_features", "model_for"]

NAIVE = "mamba-kb (naive scan)"
MATMUL = "matmul fp32 1024"


def default_n_features() -> int:
    """F of the featurizer, so the benchmark times the shape the models are trained on."""
    from tcl.features import Featurizer

    return Featurizer().n_features


def model_for(name: str, n_features: int, params: dict | None = None):
    """(kind, config, net) for a bench name: ``mamba-kb``, ``mamba-ac``, ``mlp``, ``tlp``
    (configs from params ``models``, else the built-in defaults)."""
    import torch

    from tcl.models import model_class, model_config, new_model, parse_model_name

    kind, preset = parse_model_name(name)
    try:
        config = model_config(kind, params or {}, preset)
    except KeyError:
        if preset not in (None, model_class(kind).default_preset):
            raise
        config = {}  # no params: the kind's built-in defaults (Mamba's are the KB preset's)
    torch.manual_seed(0)
    model = new_model(kind, n_features, config)
    if not hasattr(model, "net"):
        raise ValueError(f"{name}: prediction benchmarks time the torch nets (mamba-kb, mamba-ac, mlp, tlp)")
    return kind, config, model.net.eval()


def _rate(fn, items: int, seconds: float) -> float:
    """items per second of fn() over about `seconds` (after one warm-up call)."""
    fn()
    n, t0 = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        dt = time.perf_counter() - t0
        if dt >= seconds:
            return n * items / dt


def matmul_gflops(seconds: float = 1.0, n: int = 1024) -> float:
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    with torch.inference_mode():
        return _rate(lambda: torch.mm(a, b), 1, seconds) * 2.0 * n ** 3 / 1e9


def _onnx_session(model, n_features: int, seq_len: int, threads: int):
    import io

    import onnxruntime as ort

    from tcl.models.nets import export_onnx

    buf = io.BytesIO()
    export_onnx(model, buf, n_features, max_len=seq_len)
    so = ort.SessionOptions()
    so.intra_op_num_threads = int(threads)
    so.inter_op_num_threads = 1
    return ort.InferenceSession(buf.getvalue(), so, providers=["CPUExecutionProvider"])


def _inputs(batch: int, seq_len: int, n_features: int, seed: int = 0):
    """Benchmark inputs: valid lengths uniform in [L/2, L] (the bundled data: 20-48 steps of 48,
    mean 33), padding zeroed; the model skips padding, so lengths matter."""
    import torch

    from tcl.export import example_inputs

    x, mask = example_inputs(batch, seq_len, n_features, seed=seed, min_length=max(1, seq_len // 2))
    return torch.from_numpy(x), torch.from_numpy(mask)


def _flops_at_mean_length(flops_full: float, mask) -> float:
    """FLOPs of one prediction at the mean valid length of `mask`, from the FLOPs at the full
    length, for models that skip padding (``skips_padding``; their cost is linear in the length)."""
    return float(flops_full) * float(mask.sum(1).float().mean()) / mask.shape[1]


def bench_predict(
    kinds: Sequence[str] = ("mamba-kb", "mamba-ac", "mlp", "tlp"),
    batch_sizes: Iterable[int] = (1, 64, 1024),
    seq_len: int = 48,
    n_features: int | None = None,
    seconds: float = 2.0,
    threads: int = 2,
    naive: bool = True,
    onnx: bool = False,
    params: dict | None = None,
) -> list[dict]:
    """Programs/s of PyTorch CPU inference per model and batch size, plus baselines.

    Returns one dict per (model, batch): ``model, batch, seq_len, n_features, threads,
    programs_per_s, flops_per_prediction, gflops_per_s, size_mb, params, matmul_gflops,
    frac_matmul_peak, loadavg`` (+ ``speedup_vs_naive`` for mamba-kb), then the baseline rows
    ``mamba-kb (naive scan)`` per batch and ``matmul fp32 1024``.
    With ``onnx=True`` each model is also exported (traced at `seq_len`) and timed in
    onnxruntime with `threads` intra-op threads: ``onnx_programs_per_s``.
    `kinds` may also be one comma-separated string.
    """
    import torch

    from tcl.models.nets import count_parameters, flops_per_prediction, model_size_mb

    if isinstance(kinds, str):
        kinds = [k.strip() for k in kinds.split(",") if k.strip()]
    if isinstance(batch_sizes, (int, str)):
        batch_sizes = [int(b) for b in str(batch_sizes).split(",")]
    batch_sizes = [int(b) for b in batch_sizes]
    F = int(n_features or default_n_features())
    L = int(seq_len)
    old_threads = torch.get_num_threads()
    torch.set_num_threads(int(threads))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    rows: list[dict] = []
    try:
        peak = matmul_gflops(min(seconds, 1.0))
        for name in kinds:
            kind, config, model = model_for(name, F, params)
            fl_full = flops_per_prediction(model, L)
            sess = _onnx_session(model, F, L, threads) if onnx else None
            for b in batch_sizes:
                x, mask = _inputs(b, L, F, seed=b)
                fl = _flops_at_mean_length(fl_full, mask) if getattr(model, "skips_padding", False) else fl_full
                with torch.inference_mode():
                    pps = _rate(lambda: model(x, mask), b, seconds)
                if sess is not None:
                    feeds = {"x": x.numpy(), "mask": mask.numpy()}
                    onnx_pps = _rate(lambda: sess.run(None, feeds), b, seconds)
                rows.append({
                    "model": name, "batch": b, "seq_len": L, "n_features": F, "threads": int(threads),
                    "programs_per_s": pps, "flops_per_prediction": fl, "gflops_per_s": pps * fl / 1e9,
                    "size_mb": model_size_mb(model), "params": count_parameters(model),
                    "matmul_gflops": peak, "frac_matmul_peak": pps * fl / 1e9 / peak, "loadavg": load,
                })
                if sess is not None:
                    rows[-1]["onnx_programs_per_s"] = onnx_pps
        if naive:
            kind, config, model = model_for("mamba-kb", F, params)
            model.set_scan_method("ref")
            fl_full = flops_per_prediction(model, L)
            for b in batch_sizes:
                x, mask = _inputs(b, L, F, seed=b)
                fl = _flops_at_mean_length(fl_full, mask) if getattr(model, "skips_padding", False) else fl_full
                with torch.inference_mode():
                    pps = _rate(lambda: model(x, mask), b, seconds)
                rows.append({
                    "model": NAIVE, "batch": b, "seq_len": L, "n_features": F, "threads": int(threads),
                    "programs_per_s": pps, "flops_per_prediction": fl, "gflops_per_s": pps * fl / 1e9,
                    "size_mb": model_size_mb(model), "params": count_parameters(model),
                    "matmul_gflops": peak, "frac_matmul_peak": pps * fl / 1e9 / peak, "loadavg": load,
                })
                for r in rows:
                    if r["model"] == "mamba-kb" and r["batch"] == b:
                        r["speedup_vs_naive"] = r["programs_per_s"] / pps
        rows.append({"model": MATMUL, "batch": 1024, "seq_len": None, "n_features": None,
                     "threads": int(threads), "programs_per_s": None, "flops_per_prediction": 2 * 1024 ** 3,
                     "gflops_per_s": peak, "size_mb": None, "params": None, "matmul_gflops": peak,
                     "frac_matmul_peak": 1.0, "loadavg": load})
    finally:
        torch.set_num_threads(old_threads)
    return rows


def _fmt(v, spec: str) -> str:
    if v is None:
        return "-"
    try:
        return format(v, spec)
    except (TypeError, ValueError):
        return str(v)


def format_table(rows: list[dict]) -> str:
    """The rows as an aligned text table (one line per model and batch)."""
    cols = [("model", "model", "s"), ("batch", "batch", "d"), ("programs/s", "programs_per_s", ",.0f"),
            ("FLOPs/pred", "flops_per_prediction", ".3g"), ("GFLOP/s", "gflops_per_s", ".2f"),
            ("% matmul", "frac_matmul_peak", ".1%"), ("size MB", "size_mb", ".3f"),
            ("vs naive", "speedup_vs_naive", ".1f")]
    if any("onnx_programs_per_s" in r for r in rows):
        cols.insert(3, ("onnx programs/s", "onnx_programs_per_s", ",.0f"))
    table = [[h for h, _, _ in cols]]
    for r in rows:
        cells = []
        for _, key, spec in cols:
            v = r.get(key)
            cells.append(_fmt(v, spec) + ("x" if key == "speedup_vs_naive" and v is not None else ""))
        table.append(cells)
    widths = [max(len(row[i]) for row in table) for i in range(len(cols))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
             for row in table]
    if rows:
        r0 = rows[0]
        lines.append(f"seq_len={r0.get('seq_len')} n_features={r0.get('n_features')} threads={r0.get('threads')} "
                     f"loadavg(1m)={_fmt(r0.get('loadavg'), '.2f')}; valid lengths uniform in [L/2, L]: "
                     "Mamba skips padding, so its FLOPs/pred are at the mean valid length")
    return "\n".join(lines)
