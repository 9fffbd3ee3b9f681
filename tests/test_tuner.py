"""The tuner: TCL's KB steering real MetaSchedule tuning through onnxruntime (tcl.tuner)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tcl.hardware import family_of
from tests.conftest import LOCAL_PLATFORM, REPO, fixture_path, run_tcl

PLATFORM = LOCAL_PLATFORM  # the runs measure on this host
FAMILY = family_of(PLATFORM)
TINY = {"d_model": 16, "n_layers": 1, "d_state": 4, "expand": 1, "d_conv": 4}


@pytest.fixture(scope="module")
def kb(tmp_path_factory):
    """A tiny Mamba KB trained briefly on the real fixture databases, exported to ONNX."""
    import torch

    from tcl.export import export_model
    from tcl.features import featurize_file
    from tcl.models import new_model
    from tcl.records.ingest import ingest
    from tcl.training import train_model

    d = tmp_path_factory.mktemp("tuner-kb")
    sets = []
    for name in ("dense_256", "conv2d_small"):
        ingest(fixture_path(f"metaschedule/{name}"), PLATFORM, d / f"{name}.parquet")
        sets.append(featurize_file(d / f"{name}.parquet", d / f"{name}.npz", max_len=48))
    torch.manual_seed(0)
    model = new_model("mamba", sets[0].meta["n_features"], TINY, sets[0].meta)
    model, _ = train_model(model, sets, sets[1:], {"epochs": 2, "batch_size": 16, "threads": 1},
                           d / "train", progress=False)
    return export_model(model, d / "kb.onnx", FAMILY)


@pytest.fixture(scope="module")
def kb_checkpoint(kb):
    """The torch checkpoint the KB was exported from (its training directory, model.pt)."""
    assert (kb.parent / "train" / "model.pt").is_file()
    return kb.parent / "train"


def dense_candidates(n: int, seed: int = 0, workload: str = "dense_64"):
    """Real MetaSchedule candidates (default: a 64x64x64 matmul): design-space samples,
    postprocessed."""
    from tcl.collect.measure import sample_programs
    from tcl.collect.workloads import build_workload, resolve_workload
    from tcl.tuner.tune import use_x86_intrinsics_only

    use_x86_intrinsics_only()
    from tvm.s_tir import meta_schedule as ms
    from tvm.target import Target

    mod = build_workload(resolve_workload(workload))
    target = {"kind": "llvm", "mcpu": "znver4", "num-cores": 2}
    programs = sample_programs(mod, target, n, seed)
    args = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    ctx = ms.TuneContext(mod=mod, target=Target(target))
    return mod, target, ctx, [ms.MeasureCandidate(sch, args) for sch, _, _ in programs], programs


# every kind of operator the networks hold (their design spaces use different instructions)
@pytest.mark.parametrize("workload", ["dense_64", "conv2d_small", "softmax_small", "layer_norm_128_128",
                                      "depthwise_conv2d_14_384_3_1", "batch_matmul_2_128_64_128"])
def test_candidate_steps_equal_what_ingest_reads_from_the_database(tmp_path, workload):
    """The steps of a candidate equal those ingest makes of its database line (the KB was
    trained on those): committed to a real JSONDatabase, read back by the records reader. The
    trace library's steps differ only in an IndexMap's text, which gives the same features."""
    import orjson

    from tcl.collect.measure import commit, open_database
    from tcl.features import Featurizer
    from tcl.records.metaschedule import trace_to_steps
    from tcl.tuner.traces import CandidateFeatures, candidate_steps, trace_library

    mod, target, _, candidates, programs = dense_candidates(70, workload=workload)
    db = open_database(tmp_path)
    for sch, _, _ in programs:
        commit(db, mod, sch.trace, [1e-3], target)
    lines = (tmp_path / "database_tuning_record.json").read_text().splitlines()
    from_file = [trace_to_steps(orjson.loads(line)[1][0]) for line in lines]
    assert len(from_file) == len(candidates) == 70
    assert candidate_steps(candidates, use_library=False) == from_file
    if trace_library() is None:
        pytest.skip("TCL's trace library is not built (pip install -e . --no-build-isolation)")
    fast = candidate_steps(candidates)  # 70 candidates: two threads, a half each
    assert any("<IndexMap>" in step for steps in fast for step in steps) or workload != "dense_64"
    unmap = [[[s if s != "<IndexMap>" else None for s in step] for step in steps] for steps in fast]
    ref = [[[s if not (isinstance(s, str) and s.startswith('{\n  "root_index"')) else None for s in step]
            for step in steps] for steps in from_file]
    assert unmap == ref
    x_fast, m_fast = Featurizer(48)(fast)
    x_file, m_file = Featurizer(48)(from_file)
    np.testing.assert_array_equal(x_fast, x_file)
    np.testing.assert_array_equal(m_fast, m_file)
    # the library's one pass (trace -> the featurizer's rows) gives the same bytes as the
    # featurizer on the database's steps: 70 candidates (two threads), then 9 (one, the buffer
    # reused: no row of the larger batch left behind), at the KBs' max_len and a short one
    for max_len in (48, 12):
        features = CandidateFeatures(Featurizer(max_len))
        for rows in (slice(0, 70), slice(3, 12)):
            x_lib, m_lib = features(candidates[rows])
            assert features.path == "library"
            x_ref, m_ref = Featurizer(max_len)(from_file[rows])
            assert x_lib.dtype == x_ref.dtype and x_lib.shape == x_ref.shape and m_lib.dtype == m_ref.dtype
            assert x_lib.tobytes() == x_ref.tobytes() and m_lib.tobytes() == m_ref.tobytes()


def test_cost_model_scores_equal_the_predictor_on_the_same_features(kb):
    from tcl.features import Featurizer
    from tcl.serving import load_predictor
    from tcl.tuner.cost_model import TCLCostModel, positive_scores
    from tcl.tuner.traces import candidate_steps

    _, _, ctx, candidates, _ = dense_candidates(40)
    cm = TCLCostModel(str(kb), family=FAMILY)
    got = cm.predict(ctx, candidates)
    x, mask = Featurizer(48)(candidate_steps(candidates))
    ref = load_predictor(kb).predict(x, mask).astype(np.float64)
    assert got.dtype == np.float64 and got.shape == (40,)
    # the logistic map is increasing: the same order, and its values by hand in float64
    np.testing.assert_allclose(got, 1.0 / (1.0 + np.exp(-ref)), rtol=1e-6)
    assert np.all(got > 0)
    assert cm.stats.predict_calls == 1 and cm.stats.candidates_scored == 40 and cm.stats.cached == 0
    again = cm.predict(ctx, candidates)  # the same schedules again: answered from the cache
    np.testing.assert_array_equal(again, got)
    assert cm.stats.cached == 40 and cm.stats.candidates_scored == 80
    assert positive_scores(np.array([np.nan, -np.inf])).tolist() == [0.0, 0.0]


def test_cost_model_refuses_a_kb_of_another_family(kb):
    from tcl.serving import ModelMismatchError
    from tcl.tuner.cost_model import TCLCostModel

    with pytest.raises(ModelMismatchError, match="family"):
        TCLCostModel(str(kb), family="x86-sse")


def test_tuner_path_runs_without_torch_or_mlflow(kb):
    """Neither torch nor MLflow is needed to score candidates (TVM's FFI imports torch when it
    is installed, so both are blocked here: the tuner must still work)."""
    code = f"""
