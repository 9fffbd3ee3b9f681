"""The sampling interface: a pool of unlabelled programs, a budget, a `reveal` callback, rounds.

    selection = sampler.select(pool, budget, reveal, model=None)   # -> Selection (.indices)

* `pool` (:class:`Pool`): the candidate programs' step features and task structure, never a
  label: a sampler cannot read what it has not chosen.
* `reveal(indices) -> latencies (seconds)`: measures (or looks up) the chosen programs; the only
  way labels reach a sampler.
* `model`: a ``tcl.models.base.CostModel`` whose embedding and uncertainty serve from the first
  round (e.g. a family's KB), a list of them (an ensemble: the first serves the embedding, their
  disagreement is an uncertainty from the first round), or None (cold start).

Every strategy runs the same rounds (:meth:`Sampler.select`): choose this round's share of the
budget -> reveal its labels -> retrain the current model on everything revealed -> rescore. A
strategy only implements :meth:`Sampler.choose`, one round's pick from a :class:`RoundState`.
"""

from __future__ import annotations

import abc
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from tcl.sampling.learner import Learner, SampleSettings

# reveal(indices (k,) int64) -> latencies (k,) float64 seconds of those programs
Reveal = Callable[[np.ndarray], np.ndarray]


class SamplingError(ValueError):
    """A sampling request that cannot run (bad budget, a reveal that returned bad labels)."""


@dataclass
class Pool:
    """The programs to choose from, without labels: what is known before measuring them."""

    x: object                 # (N, L, F) float32 array-like, read in row slices (np.ndarray, np.memmap)
    mask: np.ndarray          # (N, L) bool, True on real steps
    task: np.ndarray          # (N,) int32 index into task_info["tasks"]
    task_info: dict = field(default_factory=dict)  # tasks, task_desc, task_weight, task_networks,
                                                   # task_network_weights, platform, meta (no labels)

    def __len__(self) -> int:
        return len(self.task)

    @classmethod
    def from_features(cls, fs) -> "Pool":
        """The pool of a FeatureSet's programs: its features and task metadata, not y/latency."""
        return cls(x=fs.x, mask=fs.mask, task=np.asarray(fs.task), task_info={
            "tasks": list(fs.tasks), "task_desc": list(fs.task_desc),
            "task_weight": np.asarray(fs.task_weight), "task_networks": list(fs.task_networks),
            "task_network_weights": list(fs.task_network_weights), "platform": fs.platform,
            "meta": dict(fs.meta), "program_id": np.asarray(fs.program_id)})

    def labelled_set(self, index: np.ndarray, latency: np.ndarray):
        """A FeatureSet of programs `index` with the revealed `latency`: y is normalised within
        each task over these programs only (all that is known after measuring them)."""
        from tcl.features import FeatureSet, task_labels

        index = np.asarray(index, np.int64)
        order = np.argsort(index, kind="stable")  # row slices of x read faster in order
        index, latency = index[order], np.asarray(latency, np.float64)[order]
        info = self.task_info
        used = np.unique(self.task[index])
        remap = np.full(max(len(info.get("tasks", ())), int(self.task.max()) + 1), -1, np.int32)
        remap[used] = np.arange(len(used), dtype=np.int32)
        task = remap[self.task[index]]
        n_tasks = len(info.get("tasks", ()))

        def pick(key, default):
            values = info.get(key)
            return [values[i] for i in used] if values is not None and n_tasks else [default(i) for i in used]

        weight = info.get("task_weight")
        program_id = info.get("program_id")
        return FeatureSet(
            x=np.asarray(self.x[index], np.float32), mask=np.asarray(self.mask[index], bool),
            y=task_labels(task, latency), latency=latency, task=task,
            program_id=(np.asarray(program_id)[index] if program_id is not None
                        else np.asarray([str(i) for i in index])),
            tasks=pick("tasks", str), task_desc=pick("task_desc", str),
            task_weight=(np.asarray(weight, np.float64)[used] if weight is not None and n_tasks
                         else np.ones(len(used))),
            task_networks=pick("task_networks", lambda i: []),
            task_network_weights=pick("task_network_weights", lambda i: {}),
            platform=str(info.get("platform", "pool")), meta=dict(info.get("meta") or {}))


@dataclass
class Selection:
    """What a sampler chose: indices into the pool in the order chosen, and one record per round."""

    indices: np.ndarray                          # (budget,) int64, distinct
    rounds: list[dict] = field(default_factory=list)
    seconds: float = 0.0                         # the sampler's own time (reveal excluded)


def split_budget(budget: int, rounds: int) -> list[int]:
    """`budget` over `rounds` as evenly as possible, the first rounds taking the remainder (the
    cold round is never smaller than the later ones); rounds with nothing to choose are dropped."""
    base, extra = divmod(int(budget), int(rounds))
    return [b for b in (base + (r < extra) for r in range(int(rounds))) if b > 0]


