"""Sampling: which programs of a new platform to measure (RDU and its baselines) -> a target subset.

    from tcl.sampling import Pool, make_sampler
    sampler = make_sampler("rdu", settings, seed=0, rounds=3)
    selection = sampler.select(Pool.from_features(fs), budget, reveal, model=None)

    subset, selection = tcl.sampling.subset.sample_features(fs, 0.1, "rdu", params)   # `tcl sample`
    summary = tcl.sampling.active.collect_active(platform, tasks, out, ActiveSettings("rdu", budget=64))
                                                          # `tcl collect --sample`: measure only the chosen

A sampler sees a :class:`Pool` (features and tasks, no labels) and learns labels only through
`reveal(indices)`, round by round (choose -> reveal -> retrain -> rescore). Strategies:
``rdu`` (tcl.sampling.rdu) and the baselines ``random``, ``kmeans``, ``uncertainty``, ``balto``
(tcl.sampling.baselines). Settings: the ``sample:`` section of params.yaml
(:class:`SampleSettings`).
"""

from __future__ import annotations

from tcl.sampling.base import Pool, Reveal, RoundState, Sampler, SamplingError, Selection
from tcl.sampling.baselines import BaltoSampler, KMeansSampler, RandomSampler, UncertaintySampler
from tcl.sampling.learner import SampleSettings
from tcl.sampling.rdu import RDUSampler

# strategy name -> its Sampler class: the one place the strategies are named
STRATEGIES: dict[str, type[Sampler]] = {
    cls.name: cls for cls in (RDUSampler, RandomSampler, KMeansSampler, UncertaintySampler, BaltoSampler)}

__all__ = ["Pool", "Reveal", "RoundState", "Sampler", "SamplingError", "Selection", "SampleSettings",
           "STRATEGIES", "make_sampler"]


def make_sampler(strategy: str, settings: SampleSettings | None = None, seed: int = 0, rounds: int = 1) -> Sampler:
    if strategy not in STRATEGIES:
        raise SamplingError(f"unknown sampling strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    return STRATEGIES[strategy](settings, seed=seed, rounds=rounds)
