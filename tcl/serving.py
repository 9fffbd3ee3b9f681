"""Serve a KB cost model with onnxruntime: resolve it in the registry, check inputs, predict.

``load_predictor("models:/tcl-kb-<family>@production")`` (or ``/<version>``, or a local ``.onnx``
path) returns a :class:`Predictor` backed by an onnxruntime ``InferenceSession`` on the CPU
execution provider. No torch in this module's import path: a tuner process can serve without it
(only :func:`bench_serving` imports torch, to compare against PyTorch).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np

from tcl.export import parse_metadata
from tcl.registry import PREFIX, TclRegistryError

DEFAULT_CHUNK = 4096   # rows converted and held at once (bounds memory on large inputs)
DEFAULT_BLOCK = 32     # rows per onnxruntime call: a block's activations stay in L1/L2 cache
DEFAULT_MODE = "blocks"
DEFAULT_THREADS = 2
MODES = ("blocks", "intra")
_OPT_LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC",
               "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}


def valid_lengths(mask: np.ndarray) -> np.ndarray:
    """Per row of a (N, L) mask: 1 + the index of its last True step (0 for an all-False row)."""
    last = mask.shape[1] - np.argmax(mask[:, ::-1], axis=1)
    return np.where(mask.any(axis=1), last, 0)


class ModelMismatchError(TclRegistryError):
    """Features (version, shape, vocabulary) or family do not match what the model was built for."""


def session_options(threads: int = DEFAULT_THREADS, opt_level: str = "all", spin: bool = False):
    """onnxruntime CPU session options. Spinning is off by default: idle pool threads that spin
    steal the cores from TVM measurements running beside the tuner (and measured slower here
    whenever the cores are shared)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = int(threads)
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _OPT_LEVELS[opt_level])
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    so.log_severity_level = 3
    return so


def fuse_ops(model: bytes, fused: bool | None) -> tuple[bytes, Path | None, int]:
    """(model bytes to load, operator library to register or None, number of nodes fused)."""
    from tcl.models.mamba_onnx import fuse_selective_scan, fused_library

    if fused is False:
        return model, None, 0
    library = fused_library()
    if library is None:
        if fused:
            raise TclRegistryError("fused=True but TCL's onnxruntime operator library is not "
                                   "built (reinstall tcl with a C++ compiler present: pip install -e .)")
        return model, None, 0
    import onnx

    proto = onnx.load_from_string(model)
    n = fuse_selective_scan(proto)
    if not n:
        return model, None, 0
    return proto.SerializeToString(), library, n


