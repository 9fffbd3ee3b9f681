"""`tcl collect --sample`: candidates generated unmeasured, only the sampler's choice measured with
real TVM, the normal database written, resumable (tcl.sampling.active)."""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from tcl.records import Record
from tcl.collect.networks import Task
from tcl.collect.workloads import resolve_workload
from tcl.features import featurize_table
from tcl.hardware import get_platform
from tcl.records.ingest import ingest, read_records
from tcl.records.metaschedule import read_database
from tcl.sampling import make_sampler
from tcl.sampling.active import STATE_FILE, generate_candidates, round_plan
from tests.test_sampling import blobs, settings

from .conftest import LOCAL_PLATFORM, REPO, run_tcl, stop_process_tree

PLATFORM = LOCAL_PLATFORM  # measured on this host
PARAMS = REPO / "params.yaml"


def _args(db, budget, pool_size=32, rounds=2, *extra):
    return ["collect", "--platform", PLATFORM, "--out", db, "--workload", "dense_64", "--sample", "rdu",
            "--budget", budget, "--rounds", rounds, "--pool-size", pool_size, "--min-repeat-ms", "1",
            "--params", PARAMS, "--json", *extra]


def _summary(proc) -> dict:
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _dense_64():
    from tcl.collect.workloads import build_workload, resolve_workload

    return build_workload(resolve_workload("dense_64"))


def _db_programs(db) -> list[str]:
    """Program ids of the database's records (as `tcl collect` resumes by), one per record line."""
    from tcl.collect.measure import existing_programs, open_database

    lines = (db / "database_tuning_record.json").read_text().splitlines()
    ids = existing_programs(open_database(db), _dense_64())
    assert len(ids) == len(lines), "a program recorded twice"
    return sorted(ids)


def _reference_pool(n: int) -> set[str]:
    """The programs a plain `tcl collect --trials n --seed 0` draws for dense_64."""
    from tcl.collect.measure import sample_programs

    return {pid for _, _, pid in sample_programs(_dense_64(), get_platform(PLATFORM).target, n, seed=0)}


def _chosen(db) -> list[str]:
    state = json.loads((db / STATE_FILE).read_text())
    return [pid for r in state["rounds"] for pid in r["programs"]]


@pytest.mark.slow
def test_only_the_chosen_budget_is_measured_and_a_larger_budget_resumes(tmp_path):
    db = tmp_path / "db"
    summary = _summary(run_tcl(*_args(db, 4)))
    assert (summary["measured"], summary["present"], summary["pool"]) == (4, 0, 32)
    assert (summary["runner_restarts"], summary["hung_runs"]) == (0, 0)  # the measuring guard kept still
    assert [r["selected"] for r in summary["rounds"]] == [2, 2]
    measured = _db_programs(db)
    # exactly the budget, exactly the programs the sampler chose, all from the candidate pool a
    # plain collection would draw: the 28 unchosen were never measured, so no label of theirs exists
    assert len(measured) == 4 and measured == sorted(_chosen(db))
    assert json.loads((db / STATE_FILE).read_text())["measured"] == measured
    assert set(measured) <= _reference_pool(32)
    report = ingest(db, PLATFORM, tmp_path / "r.parquet")
    assert report.records + sum(summary["failed"].values()) == 4 and report.tasks == 1
    # the pool's features of the measured programs are what `tcl featurize` makes of the ingested
    # records: a model trained on the collected data scores the pool as the sampler saw it
    fs = featurize_table(read_records(tmp_path / "r.parquet"))
    pool = generate_candidates([Task("dense_64_64_64", resolve_workload("dense_64"), {})],
                               get_platform(PLATFORM), 32, 0, fs.meta["max_len"]).pool
    row = {pid: i for i, pid in enumerate(pool.task_info["program_id"])}
    pool_x = sorted(pool.x[row[pid]].tobytes() for pid in measured)
    assert len(fs) == report.records and all(x.tobytes() in pool_x for x in fs.x)
    records = [r for r in read_database(db, PLATFORM) if isinstance(r, Record)]
    assert all(0 < r.latency < 1 for r in records) and records[0].task_id == "dense_64_64_64"

    # another pool (a different --pool-size) is refused, naming the state file; nothing measured
    proc = run_tcl(*_args(db, 8, 16), check=False)
    assert proc.returncode == 2 and STATE_FILE in proc.stderr and "pool_size" in proc.stderr
    assert len(_db_programs(db)) == 4

    # a larger budget measures only the difference, in a new round; the first records stay as they were
    before = (db / "database_tuning_record.json").read_text().splitlines()
    summary = _summary(run_tcl(*_args(db, 6)))
    assert (summary["measured"], summary["present"]) == (2, 4)
    assert [(r["round"], r["selected"]) for r in summary["rounds"]] == [(2, 2)]
    after = (db / "database_tuning_record.json").read_text().splitlines()
    assert after[:4] == before and len(after) == 6
    assert _db_programs(db) == sorted(_chosen(db)) and len(set(_chosen(db))) == 6


