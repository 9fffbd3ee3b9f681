"""Extraction of MetaSchedule's per-store features (tcl.perstore) from the databases the records
came from: `tcl featurize --perstore-from DB`.

    ps, n_cached = extract_perstore(fs, "data/records/p.parquet", "data/raw/p", workers=2)
    ps.save("data/features/p.perstore.npz")

Per program, MetaSchedule's own code: rebuild the schedule from the database record
(`Schedule(workload.mod)`, `trace.apply_to_schedule(sch, remove_postproc=False)`) and call
`PerStoreFeature(extract_workload=True).extract_from(TuneContext(mod, target), [candidate])`.
The records Parquet keeps no trace, so the traces are read from the MetaSchedule database the
records were ingested from and matched to the records by (task, program_id).

The features depend on the target only through its kind (a GPU target counts thread bindings;
CPU targets of any ISA or thread count give identical rows: tests/test_perstore.py checks it),
so with a cache directory each (workload, trace, target kind) is computed once and reused by
every platform with the same kind of target: matched programs are measured on every platform.
TVM is imported in the worker processes only.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import defaultdict, deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

from .features import FeatureSet, save_npz
from .perstore import N_FEATURES, N_STORE_FEATURES, N_WORKLOAD_FEATURES, PERSTORE_VERSION, PerStoreSet

PROGRAMS_PER_UNIT = 32     # programs a worker extracts per call: progress granularity and balance


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
    """Add the records of one database to `sources`: exactly those `tcl ingest` keeps (parsed by
    its own `_parse_record`), under the ids it gives them."""
    from .records import Record, loads_lenient, steps_id, steps_json
    from .records.metaschedule import _existing, _lines, _parse_record, network_weights_json

    meta_path = db_dir / "tasks.json"
    task_meta = orjson.loads(meta_path.read_bytes()) if meta_path.exists() else {}
    # per workload line, as ingest's read_database reads it: its task info, and the line itself
    infos: list[tuple | None] = []
    workloads: list[list | None] = []
    for line in _lines(_existing(db_dir / "database_workload.json")):
        try:
            workload = orjson.loads(line)
            shash = str(workload[0])
        except (orjson.JSONDecodeError, IndexError, TypeError):
            infos.append(None)  # ingest rejects the records pointing here
            workloads.append(None)
            continue
        meta = task_meta.get(shash, {})
        infos.append((shash, meta.get("name", shash), meta.get("desc"), float(meta.get("weight", 1.0)),
                      ",".join(meta.get("networks", [])), network_weights_json(meta)))
        workloads.append(workload)
    for line in _lines(_existing(db_dir / "database_tuning_record.json")):
        if not line or line.isspace():
            continue
        parsed = _parse_record(line, infos, "")
        if parsed.__class__ is not Record:
            continue  # rejected by ingest: no records row points at it
        index, record = loads_lenient(line)
        workload, trace = workloads[index], record[0]
        target = record[2] if isinstance(record[2], dict) else json.loads(record[2])
        kind = "-".join([str(target.get("kind"))] + sorted(map(str, target.get("keys") or [])))
        trace_id = hashlib.sha1(orjson.dumps(trace)).hexdigest()
        sources[(parsed.task_id, steps_id(steps_json(parsed.steps)))].append(
            _Source(str(workload[0]), workload, record, kind, trace_id))


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
    save_npz(path, {"ids": np.asarray(ids, dtype=str), "offsets": np.concatenate([[0], np.cumsum(counts)]),
                    "stores": np.concatenate([entries[i] for i in ids]).astype(np.float32)})


# ---------------------------------------------------------------------------------------------
# extraction


def extract_perstore(fs: FeatureSet, records_path: str | os.PathLike, db_dir: str | os.PathLike, workers: int = 2,
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
    import gc
    import multiprocessing
    from multiprocessing import resource_tracker

    # a spawn pool starts multiprocessing's resource tracker process, which would otherwise
    # outlive the extraction (until this process exits): stopped below if this call started it
    tracker = resource_tracker._resource_tracker
    started_tracker = tracker._fd is None
    # spawn: the workers import TVM themselves; the parent never has (and forks no TVM state)
    pool = multiprocessing.get_context("spawn").Pool(min(workers, len(units)), initializer=_init_worker)
    try:
        yield from pool.imap_unordered(_extract_unit, units)
        pool.close()
    finally:
        pool.terminate()
        pool.join()
        del pool
        if started_tracker:
            gc.collect()  # the pool's semaphores unregister from the tracker when collected
            tracker._stop()
