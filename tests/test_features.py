"""Featurizer: shape, mask, content, labels, version; FeatureSet round trip."""

import numpy as np
import pytest

from tcl.features import FEATURE_VERSION, Featurizer, FeatureSet, featurize_file, flatten_step, task_labels
from tcl.records.ingest import ingest

from .conftest import fixture_path


def test_flatten_step():
    assert flatten_step(["SP", 2, 0, 128, [2, 2, 2, 16], 1]) == ["SP", 2, 0, 128, 2, 2, 2, 16, 1]
    assert flatten_step(["FFSP", 3, 0, [1, [0, 5]], 1]) == ["FFSP", 3, 0, 1, 0, 5, 1]


def test_rows_encode_kind_numbers_and_strings():
    f = Featurizer(max_len=4)
    x, mask = f([[["SP", 2, 0, 128, [2, 16], 1], ["PR", 4, 0, "auto_unroll_max_step$16"]],
                 [["GetLoops", "b0"], ["Annotate", 32, "meta_schedule.parallel"]]])
    assert x.shape == (2, 4, f.n_features) and mask.tolist() == [[1, 1, 0, 0], [1, 0, 0, 0]]
    sp = x[0, 0]
    assert sp[f.kind_index["SP"]] == 1 and sp[: f.num_offset].sum() == 1
    np.testing.assert_allclose(sp[f.num_offset:f.num_offset + 6], np.log2(1 + np.array([2, 0, 128, 2, 16, 1])), rtol=1e-6)
    pr = x[0, 1]
    assert pr[f.string_index["auto_unroll_max_step"]] == 1
    assert pr[f.num_offset + 2] == pytest.approx(np.log2(17))  # the 16 after '$' is a number
    # GetLoops is a query with no decision: dropped, the Annotate becomes step 0
    ann = x[1, 0]
    assert ann[f.kind_index["Annotate"]] == 1 and ann[f.string_index["meta_schedule.parallel"]] == 1
    assert not x[~mask].any()  # padding is zero


def test_crop_to_max_len():
    f = Featurizer(max_len=3)
    x, mask = f([[["CA", 1, 2, 3]] * 10])
    assert mask.sum() == 3 and x.shape == (1, 3, f.n_features)


def test_labels_are_per_task_normalised_throughput():
    task = np.array([0, 0, 1, 1, 1])
    latency = np.array([2.0, 1.0, 4.0, 8.0, np.inf])
    y = task_labels(task, latency)
    np.testing.assert_allclose(y, [0.5, 1.0, 1.0, 0.5, 0.0])


def test_featurize_real_fixtures_and_round_trip(tmp_path):
    for name, src, platform in [("t4", fixture_path("ansor/tlcbench-t4-bert-early.json"), "t4"),
                                ("ms", fixture_path("metaschedule"), "znver4-avx512-t2")]:
        ingest(src, platform, tmp_path / f"{name}.parquet")
        fs = featurize_file(tmp_path / f"{name}.parquet", tmp_path / f"{name}.npz", max_len=40)
        assert fs.x.shape[1:] == (40, fs.meta["n_features"]) and fs.x.dtype == np.float32
        assert fs.meta["feature_version"] == FEATURE_VERSION and fs.meta["vocab_hash"]
        assert (fs.y > 0).all() and (fs.y <= 1).all()
        for t in range(len(fs.tasks)):  # the best program of every task has label 1
            assert fs.y[fs.task == t].max() == pytest.approx(1.0)
        back = FeatureSet.load(tmp_path / f"{name}.npz")
        assert np.array_equal(back.x, fs.x) and np.array_equal(back.mask, fs.mask)
        assert back.tasks == fs.tasks and back.meta == fs.meta and back.platform == platform


def test_feature_file_refuses_pickles(tmp_path):
    import pickle

    (tmp_path / "evil.npz").write_bytes(pickle.dumps({"x": 1}))
    with pytest.raises(ValueError, match="not a TCL feature file"):
        FeatureSet.load(tmp_path / "evil.npz")


def _rfactor_trace(loop: str) -> list:
    """A reduction split in two, rfactor-ed on the outer (l2) or inner (l3) loop of the split."""
    insts = [["GetSBlock", [], ["C", "main"], ["b0"]],
             ["GetLoops", ["b0"], [], ["l1"]],
             ["SamplePerfectTile", ["l1"], [2, 64], ["v4", "v5"]],
             ["Split", ["l1", "v4", "v5"], [1, 0], ["l2", "l3"]],
             ["RFactor", [loop], [1], ["b6"]]]
    return [insts, [[2, [16, 8]]]]


