"""Sampling (tcl.sampling, `tcl sample`): RDU and its baselines choose from a pool without labels."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tcl.features import FeatureSet, task_labels
from tcl.models.base import CostModel
from tcl.sampling import STRATEGIES, Pool, SampleSettings, SamplingError, make_sampler
from tcl.sampling import space
from tcl.sampling.learner import DEFAULTS
from tcl.sampling.subset import sample_features
from tests.test_training import F, L, make_fs

TINY = {"models": {"mlp": {"hidden": 16, "n_layers": 1}},
        "sample": {"retrain": {"kind": "mlp", "preset": None, "train": {"epochs": 2, "batch_size": 32}}}}


def settings(**sample) -> SampleSettings:
    return SampleSettings.from_params({**TINY, "sample": {**TINY["sample"], **sample}})


def run(fs, strategy, budget, rounds=2, seed=0, model=None, **sample):
    """(selection, the indices reveal was asked for) of `strategy` on `fs`'s programs."""
    asked = []

    def reveal(index):
        asked.append(np.array(index))
        return fs.latency[index]

    sampler = make_sampler(strategy, settings(**sample), seed=seed, rounds=rounds)
    return sampler.select(Pool.from_features(fs), budget, reveal, model=model), asked, sampler


def blobs(n_blobs=8, per_blob=40, seed=0) -> FeatureSet:
    """Programs in well-separated groups: each group's steps are one random pattern plus small noise."""
    rng = np.random.default_rng(seed)
    n = n_blobs * per_blob
    centres = rng.standard_normal((n_blobs, L, F)).astype(np.float32) * 4
    group = np.repeat(np.arange(n_blobs), per_blob)
    x = centres[group] + 0.05 * rng.standard_normal((n, L, F)).astype(np.float32)
    mask = np.ones((n, L), bool)
    task = (np.arange(n) % 4).astype(np.int32)
    latency = rng.lognormal(0, 0.5, n)
    return FeatureSet(x=x, mask=mask, y=task_labels(task, latency), latency=latency, task=task,
                      program_id=np.array([f"b{i}" for i in range(n)]), tasks=[f"t{t}" for t in range(4)],
                      task_desc=[f"t{t}" for t in range(4)], task_weight=np.ones(4),
                      task_networks=[["net"]] * 4, platform="blobs", meta={"group": group.tolist()})


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_selection_ignores_the_labels_of_unchosen_programs(strategy, one_torch_thread):
    fs = make_fs(n_tasks=8, per_task=30, seed=0)
    first, asked, _ = run(fs, strategy, budget=36, rounds=3)
    # reveal was asked exactly for the chosen programs
    assert sorted(np.concatenate(asked).tolist()) == sorted(first.indices.tolist())
    unchosen = np.setdiff1d(np.arange(len(fs)), first.indices)
    permuted = fs.subset(np.arange(len(fs)))
    rng = np.random.default_rng(5)
    permuted.latency = permuted.latency.copy()
    permuted.latency[unchosen] = rng.permutation(permuted.latency[unchosen]) * rng.uniform(0.1, 10, len(unchosen))
    permuted.y = np.zeros_like(permuted.y)  # nothing may read y either
    second, _, _ = run(permuted, strategy, budget=36, rounds=3)
    assert np.array_equal(first.indices, second.indices)


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("budget,rounds", [(1, 1), (37, 2), (100, 3)])
def test_each_strategy_returns_the_budget_of_distinct_programs(strategy, budget, rounds, one_torch_thread):
    fs = make_fs(n_tasks=6, per_task=20, seed=1)
    sel, _, _ = run(fs, strategy, budget, rounds=rounds, **{"retrain": {"kind": "none"}})
    assert len(sel.indices) == budget == len(np.unique(sel.indices))
    assert sel.indices.min() >= 0 and sel.indices.max() < len(fs)
    assert sum(r["selected"] for r in sel.rounds) == budget and len(sel.rounds) == min(rounds, budget)


