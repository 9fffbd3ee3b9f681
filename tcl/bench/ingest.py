"""Throughput of read + validate + featurize, in records/s, on real records of both formats.

* MetaSchedule: the bundled databases (`data/raw/<platform>/`, gzip-compressed), every record
  read once; one job per database, spread over the worker processes.
* Ansor / Tenset lines: the only real ones here are the fixture's 100 (an NVIDIA T4, 10 BERT
  tasks), far too few to time, and repeating them would time the featurizer's step cache rather
  than the featurizer (every repeated step is a hit). The input is the real lines followed by
  mutated copies: in each copy every split (`SP`) draws new tile sizes (a random factorization of
  its extent), every compute-at (`CA`) a nearby location and the unroll pragma a new value, as
  Ansor's mutations do, so each copy is a new program of a real task. The rows report the share
  of steps the featurizer had to encode (cache misses) for both inputs, so the copies can be
  compared with the real databases.

Baselines, timed in the same run on the same lines already in memory, in one process: the
stdlib `json.loads` (a plain reader) and `orjson.loads` (parsing alone: the floor of this
reader, which parses with orjson). For MetaSchedule also the trace walker alone (traces to
steps, the reader's main work after parsing), the Python one against the compiled one
(`tcl/records/trace_steps.c`), alternating on the same parsed traces. `records_per_cpu_s` is
records per second of worker CPU time, the rate of one core whatever else runs on the machine.
"""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
import random
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import orjson

from ..features import Featurizer
from ..records import Record, Reject, gc_paused, read_lines
from ..records.ansor import read_ansor_lines
from ..records.metaschedule import (HAS_COMPILED_WALKER, read_records, read_workloads, trace_to_steps,
                                    trace_to_steps_py)

BATCH = 1024  # records featurized at once: bounds a worker's memory (~16 KB of features a record)
CHUNK_BYTES = 8 << 20  # Ansor input per job
WALKER_TRACES = 10_000  # MetaSchedule traces the walkers are timed on (each walker twice)


def _featurize_stream(items, max_len: int) -> dict:
    """Featurize the Records of a reader in batches; count what was read and encoded."""
    featurizer = Featurizer(max_len)
    out = {"valid": 0, "rejected": 0, "steps": 0, "featurize_cpu_s": 0.0}
    batch: list = []

    def flush():
        cpu = time.process_time()
        _, mask = featurizer([r.steps for r in batch])
        out["featurize_cpu_s"] += time.process_time() - cpu
        out["steps"] += int(mask.sum())
        batch.clear()

    for item in items:
        if item.__class__ is Record:
            out["valid"] += 1
            batch.append(item)
            if len(batch) == BATCH:
                flush()
        else:
            out["rejected"] += 1
    if batch:
        flush()
    out["steps_encoded"] = featurizer.steps_encoded
    return out


# MetaSchedule input of the running benchmark: (record file, its lines, its workloads) per database.
# Set before the worker processes fork, so they share it instead of receiving copies.
_DATABASES: list = []


def _timed(job) -> dict:
    kind, args, max_len = job
    cpu = time.process_time()
    with gc_paused():
        if kind == "metaschedule":
            db, start, stop = args
            path, lines, workloads = _DATABASES[db]
            records = read_records(lines[start:stop], workloads, "bench", path, start + 1, whole_file=False)
            out = _featurize_stream(records, max_len)
        else:
            path, start, stop = args
            with open(path, "rb") as f:
                f.seek(start)
                data = f.read(stop - start)
            out = _featurize_stream(read_ansor_lines(path, data.split(b"\n"), "bench"), max_len)
    out["cpu_s"] = time.process_time() - cpu
    return out


def _run(jobs: list, workers: int) -> tuple[float, dict]:
    """Run jobs on `workers` processes (joined before returning); wall seconds and summed counts."""
    t0 = time.perf_counter()
    if workers <= 1:
        results = [_timed(j) for j in jobs]
    else:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
            results = list(pool.map(_timed, jobs))
    seconds = time.perf_counter() - t0
    total = {k: sum(r[k] for r in results) for k in results[0]}
    return seconds, total


def _baselines(lines: list[bytes]) -> dict:
    with gc_paused():
        t0 = time.perf_counter()
        for line in lines:
            json.loads(line)
        t1 = time.perf_counter()
        for line in lines:
            orjson.loads(line)
        t2 = time.perf_counter()
    return {"baseline_json_loads_per_s": len(lines) / (t1 - t0), "baseline_orjson_per_s": len(lines) / (t2 - t1)}


