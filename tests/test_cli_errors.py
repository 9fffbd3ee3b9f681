"""Bad input names the problem, exits non-zero and leaves every earlier output as it was."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tcl.cli import main
from tcl.features import FeatureSet, featurize_file
from tcl.records.ingest import ingest

from .conftest import fixture_path
from .test_registry import kb, new_run  # noqa: F401 - kb is a fixture used below
from .test_training import make_fs

PLATFORM = "x86-sse-t2"


def tcl(*args):
    """The real CLI in this process (stdout and stderr together in .output)."""
    return CliRunner().invoke(main, [str(a) for a in args])


def snapshot(*paths: Path) -> dict:
    """Every file under `paths` with its bytes (what must survive a failed command)."""
    out = {}
    for p in paths:
        files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file())
        out.update({str(f): f.read_bytes() for f in files})
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Real records and features of a real MetaSchedule database, and bad files of each kind."""
    d = tmp_path_factory.mktemp("data")
    ingest(fixture_path("metaschedule/conv2d_small"), PLATFORM, d / "r.parquet")
    featurize_file(d / "r.parquet", d / "f.npz")
    make_fs().save(d / "nets.npz")  # tasks of networks net0, net1, net2
    FeatureSet.load(d / "f.npz").subset(np.array([], np.int64)).save(d / "zero.npz")
    (d / "garbage.npz").write_text("not an archive\n")
    (d / "empty.npz").write_bytes(b"")
    whole = (d / "f.npz").read_bytes()
    (d / "truncated.npz").write_bytes(whole[: len(whole) // 2])
    return d


BAD_FEATURES = [
    ("garbage.npz", "not a TCL feature file (.npz, a zip archive)"),
    ("empty.npz", "empty file, not a TCL feature file"),
    ("truncated.npz", "not a TCL feature file (BadZipFile"),
    ("r.parquet", "a records Parquet file, not features: run `tcl featurize"),
    ("missing.npz", "does not exist"),  # click's own check of the path
]


@pytest.mark.parametrize("name,message", BAD_FEATURES)
def test_split_refuses_a_bad_feature_file(data, tmp_path, name, message):
    out = tmp_path / "split"
    assert tcl("split", data / "nets.npz", "--out-dir", out, "--test-networks", "net0").exit_code == 0
    before = snapshot(out)
    res = tcl("split", data / name, "--out-dir", out)
    assert res.exit_code in (1, 2) and isinstance(res.exception, SystemExit)  # no traceback
    assert message in res.output and data.name in res.output
    assert snapshot(out) == before


def test_split_refuses_a_test_network_not_in_the_data(data, tmp_path):
    out = tmp_path / "split"
    assert tcl("split", data / "nets.npz", "--out-dir", out, "--test-networks", "net0").exit_code == 0
    before = snapshot(out)
    res = tcl("split", data / "nets.npz", "--out-dir", out, "--test-networks", "net1,resnet50")
    assert res.exit_code == 1
    assert "test network(s) resnet50 not in the data (networks: net0, net1, net2)" in res.output
    assert snapshot(out) == before
    # records without network information (a user's own database) say how to split them
    res = tcl("split", data / "f.npz", "--out-dir", tmp_path / "other")
    assert res.exit_code == 1 and "name no network: pass an empty --test-networks and a --test-fraction" in res.output
    assert not (tmp_path / "other").exists()
    res = tcl("split", data / "nets.npz", "--out-dir", tmp_path / "other", "--test-fraction", 1)
    assert res.exit_code == 1 and "test_fraction must be in [0, 1), not 1.0" in res.output


def test_split_holds_out_a_share_of_the_tasks_of_records_without_networks(tmp_path):
    """An Ansor log names no network: --test-fraction holds out whole tasks for test instead."""
    ingest(fixture_path("ansor/tlcbench-t4-bert-early.json"), "t4", tmp_path / "r.parquet")
    featurize_file(tmp_path / "r.parquet", tmp_path / "f.npz")
    whole = FeatureSet.load(tmp_path / "f.npz")
    assert len(whole.tasks) == 10 and not whole.networks()

    def split(out, *args):
        res = tcl("split", tmp_path / "f.npz", "--out-dir", tmp_path / out, "--test-networks", "", "--json", *args)
        assert res.exit_code == 0, res.output
        return {name: FeatureSet.load(tmp_path / out / f"{name}.npz") for name in ("train", "valid", "test")}

    parts = split("a", "--test-fraction", 0.3)
    assert len(parts["test"].tasks) == 3 and len(parts["valid"].tasks) == 1  # 10 % of the 7 left
    assert sum(len(p) for p in parts.values()) == len(whole)
    for a, b in (("train", "valid"), ("train", "test"), ("valid", "test")):
        assert not set(parts[a].tasks) & set(parts[b].tasks)
    assert parts["test"].meta["split"]["test_fraction"] == 0.3
    again = split("b", "--test-fraction", 0.3)
    assert again["test"].tasks == parts["test"].tasks  # the seed decides
    other = split("c", "--test-fraction", 0.3, "--seed", 1)
    assert other["test"].tasks != parts["test"].tasks
    without = split("d")  # as before the option: no test split, validation drawn as before
    assert len(without["test"]) == 0 and "test_fraction" not in without["test"].meta["split"]


@pytest.mark.parametrize("name,message", BAD_FEATURES[:4])
def test_predict_refuses_a_bad_feature_file(data, tmp_path, kb, name, message):  # noqa: F811
    scores = tmp_path / "scores.npy"
    scores.write_bytes(b"earlier scores")
    res = tcl("predict", data / name, "--model", kb[1], "--out", scores)
    assert res.exit_code == 1 and message in res.output and "Traceback" not in res.output
    assert scores.read_bytes() == b"earlier scores"


def test_programs_with_nonfinite_features_are_skipped_and_named(data, tmp_path, store, caplog):
    """One program with NaN and one with inf features: train and evaluate leave them out with a
    warning naming the file and rows (they used to stop training with a traceback), predict gives
    them no score and scores the rest."""
    fs = FeatureSet.load(data / "f.npz")
    fs.x[2, 0, 0], fs.x[5, 1, 3] = np.nan, np.inf
    bad = tmp_path / "bad.npz"
    fs.save(bad)
    res = tcl("train", "--model", "mlp", "--data", bad, "--out", tmp_path / "o", "--train-set", "epochs=1", "--json")
    assert res.exit_code == 0, res.output
    assert f"{bad}: skipped 2 of {len(fs)} programs whose features are not finite (NaN/inf; rows 2, 5" in caplog.text
    assert (tmp_path / "o" / "model.pt").is_file()
    res = tcl("evaluate", "--model", tmp_path / "o", "--data", bad, "--json")
    assert res.exit_code == 0 and json.loads(res.output.splitlines()[-1])["n_programs"] == len(fs) - 2
    assert tcl("export", tmp_path / "o", "--family", "x86-sse", "--out", tmp_path / "kb.onnx").exit_code == 0
    res = tcl("predict", bad, "--model", tmp_path / "kb.onnx", "--json")
    assert res.exit_code == 0, res.output
    assert f"{bad}: 2 of {len(fs)} programs have features that are not finite" in res.output
    scores = json.loads(res.output[res.output.index("{"):])["scores"]
    assert scores[2] is None and scores[5] is None and all(isinstance(s, float) for s in scores[6:])


def test_evaluate_refuses_a_missing_model(data, tmp_path, store):
    metrics = tmp_path / "metrics.json"
    metrics.write_text('{"top1": 0.5}\n')
    res = tcl("evaluate", "--model", tmp_path / "no-such-model", "--data", data / "f.npz", "--out", metrics)
    assert res.exit_code == 1
    assert f"cannot load model {tmp_path / 'no-such-model'}: no model file or training output at" in res.output
    res = tcl("evaluate", "--model", "models:/tcl-kb-nofamily@production", "--data", data / "f.npz",
              "--out", metrics)
    assert res.exit_code == 1 and "cannot load model models:/tcl-kb-nofamily@production" in res.output
    assert "tcl-kb-nofamily" in res.output.split("cannot load model", 1)[1].split(":", 2)[2]
    res = tcl("evaluate", "--model", tmp_path / "no-such-model", "--data", data / "r.parquet")
    assert res.exit_code == 1 and "run `tcl featurize" in res.output
    assert metrics.read_text() == '{"top1": 0.5}\n'


@pytest.mark.parametrize("name,message", [
    ("garbage.npz", "not a TCL feature file"),
    ("empty.npz", "empty file"),
    ("r.parquet", "run `tcl featurize"),
    ("zero.npz", "no programs to train on"),
])
def test_train_refuses_an_unreadable_or_empty_feature_file(data, tmp_path, store, name, message):
    out = tmp_path / "train-out"
    res = tcl("train", "--model", "mlp", "--data", data / name, "--out", out)
    assert res.exit_code == 1 and message in res.output and str(data / name) in res.output
    assert not out.exists()  # nothing half-written
    import mlflow

    assert mlflow.MlflowClient().search_experiments(filter_string="name = 'tcl-train'") == []


def test_train_refuses_an_unreadable_feature_file(data, tmp_path, store):
    locked = tmp_path / "locked.npz"
    shutil.copyfile(data / "f.npz", locked)
    locked.chmod(0)
    try:
        if _can_read(locked):
            pytest.skip("running as a user that reads any file")
        res = tcl("train", "--model", "mlp", "--data", locked, "--out", tmp_path / "o")
        assert res.exit_code == 1 and "cannot read the feature file (Permission denied)" in res.output
    finally:
        locked.chmod(0o600)


def _can_read(path: Path) -> bool:
    try:
        path.open("rb").close()
        return True
    except PermissionError:
        return False


# --- dataset pack ------------------------------------------------------------------------------


def _working_db(root: Path, platform: str, drop: int = 0) -> None:
    """A working MetaSchedule database (the real fixture) with collect.json and tasks.json."""
    src = fixture_path("metaschedule/conv2d_small")
    dst = root / platform
    dst.mkdir(parents=True)
    shutil.copyfile(src / "database_workload.json", dst / "database_workload.json")
    lines = (src / "database_tuning_record.json").read_text().splitlines(keepends=True)
    (dst / "database_tuning_record.json").write_text("".join(lines[drop:]))
    shash = json.loads((src / "database_workload.json").read_text().splitlines()[0])[0]
    (dst / "tasks.json").write_text(json.dumps({shash: {"name": "conv2d_small", "weight": 1}}))
    (dst / "collect.json").write_text(json.dumps({"platform": platform}))


def test_a_failing_pack_leaves_the_old_bundle_whole(tmp_path):
    from tcl.collect.pack import pack

    work, raw = tmp_path / "work", tmp_path / "raw"
    for p in ("p-a", "p-b"):
        _working_db(work, p)
    summary = pack(str(work), ["p-a", "p-b"], str(raw))
    assert summary["p-a"]["records"] > 4
    before = snapshot(raw)
    # new measurements on both platforms, but p-b's collect.json is gone: the pack fails after
    # p-a's new folder is written
    shutil.rmtree(work)
    for p in ("p-a", "p-b"):
        _working_db(work, p, drop=4)
    (work / "p-b" / "collect.json").unlink()
    params = tmp_path / "params.yaml"
    params.write_text(f"dataset: {{out: {work}}}\nplatforms: [p-a, p-b]\n")
    res = tcl("dataset", "pack", "--params", params, "--out", raw)
    assert res.exit_code == 1 and f"pack failed, {raw} left as it was" in res.output
    assert "collect.json" in res.output
    assert snapshot(raw) == before
    assert sorted(p.name for p in raw.iterdir()) == ["p-a", "p-b"]  # no staging folder left
    with gzip.open(raw / "p-a" / "database_tuning_record.json.gz") as f:
        assert len(f.read().splitlines()) == summary["p-a"]["records"]


def test_pack_refuses_missing_params(tmp_path):
    raw = tmp_path / "raw"
    (raw / "p-a").mkdir(parents=True)
    (raw / "p-a" / "collect.json").write_text("{}")
    res = tcl("dataset", "pack", "--params", tmp_path / "missing.yaml", "--out", raw)
    assert res.exit_code == 1
    assert f"cannot read params file {tmp_path / 'missing.yaml'}: No such file or directory" in res.output
    (tmp_path / "p.yaml").write_text("dataset: {}\n")
    res = tcl("dataset", "pack", "--params", tmp_path / "p.yaml", "--out", raw)
    assert res.exit_code == 1 and "pack needs `dataset.out` and `platforms`" in res.output
    assert snapshot(raw) == {str(raw / "p-a" / "collect.json"): b"{}"}


# --- ingest ------------------------------------------------------------------------------------


def test_a_failed_ingest_leaves_the_previous_rejects_with_their_parquet(tmp_path):
    src = tmp_path / "records.json"
    good = fixture_path("ansor/tlcbench-t4-bert-early.json").read_text().splitlines()
    src.write_text("\n".join(good[:5] + ["not json"]) + "\n")
    out = tmp_path / "t4.parquet"
    rejects = tmp_path / "t4.parquet.rejects.jsonl"
    res = tcl("ingest", src, "--platform", "t4", "--out", out)
    assert res.exit_code == 0 and rejects.read_text().count("\n") == 1
    before = snapshot(out, rejects)

    src.write_text("not json\nnor this\n")  # nothing valid: the ingest fails
    res = tcl("ingest", src, "--platform", "t4", "--out", out)
    assert res.exit_code == 1 and "no valid records remain" in res.output and f"{out} left as it was" in res.output
    assert snapshot(out, rejects) == before
    failed = tmp_path / "t4.parquet.failed-rejects.jsonl"
    assert [json.loads(line)["line"] for line in failed.read_text().splitlines()] == [1, 2]


# --- register ----------------------------------------------------------------------------------


def _register(kb, run_id):  # noqa: F811
    from tcl import registry

    return registry.register_kb(kb[0], "testfam", ["p-a"], run_id, {"top1": 0.5, "top5": 0.6}, "E1", "D1",
                                onnx_path=kb[1])


def test_register_leaves_no_version_without_its_alias(store, kb, monkeypatch):  # noqa: F811
    import mlflow

    client = mlflow.MlflowClient()
    run_id = new_run()

    def fail(*args, **kwargs):
        raise RuntimeError("store went away")

    with monkeypatch.context() as m:
        m.setattr(mlflow.MlflowClient, "set_registered_model_alias", fail)
        with pytest.raises(RuntimeError, match="store went away"):
            _register(kb, run_id)
    assert client.search_model_versions("name='tcl-kb-testfam'") == []
    assert _register(kb, run_id) == 2  # version 1 was removed, numbers are not reused
    assert int(client.get_model_version_by_alias("tcl-kb-testfam", "candidate").version) == 2


def test_a_rerun_repairs_a_version_a_killed_register_left_without_alias(store, kb):  # noqa: F811
    import mlflow

    client = mlflow.MlflowClient()
    run_id = new_run()
    assert _register(kb, run_id) == 1
    client.delete_registered_model_alias("tcl-kb-testfam", "candidate")  # as if killed before the alias
    assert _register(kb, run_id) == 1
    assert int(client.get_model_version_by_alias("tcl-kb-testfam", "candidate").version) == 1


def test_dataset_collect_names_what_its_params_lack(tmp_path):
    params = tmp_path / "p.yaml"
    params.write_text("dataset: {out: w}\n")
    res = tcl("dataset", "collect", "--params", params)
    assert res.exit_code == 1 and "collect needs `platforms` and `dataset.tasks`" in res.output
    params.write_text("dataset: {tasks: [no_such_task], programs_per_task: 1, out: w}\nplatforms: [x86-sse-t1]\n")
    res = tcl("dataset", "collect", "--params", params)
    assert res.exit_code == 1 and "unknown task(s) no_such_task in dataset.tasks" in res.output
    params.write_text(f"dataset: {{tasks: [], programs_per_task: 1, out: {tmp_path / 'w'}}}\n"
                      "platforms: [no-such-platform]\n")
    res = tcl("dataset", "collect", "--params", params)
    assert res.exit_code == 1 and "unknown platform 'no-such-platform'" in res.output
    assert not (tmp_path / "w").exists()