@pytest.mark.parametrize("strategy", ["rdu", "random", "balto"])
def test_a_seed_fixes_the_selection(strategy):
    fs = make_fs(n_tasks=6, per_task=30, seed=2)
    kw = {"retrain": {"kind": "none"}}
    a = run(fs, strategy, 30, rounds=2, seed=4, **kw)[0].indices
    b = run(fs, strategy, 30, rounds=2, seed=4, **kw)[0].indices
    c = run(fs, strategy, 30, rounds=2, seed=5, **kw)[0].indices
    assert np.array_equal(a, b)
    assert not np.array_equal(np.sort(a), np.sort(c))


@pytest.mark.parametrize("pool_ratio", [0.3, 0.5])
def test_rdu_chooses_from_a_pool_of_pool_ratio_of_the_unchosen(pool_ratio):
    fs = make_fs(n_tasks=10, per_task=30, seed=3)
    sel, _, sampler = run(fs, "rdu", 45, rounds=3, pool_ratio=pool_ratio, retrain={"kind": "none"})
    for r in sel.rounds:
        assert r["candidates"] == max(r["budget"], int(np.ceil(pool_ratio * r["pool"])))
    assert [r["pool"] for r in sel.rounds] == [300, 285, 270]
    # the last round's choice lies in its candidate pool, and that pool is the programs nearest
    # their cluster centres: a hand check of the representativeness pass
    last = sel.indices[-15:]
    assert np.isin(last, sampler.last_candidates).all()


def test_allocate_is_proportional_with_caps():
    # 10 over sizes 5:3:2 -> 5, 3, 2; with cluster 0 capped at 2, its 3 go to the others 3:2
    assert space.allocate(10, np.array([5, 3, 2]), np.array([9, 9, 9])).tolist() == [5, 3, 2]
    assert space.allocate(10, np.array([5, 3, 2]), np.array([2, 9, 9])).tolist() == [2, 5, 3]
    assert space.allocate(2, np.array([1, 1, 1, 1]), np.array([1, 1, 1, 1])).sum() == 2
    # two levels: strata 0 (weights 1+1) and 1 (weight 2) share 4 as 2:2, then inside stratum 0 1:1
    assert space.allocate_nested(4, np.array([1, 1, 2]), np.array([0, 0, 1]), np.array([5, 5, 5])).tolist() == [1, 1, 2]


def test_rdu_covers_every_group_and_skips_duplicates():
    fs = blobs(n_blobs=8, per_blob=40)
    group = np.asarray(fs.meta["group"])
    sel, _, _ = run(fs, "rdu", 8, rounds=1, retrain={"kind": "none"}, stratify="none")
    assert sorted(group[sel.indices].tolist()) == list(range(8))  # one per group
    # exact copies of each program: no copy is chosen while a distinct program remains
    dup = fs.subset(np.repeat(np.arange(len(fs)), 3))
    sel, _, _ = run(dup, "rdu", 40, rounds=2, retrain={"kind": "none"}, stratify="none")
    originals = sel.indices // 3
    assert len(np.unique(originals)) == 40
    # random selection misses groups at the same budget (the test can tell them apart)
    misses = [len(np.unique(group[run(fs, "random", 8, rounds=1, seed=s)[0].indices])) < 8 for s in range(5)]
    assert any(misses)


def test_rdu_stratified_by_task_gives_each_task_its_share():
    # tasks of 30, 60 and 90 programs: 24 picks -> 4, 8, 12 (hand computation); per round too
    fs = make_fs(n_tasks=6, per_task=30, seed=9)
    fs.task = np.asarray([0] * 30 + [1] * 60 + [2] * 90, np.int32)
    sel, _, _ = run(fs, "rdu", 24, rounds=1, retrain={"kind": "none"}, stratify="task")
    assert np.bincount(fs.task[sel.indices]).tolist() == [4, 8, 12]
    sel, _, _ = run(fs, "rdu", 24, rounds=2, retrain={"kind": "none"}, stratify="task")
    assert np.bincount(fs.task[sel.indices[:12]]).tolist() == [2, 4, 6]


