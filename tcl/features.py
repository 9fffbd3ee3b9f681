"""Step-sequence features (TLP's idea) and labelled per-platform feature sets.

Each schedule primitive becomes one row of F numbers:

    [ one-hot of its kind | first N_NUMERIC numeric arguments, signed log2 | string-token one-hot ]

and a program is its first `max_len` rows (query-only primitives such as GetLoops dropped: they
carry no decision), padded with zeros, plus a mask. Labels are per-task normalised throughput
`y = min latency in task / latency`, in (0, 1].
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .io import atomic_path
from .records import STEP_KINDS

FEATURE_VERSION = "steps-v1"
N_NUMERIC = 12
# Primitives that only look things up; dropping them keeps sequences short (MetaSchedule traces
# are ~2x longer than Ansor's) without losing a decision.
QUERY_KINDS = ("GetSBlock", "GetLoops", "GetChildBlocks", "GetProducers", "GetConsumers", "GetOutputBlocks")
STRING_VOCAB = (
    "global", "shared", "local", "local.pad",
    "meta_schedule.parallel", "meta_schedule.vectorize", "meta_schedule.unroll_explicit",
    "meta_schedule.unroll_implicit", "meta_schedule.tiling_structure", "meta_schedule.cooperative_fetch",
    "pragma_auto_unroll_max_step", "pragma_unroll_explicit", "auto_unroll_max_step",
    "SSRSRS", "SSSRRSRS",
)
OTHER_STRING = "<other>"


def vocabulary() -> dict:
    kinds = [k for k in STEP_KINDS if k not in QUERY_KINDS]
    return {"kinds": kinds, "strings": list(STRING_VOCAB) + [OTHER_STRING], "n_numeric": N_NUMERIC,
            "skipped_kinds": list(QUERY_KINDS)}


def vocabulary_hash(vocab: dict | None = None) -> str:
    return hashlib.sha1(json.dumps(vocab or vocabulary(), sort_keys=True).encode()).hexdigest()[:12]


class Featurizer:
    """Steps -> (N, L, F) float32 tensor + (N, L) bool mask."""

    def __init__(self, max_len: int = 48):
        self.max_len = max_len
        vocab = vocabulary()
        self.kind_index = {k: i for i, k in enumerate(vocab["kinds"])}
        self.skip = frozenset(QUERY_KINDS)
        self.num_offset = len(self.kind_index)
        self.str_offset = self.num_offset + N_NUMERIC
        self.string_index = {s: self.str_offset + i for i, s in enumerate(STRING_VOCAB)}
        self.other_string = self.str_offset + len(STRING_VOCAB)
        self.n_features = self.other_string + 1

    @property
    def meta(self) -> dict:
        return {"feature_version": FEATURE_VERSION, "max_len": self.max_len, "n_features": self.n_features,
                "vocab": vocabulary(), "vocab_hash": vocabulary_hash()}

    def __call__(self, programs: list[list]) -> tuple[np.ndarray, np.ndarray]:
        L, F = self.max_len, self.n_features
        n = len(programs)
        x = np.zeros((n, L, F), np.float32)
        lengths = np.zeros(n, np.int64)
        hot: list[int] = []  # flat indices set to 1
        num_pos: list[int] = []
        num_val: list[float] = []
        kind_index, skip, string_index = self.kind_index, self.skip, self.string_index
        other, num_offset = self.other_string, self.num_offset
        for p, steps in enumerate(programs):
            t = 0
            for step in steps:
                kind = step[0]
                if kind in skip:
                    continue
                if t == L:
                    break
                base = (p * L + t) * F
                hot.append(base + kind_index[kind])
                k = 0
                for a in step[1:]:
                    if type(a) is str:
                        token, _, number = a.partition("$")  # Ansor pragmas: "auto_unroll_max_step$16"
                        hot.append(base + string_index.get(token, other))
                        if number and k < N_NUMERIC:
                            try:
                                num_val.append(float(number))
                                num_pos.append(base + num_offset + k)
                                k += 1
                            except ValueError:
                                pass
                    elif k < N_NUMERIC:
                        num_pos.append(base + num_offset + k)
                        num_val.append(a)
                        k += 1
                t += 1
            lengths[p] = t
        flat = x.reshape(-1)
        flat[np.asarray(hot, np.int64)] = 1.0
        if num_val:
            v = np.asarray(num_val, np.float64)
            flat[np.asarray(num_pos, np.int64)] = (np.sign(v) * np.log2(1.0 + np.abs(v))).astype(np.float32)
        mask = np.arange(L)[None, :] < lengths[:, None]
        return x, mask


def task_labels(task: np.ndarray, latency: np.ndarray) -> np.ndarray:
    """y = min latency within the task / latency (in (0, 1]); guards non-finite values."""
    best = np.full(task.max() + 1 if len(task) else 0, np.inf)
    np.minimum.at(best, task, latency)
    y = best[task] / latency
    return np.where(np.isfinite(y) & (y > 0), y, 0.0).astype(np.float32)


@dataclass
class FeatureSet:
    """Features, labels and task metadata of one platform's programs."""

    x: np.ndarray
    mask: np.ndarray
    y: np.ndarray
    latency: np.ndarray
    task: np.ndarray
    program_id: np.ndarray
    tasks: list
    task_desc: list
    task_weight: np.ndarray
    task_networks: list  # list[list[str]]
    platform: str
    meta: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.y)

    def networks(self) -> list[str]:
        return sorted({n for nets in self.task_networks for n in nets})

    def subset(self, index) -> "FeatureSet":
        """Programs at `index`; tasks are re-indexed to those present, labels kept."""
        index = np.asarray(index)
        if index.dtype == bool:
            index = np.flatnonzero(index)
        used = np.unique(self.task[index])
        remap = np.full(len(self.tasks), -1, np.int32)
        remap[used] = np.arange(len(used), dtype=np.int32)
        return FeatureSet(
            x=self.x[index], mask=self.mask[index], y=self.y[index], latency=self.latency[index],
            task=remap[self.task[index]], program_id=self.program_id[index],
            tasks=[self.tasks[i] for i in used], task_desc=[self.task_desc[i] for i in used],
            task_weight=self.task_weight[used], task_networks=[self.task_networks[i] for i in used],
            platform=self.platform, meta=dict(self.meta),
        )

    def save(self, path: str | os.PathLike) -> None:
        with atomic_path(path, suffix=".npz") as tmp:
            with open(tmp, "wb") as f:
                np.savez(
                    f, x=self.x, mask=self.mask, y=self.y, latency=self.latency, task=self.task,
                    program_id=np.asarray(self.program_id, dtype=str),
                    tasks=np.asarray(self.tasks, dtype=str), task_desc=np.asarray(self.task_desc, dtype=str),
                    task_weight=self.task_weight,
                    task_networks=np.asarray([",".join(n) for n in self.task_networks], dtype=str),
                    platform=np.asarray(self.platform), meta=np.asarray(json.dumps(self.meta, sort_keys=True)),
                )

    @classmethod
    def load(cls, path: str | os.PathLike) -> "FeatureSet":
        try:
            z = np.load(path, allow_pickle=False)  # never unpickle
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: not a TCL feature file ({exc})") from None
        with z:
            required = {"x", "mask", "y", "latency", "task", "tasks", "meta"}
            if not required <= set(z.files):
                raise ValueError(f"{path}: not a TCL feature file (missing {sorted(required - set(z.files))})")
            meta = json.loads(str(z["meta"]))
            return cls(
                x=z["x"], mask=z["mask"], y=z["y"], latency=z["latency"], task=z["task"],
                program_id=z["program_id"], tasks=z["tasks"].tolist(), task_desc=z["task_desc"].tolist(),
                task_weight=z["task_weight"],
                task_networks=[[n for n in s.split(",") if n] for s in z["task_networks"].tolist()],
                platform=str(z["platform"]), meta=meta,
            )


