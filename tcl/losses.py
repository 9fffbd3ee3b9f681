"""Training losses for cost models, vectorised over a batch.

* `lambdarank_loss`: LambdaRank (Burges 2010) restricted to pairs of programs of the same task
  in the batch. For each pair (i, j) of one task with y_i > y_j the loss is

      |ΔNDCG_ij| · log(1 + exp(-σ (s_i - s_j)))

  where |ΔNDCG_ij| = |G_i - G_j| · |1/log2(2+r_i) - 1/log2(2+r_j)| / IDCG_task is the change in
  the task's NDCG if i and j swapped places in the current ranking (r = 0-based rank by score
  within the task, G = 2^y - 1, IDCG = the task's DCG in the ideal order). The weights are
  constants (no gradient flows through the ranks). Normalised by the number of pairs so the scale
  does not grow with batch size.
* `mse_loss`: mean squared error of the score against y (normalised throughput in (0, 1]).
* `no_loss` (``none``): zero; the labels are not used and only a job's extra loss terms train
  (the KD phase of continual learning: the KB learns from the AC's scores alone).

Rows whose label is not finite are ignored by both.
"""

from __future__ import annotations

import torch


def _rank_within_task(values: torch.Tensor, same: torch.Tensor) -> torch.Tensor:
    """0-based descending rank of each value among rows of its own task; ties broken by row index."""
    n = values.shape[0]
    idx = torch.arange(n, device=values.device)
    ahead = (values[None, :] > values[:, None]) | (
        (values[None, :] == values[:, None]) & (idx[None, :] < idx[:, None])
    )
    return (ahead & same).sum(dim=1)


def lambdarank_loss(scores: torch.Tensor, y: torch.Tensor, task: torch.Tensor, sigma: float = 1.0) -> torch.Tensor:
    """LambdaRank loss over same-task pairs of the batch. scores, y: (B,) float; task: (B,) int."""
    keep = torch.isfinite(y)
    if not bool(keep.all()):
        scores, y, task = scores[keep], y[keep], task[keep]
    if scores.numel() < 2:
        return scores.sum() * 0.0

    with torch.no_grad():
        s = scores.detach()
        same = task[:, None] == task[None, :]
        gain = torch.pow(2.0, y.to(s.dtype)) - 1.0
        rank = _rank_within_task(s, same).to(s.dtype)
        ideal_rank = _rank_within_task(y.to(s.dtype), same).to(s.dtype)
        discount = 1.0 / torch.log2(rank + 2.0)
        ideal_discount = 1.0 / torch.log2(ideal_rank + 2.0)
        # IDCG of each row's task, broadcast to the row: sum over same-task rows of gain/ideal_discount
        idcg = (same.to(s.dtype) * (gain * ideal_discount)[None, :]).sum(dim=1).clamp_min(1e-12)
        pair = same & (y[:, None] > y[None, :])  # i better than j, same task
        delta = (gain[:, None] - gain[None, :]).abs() * (discount[:, None] - discount[None, :]).abs()
        weight = torch.where(pair, delta / idcg[:, None], torch.zeros_like(delta))
        n_pairs = pair.sum()

    if int(n_pairs) == 0:
        return scores.sum() * 0.0
    diff = scores[:, None] - scores[None, :]
    # softplus(-σ·diff) = log(1 + exp(-σ (s_i - s_j))), numerically stable
    pair_loss = torch.nn.functional.softplus(-sigma * diff)
    return (weight * pair_loss).sum() / n_pairs.to(scores.dtype)


def mse_loss(scores: torch.Tensor, y: torch.Tensor, task: torch.Tensor | None = None) -> torch.Tensor:
    """Mean squared error against y; `task` is accepted (and ignored) for a uniform signature."""
    keep = torch.isfinite(y)
    if not bool(keep.any()):
        return scores.sum() * 0.0
    return torch.mean((scores[keep] - y[keep].to(scores.dtype)) ** 2)


def no_loss(scores: torch.Tensor, y: torch.Tensor | None = None, task: torch.Tensor | None = None) -> torch.Tensor:
    """Zero, with the graph of `scores` (so a job whose only terms are extra losses still trains)."""
    return scores.sum() * 0.0


LOSSES = {"lambdarank": lambdarank_loss, "mse": mse_loss, "none": no_loss}


def get_loss(name: str):
    try:
        return LOSSES[name]
    except KeyError:
        raise ValueError(f"unknown loss {name!r}; choose one of {sorted(LOSSES)}") from None