import sys
sys.modules['torch'] = None; sys.modules['mlflow'] = None   # any import of them fails
from tests.test_tuner import dense_candidates
from tcl.tuner.cost_model import TCLCostModel
_, _, ctx, cands, _ = dense_candidates(8)
s = TCLCostModel({str(kb)!r}).predict(ctx, cands)
assert len(s) == 8 and (s > 0).all()
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-2000:]


def tune_json(proc) -> dict:
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_tcl_tune_writes_a_database_that_ingests(kb, tmp_path, store):
    out = tmp_path / "tuned"
    proc = run_tcl("tune", "--platform", PLATFORM, "--workload", "dense_64", "--trials", 8,
                   "--cost-model", "tcl", "--model", kb, "--out", out, "--min-repeat-ms", 0,
                   "--repeat", 1, "--no-progress", "--json")
    result = tune_json(proc)
    assert set(result) == {"tasks", "weighted_latency_s", "seconds", "predict_calls",
                           "candidates_scored", "predict_seconds"}
    (task,) = result["tasks"]
    assert set(task) == {"task", "best_latency_s", "trials"} and task["task"] == "dense_64"
    assert task["trials"] == 8 and 0 < task["best_latency_s"] < 1
    assert result["weighted_latency_s"] == pytest.approx(task["best_latency_s"])
    assert result["predict_calls"] > 0 and result["candidates_scored"] >= result["predict_calls"]
    assert 0 < result["predict_seconds"] < result["seconds"]
    # the best latency reported is the best valid record in the database written
    lines = [json.loads(s) for s in (out / "database_tuning_record.json").read_text().splitlines()]
    assert len(lines) == 8
    best = min(sum(r[1][1]) / len(r[1][1]) for r in lines if max(r[1][1]) < 1e9)
    assert task["best_latency_s"] == pytest.approx(best, rel=1e-9)
    # the loop closes: the tuning database is more data for the platform
    ingested = json.loads(run_tcl("ingest", out, "--platform", PLATFORM, "--out", tmp_path / "t.parquet",
                                  "--json").stdout.strip().splitlines()[-1])
    assert ingested["records"] + sum(ingested["rejected"].values()) == 8
    assert ingested["records"] >= 1 and ingested["tasks"] == 1
    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "t.parquet")
    assert set(table.column("task_id").to_pylist()) == {"dense_64"}
    # the records say which CPU their latencies are from (tune.json, carried as provenance)
    from tcl.hardware import get_platform, host_mismatch, local_cpu_model
    from tcl.records.ingest import read_provenance

    origin = read_provenance(table)["origin"]
    assert origin["made_by"] == "tcl tune" and origin["host_cpu"] == local_cpu_model()
    assert origin["host_mismatch"] == host_mismatch(get_platform(PLATFORM))
    # the run is an MLflow run with the figures
    import mlflow

    runs = mlflow.search_runs(experiment_names=["tcl-tune"], output_format="list")
    assert len(runs) == 1 and runs[0].data.params["cost_model"] == "tcl"
    assert runs[0].data.params["search_population_size"] == "512"  # the search's settings, TVM's here
    assert runs[0].data.metrics["candidates_scored"] == result["candidates_scored"]


def test_tune_refuses_bad_arguments(tmp_path, store):
    from click.testing import CliRunner

    from tcl.cli import main

    def tune(*args):
        return CliRunner().invoke(main, ["tune", "--platform", PLATFORM, "--trials", "8", "--no-progress",
                                         *map(str, args)])

    res = tune("--cost-model", "tcl", "--out", tmp_path / "o")
    assert res.exit_code == 2 and "exactly one of --workload" in res.output
    res = tune("--workload", "dense_64", "--cost-model", "mlp", "--out", tmp_path / "o")
    assert res.exit_code == 1 and "--cost-model mlp needs --model" in res.output
    res = tune("--workload-db", fixture_path("metaschedule/dense_256"), "--task-index", 3,
               "--cost-model", "random", "--out", tmp_path / "o")
    assert res.exit_code == 2 and "out of range" in res.output
    # remote measurement is collection's (tests/test_collect.py runs a tracker and a server)
    res = tune("--workload", "dense_64", "--cost-model", "random", "--out", tmp_path / "r",
               "--rpc-tracker", "127.0.0.1:9190")
    assert res.exit_code == 2 and "--rpc-tracker needs --rpc-key" in res.output
    assert not (tmp_path / "r").exists()
    # a key without a tracker would measure here, silently
    res = tune("--workload", "dense_64", "--cost-model", "random", "--out", tmp_path / "r", "--rpc-key", "k")
    assert res.exit_code == 2 and "--rpc-key needs --rpc-tracker" in res.output
    res = CliRunner().invoke(main, ["tune", "--platform", PLATFORM, "--trials", "0", "--workload", "dense_64",
                                    "--cost-model", "random", "--out", str(tmp_path / "r")])
    assert res.exit_code == 2 and "--trials" in res.output
    # a bad tasks.json beside a workload database: the error names it
    db = tmp_path / "db"
    db.mkdir()
    (db / "database_workload.json").write_text((fixture_path("metaschedule/dense_256") / "database_workload.json")
                                               .read_text())
    (db / "tasks.json").write_text("{not json")
    res = tune("--workload-db", db, "--cost-model", "random", "--out", tmp_path / "o")
    assert res.exit_code == 2 and f"{db / 'tasks.json'}: not a tasks.json" in res.output, res.output
    assert not (tmp_path / "r").exists() and not (tmp_path / "o").exists()


