"""`tcl bench ingest`: real inputs, counts that add up, copies that are new programs, no workers left."""

import json
import multiprocessing

import pytest

from tcl.bench.ingest import bench_ingest, format_rows, write_ansor_input
from tcl.records import Record
from tcl.records.ansor import read_ansor_lines

from .conftest import fixture_path, run_tcl

T4 = "ansor/tlcbench-t4-bert-early.json"


def test_ansor_copies_are_new_programs_of_the_real_tasks(tmp_path):
    fixture = fixture_path(T4)
    real = [json.loads(line) for line in fixture.read_text().splitlines() if line.strip()]
    distinct = write_ansor_input(fixture, tmp_path / "in.json", 1000)
    lines = (tmp_path / "in.json").read_bytes().splitlines()
    assert len(lines) == 1000 and distinct > 900  # copies differ from each other, not only from the source
    assert [json.loads(line) for line in lines[:len(real)]] == real  # the real lines come first, unchanged
    records = [r for r in read_ansor_lines("in.json", lines, "t4") if isinstance(r, Record)]
    assert {r.task_id for r in records} == {obj["i"][0][0] for obj in real}
    copies = [r for r in read_ansor_lines("in.json", lines[len(real):], "t4") if isinstance(r, Record)]
    for r in copies:  # every redrawn split's tile sizes divide its extent
        for s in r.steps:
            if s[0] == "SP" and s[3]:
                product = 1
                for f in s[4]:
                    product *= f
                assert s[3] % product == 0


def test_bench_ingest_counts_every_record_and_leaves_no_worker(tmp_path):
    dbs = [fixture_path("metaschedule/dense_256"), fixture_path("metaschedule/conv2d_small")]
    rows = bench_ingest(fixture_path(T4), dbs, n_records=3000, workers=2)
    ansor, ms = rows
    # 2 of the 100 real lines failed (error_no != 0); their copies fail too
    assert (ansor["records"], ansor["valid"], ansor["rejected"]) == (3000, 2940, 60)
    assert (ms["records"], ms["valid"], ms["rejected"]) == (48, 48, 0)
    for r in rows:
        assert r["records_per_s"] > 0 and r["baseline_json_loads_per_s"] > 0 and 0 < r["steps_encoded_share"] <= 1
    assert "tlcbench-t4-bert-early.json real lines" in ansor["input"] and "48 records" in ms["input"]
    assert multiprocessing.active_children() == []
    assert "read + validate + featurize" in format_rows(rows)


def test_bench_ingest_cli_names_its_inputs():
    proc = run_tcl("bench", "ingest", "--records", "500", "--workers", "1",
                   "--metaschedule", fixture_path("metaschedule/dense_256"), "--json")
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [r["format"] for r in rows] == ["ansor", "metaschedule"]
    assert "500 lines" in proc.stdout and "1 real databases (dense_256): 24 records" in proc.stdout
