"""The KD guard's cross-validated view of the target (``continual.kd_guard_folds``).

Why: the KD guard (``kd_guard: target``) picks, of the KB KD started from and every KD epoch, the
one that ranks the target best. It can only judge the target on programs KD did not train on: the
target's validation split, a handful of tasks (4 in the bundle). On a 10% subset that judgement is
mostly noise: in the study's x86-sse runs the guard kept the source KB in 6 of 9 seeds, while in 2
of the 3 seeds whose per-epoch held-out curves were recorded the later KD epochs ranked the
held-out networks higher (docs/continual.md, *A cross-validated KD guard*). The subset's own tasks
(23 in the bundle, ~13 programs each) would be more to judge on, but KD trains on them.

Cross-validation makes them judgeable. The subset's tasks are dealt into K folds; for each fold the
platform's whole learning (AC start, CL, KD; :func:`tcl.continual.schedule.learn_platform`) runs
again on a copy of the KB without the fold's programs, and the fold is scored after every KD epoch
(:class:`FoldProbe`). The guard then reads, for each epoch, the mean over tasks of each task's
score (``kd_guard_fold_metric``: pairwise accuracy, or task top-1 / top-5), over the validation
split's tasks (the real run's) and every fold's (the probe runs'): 27 tasks instead of 4 in the
bundle. Each task counts once: pooled by pairs, a validation task's 128 programs (16,256 ordered
pairs) would outweigh a fold task's ~13 (~150 pairs) by about 100 to 1 and hide the folds. KD's
early stopping is off under it (every epoch is judged by the guard). The real run is unchanged by
the probes (each training epoch seeds itself); the cost is K more runs of the platform's learning.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import tempfile
from pathlib import Path

import numpy as np

from tcl import metrics as M

log = logging.getLogger(__name__)

TaskScores = list[float]  # one score per task
FOLD_METRICS = ("pairwise", "task_top1", "task_top5")  # continual.kd_guard_fold_metric


def task_scores(model, fs, metric: str = "pairwise") -> TaskScores:
    """The model's score on each task of a feature set: its pairwise accuracy (every same-task pair
    with different latencies), or task_top1 / task_top5 (the best latency over the latency of the
    best of its top-1 / top-5 scored programs)."""
    scores = model.predict_features(fs)
    if metric == "pairwise":
        return list(M.pairwise_by_task(scores, fs.latency, fs.task).values())
    k = {"task_top1": 1, "task_top5": 5}[metric]
    return [e["best"] / e[k] for e in M.task_best_topk(scores, fs.latency, fs.task, (k,)).values()]


def pooled(*scores: TaskScores) -> float:
    """The mean over every task of the given lists (nan without any)."""
    every = [v for s in scores for v in s]
    return float(np.mean(every)) if every else float("nan")


def task_folds(task: np.ndarray, folds: int, seed: int) -> list[np.ndarray]:
    """Row indices of `folds` folds (fewer when there are fewer tasks) of whole tasks, dealt after
    a seeded shuffle, so that every fold holds whole tasks and the folds differ by at most one task."""
    tasks = np.unique(task)
    np.random.default_rng(seed).shuffle(tasks)
    k = min(int(folds), len(tasks))
    return [np.flatnonzero(np.isin(task, tasks[i::k])) for i in range(k)]


class FoldProbe:
    """A probe run's KD observer (PhaseLog calls ``observe`` after every epoch): the KB's score
    (`metric`, task_scores) on each task of the held-out fold, before KD (``start``) and after each
    epoch (``epochs``)."""

    def __init__(self, kb, fold, metric: str = "pairwise"):
        self.kb, self.fold, self.metric = kb, fold, metric
        self.start = task_scores(kb, fold, metric)
        self.epochs: list[TaskScores] = []

    def observe(self, epoch: int) -> dict:
        self.epochs.append(task_scores(self.kb, self.fold, self.metric))
        return {f"probe_{self.metric}": pooled(self.epochs[-1])}


@dataclasses.dataclass
class TargetCV:
    """What the folds' probe runs measured: the score (`metric`, task_scores) of every task of the
    held-out folds, for the starting KB and after each KD epoch (``epochs[e]``)."""

    folds: int
    tasks: int
    metric: str
    start: TaskScores
    epochs: list[TaskScores]

    def at(self, epoch: int | None) -> TaskScores | None:
        """The folds' task scores at KD epoch `epoch` (None: the starting KB); None past the probes' last epoch."""
        if epoch is None:
            return self.start
        return self.epochs[epoch] if epoch < len(self.epochs) else None

    def report(self) -> dict:
        return {"folds": self.folds, "tasks": self.tasks, "metric": self.metric, "start": pooled(self.start),
                "epochs": [pooled(c) for c in self.epochs]}


def target_cv(kb, data, seen: list, params: dict, cfg: dict, step: int, learn) -> TargetCV | None:
    """Run the platform's learning once per fold of `data.train`'s tasks (``cfg["kd_guard_folds"]``
    folds), each on a copy of `kb` without the fold, and pool the folds' KD curves. `learn` is
    learn_platform (passed in: it calls this). None when the subset has fewer than two tasks."""
    folds = task_folds(data.train.task, int(cfg["kd_guard_folds"]), int(cfg["kd_guard_fold_seed"]))
    if len(folds) < 2:
        log.warning("kd_guard_folds: %s has %d task(s): no cross-validation, the guard reads the "
                    "validation split alone", data.platform, len(folds))
        return None
    probes = []
    with tempfile.TemporaryDirectory(prefix="tcl-kd-cv-") as tmp:
        for k, rows in enumerate(folds):
            log.info("kd_guard_folds: %s fold %d/%d (%d programs held out)", data.platform, k + 1, len(folds),
                     len(rows))
            rest = np.setdiff1d(np.arange(len(data.train)), rows)
            fold_data = dataclasses.replace(data, train=data.train.subset(rest), curve=None)
            # the other platforms as they are (their curves are reports, not needed here)
            fold_seen = [fold_data if d.platform == data.platform else dataclasses.replace(d, curve=None)
                         for d in seen]
            probe_kb = copy.deepcopy(kb)
            probe = FoldProbe(probe_kb, data.train.subset(rows), cfg["kd_guard_fold_metric"])
            learn(probe_kb, fold_data, fold_seen, params, cfg, Path(tmp) / f"fold-{k}", step, probe=probe)
            probes.append(probe)
    n_epochs = min(len(p.epochs) for p in probes)
    start = [v for p in probes for v in p.start]
    epochs = [[v for p in probes for v in p.epochs[e]] for e in range(n_epochs)]
    return TargetCV(folds=len(folds), tasks=int(len(np.unique(data.train.task))),
                    metric=cfg["kd_guard_fold_metric"], start=start, epochs=epochs)
