"""MetaSchedule's per-store features of each measured program: what the baselines read natively.

MetaSchedule's `XGBModel` and Tenset's MLP do not read schedule primitives; they read one row per
buffer store of the scheduled program (`PerStoreFeature` of `tvm.s_tir.meta_schedule`: loop
structure, arithmetic counts, buffer access patterns, arithmetic-intensity curve), 164 numbers,
plus 8 describing the workload when `extract_workload=True`. A program has a variable number of
stores, so a platform's features are one flat (total_stores, 172) float32 array and per-program
offsets, in the same program order (and with the same labels and tasks) as the step-sequence
FeatureSet of the same records:

    ps, _ = extract_perstore(fs, "data/records/p.parquet", "data/raw/p", workers=2)
    ps.save("data/features/p.perstore.npz")
    ps.program(i)            # (stores_i, 172): the rows of program i

Extraction, per program (MetaSchedule's own code): rebuild the schedule from the database record
(`Schedule(workload.mod)`, `trace.apply_to_schedule(sch, remove_postproc=False)`) and call
`PerStoreFeature(extract_workload=True).extract_from(TuneContext(mod, target), [candidate])`.
The records Parquet keeps no trace, so the traces are read from the MetaSchedule database the
records were ingested from and matched to the records by (task, program_id).

The features depend on the target only through its kind (a GPU target counts thread bindings;
CPU targets of any ISA or thread count give identical rows: tests/test_perstore.py checks it),
so with a cache directory each (workload, trace, target kind) is computed once and reused by
every platform with the same kind of target: matched programs are measured on every platform.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import defaultdict, deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson

from .io import atomic_path

PERSTORE_VERSION = "ms-perstore-v1"
N_STORE_FEATURES = 164     # PerStoreFeature(extract_workload=False): MetaSchedule's default extractor
N_WORKLOAD_FEATURES = 8    # appended by extract_workload=True; the same for every program of a task
N_FEATURES = N_STORE_FEATURES + N_WORKLOAD_FEATURES
PROGRAMS_PER_UNIT = 32     # programs a worker extracts per call: progress granularity and balance

_LABEL_FIELDS = ("y", "latency", "task", "program_id", "tasks", "task_desc", "task_weight",
                 "task_networks", "platform")


@dataclass
class PerStoreSet:
    """Per-store features of one platform's programs, with the labels of the aligned FeatureSet."""

    stores: np.ndarray    # (S, F) float32: every program's store rows, program after program
    offsets: np.ndarray   # (N + 1,) int64: program i owns stores[offsets[i]:offsets[i + 1]]
    y: np.ndarray
    latency: np.ndarray
    task: np.ndarray
    program_id: np.ndarray
    tasks: list
    task_desc: list
    task_weight: np.ndarray
    task_networks: list
    platform: str
    meta: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.y)

    @property
    def n_stores(self) -> np.ndarray:
        """(N,) stores per program."""
        return np.diff(self.offsets)

    def program(self, i: int) -> np.ndarray:
        return self.stores[self.offsets[i]:self.offsets[i + 1]]

    def networks(self) -> list[str]:
        return sorted({n for nets in self.task_networks for n in nets})

    @classmethod
    def aligned_with(cls, fs, stores: np.ndarray, offsets: np.ndarray, meta: dict) -> "PerStoreSet":
        """Per-store rows of `fs`'s programs (same order) carrying `fs`'s labels and tasks."""
        if len(offsets) != len(fs) + 1:
            raise ValueError(f"{len(offsets) - 1} programs of per-store features for {len(fs)} programs")
        return cls(stores=np.asarray(stores, np.float32), offsets=np.asarray(offsets, np.int64),
                   meta=dict(meta), **{name: getattr(fs, name) for name in _LABEL_FIELDS})

    def subset(self, index) -> "PerStoreSet":
        """Programs at `index` (their stores with them); tasks re-indexed to those present."""
        index = np.asarray(index)
        if index.dtype == bool:
            index = np.flatnonzero(index)
        counts = self.n_stores[index]
        starts = self.offsets[:-1][index]
        # row numbers of the kept programs' stores, in order, without a Python loop
        rows = np.repeat(starts - np.cumsum(counts) + counts, counts) + np.arange(int(counts.sum()))
        used = np.unique(self.task[index])
        remap = np.full(len(self.tasks), -1, np.int32)
        remap[used] = np.arange(len(used), dtype=np.int32)
        return PerStoreSet(
            stores=self.stores[rows], offsets=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
            y=self.y[index], latency=self.latency[index], task=remap[self.task[index]],
            program_id=self.program_id[index], tasks=[self.tasks[i] for i in used],
            task_desc=[self.task_desc[i] for i in used], task_weight=self.task_weight[used],
            task_networks=[self.task_networks[i] for i in used], platform=self.platform, meta=dict(self.meta),
        )

    def save(self, path: str | os.PathLike) -> None:
        with atomic_path(path, suffix=".npz") as tmp:
            with open(tmp, "wb") as f:
                np.savez(
                    f, stores=self.stores, offsets=self.offsets, y=self.y, latency=self.latency,
                    task=self.task, program_id=np.asarray(self.program_id, dtype=str),
                    tasks=np.asarray(self.tasks, dtype=str), task_desc=np.asarray(self.task_desc, dtype=str),
                    task_weight=self.task_weight,
                    task_networks=np.asarray([",".join(n) for n in self.task_networks], dtype=str),
                    platform=np.asarray(self.platform), meta=np.asarray(json.dumps(self.meta, sort_keys=True)),
                )

    @classmethod
    def load(cls, path: str | os.PathLike) -> "PerStoreSet":
        try:
            z = np.load(path, allow_pickle=False)  # never unpickle
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: not a TCL per-store feature file ({exc})") from None
        with z:
            required = {"stores", "offsets", "y", "latency", "task", "program_id", "tasks", "meta"}
            if not required <= set(z.files):
                raise ValueError(f"{path}: not a TCL per-store feature file "
                                 f"(missing {sorted(required - set(z.files))})")
            offsets = z["offsets"]
            if len(offsets) != len(z["y"]) + 1 or offsets[-1] != len(z["stores"]) or np.any(np.diff(offsets) < 0):
                raise ValueError(f"{path}: offsets do not describe the stores array")
            return cls(
                stores=z["stores"], offsets=offsets, y=z["y"], latency=z["latency"], task=z["task"],
                program_id=z["program_id"], tasks=z["tasks"].tolist(), task_desc=z["task_desc"].tolist(),
                task_weight=z["task_weight"],
                task_networks=[[n for n in s.split(",") if n] for s in z["task_networks"].tolist()],
                platform=str(z["platform"]), meta=json.loads(str(z["meta"])),
            )


