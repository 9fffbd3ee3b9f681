"""MetaSchedule per-store features (tcl.perstore, tcl.perstore_extract) on the real fixture
databases, checked against MetaSchedule's own extractor called directly on TVM's own reading of
the same databases."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import fixture_path

pytest.importorskip("tvm")


@pytest.fixture(scope="module")
def fixture_data(tmp_path_factory):
    """Both fixture databases ingested and featurized as the pipeline does: (root, records, fs)."""
    from tcl.features import featurize_file
    from tcl.records.ingest import ingest

    root = fixture_path("metaschedule")
    tmp = tmp_path_factory.mktemp("perstore")
    records = tmp / "p.parquet"
    ingest(root, "znver4-avx512-t2", records)
    fs = featurize_file(records, tmp / "p.npz")
    return root, records, fs


@pytest.fixture(scope="module")
def extracted(fixture_data):
    from tcl.perstore_extract import extract_perstore

    root, records, fs = fixture_data
    ps, n_cached = extract_perstore(fs, records, root, workers=1)
    assert n_cached == 0
    return ps


def _direct_features(db_dir, extract_workload=True) -> dict[float, np.ndarray]:
    """PerStoreFeature of every record of a database read by TVM's JSONDatabase (which orders
    records by speed), keyed by the record's mean run time (unique in the fixtures)."""
    from tcl.perstore_extract import _init_worker

    _init_worker()
    import tvm
    from tvm.s_tir import meta_schedule as ms

    db = ms.database.JSONDatabase(str(db_dir / "database_workload.json"),
                                  str(db_dir / "database_tuning_record.json"), allow_missing=False)
    extractor = ms.feature_extractor.PerStoreFeature(extract_workload=extract_workload)
    out = {}
    for record in db.get_all_tuning_records():
        sch = tvm.s_tir.Schedule(record.workload.mod)
        record.trace.apply_to_schedule(sch, remove_postproc=False)
        ctx = ms.TuneContext(mod=record.workload.mod, target=record.target)
        secs = [float(s) for s in record.run_secs]
        features = extractor.extract_from(ctx, [ms.MeasureCandidate(sch, record.args_info)])[0].numpy()
        out[sum(secs) / len(secs)] = features.astype(np.float32)  # float64 there, stored as float32
    return out


def test_rows_equal_metaschedule_extractor_called_directly(fixture_data, extracted):
    root, _, fs = fixture_data
    direct = {}
    for db in root.rglob("database_tuning_record.json"):
        direct.update(_direct_features(db.parent))
    assert len(extracted) == len(direct) == len(fs) == 48
    assert extracted.stores.shape == (sum(len(f) for f in direct.values()), 172)
    for i, latency in enumerate(fs.latency):
        assert len(direct[latency]) == extracted.n_stores[i]
        np.testing.assert_array_equal(extracted.program(i), direct[latency])


def test_first_164_columns_are_metaschedules_default_extractor(fixture_data, extracted):
    root, _, _ = fixture_data
    _, _, fs = fixture_data
    direct = _direct_features(fixture_path("metaschedule/dense_256"), extract_workload=False)
    rows = [i for i, latency in enumerate(fs.latency) if latency in direct]
    assert len(rows) == 24
    for i in rows:
        assert direct[fs.latency[i]].shape[1] == 164
        np.testing.assert_array_equal(extracted.program(i)[:, :164], direct[fs.latency[i]])


def test_aligned_with_the_step_features(fixture_data, extracted):
    _, _, fs = fixture_data
    np.testing.assert_array_equal(extracted.program_id, fs.program_id)
    np.testing.assert_array_equal(extracted.y, fs.y)
    np.testing.assert_array_equal(extracted.task, fs.task)
    assert extracted.tasks == fs.tasks and extracted.platform == fs.platform


def test_features_do_not_depend_on_the_cpu_target():
    """The premise of the cross-platform cache: an SSE, AVX2 and AVX-512 target give equal rows."""
    from tcl.perstore_extract import _init_worker

    _init_worker()
    import tvm
    from tvm.s_tir import meta_schedule as ms

    db_dir = fixture_path("metaschedule/dense_256")
    db = ms.database.JSONDatabase(str(db_dir / "database_workload.json"),
                                  str(db_dir / "database_tuning_record.json"), allow_missing=False)
    extractor = ms.feature_extractor.PerStoreFeature(extract_workload=True)
    targets = [{"kind": "llvm", "num-cores": 1}, {"kind": "llvm", "mcpu": "haswell", "num-cores": 2},
               {"kind": "llvm", "mcpu": "znver4", "num-cores": 2}]
    for record in db.get_all_tuning_records()[:4]:
        rows = []
        for target in targets:
            sch = tvm.s_tir.Schedule(record.workload.mod)
            record.trace.apply_to_schedule(sch, remove_postproc=False)
            ctx = ms.TuneContext(mod=record.workload.mod, target=tvm.target.Target(target))
            rows.append(extractor.extract_from(ctx, [ms.MeasureCandidate(sch, record.args_info)])[0].numpy())
        assert all(np.array_equal(rows[0], r) for r in rows[1:])


def test_two_workers_and_the_cache_give_the_same_features(fixture_data, extracted, tmp_path):
    from tcl.perstore_extract import extract_perstore

    root, records, fs = fixture_data
    ps, n_cached = extract_perstore(fs, records, root, workers=2, cache_dir=tmp_path)
    assert n_cached == 0
    np.testing.assert_array_equal(ps.stores, extracted.stores)
    again, n_cached = extract_perstore(fs, records, root, workers=2, cache_dir=tmp_path)
    assert n_cached == len(fs)  # every program from the cache, no worker started
    np.testing.assert_array_equal(again.stores, extracted.stores)
    np.testing.assert_array_equal(again.offsets, extracted.offsets)
    assert again.meta == extracted.meta  # the output does not record the cache


