"""Ship working databases as the bundled dataset: matched programs only, gzip-compressed.

A program is shipped only when every platform holds a record of it (success or failure), so an
interrupted collection still ships a consistent, matched dataset. Output per platform:
`database_workload.json.gz`, `database_tuning_record.json.gz` (MetaSchedule format, workload
indices renumbered), `tasks.json`, `collect.json`.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import orjson

from ..io import atomic_path
from .measure import program_id


def _read_db(db_dir: Path):
    workloads = [orjson.loads(line) for line in open(db_dir / "database_workload.json", "rb") if line.strip()]
    records = []
    for line in open(db_dir / "database_tuning_record.json", "rb"):
        try:
            wl_index, body = orjson.loads(line)
        except (orjson.JSONDecodeError, ValueError):
            continue  # a line cut by an interrupted writer: that program is re-measured on resume
        shash = workloads[wl_index][0]
        pid = program_id(body[0])
        records.append((shash, pid, body))
    return {w[0]: w for w in workloads}, records


def pack(work_root: str, platforms: list[str], out_root: str) -> dict:
    work_root, out_root = Path(work_root), Path(out_root)
    dbs = {p: _read_db(work_root / p) for p in platforms}
    keys = [{(s, pid) for s, pid, _ in dbs[p][1]} for p in platforms]
    matched = set.intersection(*keys) if keys else set()
    summary = {}
    for p in platforms:
        workloads, records = dbs[p]
        kept_shash = sorted({s for s, _ in matched})
        index = {s: i for i, s in enumerate(kept_shash)}
        out = out_root / p
        out.mkdir(parents=True, exist_ok=True)
        _write_gz(out / "database_workload.json.gz", [orjson.dumps(workloads[s]) for s in kept_shash])
        seen = set()
        lines = []
        for s, pid, body in records:
            if (s, pid) in matched and (s, pid) not in seen:
                seen.add((s, pid))
                lines.append(orjson.dumps([index[s], body]))
        _write_gz(out / "database_tuning_record.json.gz", lines)
        tasks = json.loads((work_root / p / "tasks.json").read_text())
        with atomic_path(out / "tasks.json") as tmp:
            tmp.write_text(json.dumps({s: tasks[s] for s in kept_shash if s in tasks}, indent=1, sort_keys=True))
        shutil.copyfile(work_root / p / "collect.json", out / "collect.json")
        summary[p] = {"tasks": len(kept_shash), "records": len(lines)}
    return summary


def _write_gz(path: Path, lines: list[bytes]) -> None:
    with atomic_path(path) as tmp:
        # mtime=0: the same content gives the same bytes, so git and DVC see no change
        with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as f:
            for line in lines:
                f.write(line + b"\n")
