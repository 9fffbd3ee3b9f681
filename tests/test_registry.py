"""Registry: tags, candidate alias, idempotent registration, promotion gating and races.

Real SQLite MLflow stores (one fresh copy per test), real checkpoints and ONNX exports of real
models, real processes for the concurrency tests.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tcl import registry, tracking

F, L = 14, 16
CONFIG = {"d_model": 16, "n_layers": 1, "d_state": 4, "expand": 1, "d_conv": 4}
FEATURE_META = {"feature_version": "test-fv1", "max_len": L, "n_features": F,
                "vocab": {"kinds": ["SP", "RE", "AN"], "strings": ["global", "local"]}}
REPO = Path(__file__).resolve().parents[1]


def make_checkpoint(path: Path, seed: int, feature_meta: dict | None = None) -> Path:
    import torch

    from tcl.models.checkpoint import save_checkpoint
    from tcl.models.nets import build_net

    torch.manual_seed(seed)
    model = build_net("mamba", F, **CONFIG)
    save_checkpoint(path, model, "mamba", CONFIG, dict(feature_meta or FEATURE_META))
    return path




@pytest.fixture(scope="module")
def kb(tmp_path_factory):
    """A KB checkpoint and its ONNX export, built once for the module."""
    from tcl.export import export_onnx

    d = tmp_path_factory.mktemp("kb")
    ckpt = make_checkpoint(d / "kb.pt", seed=0)
    onnx_path = export_onnx(ckpt, d / "kb.onnx", "testfam")
    return ckpt, onnx_path


def new_run(name="train") -> str:
    with tracking.start_run("tcl-test", run_name=name) as run:
        return run.info.run_id


def reg(kb, top1, eval_hash="E1", run_id=None, family="testfam", platforms=("p-a", "p-b")):
    ckpt, onnx_path = kb
    return registry.register_kb(ckpt, family, list(platforms), run_id or new_run(),
                                {"top1": top1, "top5": min(1.0, top1 + 0.1)}, eval_hash,
                                "D1", onnx_path=onnx_path)


def test_register_tags_alias_and_artifacts(store, kb, tmp_path):
    import mlflow

    run_id = new_run()
    v = registry.register_kb(kb[0], "testfam", ["z-platform", "a-platform"], run_id,
                             {"top1": 0.875, "top5": 0.95, "pairwise": 0.7}, "EVALHASH", "DATAHASH",
                             onnx_path=kb[1])
    assert v == 1
    info = registry.show("testfam", "candidate")
    assert info["version"] == 1 and "candidate" in info["aliases"]
    tags = info["tags"]
    assert tags["family"] == "testfam"
    assert tags["platforms"] == "z-platform,a-platform"  # order kept
    assert tags["run_id"] == run_id and info["run_id"] == run_id
    assert float(tags["top1"]) == 0.875 and float(tags["top5"]) == 0.95
    assert tags["eval_data_hash"] == "EVALHASH" and tags["data_hash"] == "DATAHASH"
    assert tags["feature_version"] == "test-fv1"
    assert tags["git_commit"]  # a sha (maybe +dirty) or "unknown" outside git
    # the CPU the training run ran on (its run tag), which bit-exact reproduction needs
    from tcl.hardware import local_cpu_model
    assert tags["host_cpu"] == local_cpu_model() == mlflow.MlflowClient().get_run(run_id).data.tags["host_cpu"]
    assert tags["checkpoint_sha256"] == registry.file_sha256(kb[0])
    for key in registry.VERSION_TAGS:
        assert key in tags, key
    # the version's files: the ONNX model and the checkpoint it came from
    local = Path(mlflow.artifacts.download_artifacts(artifact_uri="models:/tcl-kb-testfam/1",
                                                     dst_path=str(tmp_path / "dl")))
    files = {p.name for p in local.rglob("*") if p.is_file()}
    assert "model.onnx" in files and "checkpoint.pt" in files
    assert registry.file_sha256(next(local.rglob("checkpoint.pt"))) == tags["checkpoint_sha256"]
    # the logged model is linked to the training run and lives in the run's experiment
    client = mlflow.MlflowClient()
    mv = client.get_model_version("tcl-kb-testfam", "1")
    assert mv.run_id == run_id
    logged = client.get_logged_model(mv.source.rsplit("/", 1)[-1])
    assert logged.source_run_id == run_id
    assert logged.experiment_id == client.get_run(run_id).info.experiment_id
    assert str(logged.status) in ("READY", "LoggedModelStatus.READY")


def test_reregister_is_idempotent(store, kb):
    import mlflow

    client = mlflow.MlflowClient()
    run_id = new_run()
    v1 = reg(kb, 0.8, run_id=run_id)
    runs_before = len(client.search_runs([e.experiment_id for e in client.search_experiments()]))
    models_before = len(client.search_logged_models(
        experiment_ids=[e.experiment_id for e in client.search_experiments()]))
    assert reg(kb, 0.8, run_id=run_id) == v1
    assert len(registry.list_models("testfam")) == 1
    assert len(client.search_runs([e.experiment_id for e in client.search_experiments()])) \
        == runs_before
    assert len(client.search_logged_models(
        experiment_ids=[e.experiment_id for e in client.search_experiments()])) == models_before
    # without a run id: the checkpoint sha alone identifies it; no run is created either
    assert registry.register_kb(kb[0], "testfam", ["p-a"], None, {"top1": 0.8, "top5": 0.9},
                                "E1", "D1", onnx_path=kb[1]) == v1
    assert len(client.search_runs([e.experiment_id for e in client.search_experiments()])) \
        == runs_before
    # a different training run of the same bytes is a new version
    assert reg(kb, 0.8) == v1 + 1


def test_new_export_of_a_registered_checkpoint_is_a_new_version(store, kb, tmp_path):
    """Same checkpoint, same run, another ONNX file (a newer exporter): a new version holding
    that file; registering the same pair again is still a no-op."""
    import onnx

    run_id = new_run()
    v1 = reg(kb, 0.8, run_id=run_id)
    proto = onnx.load(str(kb[1]))
    proto.doc_string = "re-exported"
    other = tmp_path / "kb2.onnx"
    onnx.save(proto, str(other))
    v2 = reg((kb[0], other), 0.8, run_id=run_id)
    assert v2 == v1 + 1
    assert registry.show("testfam", v2)["tags"]["onnx_sha256"] != registry.show("testfam", v1)["tags"]["onnx_sha256"]
    assert reg((kb[0], other), 0.8, run_id=run_id) == v2


def test_register_rejects_onnx_of_other_checkpoint_or_family(store, kb, tmp_path):
    other = make_checkpoint(tmp_path / "other.pt", seed=1)
    with pytest.raises(registry.TclRegistryError, match="different checkpoint"):
        registry.register_kb(other, "testfam", ["p"], new_run(), {"top1": 0.5, "top5": 0.6},
                             "E", "D", onnx_path=kb[1])
    with pytest.raises(registry.TclRegistryError, match="exported for family"):
        registry.register_kb(kb[0], "otherfam", ["p"], new_run(), {"top1": 0.5, "top5": 0.6},
                             "E", "D", onnx_path=kb[1])
    with pytest.raises(registry.TclRegistryError, match="top1"):
        registry.register_kb(kb[0], "testfam", ["p"], new_run(), {"top5": 0.6}, "E", "D",
                             onnx_path=kb[1])
    assert registry.list_models() == []


def test_promotion_gating(store, kb):
    v1 = reg(kb, 0.80)
    v2 = reg(kb, 0.70)                    # worse on the same eval data
    v3 = reg(kb, 0.60, eval_hash="E2")    # evaluated on other data: not comparable
    r = registry.promote("testfam", v1)
    assert r["status"] == "promoted" and r["previous"] is None
    with pytest.raises(registry.PromotionRefused, match=r"top1=0\.7000.*below.*0\.8000"):
        registry.promote("testfam", v2)
    assert registry.show("testfam", "production")["version"] == v1
    r = registry.promote("testfam", v2, force=True)
    assert r["status"] == "promoted" and r["previous"] == v1 and r["forced"]
    assert registry.show("testfam", "production")["version"] == v2
    r = registry.promote("testfam", v3)
    assert r["status"] == "promoted" and r["comparable"] is False
    assert registry.promote("testfam", v3)["status"] == "unchanged"
    # a better version on the same data goes through; versions can be named by alias
    v4 = reg(kb, 0.65, eval_hash="E2")
    r = registry.promote("testfam", "candidate")
    assert r["version"] == v4 and r["previous"] == v3 and r["comparable"] is True
    # other aliases are gated against their own holder
    assert registry.promote("testfam", v2, alias="staging")["status"] == "promoted"
    prod = registry.show("testfam", "production")
    assert prod["version"] == v4 and set(prod["aliases"]) >= {"production", "candidate"}


def test_unknown_family_and_version(store, kb):
    reg(kb, 0.5)
    with pytest.raises(registry.TclRegistryError, match="unknown family 'nofam'"):
        registry.promote("nofam", 1)
    with pytest.raises(registry.TclRegistryError, match="has no version '7'.*versions: 1"):
        registry.promote("testfam", 7)
    with pytest.raises(registry.TclRegistryError, match="no alias 'production'"):
        registry.show("testfam", "production")
    with pytest.raises(registry.TclRegistryError, match="invalid hardware family"):
        registry.list_models("bad/name")


def test_cli_errors_exit_2_without_traceback(store, kb):
    from click.testing import CliRunner

    from tcl.cli import main

    reg(kb, 0.5)
    runner = CliRunner()
    for args, msg in ((["promote", "nofam", "1"], "unknown family"),
                      (["promote", "testfam", "9"], "no version"),
                      (["models", "show", "nofam"], "unknown family"),
                      (["models", "list", "--family", "nofam"], "unknown family")):
        res = runner.invoke(main, args)
        assert res.exit_code == 2, (args, res.output)
        assert msg in res.output and "Traceback" not in res.output


def test_model_uri_of_a_missing_alias_says_how_to_get_one(store, kb, tmp_path):
    """`tcl evaluate/sample/collect --model models:/tcl-kb-F@production` before any promotion: the
    error names the versions there are and the promotion, not MLflow's bare 'alias not found'."""
    import click

    from tcl.cli.models import load_model_ref

    reg(kb, 0.5)  # registered at @candidate only
    with pytest.raises(click.ClickException, match="no alias 'production'.*tcl promote testfam candidate"):
        load_model_ref("models:/tcl-kb-testfam@production", tmp_path / "a")
    with pytest.raises(click.ClickException, match="has no version '3'.*versions: 1"):
        load_model_ref("models:/tcl-kb-testfam/3", tmp_path / "b")
    assert load_model_ref("models:/tcl-kb-testfam@candidate", tmp_path / "c").n_features > 0


