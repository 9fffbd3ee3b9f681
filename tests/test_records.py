"""Readers on real data and every bad-input reason; atomic outputs."""

import json
import math

import pyarrow.parquet as pq
import pytest

from tcl.records import Record, Reject
from tcl.records.ansor import read_ansor_lines
from tcl.records.ingest import NoValidRecords, ingest, iter_source
from tcl.records.metaschedule import read_database

from .conftest import fixture_path, run_tcl

T4 = "ansor/tlcbench-t4-bert-early.json"


def test_ansor_fixture_reads_98_valid_and_keeps_2_failed(tmp_path):
    out = tmp_path / "t4.parquet"
    report = ingest(fixture_path(T4), "t4", out)
    assert (report.records, report.tasks, report.rejected) == (98, 10, {"measure_error": 2})
    table = pq.read_table(out)
    assert table.num_rows == 98
    row = table.slice(0, 1).to_pylist()[0]
    steps = json.loads(row["steps"])
    assert steps[0] == ["SP", 2, 0, 128, [2, 2, 2, 16], 1]  # kept as Ansor wrote it
    assert row["source"] == "ansor" and row["platform"] == "t4"
    assert math.isclose(row["latency"], sum(row["latencies"]) / len(row["latencies"]))
    rejects = [json.loads(l) for l in open(str(out) + ".rejects.jsonl")]
    assert [r["reason"] for r in rejects] == ["measure_error"] * 2
    assert all(r["line"] > 0 and r["file"].endswith(".json") and r["raw"].startswith("{") for r in rejects)


def test_metaschedule_fixture_steps_carry_sampled_values():
    records = list(read_database(fixture_path("metaschedule/dense_256"), "znver4-avx512-t2"))
    assert len(records) == 24 and all(isinstance(r, Record) for r in records)
    steps = records[0].steps
    # SamplePerfectTile's decision and the Split that uses it carry the same tile sizes
    tile = next(s for s in steps if s[0] == "SamplePerfectTile")
    split = next(s for s in steps if s[0] == "Split")
    assert tile[-4:] == split[2:6]
    assert split[1] == 0  # the split loop: the first axis its GetLoops returned
    assert "float32[256,256]" in records[0].task_desc
    assert all(r.latency > 0 for r in records)


def test_both_fixture_databases_through_the_cli(tmp_path):
    out = tmp_path / "ms.parquet"
    proc = run_tcl("ingest", fixture_path("metaschedule"), "--platform", "znver4-avx512-t2", "--out", out, "--json")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["records"] == 48 and summary["tasks"] == 2 and summary["rejected"] == {}


GOOD = open(fixture_path(T4)).readline().rstrip("\n")


def _with(**changes):
    obj = json.loads(GOOD)
    for path, value in changes.items():
        if path == "costs":
            obj["r"][0] = value
        elif path == "error_no":
            obj["r"][1] = value
        elif path == "drop_r":
            del obj["r"]
        elif path == "step":
            obj["i"][1][1].append(value)
    return json.dumps(obj).replace("NaN", "NaN")


