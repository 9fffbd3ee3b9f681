"""MetaSchedule's per-store features of each measured program (PerStoreSet, .perstore.npz): what
the baselines read natively.

MetaSchedule's `XGBModel` and Tenset's MLP do not read schedule primitives; they read one row per
buffer store of the scheduled program (`PerStoreFeature` of `tvm.s_tir.meta_schedule`: loop
structure, arithmetic counts, buffer access patterns, arithmetic-intensity curve), 164 numbers,
plus 8 describing the workload when `extract_workload=True`. A program has a variable number of
stores, so a platform's features are one flat (total_stores, 172) float32 array and per-program
offsets, in the same program order (and with the same labels and tasks) as the step-sequence
FeatureSet of the same records, saved beside it (`perstore_path`):

    ps = load_perstore_set("data/splits/p/train.perstore.npz")
    ps.program(i)            # (stores_i, 172): the rows of program i
    x, mask = ps.padded()    # (N, S, 172) zero-padded (built per batch on indexing), (N, S) bool

A PerStoreSet carries the labels of a FeatureSet (y, latency, task, task metadata, platform), so
metrics, splitting and training jobs take either. The per-store model kinds (``xgb-ms``,
``mlp-tenset``) read ``padded()`` through ``CostModel.inputs``; the extraction from MetaSchedule
databases is ``tcl.perstore_extract`` (it needs TVM; this module does not).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .features import (FeatureKindError, FeatureSet, ProgramLabels, label_arrays, load_feature_set,
                       open_npz, read_feature_file, read_labels, save_npz, subset_labels)

PERSTORE_VERSION = "ms-perstore-v1"
N_STORE_FEATURES = 164     # PerStoreFeature(extract_workload=False): MetaSchedule's default extractor
N_WORKLOAD_FEATURES = 8    # appended by extract_workload=True; the same for every program of a task
N_FEATURES = N_STORE_FEATURES + N_WORKLOAD_FEATURES
SUFFIX = ".perstore.npz"


def store_rows(offsets: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Row numbers (into the flat stores) of the stores of programs `index`, in order."""
    counts = np.diff(offsets)[index]
    starts = offsets[:-1][index]
    return np.repeat(starts - np.cumsum(counts) + counts, counts) + np.arange(int(counts.sum()))


@dataclass
class PerStoreSet(ProgramLabels):
    """Per-store features of one platform's programs, with the labels of the aligned FeatureSet."""

    stores: np.ndarray    # (S, F) float32: every program's store rows, program after program
    offsets: np.ndarray   # (N + 1,) int64: program i owns stores[offsets[i]:offsets[i + 1]]

    @property
    def n_stores(self) -> np.ndarray:
        """(N,) stores per program."""
        return np.diff(self.offsets)

    def program(self, i: int) -> np.ndarray:
        return self.stores[self.offsets[i]:self.offsets[i + 1]]

    def padded(self) -> tuple["PaddedStores", np.ndarray]:
        """(x (N, S, F), mask (N, S) bool): each program's stores padded with zero rows to S, the
        most stores of any program; x is built batch by batch when indexed."""
        x = PaddedStores(self.stores, self.offsets)
        return x, np.arange(x.shape[1])[None, :] < self.n_stores[:, None]

    @classmethod
    def aligned_with(cls, fs: FeatureSet, stores: np.ndarray, offsets: np.ndarray, meta: dict) -> "PerStoreSet":
        """Per-store rows of `fs`'s programs (same order) carrying `fs`'s labels and tasks."""
        if len(offsets) != len(fs) + 1:
            raise ValueError(f"{len(offsets) - 1} programs of per-store features for {len(fs)} programs")
        labels = {f.name: getattr(fs, f.name) for f in dataclasses.fields(ProgramLabels)}
        return cls(stores=np.asarray(stores, np.float32), offsets=np.asarray(offsets, np.int64),
                   **{**labels, "meta": dict(meta)})

    def subset(self, index) -> "PerStoreSet":
        """Programs at `index` (their stores with them); tasks re-indexed to those present."""
        index = np.asarray(index)
        if index.dtype == bool:
            index = np.flatnonzero(index)
        counts = self.n_stores[index]
        return PerStoreSet(stores=self.stores[store_rows(self.offsets, index)],
                           offsets=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
                           **subset_labels(self, index))

    def save(self, path: str | os.PathLike) -> None:
        save_npz(path, {"stores": self.stores, "offsets": self.offsets, **label_arrays(self)})

    @classmethod
    def load(cls, path: str | os.PathLike) -> "PerStoreSet":
        with open_npz(path, ("stores", "offsets"), "per-store feature file") as z:
            offsets = z["offsets"]
            if len(offsets) != len(z["y"]) + 1 or offsets[-1] != len(z["stores"]) or np.any(np.diff(offsets) < 0):
                raise ValueError(f"{path}: offsets do not describe the stores array")
            return cls(stores=z["stores"], offsets=offsets, **read_labels(z))


