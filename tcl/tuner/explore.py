"""Exploration that follows the evidence: rank a share of the candidates at random while the
search steered by the KB has stopped finding faster programs (`tcl tune --explore SHARE`, off
by default).

    explore = Exploration(explore_params({"share_max": 0.2}), seed=0)
    explore.observe("dense_64", latency)          # each measured batch's mean latencies (s)
    scores = explore.apply("dense_64", scores)    # each predict chunk (positive scores)

MetaSchedule's search measures, each batch, the candidates its cost model scores highest plus a
fixed share (`eps_greedy`, 0.05) picked at random. Where the KB ranks a task's schedules badly, a
search it steers settles early on the wrong ones (docs/new-platform.md: with a quarter picked at
random the KB ended 8-12 % lower on the dense tasks where it had stalled, and 3.9 % higher on a
convolution it ranked well). The run's own evidence of that is progress: while the KB's picks
keep lowering the task's best latency, exploiting pays; after `patience` measured batches of a
task without a new best at least `min_gain` below the old one, `share_max` of each newly scored
chunk of that task gets a score drawn at random from the same chunk's scores (the scores'
distribution is unchanged; the chosen candidates' ranks are random), so about that share of the
candidates the search keeps, breeds from and measures are ones the KB did not prefer. A new best
ends the stall. The draws come from one generator seeded by the run's seed.

(The first reading tried, offline on the eps-0.05 validation runs' databases before any run with
it, was the Spearman correlation of the KB's scores with each measured batch's speed: within the
16 programs the KB itself preferred it averaged near 0.1 on every task, ±0.4 batch to batch, and
did not tell the tasks the KB ranks well from those it does not.)
"""

from __future__ import annotations

import numpy as np

DEFAULT_EXPLORE = {
    "share_max": 0.0,   # the share of candidates ranked at random while a task stalls (0: off)
    "patience": 2,      # measured batches of a task without progress before it counts as stalled
    "min_gain": 0.01,   # progress: a new best at least this fraction below the previous best
}


def explore_params(overrides: dict | None = None) -> dict:
    """`DEFAULT_EXPLORE`, then params.yaml ``tune.explore``, then `overrides`; unknown keys and
    values out of range raise."""
    from tcl.config import tune_settings

    p = tune_settings("explore", DEFAULT_EXPLORE, overrides)
    if not 0.0 <= float(p["share_max"]) <= 1.0:
        raise ValueError(f"tune.explore share_max must be in [0, 1], not {p['share_max']!r}")
    if int(p["patience"]) < 1:
        raise ValueError(f"tune.explore patience must be at least 1, not {p['patience']!r}")
    if not 0.0 <= float(p["min_gain"]) < 1.0:
        raise ValueError(f"tune.explore min_gain must be in [0, 1), not {p['min_gain']!r}")
    return p


def explore_for(cost_model: str, overrides: dict | None = None) -> dict | None:
    """The exploration a run of `cost_model` uses: tcl's settings (`explore_params`); None for a
    peer, which keeps MetaSchedule's search as it ships (a share above 0 asked of one raises)."""
    if cost_model == "tcl":
        return explore_params(overrides)
    if overrides and float(overrides.get("share_max", 0)) > 0:
        raise ValueError(f"--explore is for --cost-model tcl ({cost_model} keeps MetaSchedule's search as it is)")
    return None


class Exploration:
    """Per task: the best latency measured, the batches since it last fell enough, and the share
    of candidates ranked at random."""

    def __init__(self, params: dict, seed: int = 0):
        self.share_max = float(params["share_max"])
        self.patience = int(params["patience"])
        self.min_gain = float(params["min_gain"])
        self.rng = np.random.default_rng([int(seed), 11])
        self.best: dict[str, float] = {}
        self.stalled: dict[str, int] = {}  # measured batches since the last progress
        self.history: list[dict] = []      # per measured batch: task, measured, best, stalled, share after it

    def share(self, task: str) -> float:
        return self.share_max if self.stalled.get(task, 0) >= self.patience else 0.0

    def observe(self, task: str, latency: np.ndarray) -> None:
        """A measured batch of `task`: its mean latencies in seconds (inf: failed)."""
        latency = np.asarray(latency, np.float64)
        ok = latency[np.isfinite(latency) & (latency > 0)]
        best = self.best.get(task, float("inf"))
        if len(ok) and float(ok.min()) < best * (1.0 - self.min_gain):
            self.stalled[task] = 0
        else:
            self.stalled[task] = self.stalled.get(task, 0) + 1
        if len(ok):
            self.best[task] = min(best, float(ok.min()))
        self.history.append({"task": task, "measured": int(len(latency)), "best_s": self.best.get(task),
                             "stalled": self.stalled[task], "share": self.share(task)})

    def apply(self, task: str, scores: np.ndarray) -> np.ndarray:
        """`scores` (one chunk) with `share(task)` of them, chosen at random, replaced by scores
        drawn without replacement from the chunk; unchanged (the same array) at share 0."""
        share = self.share(task)
        if share <= 0.0 or len(scores) < 2:
            return scores
        chosen = np.flatnonzero(self.rng.random(len(scores)) < share)
        if len(chosen) == 0:
            return scores
        out = np.array(scores, np.float64)
        out[chosen] = self.rng.choice(scores, size=len(chosen), replace=False)
        return out