def _walker_baselines(lines: list[bytes], n: int = WALKER_TRACES, rounds: int = 2) -> dict:
    """Per-record microseconds of the Python and the compiled trace walker on the same traces
    (the first `n` parseable), alternating; the compiled one is None where it was not built."""
    traces = []
    for line in lines:
        try:
            trace = orjson.loads(line)[1][0]
        except (orjson.JSONDecodeError, IndexError, TypeError, KeyError):
            continue
        traces.append(trace)
        if len(traces) == n:
            break
    walkers = {"us_walk_python": trace_to_steps_py}
    if HAS_COMPILED_WALKER:
        walkers["us_walk_compiled"] = trace_to_steps
    best = dict.fromkeys(("us_walk_python", "us_walk_compiled"))
    with gc_paused():
        for _ in range(rounds):
            for key, walk in walkers.items():
                t0 = time.perf_counter()
                for trace in traces:
                    try:
                        walk(trace)
                    except (ValueError, TypeError, IndexError, KeyError):
                        pass  # a malformed trace: timed as the reader meets it
                us = (time.perf_counter() - t0) * 1e6 / max(len(traces), 1)
                best[key] = us if best[key] is None else min(best[key], us)
    return {**best, "walker_traces": len(traces)}


def _row(fmt: str, source: str, n_lines: int, seconds: float, total: dict, base: dict, workers: int) -> dict:
    rate = n_lines / seconds
    us = 1e6 / n_lines
    return {"format": fmt, "input": source, "records": n_lines, "valid": total["valid"],
            "rejected": total["rejected"], "seconds": seconds, "records_per_s": rate,
            "records_per_cpu_s": n_lines / total["cpu_s"] if total["cpu_s"] else float("nan"),
            # one core's time per record: where it goes (what bounds the rate)
            "us_read_validate": (total["cpu_s"] - total["featurize_cpu_s"]) * us,
            "us_featurize": total["featurize_cpu_s"] * us, "us_orjson_alone": 1e6 / base["baseline_orjson_per_s"],
            **base, "ratio_vs_json_loads": rate / base["baseline_json_loads_per_s"],
            "steps_encoded_share": total["steps_encoded"] / max(total["steps"], 1), "workers": workers}


