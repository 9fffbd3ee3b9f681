"""Invariants of the bundled dataset (data/raw): fast, read-only, no TVM measurement."""

import gzip
import json
from collections import Counter, defaultdict
from pathlib import Path

import orjson
import pytest
import yaml

from tcl.collect.stats import dataset_stats, spearman
from tcl.features import featurize_table
from tcl.hardware import platforms
from tcl.records import FAILED_LATENCY, steps_id, steps_json
from tcl.records.ingest import ingest, read_records
from tcl.records.metaschedule import trace_to_steps
from tcl.split import split_by_network

from .conftest import REPO, run_tcl

RAW = REPO / "data" / "raw"
PARAMS = yaml.safe_load((REPO / "params.yaml").read_text())
PLATFORM_NAMES = PARAMS["platforms"]


def _lines(path: Path) -> list[bytes]:
    with gzip.open(path, "rb") as f:
        return [line for line in f if line.strip()]


@pytest.fixture(scope="module")
def raw_db():
    """Per platform: every tuning-record line parsed by hand, the independent view of the files."""
    out = {}
    for p in PLATFORM_NAMES:
        d = RAW / p
        hashes = [str(orjson.loads(line)[0]) for line in _lines(d / "database_workload.json.gz")]
        meta = json.loads((d / "tasks.json").read_text())
        rows = []
        for line in _lines(d / "database_tuning_record.json.gz"):
            wl, (trace, run_secs, _target, _args) = orjson.loads(line)
            rows.append({"task": meta[hashes[wl]]["name"], "pid": steps_id(steps_json(trace_to_steps(trace))),
                         "failed": any(s >= FAILED_LATENCY for s in run_secs)})
        out[p] = {"hashes": hashes, "meta": meta, "rows": rows}
    return out


