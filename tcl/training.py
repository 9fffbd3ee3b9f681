"""The training loop for TCL's torch cost models, readable top to bottom (nanoGPT style).

    model = tcl.models.new_model("mamba", n_features, config, feature_meta)   # or load_model(path)
    history = train_model(model, train_fs, valid_fs, train_params, out_dir)

* `model`: a ``tcl.models.base.CostModel``; training starts from its current weights (a warm
  start when it was loaded). ``train_model`` calls ``model.fit``, which for the torch nets is
  :func:`fit_net` below (XGBoost boosts rounds instead: ``tcl.models.xgb``).
* `train_fs` / `valid_fs`: a FeatureSet or a list of them, one per platform. A batch never mixes
  platforms: each epoch builds batches per platform and then shuffles the order of the batches.
* `train_params`: the `train:` section of params.yaml (seed, loss, lr, warmup_epochs, schedule,
  batch_size, epochs, patience, ...).
* `trainable(name, parameter) -> bool`: a parameter filter; the others stay frozen, bit for bit.
* `extra_losses`: {name: fn(batch, scores, model) -> scalar tensor} added to the task loss (a
  teacher's distillation term, an EWC penalty); each is reported per epoch as ``loss_<name>``
  beside ``loss_task`` (``train_loss`` is their sum).
* `out_dir` receives `model.pt` (best weights), `train_state.pt` (everything needed to resume;
  written atomically after every epoch) and `history.json`. Calling again with the same
  arguments after an interruption resumes from `train_state.pt` and ends with the same result
  as an uninterrupted run: every epoch reseeds torch/numpy/random from (seed, epoch), and the
  learning rate is a pure function of the step.
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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from tcl import metrics as M

if TYPE_CHECKING:
    import torch

DEFAULT_TRAIN = {
    "seed": 0,
    "loss": "lambdarank",   # lambdarank | mse | none (only the extra loss terms train)
    "lr": 7e-4,
    "warmup_epochs": 1,
    "schedule": "cosine",   # cosine | step (x0.1 every `step_epochs`)
    "step_epochs": 5,
    "batch_size": 1024,
    "epochs": 30,
    "patience": 6,           # epochs without a better validation `select` before stopping
    # an epoch is at least this many optimizer steps: a training set with fewer batches is passed
    # over again (reshuffled) within the epoch, so a 10% subset's model gets the steps, warmup and
    # patience (all counted in epochs) a whole split's gets. 0: one pass an epoch
    "min_steps_per_epoch": 0,
    # the validation metric that picks the kept epoch and stops early: top1 | top5 | pairwise |
    # spearman (the mean over the validation sets; tcl.metrics.evaluate)
    "select": "top1",
    "task_weight": 1.0,      # the task loss's weight beside the extra loss terms
    "weight_decay": 0.0,
    "grad_clip": 0.0,        # 0 = off
    "threads": 2,
    "eval_batch_size": 4096,
}

STATE_FILE = "train_state.pt"
MODEL_FILE = "model.pt"
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


def passes_per_epoch(batches_per_pass: int, min_steps: int) -> int:
    """How many passes over the training sets make one epoch of at least `min_steps` steps."""
    return max(1, math.ceil(int(min_steps) / max(int(batches_per_pass), 1)))


def epoch_plan(sets: Sequence, batch_size: int, rng: np.random.Generator, by_task: bool,
               min_steps: int = 0) -> list[tuple[int, np.ndarray]]:
    """One epoch's batches: `epoch_batches`, passed over again (each pass reshuffled from `rng`)
    until there are at least `min_steps` of them. The first pass is `epoch_batches`' own."""
    batches = epoch_batches(sets, batch_size, rng, by_task)
    for _ in range(passes_per_epoch(len(batches), min_steps) - 1):
        batches += epoch_batches(sets, batch_size, rng, by_task)
    return batches