def test_cold_start_then_model_backed_uncertainty(one_torch_thread):
    from tcl.models import new_model
    from tcl.training import seed_everything

    fs = make_fs(n_tasks=6, per_task=30, seed=4)
    cold, _, _ = run(fs, "rdu", 30, rounds=3)
    assert cold.rounds[0]["uncertainty"] == "none"           # R + D only: nothing is known yet
    assert all(r["uncertainty"] == "committee" for r in cold.rounds[1:])
    seed_everything(0)
    model = new_model("mlp", F, {"hidden": 16, "n_layers": 1, "dropout": 0.3})
    backed, _, _ = run(fs, "rdu", 30, rounds=3, model=model)
    assert backed.rounds[0]["uncertainty"] == "mc-dropout"   # the given model serves from round one
    assert backed.rounds[1]["uncertainty"] == "mc-dropout+committee"
    assert not np.array_equal(cold.indices[:10], backed.indices[:10])


def test_a_dropout_free_given_model_serves_mc_dropout_from_the_first_round(one_torch_thread):
    """The KB presets train without dropout: with mc_dropout > 0 a given model's Dropout layers run
    at that rate for the MC samples (and are restored); a cold run's fresh models are left as they are."""
    from tcl.models import new_model
    from tcl.training import seed_everything

    fs = make_fs(n_tasks=6, per_task=30, seed=4)
    seed_everything(0)
    kb = new_model("mlp", F, {"hidden": 16, "n_layers": 1})            # dropout 0, like a KB
    assert run(fs, "rdu", 30, rounds=1, model=kb)[0].rounds[0]["uncertainty"] == "none"  # the default: off
    backed, _, _ = run(fs, "rdu", 30, rounds=3, model=kb, mc_dropout=0.1)
    assert backed.rounds[0]["uncertainty"] == "mc-dropout@0.1"
    assert backed.rounds[1]["uncertainty"] == "mc-dropout@0.1+committee"
    assert all(m.p == 0 for m in kb.net.modules() if type(m).__name__ == "Dropout")
    off, _, _ = run(fs, "rdu", 30, rounds=3, model=kb, mc_dropout=0.0)
    assert off.rounds[0]["uncertainty"] == "none" and off.rounds[1]["uncertainty"] == "committee"
    assert not np.array_equal(backed.indices, off.indices)
    # unchosen labels stay unread with the switched-on dropout too
    unchosen = np.setdiff1d(np.arange(len(fs)), backed.indices)
    permuted = fs.subset(np.arange(len(fs)))
    permuted.latency = permuted.latency.copy()
    permuted.latency[unchosen] = np.random.default_rng(1).permutation(permuted.latency[unchosen])
    permuted.y = np.zeros_like(permuted.y)
    again, _, _ = run(permuted, "rdu", 30, rounds=3, model=kb, mc_dropout=0.1)
    assert np.array_equal(backed.indices, again.indices)
    # a cold run (the main job's sample stages) chooses the same whatever mc_dropout says
    cold, _, _ = run(fs, "rdu", 30, rounds=3, mc_dropout=0.3)
    assert np.array_equal(cold.indices, run(fs, "rdu", 30, rounds=3, mc_dropout=0.0)[0].indices)
    assert [r["uncertainty"] for r in cold.rounds] == ["none", "committee", "committee"]
    with pytest.raises(ValueError, match="mc_dropout"):
        settings(mc_dropout=1.0)


