"""Fine-tuning the KB on a tuning run's own measurements (`tcl tune --fine-tune`, off by default).

    tuner = KBFineTuner.from_source("models:/tcl-kb-amd-zen4-avx512@production", family)
    tuner.add("dense_64", x, mask, latency)      # each measured batch: features and mean latency
    onnx_bytes = tuner.update()                  # a few steps on every measurement so far

The KB is trained offline; inside a run its own measurements are the closest data there is to
the programs it must rank next. `update` takes `steps` Adam steps (lr `lr`, a small one: the KB
should not forget the platform for one task's few hundred programs) on the run's measurements so
far, with the loss training uses (per-task LambdaRank: only programs of one task are compared,
labels min latency in the task / latency), then exports the net to ONNX in memory for the
tuner's onnxruntime session. The torch checkpoint comes from the registered version (its
``checkpoint.pt``) or a checkpoint file / training directory; an ``.onnx`` file alone cannot be
fine-tuned. Settings: params.yaml ``tune.fine_tune`` over `DEFAULT_FINE_TUNE`.

Imports torch: loaded only when fine-tuning is asked for (tcl.tuner.cost_model imports this
module lazily; the tuner's default path stays torch-free).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np

from tcl.features import task_labels

DEFAULT_FINE_TUNE = {
    "steps": 20,          # Adam steps per update (each measured batch)
    "lr": 5e-4,           # below training's 7e-4: the KB keeps what it learned offline
    "batch_size": 512,    # programs per step, drawn from all measurements so far
    "loss": "lambdarank",  # tcl.losses: per-task ranking, as training
    "seed": 0,
    "threads": 1,         # torch threads (params.yaml: 2, as the update runs between batches)
}


class CheckpointNeeded(ValueError):
    """Fine-tuning was asked of a model given without its torch checkpoint."""


def fine_tune_params(overrides: dict | None = None) -> dict:
    """`DEFAULT_FINE_TUNE`, then params.yaml ``tune.fine_tune``, then `overrides`; unknown keys raise."""
    from tcl.config import tune_settings

    return tune_settings("fine_tune", DEFAULT_FINE_TUNE, overrides)


def checkpoint_source(model: str | os.PathLike, family: str, dst_dir: str | os.PathLike) -> tuple[Path, dict]:
    """The torch checkpoint behind `model`: a ``models:/`` URI's registered ``checkpoint.pt``, or a
    checkpoint file / training directory. CheckpointNeeded for an ``.onnx`` file (or a folder of
    one) and for anything without a checkpoint."""
    from tcl.registry import TclRegistryError, kb_checkpoint

    ref = str(model)
    if not ref.startswith("models:/") and Path(ref).suffix == ".onnx":
        raise CheckpointNeeded(f"{ref}: fine-tuning needs the KB's torch checkpoint, and an .onnx file "
                               "has only the exported graph; give a models:/ URI (the registered version "
                               "carries checkpoint.pt) or the checkpoint (model.pt or its training directory)")
    try:
        return kb_checkpoint(ref, family, dst_dir)
    except TclRegistryError as exc:
        raise CheckpointNeeded(f"fine-tuning needs the KB's torch checkpoint: {exc}") from None


class KBFineTuner:
    """A KB's torch net, the run's measurements and an optimizer kept across updates."""

    def __init__(self, model, family: str, params: dict | None = None, source: str = ""):
        import torch

        from tcl.losses import get_loss

        if not getattr(model, "onnx_export", False) or not hasattr(model, "net"):
            raise CheckpointNeeded(f"{source or 'model'}: a {model.kind} model, not a torch net the tuner can "
                                   "fine-tune and serve")
        self.model, self.family, self.source = model, family, source
        self.p = fine_tune_params(params)
        self.loss_fn = get_loss(self.p["loss"])
        self.optimizer = torch.optim.Adam([q for q in model.net.parameters() if q.requires_grad],
                                          lr=float(self.p["lr"]))
        self.rng = np.random.default_rng(int(self.p["seed"]))
        self._x: list[np.ndarray] = []
        self._mask: list[np.ndarray] = []
        self._latency: list[np.ndarray] = []
        self._task: list[np.ndarray] = []
        self.tasks: dict[str, int] = {}
        self.history: list[dict] = []  # per update: measured, loss before/after, seconds
        self._start = _state(model.net)  # the weights the next update starts from
        self._reexport = None  # tcl.export.Reexporter, made by the first export
        self.full_exports = False  # True: trace and check every export (`tcl bench fine-tune`'s baseline)

    @classmethod
    def from_source(cls, model: str | os.PathLike, family: str, params: dict | None = None) -> "KBFineTuner":
        """The KB at `model` (see `checkpoint_source`), loaded for fine-tuning."""
        from tcl.models import load_model

        with tempfile.TemporaryDirectory(prefix="tcl-finetune-") as tmp:
            path, _ = checkpoint_source(model, family, tmp)
            try:
                kb = load_model(path)
            except (ValueError, KeyError, RuntimeError) as exc:
                raise CheckpointNeeded(f"{path}: not a TCL checkpoint ({exc})") from None
        return cls(kb, family, params, source=str(model))

    def __len__(self) -> int:
        return sum(len(t) for t in self._task)

    def add(self, task: str, x: np.ndarray, mask: np.ndarray, latency: np.ndarray) -> None:
        """Measured programs of `task`: features (copied) and mean latencies in seconds (finite, > 0)."""
        latency = np.asarray(latency, np.float64)
        keep = np.isfinite(latency) & (latency > 0)
        if not keep.any():
            return
        index = self.tasks.setdefault(task, len(self.tasks))
        self._x.append(np.array(x[keep], np.float32))
        self._mask.append(np.array(mask[keep], bool))
        self._latency.append(latency[keep])
        self._task.append(np.full(int(keep.sum()), index, np.int64))

    def measured(self):
        """(x, mask, y, task) of every measurement so far; y = min latency in its task / latency."""
        task = np.concatenate(self._task)
        return (np.concatenate(self._x), np.concatenate(self._mask),
                task_labels(task, np.concatenate(self._latency)), task)

    def loss(self) -> float:
        """The ranking loss of the current net on every measurement so far (eval mode, float64)."""
        import torch

        x, mask, y, task = self.measured()
        scores = torch.from_numpy(self.model.predict(x, mask))
        return float(self.loss_fn(scores, torch.from_numpy(y).double(), torch.from_numpy(task)))

    def update(self) -> bytes | None:
        """`steps` steps on the measurements so far, then the net as ONNX bytes (None: the net
        did not change: fewer than two programs measured, or no step lowered the loss).

        The weights kept are those with the lowest loss on all the measurements among the start,
        the end and (when a step's batch is all of them) every step between: LambdaRank's weights
        follow the current ranking, so its loss is not monotone in its own steps, and on a few
        near-tied programs a step can swap them for the worse (training keeps its best epoch for
        the same reason). The loss never rises; where no step lowered it the net is unchanged.
        """
        import torch

        if len(self) < 2:
            return None
        threads = torch.get_num_threads()  # the process's setting, given back after the update
        torch.set_num_threads(int(self.p["threads"]))
        try:
            return self._update()
        finally:
            torch.set_num_threads(threads)

    def _update(self) -> bytes | None:
        import torch

        start = time.perf_counter()
        x, mask, y, task = self.measured()
        before = self.loss()
        net, bs = self.model.net, int(self.p["batch_size"])
        best_loss, best_state = before, None
        net.train()
        for _ in range(int(self.p["steps"])):
            full = len(y) <= bs
            rows = np.arange(len(y)) if full else np.sort(self.rng.choice(len(y), bs, replace=False))
            scores = net(torch.from_numpy(x[rows]), torch.from_numpy(mask[rows]))
            loss = self.loss_fn(scores, torch.from_numpy(y[rows]), torch.from_numpy(task[rows]))
            if not torch.isfinite(loss):
                continue  # a non-finite loss would poison the weights
            if full and float(loss.detach()) < best_loss:
                best_loss, best_state = float(loss.detach()), _state(net)  # the weights before this step
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
        net.eval()
        # the step losses are float32 in train mode; the candidates are compared as `before` was
        # measured (eval, float64), so a point only rounding put below the start does not count
        end_state, after = _state(net), self.loss()
        if best_state is not None:
            net.load_state_dict(best_state)
            best_loss = self.loss()
            if best_loss < after:
                after = best_loss
            else:
                net.load_state_dict(end_state)
        if after >= before:  # nothing beat the start: back to it, unchanged
            net.load_state_dict(self._start)
            after = before
        self._start = _state(net)
        trained = time.perf_counter()
        data = self.export() if after < before else None
        self.history.append({"measured": len(y), "tasks": len(self.tasks), "loss_before": before,
                             "loss_after": after, "train_seconds": trained - start,
                             "export_seconds": time.perf_counter() - trained})
        return data

    def export(self) -> bytes:
        """The net as ONNX bytes: traced and checked on the first call, later ones write the
        current weights into that graph (tcl.export.Reexporter: the same bytes a full export
        gives, ~0.4 ms instead of ~0.2 s an update)."""
        from tcl.export import Reexporter, export_bytes

        source_run = str(self.model.extra.get("run_id") or "")
        if self.full_exports:
            return export_bytes(self.model, self.family, source_run=source_run)
        if self._reexport is None:
            self._reexport = Reexporter(self.model, self.family, source_run)
        return self._reexport()


def _state(net) -> dict:
    return {k: v.detach().clone() for k, v in net.state_dict().items()}
