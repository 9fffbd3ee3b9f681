"""The training loop for TCL cost models, readable top to bottom.

    model, history = train_model("mamba", train_fs, valid_fs, config, train_params, out_dir)

* `kind`: mamba | mlp | tlp (a torch net from `tcl.models.nets.build_model`) or xgb (the
  XGBoost baseline; trained by boosting rounds instead of epochs).
* `train_fs` / `valid_fs`: a FeatureSet or a list of them, one per platform. A batch never mixes
  platforms: each epoch builds batches per platform and then shuffles the order of the batches.
* `config`: model config (e.g. the `kb` preset); `train_params`: the `train:` section of params.yaml
  (seed, loss, lr, warmup_epochs, schedule, batch_size, epochs, patience, ...).
* `out_dir` receives `model.pt` (best weights, `tcl.models.checkpoint` format) or `model.json`
  (XGBoost), `train_state.pt` (everything needed to resume; written atomically after every
  epoch) and `history.json`. Calling `train_model` again with the same arguments after an
  interruption resumes from `train_state.pt` and ends with the same result as an uninterrupted run:
  every epoch reseeds torch/numpy/random from (seed, epoch), and the learning rate is a pure
  function of the step.
* `run`: per-epoch metrics callback, either `fn(epoch, metrics)` or an object with
  `log_metrics(metrics, step=epoch)` (e.g. the `mlflow` module).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from tcl import metrics as M

NET_KINDS = ("mamba", "mlp", "tlp")
# the baselines on their own features (tcl.perstore): MetaSchedule's XGBoost, Tenset's MLP
PERSTORE_KINDS = ("xgb-ms", "mlp-tenset")
KINDS = NET_KINDS + ("xgb",) + PERSTORE_KINDS

DEFAULT_TRAIN = {
    "seed": 0,
    "loss": "lambdarank",   # lambdarank | mse
    "lr": 7e-4,
    "warmup_epochs": 1,
    "schedule": "cosine",   # cosine | step (x0.1 every `step_epochs`)
    "step_epochs": 5,
    "batch_size": 1024,
    "epochs": 30,
    "patience": 6,           # epochs without a better validation top-1 before stopping
    "weight_decay": 0.0,
    "grad_clip": 0.0,        # 0 = off
    "threads": 2,
    "eval_batch_size": 4096,
}

STATE_FILE = "train_state.pt"
MODEL_FILE = "model.pt"
XGB_FILE = "model.json"
HISTORY_FILE = "history.json"


# ---------------------------------------------------------------------------------------------
# small helpers


def as_list(sets) -> list:
    if sets is None:
        return []
    return list(sets) if isinstance(sets, (list, tuple)) else [sets]


def seed_everything(seed: int) -> None:
    import torch

    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def epoch_seed(seed: int, epoch: int) -> int:
    """A seed for one epoch, so any epoch can be replayed (resume) without saved RNG states."""
    return (int(seed) * 1_000_003 + int(epoch) * 7_919 + 17) % (2**31 - 1)


def tune_malloc() -> bool:
    """Ask glibc to keep freed memory instead of returning it to the OS after every batch.

    The same effect as `MALLOC_MMAP_THRESHOLD_`/`MALLOC_TRIM_THRESHOLD_`/`MALLOC_TOP_PAD_` (DESIGN.md:
    4-6x faster Mamba training on CPU), applied in-process. Returns False where not glibc.
    """
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
        ok = libc.mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024)  # glibc's max for the mmap threshold
        ok &= libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1)
        ok &= libc.mallopt(M_TOP_PAD, 1 << 30)
        return bool(ok)
    except (OSError, AttributeError):
        return False


def lr_at(step: int, steps_per_epoch: int, p: dict) -> float:
    """Learning rate at an optimizer step: linear warm-up, then cosine to 0 or step decay."""
    base = float(p["lr"])
    warm = float(p["warmup_epochs"]) * steps_per_epoch
    if warm > 0 and step < warm:
        return base * (step + 1) / warm
    if p["schedule"] == "step":
        return base * 0.1 ** ((step // steps_per_epoch) // int(p["step_epochs"]))
    if p["schedule"] != "cosine":
        raise ValueError(f"unknown schedule {p['schedule']!r} (cosine | step)")
    total = max(int(p["epochs"]) * steps_per_epoch - warm, 1)
    progress = min(max((step - warm) / total, 0.0), 1.0)
    return base * 0.5 * (1.0 + math.cos(math.pi * progress))


def epoch_batches(sets: Sequence, batch_size: int, rng: np.random.Generator, by_task: bool) -> list[tuple[int, np.ndarray]]:
    """(platform index, row indices) batches for one epoch, in shuffled order.

    `by_task` (for ranking losses): tasks are visited in random order and each task's programs
    are kept together (in random order), so nearly every pair in a batch shares a task; batches
    are cut from that sequence. Otherwise rows are shuffled uniformly.
    """
    batches = []
    for si, fs in enumerate(sets):
        n = len(fs)
        if by_task:
            task = np.asarray(fs.task)
            tasks = rng.permutation(np.unique(task))
            rank_of_task = np.empty(int(task.max()) + 1, dtype=np.int64)
            rank_of_task[tasks] = np.arange(len(tasks))
            order = np.lexsort((rng.random(n), rank_of_task[task]))  # by task rank, random within
        else:
            order = rng.permutation(n)
        batches += [(si, order[a:a + batch_size]) for a in range(0, n, batch_size)]
    return [batches[i] for i in rng.permutation(len(batches))]


def predict_scores(model, fs, batch_size: int = 4096) -> np.ndarray:
    """Scores (higher = faster) of any TCL model on its feature set: a torch net or XGBCostModel on
    a FeatureSet, a per-store model (MSXGBCostModel, TensetMLPCostModel) on a PerStoreSet."""
    if hasattr(model, "predict") and not hasattr(model, "state_dict"):
        return np.asarray(model.predict(fs), dtype=np.float64)
    import torch

    was_training = model.training
    model.eval()
    out = []
    with torch.inference_mode():
        for a in range(0, len(fs), batch_size):
            x = torch.from_numpy(np.ascontiguousarray(fs.x[a:a + batch_size], dtype=np.float32))
            m = torch.from_numpy(np.ascontiguousarray(fs.mask[a:a + batch_size], dtype=bool))
            out.append(model(x, m).double().numpy())
    model.train(was_training)
    return np.concatenate(out) if out else np.zeros(0)


def validate(model, sets: Sequence, batch_size: int = 4096) -> dict:
    """Metrics on the validation sets: per platform, then the mean of top1/top5/pairwise/spearman."""
    results = [M.evaluate(predict_scores(model, fs, batch_size), fs) for fs in sets]
    out = {f"valid_{k}": v for k, v in M.mean_metrics(results).items()}
    if len(sets) > 1:
        for fs, r in zip(sets, results):
            out.update({f"valid_{fs.platform}_{k}": r[k] for k in ("top1", "top5")})
    return out


def check_finite_features(sets: Sequence, chunk: int = 8192) -> None:
    """Raise ValueError if any feature value is NaN/inf: a net would output NaN for the program and
    every batch holding it would be skipped, so training would silently learn nothing."""
    for fs in sets:
        bad_rows, bad_cols = 0, set()
        for a in range(0, len(fs), chunk):
            bad = ~np.isfinite(np.asarray(fs.x[a:a + chunk]))
            if bad.any():
                bad_rows += int(bad.any(axis=(1, 2)).sum())
                bad_cols.update(np.unique(np.nonzero(bad)[2]).tolist())
        if bad_rows:
            raise ValueError(f"FeatureSet of platform {fs.platform!r}: {bad_rows} of {len(fs)} programs have "
                             f"non-finite feature values (feature columns {sorted(bad_cols)}); "
                             f"fix the featurizer output (tcl featurize) before training")


def check_feature_kind(kind: str, sets: Sequence) -> None:
    """The per-store kinds read PerStoreSets (.perstore.npz), every other kind step FeatureSets."""
    from tcl.perstore import PerStoreSet

    wants = kind in PERSTORE_KINDS
    for fs in sets:
        if isinstance(fs, PerStoreSet) != wants:
            raise ValueError(f"model kind {kind!r} reads {'per-store features (.perstore.npz)' if wants else 'step features'}"
                             f", got {'per-store' if not wants else 'step'} features of platform {fs.platform!r}")


def _feature_meta(sets: Sequence) -> dict:
    meta = dict(getattr(sets[0], "meta", {}) or {})
    meta["platforms"] = [fs.platform for fs in sets]
    return meta


def _fingerprint(kind, config, params, sets) -> str:
    """Identifies a training job; resume refuses a train_state.pt written by a different job."""
    desc = {
        "kind": kind, "config": config,
        "params": {k: v for k, v in params.items() if k not in ("threads",)},
        "data": [(fs.platform, len(fs), list(fs.x.shape[1:]), float(np.nansum(fs.y))) for fs in sets],
    }
    return hashlib.sha1(json.dumps(desc, sort_keys=True, default=str).encode()).hexdigest()


def saved_fingerprint(out_dir) -> str | None:
    """The job fingerprint of `out_dir`'s resume state, or None when there is none."""
    path = Path(out_dir) / STATE_FILE
    if not path.is_file():
        return None
    import torch

    return str(torch.load(path, map_location="cpu", weights_only=True)["fingerprint"])


