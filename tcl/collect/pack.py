"""Ship working databases as the bundled dataset (matched programs only, gzip), and back.

A program is shipped only when every platform holds a record of it (success or failure), so an
interrupted collection still ships a consistent, matched dataset. Output per platform:
`database_workload.json.gz`, `database_tuning_record.json.gz` (MetaSchedule format, workload
indices renumbered), `tasks.json`, `collect.json`. Every platform is first written to a new folder;
only when all are written does each replace its old one, so a failed pack leaves the previous
bundle whole.

`unpack` is the way back: it restores working databases from the bundle, so a collection can be
resumed (or extended with new tasks or platforms) from a fresh clone without re-measuring.
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


def pack(work_root: str, platforms: list[str], out_root: str, matched_only: bool = True) -> dict:
    """Write the bundle of `platforms` under `out_root`; all platforms are staged before any
    replaces its old folder, so a failure (a missing file, a full disk) changes nothing.

    `matched_only=False` keeps every record of each platform instead: a snapshot of a collection
    in progress (`tcl dataset snapshot`), committed so that an interrupted collection loses nothing
    and a later session resumes from it with `tcl dataset unpack --raw SNAPSHOT`.
    """
    work_root, out_root = Path(work_root), Path(out_root)
    dbs = {p: _read_db(work_root / p) for p in platforms}
    keys = {p: {(s, pid) for s, pid, _ in dbs[p][1]} for p in platforms}
    common = set.intersection(*keys.values()) if keys else set()
    staged = {p: out_root / f".{p}.packing" for p in platforms}
    summary = {}
    try:
        for p in platforms:
            matched = common if matched_only else keys[p]
            kept_shash = sorted({s for s, _ in matched})
            index = {s: i for i, s in enumerate(kept_shash)}
            workloads, records = dbs[p]
            out = staged[p]
            shutil.rmtree(out, ignore_errors=True)  # left by a crashed pack
            out.mkdir(parents=True)
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
    except BaseException:
        for out in staged.values():
            shutil.rmtree(out, ignore_errors=True)
        raise
    for p in platforms:
        _replace_dir(staged[p], out_root / p)
    return summary


def _replace_dir(new: Path, final: Path) -> None:
    """Put `new` in the place of `final`: two renames, the old folder removed only afterwards."""
    old = final.with_name(f".{final.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    new.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def unpack(raw_root: str, platforms: list[str], work_root: str, force: bool = False) -> dict:
    """Restore working databases under `work_root` from a bundle under `raw_root`.

    Refuses to overwrite a working database unless `force`: it may hold measurements the bundle
    lacks (programs not yet matched on every platform).
    """
    raw_root, work_root = Path(raw_root), Path(work_root)
    summary = {}
    for p in platforms:
        src, dst = raw_root / p, work_root / p
        if not (src / "database_tuning_record.json.gz").exists():
            summary[p] = {"records": 0, "note": f"nothing bundled in {src}"}
            continue
        if (dst / "database_tuning_record.json").exists() and not force:
            raise FileExistsError(f"{dst} already holds a working database; pass --force to replace it")
        staging = work_root / f".{p}.unpacking"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        records = 0
        for name in ("database_workload.json", "database_tuning_record.json"):
            with gzip.open(src / f"{name}.gz", "rb") as f_in, open(staging / name, "wb") as f_out:
                for line in f_in:
                    f_out.write(line)
                    records += name == "database_tuning_record.json"
        for name in ("tasks.json", "collect.json"):
            shutil.copyfile(src / name, staging / name)
        _replace_dir(staging, dst)
        summary[p] = {"records": records}
    return summary


def _write_gz(path: Path, lines: list[bytes]) -> None:
    with atomic_path(path) as tmp:
        # mtime=0: the same content gives the same bytes, so git and DVC see no change
        with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as f:
            for line in lines:
                f.write(line + b"\n")