class RoundState:
    """What a strategy sees in one round: the pool, what is chosen and revealed so far, a seeded
    RNG, and (lazily, computed once per round) the current model's view of the pool."""

    def __init__(self, pool: Pool, round_index: int, chosen: np.ndarray, latency: np.ndarray,
                 rng: np.random.Generator, view):
        self.pool = pool
        self.round = round_index
        self.chosen = chosen          # (C,) int64 revealed so far
        self.latency = latency        # (C,) float64 their labels
        self.rng = rng
        self.view = view              # tcl.sampling.learner.PoolView of the current model (None: unused)
        self.record: dict = {}        # what the strategy reports about this round

    @property
    def unchosen(self) -> np.ndarray:
        keep = np.ones(len(self.pool), bool)
        keep[self.chosen] = False
        return np.flatnonzero(keep)


class Sampler(abc.ABC):
    """A selection strategy: `choose` one round; `select` runs the rounds."""

    name: str = ""
    uses_model: bool = True   # False: the strategy never looks at a model (random)

    def __init__(self, settings: SampleSettings | None = None, seed: int = 0, rounds: int = 1,
                 learner: Learner | None = None):
        self.settings = settings or SampleSettings()
        self.seed = int(seed)
        self.rounds = max(1, int(rounds))
        self.learner = learner or Learner(self.settings, seed=self.seed)

    @abc.abstractmethod
    def choose(self, state: RoundState, budget: int) -> np.ndarray:
        """`budget` distinct pool indices, none of them in ``state.chosen``."""

    def select(self, pool: Pool, budget: int, reveal: Reveal, model=None,
               known: tuple[np.ndarray, np.ndarray] | None = None, first_round: int = 0) -> Selection:
        """Choose `budget` programs of `pool` over this sampler's rounds.

        `known` = (indices, latencies) of programs revealed before this call (an active collection
        resumed, or driven one round at a time): they count as chosen and are never chosen again,
        and a model-using strategy retrains on them before its first round. `budget` counts only
        the new programs, and `first_round` numbers this call's rounds (their seeds and records)
        after those already run. The Selection holds only the new programs.
        """
        n = len(pool)
        budget = int(budget)
        chosen = np.zeros(0, np.int64) if known is None else np.asarray(known[0], np.int64)
        latency = np.zeros(0, np.float64) if known is None else np.asarray(known[1], np.float64)
        if chosen.shape != latency.shape or len(np.unique(chosen)) != len(chosen):
            raise SamplingError(f"known: {len(chosen)} distinct indices and {len(latency)} latencies expected")
        if len(chosen) and (chosen.min() < 0 or chosen.max() >= n or not np.all(np.isfinite(latency) & (latency > 0))):
            raise SamplingError("known: indices must be in the pool and latencies finite seconds > 0")
        if not 0 < budget <= n - len(chosen):
            raise SamplingError(f"budget {budget} must be in [1, {n - len(chosen)}] (the pool's size"
                                f"{f' less {len(chosen)} known' if len(chosen) else ''})")
        t_start, t_reveal = time.perf_counter(), 0.0
        n_known = len(chosen)
        members = given_members(model) if self.uses_model else []
        given = bool(members)   # the caller's model(s): their fine-tuned copies stay `given`
        if self.uses_model and n_known:
            members = self.learner.retrain(pool, members, chosen, latency, max(first_round - 1, 0))
        records = []
        budgets = split_budget(budget, self.rounds)
        for r, b in enumerate(budgets, start=int(first_round)):
            rng = np.random.default_rng([self.seed, r])
            view = self.learner.view(pool, members, chosen, latency, rng, given) if self.uses_model else None
            state = RoundState(pool, r, chosen, latency, rng, view)
            new = np.asarray(self.choose(state, b), np.int64)
            check_choice(new, b, chosen, n, self.name)
            t0 = time.perf_counter()
            revealed = np.asarray(reveal(new.copy()), np.float64)
            t_reveal += time.perf_counter() - t0
            if revealed.shape != new.shape or not np.all(np.isfinite(revealed) & (revealed > 0)):
                raise SamplingError(f"reveal returned {revealed.shape} latencies for {len(new)} programs "
                                    "(each must be a finite number of seconds > 0)")
            chosen = np.concatenate([chosen, new])
            latency = np.concatenate([latency, revealed])
            records.append({"round": r, "budget": int(b), "selected": int(len(new)),
                            "uncertainty": view.uncertainty_source if view is not None else None,
                            **state.record})
            if self.uses_model and r + 1 < first_round + len(budgets):
                members = self.learner.retrain(pool, members, chosen, latency, r)
        return Selection(indices=chosen[n_known:], rounds=records,
                         seconds=time.perf_counter() - t_start - t_reveal)


def given_members(model) -> list:
    """The caller's model argument as a list: [] (none), [model], or the ensemble's members."""
    if model is None:
        return []
    members = list(model) if isinstance(model, (list, tuple)) else [model]
    if any(m is None for m in members):
        raise SamplingError("an ensemble's members must all be models")
    return members


def check_choice(new: np.ndarray, budget: int, chosen: np.ndarray, n: int, name: str) -> None:
    """A strategy's pick must be `budget` distinct, new, in-range indices."""
    if len(new) != budget or len(np.unique(new)) != budget:
        raise AssertionError(f"{name}: chose {len(np.unique(new))} distinct of {budget} programs")
    if len(new) and (new.min() < 0 or new.max() >= n or np.isin(new, chosen).any()):
        raise AssertionError(f"{name}: chose an index out of range or already chosen")