def test_search_settings_default_to_tvm_s_own_and_reach_metaschedule(tmp_path, monkeypatch):
    """params.yaml tune.search: TVM's EvolutionarySearch defaults unless set; a setting reaches the
    search (a population of 32: no predict call scores more), is recorded in tune.json, and a
    misspelt one is refused before anything runs."""
    import inspect

    from tcl.collect.measure import MeasureSettings
    from tcl.collect.workloads import build_workload, resolve_workload
    from tcl.hardware import get_platform
    from tcl.tuner.tune import DEFAULT_SEARCH, TuneTask, search_params, tune

    from tvm.s_tir import meta_schedule as ms

    shipped = inspect.signature(ms.search_strategy.EvolutionarySearch.__init__).parameters
    assert DEFAULT_SEARCH == {k: shipped[k].default for k in DEFAULT_SEARCH}
    assert set(DEFAULT_SEARCH) == set(shipped) - {"self"}
    assert search_params() == DEFAULT_SEARCH  # the repository's params.yaml keeps TVM's search
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text("tune:\n  search: {population_size: 32, init_min_unmeasured: 8}\n")
    assert search_params()["population_size"] == 32
    task = TuneTask("dense_64", build_workload(resolve_workload("dense_64")))
    result = tune(get_platform(PLATFORM), [task], 8, "random", tmp_path / "db", progress=False,
                  trials_per_iter=8, settings=MeasureSettings(repeat=1, min_repeat_ms=0))
    assert result["tasks"][0]["trials"] == 8
    assert 0 < result["candidates_scored"] <= 32 * result["predict_calls"]
    assert json.loads((tmp_path / "db" / "tune.json").read_text())["search"] == {
        **DEFAULT_SEARCH, "population_size": 32, "init_min_unmeasured": 8}
    (tmp_path / "params.yaml").write_text("tune:\n  search: {populaton_size: 32}\n")
    with pytest.raises(ValueError, match=r"unknown tune.search settings \['populaton_size'\]"):
        search_params()
    from click.testing import CliRunner

    from tcl.cli import main

    res = CliRunner().invoke(main, ["tune", "--platform", PLATFORM, "--trials", "8", "--workload", "dense_64",
                                    "--cost-model", "random", "--out", str(tmp_path / "o"), "--no-progress"])
    assert res.exit_code == 2 and "populaton_size" in res.output and not (tmp_path / "o").exists()


def test_study_ratios_by_hand():
    from tcl.bench.tune import ratios

    inf = float("inf")
    curves = {  # (trials, best latency after each batch, seconds)
        "tcl": ([16, 32, 48, 64], [9.0, 5.0, 4.0, 4.0], [10.0, 20.0, 30.0, 40.0]),
        "xgb": ([16, 32, 48, 64], [inf, 8.0, 6.0, 5.0], [12.0, 24.0, 36.0, 48.0]),
        "random": ([16, 32, 48, 64], [7.0, 3.0, 3.0, 3.0], [11.0, 22.0, 33.0, 44.0]),
        "mlp": ([16, 32, 48, 64], [8.0, 6.0, 6.0, 6.0], [13.0, 26.0, 39.0, 52.0]),
    }
    r = ratios(curves)
    # xgb ends at 5.0 (first reached at its last batch), which TCL first reaches after 32 trials
    # (20 s): 64/32 trials, 48/20 s
    assert r["xgb"]["speedup_trials"] == 2.0 and r["xgb"]["speedup_seconds"] == 2.4
    assert r["xgb"]["latency_ratio_at_equal_trials"] == 5.0 / 4.0 and r["xgb"]["baseline_trials_to_final"] == 64
    # random ends at 3.0, which TCL never reaches
    assert r["random"]["speedup_trials"] is None and r["random"]["latency_ratio_at_equal_trials"] == 0.75
    # mlp levels off at 6.0 after 32 trials (26 s): its 64-trial budget is not what reaching 6.0
    # cost it; TCL reaches 6.0 after 32 trials (20 s) too: 32/32 trials, 26/20 s
    assert r["mlp"]["baseline_trials_to_final"] == 32
    assert r["mlp"]["speedup_trials"] == 1.0 and r["mlp"]["speedup_seconds"] == 1.3


def test_bench_tune_runs_every_model_of_a_seed_before_the_next_seed():
    """The runs compared with each other are measured close in time: a host slowing down mid-study
    hits every model alike, not the last one alone (bench_tune runs them in this order)."""
    from tcl.bench.tune import run_order

    assert run_order(("tcl", "xgb", "random"), (0, 1)) == [
        ("tcl", 0), ("xgb", 0), ("random", 0), ("tcl", 1), ("xgb", 1), ("random", 1)]


def test_bench_tune_end_to_end(kb, kb_checkpoint, tmp_path):
    from tcl.bench.tune import bench_tune, format_report
    from tcl.collect.measure import MeasureSettings

    settings = MeasureSettings(number=1, repeat=1, min_repeat_ms=0)
    with pytest.raises(ValueError, match="unknown cost model.*tcl-ft"):  # before any tuning
        bench_tune(PLATFORM, "dense_64", cost_models=("tcl", "xgboost"), out_dir=tmp_path / "x")
    assert not (tmp_path / "x").exists()
    report = bench_tune(PLATFORM, "dense_64", trials=4, trials_per_iter=2, seeds=(0,),
                        cost_models=("tcl", "tcl-ft", "random"), model=str(kb), out_dir=tmp_path,
                        settings=settings, progress=False, kb_checkpoint=str(kb_checkpoint))
    for name in ("tcl", "tcl-ft", "random"):
        curve = report["curves"][name]
        assert curve["trials"] == [2, 4]
        assert curve["best_latency_s"][1] <= curve["best_latency_s"][0]  # a best-so-far curve
        (task,) = report["runs"][f"{name}/seed0"]["tasks"]
        assert task["best_latency_s"] == pytest.approx(curve["best_latency_s"][-1])
        assert report["runs"][f"{name}/seed0"]["hung_runs"] == 0  # what the measuring guard did
        assert report["runs"][f"{name}/seed0"]["runner_restarts"] == 0
    r = report["ratios"]["random"]
    assert r["latency_ratio_at_equal_trials"] == pytest.approx(
        report["curves"]["random"]["best_latency_s"][-1] / report["curves"]["tcl"]["best_latency_s"][-1])
    # tcl-ft fine-tunes the KB after each of its two measured batches, with its own ratios; tcl does not.
    # An attempt swaps the served model only where it lowered the loss on the measurements (on 2-4
    # programs timed once, an attempt can find nothing better: the CI run of 2026-12-03 saw 1 of 2)
    assert report["cost_model"]["candidates_scored"] > 0
    attempts = report["runs"]["tcl-ft/seed0"]["stats"]["fine_tune"]
    assert [a["measured"] for a in attempts] == [2, 4]
    assert all(a["loss_after"] <= a["loss_before"] for a in attempts)
    swapped = sum(a["loss_after"] < a["loss_before"] for a in attempts)
    assert report["cost_model"]["fine_tune_updates"] == swapped
    cm = report["cost_model"]  # the whole share counts the fine-tuning attempts, swapped or not
    assert cm["update_seconds"] > 0 and cm["share_with_updates"] == pytest.approx(
        cm["share_of_tuning"] * (cm["predict_seconds"] + cm["update_seconds"]) / cm["predict_seconds"])
    assert report["runs"]["tcl/seed0"]["stats"]["fine_tune"] == []
    assert json.loads((tmp_path / "tcl-ft-seed0" / "tune.json").read_text())["fine_tune"] is True
    assert json.loads((tmp_path / "tcl-seed0" / "tune.json").read_text())["fine_tune"] is False
    assert set(report["ratios"]) == set(report["ratios_fine_tune"]) == {"random"}
    assert report["ratios_fine_tune"]["random"]["latency_ratio_at_equal_trials"] == pytest.approx(
        report["curves"]["random"]["best_latency_s"][-1] / report["curves"]["tcl-ft"]["best_latency_s"][-1])
    text = format_report(report)
    assert "tcl vs random" in text and "tcl-ft vs random" in text and "KB inside tuning" in text
    assert (f"KB fine-tuned {swapped} times" in text) == (swapped > 0)


