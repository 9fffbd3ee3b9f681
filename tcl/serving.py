"""Serve a KB cost model with onnxruntime: resolve it in the registry, check inputs, predict.

``load_predictor("models:/tcl-kb-<family>@production")`` (or ``/<version>``, or a local ``.onnx``
path) returns a :class:`Predictor` backed by an onnxruntime ``InferenceSession`` on the CPU
execution provider. Neither torch nor MLflow is imported by importing this module (the tuner
loads it); MLflow only when a ``models:/`` URI is resolved. Its benchmark is tcl.bench.serving.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from tcl.export import parse_metadata
from tcl.features import features_vocab_hash
from tcl.registry import PREFIX, TclRegistryError
from tcl.runtime import DEFAULT_THREADS, FusedOpsUnavailable, fuse_ops, inference_session, worker_pool

DEFAULT_CHUNK = 4096   # rows converted and held at once (bounds memory on large inputs)
DEFAULT_BLOCK = 32     # rows per onnxruntime call: a block's activations stay in L1/L2 cache
DEFAULT_MODE = "blocks"
MODES = ("blocks", "intra")


def valid_lengths(mask: np.ndarray) -> np.ndarray:
    """Per row of a (N, L) mask: 1 + the index of its last True step (0 for an all-False row)."""
    last = mask.shape[1] - np.argmax(mask[:, ::-1], axis=1)
    return np.where(mask.any(axis=1), last, 0)


class ModelMismatchError(TclRegistryError):
    """Features (version, shape, vocabulary) or family do not match what the model was built for."""


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
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        if not isinstance(model, (bytes, bytearray)):
            model = Path(model).read_bytes()
        try:
            model, library, self.fused = fuse_ops(bytes(model), fused)
        except FusedOpsUnavailable as exc:
            raise TclRegistryError(str(exc)) from None
        self.threads = max(1, int(threads))
        self.mode = mode
        n_sessions, per_session = ((self.threads, 1) if mode == "blocks" else (1, self.threads))
        self.sessions = [inference_session(model, per_session, opt_level, spin, library)
                         for _ in range(n_sessions)]
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
                self._pool = worker_pool(len(self.sessions), "tcl-ort")
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
    a local ``.onnx`` file, or a directory holding one (a downloaded MLflow model). A torch checkpoint
    (``model.pt`` or its training directory) is refused with the ``tcl export`` command that serves it."""
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
            if found:
                p = found[0]
            elif (p / "model.pt").is_file():  # a training directory: named as one below
                p = p / "model.pt"
            else:
                raise TclRegistryError(f"no .onnx file under {p}")
        if p.suffix == ".pt" and p.is_file():  # a training checkpoint: serving reads the ONNX export only
            raise TclRegistryError(f"{ref}: a torch training checkpoint, not an ONNX KB; export it first "
                                   f"(`tcl export {p} --family FAMILY --out KB.onnx`) and give the .onnx "
                                   "(`tcl evaluate` and `tcl tune --fine-tune` read checkpoints)")
        if not p.is_file():
            raise TclRegistryError(f"model not found: {ref} (a models:/ URI or an .onnx path)")
        blob = p.read_bytes()
        name_family = None
    try:
        pred = Predictor(blob, source=ref, registry_info=info, threads=threads, chunk=chunk,
                         opt_level=opt_level, **kwargs)
    except TclRegistryError:
        raise
    except Exception as exc:  # noqa: BLE001 - onnx and onnxruntime raise several kinds for a bad graph
        reason = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        raise TclRegistryError(f"{ref}: not an ONNX model onnxruntime can load ({reason}); give a KB "
                               "exported with `tcl export` or a models:/ URI") from None
    if name_family is not None and pred.family != name_family:
        raise ModelMismatchError(f"{ref} holds an ONNX model exported for family "
                                 f"{pred.family!r}, not {name_family!r}")
    if expected_family is not None and pred.family != expected_family:
        raise ModelMismatchError(f"family mismatch: {ref} serves {pred.family!r}, expected {expected_family!r} "
                                 f"(a KB serves the family it learned; to start {expected_family!r} from it, "
                                 f"`tcl transfer --family {expected_family} --from <its checkpoint or models:/ URI> "
                                 "--target-data <some of the platform's measured programs>`)")
    return pred