@pytest.fixture(scope="module")
def ingested(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("records")
    return {p: (ingest(RAW / p, p, tmp / f"{p}.parquet"), tmp / f"{p}.parquet") for p in PLATFORM_NAMES}


def test_platforms_are_the_params_platforms_and_registered_in_three_families():
    on_disk = sorted(p.name for p in RAW.iterdir() if p.is_dir())
    PLATFORMS = platforms()
    assert on_disk == sorted(PLATFORM_NAMES)
    assert all(p in PLATFORMS and PLATFORMS[p].measurable for p in PLATFORM_NAMES)
    assert len({PLATFORMS[p].family for p in PLATFORM_NAMES}) >= 3
    for p in PLATFORM_NAMES:  # measured the way the registry and params say
        c = json.loads((RAW / p / "collect.json").read_text())
        assert c["platform"] == p and c["target"] == PLATFORMS[p].target and c["threads"] == PLATFORMS[p].threads
        timing = ("number", "repeat", "min_repeat_ms", "enable_cpu_cache_flush")  # what a latency means
        assert {k: c["settings"][k] for k in timing} == {k: PARAMS["dataset"]["measure"][k] for k in timing}


def test_every_task_has_records_and_programs_are_matched_across_platforms(raw_db):
    first = raw_db[PLATFORM_NAMES[0]]
    for p, db in raw_db.items():
        assert db["hashes"] == first["hashes"], p  # same workloads, same order
        assert set(db["meta"]) == set(db["hashes"]), p  # every workload described in tasks.json
    per_task = {p: defaultdict(set) for p in raw_db}
    for p, db in raw_db.items():
        for row in db["rows"]:
            per_task[p][row["task"]].add(row["pid"])
    tasks = {m["name"] for m in first["meta"].values()}
    for p in raw_db:
        assert set(per_task[p]) == tasks, p  # every task has >= 1 record on every platform
        valid_tasks = {r["task"] for r in raw_db[p]["rows"] if not r["failed"]}
        assert valid_tasks == tasks, f"{p}: tasks without a valid record: {tasks - valid_tasks}"
        assert per_task[p] == per_task[PLATFORM_NAMES[0]], p  # same program ids, failures included


def test_rejected_records_are_never_counted_as_valid(raw_db, ingested):
    for p, (report, parquet) in ingested.items():
        lines = len(_lines(RAW / p / "database_tuning_record.json.gz"))
        assert report.records + sum(report.rejected.values()) == lines, p
        assert report.rejected.get("failed_run", 0) == sum(r["failed"] for r in raw_db[p]["rows"]), p
        table = read_records(parquet)
        assert table.num_rows == report.records
        latencies = table.column("latency").to_pylist()
        assert all(0 < x < FAILED_LATENCY for x in latencies), p
        valid_ids = Counter((r["task"], r["pid"]) for r in raw_db[p]["rows"] if not r["failed"])
        got = Counter(zip(table.column("task_id").to_pylist(), table.column("program_id").to_pylist()))
        assert got == valid_ids, p


def test_split_holds_out_every_task_of_the_test_networks(ingested):
    held = [n for n in PARAMS["split"]["test_networks"].split(",") if n]
    assert set(held) == {"resnet50", "bert_base"}
    for p, (_, parquet) in ingested.items():
        fs = featurize_table(read_records(parquet), PARAMS["featurize"]["max_len"])
        parts = split_by_network(fs, held, PARAMS["split"]["valid_fraction"], PARAMS["split"]["seed"])
        held_tasks = {t for t, nets in zip(fs.tasks, fs.task_networks) if set(nets) & set(held)}
        assert held_tasks and set(parts["test"].tasks) == held_tasks, p
        for name in ("train", "valid"):
            assert not set(parts[name].tasks) & held_tasks, (p, name)
            assert not set(parts[name].networks()) & set(held), (p, name)
        assert sum(len(x) for x in parts.values()) == len(fs)
        assert len(parts["train"]) > 0


def test_task_set_covers_the_operator_kinds_and_networks(raw_db):
    meta = raw_db[PLATFORM_NAMES[0]]["meta"].values()
    kinds = {m["kind"] for m in meta}
    networks = {n for m in meta for n in m["networks"]}
    assert {"conv2d", "depthwise_conv2d", "dense", "batch_matmul", "softmax", "layer_norm"} <= kinds
    assert {"resnet50", "mobilenet_v2", "bert_base"} <= networks
    assert all(m["weight"] == sum(m["weights"].values()) >= 1 for m in meta)


def test_stats_figures_agree_with_the_files(raw_db):
    from scipy.stats import spearmanr

    s = dataset_stats(RAW, PLATFORM_NAMES)
    for p, db in raw_db.items():
        x = s["per_platform"][p]
        assert x["records"] == len(db["rows"]) and x["failed"] == sum(r["failed"] for r in db["rows"])
        assert x["valid"] + x["failed"] == x["records"]
        assert x["tasks"] == len(db["meta"])
    assert len(s["pairs"]) == len(PLATFORM_NAMES) * (len(PLATFORM_NAMES) - 1) // 2
    for pair in s["pairs"]:
        assert -1 <= pair["median_spearman"] <= 1 and 0 <= pair["best_changes"] <= pair["tasks"]
        assert pair["geomean_slowdown_a_best_on_b"] >= 1 and pair["mean_rank_a_best_on_b"] >= 1
    # the rank correlation is the textbook one (ties get mean ranks)
    a, b = [3.0, 1.0, 2.0, 2.0, 5.0, 4.0], [2.5, 1.0, 3.0, 3.0, 4.0, 9.0]
    assert spearman(a, b) == pytest.approx(spearmanr(a, b).statistic, abs=1e-12)


def test_stats_and_datasheet_commands(tmp_path):
    out = tmp_path / "stats.json"
    proc = run_tcl("dataset", "stats", "--raw", RAW, "--out", out)
    assert "median Spearman within a family" in proc.stdout
    stats = json.loads(out.read_text())
    assert stats["platforms"] == sorted(PLATFORM_NAMES)
    sheet = tmp_path / "DATASHEET.md"
    run_tcl("dataset", "datasheet", "--stats", out, "--noise", str(tmp_path / "none-*.json"), "--raw", RAW,
            "--params", REPO / "params.yaml", "--out", sheet)
    text = sheet.read_text()
    for p in PLATFORM_NAMES:
        assert p in text
    assert f"| {stats['totals']['records']} (" in text and "min_repeat_ms=" in text
    assert "Not measured yet" in text  # no noise report given: said so, not invented
    proc = run_tcl("dataset", "datasheet", "--stats", tmp_path / "missing.json", "--out", sheet, check=False)
    assert proc.returncode == 1 and "tcl dataset stats" in proc.stderr
