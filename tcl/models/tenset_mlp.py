"""Tenset's MLP cost model on per-store features (Tenset `auto_scheduler/cost_model/mlp_model.py`):
kind ``mlp-tenset``.

The network and the loss are MetaSchedule's port of Tenset's, used as they are:
`SegmentSumMLP` (each store row -> Linear-ReLU-Linear-ReLU to `hidden_dim`, summed over the
program's stores, two residual Linear-ReLU layers, Linear to the score) and `lambda_rank_loss`
(LambdaRank over all pairs of the batch, NDCG weights), both from
`tvm.s_tir.meta_schedule.cost_model.mlp_model`. The training procedure is Tenset's
`MLPModelInternal._fit_a_model` with `loss_type="lambdaRankLoss"`, written here because
MetaSchedule's trainer wants tuning contexts and a database (so ``fit`` is not
``tcl.training.fit_net``, and like Tenset's it starts from fresh weights):

* features divided column-wise by their maximum over the training stores (Tenset's
  `fea_norm_vec`, saved with the model and applied to every later input);
* batches of 512 programs drawn uniformly (tasks mixed: the labels are per-task normalised);
  batches never mix platforms;
* Adam, lr 7e-4, weight decay 1e-6, gradient norm clipped at 0.5, 50 epochs, stopped after
  50 // 6 = 8 epochs without a lower moving-average (0.95) training loss; the last weights are
  kept (Tenset selects nothing on validation data; validation metrics are only logged).

Input: the 164 per-store columns and the 8 workload columns (`workload_features`, default on:
the input MetaSchedule's port was configured for, 172; Tenset's own optional workload part was
a 160-number embedding from a pickle, which is not available here).
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from tcl.models.base import PerStoreCostModel
from tcl.models.checkpoint import read_checkpoint, save_checkpoint
from tcl.perstore import N_FEATURES, flat_stores

KIND = "mlp-tenset"
MODEL_FILE = "model.pt"
DEFAULT_CONFIG = {"hidden_dim": 256, "workload_features": True, "epochs": 50, "batch_size": 512,
                  "lr": 7e-4, "weight_decay": 1e-6, "grad_clip": 0.5}


def _library():
    """MetaSchedule's port of Tenset's network and loss."""
    from tvm.s_tir.meta_schedule.cost_model.mlp_model import SegmentSumMLP, lambda_rank_loss

    return SegmentSumMLP, lambda_rank_loss


class TensetNet(nn.Module):
    """MetaSchedule's `SegmentSumMLP` (``mlp``) behind Tenset's input normalisation: store rows
    (their first `n_columns` columns) divided by ``norm``, the training stores' column maxima."""

    def __init__(self, n_features: int, n_columns: int, hidden_dim: int):
        super().__init__()
        SegmentSumMLP, _ = _library()
        self.n_features = n_features  # what the checkpoint records as the model's input width
        self.mlp = SegmentSumMLP(input_dim=n_columns, hidden_dim=hidden_dim, output_dim=1)
        self.register_buffer("norm", torch.ones(n_columns))

    def forward(self, counts: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """(stores per program (B,), their rows (sum, >= n_columns)) -> scores (B,)."""
        rows = rows[:, :len(self.norm)] / self.norm
        return self.mlp(counts, rows).reshape(-1)  # the library's squeeze() makes one program a scalar


class TensetMLPModel(PerStoreCostModel):
    """Tenset's segment-sum MLP behind the CostModel interface (``net``: a TensetNet)."""

    kind = KIND
    warm_start = False

    def __init__(self, n_features: int = N_FEATURES, config: dict | None = None,
                 feature_meta: dict | None = None):
        super().__init__(n_features or N_FEATURES, {**DEFAULT_CONFIG, **(config or {})}, feature_meta)
        self.net = self._build()

    def _build(self) -> TensetNet:
        return TensetNet(self.n_features, self.n_columns, int(self.config["hidden_dim"])).eval()

    @staticmethod
    def _segments(x, mask) -> tuple[torch.Tensor, torch.Tensor]:
        """Padded (B, S, F) + mask -> (stores per program (B,), their rows (sum, F)) as tensors."""
        counts, rows = flat_stores(x, mask)
        return torch.from_numpy(counts), torch.from_numpy(np.ascontiguousarray(rows, np.float32))

    # -- training -------------------------------------------------------------------------------
    def fit(self, train_sets, valid_sets, train_params, out_dir, run=None, progress=None,
            resume=True, trainable=None, extra_losses=None) -> list[dict]:
        """Tenset's training (module docstring) on PerStoreSets, one per platform; writes
        model.pt and history.json. Of `train_params` only seed and threads apply."""
        from tcl.training import (DEFAULT_TRAIN, emit_metrics, epoch_batches, epoch_seed, feature_meta,
                                  seed_everything, validate, write_history)

        if trainable is not None or extra_losses:
            raise ValueError(f"{self.kind} models take no parameter filter or extra loss terms")
        _, loss_fn = _library()
        p = {**DEFAULT_TRAIN, **(train_params or {})}
        cfg, seed = self.config, int(p["seed"])
        torch.set_num_threads(int(p["threads"]))
        self.feature_meta = {**self.feature_meta, **feature_meta(train_sets)}
        inputs = [self.inputs(fs) for fs in train_sets]
        seed_everything(seed)
        self.net = self._build()
        stores = np.concatenate([fs.stores[:, :self.n_columns] for fs in train_sets])
        norm = stores.max(axis=0) if len(stores) else np.ones(self.n_columns, np.float32)
        self.net.norm.copy_(torch.from_numpy(np.where(norm > 0, norm, 1.0).astype(np.float32)))
        opt = torch.optim.Adam(self.net.parameters(), lr=float(cfg["lr"]), weight_decay=float(cfg["weight_decay"]))
        n_epochs = int(cfg["epochs"])
        patience = n_epochs // 6
        avg_loss, best_loss, best_epoch, history = None, math.inf, 0, []
        for epoch in range(n_epochs):
            start = time.perf_counter()
            es = epoch_seed(seed, epoch)
            seed_everything(es)
            self.net.train()
            seen = 0
            for si, index in epoch_batches(train_sets, int(cfg["batch_size"]), np.random.default_rng(es), by_task=False):
                (x, mask), fs = inputs[si], train_sets[si]
                y = torch.from_numpy(np.asarray(fs.y[index], np.float32))
                loss = loss_fn(self.net(*self._segments(x[index], mask[index])), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.net.parameters(), float(cfg["grad_clip"]))
                opt.step()
                value = float(loss.detach())
                avg_loss = value if avg_loss is None else 0.95 * avg_loss + 0.05 * value
                seen += len(index)
            seconds = time.perf_counter() - start
            record = {"epoch": epoch, "train_loss": avg_loss, "epoch_seconds": seconds,
                      "train_samples_per_s": seen / max(seconds, 1e-9),
                      "best_epoch": epoch}  # the weights kept are the last epoch's (Tenset's rule)
            if valid_sets:
                self.net.eval()
                record.update(validate(self, valid_sets, int(p["eval_batch_size"])))
            history.append(record)
            emit_metrics(run, epoch, record)
            if avg_loss < best_loss:
                best_loss, best_epoch = avg_loss, epoch
            elif epoch - best_epoch >= patience:
                break
        self.net.eval()
        out_dir = Path(out_dir)
        self.save(out_dir / MODEL_FILE, extra={"epoch": history[-1]["epoch"], "train_params": p})
        write_history(out_dir, history)
        return history

    # -- inference ------------------------------------------------------------------------------
    def predict(self, x: np.ndarray, mask: np.ndarray, dropout: bool = False) -> np.ndarray:
        with torch.inference_mode():
            return self.net(*self._segments(x, mask)).double().numpy()

    def embed(self, x: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """The segment sum of the encoded store rows (N, hidden_dim): what the residual layers and
        the decoder read."""
        counts, rows = self._segments(x, mask)
        with torch.inference_mode():
            encoded = self.net.mlp.encoder(rows[:, :self.n_columns] / self.net.norm)  # (stores, hidden)
            program = torch.repeat_interleave(torch.arange(len(counts)), counts)
            pooled = torch.zeros(len(counts), encoded.shape[1]).index_add_(0, program, encoded)
        return pooled.numpy()

    # -- persistence ----------------------------------------------------------------------------
    def save(self, path: str | os.PathLike, extra: dict | None = None) -> Path:
        return save_checkpoint(path, self.net, self.kind, self.config, self.feature_meta,
                               {**self.extra, **(extra or {})})

    @classmethod
    def load(cls, path: str | os.PathLike) -> "TensetMLPModel":
        state, info = read_checkpoint(path)
        if info["kind"] != cls.kind:
            raise ValueError(f"{path} holds a {info['kind']} model, not {cls.kind}")
        model = cls(int(info["n_features"]), info.get("config"), info.get("feature_meta"))
        model.net.load_state_dict(state, strict=True)
        model.extra = dict(info.get("extra") or {})
        return model