class PaddedStores:
    """A PerStoreSet's flat store rows seen as a zero-padded (N, S, F) float32 array: indexing
    with a slice or an index array builds just those programs' block (the padded whole would
    be S / mean stores times the flat rows)."""

    ndim = 3
    dtype = np.dtype(np.float32)

    def __init__(self, stores: np.ndarray, offsets: np.ndarray):
        self.stores, self.offsets = stores, offsets
        most = int(np.diff(offsets).max(initial=0))
        self.shape = (len(offsets) - 1, max(most, 1), int(stores.shape[1]))

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index) -> np.ndarray:
        programs = np.arange(len(self))[index]  # a slice, an int or bool index array alike
        counts = np.diff(self.offsets)[programs]
        out = np.zeros((len(programs), *self.shape[1:]), np.float32)  # (n, S, F)
        out[np.arange(self.shape[1])[None, :] < counts[:, None]] = self.stores[store_rows(self.offsets, programs)]
        return out

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = self[:]
        return out if dtype is None else out.astype(dtype)


def per_store_inputs(fs, kind: str) -> tuple[PaddedStores, np.ndarray]:
    """`CostModel.inputs` of a per-store kind: the padded stores and their mask of a PerStoreSet."""
    if not isinstance(fs, PerStoreSet):
        raise FeatureKindError(f"model kind {kind!r} reads MetaSchedule's per-store features (*{SUFFIX}, "
                               f"written by `tcl featurize --perstore-from`), not the step features of "
                               f"platform {fs.platform!r}")
    return fs.padded()


def flat_stores(x: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Padded (B, S, F) + mask (B, S) -> (stores per program (B,) int64, their rows (sum, F)), the
    programs' rows one after another as in a PerStoreSet."""
    mask = np.asarray(mask, dtype=bool)
    return mask.sum(axis=1).astype(np.int64), np.asarray(x)[mask]


def perstore_path(features_path: str | os.PathLike) -> Path:
    """data/features/p.npz -> data/features/p.perstore.npz (the per-store file beside it)."""
    path = Path(features_path)
    return path.with_name(path.name.removesuffix(".npz") + SUFFIX)


def load_perstore_set(path: str | os.PathLike) -> PerStoreSet:
    """PerStoreSet.load with one clear error (FeatureFileError) for anything that is not one."""
    return read_feature_file(path, PerStoreSet.load)


def load_feature_file(path: str | os.PathLike) -> FeatureSet | PerStoreSet:
    """The feature set `path` holds: step sequences (FeatureSet) or per-store rows (PerStoreSet)."""
    def per_store(p: Path) -> bool:
        with np.load(p, allow_pickle=False) as z:
            return "stores" in z.files

    return load_perstore_set(path) if read_feature_file(path, per_store) else load_feature_set(path)