class Predictor:
    """onnxruntime session(s) plus the metadata the model was exported with.

    ``mode="blocks"`` (default) opens `threads` single-threaded sessions that pull row blocks of
    `block` programs in parallel; ``mode="intra"`` opens one session with
    ``intra_op_num_threads=threads`` and runs the blocks one after another. The ops of this small
    model are too small to split over threads with profit: on the idle 2-core machine two
    sessions on 32-row blocks measured 49-55k programs/s against 31-33k for ``intra``
    (``tcl models bench`` sweeps modes and block sizes).

    `fused`: run each Mamba block's causal conv and selective scan (with its softplus, D skip and
    gate) as TCL's onnxruntime operators (``tcl/csrc/ortops.cc``) instead of the standard ops
    they were exported as (``tcl.models.mamba_onnx``; ~1.9x the programs/s). None (default)
    fuses when the operator library was built and the model carries fusable groups; True
    insists on the library; False keeps the exported graph. ``self.fused`` counts the nodes.
    """

    def __init__(self, model: bytes | str | os.PathLike, source: str = "",
                 registry_info: dict | None = None, threads: int = DEFAULT_THREADS,
                 chunk: int = DEFAULT_CHUNK, opt_level: str = "all", mode: str = DEFAULT_MODE,
                 block: int = DEFAULT_BLOCK, spin: bool = False, fused: bool | None = None):
        import onnxruntime as ort

        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        if not isinstance(model, (bytes, bytearray)):
            model = Path(model).read_bytes()
        model, library, self.fused = fuse_ops(bytes(model), fused)
        self.threads = max(1, int(threads))
        self.mode = mode
        n_sessions, per_session = ((self.threads, 1) if mode == "blocks" else (1, self.threads))
        self.sessions = []
        for _ in range(n_sessions):
            so = session_options(per_session, opt_level, spin)
            if library is not None:
                so.register_custom_ops_library(str(library))
            self.sessions.append(ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]))
        self.session = self.sessions[0]
        meta = parse_metadata(dict(self.session.get_modelmeta().custom_metadata_map))
        missing = [k for k in ("family", "feature_version", "max_len", "n_features") if k not in meta]
        if missing:
            raise ModelMismatchError(f"{source or 'model'} lacks TCL export metadata "
                                     f"{missing}; export it with `tcl export`")
        self.meta = meta
        self.source = source
        self.registry_info = registry_info or {}
        self.chunk = int(chunk)
        self.block = int(block)
        self._pool = None

    family = property(lambda self: self.meta["family"])
    feature_version = property(lambda self: self.meta["feature_version"])
    max_len = property(lambda self: int(self.meta["max_len"]))
    n_features = property(lambda self: int(self.meta["n_features"]))
    kind = property(lambda self: self.meta.get("kind", ""))
    vocab_hash = property(lambda self: self.meta.get("vocab_hash", ""))
    version = property(lambda self: self.registry_info.get("version"))

    def __repr__(self) -> str:
        ver = f" v{self.version}" if self.version is not None else ""
        return (f"Predictor({PREFIX}{self.family}{ver}, kind={self.kind}, "
                f"features={self.feature_version} {self.max_len}x{self.n_features}, "
                f"fused ops={self.fused})")

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def _run(self, sess, x: np.ndarray, mask: np.ndarray, rows: np.ndarray, length: int,
             out: np.ndarray) -> None:
        """Score x[rows] cropped to `length` steps into out[rows]."""
        feeds = {"x": x[rows, :length], "mask": mask[rows, :length]}  # fancy index: contiguous copies
        out[rows] = sess.run(None, feeds)[0].reshape(-1)

    def predict(self, x: np.ndarray, mask: np.ndarray, chunk: int | None = None,
                block: int | None = None) -> np.ndarray:
        """Scores (N,) float32 for x (N, L, F) and mask (N, L).

        Rows are converted `chunk` at a time (memory stays bounded for large or memory-mapped
        inputs) and scored in blocks of `block` rows, in parallel over the sessions. Within a
        chunk, rows are grouped by length and each block is cropped to its longest row: steps
        after a row's last valid one change nothing (causal scan, masked pooling), and the
        exported Mamba scan runs only as many steps as its input has.
        """
        if x.ndim != 3 or x.shape[2] != self.n_features:
            raise ModelMismatchError(f"x must be (N, L, {self.n_features}); got {tuple(x.shape)}")
        if mask.shape != x.shape[:2]:
            raise ModelMismatchError(f"mask must be {tuple(x.shape[:2])}; got {tuple(mask.shape)}")
        if x.shape[1] > self.max_len:
            raise ModelMismatchError(f"sequences of length {x.shape[1]} exceed the model's "
                                     f"max_len {self.max_len}")
        n = x.shape[0]
        out = np.empty(n, dtype=np.float32)
        step = max(1, int(chunk or self.chunk))
        blk = max(1, min(int(block or self.block), step))
        for i in range(0, n, step):
            xc = np.ascontiguousarray(x[i:i + step], dtype=np.float32)
            mc = np.ascontiguousarray(mask[i:i + step], dtype=bool)
            if not np.isfinite(xc).all():  # NaN scores would silently wreck the ranking
                bad = np.flatnonzero(~np.isfinite(xc).all(axis=(1, 2)))
                cols = np.flatnonzero(~np.isfinite(xc).all(axis=(0, 1)))
                raise ModelMismatchError(
                    f"non-finite feature values in {len(bad)} programs (first row {i + bad[0]}, "
                    f"feature columns {cols.tolist()[:10]}); fix the featurizer output")
            lengths = valid_lengths(mc)
            order = np.argsort(lengths, kind="stable")
            # small inputs: blocks small enough that every session gets one
            rows_per_block = max(1, min(blk, -(-len(xc) // len(self.sessions))))
            blocks = [(order[j:j + rows_per_block],
                       max(1, int(lengths[order[min(j + rows_per_block, len(order)) - 1]])))
                      for j in range(0, len(order), rows_per_block)]
            oc = out[i:i + len(xc)]
            if len(self.sessions) == 1 or len(blocks) == 1:
                for rows, length in blocks:
                    self._run(self.session, xc, mc, rows, length, oc)
                continue
            if self._pool is None:
                from concurrent.futures import ThreadPoolExecutor

                self._pool = ThreadPoolExecutor(len(self.sessions), thread_name_prefix="tcl-ort")
            # each session pulls the next block (a core that is busy elsewhere takes fewer);
            # onnxruntime releases the GIL while it runs
            todo = iter(blocks)  # next() on a list iterator is atomic under the GIL
            futures = [self._pool.submit(self._run_blocks, sess, todo, xc, mc, oc) for sess in self.sessions]
            for f in futures:
                f.result()
        return out

    def _run_blocks(self, sess, todo, x: np.ndarray, mask: np.ndarray, out: np.ndarray) -> None:
        for rows, length in todo:
            self._run(sess, x, mask, rows, length, out)

    def check_features(self, meta: dict, platform: str | None = None,
                       family: str | None = None) -> None:
        """Raise ModelMismatchError unless features with `meta` (FeatureSet.meta) of `platform`
        (or of an explicit `family`) are what this model was trained on."""
        fv = str(meta.get("feature_version", ""))
        if fv != str(self.feature_version):
            raise ModelMismatchError(
                f"feature version mismatch: features are {fv!r}, the model {self.family} expects "
                f"{self.feature_version!r}; re-featurize with the matching tcl or serve a model "
                "trained on these features")
        for key in ("n_features", "max_len"):
            if key in meta and int(meta[key]) != int(self.meta[key]):
                raise ModelMismatchError(f"{key} mismatch: features have {meta[key]}, the model "
                                         f"expects {self.meta[key]}")
        from tcl.export import features_vocab_hash

        fh = features_vocab_hash(meta)
        if fh and self.vocab_hash:
            if fh != self.vocab_hash:
                raise ModelMismatchError("featurizer vocabulary differs from the one the model "
                                         "was trained with (vocab_hash mismatch)")
        if family is None:
            if not platform:
                raise ModelMismatchError("cannot check the hardware family: features name no "
                                         "platform; pass family= explicitly")
            try:
                from tcl.hardware import family_of

                family = family_of(platform)
            except (KeyError, ValueError, ImportError) as exc:  # ValueError: a broken hardware.json
                raise ModelMismatchError(f"cannot tell the hardware family of platform "
                                         f"{platform!r} ({exc}); pass family= explicitly") from None
        if family != self.family:
            raise ModelMismatchError(f"family mismatch: platform {platform or '?'} is family "
                                     f"{family!r}, the model serves {self.family!r}")

    def predict_features(self, fs, family: str | None = None,
                         chunk: int | None = None) -> np.ndarray:
        """Scores for a ``tcl.features.FeatureSet`` after checking it matches the model."""
        self.check_features(dict(fs.meta), getattr(fs, "platform", None), family)
        return self.predict(fs.x, fs.mask, chunk=chunk)


def load_predictor(uri_or_path: str | os.PathLike, expected_family: str | None = None,
                   threads: int = DEFAULT_THREADS, chunk: int = DEFAULT_CHUNK,
                   opt_level: str = "all", **kwargs) -> Predictor:
    """A Predictor for ``models:/tcl-kb-<family>@<alias>``, ``models:/tcl-kb-<family>/<version>``,
    a local ``.onnx`` file, or a directory holding one (a downloaded MLflow model)."""
    ref = str(uri_or_path)
    info: dict = {}
    if ref.startswith("models:/"):
        from tcl.registry import resolve_onnx

        with tempfile.TemporaryDirectory(prefix="tcl-serve-") as tmp:
            path, info = resolve_onnx(ref, tmp)
            blob = path.read_bytes()
        name_family = info["name"][len(PREFIX):]
    else:
        p = Path(ref)
        if p.is_dir():
            found = sorted(p.rglob("*.onnx"))
            if not found:
                raise TclRegistryError(f"no .onnx file under {p}")
            p = found[0]
        if not p.is_file():
            raise TclRegistryError(f"model not found: {ref} (a models:/ URI or an .onnx path)")
        blob = p.read_bytes()
        name_family = None
    pred = Predictor(blob, source=ref, registry_info=info, threads=threads, chunk=chunk,
                     opt_level=opt_level, **kwargs)
    if name_family is not None and pred.family != name_family:
        raise ModelMismatchError(f"{ref} holds an ONNX model exported for family "
                                 f"{pred.family!r}, not {name_family!r}")
    if expected_family is not None and pred.family != expected_family:
        raise ModelMismatchError(f"family mismatch: {ref} serves {pred.family!r}, "
                                 f"expected {expected_family!r}")
    return pred


# ---------------------------------------------------------------------------------------------
# benchmark


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
    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["c"])], "mm",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [n, n]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, [n, n])],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [n, n])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    return ort.InferenceSession(proto.SerializeToString(), session_options(threads),
                                providers=["CPUExecutionProvider"])


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


