"""A sampled subset of a labelled feature set: what `tcl sample` writes (a FeatureSet, the format
`tcl train` reads).

The feature set's labels reach the sampler only through `reveal`, for the programs it chose.
The subset's y is normalised within each task over the chosen programs (what measuring only
them yields), and its meta records how it was chosen (``meta["sample"]``).
"""

from __future__ import annotations

import math

import numpy as np

from tcl.sampling import Pool, SampleSettings, SamplingError, Selection, make_sampler
from tcl.sampling.base import given_members

RUN_DEFAULTS = {"strategy": "rdu", "ratio": 0.1, "rounds": 3, "seed": 0}


def run_settings(params: dict | None) -> dict:
    """strategy / ratio / rounds / seed of params.yaml `sample:` (defaults: RUN_DEFAULTS)."""
    section = (params or {}).get("sample") or {}
    return {k: section.get(k, v) for k, v in RUN_DEFAULTS.items()}


def budget_of(n: int, ratio: float) -> int:
    """Programs to choose for `ratio` of `n` (at least one)."""
    if not (isinstance(ratio, (int, float)) and math.isfinite(ratio) and 0 < ratio <= 1):
        raise SamplingError(f"ratio must be in (0, 1], got {ratio}")
    if n == 0:
        raise SamplingError("the feature set has no programs to choose from")
    return max(1, min(n, int(round(ratio * n))))


def sample_features(fs, ratio: float, strategy: str, params: dict | None = None, model=None,
                    rounds: int | None = None, seed: int | None = None, model_ref: str | list | None = None):
    """(subset FeatureSet, Selection): `ratio` of `fs`'s programs chosen by `strategy`; `model`
    (a CostModel, or a list of them: an ensemble) serves embedding and uncertainty from the first
    round."""
    run = run_settings(params)
    rounds = int(run["rounds"] if rounds is None else rounds)
    seed = int(run["seed"] if seed is None else seed)
    if rounds < 1:
        raise SamplingError(f"rounds must be >= 1, got {rounds}")
    settings = SampleSettings.from_params(params)
    from tcl.features import FeatureKindError

    for member in given_members(model):
        try:
            member.check_features(fs)
        except FeatureKindError as exc:
            raise SamplingError(f"the model cannot score these programs: {exc}") from None
    budget = budget_of(len(fs), ratio)
    latency = np.asarray(fs.latency, np.float64)

    def reveal(index: np.ndarray) -> np.ndarray:
        return latency[index]

    sampler = make_sampler(strategy, settings, seed=seed, rounds=rounds)
    selection: Selection = sampler.select(Pool.from_features(fs), budget, reveal, model=model)
    return subset_of(fs, selection, strategy=strategy, ratio=ratio, seed=seed, rounds=rounds,
                     settings=settings, model_ref=model_ref), selection


def subset_of(fs, selection: Selection, **how):
    """The chosen programs of `fs` (in pool order), y renormalised within each task over them,
    with ``meta["sample"]`` recording how they were chosen, and by which code on which CPU: a
    model-guided sampler's choice moves with float-level changes to the KB it trains between
    rounds (docs/sampling.md, *Today's code on the 512-a-task pool*)."""
    from tcl.features import task_labels
    from tcl.hardware import local_cpu_id, local_cpu_model
    from tcl.tracking import git_commit

    sub = fs.subset(np.sort(selection.indices))
    sub.y = task_labels(sub.task, sub.latency)
    settings = how.pop("settings", None)
    sub.meta["sample"] = {
        **{k: v for k, v in how.items() if v is not None},
        "selected": int(len(selection.indices)), "pool": int(len(fs)),
        "round_sizes": [r["selected"] for r in selection.rounds], "rounds_detail": selection.rounds,
        "seconds": round(float(selection.seconds), 3),
        "settings": settings.as_dict() if settings is not None else None,
        "labels": "y normalised within each task over the chosen programs",
        "git_commit": git_commit(), "host_cpu": local_cpu_model(), "host_cpu_id": local_cpu_id(),
    }
    return sub