def load_feature_file(path: str | os.PathLike):
    """A FeatureSet (step sequences) or a PerStoreSet, whichever `path` holds."""
    from .features import FeatureSet

    try:
        with np.load(path, allow_pickle=False) as z:
            per_store = "stores" in z.files
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a TCL feature file ({exc})") from None
    return PerStoreSet.load(path) if per_store else FeatureSet.load(path)


def perstore_path(features_path: str | os.PathLike) -> Path:
    """data/features/p.npz -> data/features/p.perstore.npz (the per-store file beside it)."""
    path = Path(features_path)
    return path.with_name(path.name.removesuffix(".npz") + ".perstore.npz")


# ---------------------------------------------------------------------------------------------
# matching records to the database lines they came from


@dataclass(slots=True)
class _Source:
    shash: str             # the workload's structural hash (database_workload.json)
    workload: list         # [shash, base64 IRModule]
    record: list           # [trace, run_secs, target, args_info]
    target_kind: str       # what the features depend on of the target (see the module docstring)
    trace_id: str          # sha1 of the trace JSON: the cache key within a workload


def _database_sources(root: Path) -> dict[tuple[str, str], deque]:
    """(task_id, program_id) -> database records with that program, in file order, from the
    database `root` or every database under it (as `tcl ingest` reads a folder).

    Task and program ids are computed exactly as `tcl ingest` computes them, so every row of the
    records Parquet written from these databases finds its record here. Two records can share
    both ids (their traces differ only in what the step encoding leaves out); they are matched
    in file order, the order ingest wrote them in.
    """
    from .records.metaschedule import _existing

    if _existing(root / "database_tuning_record.json").exists():
        db_dirs = [root]
    else:
        db_dirs = sorted({p.parent for p in root.rglob("database_tuning_record.json*")})
    if not db_dirs:
        raise FileNotFoundError(f"{root}: no MetaSchedule database (database_tuning_record.json) in it")
    sources: dict[tuple[str, str], deque] = defaultdict(deque)
    for db_dir in db_dirs:
        _read_database_sources(db_dir, sources)
    return sources