def bench_metaschedule(databases: list[Path], workers: int = 2, max_len: int = 48) -> dict:
    """Read + validate + featurize every record of the given MetaSchedule databases.

    Each file is read (and decompressed) once; the records are then parsed by `workers` processes
    in equal slices, so a few large databases keep every core busy (jobs of one database each left
    one core idle for the last of 5 databases on 2 cores). The reading is in the wall time.
    """
    record_files = [_record_file(d) for d in databases]
    t0 = time.perf_counter()
    _DATABASES[:] = []
    for d, path in zip(databases, record_files):
        workloads = [w for w in read_workloads(d) if w.__class__ is not Reject][-1]
        _DATABASES.append((path, list(read_lines(path)), workloads))
    read_seconds = time.perf_counter() - t0
    lines = [line for _, db_lines, _ in _DATABASES for line in db_lines if line and not line.isspace()]
    base = _baselines(lines)
    walkers = _walker_baselines(lines)
    n_slices = max(workers, 1)  # equal slices, as many per database as workers: every core busy to the end
    jobs = []
    for db, (_, db_lines, _) in enumerate(_DATABASES):
        step = -(-len(db_lines) // n_slices)
        jobs += [("metaschedule", (db, a, a + step), max_len) for a in range(0, len(db_lines), step)]
    try:
        seconds, total = _run(jobs, workers)
    finally:
        _DATABASES[:] = []
    size = sum(os.path.getsize(p) for p in record_files)
    names = ", ".join(d.name for d in databases)
    source = (f"{len(databases)} real databases ({names}): {len(lines):,} records, "
              f"{size / 1e6:.1f} MB gzip, {sum(map(len, lines)) / 1e6:.1f} MB JSON; read once "
              f"({read_seconds:.2f} s, in the wall time), parsed in {len(jobs)} slices")
    return {**_row("metaschedule", source, len(lines), seconds + read_seconds, total, base, workers), **walkers}


def _record_file(db: Path) -> Path:
    for name in ("database_tuning_record.json", "database_tuning_record.json.gz"):
        if (db / name).exists():
            return db / name
    raise FileNotFoundError(f"{db}: no database_tuning_record.json(.gz)")


@functools.lru_cache(maxsize=None)
def _divisors(n: int) -> tuple[int, ...]:
    return tuple(d for d in range(1, n + 1) if n % d == 0)


def _mutate(steps: list, unrolls: list[int], rng: random.Random) -> None:
    """New tile sizes for every split, compute-at locations near the old ones, a new unroll pragma
    value (Ansor's tile-size, compute-location and unroll mutations): a new program of the task."""
    for s in steps:
        if s[0] == "CA" and len(s) == 4 and isinstance(s[3], int):
            s[3] = rng.randint(max(0, s[3] - 2), s[3] + 2)
        elif s[0] == "SP" and len(s) > 4 and isinstance(s[3], int) and s[3] > 0 and isinstance(s[4], list):
            remaining, factors = s[3], []
            for _ in s[4]:
                factors.append(rng.choice(_divisors(remaining)))
                remaining //= factors[-1]
            s[4] = factors
        elif s[0] == "PR" and isinstance(s[-1], str) and s[-1].startswith("auto_unroll_max_step$"):
            s[-1] = f"auto_unroll_max_step${rng.choice(unrolls)}"


def write_ansor_input(fixture: Path, out: Path, n_lines: int, seed: int = 0) -> int:
    """The fixture's real lines, then mutated copies of them, up to `n_lines`; returns distinct programs."""
    real = [line for line in fixture.read_bytes().splitlines() if line.strip()]
    parsed = [orjson.loads(line) for line in real]
    unrolls = sorted({int(s[-1].split("$")[1]) for obj in parsed for s in obj["i"][1][1]
                      if s[0] == "PR" and str(s[-1]).startswith("auto_unroll_max_step$")}) or [0]
    rng = random.Random(seed)
    programs = set()
    with open(out, "wb") as f:
        for i in range(n_lines):
            if i < len(real):
                line = real[i]
            else:
                obj = orjson.loads(real[i % len(real)])
                _mutate(obj["i"][1][1], unrolls, rng)
                line = orjson.dumps(obj)
            programs.add(hash(line[:line.rfind(b'"r"')]))
            f.write(line + b"\n")
    return len(programs)


def _byte_chunks(path: Path, chunk_bytes: int) -> list[tuple[int, int]]:
    """Byte ranges of about `chunk_bytes` that start and end on line boundaries."""
    size = path.stat().st_size
    bounds = [0]
    with open(path, "rb") as f:
        while bounds[-1] + chunk_bytes < size:
            f.seek(bounds[-1] + chunk_bytes)
            f.readline()
            bounds.append(f.tell())
    bounds.append(size)
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


def bench_ansor(fixture: Path, n_lines: int = 200_000, workers: int = 2, max_len: int = 48) -> dict:
    """Read + validate + featurize `n_lines` Ansor lines built from the real fixture (see module doc)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ansor.json"
        distinct = write_ansor_input(fixture, path, n_lines)
        lines = [line for line in path.read_bytes().split(b"\n") if line]
        base = _baselines(lines)
        jobs = [("ansor", (str(path), a, b), max_len) for a, b in _byte_chunks(path, CHUNK_BYTES)]
        seconds, total = _run(jobs, workers)
        source = (f"{n_lines:,} lines ({path.stat().st_size / 1e6:.1f} MB): the {fixture.name} real lines, "
                  f"then copies with new tile sizes, compute-at locations and unroll values; "
                  f"{distinct:,} distinct programs")
    return _row("ansor", source, len(lines), seconds, total, base, workers)


def bench_ingest(ansor_fixture: str | os.PathLike, databases: list[str | os.PathLike], n_records: int = 200_000,
                 workers: int = 2, max_len: int = 48) -> list[dict]:
    return [bench_ansor(Path(ansor_fixture), n_records, workers, max_len),
            bench_metaschedule([Path(d) for d in databases], workers, max_len)]


def format_rows(rows: list[dict]) -> str:
    out = [f"{'format':13} {'records':>8} {'records/s':>10} {'per CPU-s':>10} {'json.loads/s':>13} "
           f"{'orjson/s':>9} {'x json':>6} {'encoded':>8} workers"]
    for r in rows:
        out.append(f"{r['format']:13} {r['records']:8d} {r['records_per_s']:10.0f} {r['records_per_cpu_s']:10.0f} "
                   f"{r['baseline_json_loads_per_s']:13.0f} {r['baseline_orjson_per_s']:9.0f} "
                   f"{r['ratio_vs_json_loads']:6.2f} {r['steps_encoded_share']:8.1%} {r['workers']}")
    out.append("")
    out.extend(f"{r['format']}: {r['input']}" for r in rows)
    out.extend(f"{r['format']}: one core's time per record: {r['us_read_validate']:.1f} us read + validate "
               f"(JSON parsing alone: {r['us_orjson_alone']:.1f} us), {r['us_featurize']:.1f} us featurize"
               for r in rows)
    out.extend(f"{r['format']}: the trace walker alone, per record ({r['walker_traces']:,} traces, same process, "
               f"alternating): {r['us_walk_python']:.1f} us in Python, "
               + (f"{r['us_walk_compiled']:.1f} us compiled" if r["us_walk_compiled"] is not None else
                  "compiled walker not built (setup.py builds tcl/records/_trace_steps*.so)")
               for r in rows if "us_walk_python" in r)
    out.append("records/s: read + validate + featurize, wall clock, all workers; per CPU-s: per second of "
               "worker CPU (one core's rate); json.loads/s, orjson/s: parsing the same lines alone, one "
               "process; encoded: steps the featurizer encoded rather than found in its cache")
    return "\n".join(out)
