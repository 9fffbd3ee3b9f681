"""Shipping a collection: pack (matched programs, chosen tasks), snapshot and unpack round trips."""

from __future__ import annotations

import json
import shutil

from click.testing import CliRunner

from tcl.cli import main
from tcl.collect.pack import pack, unpack

from .conftest import fixture_path

FIXTURES = {"conv2d_small": "metaschedule/conv2d_small", "dense_256": "metaschedule/dense_256"}


def _records(db_dir) -> list[str]:
    return [ln for ln in (db_dir / "database_tuning_record.json").read_text().splitlines() if ln.strip()]


def _working_db(root, platform, drop: dict | None = None):
    """A working database holding both real fixture databases (two tasks), as `collect` writes
    it; `drop[task]` leaves out that task's first n records."""
    dst = root / platform
    dst.mkdir(parents=True)
    workloads, records, tasks = [], [], {}
    for name, rel in FIXTURES.items():
        src = fixture_path(rel)
        (wl_line,) = [ln for ln in (src / "database_workload.json").read_text().splitlines() if ln.strip()]
        shash = json.loads(wl_line)[0]
        tasks[shash] = {"name": name, "weight": 1}
        for line in _records(src)[(drop or {}).get(name, 0):]:
            _, body = json.loads(line)
            records.append(json.dumps([len(workloads), body]))
        workloads.append(wl_line)
    (dst / "database_workload.json").write_text("\n".join(workloads) + "\n")
    (dst / "database_tuning_record.json").write_text("\n".join(records) + "\n")
    (dst / "tasks.json").write_text(json.dumps(tasks))
    (dst / "collect.json").write_text(json.dumps({"platform": platform}))
    return {name: len(_records(fixture_path(rel))) for name, rel in FIXTURES.items()}


def test_pack_ships_matched_programs_of_the_chosen_tasks_and_snapshot_keeps_everything(tmp_path):
    work = tmp_path / "work"
    full = _working_db(work, "p-a")
    _working_db(work, "p-b", drop={"dense_256": 3})  # p-b has not measured 3 of dense_256's yet

    matched = pack(str(work), ["p-a", "p-b"], str(tmp_path / "raw"))
    assert matched["p-a"] == matched["p-b"] == {"tasks": 2, "records": full["conv2d_small"] + full["dense_256"] - 3}

    only = pack(str(work), ["p-a", "p-b"], str(tmp_path / "raw1"), task_names={"conv2d_small"})
    assert only["p-a"] == {"tasks": 1, "records": full["conv2d_small"]}

    snap = pack(str(work), ["p-a", "p-b"], str(tmp_path / "snap"), matched_only=False)
    assert snap["p-a"]["records"] == full["conv2d_small"] + full["dense_256"]
    assert snap["p-b"]["records"] == full["conv2d_small"] + full["dense_256"] - 3

    # unpack restores working databases that hold the same records, so `collect` resumes there
    restored = tmp_path / "restored"
    assert unpack(str(tmp_path / "snap"), ["p-a", "p-b"], str(restored))["p-b"]["records"] == snap["p-b"]["records"]
    for p in ("p-a", "p-b"):
        original = sorted(json.dumps(json.loads(ln)[1]) for ln in _records(work / p))
        assert sorted(json.dumps(json.loads(ln)[1]) for ln in _records(restored / p)) == original
        assert json.loads((restored / p / "tasks.json").read_text()) == json.loads((work / p / "tasks.json").read_text())


def test_unpack_never_overwrites_a_working_database(tmp_path):
    work = tmp_path / "work"
    _working_db(work, "p-a")
    pack(str(work), ["p-a"], str(tmp_path / "raw"))
    before = (work / "p-a" / "database_tuning_record.json").read_bytes()
    params = tmp_path / "params.yaml"
    params.write_text(f"dataset: {{out: {work}}}\nplatforms: [p-a]\n")
    res = CliRunner().invoke(main, ["dataset", "unpack", "--params", str(params), "--raw", str(tmp_path / "raw")])
    assert res.exit_code == 1 and "already holds a working database" in res.output
    assert (work / "p-a" / "database_tuning_record.json").read_bytes() == before
    shutil.rmtree(work)
    res = CliRunner().invoke(main, ["dataset", "unpack", "--params", str(params), "--raw", str(tmp_path / "raw")])
    assert res.exit_code == 0, res.output
    assert (work / "p-a" / "database_tuning_record.json").read_bytes()