def featurize_table(table, max_len: int = 48) -> FeatureSet:
    """Records table (from `tcl.records.ingest.read_records`) -> FeatureSet of one platform."""
    import orjson

    platforms = set(table.column("platform").to_pylist())
    if len(platforms) != 1:
        raise ValueError(f"a feature set holds one platform; got {sorted(platforms)}")
    featurizer = Featurizer(max_len)
    steps = [orjson.loads(s) for s in table.column("steps").to_pylist()]
    x, mask = featurizer(steps)
    task_ids = table.column("task_id").to_pylist()
    tasks = sorted(set(task_ids))
    index = {t: i for i, t in enumerate(tasks)}
    task = np.fromiter((index[t] for t in task_ids), np.int32, len(task_ids))
    latency = np.asarray(table.column("latency").to_numpy(), np.float64)
    first = {}
    for i, t in enumerate(task_ids):
        first.setdefault(t, i)
    desc = table.column("task_desc").to_pylist()
    weight = table.column("task_weight").to_pylist()
    nets = table.column("networks").to_pylist()
    return FeatureSet(
        x=x, mask=mask, y=task_labels(task, latency), latency=latency, task=task,
        program_id=np.asarray(table.column("program_id").to_pylist(), dtype=str),
        tasks=tasks, task_desc=[desc[first[t]] for t in tasks],
        task_weight=np.asarray([weight[first[t]] for t in tasks], np.float64),
        task_networks=[[n for n in nets[first[t]].split(",") if n] for t in tasks],
        platform=platforms.pop(), meta=featurizer.meta,
    )


def featurize_file(records_path: str | os.PathLike, out: str | os.PathLike, max_len: int = 48) -> FeatureSet:
    from .records.ingest import read_records

    fs = featurize_table(read_records(records_path), max_len)
    fs.meta["source"] = Path(records_path).name
    fs.save(out)
    return fs
