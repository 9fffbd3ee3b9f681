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

DEFAULT_CHUNK = 4096
DEFAULT_THREADS = 2
_OPT_LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC",
               "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}


class ModelMismatchError(TclRegistryError):
    """Features (version, shape, vocabulary) or family do not match what the model was built for."""


def session_options(threads: int = DEFAULT_THREADS, opt_level: str = "all"):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = int(threads)
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _OPT_LEVELS[opt_level])
    so.log_severity_level = 3
    return so


class Predictor:
    """An onnxruntime session plus the metadata the model was exported with."""

    def __init__(self, model: bytes | str | os.PathLike, source: str = "",
                 registry_info: dict | None = None, threads: int = DEFAULT_THREADS,
                 chunk: int = DEFAULT_CHUNK, opt_level: str = "all"):
        import onnxruntime as ort

        if not isinstance(model, (bytes, bytearray)):
            model = Path(model).read_bytes()
        self.session = ort.InferenceSession(bytes(model), session_options(threads, opt_level),
                                            providers=["CPUExecutionProvider"])
        meta = parse_metadata(dict(self.session.get_modelmeta().custom_metadata_map))
        missing = [k for k in ("family", "feature_version", "max_len", "n_features") if k not in meta]
        if missing:
            raise ModelMismatchError(f"{source or 'model'} lacks TCL export metadata "
                                     f"{missing}; export it with `tcl export`")
        self.meta = meta
        self.source = source
        self.registry_info = registry_info or {}
        self.chunk = int(chunk)
        self.threads = int(threads)

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
                f"features={self.feature_version} {self.max_len}x{self.n_features})")

    def predict(self, x: np.ndarray, mask: np.ndarray, chunk: int | None = None) -> np.ndarray:
        """Scores (N,) float32 for x (N, L, F) and mask (N, L), in chunks of `chunk` rows.

        Only one chunk is converted/held at a time, so memory stays bounded for large or
        memory-mapped inputs.
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
        for i in range(0, n, step):
            xb = np.ascontiguousarray(x[i:i + step], dtype=np.float32)
            mb = np.ascontiguousarray(mask[i:i + step], dtype=bool)
            out[i:i + len(xb)] = self.session.run(None, {"x": xb, "mask": mb})[0].reshape(-1)
        return out

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
            except (KeyError, ImportError) as exc:
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
                   opt_level: str = "all") -> Predictor:
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
                     opt_level=opt_level)
    if name_family is not None and pred.family != name_family:
        raise ModelMismatchError(f"{ref} holds an ONNX model exported for family "
                                 f"{pred.family!r}, not {name_family!r}")
    if expected_family is not None and pred.family != expected_family:
        raise ModelMismatchError(f"family mismatch: {ref} serves {pred.family!r}, "
                                 f"expected {expected_family!r}")
    return pred


# ---------------------------------------------------------------------------------------------
# benchmark


def _rate(fn, batch: int, seconds: float, min_iters: int = 3) -> float:
    """Programs/s of fn() (one call = `batch` programs): warm up, then the best of 3 windows."""
    fn()
    best = 0.0
    for _ in range(3):
        n, t0 = 0, time.perf_counter()
        while True:
            fn()
            n += 1
            dt = time.perf_counter() - t0
            if n >= min_iters and dt >= seconds / 3:
                break
        best = max(best, n * batch / dt)
    return best


def matmul_gflops(threads: int = DEFAULT_THREADS, n: int = 1024, seconds: float = 1.0) -> dict:
    """fp32 GEMM throughput of this machine now: torch (oneDNN/MKL) and onnxruntime (MLAS)."""
    import onnx
    import onnxruntime as ort
    import torch
    from onnx import TensorProto, helper

    flops = 2.0 * n ** 3
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a = torch.randn(n, n)
        b = torch.randn(n, n)
        t = _rate(lambda: torch.mm(a, b), 1, seconds) * flops / 1e9
    finally:
        torch.set_num_threads(old)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["c"])], "mm",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [n, n]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, [n, n])],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [n, n])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    sess = ort.InferenceSession(proto.SerializeToString(), session_options(threads),
                                providers=["CPUExecutionProvider"])
    feeds = {"a": a.numpy(), "b": b.numpy()}
    o = _rate(lambda: sess.run(None, feeds), 1, seconds) * flops / 1e9
    del onnx
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
    Also measures fp32 matmul GFLOP/s now and the FLOPs of one prediction, and (with `sweep`)
    onnxruntime optimisation levels x thread counts at the largest batch.
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
    pred = Predictor(blob, source="bench", threads=threads)

    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    rows = []
    try:
        for b in batch_sizes:
            x, mask = example_inputs(int(b), L, F, seed=int(b))
            xt, mt = torch.from_numpy(x), torch.from_numpy(mask)
            onnx_pps = _rate(lambda: pred.predict(x, mask), int(b), seconds)

            def torch_fn():
                with torch.inference_mode():
                    model(xt, mt)

            torch_pps = _rate(torch_fn, int(b), seconds)
            rows.append({"batch": int(b), "onnx_pps": onnx_pps, "torch_pps": torch_pps})
    finally:
        torch.set_num_threads(old_threads)
    fl = flops_per_prediction(model, L, F)
    mm = matmul_gflops(threads, seconds=seconds)
    big = max(rows, key=lambda r: r["batch"])
    achieved = big["onnx_pps"] * fl / 1e9
    result = {
        "kind": kind, "config": config, "max_len": L, "n_features": F, "threads": threads,
        "params": int(sum(p.numel() for p in model.parameters())),
        "rows": rows, "flops_per_prediction": fl, "matmul_gflops": mm,
        "onnx_gflops_at_max_batch": achieved,
        "fraction_of_matmul_peak": achieved / mm["peak"] if mm["peak"] else float("nan"),
        "target_pps": 50000.0,
        "meets_target": bool(big["onnx_pps"] >= 50000.0
                             or (mm["peak"] and achieved / mm["peak"] >= 0.5)),
    }
    if sweep:
        x, mask = example_inputs(big["batch"], L, F, seed=1)
        grid = []
        for level in ("basic", "extended", "all"):
            for th in sorted({1, threads}):
                p = Predictor(blob, source="bench", threads=th, opt_level=level)
                grid.append({"opt_level": level, "threads": th,
                             "onnx_pps": _rate(lambda: p.predict(x, mask), big["batch"],
                                               seconds / 2)})
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
    lines = [
        f"KB model: {res['kind']} {res['config']}  params={res['params']}  "
        f"input {res['max_len']}x{res['n_features']}  threads={res['threads']}",
        f"FLOPs/prediction: {res['flops_per_prediction']:.3g}",
        f"fp32 matmul {mm['n']}^3: torch {mm['torch']:.1f} GFLOP/s, onnxruntime "
        f"{mm['onnxruntime']:.1f} GFLOP/s",
        f"{'batch':>6} {'onnx prog/s':>13} {'torch prog/s':>13} {'onnx/torch':>10}",
    ]
    for r in res["rows"]:
        lines.append(f"{r['batch']:>6} {r['onnx_pps']:>13,.0f} {r['torch_pps']:>13,.0f} "
                     f"{r['onnx_pps'] / r['torch_pps']:>10.2f}")
    lines.append(f"ONNX at max batch: {res['onnx_gflops_at_max_batch']:.2f} GFLOP/s = "
                 f"{100 * res['fraction_of_matmul_peak']:.1f}% of matmul peak; target "
                 f">= {res['target_pps']:,.0f} prog/s or >= 50% of peak: "
                 f"{'met' if res['meets_target'] else 'NOT met'}")
    for g in res.get("sweep", []):
        lines.append(f"  sweep opt={g['opt_level']:<8} threads={g['threads']}: "
                     f"{g['onnx_pps']:,.0f} prog/s")
    return "\n".join(lines)