def job_fingerprint(kind: str, train_fs, config: dict, train_params: dict) -> str:
    """The fingerprint `train_model` would record for this job (compare with `saved_fingerprint`)."""
    return _fingerprint(kind, config, {**DEFAULT_TRAIN, **(train_params or {})}, as_list(train_fs))


def _emit(run, epoch: int, metrics: dict) -> None:
    if run is None:
        return
    scalars = {re.sub(r"[^\w\-. :/]", "_", k): float(v) for k, v in metrics.items()
               if isinstance(v, (int, float)) and math.isfinite(v)}  # names MLflow accepts
    if hasattr(run, "log_metrics"):
        run.log_metrics(scalars, step=epoch)
    else:
        run(epoch, scalars)


def _write_history(out_dir: Path, history: list) -> None:
    from tcl.io import atomic_write_json

    atomic_write_json(out_dir / HISTORY_FILE, history)


# ---------------------------------------------------------------------------------------------
# the loop


def train_model(kind: str, train_fs, valid_fs, config: dict, train_params: dict, out_dir,
                run=None, progress: bool | None = None, resume: bool = True):
    """Train a cost model; returns (model with the best validation weights, history list)."""
    if kind not in KINDS:
        raise ValueError(f"unknown model kind {kind!r}; choose one of {KINDS}")
    p = {**DEFAULT_TRAIN, **(train_params or {})}
    train_sets, valid_sets = as_list(train_fs), as_list(valid_fs)
    if not train_sets or any(len(fs) == 0 for fs in train_sets):
        raise ValueError("no training data")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    check_feature_kind(kind, train_sets + valid_sets)
    if kind == "xgb":
        return train_xgb(train_sets, valid_sets, config, p, out_dir, run)
    if kind in PERSTORE_KINDS:
        from tcl.models import ms_xgb, tenset_mlp

        return {"xgb-ms": ms_xgb, "mlp-tenset": tenset_mlp}[kind].train(train_sets, valid_sets, config, p, out_dir, run)

    import torch
    from tqdm.auto import tqdm

    from tcl.losses import get_loss
    from tcl.models.checkpoint import save_checkpoint
    from tcl.models.nets import build_model
    from tcl.io import atomic_path

    torch.set_num_threads(int(p["threads"]))
    tune_malloc()
    n_features = int(train_sets[0].x.shape[2])
    if any(int(fs.x.shape[2]) != n_features for fs in train_sets + valid_sets):
        raise ValueError("all FeatureSets must have the same number of features")
    check_finite_features(train_sets + valid_sets)
    seed, bs = int(p["seed"]), int(p["batch_size"])
    loss_fn = get_loss(p["loss"])
    fingerprint = _fingerprint(kind, config, p, train_sets)
    feature_meta = _feature_meta(train_sets)

    # model + optimizer, built from the seed
    seed_everything(seed)
    model = build_model(kind, n_features, **config)
    opt = torch.optim.Adam(model.parameters(), lr=float(p["lr"]), weight_decay=float(p["weight_decay"]))
    steps_per_epoch = len(epoch_batches(train_sets, bs, np.random.default_rng(0), by_task=False))

    # resume state
    start_epoch, step, history = 0, 0, []
    best = {"metric": -math.inf, "epoch": -1, "state": None, "bad_epochs": 0}
    state_path = out_dir / STATE_FILE
    if resume and state_path.exists():
        st = torch.load(state_path, map_location="cpu", weights_only=True)
        if st["fingerprint"] != fingerprint:
            raise RuntimeError(f"{state_path} belongs to a different training job; use another --out "
                               f"or delete it to start over")
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["optimizer"])
        start_epoch, step, history = int(st["epoch"]) + 1, int(st["step"]), json.loads(st["history"])
        best = {"metric": float(st["best_metric"]), "epoch": int(st["best_epoch"]),
                "state": st["best_state"], "bad_epochs": int(st["bad_epochs"])}
        if st.get("stopped"):
            start_epoch = int(p["epochs"])  # early stopping had already ended this job

    for epoch in range(start_epoch, int(p["epochs"])):
        # everything random in this epoch derives from (seed, epoch): resumable bit for bit
        es = epoch_seed(seed, epoch)
        seed_everything(es)
        batches = epoch_batches(train_sets, bs, np.random.default_rng(es), by_task=p["loss"] != "mse")

        model.train()
        t0, total_loss, n_seen, skipped = time.perf_counter(), 0.0, 0, 0
        bar = tqdm(batches, desc=f"{kind} epoch {epoch + 1}/{p['epochs']}", leave=False,
                   disable=(not progress) if progress is not None else None)
        for si, idx in bar:
            fs = train_sets[si]
            idx = np.sort(idx)  # contiguous-ish reads; order inside a batch does not matter
            x = torch.from_numpy(np.ascontiguousarray(fs.x[idx], dtype=np.float32))
            m = torch.from_numpy(np.ascontiguousarray(fs.mask[idx], dtype=bool))
            y = torch.from_numpy(np.ascontiguousarray(fs.y[idx], dtype=np.float32))
            t = torch.from_numpy(np.ascontiguousarray(fs.task[idx], dtype=np.int64))

            for g in opt.param_groups:
                g["lr"] = lr_at(step, steps_per_epoch, p)
            loss = loss_fn(model(x, m), y, t)
            opt.zero_grad(set_to_none=True)
            if not torch.isfinite(loss):
                skipped += 1  # a non-finite loss would poison the weights: skip the batch
                step += 1
                continue
            loss.backward()
            if float(p["grad_clip"]) > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), float(p["grad_clip"]))
            opt.step()
            step += 1
            total_loss += float(loss.detach()) * len(idx)
            n_seen += len(idx)
            bar.set_postfix(loss=f"{total_loss / max(n_seen, 1):.4g}")
        bar.close()
        seconds = time.perf_counter() - t0
        if n_seen == 0:
            raise RuntimeError(f"epoch {epoch}: every batch had a non-finite loss; nothing was learned")

        # validation + early stopping bookkeeping
        record = {"epoch": epoch, "train_loss": total_loss / max(n_seen, 1), "lr": lr_at(max(step - 1, 0), steps_per_epoch, p),
                  "skipped_batches": skipped, "epoch_seconds": seconds, "train_samples_per_s": n_seen / max(seconds, 1e-9)}
        if valid_sets:
            record.update(validate(model, valid_sets, int(p["eval_batch_size"])))
            score = record["valid_top1"]
            score = score if math.isfinite(score) else -math.inf
        else:
            score = -record["train_loss"]  # no validation data: keep the last/lowest-loss weights
        improved = score > best["metric"] or best["state"] is None
        if improved:
            best = {"metric": score, "epoch": epoch, "bad_epochs": 0,
                    "state": {k: v.detach().clone() for k, v in model.state_dict().items()}}
        else:
            best["bad_epochs"] += 1
        record["best_epoch"] = best["epoch"]
        history.append(record)
        stop = bool(valid_sets) and best["bad_epochs"] >= int(p["patience"])

        # checkpoints: best weights in the shared format, then the resume state (atomic, in this order)
        if improved:
            model_extra = {"epoch": epoch, "train_params": p, "valid_top1": record.get("valid_top1")}
            save_checkpoint(out_dir / MODEL_FILE, model, kind, config, feature_meta, extra=model_extra)  # atomic
        with atomic_path(state_path, suffix=".pt") as tmp:
            torch.save({
                "fingerprint": fingerprint, "epoch": epoch, "step": step, "stopped": stop,
                "model": model.state_dict(), "optimizer": opt.state_dict(),
                "best_state": best["state"], "best_metric": best["metric"], "best_epoch": best["epoch"],
                "bad_epochs": best["bad_epochs"], "history": json.dumps(history),
            }, tmp)
        _write_history(out_dir, history)
        _emit(run, epoch, record)
        if stop:
            break

    if best["state"] is not None:
        model.load_state_dict(best["state"])
    model.eval()
    return model, history