def flops_per_prediction(model, max_len: int, n_features: int) -> float:
    """FLOPs of one prediction: ``tcl.models.nets.flops_per_prediction`` if it exists, else
    torch's FlopCounterMode over one forward pass (matmuls/convs only)."""
    try:
        from tcl.models import nets

        fn = getattr(nets, "flops_per_prediction", None)
        if fn is not None:
            return float(fn(model, max_len))
    except ImportError:
        pass
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    x = torch.zeros(8, max_len, n_features)
    mask = torch.ones(8, max_len, dtype=torch.bool)
    with torch.no_grad(), FlopCounterMode(display=False) as fc:
        model(x, mask)
    return fc.get_total_flops() / 8.0


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

    from tcl.export import example_inputs, export_model
    from tcl.tracking import repo_root

    if checkpoint is not None:
        from tcl.models.checkpoint import load_checkpoint

        model, info = load_checkpoint(checkpoint)
        kind, config, fmeta = info["kind"], info.get("config", {}), info["feature_meta"]
    else:
        import yaml

        from tcl.models.nets import build_model

        params = yaml.safe_load((repo_root() / "params.yaml").read_text()) or {}
        config = dict(params["models"]["mamba"]["kb"])
        kind = "mamba"
        max_len = int(params.get("featurize", {}).get("max_len", 48))
        if n_features is None:
            n_features = _default_n_features(max_len)
        torch.manual_seed(0)
        model = build_model(kind, n_features, **config)
        fmeta = {"feature_version": "bench", "max_len": max_len, "n_features": n_features}
    model.eval()
    L, F = int(fmeta["max_len"]), int(fmeta["n_features"])
    with tempfile.TemporaryDirectory(prefix="tcl-bench-") as tmp:
        path = export_model(model, Path(tmp, "kb.onnx"), "bench", kind, config, fmeta)
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
    fl_full = float(flops_per_prediction(model, L, F))
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
