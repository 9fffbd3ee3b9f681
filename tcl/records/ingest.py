"""Ingest a source (Ansor JSON lines or MetaSchedule databases) into one platform's Parquet file.

Bad records never abort the batch: each is skipped, counted by reason and kept, with its file
and line, in `<out>.rejects.jsonl` beside the output. Both files are written atomically.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

from ..io import atomic_path
from . import REJECT_REASONS, IngestReport, Record, Reject, gc_paused, read_lines, steps_id, steps_json
from .ansor import read_ansor_lines
from .metaschedule import read_database

RECORD_COLUMNS = ("platform", "task_id", "task_desc", "task_weight", "networks", "network_weights",
                  "steps", "latencies", "latency", "program_id", "source")
# Columns a records file written by an older TCL may lack; readers of the table fall back.
OPTIONAL_COLUMNS = ("network_weights",)


class NoValidRecords(Exception):
    """Raised when a source yields nothing usable; the message says why."""


def _is_ms_db(path: Path) -> bool:
    return (path / "database_tuning_record.json").exists() or (path / "database_tuning_record.json.gz").exists()


def detect_format(src: Path) -> str:
    if src.is_dir():
        if _is_ms_db(src) or any(_is_ms_db(p.parent) for p in src.rglob("database_tuning_record.json*")):
            return "metaschedule"
        return "ansor"
    if src.name.startswith("database_tuning_record"):
        return "metaschedule"
    return "ansor"


def iter_source(src: str | os.PathLike, platform: str, fmt: str = "auto") -> Iterator[Record | Reject]:
    src = Path(src)
    if not src.exists():
        raise FileNotFoundError(f"{src}: no such file or folder")
    fmt = detect_format(src) if fmt == "auto" else fmt
    if fmt == "metaschedule":
        db_dirs = [src] if src.is_dir() and _is_ms_db(src) else (
            [src.parent] if src.is_file() else
            sorted({p.parent for p in src.rglob("database_tuning_record.json*")}))
        if not db_dirs:
            yield Reject(str(src), 0, "no_records", "no database_tuning_record.json under it", "")
        for d in db_dirs:
            yield from read_database(d, platform)
    elif fmt == "ansor":
        files = [src] if src.is_file() else sorted(p for p in src.rglob("*.json") if p.is_file())
        if not files:
            yield Reject(str(src), 0, "no_records", "no *.json record files under it", "")
        for f in files:
            yield from _read_ansor_file(f, platform)
    else:
        raise ValueError(f"unknown format {fmt!r} (auto, ansor or metaschedule)")


def _read_ansor_file(path: Path, platform: str) -> Iterator[Record | Reject]:
    empty = True
    for item in read_ansor_lines(str(path), read_lines(path), platform):
        empty = False
        yield item
    if empty:
        yield Reject(str(path), 0, "empty_file", "no records", "")


def records_to_table(records: list[Record]):
    import pyarrow as pa

    steps_text = [steps_json(r.steps) for r in records]
    return pa.table({
        "platform": pa.array([r.platform for r in records], pa.string()),
        "task_id": pa.array([r.task_id for r in records], pa.string()),
        "task_desc": pa.array([r.task_desc for r in records], pa.string()),
        "task_weight": pa.array([r.task_weight for r in records], pa.float64()),
        "networks": pa.array([r.networks for r in records], pa.string()),
        "network_weights": pa.array([r.network_weights for r in records], pa.string()),
        "steps": pa.array(steps_text, pa.string()),
        "latencies": pa.array([r.latencies for r in records], pa.list_(pa.float64())),
        "latency": pa.array([r.latency for r in records], pa.float64()),
        "program_id": pa.array([steps_id(s) for s in steps_text], pa.string()),
        "source": pa.array([r.source for r in records], pa.string()),
    })


# What made a MetaSchedule database, written beside it: `tcl tune` (tune.json), `tcl collect`
# (collect.json). Their content travels with the records as their provenance.
ORIGIN_FILES = {"tune.json": "tcl tune", "collect.json": "tcl collect"}
PROVENANCE_KEY = b"tcl.provenance"


def provenance(src: str | os.PathLike, fmt: str) -> dict:
    """Where records come from: the source path, its format and, for a database written by
    `tcl tune` or `tcl collect`, that file's settings (platform, cost model, seed, TVM version...)."""
    src = Path(src)
    folder = src if src.is_dir() else src.parent
    origin = {}
    for name, made_by in ORIGIN_FILES.items():
        path = folder / name
        if path.is_file():
            try:
                origin = {"made_by": made_by, "file": name, **json.loads(path.read_text())}
            except (OSError, ValueError) as exc:  # an unreadable origin file costs the provenance, not the data
                origin = {"made_by": made_by, "file": name, "error": str(exc)}
            break
    return {"source": str(src), "format": fmt, "origin": origin}


def ingest(src, platform: str, out: str | os.PathLike, fmt: str = "auto",
           progress: bool = False) -> IngestReport:
    """Read `src`, write `out` (Parquet) and `out.rejects.jsonl`; raise NoValidRecords if empty."""
    import pyarrow.parquet as pq
    from tqdm import tqdm

    out = Path(out)
    report = IngestReport()
    records: list[Record] = []
    rejects_path = out.with_name(out.name + ".rejects.jsonl")
    # the new rejects replace the old only after the new Parquet has replaced its own: a failed
    # ingest leaves the previous pair as it was
    with atomic_path(rejects_path) as tmp_rejects:
        with open(tmp_rejects, "w") as rej, gc_paused():
            for item in tqdm(iter_source(src, platform, fmt), disable=not progress, unit="rec", desc="ingest"):
                if isinstance(item, Record):
                    records.append(item)
                else:
                    report.count(item.reason)
                    rej.write(json.dumps(item._asdict()) + "\n")
        report.records = len(records)
        report.tasks = len({r.task_id for r in records})
        report.rejects_path = str(rejects_path)
        if not records:
            failed = out.with_name(out.name + ".failed-rejects.jsonl")
            os.replace(tmp_rejects, failed)
            reasons = ", ".join(f"{k}={v}" for k, v in sorted(report.rejected.items())) or "nothing read"
            raise NoValidRecords(f"{src}: no valid records remain ({reasons}); rejects of this run kept in "
                                 f"{failed}, {out} left as it was")
        report.provenance = provenance(src, detect_format(Path(src)) if fmt == "auto" else fmt)
        table = records_to_table(records)
        table = table.replace_schema_metadata({PROVENANCE_KEY: json.dumps(report.provenance).encode()})
        with atomic_path(out, suffix=".parquet") as tmp:
            pq.write_table(table, tmp)
    return report


def read_provenance(table) -> dict | None:
    """The provenance `ingest` stored in a records table (None for files from before it)."""
    meta = table.schema.metadata or {}
    return json.loads(meta[PROVENANCE_KEY]) if PROVENANCE_KEY in meta else None


def read_records(path: str | os.PathLike):
    """The records table of a Parquet file written by `ingest` (pyarrow.Table)."""
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    missing = [c for c in RECORD_COLUMNS if c not in table.column_names and c not in OPTIONAL_COLUMNS]
    if missing:
        raise ValueError(f"{path}: not a TCL records file (missing columns {', '.join(missing)})")
    return table


def describe_reasons() -> str:
    return "\n".join(f"  {k:18} {v}" for k, v in REJECT_REASONS.items())
