"""`tcl collect` measures real programs with TVM MetaSchedule, locally and through RPC."""

import json
import os
import subprocess
import sys
import time

import pytest

from tcl.hardware import get_platform
from tcl.records import Record
from tcl.records.ingest import ingest
from tcl.records.metaschedule import read_database

from .conftest import (LOCAL_PLATFORM, REPO, fixture_path, free_port, rpc_tracker_and_server, run_tcl,
                       stop_process_tree, wait_for_tracker)

pytestmark = pytest.mark.slow

PLATFORM = LOCAL_PLATFORM  # measured on this host


def _records(db):
    return [r for r in read_database(db, PLATFORM) if isinstance(r, Record)]


def test_collect_writes_a_metaschedule_database_and_resumes(tmp_path):
    db = tmp_path / "db"
    scratch = tmp_path / "tmp"  # the temporary files of the run: none is left behind
    scratch.mkdir()
    proc = run_tcl("collect", "--platform", PLATFORM, "--out", db, "--workload", "dense_64",
                   "--trials", "4", "--min-repeat-ms", "1", "--json", env={"TMPDIR": str(scratch)})
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["measured"] == 4 and summary["present"] == 0
    assert summary["runner_restarts"] == 0 and summary["hung_runs"] == 0  # the runner's guard kept still
    assert list(scratch.iterdir()) == []  # each build's directory, and the library the runner linked
    assert (db / "database_workload.json").exists() and (db / "tasks.json").exists()
    settings = json.loads((db / "collect.json").read_text())
    assert settings["target"] == get_platform(PLATFORM).target and settings["threads"] == 2
    records = _records(db)
    assert len(records) == 4 and all(0 < r.latency < 1 for r in records)
    assert len({json.dumps(r.steps) for r in records}) == 4  # distinct programs
    assert records[0].task_id == "dense_64_64_64" and "dense" in records[0].task_desc
    # the database is what the reader and ingest consume
    report = ingest(db, PLATFORM, tmp_path / "r.parquet")
    assert report.records == 4 and report.tasks == 1

    # resuming with more trials measures only the new programs; the first four are kept as they were
    before = (db / "database_tuning_record.json").read_text().splitlines()
    proc = run_tcl("collect", "--platform", PLATFORM, "--out", db, "--workload", "dense_64",
                   "--trials", "6", "--min-repeat-ms", "1", "--json")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["present"] == 4 and summary["measured"] == 2
    after = (db / "database_tuning_record.json").read_text().splitlines()
    assert after[:4] == before and len(after) == 6

    # a run killed mid-write leaves half a line: resuming drops it and measures that program again
    text = (db / "database_tuning_record.json").read_text()
    (db / "database_tuning_record.json").write_text(text[: len(text) - len(after[-1]) // 2 - 1])
    proc = run_tcl("collect", "--platform", PLATFORM, "--out", db, "--workload", "dense_64",
                   "--trials", "6", "--min-repeat-ms", "1", "--json")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["present"] == 5 and summary["measured"] == 1
    assert len(_records(db)) == 6


def test_collect_measures_the_workloads_of_a_user_s_database(tmp_path):
    """A model's own tasks as a MetaSchedule database holds them (any TIR; here two fixture
    databases' workloads, without tasks.json): collected plainly and actively, each task named by
    its structural hash, as `tcl ingest` and `tcl tune --workload-db` name it."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "database_workload.json").write_text("".join(
        (fixture_path(f"metaschedule/{name}") / "database_workload.json").read_text()
        for name in ("dense_256", "conv2d_small")))
    hashes = [str(json.loads(line)[0]) for line in (mine / "database_workload.json").read_text().splitlines()]
    db = tmp_path / "db"
    proc = run_tcl("collect", "--platform", PLATFORM, "--out", db, "--workload-db", mine,
                   "--trials", "2", "--min-repeat-ms", "1", "--json")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["tasks"] == 2 and summary["measured"] == 4
    meta = json.loads((db / "tasks.json").read_text())
    assert sorted(m["name"] for m in meta.values()) == sorted(hashes) == sorted(meta)
    assert {m["kind"] for m in meta.values()} == {"workload"}
    report = ingest(db, PLATFORM, tmp_path / "r.parquet")
    assert report.records == 4 and report.tasks == 2
    # actively: the second workload only, the sampler's choice of a pool of its candidates
    proc = run_tcl("collect", "--platform", PLATFORM, "--out", tmp_path / "active", "--workload-db", mine,
                   "--task-index", "1", "--sample", "random", "--budget", "2", "--pool-size", "4",
                   "--min-repeat-ms", "1", "--params", REPO / "params.yaml", "--json")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["measured"] == 2 and summary["pool"] == 4
    assert [m["name"] for m in json.loads((tmp_path / "active" / "tasks.json").read_text()).values()] == [hashes[1]]
    proc = run_tcl("collect", "--platform", PLATFORM, "--out", tmp_path / "x", "--workload", "dense_64",
                   "--task-index", "0", "--trials", "1", check=False)
    assert proc.returncode == 2 and "--task-index goes with --workload-db" in proc.stderr


def test_collect_rejects_unknown_names(tmp_path):
    proc = run_tcl("collect", "--platform", "nope", "--out", tmp_path, "--workload", "dense_64", "--trials", "1",
                   check=False)
    assert proc.returncode == 2 and "unknown platform 'nope'" in proc.stderr
    proc = run_tcl("collect", "--platform", "t4", "--out", tmp_path, "--workload", "dense_64", "--trials", "1",
                   check=False)
    assert proc.returncode != 0 and "no TVM target" in proc.stderr
    proc = run_tcl("collect", "--platform", "x86-sse-t1", "--out", tmp_path, "--workload", "nope",
                   "--trials", "1", check=False)
    assert proc.returncode == 2 and "unknown workload 'nope'" in proc.stderr


def test_an_operator_named_by_its_shape_is_a_workload():
    from tcl.collect.networks import network_tasks
    from tcl.collect.workloads import SHAPE_DIMS, build_workload, parse_shape_name, resolve_workload

    for name, task in network_tasks().items():  # a task's name spells its operator
        assert parse_shape_name(name) == task.op
    unseen = {"dense": "dense_48_80_16", "batch_matmul": "batch_matmul_2_16_24_8",
              "conv2d": "conv2d_9_8_16_3_2", "depthwise_conv2d": "depthwise_conv2d_10_8_5_1",
              "softmax": "softmax_3_40", "layer_norm": "layer_norm_5_24"}
    assert set(unseen) == set(SHAPE_DIMS)
    for kind, name in unseen.items():
        op = resolve_workload(name)
        assert name not in network_tasks() and op.kind == kind and op.key == name
        assert list(build_workload(op).functions)  # a TIR module MetaSchedule can tune
    for bad, why in [("dense_48_80", "dense takes 3 positive integer dimensions, dense_M_K_N"),
                     ("conv2d_9_8_16_3_0", "conv2d_H_CIN_COUT_K_STRIDE"),
                     ("softmax_3_x", "softmax_ROWS_COLS"), ("dense_4_4_\u00b2", "dense_M_K_N"), ("gemm_4_4_4", "unknown workload")]:
        with pytest.raises(KeyError, match=why):
            resolve_workload(bad)
    assert parse_shape_name("gemm_4_4_4") is None


def test_collect_through_an_rpc_tracker_and_server(tmp_path):
    with rpc_tracker_and_server("tcl-test") as port:
        db = tmp_path / "rpc-db"
        proc = run_tcl("collect", "--platform", "x86-sse-t1", "--out", db, "--workload", "dense_64",
                       "--trials", "3", "--min-repeat-ms", "1", "--rpc-tracker", f"127.0.0.1:{port}",
                       "--rpc-key", "tcl-test", "--json")
        summary = json.loads(proc.stdout.strip().splitlines()[-1])
        assert summary["measured"] == 3 and summary["failed"] == {}, summary
        settings = json.loads((db / "collect.json").read_text())
        assert settings["rpc"] == {"tracker": f"127.0.0.1:{port}", "key": "tcl-test"}
        assert len(_records(db)) == 3


def test_collect_fails_fast_without_an_rpc_server(tmp_path):
    port = free_port()
    tracker = subprocess.Popen([sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1",
                                "--port", str(port), "--port-end", str(port + 1), "--silent"])
    try:
        wait_for_tracker(port, procs=(tracker,))
        proc = run_tcl("collect", "--platform", "x86-sse-t1", "--out", tmp_path / "db", "--workload", "dense_64",
                       "--trials", "1", "--rpc-tracker", f"127.0.0.1:{port}", "--rpc-key", "nobody", check=False)
        assert proc.returncode == 2 and "no server registered with key 'nobody'" in proc.stderr
    finally:
        stop_process_tree(tracker)


def test_collect_lists_the_task_names_its_hint_points_to(tmp_path):
    lines = run_tcl("collect", "--list-tasks").stdout.splitlines()  # no --platform/--out needed
    assert "dense_64" in lines[0] and any(line.startswith("dense_128_768_768 ") for line in lines)
    assert lines[1].startswith("any operator by its shape: ") and "dense_M_K_N" in lines[1]
    assert lines[-1].startswith("networks (--network): ") and "bert_base" in lines[-1]
    proc = run_tcl("collect", "--platform", "x86-sse-t1", "--out", tmp_path / "db", "--workload", "nope",
                   "--trials", "1", check=False)
    assert proc.returncode == 2 and "unknown workload 'nope'" in proc.stderr and "--list-tasks" in proc.stderr
    assert not (tmp_path / "db").exists()