def test_mlp_cost_model_scores_each_candidates_store_rows(tmp_path):
    """The offline Tenset-MLP scores a candidate from its own per-store rows (MetaSchedule's
    extractor), whatever the other candidates of the batch: each scored alone agrees."""
    import torch

    from tcl.models import new_model
    from tcl.tuner.baselines import TensetMLPCostModel
    from tcl.tuner.cost_model import positive_scores

    torch.manual_seed(0)
    model = new_model("mlp-tenset", 172, {"hidden_dim": 16})
    model.save(tmp_path / "model.pt")
    _, _, ctx, candidates, _ = dense_candidates(6)
    cm = TensetMLPCostModel(tmp_path)
    batch = cm.predict(ctx, candidates)
    alone = np.array([cm.predict(ctx, [c])[0] for c in candidates])
    np.testing.assert_allclose(batch, alone, rtol=1e-5)
    rows = [f.numpy() for f in cm.extractor.extract_from(ctx, candidates[:1])]
    with torch.no_grad():  # the net on the first program's store rows, by hand
        ref = model.net(torch.tensor([len(rows[0])]), torch.from_numpy(rows[0].astype(np.float32)))
    np.testing.assert_allclose(batch[0], positive_scores(ref.double().numpy())[0], rtol=1e-5)
    assert cm.stats.candidates_scored == 12 and len(np.unique(batch)) > 1


def test_tune_measures_through_an_rpc_tracker_and_server(tmp_path):
    from tests.conftest import rpc_tracker_and_server

    with rpc_tracker_and_server("tcl-tune") as port:
        out = tmp_path / "rpc-tuned"
        proc = run_tcl("tune", "--platform", "x86-sse-t1", "--workload", "dense_64", "--trials", 4,
                       "--cost-model", "random", "--out", out, "--min-repeat-ms", 1, "--no-progress", "--json",
                       "--rpc-tracker", f"127.0.0.1:{port}", "--rpc-key", "tcl-tune",
                       env={"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/m.db"})
        (task,) = tune_json(proc)["tasks"]
        assert task["trials"] == 4 and task["best_latency_s"] > 0
        settings = json.loads((out / "tune.json").read_text())
        assert settings["rpc"] == {"tracker": f"127.0.0.1:{port}", "key": "tcl-tune"}
        assert settings["host_cpu"] is None and settings["host_mismatch"] is None  # the device's, not ours


def test_tasks_of_a_network_and_of_a_workload_database():
    from tvm_ffi import structural_hash

    from tcl.cli.tuning import _tasks
    from tcl.collect.networks import bert
    from tcl.tuner.tune import workload_tasks

    tasks = _tasks(None, None, None, "bert_tiny")
    ops = bert(2, 128, 2)
    assert len(tasks) == len(set(ops)) and sum(t.weight for t in tasks) == len(ops)
    (task,) = workload_tasks(fixture_path("metaschedule/dense_256"), 0)
    shash = json.loads((fixture_path("metaschedule/dense_256") / "database_workload.json").read_text())[0]
    assert str(structural_hash(task.mod)) == str(shash) and task.weight == 1.0
    assert task.name == str(shash)  # no tasks.json: named as `tcl ingest` names it


def test_batch_shrinks_so_every_task_of_a_network_gets_measured():
    from tcl.tuner.tune import batch_for

    assert batch_for(256, 1, 16) == (16, None) and batch_for(8, 1, 64) == (8, None)  # one task: as asked
    assert batch_for(640, 7, 64) == (64, None)
    batch, note = batch_for(100, 7, 64)  # 64 a batch: two of seven tasks measured
    assert batch == 14 and "each of the 7 tasks" in note
    batch, note = batch_for(5, 7, 64)
    assert batch == 1 and "the last 2 get none" in note
    with pytest.raises(ValueError, match="--trials-per-iter"):
        batch_for(8, 2, 0)


def test_tune_of_several_workloads_measures_each_within_a_small_budget(tmp_path, store):
    """Two workloads on 4 trials: MetaSchedule's batch of 64 would give the first all four."""
    db = tmp_path / "two"
    db.mkdir()
    (db / "database_workload.json").write_text("".join(
        (fixture_path(f"metaschedule/{name}") / "database_workload.json").read_text()
        for name in ("dense_256", "conv2d_small")))
    proc = run_tcl("tune", "--platform", PLATFORM, "--workload-db", db, "--trials", 4, "--cost-model", "random",
                   "--out", tmp_path / "o", "--min-repeat-ms", 0, "--repeat", 1, "--no-progress", "--json")
    result = tune_json(proc)
    assert [t["trials"] for t in result["tasks"]] == [2, 2]
    # the records of the tuning name each workload as the database's own records would be named
    ingested = run_tcl("ingest", tmp_path / "o", "--platform", PLATFORM, "--out", tmp_path / "t.parquet", "--json")
    import pyarrow.parquet as pq

    hashes = [str(json.loads(line)[0]) for line in (db / "database_workload.json").read_text().splitlines()]
    assert json.loads(ingested.stdout.strip().splitlines()[-1])["tasks"] == 2
    assert set(pq.read_table(tmp_path / "t.parquet").column("task_id").to_pylist()) == set(hashes)
    assert [t["task"] for t in result["tasks"]] == hashes
    assert result["weighted_latency_s"] == pytest.approx(sum(t["best_latency_s"] for t in result["tasks"]))
    assert proc.stderr.count("batches of 2 candidates, not 64") == 1  # said before the run, once
    assert json.loads((tmp_path / "o" / "tune.json").read_text())["trials_per_iter"] == 2


