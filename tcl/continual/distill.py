"""Ranking distillation between a frozen teacher and a student, and the teacher's weight Φ_t.

L_distill is the task loss itself (tcl.losses.lambdarank_loss, pairs of one task) with the
teacher's scores turned into soft targets: within each task, the teacher's scores are
standardised (z) and mapped to a pseudo-throughput ``exp(sharpness · (z − max z))`` in (0, 1],
the same range as the labels (``min latency / latency``). The student is thus asked to order the
programs of a task as the teacher does, with the top of the teacher's ranking weighted most
(LambdaRank's ΔNDCG), and the term has the scale of L_task, so β weighs the two as the paper
does. The teacher is frozen for the whole phase, so its targets are computed once per phase.

Φ_t, the weight of the KB's teaching on platform t (CL phase):

    q_t      = the KB's mean per-task Spearman correlation with the measured throughput of D_t's
               training programs (how well the KB already ranks platform t)
    Φ_t(e)   = max(floor, clip(q_t / trust, 0, 1) · decay^e)        e = 0-based epoch

A KB that ranks D_t no better than chance (q_t ≤ 0; negative transfer) teaches at the floor only;
one with q_t ≥ trust starts at full weight; either way the teaching fades over the epochs while
the AC's own data takes over. Constants: params.yaml ``continual.phi``; ``fixed`` (a number)
replaces the rule by a constant Φ_t (the ablation without a dynamic Φ; null: the rule).
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from tcl import metrics as M

DEFAULT_PHI = {"trust": 0.5, "floor": 0.1, "decay": 0.9, "fixed": None}


def teacher_targets(scores: np.ndarray, task: np.ndarray, sharpness: float = 1.0) -> np.ndarray:
    """Soft targets (N,) float32 in (0, 1] from a teacher's scores: per task, the standardised
    score z mapped to ``exp(sharpness · (z − max z))`` (the teacher's favourite gets 1)."""
    scores = np.nan_to_num(np.asarray(scores, dtype=np.float64), nan=-1e30)
    task = np.asarray(task)
    out = np.ones(len(scores), dtype=np.float64)
    for t in np.unique(task):
        rows = np.flatnonzero(task == t)
        s = scores[rows]
        sd = s.std()
        z = (s - s.mean()) / sd if sd > 0 else np.zeros_like(s)
        out[rows] = np.exp(float(sharpness) * (z - z.max()))
    return out.astype(np.float32)


def distill_term(targets: Sequence[np.ndarray], weight: Callable[[int], float]):
    """An extra loss term for tcl.training.fit_net: ``weight(epoch) · LambdaRank(student scores,
    teacher targets)`` on the batch's rows; `targets[i]` belongs to training set i."""
    import torch

    from tcl.losses import lambdarank_loss

    tensors = [torch.from_numpy(np.ascontiguousarray(t, dtype=np.float32)) for t in targets]

    def term(batch, scores, model):
        y = tensors[batch.platform][torch.from_numpy(batch.rows)]
        return float(weight(batch.epoch)) * lambdarank_loss(scores, y, batch.task)

    return term


def teacher_quality(teacher, fs) -> float:
    """q_t: the teacher's mean per-task Spearman correlation on a FeatureSet (nan: undefined)."""
    return float(M.evaluate(teacher.predict_features(fs), fs)["spearman"])


def phi_at(epoch: int, quality: float, phi: dict) -> float:
    """Φ_t at a 0-based epoch for a teacher of quality q_t (see the module docstring)."""
    p = {**DEFAULT_PHI, **(phi or {})}
    floor, decay, trust = float(p["floor"]), float(p["decay"]), float(p["trust"])
    if not (0.0 <= floor <= 1.0 and 0.0 < decay <= 1.0 and trust > 0):
        raise ValueError(f"continual.phi needs 0 <= floor <= 1, 0 < decay <= 1, trust > 0 (got {p})")
    if p["fixed"] is not None:
        if not 0.0 <= float(p["fixed"]) <= 1.0:
            raise ValueError(f"continual.phi.fixed must be null or in [0, 1], not {p['fixed']!r}")
        return float(p["fixed"])
    start = min(max(quality / trust, 0.0), 1.0) if math.isfinite(quality) else 0.0
    return max(floor, start * decay ** int(epoch))