def test_an_ensemble_of_given_models_serves_its_disagreement_from_the_first_round(one_torch_thread):
    """Several given models (e.g. KBs of several seeds): the first serves the embedding, the sd of
    their within-task score ranks is an uncertainty from round one; the callers' models are never
    changed, one model in a list chooses as the model alone, and unchosen labels stay unread."""
    import torch

    from tcl.models import new_model
    from tcl.sampling.learner import Learner
    from tcl.training import seed_everything

    fs = make_fs(n_tasks=6, per_task=30, seed=4)
    kbs = []
    for seed in (0, 1):
        seed_everything(seed)
        kbs.append(new_model("mlp", F, {"hidden": 16, "n_layers": 1}))
    before = [{k: v.clone() for k, v in kb.net.state_dict().items()} for kb in kbs]
    ensemble, _, _ = run(fs, "rdu", 30, rounds=3, model=kbs)
    assert [r["uncertainty"] for r in ensemble.rounds] == ["ensemble-2", "ensemble-2+committee",
                                                           "ensemble-2+committee"]
    for kb, state in zip(kbs, before):
        assert all(torch.equal(v, state[k]) for k, v in kb.net.state_dict().items())
    alone, _, _ = run(fs, "rdu", 30, rounds=3, model=kbs[0])
    assert np.array_equal(alone.indices, run(fs, "rdu", 30, rounds=3, model=[kbs[0]])[0].indices)
    assert alone.rounds[0]["uncertainty"] == "none" and not np.array_equal(alone.indices, ensemble.indices)
    unchosen = np.setdiff1d(np.arange(len(fs)), ensemble.indices)
    permuted = fs.subset(np.arange(len(fs)))
    permuted.latency = permuted.latency.copy()
    permuted.latency[unchosen] = np.random.default_rng(1).permutation(permuted.latency[unchosen])
    permuted.y = np.zeros_like(permuted.y)
    assert np.array_equal(ensemble.indices, run(permuted, "rdu", 30, rounds=3, model=kbs)[0].indices)
    # the spread is the members' disagreement on each program's rank inside its task
    view = Learner(settings()).view(Pool.from_features(fs), kbs, np.zeros(0, np.int64), np.zeros(0),
                                    np.random.default_rng(0), given=True)
    index = np.arange(len(fs))
    ranks = np.stack([space.task_rank01(kb.predict(fs.x, fs.mask), fs.task) for kb in kbs])
    assert np.allclose(view.uncertainty(index), space.rank01(ranks.std(axis=0)))
    with pytest.raises(SamplingError, match="members"):
        run(fs, "rdu", 30, model=[kbs[0], None])


def test_mc_dropout_uncertainty_is_the_spread_of_dropout_samples(one_torch_thread):
    from tcl.models import new_model
    from tcl.sampling.learner import Learner
    from tcl.training import seed_everything

    fs = make_fs(n_tasks=4, per_task=25, seed=6)
    seed_everything(0)
    model = new_model("mlp", F, {"hidden": 16, "n_layers": 1, "dropout": 0.5})
    s = settings(mc_samples=64)
    view = Learner(s).view(Pool.from_features(fs), [model], np.zeros(0, np.int64), np.zeros(0),
                           np.random.default_rng(0))
    index = np.arange(len(fs))
    unc = view.uncertainty(index)
    seed_everything(123)
    spread = np.stack([model.predict(fs.x, fs.mask, dropout=True) for _ in range(64)]).std(axis=0)
    # an independent draw of the samples ranks the programs alike
    assert np.corrcoef(unc, space.rank01(spread))[0, 1] > 0.8


def test_bad_budget_and_reveal_are_refused():
    fs = make_fs(n_tasks=2, per_task=10)
    sampler = make_sampler("random", settings())
    with pytest.raises(SamplingError, match="budget"):
        sampler.select(Pool.from_features(fs), 0, lambda i: fs.latency[i])
    with pytest.raises(SamplingError, match="finite"):
        sampler.select(Pool.from_features(fs), 3, lambda i: np.full(len(i), np.nan))
    broken = fs.subset(np.arange(len(fs)))
    broken.x = broken.x.copy()
    broken.x[4, 0, 0] = np.nan
    with pytest.raises(ValueError, match="1 of 20 programs have a non-finite embedding .first: row 4"):
        make_sampler("rdu", settings()).select(Pool.from_features(broken), 3, lambda i: broken.latency[i])
    with pytest.raises(SamplingError, match="unknown sampling strategy"):
        make_sampler("nope")
    with pytest.raises(ValueError, match="unknown sample: keys"):
        SampleSettings.from_params({"sample": {"pool_ratioo": 0.3}})