# ---------------------------------------------------------------------------------------------
# XGBoost: boosting rounds play the role of epochs


def train_xgb(train_sets, valid_sets, config: dict, p: dict, out_dir: Path, run=None):
    from tcl.models.xgb import XGBCostModel

    cfg = {"seed": int(p["seed"]), **(config or {})}
    model = XGBCostModel(config=cfg, feature_meta=_feature_meta(train_sets), n_threads=int(p["threads"]))
    history: list[dict] = []

    def on_round(i, values):
        history.append({"epoch": i, **values})
        _emit(run, i, values)

    t0 = time.perf_counter()
    model.fit(train_sets, valid_sets, on_round=on_round,
                       early_stopping_rounds=int(p["patience"]) * 5 if valid_sets else None)
    seconds = time.perf_counter() - t0
    final = {"epoch": len(history), "train_seconds": seconds,
             "train_samples_per_s": sum(len(fs) for fs in train_sets) * len(history) / max(seconds, 1e-9)}
    if valid_sets:
        final.update(validate(model, valid_sets, int(p["eval_batch_size"])))
    history.append(final)
    model.save(out_dir / XGB_FILE)
    _write_history(out_dir, history)
    return model, history


# ---------------------------------------------------------------------------------------------
# loading any trained model


def resolve_model_path(path) -> Path:
    """A checkpoint file from a file or a training output directory (model.pt or model.json)."""
    path = Path(path)
    if path.is_dir():
        for name in (MODEL_FILE, XGB_FILE):
            if (path / name).is_file():
                return path / name
        found = sorted(path.rglob(MODEL_FILE)) + sorted(path.rglob(XGB_FILE))
        if not found:
            raise FileNotFoundError(f"no {MODEL_FILE} or {XGB_FILE} under {path}")
        return found[0]
    if not path.is_file():
        raise FileNotFoundError(path)
    return path


def load_trained(path) -> tuple[object, dict]:
    """(model, info) from a .pt checkpoint, an XGBoost .json or a directory holding one."""
    path = resolve_model_path(path)
    if path.suffix == ".json":
        import xgboost as xgb

        from tcl.models.ms_xgb import KIND as MS_XGB, MSXGBCostModel
        from tcl.models.xgb import XGBCostModel

        cls = MSXGBCostModel if xgb.Booster(model_file=str(path)).attr("tcl_kind") == MS_XGB else XGBCostModel
        model = cls.load(path)
        return model, dict(model.info, path=str(path))
    import torch

    from tcl.models import tenset_mlp

    if tenset_mlp.is_payload(torch.load(path, map_location="cpu", weights_only=True)):
        model = tenset_mlp.TensetMLPCostModel.load(path)
        return model, dict(model.info, path=str(path))
    from tcl.models.checkpoint import load_checkpoint

    model, info = load_checkpoint(path)
    model.eval()
    return model, dict(info, path=str(path))
