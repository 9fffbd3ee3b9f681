"""Step-sequence features (TLP's idea) and labelled per-platform feature sets.

Each schedule primitive becomes one row of F numbers:

    [ one-hot of its kind | first N_NUMERIC numeric arguments, signed log2 | string-token one-hot ]

and a program is its first `max_len` rows (query-only primitives such as GetLoops dropped: they
carry no decision), padded with zeros, plus a mask. Labels are per-task normalised throughput
`y = min latency in task / latency`, in (0, 1].
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, TypeVar

import numpy as np
import orjson

from .io import atomic_path
from .npzfile import stored_rows, write_npz
from .records import ANSOR_STEP_KINDS, STEP_KINDS, gc_paused

FEATURE_VERSION = "steps-v2"  # v2: MetaSchedule loop inputs carry their position (no collisions)
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


def features_vocab_hash(feature_meta: dict) -> str:
    """The vocabulary hash of a FeatureSet/featurizer meta: its ``vocab_hash``, else computed from
    its ``vocab``; "" when it records neither."""
    vocab = feature_meta.get("vocab")
    return str(feature_meta.get("vocab_hash") or (vocabulary_hash(vocab) if vocab else ""))


class Featurizer:
    """Steps -> (N, L, F) float32 tensor + (N, L) bool mask.

    Each distinct step is encoded once and kept as a row of a table (programs of a task share
    most steps); a program's rows are then gathered from it. Flat steps (all MetaSchedule ones)
    are looked up by their tuple, nested ones (Ansor's factor lists) by their JSON text.
    """

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
        self.max_cached_steps = 200_000
        self._rows: dict = {}  # step key -> row of self._table
        self._table = np.zeros((1024, self.n_features), np.float32)  # row 0: padding, stays zero
        self._n_rows = 1
        self.steps_encoded = 0  # cache misses since construction (benchmarks report the share)

    @property
    def meta(self) -> dict:
        return {"feature_version": FEATURE_VERSION, "max_len": self.max_len, "n_features": self.n_features,
                "vocab": vocabulary(), "vocab_hash": vocabulary_hash()}

    def __call__(self, programs: list[list]) -> tuple[np.ndarray, np.ndarray]:
        L, F = self.max_len, self.n_features
        skip, rows, row_of, dumps, nested = self.skip, self._rows, self._row_of, orjson.dumps, _NESTED_KINDS
        ids: list[int] = []
        lengths: list[int] = []
        for steps in programs:
            kept = [s for s in steps if s[0] not in skip]
            if len(kept) > L:
                kept = kept[:L]
            lengths.append(len(kept))
            if not kept:
                continue
            keys = [dumps(s) for s in kept] if kept[0][0] in nested else [tuple(s) for s in kept]
            try:
                found = [rows.get(k) for k in keys]
            except TypeError:  # a nested argument in a step of a usually flat kind
                keys = [dumps(s) for s in kept]
                found = [rows.get(k) for k in keys]
            if None in found:
                found = [i if i is not None else rows.get(k) if k in rows else row_of(k, s)
                         for i, k, s in zip(found, keys, kept)]
            ids.extend(found)
        lengths_arr = np.asarray(lengths, np.int64)
        mask = np.arange(L)[None, :] < lengths_arr[:, None]
        # table row of every (program, t): the kept steps' rows in mask order, the zero row elsewhere
        index = np.zeros(len(programs) * L, np.int64)
        index[mask.reshape(-1)] = ids
        x = self._table[index]
        if self._n_rows > self.max_cached_steps:  # bound memory on huge, diverse inputs
            self._rows.clear()
            self._n_rows = 1
        return x.reshape(len(programs), L, F), mask

    def _row_of(self, key, step: list) -> int:
        """Encode one step into the next free row of the table."""
        i = self._n_rows
        if i == len(self._table):
            self._table = np.concatenate([self._table, np.zeros_like(self._table)])
        row = self._table[i]
        row[:] = 0.0
        step = flatten_step(step)
        row[self.kind_index[step[0]]] = 1.0
        k = 0
        for a in step[1:]:
            if a.__class__ is str:
                token, _, number = a.partition("$")  # Ansor pragmas: "auto_unroll_max_step$16"
                row[self.string_index.get(token, self.other_string)] = 1.0
                if not number or k >= N_NUMERIC:
                    continue
                try:
                    a = float(number)
                except ValueError:
                    continue
            elif a.__class__ not in _NUMBERS or k >= N_NUMERIC:
                continue  # None (an absent optional attribute) carries no number
            # a flag (True/False) counts as 1/0: it is a decision, and a tuple key equates True with 1
            row[self.num_offset + k] = math.copysign(math.log2(1.0 + abs(a)), a)
            k += 1
        self._rows[key] = i
        self._n_rows = i + 1
        self.steps_encoded += 1
        return i


_NUMBERS = frozenset((int, float, bool))
# Ansor steps nest their arguments (factor lists, iterator lists): looked up by JSON text
_NESTED_KINDS = frozenset(ANSOR_STEP_KINDS)


def flatten_step(step: list) -> list:
    """["SP", 2, 0, 128, [2, 2, 2, 16], 1] -> ["SP", 2, 0, 128, 2, 2, 2, 16, 1]."""
    flat = [step[0]]
    for a in step[1:]:
        if a.__class__ is list:
            flat.extend(flatten_step([None, *a])[1:])
        else:
            flat.append(a)
    return flat


def task_labels(task: np.ndarray, latency: np.ndarray) -> np.ndarray:
    """y = min latency within the task / latency (in (0, 1]); guards non-finite values."""
    best = np.full(task.max() + 1 if len(task) else 0, np.inf)
    np.minimum.at(best, task, latency)
    y = best[task] / latency
    return np.where(np.isfinite(y) & (y > 0), y, 0.0).astype(np.float32)


@dataclass(kw_only=True)
class ProgramLabels:
    """The labels and task metadata a feature set carries beside its features (FeatureSet here,
    tcl.perstore.PerStoreSet), and what is done with them alone."""

    y: np.ndarray            # (N,) float32 = min latency in task / latency, in (0, 1]
    latency: np.ndarray      # (N,) float64 seconds
    task: np.ndarray         # (N,) int32 index into tasks
    program_id: np.ndarray   # (N,) str
    tasks: list
    task_desc: list
    task_weight: np.ndarray  # occurrences over all networks
    task_networks: list  # list[list[str]]
    platform: str
    meta: dict = field(default_factory=dict)
    # per task {network: occurrences in that network}; None: each network gets task_weight
    task_network_weights: list | None = None

    def __post_init__(self):
        if self.task_network_weights is None:
            self.task_network_weights = [{n: float(w) for n in nets}
                                         for nets, w in zip(self.task_networks, self.task_weight)]

    def __len__(self) -> int:
        return len(self.y)

    def networks(self) -> list[str]:
        return sorted({n for nets in self.task_networks for n in nets})


@dataclass
class FeatureSet(ProgramLabels):
    """Step-sequence features, labels and task metadata of one platform's programs."""

    x: np.ndarray     # (N, L, F) float32; a tcl.npzfile.StoredRows when loaded with stored_x
    mask: np.ndarray  # (N, L) bool, True on real steps

    def subset(self, index) -> "FeatureSet":
        """Programs at `index`; tasks are re-indexed to those present, labels kept. Stored rows
        stay in the file (a view of the chosen rows, read when used or saved)."""
        index = np.asarray(index)
        if index.dtype == bool:
            index = np.flatnonzero(index)
        return FeatureSet(x=self.x.take(index, axis=0), mask=self.mask[index], **subset_labels(self, index))

    def save(self, path: str | os.PathLike) -> None:
        save_npz(path, {"x": self.x, "mask": self.mask, **label_arrays(self)})

    @classmethod
    def load(cls, path: str | os.PathLike, stored_x: bool = False) -> "FeatureSet":
        """The feature set at `path`; `stored_x`: x stays in the file, read row by row on use
        (tcl.npzfile.StoredRows; the rest is loaded), for files larger than memory."""
        with open_npz(path, ("x", "mask"), "feature file") as z:
            x = stored_rows(path, "x") if stored_x else None
            return cls(x=z["x"] if x is None else x, mask=z["mask"], **read_labels(z))


# ---------------------------------------------------------------------------------------------
# the labels and task metadata every feature file carries beside its features (FeatureSet here,
# tcl.perstore.PerStoreSet): one way to subset, write and read them

LABEL_ARRAYS = ("y", "latency", "task", "tasks", "meta")  # what a feature file must hold besides its features


def subset_labels(s, index: np.ndarray) -> dict:
    """The label fields of programs `index` (an int array) of a feature set `s`, tasks
    re-indexed to those present: keyword arguments for the set's constructor."""
    used = np.unique(s.task[index])
    remap = np.full(len(s.tasks), -1, np.int32)
    remap[used] = np.arange(len(used), dtype=np.int32)
    return dict(
        y=s.y[index], latency=s.latency[index], task=remap[s.task[index]], program_id=s.program_id[index],
        tasks=[s.tasks[i] for i in used], task_desc=[s.task_desc[i] for i in used],
        task_weight=s.task_weight[used], task_networks=[s.task_networks[i] for i in used],
        platform=s.platform, meta=dict(s.meta),
        task_network_weights=[dict(s.task_network_weights[i]) for i in used],
    )


def label_arrays(s) -> dict[str, np.ndarray]:
    """The label fields of a feature set `s` as the arrays its .npz file holds (no objects)."""
    return dict(
        y=s.y, latency=s.latency, task=s.task, program_id=np.asarray(s.program_id, dtype=str),
        tasks=np.asarray(s.tasks, dtype=str), task_desc=np.asarray(s.task_desc, dtype=str),
        task_weight=s.task_weight,
        task_networks=np.asarray([",".join(n) for n in s.task_networks], dtype=str),
        task_network_weights=np.asarray([json.dumps(w, sort_keys=True) for w in s.task_network_weights], dtype=str),
        platform=np.asarray(s.platform), meta=np.asarray(json.dumps(s.meta, sort_keys=True)),
    )


def read_labels(z) -> dict:
    """The label fields from an open .npz written with `label_arrays`: constructor keywords."""
    # files written before per-network weights lack the field: each network then gets task_weight
    network_weights = ([json.loads(s) for s in z["task_network_weights"].tolist()]
                       if "task_network_weights" in z.files else None)
    return dict(
        y=z["y"], latency=z["latency"], task=z["task"], program_id=z["program_id"],
        tasks=z["tasks"].tolist(), task_desc=z["task_desc"].tolist(), task_weight=z["task_weight"],
        task_networks=[[n for n in s.split(",") if n] for s in z["task_networks"].tolist()],
        platform=str(z["platform"]), meta=json.loads(str(z["meta"])), task_network_weights=network_weights,
    )


def save_npz(path: str | os.PathLike, arrays: dict) -> None:
    """Write `arrays` as an uncompressed .npz, atomically (temp file + rename); stored rows are
    copied chunk by chunk (tcl.npzfile.write_npz)."""
    with atomic_path(path, suffix=".npz") as tmp:
        with open(tmp, "wb") as f:
            write_npz(f, arrays)


@contextlib.contextmanager
def open_npz(path: str | os.PathLike, features: tuple[str, ...], what: str):
    """An open .npz (never unpickled) holding `features` and the label arrays; ValueError naming
    the file otherwise. `what` names the kind of file in the error."""
    try:
        z = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a TCL {what} ({exc})") from None
    with z:
        required = {*features, *LABEL_ARRAYS}
        if not required <= set(z.files):
            raise ValueError(f"{path}: not a TCL {what} (missing {sorted(required - set(z.files))})")
        yield z


def featurize_table(table, max_len: int = 48) -> FeatureSet:
    """Records table (from `tcl.records.ingest.read_records`) -> FeatureSet of one platform."""
    import orjson

    platforms = set(table.column("platform").to_pylist())
    if len(platforms) != 1:
        raise ValueError(f"a feature set holds one platform; got {sorted(platforms)}")
    featurizer = Featurizer(max_len)
    with gc_paused():
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
    # records ingested before per-network weights: None, each network then gets task_weight
    net_weights = (table.column("network_weights").to_pylist()
                   if "network_weights" in table.column_names else None)
    return FeatureSet(
        x=x, mask=mask, y=task_labels(task, latency), latency=latency, task=task,
        program_id=np.asarray(table.column("program_id").to_pylist(), dtype=str),
        tasks=tasks, task_desc=[desc[first[t]] for t in tasks],
        task_weight=np.asarray([weight[first[t]] for t in tasks], np.float64),
        task_networks=[[n for n in nets[first[t]].split(",") if n] for t in tasks],
        platform=platforms.pop(), meta=featurizer.meta,
        task_network_weights=[json.loads(net_weights[first[t]]) for t in tasks] if net_weights else None,
    )


def featurize_file(records_path: str | os.PathLike, out: str | os.PathLike, max_len: int = 48) -> FeatureSet:
    from .records.ingest import read_provenance, read_records

    table = read_records(records_path)
    fs = featurize_table(table, max_len)
    fs.meta["source"] = Path(records_path).name
    if (origin := read_provenance(table)) is not None:
        fs.meta["provenance"] = origin
    fs.save(out)
    return fs


class FeatureFileError(ValueError):
    """A file that cannot be used as a feature set; the message names the file and the reason."""


class FeatureKindError(ValueError):
    """A feature set of another kind than a model reads (step sequences vs per-store rows)."""


def load_feature_set(path: str | os.PathLike, stored_x: bool = False, finite_only: bool = True) -> FeatureSet:
    """FeatureSet.load with one clear error (FeatureFileError) for anything that is not one;
    `stored_x`: x read from the file on use (see FeatureSet.load). `finite_only` (in-memory x):
    programs whose features hold NaN/inf are left out with a warning naming the file and rows (a
    net scores such a program NaN, and training skips every batch holding one), so one bad
    program does not stop the rest; callers that must keep the rows (scores per row) pass False."""
    fs = read_feature_file(path, lambda p: FeatureSet.load(p, stored_x=stored_x))
    n = len(fs.y)
    if fs.x.ndim != 3 or fs.mask.shape != fs.x.shape[:2] or not (len(fs.x) == len(fs.task) == n):
        raise FeatureFileError(f"{path}: inconsistent arrays (x {fs.x.shape}, mask {fs.mask.shape}, "
                               f"y {fs.y.shape}, task {fs.task.shape})")
    if finite_only and not stored_x:
        bad = nonfinite_programs(fs.x)
        if len(bad):
            cols = nonfinite_columns(fs.x, bad)
            logging.getLogger(__name__).warning(
                f"warning: {path}: skipped {len(bad)} of {n} programs whose features are not finite "
                f"(NaN/inf; rows {_first(bad)}; feature columns {_first(cols)}); re-make the file with `tcl featurize`")
            fs = fs.subset(np.setdiff1d(np.arange(n), bad))
    return fs


def nonfinite_programs(x: np.ndarray, chunk: int = 8192) -> np.ndarray:
    """Row indices of the programs of `x` (N, ...) with a NaN or infinite feature value."""
    rows = []
    for a in range(0, len(x), chunk):
        part = np.asarray(x[a:a + chunk])
        rows.append(a + np.flatnonzero((~np.isfinite(part.reshape(len(part), -1))).any(axis=1)))
    return np.concatenate(rows) if rows else np.zeros(0, np.int64)


def nonfinite_columns(x: np.ndarray, rows: np.ndarray) -> list[int]:
    """The feature columns (last axis) with a NaN or infinite value in the programs `rows` of `x`."""
    return np.unique(np.nonzero(~np.isfinite(np.asarray(x.take(rows, axis=0))))[-1]).tolist()


def _first(items, k: int = 5) -> str:
    """The first `k` of `items`, comma-separated, with how many more."""
    items = list(items)
    more = f", ... (+{len(items) - k})" if len(items) > k else ""
    return ", ".join(str(int(i)) for i in items[:k]) + more


T = TypeVar("T")


def read_feature_file(path: str | os.PathLike, load: Callable[[Path], T]) -> T:
    """`load(path)` of a feature file (.npz), with one clear error (FeatureFileError) naming the
    file and the reason for anything that is not one."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as exc:
        raise FeatureFileError(f"{path}: cannot read the feature file ({exc.strerror})") from None
    if head == b"PAR1":
        raise FeatureFileError(f"{path}: a records Parquet file, not features: run `tcl featurize "
                               f"{path} --out FEATURES.npz` first")
    if not head:
        raise FeatureFileError(f"{path}: empty file, not a TCL feature file (.npz)")
    if head != b"PK\x03\x04":  # every .npz is a zip archive
        raise FeatureFileError(f"{path}: not a TCL feature file (.npz, a zip archive); "
                               "make one with `tcl featurize`")
    try:
        return load(path)
    except FeatureFileError:
        raise
    except (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile, zlib.error) as exc:
        reason = str(exc)  # the loaders' own errors already name the file
        raise FeatureFileError(reason if reason.startswith(str(path)) else
                               f"{path}: not a TCL feature file ({type(exc).__name__}: {reason})") from None