def _read_database_sources(db_dir: Path, sources: dict) -> None:
    from .records import check_latencies, steps_id, steps_json
    from .records.metaschedule import _existing, _open_lines, trace_to_steps

    meta_path = db_dir / "tasks.json"
    task_meta = orjson.loads(meta_path.read_bytes()) if meta_path.exists() else {}
    workloads = []
    for line in _open_lines(_existing(db_dir / "database_workload.json")):
        try:
            workloads.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            workloads.append(None)  # ingest rejected the records pointing here
    for line in _open_lines(_existing(db_dir / "database_tuning_record.json")):
        try:  # skip what ingest rejects (no records row points at it), as ingest decides it
            index, record = orjson.loads(line)
            if not isinstance(index, int) or index < 0 or workloads[index] is None or check_latencies(record[1]):
                continue
            workload, trace = workloads[index], record[0]
            steps = trace_to_steps(trace)
        except (orjson.JSONDecodeError, ValueError, TypeError, IndexError, KeyError):
            continue
        if isinstance(steps, str):
            continue
        shash = str(workload[0])
        task_id = task_meta.get(shash, {}).get("name", shash)
        target = record[2] if isinstance(record[2], dict) else json.loads(record[2])
        kind = "-".join([str(target.get("kind"))] + sorted(map(str, target.get("keys") or [])))
        trace_id = hashlib.sha1(orjson.dumps(trace)).hexdigest()
        sources[(task_id, steps_id(steps_json(steps)))].append(_Source(shash, workload, record, kind, trace_id))


# ---------------------------------------------------------------------------------------------
# the workers (TVM is imported there only)


def _init_worker() -> None:
    os.environ.setdefault("TVM_NUM_THREADS", "1")  # one program at a time: no thread pool to share
    from .collect.measure import use_x86_intrinsics_only

    use_x86_intrinsics_only()  # the CUDA intrinsics' import alone takes ~40 s