@pytest.fixture(scope="module")
def fine_tuned_run(kb_checkpoint, tmp_path_factory):
    """`tcl tune --fine-tune` of dense_64 (8 trials: one measured batch, one update) from the
    KB's checkpoint directory: (its database folder, its MLflow store URI, its JSON line)."""
    d = tmp_path_factory.mktemp("fine-tune")
    uri = f"sqlite:///{d}/mlflow.db"
    proc = run_tcl("tune", "--platform", PLATFORM, "--workload", "dense_64", "--trials", 8, "--cost-model", "tcl",
                   "--model", kb_checkpoint, "--fine-tune", "--out", d / "tuned", "--min-repeat-ms", 0,
                   "--repeat", 1, "--no-progress", "--json", env={"MLFLOW_TRACKING_URI": uri})
    return d / "tuned", uri, tune_json(proc)


def test_tcl_tune_fine_tune_records_the_switch_and_its_updates(fine_tuned_run):
    import mlflow
    from mlflow.tracking import MlflowClient

    out, uri, result = fine_tuned_run
    (task,) = result["tasks"]
    assert task["trials"] == 8 and 0 < task["best_latency_s"] < 1
    assert json.loads((out / "tune.json").read_text())["fine_tune"] is True
    client = MlflowClient(tracking_uri=uri)  # the run's own store (mlflow's default is another test's)
    (run,) = client.search_runs([client.get_experiment_by_name("tcl-tune").experiment_id])
    assert run.data.params["fine_tune"] == "True"
    stats = mlflow.artifacts.load_dict(f"{run.info.artifact_uri}/tune_curves.json")["stats"]
    assert stats["measured"] == 8 and len(stats["fine_tune"]) == 1
    (update,) = stats["fine_tune"]
    assert 2 <= update["measured"] <= 8 and update["tasks"] == 1
    # the loss on the measurements never rises; the model is swapped when it fell
    assert update["loss_after"] <= update["loss_before"]
    assert stats["updates"] == int(update["loss_after"] < update["loss_before"])


def test_fine_tuning_learns_the_runs_measurements(fine_tuned_run, kb_checkpoint):
    """update() with the programs a tuning run measured: the served (ONNX) scores change, the
    ranking loss of those scores on the measured programs falls, and no score of the previous
    model is served from the cache afterwards. The programs' features here come from the
    database file through ingest's reader, not from the tuner. Their latencies are set to reverse
    the KB's own ranking, 2x apart: the run's real ones (8 programs timed once) can be near-tied,
    and an update that finds nothing better rightly keeps the model (a CI run of 2026-12-03)."""
    import orjson
    import torch
    from tvm.s_tir import Schedule
    from tvm.s_tir import meta_schedule as ms
    from tvm.target import Target
    from tvm.tirx.expr import FloatImm

    from tcl.features import Featurizer
    from tcl.losses import lambdarank_loss
    from tcl.records.metaschedule import trace_to_steps
    from tcl.tuner.cost_model import TCLCostModel

    out, _, _ = fine_tuned_run
    (workload_line,) = (out / "database_workload.json").read_text().splitlines()
    workload = ms.database.Workload.from_json(json.loads(workload_line))
    lines = [orjson.loads(line) for line in (out / "database_tuning_record.json").read_text().splitlines()]
    assert len(lines) == 8
    candidates = []
    for line in lines:  # each line: a program the run measured
        record = ms.database.TuningRecord.from_json(line[1], workload)
        sch = Schedule(workload.mod)
        record.trace.apply_to_schedule(sch, remove_postproc=False)
        candidates.append(ms.MeasureCandidate(sch, record.args_info))
    x, mask = Featurizer(48)([trace_to_steps(line[1][0]) for line in lines])

    ctx = ms.TuneContext(mod=workload.mod, target=Target({"kind": "llvm", "mcpu": "znver4",
                                                                     "num-cores": 2}), task_name="dense_64")
    # a small rate: the first steps lower the loss (larger ones can overshoot; update() then keeps
    # the start and the model is not swapped)
    cm = TCLCostModel(str(kb_checkpoint), family=FAMILY, fine_tune=True, fine_tune_params={"steps": 30, "lr": 1e-4})
    before = cm.predictor.predict(x, mask)
    rank = np.argsort(np.argsort(-before))  # 0: the program the KB scores best
    latency = 1e-4 * 2.0 ** (len(rank) - 1 - rank)  # the KB's best is the slowest
    results = [ms.runner.RunnerResult(run_secs=[FloatImm("float64", float(s))], error_msg=None) for s in latency]
    y = latency.min() / latency  # by hand: best in the task / latency

    def loss(scores):
        return float(lambdarank_loss(torch.from_numpy(scores.astype(np.float64)), torch.from_numpy(y),
                                     torch.zeros(len(y), dtype=torch.int64)))

    served_before = cm.predict(ctx, candidates)
    cm.update(ctx, candidates, results)
    after = cm.predictor.predict(x, mask)
    assert cm.stats.updates == 1 and cm.stats.measured == 8
    assert np.max(np.abs(after - before)) > 1e-4
    assert loss(after) < loss(before)
    (history,) = cm.stats.fine_tune  # the tuner's own account agrees with the served model's scores
    assert history["measured"] == 8
    assert history["loss_after"] == pytest.approx(loss(after), rel=1e-3, abs=1e-6)
    served = cm.predict(ctx, candidates)
    assert cm.stats.cached == 0  # the previous model's scores were forgotten
    np.testing.assert_allclose(served, 1.0 / (1.0 + np.exp(-after.astype(np.float64))), rtol=1e-5)
    assert not np.allclose(served, served_before)


