"""The main job end to end: `dvc repro` of the repository's dvc.yaml on a slice of the bundled data.

A temporary git + DVC project gets the real dvc.yaml, params.yaml (with a smaller platform set,
tiny epochs) and a slice of data/raw (a few tasks per platform, a few programs per task). The
pipeline runs ingest -> featurize -> split -> sample -> ckd + scratch -> evaluate -> export ->
register through DVC's Python API against a temporary MLflow SQLite store; then a second
`dvc repro` must run nothing and create no MLflow run and no model version.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.conftest import REPO

# two families; amd-zen4-avx512 learns from two platforms (one FeatureSet each)
FAMILIES = {"amd-zen4-avx512": ["znver4-avx512-t2", "znver4-avx512-t1"], "x86-sse": ["x86-sse-t1"]}
PROGRAMS_PER_TASK = 24
TEST_NETWORKS = ("resnet50", "bert_base")
RATIOS = [0.25, 0.5]  # sample.ratios of the slice: 3 training tasks x 24 programs -> 18 / 36 programs
TARGET_RATIO = 0.5    # continual.target_ratio: what the later platform of amd-zen4-avx512 learns from


def _pick_tasks(raw: Path) -> set[str]:
    """Structural hashes of: one task of each test network and four tasks of other networks,
    among the tasks with enough measured programs on every platform of the slice."""
    counts: dict[str, list[int]] = {}
    for platform in [p for ps in FAMILIES.values() for p in ps]:
        d = raw / platform
        workloads = [json.loads(line)[0] for line in _lines(d / "database_workload.json")]
        per = {}
        for line in _lines(d / "database_tuning_record.json"):
            shash = workloads[json.loads(line)[0]]
            per[shash] = per.get(shash, 0) + 1
        for shash, n in per.items():
            counts.setdefault(shash, []).append(n)
    n_platforms = sum(len(ps) for ps in FAMILIES.values())
    ok = {h for h, c in counts.items() if len(c) == n_platforms and min(c) >= PROGRAMS_PER_TASK}
    meta = json.loads((raw / FAMILIES["x86-sse"][0] / "tasks.json").read_text())
    picked, rest = set(), []
    for net in TEST_NETWORKS:
        cands = sorted(h for h in ok if meta.get(h, {}).get("networks") == [net])
        if not cands:
            pytest.skip(f"the bundled data has no task of {net} with {PROGRAMS_PER_TASK} programs")
        picked.add(cands[0])
    rest = sorted(h for h in ok if h in meta and not set(meta[h]["networks"]) & set(TEST_NETWORKS))
    if len(rest) < 4:
        pytest.skip("the bundled data has fewer than 4 training tasks")
    return picked | set(rest[:4])


def _lines(path: Path):
    gz = path.with_name(path.name + ".gz")
    opener = (lambda: gzip.open(gz, "rt")) if gz.exists() else (lambda: open(path))
    with opener() as f:
        for line in f:
            if line.strip():
                yield line


def _slice_raw(src: Path, dst: Path, platform: str, keep: set[str]) -> None:
    """A real MetaSchedule database with the first PROGRAMS_PER_TASK records of the kept tasks."""
    dst.mkdir(parents=True)
    wl_lines = list(_lines(src / "database_workload.json"))
    workloads = [json.loads(line)[0] for line in wl_lines]
    (dst / "database_workload.json").write_text("".join(wl_lines))
    seen: dict[str, int] = {}
    out = []
    for line in _lines(src / "database_tuning_record.json"):
        shash = workloads[json.loads(line)[0]]
        if shash in keep and seen.get(shash, 0) < PROGRAMS_PER_TASK:
            seen[shash] = seen.get(shash, 0) + 1
            out.append(line)
    (dst / "database_tuning_record.json").write_text("".join(out))
    for name in ("tasks.json", "collect.json"):
        if (src / name).exists():
            shutil.copyfile(src / name, dst / name)


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    if shutil.which("git") is None:
        pytest.skip("git not installed")
    root = tmp_path_factory.mktemp("pipeline") / "proj"
    root.mkdir()
    raw = REPO / "data" / "raw"
    keep = _pick_tasks(raw)
    for platform in [p for ps in FAMILIES.values() for p in ps]:
        _slice_raw(raw / platform, root / "data" / "raw" / platform, platform, keep)

    shutil.copyfile(REPO / "dvc.yaml", root / "dvc.yaml")
    shutil.copyfile(REPO / ".dvcignore", root / ".dvcignore")
    # the stages list the code they run as deps (tcl/...): the project carries a copy of it
    shutil.copytree(REPO / "tcl", root / "tcl", ignore=shutil.ignore_patterns("__pycache__"))
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["platforms"] = [p for ps in FAMILIES.values() for p in ps]
    params["families"] = FAMILIES
    params["split"]["valid_fraction"] = 0.25  # 4 non-test tasks -> 1 validation task
    params["pipeline"]["train"] = {"epochs": 2, "batch_size": 32, "patience": 2, "threads": 1}
    params["sample"].update(ratios=RATIOS, rounds=2)
    params["sample"]["retrain"]["train"]["epochs"] = 2
    params["continual"].update(target_ratio=TARGET_RATIO, ac_init_epochs=1, cl={"epochs": 2},
                               kd={**params["continual"]["kd"], "epochs": 2},
                               kd_first={**params["continual"]["kd_first"], "epochs": 2})
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (root / ".gitignore").write_text("/mlflow/\n/plots-html/\n")

    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    for cmd in (["git", "init", "-q"], [sys.executable, "-m", "dvc", "init", "-q"],
                [sys.executable, "-m", "dvc", "config", "core.analytics", "false"],
                ["git", "add", "-A"], ["git", "commit", "-q", "-m", "pipeline test"]):
        subprocess.run(cmd, cwd=root, check=True, env=env, capture_output=True)
    return root


@pytest.fixture()
def in_project(project, monkeypatch):
    """cwd = the project, its own MLflow store, the venv's `tcl`/`python` first on PATH."""
    monkeypatch.chdir(project)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{project}/mlflow/mlflow.db")
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    return project


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes(), usedforsecurity=False).hexdigest()


