"""Sampler scale on this machine (`tcl bench sample`): seconds and peak memory to choose a share of
10^4 .. 10^6 programs, beside baselines measured in the same process.

Each pool size runs in a fresh process (its peak resident memory, ``ru_maxrss``, is then its own):

* the pool: synthetic step features of the real featurizer's shape (L = featurize.max_len,
  F = the featurizer's width): programs of 64 families, each a pattern of step rows drawn from a
  table of 2,048 distinct rows, a share of its steps replaced at random, random lengths. The
  features of 10^6 programs are ~16 GB at (48, 87), more than this machine holds, so they are
  generated block by block when read, as `tcl sample` reads a feature file's rows (tcl.npzfile); the
  mask and the task index (~50 MB at 10^6) are in memory.
* the strategy (default ``rdu``, `rounds` rounds, no net retrained: ``retrain.kind none``, so the
  later rounds' uncertainty is the committee's): wall seconds of ``select``, peak RSS of the
  process, and the RSS before it (interpreter, libraries, the pool's mask).
* baselines in the same process: random selection of the same budget, and one MiniBatchKMeans
  fit of ``max_clusters`` clusters on ``fit_rows`` programs of the cold embedding (the unit of
  RDU's clustering).

``from_file``: the pool is first written as a real feature file (``tcl featurize``'s format, ~17
KB a program at (48, 87)) and the user's command is timed on it: ``tcl sample FILE --out SUBSET``
in its own process (reading the file's step features in row slices, choosing, writing the
subset chunk by chunk), its wall seconds and its own peak RSS, beside ``--strategy random`` run
the same way. The file is written to ``workdir`` (default: a temporary directory) and removed;
right after it was written most of it is in the page cache, so this times the sampler, not the disk.
"""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SIZES = (10_000, 100_000, 1_000_000)
BLOCK = 8192  # programs generated at a time