def validate(model, sets: Sequence, batch_size: int = 4096) -> dict:
    """Metrics on the validation sets: per platform, then the mean of top1/top5/pairwise/spearman."""
    results = [M.evaluate(model.predict_features(fs, batch_size), fs) for fs in sets]
    out = {f"valid_{k}": v for k, v in M.mean_metrics(results).items()}
    if len(sets) > 1:
        for fs, r in zip(sets, results):
            out.update({f"valid_{fs.platform}_{k}": r[k] for k in ("top1", "top5")})
    return out


def selection_key(train_params: dict) -> str:
    """The history key early stopping maximises: ``valid_<select>`` (train params' `select`)."""
    select = str({**DEFAULT_TRAIN, **(train_params or {})}["select"])
    if select not in M.MEAN_KEYS:
        raise ValueError(f"train select {select!r} is not a validation metric ({' | '.join(M.MEAN_KEYS)})")
    return f"valid_{select}"


def check_finite_features(model, sets: Sequence, chunk: int = 8192) -> None:
    """Raise ValueError if any feature value is NaN/inf: a net would output NaN for the program and
    every batch holding it would be skipped, so training would silently learn nothing."""
    from tcl.features import nonfinite_columns, nonfinite_programs

    for fs in sets:
        x = model.inputs(fs)[0]
        bad = nonfinite_programs(x, chunk)
        if len(bad):
            raise ValueError(f"FeatureSet of platform {fs.platform!r}: {len(bad)} of {len(fs)} programs have "
                             f"non-finite feature values (feature columns {nonfinite_columns(x, bad)}); "
                             f"fix the featurizer output (tcl featurize) before training")


def feature_meta(sets: Sequence) -> dict:
    meta = dict(getattr(sets[0], "meta", {}) or {})
    meta["platforms"] = [fs.platform for fs in sets]
    return meta