@pytest.mark.slow
def test_a_round_interrupted_while_measuring_resumes_with_the_programs_it_chose(tmp_path):
    db = tmp_path / "db"
    args = [sys.executable, "-m", "tcl.cli", *map(str, _args(db, 4))]
    log = tmp_path / "stderr.log"
    with log.open("wb") as err:  # a deadline for a busy machine (TVM import, 2 builds, a retrain)
        # killed, the run cannot remove its temporary files: they go under tmp_path, not /tmp
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
                                env={**os.environ, "TMPDIR": str(tmp_path)})
    state, deadline = None, time.monotonic() + 600
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            path = db / STATE_FILE
            if path.exists():
                s = json.loads(path.read_text())
                if len(s["rounds"]) == 1 and s["pending"]:  # round 1 chosen, being measured
                    state = s
                    break
            time.sleep(0.02)
    finally:
        stop_process_tree(proc)
    assert state is not None, ("the run never reached its second round's measurement:\n"
                               + log.read_text(errors="replace")[-3000:])
    first, pending = state["rounds"][0]["programs"], state["pending"]
    assert len(first) == 2 and len(pending) == 2
    on_disk = len(_db_programs(db))
    assert 2 <= on_disk <= 4

    summary = _summary(run_tcl(*_args(db, 4)))
    # the interrupted round is finished with the programs it chose; nothing is chosen anew
    assert summary["measured"] == 4 - on_disk and summary["rounds"] == []
    assert _db_programs(db) == sorted(first + pending)
    assert json.loads((db / STATE_FILE).read_text())["pending"] == []


@pytest.mark.slow
def test_a_given_model_serves_uncertainty_from_the_first_round(tmp_path):
    from tcl.features import Featurizer
    from tcl.models import new_model

    kb = tmp_path / "kb.pt"
    # dropout on: MC dropout is the uncertainty a model brings before any label
    new_model("mlp", Featurizer(48).n_features, {"hidden": 16, "n_layers": 1, "dropout": 0.3}).save(kb)
    db = tmp_path / "db"
    summary = _summary(run_tcl(*_args(db, 2, 16, 1, "--model", kb)))
    assert summary["measured"] == 2 and len(_db_programs(db)) == 2
    assert summary["rounds"][0]["uncertainty"] == "mc-dropout"
    # --model repeated: an ensemble, whose disagreement joins the first model's MC dropout
    other = tmp_path / "kb-2.pt"
    new_model("mlp", Featurizer(48).n_features, {"hidden": 16, "n_layers": 1}).save(other)
    summary = _summary(run_tcl(*_args(tmp_path / "db-ensemble", 2, 16, 1, "--model", kb, "--model", other)))
    assert summary["measured"] == 2 and summary["rounds"][0]["uncertainty"] == "mc-dropout+ensemble-2"