def test_rfactor_on_different_loops_gets_different_features():
    from tcl.records.metaschedule import trace_to_steps

    outer, inner = trace_to_steps(_rfactor_trace("l2")), trace_to_steps(_rfactor_trace("l3"))
    assert outer[-1] == ["RFactor", 0, 1] and inner[-1] == ["RFactor", 1, 1]  # tile level, factor axis
    x, _ = Featurizer(8)([outer, inner])
    assert not np.array_equal(x[0], x[1])


def test_no_two_different_traces_of_a_task_share_features_on_the_bundled_data():
    """Every program of one bundled platform: identical feature rows within a task only for identical traces."""
    import gzip
    from pathlib import Path

    import orjson

    from tcl.records import Record, check_latencies
    from tcl.records.metaschedule import read_database

    db = Path(__file__).resolve().parents[1] / "data" / "raw" / "x86-avx2-t2"
    if not db.exists():
        pytest.skip("bundled dataset not present")
    traces = []  # the independent view: every usable line's (workload, trace text), read by hand
    with gzip.open(db / "database_tuning_record.json.gz", "rb") as f:
        for line in f:
            workload, (trace, run_secs, _target, _args) = orjson.loads(line)
            if check_latencies(run_secs) is None:
                traces.append((workload, orjson.dumps(trace)))
    records = [r for r in read_database(db, "x86-avx2-t2") if isinstance(r, Record)]
    assert len(records) == len(traces) > 3000
    x, mask = Featurizer(48)([r.steps for r in records])
    seen: dict[tuple, bytes] = {}
    collisions = []
    for (workload, trace), row, m in zip(traces, x, mask):
        key = (workload, row.tobytes(), m.tobytes())
        if seen.setdefault(key, trace) != trace:
            collisions.append(workload)
    assert collisions == []


def test_per_network_weights_flow_from_tasks_json_to_the_top_k_score(tmp_path):
    """dense_256 occurs 3x in netA and 1x in netB, conv2d_small 2x in netB: netB's score weighs
    dense by 1 (not its total 4); computed by hand from the raw database files."""
    import json
    import shutil

    from tcl import metrics as M
    from tcl.features import featurize_table
    from tcl.records.ingest import read_records

    counts = {"dense_256": {"netA": 3, "netB": 1}, "conv2d_small": {"netB": 2}}
    latencies = {}  # task -> mean run_secs per record, in file order (the independent view)
    for name, weights in counts.items():
        db = tmp_path / "dbs" / name
        shutil.copytree(fixture_path(f"metaschedule/{name}"), db)
        shash = json.loads((db / "database_workload.json").read_text().splitlines()[0])[0]
        (db / "tasks.json").write_text(json.dumps({shash: {
            "name": name, "desc": name, "networks": sorted(weights), "weight": sum(weights.values()),
            "weights": weights}}))
        lines = (db / "database_tuning_record.json").read_text().splitlines()
        latencies[name] = [sum(r[1][1]) / len(r[1][1]) for r in map(json.loads, lines)]
    ingest(tmp_path / "dbs", "znver4-avx512-t2", tmp_path / "r.parquet")
    fs = featurize_table(read_records(tmp_path / "r.parquet"))
    fs.save(tmp_path / "f.npz")
    fs = FeatureSet.load(tmp_path / "f.npz")
    assert fs.task_network_weights[fs.tasks.index("dense_256")] == {"netA": 3.0, "netB": 1.0}

    scores = np.zeros(len(fs))  # all tied: the top-1 pick is each task's first record
    best = {t: min(v) for t, v in latencies.items()}
    first = {t: v[0] for t, v in latencies.items()}
    assert best["dense_256"] < first["dense_256"]  # the pick is not the best: weights matter
    net_b = (1 * best["dense_256"] + 2 * best["conv2d_small"]) / (1 * first["dense_256"] + 2 * first["conv2d_small"])
    res = M.evaluate(scores, fs)
    assert res["per_network"]["netB"]["top1"] == pytest.approx(net_b, rel=1e-9)
    assert res["per_network"]["netA"]["top1"] == pytest.approx(best["dense_256"] / first["dense_256"], rel=1e-9)
    assert res["task_top1"] == pytest.approx(np.mean([best[t] / first[t] for t in counts]), rel=1e-9)

    # a feature file written before per-network weights still loads: each network gets the total
    with np.load(tmp_path / "f.npz") as z:
        old = {k: z[k] for k in z.files if k != "task_network_weights"}
    np.savez(tmp_path / "old.npz", **old)
    back = FeatureSet.load(tmp_path / "old.npz")
    assert back.task_network_weights[back.tasks.index("dense_256")] == {"netA": 4.0, "netB": 4.0}