def test_a_family_without_a_kb_is_told_which_kbs_can_start_one(store, kb):
    """`tcl tune/transfer` on a family nobody registered a KB for: the error names the registered
    KBs of other families and the `tcl transfer` that makes this family's own from one of them."""
    with pytest.raises(registry.TclRegistryError, match=r"the main job \(dvc repro\) registers"):
        registry.default_kb_uri("newfam")
    reg(kb, 0.5)  # testfam at @candidate only
    with pytest.raises(registry.TclRegistryError) as err:
        registry.default_kb_uri("newfam")
    assert ("registered: tcl-kb-testfam; one of them starts this family's own (`tcl transfer --family newfam "
            "--from models:/tcl-kb-testfam@candidate --target-data SUBSET.npz --register`)") in str(err.value)
    assert registry.default_kb_uri("testfam")[0] == "models:/tcl-kb-testfam@candidate"


def test_cli_register_promote_list(store, kb, tmp_path):
    from click.testing import CliRunner

    from tcl.cli import main

    metrics = tmp_path / "metrics.json"
    metrics.write_text(json.dumps({"top1": 0.9, "top5": 0.97, "spearman": 0.5}))
    evald = tmp_path / "test.npz"
    evald.write_bytes(b"held-out data")
    runner = CliRunner()
    args = ["register", str(kb[0]), "--family", "testfam", "--platforms", "p-a,p-b",
            "--eval-metrics", str(metrics), "--onnx", str(kb[1]), "--run-id", new_run(),
            "--data-hash", "D9", "--eval-data", str(evald), "--json",
            "--out", str(tmp_path / "registered.json")]
    res = runner.invoke(main, args)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout.splitlines()[-1])  # --json: the answer is the output's last line
    assert out["version"] == 1 and out["tags"]["eval_data_hash"] == tracking.data_hash(evald)
    assert json.loads((tmp_path / "registered.json").read_text())["version"] == 1
    res = runner.invoke(main, args)  # same checkpoint, same run: the same version
    assert res.exit_code == 0 and json.loads(res.stdout)["version"] == 1
    with pytest.raises(registry.TclRegistryError, match="no alias 'production'.*tcl promote testfam candidate"):
        registry.resolve_onnx("models:/tcl-kb-testfam@production", tmp_path / "dl")  # says how to get one
    res = runner.invoke(main, ["promote", "testfam", "1"])
    assert res.exit_code == 0 and "promoted tcl-kb-testfam version 1" in res.output
    res = runner.invoke(main, ["promote", "testfam", "1", "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout.splitlines()[-1])["status"] == "unchanged"
    res = runner.invoke(main, ["models", "list", "--json"])
    rows = json.loads(res.stdout.splitlines()[-1])
    assert [(r["version"], r["aliases"]) for r in rows] == [(1, ["candidate", "production"])]
    res = runner.invoke(main, ["models", "show", "testfam"])
    assert json.loads(res.stdout)["tags"]["platforms"] == "p-a,p-b"


RACE_SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    from pathlib import Path
    from tcl import registry
    family, version, barrier, me, n = sys.argv[1:6]
    registry.list_models(family)          # imports and opens the store before the barrier
    Path(barrier, me).touch()
    while len(os.listdir(barrier)) < int(n):
        time.sleep(0.002)
    try:
        r = registry.promote(family, version)
        print(json.dumps({"status": r["status"], "version": r["version"],
                          "previous": r["previous"]}))
    except registry.PromotionRefused as exc:
        print(json.dumps({"status": "refused", "version": int(version), "msg": str(exc)}))
""")


def _spawn(args, env):
    return subprocess.Popen([sys.executable, "-c", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)


def test_two_processes_promoting_at_once(store, kb, tmp_path):
    v1 = reg(kb, 0.5)
    v2 = reg(kb, 0.8)
    v3 = reg(kb, 0.7)
    registry.promote("testfam", v1)
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    env = dict(os.environ)
    procs = {v: _spawn([RACE_SCRIPT, "testfam", str(v), str(barrier), f"p{v}", "2"], env)
             for v in (v2, v3)}
    res = {}
    for v, p in procs.items():
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        res[v] = json.loads(out.strip().splitlines()[-1])
    # The rule picks the better version whichever process runs first, and each process's
    # report is consistent with one serial order of the two promotions.
    assert registry.show("testfam", "production")["version"] == v2
    assert res[v2]["status"] == "promoted"
    if res[v3]["status"] == "refused":     # v2 went first
        assert res[v2]["previous"] == v1
        assert "below production version 2" in res[v3]["msg"]
    else:                                  # v3 went first, then v2 replaced it
        assert res[v3] == {"status": "promoted", "version": v3, "previous": v1}
        assert res[v2]["previous"] == v3
    holders = [d["version"] for d in registry.list_models("testfam")
               if "production" in d["aliases"]]
    assert holders == [v2]


def _create_store_and_log(db: str, barrier: str, me: str, n: int, q) -> None:
    """In a forked process: wait for all, then ensure_store + log one run."""
    import time

    try:
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{db}"
        import mlflow

        Path(barrier, me).touch()
        while len(os.listdir(barrier)) < n:
            time.sleep(0.002)
        tracking.ensure_store()
        with tracking.start_run("race", run_name=me):
            mlflow.log_metric("m", 1.0)
        q.put((me, "ok"))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        q.put((me, f"{type(exc).__name__}: {exc}"))


def test_fresh_store_created_once_by_concurrent_processes(tmp_path):
    """Three processes create one fresh SQLite store at the same moment and log a run each.

    Forked from this process (mlflow already imported) so the test stays fast; the new store
    has never been opened here, so no connection is shared across the fork.
    """
    import multiprocessing as mp

    import mlflow  # noqa: F401 - imported once, inherited by the children

    db = tmp_path / "fresh" / "registry" / "mlflow.db"
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_create_store_and_log, args=(str(db), str(barrier), f"p{i}", 3, q))
             for i in range(3)]
    for p in procs:
        p.start()
    results = dict(q.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert results == {"p0": "ok", "p1": "ok", "p2": "ok"}
    con = sqlite3.connect(db)
    try:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 3
        assert con.execute("SELECT count(*) FROM experiments WHERE name='race'").fetchone()[0] == 1
        from mlflow.store.db.utils import _get_latest_schema_revision

        assert con.execute("SELECT version_num FROM alembic_version").fetchone()[0] \
            == _get_latest_schema_revision()
        # experiment artifacts live beside the database, not in ./mlruns of some cwd
        loc = con.execute("SELECT artifact_location FROM experiments WHERE name='race'").fetchone()
        assert str(db.parent / "artifacts") in loc[0]
    finally:
        con.close()


def test_tracking_uri_and_provenance(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    root = tmp_path / "proj"
    (root / "sub" / "deep").mkdir(parents=True)
    (root / "params.yaml").write_text("export: {opset: 17}\n")
    monkeypatch.chdir(root / "sub" / "deep")
    assert tracking.tracking_uri() == f"sqlite:///{root.resolve()}/registry/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:////elsewhere/x.db")
    assert tracking.tracking_uri() == "sqlite:////elsewhere/x.db"
    assert tracking.git_commit(tmp_path) == "unknown"  # not a git repository
    # data_hash: content md5 without dvc.lock, DVC's recorded md5 when dvc.lock lists the path
    data = root / "data" / "f.npz"
    data.parent.mkdir()
    data.write_bytes(b"abc")
    assert tracking.data_hash(data) == "900150983cd24fb0d6963f7d28e17f72"
    (root / "dvc.lock").write_text(
        "schema: '2.0'\nstages:\n  featurize:\n    cmd: x\n    outs:\n    - path: data/f.npz\n"
        "      md5: 0123456789abcdef0123456789abcdef\n      size: 3\n")
    assert tracking.data_hash(data) == "0123456789abcdef0123456789abcdef"


def test_git_commit_marks_dirty_tree(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git not installed")
    repo = tmp_path / "g"
    repo.mkdir()
    run = lambda *a: subprocess.run(["git", *a], cwd=repo, check=True, capture_output=True)  # noqa: E731
    run("init", "-q")
    (repo / "f").write_text("1")
    run("add", "f")
    run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True,
                         text=True).stdout.strip()
    assert tracking.git_commit(repo) == sha
    (repo / "f").write_text("2")
    assert tracking.git_commit(repo) == sha + "+dirty"