def _weights_sha1(model) -> str:
    """Identifies the starting weights (a warm start is a different job from a fresh one)."""
    net = getattr(model, "net", None)
    if net is None:
        return ""
    h = hashlib.sha1()
    for k, v in sorted(net.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def job_fingerprint(model, train_fs, train_params: dict, trainable=None, extra_losses=None) -> str:
    """Identifies a training job: resume refuses a train_state.pt written by a different one."""
    params = {**DEFAULT_TRAIN, **(train_params or {})}
    frozen = []
    net = getattr(model, "net", None)
    if trainable is not None and net is not None:
        frozen = [n for n, p in net.named_parameters() if not trainable(n, p)]
    desc = {
        "kind": model.kind, "config": model.config,
        # (min_steps_per_epoch 0, the default, left out: the jobs from before it existed still resume)
        "params": {k: v for k, v in params.items()
                   if k != "threads" and not (k == "min_steps_per_epoch" and not v)},
        "data": [(fs.platform, len(fs), list(model.inputs(fs)[0].shape[1:]), float(np.nansum(fs.y)))
                 for fs in as_list(train_fs)],
        "init": _weights_sha1(model), "frozen": frozen, "extra_losses": sorted(extra_losses or {}),
    }
    return hashlib.sha1(json.dumps(desc, sort_keys=True, default=str).encode()).hexdigest()


def saved_fingerprint(out_dir) -> str | None:
    """The job fingerprint of `out_dir`'s resume state, or None when there is none."""
    path = Path(out_dir) / STATE_FILE
    if not path.is_file():
        return None
    import torch

    return str(torch.load(path, map_location="cpu", weights_only=True)["fingerprint"])


def emit_metrics(run, epoch: int, metrics: dict) -> None:
    if run is None:
        return
    scalars = {re.sub(r"[^\w\-. :/]", "_", k): float(v) for k, v in metrics.items()
               if isinstance(v, (int, float)) and math.isfinite(v)}  # names MLflow accepts
    if hasattr(run, "log_metrics"):
        run.log_metrics(scalars, step=epoch)
    else:
        run(epoch, scalars)


def write_history(out_dir: Path, history: list) -> None:
    from tcl.io import atomic_write_json

    atomic_write_json(Path(out_dir) / HISTORY_FILE, history)


@dataclass
class Batch:
    """One training batch (all rows of one platform), as the loss terms see it."""

    x: "torch.Tensor"     # (B, L, F) float32
    mask: "torch.Tensor"  # (B, L) bool
    y: "torch.Tensor"     # (B,) float32: normalised throughput
    task: "torch.Tensor"  # (B,) int64
    platform: int         # index into the training sets
    rows: np.ndarray      # row indices into that FeatureSet
    epoch: int = 0        # 0-based epoch (a term that changes over training is a function of it)


# ---------------------------------------------------------------------------------------------
# the loop


def train_model(model, train_fs, valid_fs, train_params: dict, out_dir, run=None,
                progress: bool | None = None, resume: bool = True, trainable=None, extra_losses=None):
    """Train `model` from its current weights; returns (model with the best validation weights,
    history list)."""
    train_sets, valid_sets = as_list(train_fs), as_list(valid_fs)
    if not train_sets or any(len(fs) == 0 for fs in train_sets):
        raise ValueError("no training data")
    n_features = {int(model.inputs(fs)[0].shape[2]) for fs in train_sets + valid_sets}
    if n_features != {model.n_features}:
        raise ValueError(f"the model takes {model.n_features} features; the FeatureSets have {sorted(n_features)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    history = model.fit(train_sets, valid_sets, train_params, out_dir, run=run, progress=progress,
                        resume=resume, trainable=trainable, extra_losses=extra_losses)
    return model, history


def fit_net(model, train_sets: Sequence, valid_sets: Sequence, train_params: dict, out_dir,
            run=None, progress: bool | None = None, resume: bool = True, trainable=None,
            extra_losses=None) -> list[dict]:
    """The loop of a torch CostModel (``model.net``); see the module docstring."""
    import torch
    from tqdm.auto import tqdm

    from tcl.io import atomic_path
    from tcl.losses import get_loss

    # data and settings
    p = {**DEFAULT_TRAIN, **(train_params or {})}
    train_sets, valid_sets = as_list(train_sets), as_list(valid_sets)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(int(p["threads"]))
    tune_malloc()
    check_finite_features(model, train_sets + valid_sets)
    seed, bs = int(p["seed"]), int(p["batch_size"])
    loss_fn, task_weight = get_loss(p["loss"]), float(p["task_weight"])
    select = selection_key(p)
    extra_losses = dict(extra_losses or {})
    fingerprint = job_fingerprint(model, train_sets, p, trainable, extra_losses)
    model.feature_meta = {**model.feature_meta, **feature_meta(train_sets)}
    inputs = [model.inputs(fs) for fs in train_sets]

    # model and optimizer: the parameters the filter keeps are trained, the others frozen
    net = model.net
    requires_grad = {n: q.requires_grad for n, q in net.named_parameters()}
    params = []
    for name, q in net.named_parameters():
        q.requires_grad_(trainable is None or bool(trainable(name, q)))
        if q.requires_grad:
            params.append(q)
    if not params:
        raise ValueError("the parameter filter froze every parameter: nothing to train")
    opt = torch.optim.Adam(params, lr=float(p["lr"]), weight_decay=float(p["weight_decay"]))
    min_steps = int(p["min_steps_per_epoch"])
    steps_per_epoch = len(epoch_plan(train_sets, bs, np.random.default_rng(0), False, min_steps))

    # resume state
    start_epoch, step, history = 0, 0, []
    best = {"metric": -math.inf, "epoch": -1, "state": None, "bad_epochs": 0}
    state_path = out_dir / STATE_FILE
    if resume and state_path.exists():
        st = torch.load(state_path, map_location="cpu", weights_only=True)
        if st["fingerprint"] != fingerprint:
            raise RuntimeError(f"{state_path} belongs to a different training job; use another --out "
                               f"or delete it to start over")
        net.load_state_dict(st["model"])
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
        batches = epoch_plan(train_sets, bs, np.random.default_rng(es), p["loss"] != "mse", min_steps)

        net.train()
        t0, n_seen, skipped = time.perf_counter(), 0, 0
        sums = dict.fromkeys(["task", *extra_losses], 0.0)  # sample-weighted loss terms
        bar = tqdm(batches, desc=f"{model.kind} epoch {epoch + 1}/{p['epochs']}", leave=False,
                   disable=(not progress) if progress is not None else None)
        for si, idx in bar:
            fs, (xs, ms) = train_sets[si], inputs[si]
            idx = np.sort(idx)  # contiguous-ish reads; order inside a batch does not matter
            batch = Batch(x=torch.from_numpy(np.ascontiguousarray(xs[idx], dtype=np.float32)),
                          mask=torch.from_numpy(np.ascontiguousarray(ms[idx], dtype=bool)),
                          y=torch.from_numpy(np.ascontiguousarray(fs.y[idx], dtype=np.float32)),
                          task=torch.from_numpy(np.ascontiguousarray(fs.task[idx], dtype=np.int64)),
                          platform=si, rows=idx, epoch=epoch)

            for g in opt.param_groups:
                g["lr"] = lr_at(step, steps_per_epoch, p)
            scores = model.score_batch(batch.x, batch.mask, fs.platform)  # a multi-head net: fs's head
            terms = {"task": task_weight * loss_fn(scores, batch.y, batch.task)}
            terms.update({name: fn(batch, scores, model) for name, fn in extra_losses.items()})
            loss = sum(terms.values())
            opt.zero_grad(set_to_none=True)
            if not torch.isfinite(loss):
                skipped += 1  # a non-finite loss would poison the weights: skip the batch
                step += 1
                continue
            loss.backward()
            if float(p["grad_clip"]) > 0:
                torch.nn.utils.clip_grad_norm_(params, float(p["grad_clip"]))
            opt.step()
            step += 1
            for name, value in terms.items():
                sums[name] += float(value.detach()) * len(idx)
            n_seen += len(idx)
            bar.set_postfix(loss=f"{sum(sums.values()) / max(n_seen, 1):.4g}")
        bar.close()
        seconds = time.perf_counter() - t0
        if n_seen == 0:
            raise RuntimeError(f"epoch {epoch}: every batch had a non-finite loss; nothing was learned")

        # validation + early stopping bookkeeping
        record = {"epoch": epoch, "train_loss": sum(sums.values()) / n_seen,
                  "lr": lr_at(max(step - 1, 0), steps_per_epoch, p), "skipped_batches": skipped,
                  "epoch_seconds": seconds, "train_samples_per_s": n_seen / max(seconds, 1e-9)}
        if extra_losses:
            record.update({f"loss_{name}": v / n_seen for name, v in sums.items()})
        if valid_sets:
            record.update(validate(model, valid_sets, int(p["eval_batch_size"])))
            score = record[select]
            score = score if math.isfinite(score) else -math.inf
        else:
            score = -record["train_loss"]  # no validation data: keep the last/lowest-loss weights
        improved = score > best["metric"] or best["state"] is None
        if improved:
            best = {"metric": score, "epoch": epoch, "bad_epochs": 0,
                    "state": {k: v.detach().clone() for k, v in net.state_dict().items()}}
        else:
            best["bad_epochs"] += 1
        record["best_epoch"] = best["epoch"]
        history.append(record)
        stop = bool(valid_sets) and best["bad_epochs"] >= int(p["patience"])

        # checkpoints: best weights in the shared format, then the resume state (atomic, in this order)
        if improved:
            model.save(out_dir / MODEL_FILE, extra={"epoch": epoch, "train_params": p,
                                                    "valid_top1": record.get("valid_top1")})
        with atomic_path(state_path, suffix=".pt") as tmp:
            torch.save({
                "fingerprint": fingerprint, "epoch": epoch, "step": step, "stopped": stop,
                "model": net.state_dict(), "optimizer": opt.state_dict(),
                "best_state": best["state"], "best_metric": best["metric"], "best_epoch": best["epoch"],
                "bad_epochs": best["bad_epochs"], "history": json.dumps(history),
            }, tmp)
        write_history(out_dir, history)
        emit_metrics(run, epoch, record)
        if stop:
            break

    if best["state"] is not None:
        net.load_state_dict(best["state"])
    for name, q in net.named_parameters():
        q.requires_grad_(requires_grad[name])
    net.eval()
    return history
