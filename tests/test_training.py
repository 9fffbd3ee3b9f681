"""The training loop, XGBoost baseline, MLflow tracking and the train/evaluate commands."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from tcl.features import FeatureSet

L, F = 8, 6


def make_fs(n_tasks=12, per_task=24, seed=0, platform="synthetic", networks=None) -> FeatureSet:
    """Programs whose throughput is a fixed function of their (masked) step features plus noise."""
    rng = np.random.default_rng(seed)
    n = n_tasks * per_task
    x = rng.standard_normal((n, L, F)).astype(np.float32)
    lengths = rng.integers(3, L + 1, size=n)
    mask = np.arange(L)[None, :] < lengths[:, None]
    x *= mask[..., None]
    w = np.linspace(-1.0, 1.0, F)
    task = np.repeat(np.arange(n_tasks), per_task).astype(np.int32)
    log_tp = (x @ w).sum(axis=1) / 3.0 + 0.05 * rng.standard_normal(n)
    latency = np.exp(-log_tp)
    best = np.array([latency[task == t].min() for t in range(n_tasks)])
    y = (best[task] / latency).astype(np.float32)
    networks = networks or [[f"net{t % 3}"] for t in range(n_tasks)]
    return FeatureSet(
        x=x, mask=mask, y=y, latency=latency, task=task,
        program_id=np.array([f"p{seed}-{i}" for i in range(n)]),
        tasks=[f"task{t}" for t in range(n_tasks)], task_desc=[f"op{t}" for t in range(n_tasks)],
        task_weight=np.ones(n_tasks), task_networks=networks, platform=platform,
        meta={"feature_version": "test-1", "max_len": L, "n_features": F},
    )


def fit(kind, train, valid, config, params, out, **kwargs):
    """A fresh model of `kind` (initialised from params' seed) trained by train_model."""
    from tcl.models import new_model
    from tcl.training import as_list, feature_meta, seed_everything, train_model

    seed_everything(int(params["seed"]))
    model = new_model(kind, F, config, feature_meta(as_list(train)))
    return train_model(model, train, valid, params, out, **kwargs)


TRAIN = {"seed": 3, "loss": "lambdarank", "lr": 3e-3, "warmup_epochs": 1, "schedule": "cosine",
         "batch_size": 64, "epochs": 3, "patience": 5, "threads": 1}
MLP = {"hidden": 32, "n_layers": 2}


def _strip_timing(history):
    timing = ("epoch_seconds", "train_samples_per_s")
    return [{k: v for k, v in h.items() if k not in timing} for h in history]


@pytest.mark.parametrize("kind,config", [("mlp", MLP),
                                         ("mamba", {"d_model": 8, "n_layers": 1, "d_state": 4, "expand": 1, "d_conv": 2})])
def test_resume_after_interruption_equals_uninterrupted(tmp_path, kind, config):
    from tcl.training import STATE_FILE

    train, valid = make_fs(seed=0), make_fs(seed=1, n_tasks=6)
    model_a, hist_a = fit(kind, train, valid, config, TRAIN, tmp_path / "a")

    class Interrupt(Exception):
        pass

    def crash_after_epoch_1(epoch, metrics):
        if epoch == 1:
            raise Interrupt

    with pytest.raises(Interrupt):
        fit(kind, train, valid, config, TRAIN, tmp_path / "b", run=crash_after_epoch_1)
    assert (tmp_path / "b" / STATE_FILE).exists()
    seen = []
    model_b, hist_b = fit(kind, train, valid, config, TRAIN, tmp_path / "b",
                                  run=lambda e, m: seen.append(e))
    assert seen == [2]  # only the epoch that had not finished ran again
    assert _strip_timing(hist_a) == _strip_timing(hist_b)
    sa, sb = model_a.net.state_dict(), model_b.net.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert np.array_equal(sa[k].numpy(), sb[k].numpy()), k


def test_training_learns_and_checkpoint_loads(tmp_path):
    from tcl import metrics as M
    from tcl.models import load_model

    train, valid = make_fs(seed=0, n_tasks=20), make_fs(seed=1, n_tasks=8)
    params = {**TRAIN, "epochs": 6}
    model, history = fit("mlp", train, valid, MLP, params, tmp_path)
    assert history[-1]["valid_pairwise"] > 0.8  # the synthetic ranking is learnable
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    loaded = load_model(tmp_path)
    assert loaded.kind == "mlp"
    np.testing.assert_allclose(loaded.predict_features(valid), model.predict_features(valid), rtol=1e-6)
    best = max(h["valid_top1"] for h in history)
    assert M.evaluate(loaded.predict_features(valid), valid)["top1"] == pytest.approx(best)


def test_early_stopping_on_validation_top1(tmp_path):

    # lr 0: the model never changes, so validation top-1 never improves after the first epoch
    params = {**TRAIN, "lr": 0.0, "epochs": 10, "patience": 2}
    _, history = fit("mlp", make_fs(seed=0), make_fs(seed=1, n_tasks=4), MLP, params, tmp_path)
    assert [h["epoch"] for h in history] == [0, 1, 2]
    assert all(h["best_epoch"] == 0 for h in history)


def test_batches_never_mix_platforms_and_cover_each_row_once():
    from tcl.training import epoch_batches

    a, b = make_fs(seed=0, n_tasks=5, platform="p1"), make_fs(seed=1, n_tasks=3, platform="p2")
    for by_task in (True, False):
        batches = epoch_batches([a, b], 32, np.random.default_rng(0), by_task=by_task)
        for si, fs in enumerate((a, b)):
            rows = np.concatenate([idx for s, idx in batches if s == si])
            assert np.array_equal(np.sort(rows), np.arange(len(fs)))
        assert {s for s, _ in batches} == {0, 1}
    # by task: a batch of 32 from tasks of 24 programs spans at most 3 tasks (kept contiguous)
    batches = epoch_batches([a], 32, np.random.default_rng(0), by_task=True)
    assert max(len(np.unique(a.task[idx])) for _, idx in batches) <= 3


def test_min_steps_per_epoch_passes_a_small_set_again_each_pass_covering_every_row(tmp_path):
    from tcl.training import epoch_batches, epoch_plan, lr_at

    fs = make_fs(seed=0, n_tasks=5)                           # 120 programs: 2 batches of 64
    one = epoch_batches([fs], 64, np.random.default_rng(7), by_task=True)
    plan = epoch_plan([fs], 64, np.random.default_rng(7), True, min_steps=5)
    assert len(one) == 2 and len(plan) == 6                   # 3 passes of 2 batches
    assert all(np.array_equal(a[1], b[1]) for a, b in zip(one, plan))  # the first pass is the plain epoch's
    for p in range(3):
        assert np.array_equal(np.sort(np.concatenate([i for _, i in plan[2 * p:2 * p + 2]])), np.arange(len(fs)))
    assert not np.array_equal(plan[0][1], plan[2][1])         # each pass reshuffled
    assert len(epoch_plan([fs], 64, np.random.default_rng(7), True, min_steps=2)) == 2  # enough already

    # in training: each epoch takes the steps, the lr schedule counts them, and 0 is the plain loop
    _, h0 = fit("mlp", fs, None, MLP, {**TRAIN, "epochs": 2}, tmp_path / "plain")
    _, h5 = fit("mlp", fs, None, MLP, {**TRAIN, "epochs": 2, "min_steps_per_epoch": 5}, tmp_path / "steps")
    _, hz = fit("mlp", fs, None, MLP, {**TRAIN, "epochs": 2, "min_steps_per_epoch": 0}, tmp_path / "zero")
    assert _strip_timing(hz) == _strip_timing(h0)
    assert h5[0]["train_loss"] != h0[0]["train_loss"]
    p = {**TRAIN, "epochs": 2}
    assert h5[-1]["lr"] == pytest.approx(lr_at(2 * 6 - 1, 6, p))   # the schedule runs over 6 steps an epoch
    assert h0[-1]["lr"] == pytest.approx(lr_at(2 * 2 - 1, 2, p))


def test_non_finite_features_are_refused(tmp_path):

    fs = make_fs(seed=0)
    fs.x[5, 0, 2] = np.nan
    with pytest.raises(ValueError, match=r"1 of 288 programs .* columns \[2\]"):
        fit("mlp", fs, None, MLP, TRAIN, tmp_path)


def test_training_on_two_platforms_reports_each(tmp_path):

    train = [make_fs(seed=0, platform="p1"), make_fs(seed=2, n_tasks=8, platform="p2")]
    valid = [make_fs(seed=1, n_tasks=4, platform="p1"), make_fs(seed=3, n_tasks=4, platform="p2")]
    _, history = fit("mlp", train, valid, MLP, {**TRAIN, "epochs": 1}, tmp_path)
    h = history[0]
    assert h["valid_top1"] == pytest.approx((h["valid_p1_top1"] + h["valid_p2_top1"]) / 2)
    assert h["train_samples_per_s"] > 0


def test_lr_schedule():
    from tcl.training import lr_at

    p = {"lr": 1.0, "warmup_epochs": 1, "schedule": "cosine", "epochs": 3, "step_epochs": 5}
    assert lr_at(0, 10, p) == pytest.approx(0.1)   # warm-up: (0+1)/10
    assert lr_at(9, 10, p) == pytest.approx(1.0)   # end of warm-up
    assert lr_at(20, 10, p) == pytest.approx(0.5)  # half way through the cosine (10 of 20 steps)
    assert lr_at(29, 10, p) < 0.01
    s = {**p, "schedule": "step", "warmup_epochs": 0, "epochs": 12}
    assert [lr_at(e * 10, 10, s) for e in (0, 4, 5, 10)] == pytest.approx([1.0, 1.0, 0.1, 0.01])


def test_xgb_save_load_round_trip(tmp_path):
    from tcl.models import load_model
    from tcl.models.xgb import XGBModel

    train, valid = make_fs(seed=0), make_fs(seed=1, n_tasks=6)
    model, history = fit("xgb", train, valid, {"n_estimators": 20, "max_depth": 4, "eta": 0.3},
                         TRAIN, tmp_path)
    path = tmp_path / "model.json"
    doc = json.loads(path.read_text())  # XGBoost's JSON format, no pickle
    assert "learner" in doc
    loaded = XGBModel.load(path)
    assert loaded.config["max_depth"] == 4 and loaded.feature_meta["feature_version"] == "test-1"
    np.testing.assert_array_equal(loaded.predict_features(valid), model.predict_features(valid))
    again = load_model(tmp_path)
    assert again.kind == "xgb"
    assert history[-1]["valid_pairwise"] > 0.7
    np.testing.assert_array_equal(again.predict_features(valid), model.predict_features(valid))


def test_cli_train_logs_mlflow_run_and_evaluate_json(tmp_path, monkeypatch):
    import yaml
    from click.testing import CliRunner

    from tcl.cli import main

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    train_path, valid_path = tmp_path / "train.npz", tmp_path / "valid.npz"
    make_fs(seed=0).save(train_path)
    make_fs(seed=1, n_tasks=6).save(valid_path)
    params_path = tmp_path / "params.yaml"
    params_path.write_text(yaml.safe_dump({"models": {"mlp": MLP}, "train": {**TRAIN, "epochs": 2}}))
    out = tmp_path / "out"
    runner = CliRunner()
    res = runner.invoke(main, ["train", "--model", "mlp", "--data", str(train_path), "--valid", str(valid_path),
                               "--params", str(params_path), "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output.strip().splitlines()[-1])

    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    run = client.get_run(summary["run_id"])
    assert run.data.params["model"] == "mlp"
    assert run.data.params["train.lr"] == str(TRAIN["lr"]) and run.data.params["model.hidden"] == "32"
    tags = run.data.tags
    assert tags["data_hash"] == hashlib.md5(train_path.read_bytes()).hexdigest()
    assert tags["platform"] == "synthetic" and tags["feature_version"] == "test-1"
    assert tags["seed"] == str(TRAIN["seed"]) and tags["git_commit"]
    per_epoch = client.get_metric_history(run.info.run_id, "valid_top1")
    assert sorted(m.step for m in per_epoch) == [0, 1]
    assert run.data.metrics["best_valid_top1"] == pytest.approx(max(m.value for m in per_epoch))
    assert {"train_loss", "best_epoch", "best_valid_pairwise"} <= set(run.data.metrics)
    artifacts = [f.path for f in client.list_artifacts(run.info.run_id, "checkpoint")]
    assert "checkpoint/model.pt" in artifacts

    # the same command again resumes the finished job into the same MLflow run; another job is refused
    args = ["train", "--model", "mlp", "--data", str(train_path), "--valid", str(valid_path),
            "--params", str(params_path), "--out", str(out), "--json"]
    again = runner.invoke(main, args)
    assert again.exit_code == 0, again.output
    assert json.loads(again.output.strip().splitlines()[-1])["run_id"] == summary["run_id"]
    other = runner.invoke(main, args + ["--train-set", "epochs=3"])
    assert other.exit_code != 0 and "different training job" in other.output

    for ref in (str(out), f"runs:/{run.info.run_id}/checkpoint/model.pt"):
        res = runner.invoke(main, ["evaluate", "--model", ref, "--data", str(valid_path), "--json"])
        assert res.exit_code == 0, res.output
        metrics = json.loads(res.output.strip().splitlines()[-1])
        assert {"top1", "top5", "pairwise"} <= set(metrics)
        assert metrics["top1"] == pytest.approx(summary["best_valid_top1"])


def _train_cli(tmp_path, monkeypatch, kind, params, extra=()):
    import yaml
    from click.testing import CliRunner

    from tcl.cli import main

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    make_fs(seed=0).save(tmp_path / "train.npz")
    make_fs(seed=1, n_tasks=6).save(tmp_path / "valid.npz")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    res = CliRunner().invoke(main, ["train", "--model", kind, "--data", str(tmp_path / "train.npz"),
                                    "--valid", str(tmp_path / "valid.npz"), "--params", str(tmp_path / "params.yaml"),
                                    "--out", str(tmp_path / "out"), "--json", *extra])
    assert res.exit_code == 0, res.output
    return json.loads(res.output.strip().splitlines()[-1])


def test_cli_train_xgb_logs_rounds_and_json_model(tmp_path, monkeypatch):
    import mlflow

    params = {"models": {"xgb": {"n_estimators": 8, "max_depth": 3, "eta": 0.3}}, "train": TRAIN}
    summary = _train_cli(tmp_path, monkeypatch, "xgb", params)
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    run = client.get_run(summary["run_id"])
    assert run.data.params["model.max_depth"] == "3" and run.data.tags["model_kind"] == "xgb"
    rounds = client.get_metric_history(run.info.run_id, "valid_ndcg_at5")
    assert sorted(m.step for m in rounds) == list(range(8))
    assert "checkpoint/model.json" in [f.path for f in client.list_artifacts(run.info.run_id, "checkpoint")]
    assert 0 < summary["best_valid_top1"] <= 1


def test_evaluate_resolves_registered_model_uri(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from tcl import registry
    from tcl.cli import main

    params = {"models": {"mlp": MLP}, "train": {**TRAIN, "epochs": 1}}
    summary = _train_cli(tmp_path, monkeypatch, "mlp", params)
    registry.register_kb(summary["checkpoint"], "testfam", ["synthetic"], summary["run_id"],
                         {"top1": summary["best_valid_top1"], "top5": summary["best_valid_top5"]},
                         eval_data_hash="e", data_hash="d")
    res = CliRunner().invoke(main, ["evaluate", "--model", "models:/tcl-kb-testfam@candidate",
                                    "--data", str(tmp_path / "valid.npz"), "--json"])
    assert res.exit_code == 0, res.output
    metrics = json.loads(res.output.strip().splitlines()[-1])
    assert metrics["kind"] == "mlp" and metrics["top1"] == pytest.approx(summary["best_valid_top1"])


def test_bench_train_times_each_model():
    from tcl.bench.train import bench_train, format_table

    rows = bench_train(["mlp", "xgb"], n_samples=128, n_features=F,
                       params={"models": {"mlp": MLP, "xgb": {"n_estimators": 4, "max_depth": 3}},
                               "featurize": {"max_len": L}})
    assert [r["model"] for r in rows] == ["mlp", "xgb"]
    assert all(r["samples_per_s"] > 0 and r["n_samples"] == 128 for r in rows)
    assert "mlp" in format_table(rows)
    # several scans: a Mamba row each, the first the baseline; the other models once
    rows = bench_train(["mamba-kb", "mlp"], n_samples=64, n_features=F, scan=("fast", "fused"),
                       params={"models": {"mamba": {"kb": {"d_model": 8, "n_layers": 1, "d_state": 2, "expand": 1,
                                                           "d_conv": 4}}, "mlp": MLP},
                               "featurize": {"max_len": L}, "train": {"batch_size": 32}})
    assert [(r["model"], r["scan"]) for r in rows] == [("mamba-kb", "fast"), ("mamba-kb", "fused"), ("mlp", None)]
    assert rows[0]["speedup"] == 1.0 and rows[1]["speedup"] > 0 and rows[2]["speedup"] is None
    assert "vs first scan" in format_table(rows)


def test_cli_train_presets_file_supplies_the_mamba_config(tmp_path, monkeypatch):
    """`--presets FILE --preset NAME` takes the model config from FILE's models.mamba (a study's
    own variants) while `train:` still comes from --params; an unknown preset is a clear error."""
    import yaml
    from click.testing import CliRunner

    from tcl.cli import main
    from tcl.models import load_model

    tiny = {"d_model": 8, "n_layers": 1, "d_state": 2, "expand": 1, "d_conv": 2}
    presets = tmp_path / "study.yaml"
    presets.write_text(yaml.safe_dump({"models": {"mamba": {"tiny": tiny}}}))
    params = {"train": {**TRAIN, "epochs": 1}}
    _train_cli(tmp_path, monkeypatch, "mamba", params, ["--presets", str(presets), "--preset", "tiny"])
    model = load_model(tmp_path / "out")
    assert model.config["d_model"] == 8 and model.config["d_conv"] == 2
    res = CliRunner().invoke(main, ["train", "--model", "mamba", "--presets", str(presets), "--preset", "nope",
                                    "--data", str(tmp_path / "train.npz"), "--out", str(tmp_path / "o2")])
    assert res.exit_code != 0 and "nope" in res.output


def test_cli_train_init_starts_from_a_saved_model(tmp_path, monkeypatch):
    """`tcl train --init DIR` warm-starts from DIR's model: with lr 0 nothing moves, so the new
    run keeps exactly the given model; a model of another kind is refused by name."""
    from click.testing import CliRunner

    from tcl.cli import main
    from tcl.models import load_model

    first = _train_cli(tmp_path, monkeypatch, "mlp", {"models": {"mlp": MLP}, "train": {**TRAIN, "epochs": 1}})
    args = ["train", "--data", str(tmp_path / "train.npz"), "--valid", str(tmp_path / "valid.npz"),
            "--params", str(tmp_path / "params.yaml"), "--init", str(tmp_path / "out"), "--json"]
    res = CliRunner().invoke(main, args + ["--model", "mlp", "--out", str(tmp_path / "warm"),
                                           "--train-set", "lr=0"])
    assert res.exit_code == 0, res.output
    warm = json.loads(res.output.strip().splitlines()[-1])
    assert warm["best_valid_top1"] == pytest.approx(first["best_valid_top1"])
    valid = FeatureSet.load(tmp_path / "valid.npz")
    np.testing.assert_array_equal(load_model(tmp_path / "warm").predict_features(valid),
                                  load_model(tmp_path / "out").predict_features(valid))
    res = CliRunner().invoke(main, args + ["--model", "tlp", "--out", str(tmp_path / "other")])
    assert res.exit_code != 0 and "is a mlp model, not tlp" in res.output