def _extract_unit(unit: tuple) -> list[tuple[int, np.ndarray | None, str]]:
    """[(row, features (stores, 172) or None, error)] for one workload's chunk of programs."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    workload_json, target_json, programs = unit
    workload = ms.database.Workload.from_json(workload_json)
    context = ms.TuneContext(mod=workload.mod, target=tvm.target.Target(target_json))
    extractor = ms.feature_extractor.PerStoreFeature(extract_workload=True)
    out = []
    for row, record_json in programs:
        try:
            record = ms.database.TuningRecord.from_json(record_json, workload)
            sch = tvm.s_tir.Schedule(workload.mod)
            record.trace.apply_to_schedule(sch, remove_postproc=False)
            (features,) = extractor.extract_from(context, [ms.MeasureCandidate(sch, record.args_info)])
            out.append((row, features.numpy().astype(np.float32), ""))
        except Exception as exc:  # noqa: BLE001  (TVM raises its own error types; keep the reason)
            lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
            out.append((row, None, f"{type(exc).__name__}: {lines[-1] if lines else ''}"[:200]))
    return out


# ---------------------------------------------------------------------------------------------
# the cache: one file per (target kind, workload) holding its programs' rows


def _cache_file(cache_dir: Path, target_kind: str, shash: str) -> Path:
    from importlib.metadata import version

    return cache_dir / f"{PERSTORE_VERSION}-tvm{version('apache-tvm')}-{target_kind}" / f"{shash}.npz"


def _read_cache(path: Path) -> dict[str, np.ndarray]:
    if not path.is_file():
        return {}
    try:
        with np.load(path, allow_pickle=False) as z:
            ids, offsets, stores = z["ids"].tolist(), z["offsets"], z["stores"]
    except (OSError, ValueError, KeyError):
        return {}  # a damaged cache file is recomputed, never trusted
    return {i: stores[offsets[k]:offsets[k + 1]] for k, i in enumerate(ids)}


def _write_cache(path: Path, entries: dict[str, np.ndarray]) -> None:
    ids = sorted(entries)
    counts = [len(entries[i]) for i in ids]
    with atomic_path(path, suffix=".npz") as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, ids=np.asarray(ids, dtype=str), offsets=np.concatenate([[0], np.cumsum(counts)]),
                     stores=np.concatenate([entries[i] for i in ids]).astype(np.float32))


# ---------------------------------------------------------------------------------------------
# extraction


def extract_perstore(fs, records_path: str | os.PathLike, db_dir: str | os.PathLike, workers: int = 2,
                     cache_dir: str | os.PathLike | None = None, progress: bool = False) -> tuple[PerStoreSet, int]:
    """Per-store features of the programs of `fs` (the FeatureSet featurized from `records_path`),
    read from the MetaSchedule database `db_dir` those records were ingested from; and how many
    programs came from the cache (the features themselves do not depend on it)."""
    from tqdm import tqdm

    from .records.ingest import read_records

    db_dir = Path(db_dir)
    table = read_records(records_path)
    task_ids = table.column("task_id").to_pylist()
    program_ids = table.column("program_id").to_pylist()
    if len(task_ids) != len(fs) or list(map(str, fs.program_id)) != program_ids:
        raise ValueError(f"{records_path}: its rows are not the programs of the feature set "
                         f"({len(task_ids)} rows, {len(fs)} programs); featurize it again")
    sources = _database_sources(db_dir)
    matched: list[_Source] = []
    for row, key in enumerate(zip(task_ids, program_ids)):
        if not sources.get(key):
            raise ValueError(f"{records_path}: row {row} (task {key[0]}, program {key[1]}) has no record in "
                             f"{db_dir}; give the database the records were ingested from")
        matched.append(sources[key].popleft())

    # cached rows first; the rest is grouped by (workload, target) into units for the workers
    features: list[np.ndarray | None] = [None] * len(matched)
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for row, src in enumerate(matched):
        groups[(src.shash, src.target_kind)].append(row)
    caches: dict[tuple[str, str], dict] = {}
    units, n_cached = [], 0
    for (shash, kind), rows in groups.items():
        cache = caches[(shash, kind)] = _read_cache(_cache_file(Path(cache_dir), kind, shash)) if cache_dir else {}
        todo = []
        for row in rows:
            hit = cache.get(matched[row].trace_id)
            if hit is not None:
                features[row] = hit
                n_cached += 1
            else:
                todo.append(row)
        for a in range(0, len(todo), PROGRAMS_PER_UNIT):
            chunk = todo[a:a + PROGRAMS_PER_UNIT]
            first = matched[chunk[0]]
            units.append((first.workload, first.record[2], [(r, matched[r].record) for r in chunk]))

    failed, dirty = [], set()
    with tqdm(total=len(matched), initial=n_cached, unit="prog", desc="per-store features",
              disable=not progress) as bar:
        for results in _run_units(units, workers):
            for row, rows_features, error in results:
                if rows_features is None:
                    failed.append({"row": row, "task": task_ids[row], "program_id": program_ids[row], "error": error})
                    rows_features = np.zeros((0, N_FEATURES), np.float32)
                elif rows_features.shape[1] != N_FEATURES:
                    raise RuntimeError(f"PerStoreFeature gave {rows_features.shape[1]} columns, expected {N_FEATURES}")
                else:
                    src = matched[row]
                    caches[(src.shash, src.target_kind)][src.trace_id] = rows_features
                    dirty.add((src.shash, src.target_kind))
                features[row] = rows_features
            bar.update(len(results))

    if cache_dir:
        for shash, kind in dirty:
            _write_cache(_cache_file(Path(cache_dir), kind, shash), caches[(shash, kind)])
    counts = np.array([len(f) for f in features], np.int64)
    meta = {"feature_version": PERSTORE_VERSION, "n_features": N_FEATURES,
            "n_store_features": N_STORE_FEATURES, "n_workload_features": N_WORKLOAD_FEATURES,
            "extractor": "tvm.s_tir.meta_schedule.feature_extractor.PerStoreFeature(extract_workload=True)",
            "source": Path(records_path).name, "database": db_dir.name, "failed": failed}
    stores = np.concatenate(features) if features else np.zeros((0, N_FEATURES), np.float32)
    return PerStoreSet.aligned_with(fs, stores, np.concatenate([[0], np.cumsum(counts)]), meta), n_cached


def _run_units(units: list, workers: int):
    """Results of `_extract_unit` for every unit: in this process, or in `workers` processes."""
    if not units:
        return
    if workers <= 1:
        _init_worker()
        for unit in units:
            yield _extract_unit(unit)
        return
    import multiprocessing

    # spawn: the workers import TVM themselves; the parent never has (and forks no TVM state)
    pool = multiprocessing.get_context("spawn").Pool(min(workers, len(units)), initializer=_init_worker)
    try:
        yield from pool.imap_unordered(_extract_unit, units)
        pool.close()
    finally:
        pool.terminate()
        pool.join()