@pytest.mark.parametrize("line,reason", [
    (GOOD[: len(GOOD) // 2], "garbled"),
    ("{this is not json", "garbled"),
    (_with(error_no=4), "measure_error"),
    (_with(costs=[1e10]), "failed_run"),
    (_with(costs=[float("nan")]), "bad_latency"),
    (_with(costs=[float("inf")]), "bad_latency"),
    (_with(costs=[0.0]), "bad_latency"),
    (_with(costs=[-1.0]), "bad_latency"),
    (_with(drop_r=True), "missing_field"),
    (_with(step=["ZZ", 1, 2]), "unknown_step_kind"),
])
def test_each_bad_ansor_line_is_rejected_with_its_reason(line, reason):
    items = list(read_ansor_lines("f.json", [GOOD, line, GOOD], "t4"))
    assert [type(i) for i in items] == [Record, Reject, Record]
    assert items[1].reason == reason and items[1].line == 2 and items[1].file == "f.json"


def test_bad_lines_never_abort_the_batch_and_are_counted(tmp_path):
    src = tmp_path / "mixed.json"
    src.write_text("\n".join([GOOD, GOOD[:40], _with(costs=[1e10]), _with(step=["ZZ"]), GOOD]) + "\n")
    report = ingest(src, "t4", tmp_path / "out.parquet")
    assert report.records == 2
    assert report.rejected == {"garbled": 1, "failed_run": 1, "unknown_step_kind": 1}
    rejects = [json.loads(l) for l in open(tmp_path / "out.parquet.rejects.jsonl")]
    assert sorted(r["line"] for r in rejects) == [2, 3, 4]


def test_empty_file_and_empty_folder_fail_with_a_reason(tmp_path):
    (tmp_path / "empty.json").write_text("")
    with pytest.raises(NoValidRecords, match="empty_file"):
        ingest(tmp_path / "empty.json", "t4", tmp_path / "o.parquet")
    (tmp_path / "nothing").mkdir()
    with pytest.raises(NoValidRecords, match="no_records"):
        ingest(tmp_path / "nothing", "t4", tmp_path / "o.parquet")
    proc = run_tcl("ingest", tmp_path / "empty.json", "--platform", "t4", "--out", tmp_path / "o.parquet",
                   check=False)
    assert proc.returncode != 0 and "no valid records remain" in proc.stderr and "empty_file" in proc.stderr
    assert not (tmp_path / "o.parquet").exists()


def test_tenset_tree_of_platform_files(tmp_path):
    tree = tmp_path / "measure_records" / "t4"
    tree.mkdir(parents=True)
    lines = open(fixture_path(T4)).read().splitlines()
    (tree / "a.json").write_text("\n".join(lines[:50]) + "\n")
    (tree / "b.json").write_text("\n".join(lines[50:]) + "\n")
    report = ingest(tree, "t4", tmp_path / "t.parquet")
    assert report.records == 98 and report.rejected == {"measure_error": 2}


def test_metaschedule_bad_records(tmp_path):
    db = tmp_path / "db"
    db.mkdir()
    src = fixture_path("metaschedule/dense_256")
    (db / "database_workload.json").write_text((src / "database_workload.json").read_text())
    good = (src / "database_tuning_record.json").read_text().splitlines()
    failed = json.loads(good[1]); failed[1][1] = [1e10]
    unknown = json.loads(good[2]); unknown[1][0][0][0][0] = "NoSuchPrimitive"
    orphan = json.loads(good[3]); orphan[0] = 7
    missing = json.loads(good[4]); missing[1] = missing[1][:1]
    (db / "database_tuning_record.json").write_text("\n".join(
        [good[0], json.dumps(failed), json.dumps(unknown), json.dumps(orphan), json.dumps(missing), good[5][:100]]) + "\n")
    report = ingest(db, "znver4-avx512-t2", tmp_path / "o.parquet")
    assert report.records == 1
    assert report.rejected == {"failed_run": 1, "unknown_step_kind": 1, "unknown_workload": 1,
                               "missing_field": 1, "garbled": 1}


def test_a_crash_mid_write_leaves_the_previous_output_intact(tmp_path, monkeypatch):
    out = tmp_path / "t4.parquet"
    ingest(fixture_path(T4), "t4", out)
    before = out.read_bytes()
    import tcl.records.ingest as ingest_mod

    def explode(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(ingest_mod, "records_to_table", explode)
    with pytest.raises(RuntimeError):
        ingest(fixture_path(T4), "t4", out)
    assert out.read_bytes() == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp files left


def test_reader_loads_no_pickle(tmp_path):
    import pickle

    (tmp_path / "evil.json").write_bytes(pickle.dumps({"x": 1}))
    items = list(iter_source(tmp_path / "evil.json", "t4"))
    assert all(isinstance(i, Reject) for i in items)


def test_provenance_of_a_tuning_database_travels_to_records_and_features(tmp_path):
    """A database `tcl tune` wrote (its tune.json beside it) ingests as more data for its platform,
    and the records and features say where they came from."""
    import shutil

    from tcl.features import FeatureSet, featurize_file
    from tcl.records.ingest import read_provenance

    db = tmp_path / "tuned"
    shutil.copytree(fixture_path("metaschedule/dense_256"), db)
    settings = {"platform": "znver4-avx512-t2", "cost_model": "tcl", "seed": 3, "trials": 24}
    (db / "tune.json").write_text(json.dumps(settings))
    out = tmp_path / "more.parquet"
    proc = run_tcl("ingest", db, "--platform", "znver4-avx512-t2", "--out", out, "--json")
    assert proc.returncode == 0, proc.stderr
    reported = json.loads(proc.stdout.strip().splitlines()[-1])["provenance"]
    assert reported == {"source": str(db), "format": "metaschedule",
                        "origin": {"made_by": "tcl tune", "file": "tune.json", **settings}}
    assert read_provenance(pq.read_table(out)) == reported
    featurize_file(out, tmp_path / "more.npz")
    assert FeatureSet.load(tmp_path / "more.npz").meta["provenance"] == reported


def test_provenance_without_an_origin_file_names_the_source(tmp_path):
    out = tmp_path / "t4.parquet"
    report = ingest(fixture_path(T4), "t4", out)
    assert report.provenance == {"source": str(fixture_path(T4)), "format": "ansor", "origin": {}}