def test_cli_refuses_incomplete_active_requests(tmp_path):
    base = ["collect", "--platform", PLATFORM, "--out", tmp_path / "db", "--workload", "dense_64"]
    proc = run_tcl(*base, "--sample", "rdu", check=False)
    assert proc.returncode == 2 and "--sample needs --budget" in proc.stderr
    proc = run_tcl(*base, "--budget", "4", "--trials", "4", check=False)
    assert proc.returncode == 2 and "need --sample" in proc.stderr
    proc = run_tcl(*base, "--sample", "rdu", "--budget", "4", "--trials", "4", check=False)  # --trials ignored
    assert proc.returncode == 2 and "--trials is a plain collection's" in proc.stderr
    proc = run_tcl(*base, check=False)
    assert proc.returncode == 2 and "give --trials" in proc.stderr
    assert not (tmp_path / "db").exists()


@pytest.mark.slow
def test_a_budget_beyond_the_pool_is_refused_before_measuring(tmp_path):
    proc = run_tcl(*_args(tmp_path / "db", 9, 8), check=False)
    assert proc.returncode == 2 and "budget 9 exceeds the pool: 8 candidate programs" in proc.stderr
    assert not (tmp_path / "db" / "database_tuning_record.json").exists() or not _db_programs(tmp_path / "db")


@pytest.mark.parametrize("budget,rounds,measured,expected", [
    (8, 2, 0, [(0, 4), (1, 4)]),
    (8, 2, 4, [(1, 4)]),
    (10, 3, 5, [(1, 2), (2, 3)]),   # rounds of 4, 3, 3: five measured fill round 0 and one of round 1
    (4, 2, 6, []),
])
def test_round_plan_leaves_what_is_measured_out_of_the_rounds(budget, rounds, measured, expected):
    assert round_plan(budget, rounds, measured) == expected


@pytest.mark.parametrize("strategy", ["rdu", "balto"])
def test_known_programs_are_never_chosen_nor_revealed_and_unchosen_labels_are_unread(strategy, one_torch_thread):
    from tcl.sampling import Pool

    fs = blobs(n_blobs=4, per_blob=20, seed=3)
    known = np.array([0, 21, 42, 63, 5, 30, 50, 70, 11, 33])

    def run(latency):
        asked = []

        def reveal(index):
            asked.append(np.array(index))
            return latency[index]

        sampler = make_sampler(strategy, settings(), seed=1, rounds=2)
        sel = sampler.select(Pool.from_features(fs), 8, reveal, known=(known, latency[known]), first_round=3)
        return sel, asked

    sel, asked = run(fs.latency)
    assert len(sel.indices) == 8 and not np.isin(sel.indices, known).any()
    assert np.array_equal(np.concatenate(asked), sel.indices)
    assert [r["round"] for r in sel.rounds] == [3, 4]
    # permuting the labels of every program neither known nor chosen changes nothing
    hidden = np.setdiff1d(np.arange(len(fs)), np.concatenate([known, sel.indices]))
    latency = fs.latency.copy()
    latency[hidden] = np.random.default_rng(0).permutation(latency[hidden])
    again, _ = run(latency)
    assert np.array_equal(again.indices, sel.indices)


def test_retraining_between_rounds_leaves_the_given_model_unchanged(one_torch_thread):
    """Each round retrains a copy: the family's KB a collection starts from is never changed."""
    import torch

    from tcl.models import new_model
    from tcl.sampling import Pool
    from tests.test_training import F

    fs = blobs(n_blobs=4, per_blob=20, seed=3)
    model = new_model("mlp", F, {"hidden": 16, "n_layers": 1})
    before = {k: v.clone() for k, v in model.net.state_dict().items()}
    known = np.array([0, 21, 42, 63])
    sampler = make_sampler("rdu", settings(), seed=1, rounds=2)
    sampler.select(Pool.from_features(fs), 8, lambda i: fs.latency[i], model=model,
                   known=(known, fs.latency[known]), first_round=1)
    assert sampler.learner.retrained == 2
    assert all(torch.equal(before[k], v) for k, v in model.net.state_dict().items())
