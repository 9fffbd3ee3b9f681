"""Hold out whole networks: every task a test network contains goes to the test split.

Records that name no network (most Ansor/Tenset logs) hold out a share of their tasks instead
(`test_fraction`). The remaining tasks are divided into train and validation (for early stopping)
by task, with a fixed seed, so no program of a validation or test task is ever trained on.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np

# a FeatureSet or a PerStoreSet (tcl.perstore), anything with their labels and `subset`: the split
# depends only on the tasks, so sets of the same programs split into the same programs
Programs = TypeVar("Programs")


def split_by_network(fs: Programs, test_networks: list[str], valid_fraction: float = 0.1,
                     seed: int = 0, test_fraction: float = 0.0) -> dict[str, Programs]:
    """train / valid / test of `fs` by task: the test networks' tasks, plus `test_fraction` of the
    other tasks drawn with `seed`, are the test split; `valid_fraction` of the rest is validation."""
    for name, share in (("valid_fraction", valid_fraction), ("test_fraction", test_fraction)):
        if not 0 <= share < 1:
            raise ValueError(f"{name} must be in [0, 1), not {share}")
    held = set(test_networks)
    missing = sorted(held - set(fs.networks()))
    if missing:
        known = ", ".join(fs.networks())
        raise ValueError(f"test network(s) {', '.join(missing)} not in the data "
                         + (f"(networks: {known})" if known else
                            "(its records name no network: pass an empty --test-networks and a "
                            "--test-fraction to hold out a share of its tasks)"))
    test_tasks = np.array([bool(held & set(nets)) for nets in fs.task_networks], bool)
    if test_fraction > 0:  # its own stream: the validation draw below is as without it
        rest = np.flatnonzero(~test_tasks)
        n_test = int(round(test_fraction * len(rest))) if len(rest) > 1 else 0
        test_tasks[np.random.default_rng([seed, 1]).permutation(rest)[:n_test]] = True
    rest = np.flatnonzero(~test_tasks)
    rng = np.random.default_rng(seed)
    n_valid = int(round(valid_fraction * len(rest))) if len(rest) > 1 else 0
    valid_tasks = np.zeros(len(fs.tasks), bool)
    valid_tasks[rng.permutation(rest)[:n_valid]] = True
    splits = {
        "train": ~test_tasks[fs.task] & ~valid_tasks[fs.task],
        "valid": valid_tasks[fs.task],
        "test": test_tasks[fs.task],
    }
    out = {}
    for name, keep in splits.items():
        sub = fs.subset(keep)
        sub.meta["split"] = {"name": name, "test_networks": sorted(held), "valid_fraction": valid_fraction,
                             "seed": seed, **({"test_fraction": test_fraction} if test_fraction else {})}
        out[name] = sub
    return out