def test_fine_tune_update_keeps_the_start_unless_the_loss_falls(kb_checkpoint):
    """KBFineTuner.update: programs all equally fast teach nothing (no update, weights bit for bit
    the start's); latencies that reverse the KB's ranking lower the loss and export a new net, and
    the next update starts from it."""
    import torch

    from tcl.features import Featurizer
    from tcl.tuner.fine_tune import KBFineTuner
    from tcl.tuner.traces import candidate_steps

    _, _, _, candidates, _ = dense_candidates(8)
    x, mask = Featurizer(48)(candidate_steps(candidates))
    tuner = KBFineTuner.from_source(str(kb_checkpoint), FAMILY, {"steps": 30, "lr": 1e-4})
    start = {k: v.clone() for k, v in tuner.model.net.state_dict().items()}
    tuner.add("dense_64", x, mask, np.full(8, 1e-4))
    assert tuner.update() is None
    (first,) = tuner.history
    assert first["loss_after"] == first["loss_before"]
    assert all(torch.equal(v, start[k]) for k, v in tuner.model.net.state_dict().items())

    tuner = KBFineTuner.from_source(str(kb_checkpoint), FAMILY, {"steps": 30, "lr": 1e-4})
    rank = np.argsort(np.argsort(-tuner.model.predict(x, mask)))  # 0: the KB's best
    tuner.add("dense_64", x, mask, 1e-4 * 2.0 ** (7 - rank))  # ... is the slowest
    assert isinstance(tuner.update(), bytes)
    (update,) = tuner.history
    assert update["loss_after"] < update["loss_before"]
    assert update["loss_after"] == pytest.approx(tuner.loss(), rel=1e-9)  # the net kept is the one measured
    assert any(not torch.equal(v, start[k]) for k, v in tuner.model.net.state_dict().items())


@pytest.mark.parametrize("kind", ["xgb", "random"])
def test_metaschedule_s_own_cost_models_are_counted_like_tcl_s(kind):
    """xgb and random are MetaSchedule's models as they are, their predict calls counted and timed
    (tcl tune reports predict_calls / candidates_scored / predict_seconds for every model)."""
    from tcl.tuner.baselines import make_cost_model

    _, _, ctx, candidates, _ = dense_candidates(6)
    cm, stats = make_cost_model(kind, None, FAMILY, seed=0, threads=1)
    scores = cm.predict(ctx, candidates)
    assert scores.shape == (6,) and np.isfinite(scores).all()
    cm.predict(ctx, candidates[:2])
    assert (stats.predict_calls, stats.candidates_scored) == (2, 8) and stats.predict_seconds > 0


def test_fine_tune_settings_of_one_run_go_over_params_yaml(kb_checkpoint):
    """A study tries fine-tuning settings run by run (tune(..., fine_tune_settings=...)): they reach
    the fine-tuner over params.yaml's tune.fine_tune, and a misspelt one is refused."""
    from tcl.tuner.baselines import make_cost_model
    from tcl.tuner.fine_tune import fine_tune_params

    cm, _ = make_cost_model("tcl", str(kb_checkpoint), FAMILY, seed=0, threads=1, fine_tune=True,
                            fine_tune_settings={"lr": 0.002})
    assert cm.fine_tuner.p == {**fine_tune_params(), "lr": 0.002}
    with pytest.raises(ValueError, match="stpes"):
        make_cost_model("tcl", str(kb_checkpoint), FAMILY, seed=0, threads=1, fine_tune=True,
                        fine_tune_settings={"stpes": 3})


def test_fine_tune_needs_a_checkpoint(kb, tmp_path, store):
    from click.testing import CliRunner

    from tcl.cli import main
    from tcl.tuner.cost_model import TCLCostModel
    from tcl.tuner.fine_tune import CheckpointNeeded

    with pytest.raises(CheckpointNeeded, match="needs the KB's torch checkpoint.*an .onnx file"):
        TCLCostModel(str(kb), family=FAMILY, fine_tune=True)
    with pytest.raises(CheckpointNeeded, match="no model.pt"):
        TCLCostModel(str(tmp_path), family=FAMILY, fine_tune=True)  # a folder without a checkpoint
    res = CliRunner().invoke(main, ["tune", "--platform", PLATFORM, "--workload", "dense_64", "--trials", "8",
                                    "--cost-model", "tcl", "--model", str(kb), "--fine-tune", "--no-progress",
                                    "--out", str(tmp_path / "o")])
    assert res.exit_code == 1 and "torch checkpoint" in res.output
    res = CliRunner().invoke(main, ["tune", "--platform", PLATFORM, "--workload", "dense_64", "--trials", "8",
                                    "--cost-model", "random", "--fine-tune", "--no-progress",
                                    "--out", str(tmp_path / "r")])
    assert res.exit_code == 1 and "--fine-tune is for --cost-model tcl" in res.output
    bad = tmp_path / "kb.onnx"
    bad.write_bytes(b"not a graph")  # a clean error, not onnx's traceback
    res = CliRunner().invoke(main, ["tune", "--platform", PLATFORM, "--workload", "dense_64", "--trials", "8",
                                    "--cost-model", "tcl", "--model", str(bad), "--no-progress",
                                    "--out", str(tmp_path / "b")])
    assert res.exit_code == 1 and f"{bad}: not an ONNX model onnxruntime can load" in res.output
    ckpt = tmp_path / "trained"
    ckpt.mkdir()
    (ckpt / "model.pt").write_bytes(b"")  # a training directory: pointed to tcl export, never unpickled
    for given in (ckpt, ckpt / "model.pt"):
        res = CliRunner().invoke(main, ["tune", "--platform", PLATFORM, "--workload", "dense_64", "--trials", "8",
                                        "--cost-model", "tcl", "--model", str(given), "--no-progress",
                                        "--out", str(tmp_path / "c")])
        assert res.exit_code == 1 and "a torch training checkpoint, not an ONNX KB" in res.output
        assert f"tcl export {ckpt / 'model.pt'}" in res.output
    res = CliRunner().invoke(main, ["tune", "--platform", PLATFORM, "--workload", "dense_64", "--trials", "8",
                                    "--cost-model", "mlp", "--model", str(tmp_path / "missing"), "--no-progress",
                                    "--out", str(tmp_path / "m")])
    assert res.exit_code == 1 and "missing" in res.output and not isinstance(res.exception, FileNotFoundError)