def test_save_load_round_trip_and_feature_file_dispatch(extracted, fixture_data, tmp_path):
    from tcl.features import FeatureSet
    from tcl.perstore import PerStoreSet, load_feature_file, perstore_path

    _, _, fs = fixture_data
    path = perstore_path(tmp_path / "p.npz")
    assert path.name == "p.perstore.npz"
    extracted.save(path)
    back = load_feature_file(path)
    assert isinstance(back, PerStoreSet)
    np.testing.assert_array_equal(back.stores, extracted.stores)
    np.testing.assert_array_equal(back.offsets, extracted.offsets)
    assert back.meta == extracted.meta and back.task_networks == extracted.task_networks
    fs.save(tmp_path / "p.npz")
    assert isinstance(load_feature_file(tmp_path / "p.npz"), FeatureSet)


def test_load_refuses_offsets_that_do_not_fit(extracted, tmp_path):
    from tcl.features import FeatureFileError
    from tcl.perstore import PerStoreSet, load_feature_file

    bad = PerStoreSet(**{**extracted.__dict__, "offsets": extracted.offsets.copy()})
    bad.offsets[-1] += 1
    bad.save(tmp_path / "bad.perstore.npz")
    with pytest.raises(FeatureFileError, match="bad.perstore.npz: offsets"):
        load_feature_file(tmp_path / "bad.perstore.npz")
    (tmp_path / "records.perstore.npz").write_bytes(b"PAR1 not features")
    with pytest.raises(FeatureFileError, match="records.perstore.npz: a records Parquet file"):
        load_feature_file(tmp_path / "records.perstore.npz")


def test_padded_view_holds_each_programs_stores_then_zeros(extracted):
    """The (N, S, 172) view the per-store kinds read, built per batch: program i's rows, then zero
    rows up to the most stores of any program, mask True exactly on its rows."""
    x, mask = extracted.padded()
    most = int(extracted.n_stores.max())
    assert x.shape == (len(extracted), most, 172) and mask.shape == (len(extracted), most)
    index = np.array([5, 0, 47, 5])
    for block in (x[index], x[:][index], np.asarray(x)[index]):  # an index array, a slice, the whole
        assert block.dtype == np.float32
        for k, i in enumerate(index):
            n = len(extracted.program(i))
            np.testing.assert_array_equal(block[k, :n], extracted.program(i))
            assert not block[k, n:].any() and mask[i].sum() == n and mask[i, :n].all()


def test_subset_and_split_keep_each_programs_stores(extracted, fixture_data):
    from tcl.split import split_by_network

    _, _, fs = fixture_data
    index = np.array([47, 3, 30, 3])
    sub = extracted.subset(index)
    for k, i in enumerate(index):
        np.testing.assert_array_equal(sub.program(k), extracted.program(i))
    parts = split_by_network(extracted, [], valid_fraction=0.5, seed=0)
    step_parts = split_by_network(fs, [], valid_fraction=0.5, seed=0)
    assert sum(len(p) for p in parts.values()) == len(fs)
    for name, part in parts.items():
        np.testing.assert_array_equal(part.program_id, step_parts[name].program_id)
        np.testing.assert_array_equal(part.y, step_parts[name].y)


def test_a_record_missing_from_the_database_is_named(fixture_data, tmp_path):
    from tcl.perstore_extract import extract_perstore

    root, records, fs = fixture_data
    with pytest.raises(ValueError, match=r"row 0 .*has no record in .*dense_256"):
        extract_perstore(fs, records, root / "dense_256", workers=1)


def test_featurize_and_split_commands_write_the_perstore_files(fixture_data, tmp_path):
    from tests.conftest import run_tcl

    root, records, _ = fixture_data
    out = run_tcl("featurize", records, "--out", tmp_path / "f" / "p.npz", "--perstore-from", root,
                  "--workers", "1", "--json")
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["perstore"]["stores"] > summary["programs"] == 48
    assert summary["perstore"]["failed"] == 0
    run_tcl("split", tmp_path / "f" / "p.npz", "--out-dir", tmp_path / "s", "--valid-fraction", "0.5",
            "--test-networks", "")
    names = sorted(p.name for p in (tmp_path / "s").iterdir())
    assert names == ["test.npz", "test.perstore.npz", "train.npz", "train.perstore.npz",
                     "valid.npz", "valid.perstore.npz"]
    from tcl.features import FeatureSet
    from tcl.perstore import PerStoreSet

    for name in ("train", "valid"):
        step, per_store = FeatureSet.load(tmp_path / "s" / f"{name}.npz"), PerStoreSet.load(tmp_path / "s" / f"{name}.perstore.npz")
        assert len(step) > 0
        np.testing.assert_array_equal(per_store.program_id, step.program_id)
        np.testing.assert_array_equal(per_store.y, step.y)


def test_split_refuses_a_perstore_file_of_other_programs(fixture_data, extracted, tmp_path):
    from tests.conftest import run_tcl

    _, _, fs = fixture_data
    fs.save(tmp_path / "p.npz")
    extracted.subset(np.arange(1, len(extracted))).save(tmp_path / "p.perstore.npz")
    proc = run_tcl("split", tmp_path / "p.npz", "--out-dir", tmp_path / "s", "--test-networks", "", check=False)
    assert proc.returncode == 1
    assert "p.perstore.npz: its programs are not those of" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "s").exists()  # nothing written