def test_subset_records_how_it_was_chosen_and_renormalises_labels():
    fs = make_fs(n_tasks=6, per_task=20, seed=7)
    sub, sel = sample_features(fs, 0.25, "kmeans", {**TINY, "sample": {"retrain": {"kind": "none"}}}, rounds=2, seed=3)
    assert len(sub) == 30 and np.array_equal(sub.program_id, fs.program_id[np.sort(sel.indices)])
    for t in range(len(sub.tasks)):  # the best chosen program of each task has y = 1
        assert sub.y[sub.task == t].max() == pytest.approx(1.0)
    how = sub.meta["sample"]
    assert (how["strategy"], how["seed"], how["rounds"], how["round_sizes"]) == ("kmeans", 3, 2, [15, 15])
    from tcl.tracking import git_commit

    assert how["git_commit"] == git_commit() != "" and how["host_cpu"]  # the code and CPU that chose them


def _params_file(tmp_path):
    import yaml

    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump({**TINY, "sample": {**TINY["sample"], "rounds": 2}}))
    return path


def test_cli_sample_json_contract_and_model(tmp_path, one_torch_thread):
    from click.testing import CliRunner

    from tcl.cli import main
    from tcl.features import load_feature_set
    from tcl.models import new_model

    data = tmp_path / "train.npz"
    make_fs(n_tasks=6, per_task=30, seed=8).save(data)
    params = _params_file(tmp_path)
    out = tmp_path / "subset.npz"
    runner = CliRunner()
    res = runner.invoke(main, ["sample", str(data), "--ratio", "0.1", "--strategy", "rdu", "--seed", "2",
                               "--params", str(params), "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output.strip().splitlines()[-1])
    assert set(summary) == {"selected", "ratio", "strategy", "seconds", "rounds"}
    assert (summary["selected"], summary["ratio"], summary["strategy"], summary["rounds"]) == (18, 0.1, "rdu", 2)
    sub = load_feature_set(out)
    assert len(sub) == 18 and sub.meta["sample"]["seed"] == 2

    model_path = tmp_path / "kb.pt"
    new_model("mlp", F, {"hidden": 16, "n_layers": 1}).save(model_path)
    res = runner.invoke(main, ["sample", str(data), "--ratio", "0.2", "--strategy", "balto", "--model", str(model_path),
                               "--rounds", "1", "--params", str(params), "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output.strip().splitlines()[-1])
    assert summary["selected"] == 36 and summary["rounds"] == 1
    assert load_feature_set(out).meta["sample"]["model_ref"] == str(model_path)
    # --set overrides sample: settings for the run (dotted keys reach nested ones); the subset records them
    res = runner.invoke(main, ["sample", str(data), "--ratio", "0.2", "--strategy", "rdu", "--model", str(model_path),
                               "--rounds", "1", "--params", str(params), "--set", "mc_dropout=0.2",
                               "--set", "weights.uncertainty=2", "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    how = load_feature_set(out).meta["sample"]
    assert how["settings"]["mc_dropout"] == 0.2 and how["settings"]["weights"]["uncertainty"] == 2.0
    assert how["settings"]["weights"]["representativeness"] == DEFAULTS["weights"]["representativeness"]  # kept
    assert how["rounds_detail"][0]["uncertainty"] == "mc-dropout@0.2"  # this dropout-free model's, switched on
    # --model repeated: an ensemble, recorded as the list of its references
    other_path = tmp_path / "kb-2.pt"
    new_model("mlp", F, {"hidden": 16, "n_layers": 1}).save(other_path)
    res = runner.invoke(main, ["sample", str(data), "--ratio", "0.2", "--model", str(model_path), "--model",
                               str(other_path), "--rounds", "1", "--params", str(params), "--out", str(out)])
    assert res.exit_code == 0, res.output
    how = load_feature_set(out).meta["sample"]
    assert how["model_ref"] == [str(model_path), str(other_path)]
    assert how["rounds_detail"][0]["uncertainty"] == "ensemble-2"
    res = runner.invoke(main, ["sample", str(data), "--set", "pool_ratioo=0.3", "--params", str(params),
                               "--out", str(out)])
    assert res.exit_code == 1 and "unknown sample: keys ['pool_ratioo']" in res.output


def test_cli_sample_reads_the_file_in_row_slices_and_chooses_as_in_memory(tmp_path, one_torch_thread):
    """`tcl sample` keeps the step features in the file (pools larger than memory); the subset is
    the one the in-memory path chooses, byte for byte in its arrays."""
    import yaml
    from click.testing import CliRunner

    from tcl.cli import main
    from tcl.features import load_feature_set

    data = tmp_path / "train.npz"
    fs = make_fs(n_tasks=6, per_task=30, seed=9)
    fs.save(data)
    params = _params_file(tmp_path)
    out = tmp_path / "subset.npz"
    res = CliRunner().invoke(main, ["sample", str(data), "--ratio", "0.2", "--strategy", "rdu", "--seed", "1",
                                    "--params", str(params), "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    expected, _ = sample_features(load_feature_set(data), 0.2, "rdu", yaml.safe_load(params.read_text()), seed=1)
    got = load_feature_set(out)
    assert np.array_equal(got.x, expected.x) and np.array_equal(got.mask, expected.mask)
    assert np.array_equal(got.program_id, expected.program_id) and np.array_equal(got.y, expected.y)


@pytest.mark.parametrize("args,message", [
    (["--ratio", "0"], "--ratio must be in (0, 1]"),
    (["--ratio", "1.5"], "--ratio must be in (0, 1]"),
    (["--ratio", "0.1", "--model", "nowhere.pt"], "cannot load model nowhere.pt"),
    (["--ratio", "0.1", "--rounds", "0"], "rounds must be >= 1"),
])
def test_cli_sample_bad_input_is_a_clean_error(tmp_path, args, message):
    from click.testing import CliRunner

    from tcl.cli import main

    data = tmp_path / "train.npz"
    make_fs(n_tasks=2, per_task=10).save(data)
    res = CliRunner().invoke(main, ["sample", str(data), *args, "--params", str(_params_file(tmp_path)),
                                    "--out", str(tmp_path / "o.npz")])
    assert res.exit_code == 1 and message in res.output and "Traceback" not in res.output


def test_cli_sample_names_a_file_that_is_not_features(tmp_path):
    from click.testing import CliRunner

    from tcl.cli import main

    bad = tmp_path / "notes.npz"
    bad.write_text("hello")
    res = CliRunner().invoke(main, ["sample", str(bad), "--ratio", "0.1", "--out", str(tmp_path / "o.npz")])
    assert res.exit_code == 1 and str(bad) in res.output and "not a TCL feature file" in res.output


def test_bench_sample_times_a_small_pool_beside_its_baselines():
    from tcl.bench.sample import SyntheticSteps, bench_sample, format_table

    # the generated features are the same whatever the reads
    steps = SyntheticSteps(20_000, 8, 6, seed=1)
    rows = np.array([3, 9000, 19_999])
    pieces = np.concatenate([steps[8990:9010][[10]], steps[:5][[3]], steps[19_999:]])  # rows 9000, 3, 19999
    assert np.array_equal(steps[rows], pieces[[1, 0, 2]])
    out = bench_sample([3000], ratio=0.1, rounds=2, params={"featurize": {"max_len": 8}})
    assert out[0]["selected"] == 300 and out[0]["round_sizes"] == [150, 150]
    assert out[0]["seconds"] > 0 and out[0]["peak_rss_mb"] >= out[0]["rss_before_mb"] > 0
    assert out[0]["random_seconds"] > 0 and out[0]["kmeans_fit_seconds"] > 0
    assert "3000" in format_table(out)


def test_bench_sample_command_times_the_rounds_params_yaml_gives(tmp_path):
    """Without --rounds the bench times what `tcl sample` runs: params.yaml's sample.rounds."""
    import yaml
    from click.testing import CliRunner
    from tcl.cli import main

    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"featurize": {"max_len": 8}, "sample": {"rounds": 4}}))
    res = CliRunner().invoke(main, ["bench", "sample", "--sizes", "2000", "--params", str(params), "--json"])
    assert res.exit_code == 0, res.output
    row = json.loads(res.output.strip().splitlines()[-1])[0]
    assert row["rounds"] == 4 and len(row["round_sizes"]) == 4 and sum(row["round_sizes"]) == 200


def test_bench_sample_from_file_times_the_command_on_a_written_pool(tmp_path):
    from tcl.bench.sample import bench_sample, format_table

    out = bench_sample([2000], ratio=0.1, rounds=2, params={"featurize": {"max_len": 8}}, from_file=True,
                       workdir=str(tmp_path))
    row = out[0]
    assert row["from_file"] and row["selected"] == 200
    assert row["file_gb"] * 1e9 > 2000 * 8 * 4  # the steps (8 rows of F float32 each program) are in the file
    assert 0 < row["sampler_seconds"] < row["seconds"] and row["random_seconds"] > 0
    assert row["peak_rss_mb"] > 0 and row["random_peak_rss_mb"] > 0
    assert list(tmp_path.iterdir()) == []  # the pool file and the subsets are removed
    assert "2000" in format_table(out) and "file GB" in format_table(out)


class GroupModel(CostModel):
    """A cost model whose embedding sees what the step features barely show: the group coded in
    x[:, 0, 0] (one-hot of 6); its scores are all equal (no uncertainty)."""

    kind = "group-test"

    def predict(self, x, mask, dropout=False):
        return np.zeros(len(x))

    def embed(self, x, mask):
        return np.eye(6, dtype=np.float32)[np.rint(x[:, 0, 0] * 1000).astype(int)]

    def fit(self, *args, **kwargs):
        raise NotImplementedError

    def save(self, path, extra=None):
        raise NotImplementedError

    @classmethod
    def load(cls, path):
        raise NotImplementedError


def test_a_given_model_s_embedding_serves_from_the_first_round():
    fs = make_fs(n_tasks=1, per_task=240, seed=10)
    group = np.arange(len(fs)) % 6
    fs.x = fs.x.copy()
    fs.x[:, :, 0] = np.random.default_rng(0).normal(0, 1, fs.x.shape[:2])  # column 0 is noise...
    fs.x[:, 0, 0] = group / 1000.0                                         # ...but for a faint group code
    fs.mask = np.ones_like(fs.mask)
    kw = {"retrain": {"kind": "none"}, "stratify": "none"}
    backed, _, _ = run(fs, "rdu", 6, rounds=1, model=GroupModel(F), **kw)
    cold, _, _ = run(fs, "rdu", 6, rounds=1, **kw)
    assert sorted(group[backed.indices].tolist()) == list(range(6))   # one program per group
    assert len(np.unique(group[cold.indices])) < 6                      # the features alone do not tell


class ScoreModel(GroupModel):
    """A cost model that predicts x[:, 0, 1] (and embeds like GroupModel's parent: the mean step)."""

    kind = "score-test"

    def predict(self, x, mask, dropout=False):
        return np.asarray(x[:, 0, 1], np.float64)

    def embed(self, x, mask):
        return x.mean(axis=1)


def test_rdu_performance_weight_favours_the_programs_predicted_fastest_in_their_task():
    fs = make_fs(n_tasks=4, per_task=40, seed=3)
    model = ScoreModel(F)
    kw = {"retrain": {"kind": "none"}, "pool_ratio": 1.0, "max_clusters": 1}  # one cluster: the cells are the tasks
    only_p = {"representativeness": 0.0, "diversity": 0.0, "uncertainty": 0.0, "performance": 1.0}
    chosen, _, _ = run(fs, "rdu", 12, rounds=1, model=model, weights=only_p, **kw)
    score = fs.x[:, 0, 1]
    for t in range(4):  # 3 a task: its three best-scored programs
        rows = np.flatnonzero(fs.task == t)
        assert sorted(chosen.indices[fs.task[chosen.indices] == t]) == sorted(rows[np.argsort(-score[rows])[:3]])
    assert chosen.rounds[0]["scores"]["performance"] > 0.9
    paper, _, _ = run(fs, "rdu", 12, rounds=1, model=model, **kw)  # absent: weight 0, the paper's terms only
    assert "performance" not in paper.rounds[0]["scores"]
    assert not np.array_equal(np.sort(paper.indices), np.sort(chosen.indices))
    with pytest.raises(ValueError, match="optionally"):
        settings(weights={"speed": 1.0})