def test_tune_serves_the_family_s_candidate_until_one_is_promoted(kb, kb_checkpoint, tmp_path, store):
    """Without --model, tcl serves models:/tcl-kb-<family>@production; right after the main job
    (which registers at @candidate) it serves the candidate, says so, and records which KB ran."""
    from click.testing import CliRunner

    from tcl import registry, tracking
    from tcl.cli import main

    def tune(out):
        return CliRunner().invoke(main, ["tune", "--platform", PLATFORM, "--workload", "dense_64", "--trials", "8",
                                         "--cost-model", "tcl", "--min-repeat-ms", "0", "--repeat", "1",
                                         "--no-progress", "--json", "--out", str(out)])

    res = tune(tmp_path / "none")
    assert res.exit_code == 1 and f"no registered KB for family '{FAMILY}'" in res.output
    with tracking.start_run("tcl-test", run_name="train") as run:
        run_id = run.info.run_id
    registry.register_kb(kb_checkpoint / "model.pt", FAMILY, [PLATFORM], run_id, {"top1": 0.5, "top5": 0.9},
                         "E1", "D1", onnx_path=kb)
    res = tune(tmp_path / "cand")
    assert res.exit_code == 0, res.output
    assert f"warning: tcl-kb-{FAMILY} has no @production version; using @candidate (version 1)" in res.stderr
    assert json.loads(res.stdout.splitlines()[-1])["tasks"][0]["trials"] == 8
    used = json.loads((tmp_path / "cand" / "tune.json").read_text())["model"]
    assert used == f"models:/tcl-kb-{FAMILY}@candidate"
    registry.promote(FAMILY, "1")
    assert registry.default_kb_uri(FAMILY) == (f"models:/tcl-kb-{FAMILY}@production", None)


def test_candidate_features_fall_back_to_the_featurizer_for_what_the_library_refuses():
    """A string with '$' (Ansor's "token$number", whose number Python's float() reads) sends the
    batch through the steps and the Featurizer; the features are then theirs."""
    from tvm.s_tir import meta_schedule as ms

    from tcl.features import Featurizer
    from tcl.tuner.traces import CandidateFeatures, candidate_steps, trace_library

    if trace_library() is None:
        pytest.skip("TCL's trace library is not built")
    _, _, _, candidates, _ = dense_candidates(3)
    sch = candidates[0].sch.copy()
    block = sch.get_child_blocks(sch.get_sblock("root"))[0]
    sch.annotate(block, "pragma_tcl", "auto_unroll_max_step$16")
    odd = [ms.MeasureCandidate(sch, candidates[0].args_info), *candidates[1:]]
    features = CandidateFeatures(Featurizer(48))
    x, mask = features(odd)
    assert features.path == "steps"
    steps = candidate_steps(odd, use_library=False)
    assert ["Annotate", "auto_unroll_max_step$16", "pragma_tcl"] in steps[0]
    x_ref, m_ref = Featurizer(48)(steps)
    assert x.tobytes() == x_ref.tobytes() and mask.tobytes() == m_ref.tobytes()
    features(candidates)  # the next batch takes the library again
    assert features.path == "library"


def test_exploration_ranks_a_share_at_random_only_while_a_task_stalls():
    """tcl.tuner.explore: a task counts as stalled after `patience` measured batches without a new
    best `min_gain` below the last; while stalled, `apply` gives about `share_max` of a chunk a
    score drawn from the same chunk (the scores' multiset is kept), seeded; a new best ends it."""
    from tcl.tuner.explore import Exploration, explore_params

    e = Exploration(explore_params({"share_max": 0.25, "patience": 2, "min_gain": 0.01}), seed=3)
    scores = np.linspace(0.01, 0.99, 2000)
    assert e.apply("a", scores) is scores  # nothing measured yet: the KB's ranking as it is
    inf = float("inf")
    for batch, stalled in (([3.0, 2.0, inf], 0), ([1.995, 2.5], 1), ([inf, inf], 2)):
        e.observe("a", np.array(batch))   # 1.995 is 0.25 % below 2.0: not progress
        assert e.stalled["a"] == stalled
    assert e.best["a"] == 1.995 and e.share("a") == 0.25 and e.share("b") == 0.0
    out = e.apply("a", scores)
    changed = np.mean(out != scores)
    assert 0.2 < changed < 0.3
    assert set(out) <= set(scores)  # drawn from the chunk, not invented
    assert e.apply("b", scores) is scores  # another task keeps its own count
    again = Exploration(explore_params({"share_max": 0.25, "patience": 2}), seed=3)
    for batch in ([3.0, 2.0, inf], [1.995, 2.5], [inf, inf]):
        again.observe("a", np.array(batch))
    assert np.array_equal(again.apply("a", scores), out)  # the run's seed fixes the draws
    e.observe("a", np.array([1.9]))  # 4.8 % below: progress, the KB steers again
    assert e.share("a") == 0.0 and e.apply("a", scores) is scores
    assert [h["stalled"] for h in e.history] == [0, 1, 2, 0]
    with pytest.raises(ValueError, match="share_max"):
        explore_params({"share_max": 1.5})
    with pytest.raises(ValueError, match=r"unknown tune.explore settings \['shar_max'\]"):
        explore_params({"shar_max": 0.2})


def test_tune_with_explore_records_each_batch_and_is_for_tcl_only(kb, tmp_path, store):
    """A real run with `explore` (any batch short of halving the best stalls it): one reading per
    measured batch in the stats, the settings in tune.json; a peer refuses the switch."""
    from click.testing import CliRunner

    from tcl.cli import main
    from tcl.collect.measure import MeasureSettings
    from tcl.collect.workloads import build_workload, resolve_workload
    from tcl.hardware import get_platform
    from tcl.tuner.tune import TuneTask, tune

    task = TuneTask("dense_64", build_workload(resolve_workload("dense_64")))
    explore = {"share_max": 0.5, "patience": 1, "min_gain": 0.5}
    result = tune(get_platform(PLATFORM), [task], 12, "tcl", tmp_path / "db", model=str(kb), progress=False,
                  trials_per_iter=4, settings=MeasureSettings(repeat=1, min_repeat_ms=0), explore=explore)
    readings = result["stats"]["explore"]
    assert [r["measured"] for r in readings] == [4, 4, 4] and result["tasks"][0]["trials"] == 12
    assert readings[0]["stalled"] == 0 and readings[0]["share"] == 0.0  # the first best is progress
    for r in readings[1:]:
        assert r["share"] == (0.5 if r["stalled"] >= 1 else 0.0)
    assert json.loads((tmp_path / "db" / "tune.json").read_text())["explore"] == explore
    res = CliRunner().invoke(main, ["tune", "--platform", PLATFORM, "--trials", "8", "--workload", "dense_64",
                                    "--cost-model", "xgb", "--explore", "0.2", "--out", str(tmp_path / "x"),
                                    "--no-progress"])
    assert res.exit_code == 2 and "--explore is for --cost-model tcl" in res.output
    assert not (tmp_path / "x").exists()


