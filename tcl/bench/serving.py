"""Serving throughput of the KB model (`tcl models bench`): onnxruntime (tcl.serving) against
PyTorch, in one process and run, with this machine's matmul GFLOP/s as the yardstick."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from tcl.runtime import DEFAULT_THREADS, inference_session
from tcl.serving import DEFAULT_BLOCK, DEFAULT_CHUNK, DEFAULT_MODE, Predictor


def _rate(fn, batch: int, seconds: float, min_iters: int = 3, windows: int = 3,
          clock=time.perf_counter) -> float:
    """Programs/s of fn() (one call = `batch` programs): one warm-up call, then the best of
    `windows` windows of seconds/windows each. With ``clock=time.process_time`` the rate is per
    CPU-second of this process (robust to other processes on the machine, for 1 thread)."""
    fn()
    best = 0.0
    for _ in range(windows):
        n, t0 = 0, clock()
        while True:
            fn()
            n += 1
            dt = clock() - t0
            if n >= min_iters and dt >= seconds / windows:
                break
        best = max(best, n * batch / max(dt, 1e-9))
    return best


def _matmul_session(n: int, threads: int):
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["c"])], "mm",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [n, n]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, [n, n])],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [n, n])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    return inference_session(proto.SerializeToString(), threads)


def matmul_gflops(threads: int = DEFAULT_THREADS, n: int = 1024, seconds: float = 1.0,
                  clock=time.perf_counter) -> dict:
    """fp32 GEMM (n x n x n) throughput of this machine now: torch (oneDNN/MKL) and
    onnxruntime (MLAS), each with `threads` threads; ``peak`` is the better of the two."""
    import torch

    flops = 2.0 * n ** 3
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a = torch.randn(n, n)
        b = torch.randn(n, n)
        t = _rate(lambda: torch.mm(a, b), 1, seconds, clock=clock) * flops / 1e9
    finally:
        torch.set_num_threads(old)
    sess = _matmul_session(n, threads)
    feeds = {"a": a.numpy(), "b": b.numpy()}
    o = _rate(lambda: sess.run(None, feeds), 1, seconds, clock=clock) * flops / 1e9
    return {"torch": t, "onnxruntime": o, "peak": max(t, o), "n": n, "threads": threads}


def bench_serving(batch_sizes=(1, 64, 1024), checkpoint: str | os.PathLike | None = None,
                  seconds: float = 1.0, threads: int = DEFAULT_THREADS,
                  sweep: bool = True, n_features: int | None = None) -> dict:
    """ONNX (onnxruntime) vs PyTorch programs/s for the KB model, in one process and run.

    Without `checkpoint`, a randomly initialised KB model is built from params.yaml
    (``models.mamba.kb``, ``featurize.max_len``); throughput does not depend on the weights.
    Inputs have valid lengths uniform in [L/2, L] (the bundled data: 20-48 of 48, mean 33):
    padding is skipped, so the figures depend on lengths; the largest batch is also timed with
    every program L steps long. Also measures fp32 matmul GFLOP/s now and the FLOPs of one
    prediction, and (with `sweep`) onnxruntime optimisation levels, parallel modes, block sizes,
    threads and spinning at the largest batch.
    """
    import torch

    from tcl.config import load_params
    from tcl.export import example_inputs, export_model
    from tcl.models import load_model, model_config, new_model
    from tcl.models.nets import flops_per_prediction

    if checkpoint is not None:
        cost_model = load_model(checkpoint)
    else:
        params = load_params(required=False)
        max_len = int(params.get("featurize", {}).get("max_len", 48))
        if n_features is None:
            n_features = _default_n_features(max_len)
        torch.manual_seed(0)
        cost_model = new_model("mamba", n_features, model_config("mamba", params, "kb"),
                               {"feature_version": "bench", "max_len": max_len, "n_features": n_features})
    kind, config, fmeta = cost_model.kind, cost_model.config, cost_model.feature_meta
    model = cost_model.net.eval()
    L, F = int(fmeta["max_len"]), int(fmeta["n_features"])
    with tempfile.TemporaryDirectory(prefix="tcl-bench-") as tmp:
        path = export_model(cost_model, Path(tmp, "kb.onnx"), "bench")
        blob = path.read_bytes()
    pred = Predictor(blob, source="bench", threads=threads)  # fused scan when the library is built
    # the exported standard-op graph (ONNX Scan loop): the baseline of the fused operator
    pred_scan = Predictor(blob, source="bench", threads=threads, fused=False)

    def torch_fn(xt, mt):
        def run():
            with torch.inference_mode():
                model(xt, mt)
        return run

    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    rows = []
    try:
        for b in batch_sizes:
            x, mask = example_inputs(int(b), L, F, seed=int(b), min_length=L // 2)
            xt, mt = torch.from_numpy(x), torch.from_numpy(mask)
            onnx_pps = _rate(lambda: pred.predict(x, mask), int(b), seconds)
            scan_pps = _rate(lambda: pred_scan.predict(x, mask), int(b), seconds)
            torch_pps = _rate(torch_fn(xt, mt), int(b), seconds)
            rows.append({"batch": int(b), "onnx_pps": onnx_pps, "onnx_scan_pps": scan_pps,
                         "torch_pps": torch_pps, "mean_valid_length": float(mask.sum(1).mean())})
    finally:
        torch.set_num_threads(old_threads)
    big = max(rows, key=lambda r: r["batch"])
    # FLOPs of one prediction at the inputs' mean valid length (padding is skipped; the model's
    # cost is linear in the length), and at the full max_len
    fl_full = float(flops_per_prediction(model, L))
    mean_len = big["mean_valid_length"]
    fl = fl_full * mean_len / L
    mm = matmul_gflops(threads, seconds=seconds)
    achieved = big["onnx_pps"] * fl / 1e9
    full_x, full_mask = example_inputs(big["batch"], L, F, seed=3, min_length=L)
    full_pps = _rate(lambda: pred.predict(full_x, full_mask), big["batch"], seconds)

    # Per CPU-second of the calling thread, one thread: what one core delivers, largely
    # independent of other processes competing for the cores (the wall-clock rates are not).
    clock = time.thread_time
    bx, bm = example_inputs(big["batch"], L, F, seed=2, min_length=L // 2)
    p1 = Predictor(blob, source="bench", threads=1)  # runs inline in this thread
    p1_scan = Predictor(blob, source="bench", threads=1, fused=False)
    cpu = {"batch": big["batch"],
           "onnx_pps": _rate(lambda: p1.predict(bx, bm), big["batch"], seconds, clock=clock),
           "onnx_scan_pps": _rate(lambda: p1_scan.predict(bx, bm), big["batch"], seconds, clock=clock)}
    torch.set_num_threads(1)
    try:
        cpu["torch_pps"] = _rate(torch_fn(torch.from_numpy(bx), torch.from_numpy(bm)),
                                 big["batch"], seconds, clock=clock)
    finally:
        torch.set_num_threads(old_threads)
    cpu["matmul_gflops"] = matmul_gflops(1, seconds=seconds, clock=clock)
    cpu["onnx_gflops"] = cpu["onnx_pps"] * fl / 1e9
    cpu["fraction_of_matmul_peak"] = cpu["onnx_gflops"] / cpu["matmul_gflops"]["peak"]

    result = {
        "kind": kind, "config": config, "max_len": L, "n_features": F, "threads": threads,
        "fused_ops": pred.fused,
        "params": int(sum(p.numel() for p in model.parameters())),
        "rows": rows, "flops_per_prediction": fl, "mean_valid_length": mean_len,
        "flops_per_prediction_full_length": fl_full, "onnx_pps_full_length": full_pps,
        "matmul_gflops": mm,
        "onnx_gflops_at_max_batch": achieved,
        "fraction_of_matmul_peak": achieved / mm["peak"] if mm["peak"] else float("nan"),
        "per_cpu_second_1_thread": cpu,
        "target_pps": 50000.0,
        "meets_target": bool(big["onnx_pps"] >= 50000.0
                             or (mm["peak"] and achieved / mm["peak"] >= 0.5)),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "cpu_count": os.cpu_count(),
    }
    if sweep:
        x, mask = example_inputs(big["batch"], L, F, seed=1, min_length=L // 2)
        grid = []
        configs = [  # (opt_level, mode, threads, block, spin)
            ("all", DEFAULT_MODE, threads, DEFAULT_BLOCK, False),  # the Predictor's defaults
            ("basic", DEFAULT_MODE, threads, DEFAULT_BLOCK, False),
            ("all", "blocks", threads, 256, False),
            ("all", "blocks", threads, 16, False),
            ("all", "blocks", threads, 64, False),
            ("all", "intra", threads, 256, False),
            ("all", "intra", threads, DEFAULT_BLOCK, False),
            ("all", "intra", threads, DEFAULT_CHUNK, True),  # onnxruntime's own defaults
            ("all", "intra", 1, DEFAULT_BLOCK, False),
        ]
        for level, mode, th, blk, spin in configs:
            p = Predictor(blob, source="bench", threads=th, opt_level=level, mode=mode,
                          block=blk, spin=spin)
            grid.append({"opt_level": level, "mode": mode, "threads": th, "block": blk,
                         "spin": spin, "onnx_pps": _rate(lambda: p.predict(x, mask),
                                                         big["batch"], seconds / 2)})
            p.close()
        result["sweep"] = grid
    return result


def _default_n_features(max_len: int = 48) -> int:
    """F of the current featurizer (``tcl.features.Featurizer``); 32 if it is not available."""
    try:
        from tcl.features import Featurizer

        return int(Featurizer(max_len).n_features)
    except (ImportError, AttributeError, TypeError):
        return 32


def format_bench(res: dict) -> str:
    mm = res["matmul_gflops"]
    cpu = res["per_cpu_second_1_thread"]
    la = res.get("load_average")
    lines = [
        f"KB model: {res['kind']} {res['config']}  params={res['params']}  "
        f"input {res['max_len']}x{res['n_features']}  threads={res['threads']}  "
        f"cpus={res.get('cpu_count')}  load average {la[0] if la else float('nan'):.2f}",
        f"FLOPs/prediction: {res['flops_per_prediction']:.3g} at the inputs' mean valid length "
        f"{res['mean_valid_length']:.1f} (lengths uniform in [{res['max_len'] // 2}, {res['max_len']}]); "
        f"{res['flops_per_prediction_full_length']:.3g} at {res['max_len']}",
        f"fp32 matmul {mm['n']}^3 ({mm['threads']} threads): torch {mm['torch']:.1f} GFLOP/s, "
        f"onnxruntime {mm['onnxruntime']:.1f} GFLOP/s",
        f"onnx: {res.get('fused_ops', 0)} nodes run as TCL's operators (tcl/csrc/ortops.cc); "
        "onnx-scan: the exported standard-op graph (ONNX Scan loop), same run",
        f"{'batch':>6} {'onnx prog/s':>13} {'onnx-scan':>11} {'torch prog/s':>13} "
        f"{'onnx/scan':>9} {'onnx/torch':>10}",
    ]
    big_batch = max(r["batch"] for r in res["rows"])
    for r in res["rows"]:
        lines.append(f"{r['batch']:>6} {r['onnx_pps']:>13,.0f} {r['onnx_scan_pps']:>11,.0f} "
                     f"{r['torch_pps']:>13,.0f} {r['onnx_pps'] / r['onnx_scan_pps']:>9.2f} "
                     f"{r['onnx_pps'] / r['torch_pps']:>10.2f}")
    lines.append(f"ONNX at batch {max(r['batch'] for r in res['rows'])}: "
                 f"{res['onnx_gflops_at_max_batch']:.2f} GFLOP/s = "
                 f"{100 * res['fraction_of_matmul_peak']:.1f}% of matmul peak; target "
                 f">= {res['target_pps']:,.0f} prog/s or >= 50% of peak: "
                 f"{'met' if res['meets_target'] else 'NOT met'}")
    lines.append(f"ONNX at batch {big_batch} with every program {res['max_len']} steps long: "
                 f"{res['onnx_pps_full_length']:,.0f} prog/s")
    cm = cpu["matmul_gflops"]
    lines.append(f"per CPU-second, 1 thread, batch {cpu['batch']}: onnx {cpu['onnx_pps']:,.0f} "
                 f"prog/s, onnx-scan {cpu['onnx_scan_pps']:,.0f} prog/s, torch {cpu['torch_pps']:,.0f} prog/s; matmul {cm['peak']:.1f} GFLOP/s; "
                 f"onnx {cpu['onnx_gflops']:.2f} GFLOP/s = "
                 f"{100 * cpu['fraction_of_matmul_peak']:.1f}% of it")
    for g in res.get("sweep", []):
        lines.append(f"  sweep opt={g['opt_level']:<8} mode={g['mode']:<6} threads={g['threads']} "
                     f"block={g['block']:<4} spin={int(g['spin'])}: {g['onnx_pps']:>9,.0f} prog/s")
    return "\n".join(lines)
