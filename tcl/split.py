"""Hold out whole networks: every task a test network contains goes to the test split.

The remaining tasks are divided into train and validation (for early stopping) by task, with a
fixed seed, so no program of a validation or test task is ever trained on.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np

# a FeatureSet or a PerStoreSet (tcl.perstore), anything with their labels and `subset`: the split
# depends only on the tasks, so sets of the same programs split into the same programs
Programs = TypeVar("Programs")


def split_by_network(fs: Programs, test_networks: list[str], valid_fraction: float = 0.1,
                     seed: int = 0) -> dict[str, Programs]:
    held = set(test_networks)
    missing = sorted(held - set(fs.networks()))
    if missing:
        known = ", ".join(fs.networks())
        raise ValueError(f"test network(s) {', '.join(missing)} not in the data "
                         + (f"(networks: {known})" if known else
                            "(its records name no network: pass an empty --test-networks to split "
                            "by task only)"))
    test_tasks = np.array([bool(held & set(nets)) for nets in fs.task_networks], bool)
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
                             "seed": seed}
        out[name] = sub
    return out