def test_online_blend_reorders_the_kb_s_own_scores_by_both_ranks():
    """tcl.tuner.online.blend_ranks: the chunk keeps the KB's scores (the same multiset) and hands
    them out by (1 - w) KB rank + w XGBoost rank: w 0 is the KB's order, w 1 XGBoost's, a tie
    goes to the KB's order."""
    from tcl.tuner.online import blend_ranks, online_for, online_params

    scores = np.array([0.9, 0.1, 0.5, 0.3])   # the KB: 0 > 2 > 3 > 1
    online = np.array([0.0, 3.0, 1.0, 2.0])   # XGBoost: 1 > 3 > 2 > 0
    assert np.array_equal(blend_ranks(scores, online, 0.0), scores)
    assert np.array_equal(blend_ranks(scores, online, 1.0), [0.1, 0.9, 0.3, 0.5])
    half = blend_ranks(scores, online, 0.5)
    assert sorted(half) == sorted(scores)
    # blended ranks 0.5, 0.5, 0.5, 0.5: every tie, so the KB's order stands
    assert np.array_equal(half, scores)
    quarter = blend_ranks(scores, online, 0.25)  # 0.75, 0.25, 0.583, 0.417: the KB's order still
    assert np.array_equal(quarter, scores)
    three_quarters = blend_ranks(scores, online, 0.75)  # 0.25, 0.75, 0.417, 0.583: XGBoost's order
    assert np.array_equal(three_quarters, [0.1, 0.9, 0.3, 0.5])
    with pytest.raises(ValueError, match="weight"):
        online_params({"weight": 1.5})
    with pytest.raises(ValueError, match=r"unknown tune.online settings \['wieght'\]"):
        online_params({"wieght": 0.5})
    assert online_for("xgb") is None
    with pytest.raises(ValueError, match="--online-weight is for --cost-model tcl"):
        online_for("random", {"weight": 0.5})


def test_tune_with_xgboost_beside_the_kb_blends_once_it_has_trained(kb, tmp_path, store):
    """A real run with `online` (warm-up 8 of 16 trials): XGBoost learns every measured batch and
    ranks candidates after its warm-up, its seconds are counted, the settings are in tune.json; a
    peer refuses the switch."""
    from click.testing import CliRunner

    from tcl.cli import main
    from tcl.collect.measure import MeasureSettings
    from tcl.collect.workloads import build_workload, resolve_workload
    from tcl.hardware import get_platform
    from tcl.tuner.online import online_params
    from tcl.tuner.tune import TuneTask, tune

    task = TuneTask("dense_64", build_workload(resolve_workload("dense_64")))
    online = {"weight": 0.5, "warmup": 8}
    result = tune(get_platform(PLATFORM), [task], 16, "tcl", tmp_path / "db", model=str(kb), progress=False,
                  trials_per_iter=4, settings=MeasureSettings(repeat=1, min_repeat_ms=0), online=online)
    assert result["tasks"][0]["trials"] == 16 and result["stats"]["measured"] == 16
    s = result["stats"]
    assert s["online_train_seconds"] > 0 and s["online_blended"] > 0
    assert 0 < s["online_score_seconds"] < s["predict_seconds"]
    assert json.loads((tmp_path / "db" / "tune.json").read_text())["online"] == online_params(online)
    res = CliRunner().invoke(main, ["tune", "--platform", PLATFORM, "--trials", "8", "--workload", "dense_64",
                                    "--cost-model", "xgb", "--online-weight", "0.5", "--out", str(tmp_path / "x"),
                                    "--no-progress"])
    assert res.exit_code == 2 and "--online-weight is for --cost-model tcl" in res.output
    assert not (tmp_path / "x").exists()


def test_bench_fine_tune_replays_a_run_s_updates_per_setup(kb_checkpoint, tmp_path):
    """`tcl bench fine-tune`: the updates of a run replayed on a feature file's programs, once per
    setup (threads x scan x export, the first the baseline); every setup learns the same (the
    final loss: threads and the torch/C++ scans differ by float rounding, the exports not at
    all), and the process's own torch setting is back after each update."""
    import torch

    from tcl.features import FeatureSet, featurize_file
    from tcl.records.ingest import ingest
    from tcl.tuner.fine_tune import KBFineTuner

    ingest(fixture_path("metaschedule/dense_256"), PLATFORM, tmp_path / "d.parquet")
    featurize_file(tmp_path / "d.parquet", tmp_path / "d.npz", max_len=48)
    before = torch.get_num_threads()
    proc = run_tcl("bench", "fine-tune", "--model", kb_checkpoint, "--data", tmp_path / "d.npz", "--trials", 24,
                   "--trials-per-iter", 8, "--threads", "1,2", "--scan", "fast,fused", "--export", "full", "--json")
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    setups = [(r["threads"], r["scan"], r["export"]) for r in report["runs"]]
    assert setups == [(1, "fast", "full"), (1, "fused", "full"), (2, "fast", "full"), (2, "fused", "full")]
    base = report["runs"][0]
    assert base["speedup"] == 1.0 and all(r["updates"] == 3 and r["seconds"] > 0 for r in report["runs"])
    for r in report["runs"]:
        assert r["final_loss"] == pytest.approx(base["final_loss"], rel=1e-4)
    assert "the baseline (1, fast, full)" in proc.stderr
    exports = json.loads(run_tcl("bench", "fine-tune", "--model", kb_checkpoint, "--data", tmp_path / "d.npz",
                                 "--trials", 16, "--trials-per-iter", 8, "--threads", "1", "--scan", "fused",
                                 "--json").stdout.strip().splitlines()[-1])["runs"]
    assert [r["export"] for r in exports] == ["full", "reexport"]
    assert exports[1]["final_loss"] == exports[0]["final_loss"]
    too_many = run_tcl("bench", "fine-tune", "--model", kb_checkpoint, "--data", tmp_path / "d.npz",
                       "--trials", 100000, check=False)
    assert too_many.returncode == 1 and "fewer than --trials 100000" in too_many.stderr

    tuner = KBFineTuner.from_source(kb_checkpoint, FAMILY, {"threads": 2})
    fs = FeatureSet.load(tmp_path / "d.npz")
    tuner.add("t", fs.x[:16], fs.mask[:16], fs.latency[:16])
    tuner.update()
    assert torch.get_num_threads() == before
