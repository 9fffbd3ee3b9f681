"""Tenset's MLP cost model on per-store features (Tenset `auto_scheduler/cost_model/mlp_model.py`).

The network and the loss are MetaSchedule's port of Tenset's, used as they are:
`SegmentSumMLP` (each store row -> Linear-ReLU-Linear-ReLU to `hidden_dim`, summed over the
program's stores, two residual Linear-ReLU layers, Linear to the score) and `lambda_rank_loss`
(LambdaRank over all pairs of the batch, NDCG weights), both from
`tvm.s_tir.meta_schedule.cost_model.mlp_model`. The training procedure is Tenset's
`MLPModelInternal._fit_a_model` with `loss_type="lambdaRankLoss"`, written here because
MetaSchedule's trainer wants tuning contexts and a database:

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

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

KIND = "mlp-tenset"
FORMAT = "tcl-tenset-mlp"
DEFAULT_CONFIG = {"hidden_dim": 256, "workload_features": True, "epochs": 50, "batch_size": 512,
                  "lr": 7e-4, "weight_decay": 1e-6, "grad_clip": 0.5}


def _library():
    """MetaSchedule's port of Tenset's network and loss."""
    from tvm.s_tir.meta_schedule.cost_model.mlp_model import SegmentSumMLP, lambda_rank_loss

    return SegmentSumMLP, lambda_rank_loss


@dataclass
class TensetMLPCostModel:
    config: dict = field(default_factory=lambda: dict(DEFAULT_CONFIG))
    feature_meta: dict = field(default_factory=dict)
    net: object = None
    norm: np.ndarray | None = None   # (F,) column maxima of the training stores
    n_threads: int = 2

    kind = KIND

    @property
    def cfg(self) -> dict:
        return {**DEFAULT_CONFIG, **self.config}

    def _columns(self, ps) -> int:
        return int(ps.stores.shape[1]) if self.cfg["workload_features"] else int(ps.meta.get("n_store_features", 164))

    def _build(self, n_features: int):
        SegmentSumMLP, _ = _library()
        return SegmentSumMLP(input_dim=n_features, hidden_dim=int(self.cfg["hidden_dim"]), output_dim=1)

    def _batch(self, ps, index: np.ndarray):
        """(segment sizes, normalised store rows) of the programs at `index`, as torch tensors."""
        import torch

        counts = np.diff(ps.offsets)[index]
        rows = np.repeat(ps.offsets[:-1][index] - np.cumsum(counts) + counts, counts) + np.arange(int(counts.sum()))
        x = ps.stores[rows, :len(self.norm)] / self.norm
        return torch.from_numpy(counts.astype(np.int64)), torch.from_numpy(np.ascontiguousarray(x, np.float32))

    def _scores(self, ps, index: np.ndarray):
        sizes, x = self._batch(ps, index)
        return self.net(sizes, x).reshape(-1)  # the library's squeeze() makes one program a scalar

    # -- training -------------------------------------------------------------------------------
    def fit(self, train_sets, valid_sets=(), seed: int = 0, on_epoch=None) -> list[dict]:
        """Tenset's training on PerStoreSets (one per platform); returns per-epoch records."""
        import time

        import torch

        from tcl.training import epoch_batches, epoch_seed, seed_everything, validate

        _, loss_fn = _library()
        cfg = self.cfg
        torch.set_num_threads(self.n_threads)
        cols = self._columns(train_sets[0])
        stores = np.concatenate([ps.stores[:, :cols] for ps in train_sets])
        norm = stores.max(axis=0) if len(stores) else np.ones(cols, np.float32)
        self.norm = np.where(norm > 0, norm, 1.0).astype(np.float32)
        seed_everything(seed)
        self.net = self._build(cols)
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
                ps = train_sets[si]
                y = torch.from_numpy(np.asarray(ps.y[index], np.float32))
                loss = loss_fn(self._scores(ps, index), y)
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
                record.update(validate(self, valid_sets))
            history.append(record)
            if on_epoch is not None:
                on_epoch(epoch, record)
            if avg_loss < best_loss:
                best_loss, best_epoch = avg_loss, epoch
            elif epoch - best_epoch >= patience:
                break
        self.net.eval()
        return history

    # -- inference ------------------------------------------------------------------------------
    def predict(self, ps, batch_size: int = 4096) -> np.ndarray:
        """Scores (higher = faster) of every program of a PerStoreSet."""
        import torch

        if self.net is None:
            raise RuntimeError("model is not trained or loaded")
        out = []
        with torch.inference_mode():
            for a in range(0, len(ps), batch_size):
                out.append(self._scores(ps, np.arange(a, min(a + batch_size, len(ps)))).double().numpy())
        return np.concatenate(out) if out else np.zeros(0)

    # -- persistence ----------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> Path:
        """Tensors + JSON in one torch file (loadable with weights_only=True), written atomically."""
        import torch

        from tcl.io import atomic_path

        if self.net is None:
            raise RuntimeError("nothing to save: model is not trained")
        info = {"kind": KIND, "config": self.config, "feature_meta": self.feature_meta,
                "n_features": int(len(self.norm))}
        payload = {"format": FORMAT, "info_json": json.dumps(info, sort_keys=True, default=str),
                   "state_dict": {k: v.detach().cpu().clone() for k, v in self.net.state_dict().items()},
                   "norm": torch.from_numpy(self.norm)}
        with atomic_path(path, suffix=".pt") as tmp:
            torch.save(payload, tmp)
        return Path(path)

    @classmethod
    def load(cls, path: str | os.PathLike, n_threads: int = 2) -> "TensetMLPCostModel":
        import torch

        payload = torch.load(Path(path), map_location="cpu", weights_only=True)
        if not is_payload(payload):
            raise ValueError(f"{path} is not a {KIND} model")
        info = json.loads(payload["info_json"])
        model = cls(config=info["config"], feature_meta=info["feature_meta"],
                    norm=payload["norm"].numpy(), n_threads=n_threads)
        model.net = model._build(int(info["n_features"]))
        model.net.load_state_dict(payload["state_dict"], strict=True)
        model.net.eval()
        return model

    @property
    def info(self) -> dict:
        return {"kind": KIND, "config": self.config, "feature_meta": self.feature_meta}


def is_payload(payload) -> bool:
    return isinstance(payload, dict) and payload.get("format") == FORMAT


def train(train_sets, valid_sets, config: dict, p: dict, out_dir: Path, run=None):
    """`tcl.training.train_model` for this kind: Tenset's training, then model.pt + history.json."""
    from tcl.io import atomic_write_json
    from tcl.training import HISTORY_FILE, MODEL_FILE, _emit, _feature_meta

    model = TensetMLPCostModel(config=dict(config or {}), feature_meta=_feature_meta(train_sets),
                               n_threads=int(p["threads"]))
    history = model.fit(train_sets, valid_sets, seed=int(p["seed"]), on_epoch=lambda e, r: _emit(run, e, r))
    model.save(out_dir / MODEL_FILE)
    atomic_write_json(out_dir / HISTORY_FILE, history)
    return model, history