class SyntheticSteps:
    """(N, L, F) float32 step features generated on reading (row slices or index arrays), the
    same rows whatever the reads: block b of BLOCK programs is drawn from a generator seeded (seed, b)."""

    dtype = np.dtype(np.float32)

    def __init__(self, n: int, max_len: int, n_features: int, seed: int = 0, n_families: int = 64):
        self.shape = (int(n), int(max_len), int(n_features))
        self.seed = int(seed)
        rng = np.random.default_rng([self.seed, 1])
        table = np.zeros((2048, n_features), np.float32)  # one-hot kind + a few numeric arguments
        table[np.arange(2048), rng.integers(0, min(24, n_features), 2048)] = 1.0
        cols = rng.integers(0, n_features, (2048, 4))
        table[np.arange(2048)[:, None], cols] += rng.normal(0, 3, (2048, 4)).astype(np.float32)
        self.table = table
        self.families = rng.integers(0, 2048, (n_families, max_len))
        self.mask = np.arange(max_len)[None, :] < self._lengths()[:, None]

    def _lengths(self) -> np.ndarray:
        n, max_len, _ = self.shape
        return np.random.default_rng([self.seed, 2]).integers(max_len // 3, max_len + 1, n)

    def __len__(self) -> int:
        return self.shape[0]

    def _block(self, b: int) -> np.ndarray:
        n, max_len, _ = self.shape
        rows = np.arange(b * BLOCK, min(n, (b + 1) * BLOCK))
        rng = np.random.default_rng([self.seed, 3, b])
        ids = self.families[rows % len(self.families)].copy()                    # (c, L)
        swap = rng.random(ids.shape) < 0.3
        ids[swap] = rng.integers(0, len(self.table), int(swap.sum()))
        return self.table[ids] * self.mask[rows][..., None]                      # (c, L, F)

    def __getitem__(self, key) -> np.ndarray:
        if isinstance(key, slice):
            start, stop, step = key.indices(self.shape[0])
            key = np.arange(start, stop, step)
        key = np.asarray(key, np.int64)
        out = np.empty((len(key), *self.shape[1:]), np.float32)
        blocks = key // BLOCK
        for b in np.unique(blocks):
            at = np.flatnonzero(blocks == b)
            out[at] = self._block(int(b))[key[at] - b * BLOCK]
        return out


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: kilobytes


def _one_size(n: int, ratio: float, strategy: str, rounds: int, settings: dict, max_len: int,
              n_features: int, seed: int) -> dict:
    """Run in a fresh process: the strategy and the baselines on a pool of `n` programs."""
    from tcl.sampling import Pool, SampleSettings, make_sampler
    from tcl.sampling import space

    x = SyntheticSteps(n, max_len, n_features, seed)
    pool = Pool(x=x, mask=x.mask, task=(np.arange(n) // 128).astype(np.int32))
    latency = np.random.default_rng([seed, 4]).lognormal(0.0, 0.5, n)
    budget = max(1, int(round(ratio * n)))
    s = SampleSettings.from_params({"sample": {**settings, "retrain": {"kind": "none"}}})

    def reveal(index):
        return latency[index]

    rss_before = _rss_mb()
    t0 = time.perf_counter()
    make_sampler("random", s, seed=seed, rounds=rounds).select(pool, budget, reveal)
    random_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    sel = make_sampler(strategy, s, seed=seed, rounds=rounds).select(pool, budget, reveal)
    seconds = time.perf_counter() - t0
    peak = _rss_mb()
    assert len(np.unique(sel.indices)) == budget

    # one MiniBatchKMeans fit as RDU makes it (on a projected cold embedding of fit_rows programs)
    rows = min(n, s.fit_rows)
    emb = space.project(space.cold_embedding(x[:rows], x.mask[:rows]), s.embed_dims, np.random.default_rng(0))
    from sklearn.cluster import MiniBatchKMeans

    t0 = time.perf_counter()
    MiniBatchKMeans(n_clusters=min(s.max_clusters, budget), batch_size=4096, n_init=3, max_iter=50,
                    random_state=0, compute_labels=False).fit(emb)
    kmeans_s = time.perf_counter() - t0
    return {"programs": n, "selected": budget, "strategy": strategy, "rounds": rounds, "seconds": seconds,
            "peak_rss_mb": peak, "rss_before_mb": rss_before, "random_seconds": random_s,
            "kmeans_fit_seconds": kmeans_s, "sampler_seconds": sel.seconds,
            "round_sizes": [r["selected"] for r in sel.rounds]}


# Runs argv[2:] and writes [exit code, its peak RSS in KB] to argv[1]. A child's ru_maxrss starts
# from its parent's resident size at the fork (Linux keeps it across exec), so the command is
# forked from this bare interpreter (python -S, a few MB), not from the bench's process.
_LAUNCH = """import json, os, sys
pid = os.fork()
if pid == 0:
    try:
        os.execv(sys.argv[2], sys.argv[2:])
    finally:
        os._exit(127)
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as f:
    json.dump([os.waitstatus_to_exitcode(status), usage.ru_maxrss], f)
"""


def _command_peak(args: list[str]) -> tuple[float, float, str]:
    """Run `args`; (wall seconds, its own peak RSS in MB, its stdout). RuntimeError on failure."""
    with tempfile.TemporaryDirectory(prefix="tcl-bench-cmd-") as tmp:
        usage_file = Path(tmp) / "usage.json"
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-S", "-c", _LAUNCH, str(usage_file), *args],
                              capture_output=True, text=True)
        seconds = time.perf_counter() - t0
        code, peak_kb = json.loads(usage_file.read_text()) if usage_file.exists() else (proc.returncode, 0)
    if proc.returncode != 0 or code != 0:
        raise RuntimeError(f"{' '.join(args[2:])} failed ({code}):\n{proc.stderr[-2000:]}")
    return seconds, peak_kb / 1024.0, proc.stdout


def _one_file(n: int, ratio: float, strategy: str, rounds: int, settings: dict, max_len: int,
              n_features: int, seed: int, workdir: str | None) -> dict:
    """Run in a fresh process: write a synthetic pool of `n` programs as a feature file, then time
    `tcl sample` on it with `strategy` and with random (each its own process)."""
    import yaml

    from tcl.features import FeatureSet, task_labels
    from tcl.npzfile import stored_rows

    x = SyntheticSteps(n, max_len, n_features, seed)
    task = (np.arange(n) // 128).astype(np.int32)
    latency = np.random.default_rng([seed, 4]).lognormal(0.0, 0.5, n)
    n_tasks = int(task.max()) + 1
    fs = FeatureSet(x=x, mask=x.mask, y=task_labels(task, latency), latency=latency, task=task,
                    program_id=np.char.mod("p%d", np.arange(n)), tasks=[f"t{i}" for i in range(n_tasks)],
                    task_desc=[""] * n_tasks, task_weight=np.ones(n_tasks), task_networks=[["synthetic"]] * n_tasks,
                    platform="synthetic")
    with tempfile.TemporaryDirectory(prefix="tcl-bench-sample-", dir=workdir) as tmp:
        pool_file, params_file = Path(tmp) / "pool.npz", Path(tmp) / "params.yaml"
        t0 = time.perf_counter()
        fs.save(pool_file)
        write_s = time.perf_counter() - t0
        params_file.write_text(yaml.safe_dump({"featurize": {"max_len": max_len},
                                               "sample": {**settings, "retrain": {"kind": "none"}}}))
        row = {"programs": n, "selected": max(1, int(round(ratio * n))), "strategy": strategy, "rounds": rounds,
               "from_file": True, "file_gb": pool_file.stat().st_size / 1e9, "write_seconds": write_s}
        for name in (strategy, "random"):
            out_file = Path(tmp) / f"{name}.npz"
            seconds, peak, stdout = _command_peak([
                sys.executable, "-m", "tcl.cli", "sample", str(pool_file), "--ratio", str(ratio), "--strategy", name,
                "--rounds", str(rounds), "--seed", str(seed), "--params", str(params_file), "--out", str(out_file),
                "--json"])
            summary = json.loads(stdout.strip().splitlines()[-1])
            if name == strategy:
                assert stored_rows(out_file, "x").shape[0] == summary["selected"] == row["selected"]  # header only
                row.update(seconds=seconds, peak_rss_mb=peak, sampler_seconds=summary["seconds"],
                           subset_gb=out_file.stat().st_size / 1e9)
            else:
                row.update(random_seconds=seconds, random_peak_rss_mb=peak)
            out_file.unlink()
    return row


def bench_sample(sizes=SIZES, ratio: float = 0.1, strategy: str = "rdu", rounds: int = 3,
                 params: dict | None = None, seed: int = 0, from_file: bool = False,
                 workdir: str | None = None) -> list[dict]:
    """One row per pool size (each measured in its own process); see the module docstring."""
    from tcl.features import Featurizer

    params = params or {}
    max_len = int((params.get("featurize") or {}).get("max_len", 48))
    n_features = Featurizer(max_len).n_features
    settings = {k: v for k, v in (params.get("sample") or {}).items()
                if k not in ("strategy", "ratio", "rounds", "seed", "retrain")}
    rows = []
    for n in sizes:
        args = [int(n), float(ratio), strategy, int(rounds), settings, max_len, n_features, int(seed)]
        if from_file:
            args.append(workdir)
        path = os.pathsep.join(filter(None, [_ROOT, os.environ.get("PYTHONPATH")]))
        child = "_one_file" if from_file else "_one_size"
        proc = subprocess.run([sys.executable, "-c", _CHILD, child, json.dumps(args)],
                              capture_output=True, text=True, env={**os.environ, "PYTHONPATH": path})
        if proc.returncode != 0:
            raise RuntimeError(f"bench sample of {n} programs failed:\n{proc.stderr[-2000:]}")
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return rows


# one pool size in a fresh interpreter: its peak RSS is then its own
_CHILD = ("import json, sys; import tcl.bench.sample as bench; "
          "print(json.dumps(getattr(bench, sys.argv[1])(*json.loads(sys.argv[2]))))")
_ROOT = str(Path(__file__).resolve().parents[2])  # the tcl package's parent: the child imports this code


# (header, row key, format) of each column; "|" separates the strategy from its baselines
_COLUMNS = [("programs", "programs", "10d"), ("chosen", "selected", "8d"), ("strategy", "strategy", ">9s"),
            ("seconds", "seconds", "8.2f"), ("peak MB", "peak_rss_mb", "8.0f"), ("before MB", "rss_before_mb", "9.0f"),
            "|", ("random s", "random_seconds", "8.3f"), ("1 k-means fit s", "kmeans_fit_seconds", "15.2f")]
_FILE_COLUMNS = [("programs", "programs", "10d"), ("file GB", "file_gb", "8.2f"), ("chosen", "selected", "8d"),
                 ("strategy", "strategy", ">9s"), ("seconds", "seconds", "8.2f"), ("sampler s", "sampler_seconds", "9.2f"),
                 ("peak MB", "peak_rss_mb", "8.0f"), "|", ("random s", "random_seconds", "8.2f"),
                 ("random MB", "random_peak_rss_mb", "9.0f"), "|", ("write s", "write_seconds", "8.1f")]


def format_table(rows: list[dict]) -> str:
    """The rows as a text table, with what the columns mean."""
    from_file = bool(rows and rows[0].get("from_file"))
    columns = _FILE_COLUMNS if from_file else _COLUMNS

    width = [1 if col == "|" else int(re.match(r"\D*(\d+)", col[2]).group(1)) for col in columns]  # "8.2f" -> 8
    head = " ".join("|" if col == "|" else f"{col[0]:>{w}s}" for col, w in zip(columns, width))
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(" ".join("|" if col == "|" else format(r[col[1]], col[2]) for col in columns))
    if rows and from_file:
        lines.append(f"(`tcl sample FILE` end to end in its own process, {rows[0]['rounds']} round(s), no net "
                     "retrained: seconds = read + choose + write the subset; sampler s: choosing alone; peak MB: "
                     "that process's peak resident memory; write s: writing the pool file, not timed against)")
    elif rows:
        lines.append(f"({rows[0]['rounds']} round(s), no net retrained; peak MB: the process's peak resident "
                     "memory, before MB: before sampling (interpreter, libraries, the pool's mask))")
    return "\n".join(lines)
