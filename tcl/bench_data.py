"""Throughput of read + validate + featurize, in records/s, for both record formats.

Inputs are the real fixture records replicated to a large file (Tenset-sized batches), so the
figure reflects the real step-sequence lengths. The baseline, measured in the same run on the
same bytes, is the stdlib `json.loads` of every line: the least any reader has to do.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from .features import Featurizer
from .records import Record, gc_paused
from .records.ansor import read_ansor_lines
from .records.metaschedule import read_database

CHUNK_LINES = 20_000


def _ansor_chunk(args) -> int:
    path, start, stop, max_len = args
    featurizer = Featurizer(max_len)
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(stop - start)
    with gc_paused():
        records = [r for r in read_ansor_lines(path, data.splitlines(), "bench") if isinstance(r, Record)]
        x, mask = featurizer([r.steps for r in records])
    return len(records)


def _byte_chunks(path: str, n_chunks: int) -> list[tuple[int, int]]:
    """Split a file into ~n_chunks byte ranges on line boundaries."""
    size = os.path.getsize(path)
    bounds = [0]
    with open(path, "rb") as f:
        for i in range(1, n_chunks):
            f.seek(size * i // n_chunks)
            f.readline()
            bounds.append(f.tell())
    bounds.append(size)
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


def read_featurize_ansor(path: str, workers: int = 2, max_len: int = 48) -> int:
    """Parallel read+validate+featurize of an Ansor file; returns valid records."""
    n_chunks = max(workers, os.path.getsize(path) // (CHUNK_LINES * 800) + 1)
    jobs = [(path, a, b, max_len) for a, b in _byte_chunks(path, n_chunks)]
    if workers <= 1:
        return sum(map(_ansor_chunk, jobs))
    with ProcessPoolExecutor(workers) as pool:
        return sum(pool.map(_ansor_chunk, jobs))


def _baseline(path: str) -> int:
    n = 0
    with open(path, "rb") as f:
        for line in f:
            json.loads(line)
            n += 1
    return n


def bench_data(ansor_fixture: str, ms_fixture: str, n_records: int = 200_000, workers: int = 2,
               max_len: int = 48) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        lines = Path(ansor_fixture).read_bytes().splitlines()
        big = Path(tmp) / "ansor.json"
        with open(big, "wb") as f:
            for i in range(n_records):
                f.write(lines[i % len(lines)] + b"\n")
        t0 = time.perf_counter()
        base_n = _baseline(str(big))
        t_base = time.perf_counter() - t0
        t0 = time.perf_counter()
        valid = read_featurize_ansor(str(big), workers, max_len)
        t = time.perf_counter() - t0
        rows.append({"format": "ansor", "records": base_n, "valid": valid, "seconds": t,
                     "records_per_s": base_n / t, "baseline_json_loads_per_s": base_n / t_base,
                     "ratio_vs_baseline": (base_n / t) / (base_n / t_base), "workers": workers})

        db = Path(tmp) / "ms"
        db.mkdir()
        src = Path(ms_fixture)
        (db / "database_workload.json").write_bytes((src / "database_workload.json").read_bytes())
        rec_lines = (src / "database_tuning_record.json").read_bytes().splitlines()
        n_ms = max(n_records // 10, len(rec_lines))
        with open(db / "database_tuning_record.json", "wb") as f:
            for i in range(n_ms):
                f.write(rec_lines[i % len(rec_lines)] + b"\n")
        t0 = time.perf_counter()
        base_n = _baseline(str(db / "database_tuning_record.json"))
        t_base = time.perf_counter() - t0
        t0 = time.perf_counter()
        with gc_paused():
            records = [r for r in read_database(db, "bench") if isinstance(r, Record)]
            Featurizer(max_len)([r.steps for r in records])
        t = time.perf_counter() - t0
        rows.append({"format": "metaschedule", "records": base_n, "valid": len(records), "seconds": t,
                     "records_per_s": base_n / t, "baseline_json_loads_per_s": base_n / t_base,
                     "ratio_vs_baseline": (base_n / t) / (base_n / t_base), "workers": 1})
    return rows


def format_rows(rows: list[dict]) -> str:
    out = [f"{'format':13} {'records':>8} {'records/s':>10} {'json.loads/s':>13} {'ratio':>6} workers"]
    for r in rows:
        out.append(f"{r['format']:13} {r['records']:8d} {r['records_per_s']:10.0f} "
                   f"{r['baseline_json_loads_per_s']:13.0f} {r['ratio_vs_baseline']:6.2f} {r['workers']}")
    return "\n".join(out)
