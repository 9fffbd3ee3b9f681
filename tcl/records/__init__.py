"""Measured programs: the record schema, validation outcomes, and per-platform Parquet files.

A reader yields `Record`s and `Reject`s; `ingest` turns a source (file or tree) into one
Parquet file per platform plus a rejects file beside it. No pickle is ever loaded.
"""

from __future__ import annotations

import contextlib
import gc
import gzip
import hashlib
import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

import orjson

# Step kinds a reader accepts; anything else is rejected as `unknown_step_kind`.
ANSOR_STEP_KINDS = ("AN", "FU", "PR", "RE", "SP", "FSP", "FFSP", "SA", "CA", "CI", "CR", "CHR", "CHW", "RF")
METASCHEDULE_STEP_KINDS = (
    "GetSBlock", "GetLoops", "GetChildBlocks", "GetProducers", "GetConsumers", "GetOutputBlocks",
    "Split", "LoopPartition", "Fuse", "Merge", "Reorder", "ReorderBlockIterVar", "AddUnitLoop",
    "Parallel", "Vectorize", "Unroll", "Bind",
    "CacheRead", "CacheWrite", "ReindexCacheRead", "ReindexCacheWrite", "CacheInplace", "CacheIndex", "ReIndex",
    "ComputeAt", "ReverseComputeAt", "ComputeInline", "ReverseComputeInline",
    "DecomposeReduction", "DecomposePadding", "RFactor", "StorageAlign", "SetScope", "SetDType",
    "Blockize", "Tensorize", "TransformLayout", "TransformBlockLayout", "SetAxisSeparator", "PadEinsum",
    "RollingBuffer", "UnsafeSetDType", "UnsafeHideBufferAccess", "AnnotateBufferAccess",
    "Annotate", "Unannotate",
    "SamplePerfectTile", "SamplePartitionedTile", "SampleCategorical", "SampleComputeLocation",
    "EnterPostproc",
)
STEP_KINDS = ANSOR_STEP_KINDS + METASCHEDULE_STEP_KINDS

FAILED_LATENCY = 1e10  # MetaSchedule's marker for a failed build/run (and Tenset's for timeouts)

# Why a record was rejected. Keys are stable: tests and reports use them.
REJECT_REASONS = {
    "garbled": "line is not valid JSON (truncated or garbled)",
    "missing_field": "a required field is missing or has the wrong type",
    "measure_error": "measurement failed (error_no != 0)",
    "failed_run": "run_secs holds the 1e10 failure marker",
    "bad_latency": "latency is NaN, infinite, zero or negative",
    "unknown_step_kind": "a step kind outside the known vocabulary",
    "unknown_workload": "tuning record points at a workload index not in database_workload.json",
    "empty_file": "the file holds no records",
    "no_records": "the folder holds no record files",
}


@dataclass(slots=True)
class Record:
    platform: str
    task_id: str
    task_desc: str
    task_weight: float  # occurrences over all networks
    networks: str  # comma-separated network names
    network_weights: str  # JSON {network: occurrences in that network}; "{}" without network info
    steps: list  # [[kind, arg, ...], ...]
    latencies: list
    source: str

    @property
    def latency(self) -> float:
        return sum(self.latencies) / len(self.latencies)


class Reject(NamedTuple):
    file: str
    line: int  # 1-based; 0 for whole-file reasons
    reason: str
    detail: str
    raw: str


def steps_json(steps: list) -> str:
    """Canonical compact JSON of a program's steps (the text `steps_id` hashes). orjson writes
    what `json.dumps(steps, separators=(",", ":"))` wrote for every bundled record, ~3x faster;
    the two differ only on non-ASCII strings and float exponents, which steps hardly hold."""
    try:
        return orjson.dumps(steps).decode()
    except orjson.JSONEncodeError:  # an integer beyond 64 bits
        return json.dumps(steps, separators=(",", ":"))


def steps_id(steps_text: str) -> str:
    """Stable id of a program (sha1 of its canonical steps JSON): matches it across platforms."""
    return hashlib.sha1(steps_text.encode()).hexdigest()


@contextlib.contextmanager
def gc_paused():
    """Pause the cyclic garbage collector while reading a batch.

    Parsed records are trees of small lists without reference cycles, but allocating millions
    of them keeps triggering the collector, which then rescans every live record: measured
    here, that is ~80% of the time of reading 20,000 Ansor lines (55 us/line vs 10 us/line).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def read_lines(path: str | os.PathLike, chunk_bytes: int = 1 << 22) -> Iterator[bytes]:
    """Lines of a file (gzip-compressed when its name ends in .gz), read in large chunks: per-line
    reads of a gzip stream cost ~1.5x the decompression itself."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as f:
        rest = b""
        while True:
            block = f.read(chunk_bytes)
            if not block:
                break
            lines = (rest + block).split(b"\n")
            rest = lines.pop()
            yield from lines
        if rest:
            yield rest


def loads_lenient(line: bytes | str):
    """Parse one JSON line fast; fall back to the stdlib for NaN/Infinity (which Python's json
    writes and orjson refuses) so such records are rejected as bad latency, not as garbled.
    Raises ValueError for text that is not JSON."""
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        return json.loads(line)


def check_latencies(costs) -> str | None:
    """Reason a list of measured costs is unusable, or None when it is fine."""
    if not isinstance(costs, list) or not costs:
        return "missing_field"
    for c in costs:
        if not isinstance(c, (int, float)) or isinstance(c, bool):
            return "missing_field"
        if not math.isfinite(c) or c <= 0:
            return "bad_latency"
        if c >= FAILED_LATENCY:
            return "failed_run"
    return None


@dataclass
class IngestReport:
    records: int = 0
    tasks: int = 0
    rejected: dict = field(default_factory=dict)  # reason -> count
    rejects_path: str | None = None
    provenance: dict | None = None  # where the records come from (tcl.records.ingest.provenance)

    def count(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1

    def as_dict(self) -> dict:
        return {"records": self.records, "tasks": self.tasks, "rejected": dict(sorted(self.rejected.items())),
                "rejects_path": self.rejects_path, "provenance": self.provenance}