def _store_counts() -> tuple[int, int]:
    """(runs in every experiment, model versions of every tcl-kb-* model) of the MLflow store."""
    from tcl import tracking

    tracking.ensure_store()
    import mlflow

    client = mlflow.MlflowClient()
    exps = [e.experiment_id for e in client.search_experiments()]
    runs = len(client.search_runs(exps, max_results=1000))
    versions = len(client.search_model_versions("name LIKE 'tcl-kb-%'"))
    return runs, versions


def test_dvc_repro_registers_a_kb_per_family_and_a_noop_repro_changes_nothing(in_project):
    from dvc.repo import Repo

    from tcl import registry

    root = in_project
    with Repo(str(root)) as repo:
        ran = repo.reproduce()
    names = {s.addressing for s in ran}
    all_platforms = [p for ps in FAMILIES.values() for p in ps]
    assert {f"sample@{p}-{r}" for p in all_platforms for r in RATIOS} <= names
    for fam in FAMILIES:
        for stage in ("ckd", "scratch", "evaluate", "export", "register"):
            assert f"{stage}@{fam}" in names

    import mlflow

    from tcl import tracking
    from tcl.features import FeatureSet

    tracking.ensure_store()  # MLflow at this project's store: an earlier test in the process may have set another
    client = mlflow.MlflowClient()
    split, subsets = root / "data" / "splits", root / "data" / "subsets"
    # sample: one subset per platform and ratio, recording how it was chosen
    for p in all_platforms:
        pool = len(FeatureSet.load(split / p / "train.npz"))
        for r in RATIOS:
            sub = FeatureSet.load(subsets / p / f"rdu-{r}.npz")
            how = sub.meta["sample"]
            assert len(sub) == how["selected"] == round(r * pool) and how["pool"] == pool
            assert (how["strategy"], how["seed"], how["rounds"]) == ("rdu", 0, 2)
            assert len(how["rounds_detail"]) == 2 and all("scores" in d for d in how["rounds_detail"])
            assert set(sub.program_id) <= set(FeatureSet.load(split / p / "train.npz").program_id)

    for fam, platforms in FAMILIES.items():
        # what the KB learned from: the first platform's whole split, the later ones' subsets
        learned = [split / platforms[0] / "train.npz"] + [subsets / p / f"rdu-{TARGET_RATIO}.npz"
                                                          for p in platforms[1:]]
        # registry: one version, alias candidate, tags per docs/lifecycle.md and the CKD tags
        rows = registry.list_models(fam)
        assert [r["version"] for r in rows] == [1]
        v = rows[0]
        assert v["aliases"] == ["candidate"]
        tags = v["tags"]
        assert set(registry.VERSION_TAGS) <= set(tags)
        assert tags["family"] == fam and tags["platforms"] == ",".join(platforms)
        assert tags["kind"] == "mamba" and tags["feature_version"]
        assert tags["data_hash"] == ",".join(_md5(f) for f in learned)
        assert tags["eval_data_hash"] == ",".join(_md5(split / p / "test.npz") for p in platforms)
        assert tags["schedule"] == "ckd" and tags["target"] == platforms[-1]
        assert tags["sources"] == (",".join(platforms[:-1]) or "none")
        assert tags["subset_hash"] == (",".join(_md5(f) for f in learned[1:]) or "none")
        assert tags["checkpoint_sha256"] == registry.file_sha256(root / "models" / fam / "model.pt")
        assert tags["onnx_sha256"] == registry.file_sha256(root / "models" / f"{fam}.onnx")
        run_id = json.loads((root / "models" / fam / "mlflow_run.json").read_text())["run_id"]
        assert tags["run_id"] == run_id

        # the KB's run is the CKD parent run; each subset it learned from is an artifact of it
        run = client.get_run(run_id)
        assert run.info.run_name == f"ckd-{fam}" and run.data.tags["platforms"] == ",".join(platforms)
        assert [run.data.params[f"data.{p}"] for p in platforms] == [str(f.relative_to(root)) for f in learned]
        for p, f in zip(platforms[1:], learned[1:]):
            got = client.download_artifacts(run_id, f"subsets/{p}/{f.name}", str(root / "mlflow" / "dl"))
            assert _md5(Path(got)) == _md5(f)
        assert len(client.list_artifacts(run_id, "subsets")) == len(platforms) - 1

        # metrics: the KB's fields as before (means over platforms + per platform/network, the
        # same top1 as the tags), the from-scratch comparison beside them
        m = json.loads((root / "metrics" / f"{fam}.json").read_text())
        assert m["platforms"] == platforms and m["model"] == "ckd"
        for res in (m, m["scratch"]):
            for key in ("top1", "top5", "pairwise"):
                assert 0.0 <= res[key] <= 1.0
            assert -1.0 <= res["spearman"] <= 1.0  # a 2-epoch model can rank a task backwards
            assert set(res["per_platform"]) == set(platforms)
            for r in res["per_platform"].values():
                assert set(r["per_network"]) == set(TEST_NETWORKS)
        assert float(tags["top1"]) == pytest.approx(m["top1"])
        assert m["ckd_minus_scratch"]["top1"] == pytest.approx(m["top1"] - m["scratch"]["top1"])
        assert [m["train_data"][p]["programs"] for p in platforms] == [len(FeatureSet.load(f)) for f in learned]
        info = json.loads((root / "models" / f"{fam}.registered.json").read_text())
        assert info["version"] == 1 and info["name"] == f"tcl-kb-{fam}"

        # the from-scratch run: one FeatureSet per platform of the family, whole training splits
        scratch_id = json.loads((root / "models-scratch" / fam / "mlflow_run.json").read_text())["run_id"]
        run = client.get_run(scratch_id)
        assert run.info.run_name == f"scratch-{fam}" and run.data.tags["platform"] == ",".join(platforms)
        assert run.data.params["data"] == ",".join(f"data/splits/{p}/train.npz" for p in platforms)
        assert run.data.params["train.epochs"] == "2"

        # plot files: the KB's KD epochs (2 per platform), the scratch model's epochs
        loss = json.loads((root / "plots" / "train_loss" / f"{fam}.json").read_text())
        valid = json.loads((root / "plots" / "valid" / f"{fam}.json").read_text())
        assert [r["epoch"] for r in loss] == [r["epoch"] for r in valid] == list(range(2 * len(platforms)))
        assert all(r["train_loss"] > 0 for r in loss) and all(0 <= r["valid_top1"] <= 1 for r in valid)
        assert all(0 <= r["valid_pairwise"] <= 1 for r in valid)
        # KD learns the labels beside the AC (continual.alpha_task > 0) on every platform, the first too
        summary = json.loads((root / "models" / fam / "continual.json").read_text())
        assert all(r["loss_task"] > 0 and r["loss_distill"] > 0
                   for p in summary["per_platform"] for r in p["kd"]["epochs"])
        assert all(p["kd"]["select"] == "pairwise" for p in summary["per_platform"])
        loss = json.loads((root / "plots" / "scratch_train_loss" / f"{fam}.json").read_text())
        valid = json.loads((root / "plots" / "scratch_valid" / f"{fam}.json").read_text())
        assert [r["epoch"] for r in loss] == [r["epoch"] for r in valid] == [0, 1]
        topk = json.loads((root / "plots" / "topk" / f"{fam}.json").read_text())
        assert {(r["model"], r["platform"], r["network"], r["metric"]) for r in topk} == {
            (model, p, n, k) for model in ("kb", "scratch") for p in platforms for n in TEST_NETWORKS
            for k in ("top1", "top5")}

    runs, versions = _store_counts()
    # per family: the CKD parent, cl + kd per platform, ac-init per later platform; the scratch run
    assert versions == len(FAMILIES)
    assert runs == sum(1 + 2 * len(ps) + (len(ps) - 1) + 1 for ps in FAMILIES.values())

    # a no-op repro: nothing runs, no new MLflow run or model version
    with Repo(str(root)) as repo:
        assert list(repo.reproduce()) == []
        assert repo.status() == {}
    assert _store_counts() == (runs, versions)

    # the plots render (the dvc.yaml `plots:` definitions): one chart per file, no errors
    out = subprocess.run([sys.executable, "-m", "dvc", "plots", "show", "--json"],
                         cwd=root, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    shown = json.loads(out.stdout)
    assert not shown.get("errors")
    kinds = ("train_loss", "valid", "scratch_train_loss", "scratch_valid", "topk")
    assert set(shown["data"]) == {f"plots/{kind}/{fam}.json" for kind in kinds for fam in FAMILIES}
    out = subprocess.run([sys.executable, "-m", "dvc", "plots", "show", "-o", "plots-html"],
                         cwd=root, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    html = (root / "plots-html" / "index.html").read_text()
    assert html.count('"$schema": "https://vega.github.io/schema/vega-lite') == len(kinds) * len(FAMILIES)

    # the registered KB serves
    from tcl.features import FeatureSet
    from tcl.serving import load_predictor

    fs = FeatureSet.load(root / "data" / "splits" / "x86-sse-t1" / "test.npz")
    served = load_predictor("models:/tcl-kb-x86-sse@candidate")
    scores = served.predict_features(fs)
    assert scores.shape == (len(fs),)
    # parity on real data: the served graph (TCL's operators), the exported standard-op graph
    # and the PyTorch checkpoint agree
    import torch

    from tcl.models.nets import load_checkpoint

    model, _ = load_checkpoint(root / "models" / "x86-sse" / "model.pt")
    with torch.no_grad():
        ref = model.eval()(torch.from_numpy(np.asarray(fs.x)), torch.from_numpy(np.asarray(fs.mask))).numpy()
    assert served.fused == 2  # one Mamba block: conv + scan
    np.testing.assert_allclose(scores, ref, rtol=0, atol=1e-5)
    standard = load_predictor("models:/tcl-kb-x86-sse@candidate", fused=False).predict_features(fs)
    np.testing.assert_allclose(standard, ref, rtol=0, atol=1e-5)

    # editing the training code makes every family's model stale (and its descendants), nothing
    # upstream of training
    training = root / "tcl" / "training.py"
    saved = training.read_text()
    training.write_text(saved + "\n# edited\n")
    try:
        with Repo(str(root)) as repo:
            stale = {name.split(":")[-1] for name in repo.status()}
    finally:
        training.write_text(saved)
    assert {f"{stage}@{fam}" for stage in ("ckd", "scratch") for fam in FAMILIES} <= stale
    assert not any(name.startswith(("ingest@", "featurize@", "split@")) for name in stale)

    # a changed target ratio reruns the KB of the family with a later platform, not its subsets,
    # nor the from-scratch models
    params_file = root / "params.yaml"
    saved = params_file.read_text()
    params = yaml.safe_load(saved)
    params["continual"]["target_ratio"] = RATIOS[0]
    params_file.write_text(yaml.safe_dump(params, sort_keys=False))
    try:
        with Repo(str(root)) as repo:
            stale = {name.split(":")[-1] for name in repo.status()}
    finally:
        params_file.write_text(saved)
    assert {f"ckd@{fam}" for fam in FAMILIES} <= stale  # both declare `continual`
    assert not any(name.startswith(("sample@", "scratch@")) for name in stale)


def test_family_platforms_checks_the_hardware_registry():
    import click

    from tcl.pipeline import family_platforms

    params = {"families": {"x86-sse": ["x86-sse-t1"], "x86-avx2": ["x86-sse-t1"],
                           "amd-zen4-avx512": []}}
    assert family_platforms("x86-sse", params) == ["x86-sse-t1"]
    for fam, msg in (("x86-avx2", "belongs to family 'x86-sse'"), ("amd-zen4-avx512", "no platforms"),
                     ("nvidia-turing", "not under `families:`")):
        with pytest.raises(click.ClickException, match=msg):
            family_platforms(fam, params)


def test_paper_profile_becomes_dvc_exp_run_flags_for_existing_keys():
    from tcl.pipeline import profile_args

    args = profile_args(REPO / "params-paper.yaml")
    flags = dict(a.split("=", 1) for a in args[1::2])
    assert args[::2] == ["-S"] * len(flags)
    assert flags["pipeline.train.epochs"] == "50" and flags["pipeline.train.batch_size"] == "1024"
    # `dvc exp run -S` only modifies keys: every key of the profile must exist in params.yaml
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    for key in flags:
        node = params
        for part in key.split("."):
            assert part in node, f"{key} is not in params.yaml"
            node = node[part]


def test_data_hash_of_a_file_ignores_a_stale_dvc_lock_dep(tmp_path, monkeypatch):
    """While `dvc repro` re-runs a stage, dvc.lock still lists its deps' previous md5s."""
    from tcl import tracking

    (tmp_path / "params.yaml").write_text("{}\n")
    f = tmp_path / "train.npz"
    f.write_bytes(b"new bytes")
    (tmp_path / "dvc.lock").write_text(
        "schema: '2.0'\nstages:\n  train:\n    cmd: x\n    deps:\n    - path: train.npz\n"
        "      md5: 0123456789abcdef0123456789abcdef\n      size: 9\n")
    monkeypatch.chdir(tmp_path)
    assert tracking.data_hash(f) == _md5(f)
