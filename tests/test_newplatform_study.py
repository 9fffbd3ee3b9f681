"""pipelines/newplatform/summarize.py: `tcl evaluate` JSONs grouped by label, mean ± sample sd over
seeds, rows in the table's order (zero-shot, 10% runs, 100%), checked by hand."""

from __future__ import annotations

import importlib.util
import json
import statistics
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "pipelines" / "newplatform" / "summarize.py"


def _module():
    spec = importlib.util.spec_from_file_location("newplatform_summarize", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _result(path: Path, label: str, top1: float, bert_top1: float) -> None:
    path.write_text(json.dumps({
        "label": label, "top1": top1, "top5": 0.9, "task_top1": top1 / 2, "task_top5": 1.0, "pairwise": 0.7,
        "per_network": {"bert_base": {"top1": bert_top1, "top5": 1.0}, "resnet50": {"top1": 0.5, "top5": 1.0}}}))


def test_runs_grouped_by_label_mean_and_sample_sd(tmp_path):
    summarize = _module()
    results = tmp_path / "results"
    results.mkdir()
    _result(results / "scratch-full-s0.json", "scratch-full", 0.2, 0.1)
    _result(results / "scratch-full-s1.json", "scratch-full", 0.4, 0.3)
    _result(results / "transfer-rdu-s0.json", "transfer-rdu", 0.3, 0.2)
    _result(results / "zeroshot-x86-sse.json", "zeroshot-x86-sse", 0.5, 0.6)

    rows = summarize.summarize(summarize.load_runs(results))
    assert [r["label"] for r in rows] == ["zeroshot-x86-sse", "transfer-rdu", "scratch-full"]
    zeroshot, transfer, full = rows
    assert (zeroshot["data"], transfer["data"], full["data"]) == ("none", "10% (RDU)", "100%")
    assert full["runs"] == 2 and full["top1"] == pytest.approx(0.3)
    assert full["top1_sd"] == pytest.approx(statistics.stdev([0.2, 0.4]))
    assert full["task_top1"] == pytest.approx(0.15) and full["bert_base_top1"] == pytest.approx(0.2)
    assert zeroshot["runs"] == 1 and zeroshot["top1_sd"] == 0.0

    table = summarize.table(rows)
    assert "| scratch-full | 100% | 2 | 0.300 ± 0.141 | 0.900 ± 0.000 | 0.150 ± 0.071 |" in table
    assert table.splitlines()[0].endswith("| bert_base top-1 | resnet50 top-1 |")
    summarize.plot(rows, tmp_path / "img" / "newplatform.png")
    assert (tmp_path / "img" / "newplatform.png").stat().st_size > 0


def test_the_resample_summary_runs_as_a_command_on_its_own_folders(tmp_path):
    """The `resample-summary` stage's form: its own results folder and outputs, one data column."""
    import subprocess
    import sys

    results = tmp_path / "resample-results"
    results.mkdir()
    _result(results / "finetune-random-s0.json", "finetune-random", 0.2, 0.1)
    _result(results / "finetune-random-s1.json", "finetune-random", 0.4, 0.3)
    out = tmp_path / "out"
    subprocess.run([sys.executable, str(SCRIPT), "--results", str(results), "--summary", str(out / "s.json"),
                    "--markdown", str(out / "s.md"), "--plot", str(out / "p.png"), "--trained-on", "10% of the pool"],
                   check=True, capture_output=True, cwd=SCRIPT.parents[2])
    (row,) = json.loads((out / "s.json").read_text())["runs"]
    assert (row["label"], row["data"], row["runs"]) == ("finetune-random", "10% of the pool", 2)
    assert row["top1"] == pytest.approx(0.3)
    assert "| finetune-random | 10% of the pool | 2 | 0.300 ± 0.141 |" in (out / "s.md").read_text()
    assert (out / "p.png").stat().st_size > 0


def test_pool_size_labels_name_their_data_and_sort_by_ratio_training_strategy(tmp_path):
    """The `pool-summary` stage's labels: STRATEGY-RATIO[-steps|-transfer] and full, each row's data
    column read off its label, 5% before 10%, scratch before equal steps before transfer, strategies in
    the study's order, the whole pool last."""
    summarize = _module()
    results = tmp_path / "results"
    results.mkdir()
    for label in ("full", "random-0.1-transfer", "rdu-0.1-steps", "kmeans-0.1", "rdu-0.1", "random-0.05", "rdu-0.05"):
        _result(results / f"{label}-s0.json", label, 0.3, 0.2)
    rows = summarize.summarize(summarize.load_runs(results))
    assert [(r["label"], r["data"]) for r in rows] == [
        ("rdu-0.05", "5% (rdu)"), ("random-0.05", "5% (random)"), ("rdu-0.1", "10% (rdu)"),
        ("kmeans-0.1", "10% (kmeans)"), ("rdu-0.1-steps", "10% (rdu, equal steps)"),
        ("random-0.1-transfer", "10% (random, tcl transfer)"), ("full", "100%")]
    # not the study's form: read as the other studies' labels are
    assert summarize.pool_label("transfer-pool-rdu") is None and summarize.pool_label("rdu-tenth") is None
    assert summarize.pool_label("rdu-0.1-steps") == ("rdu", 0.1, "steps")


def test_paired_differences_only_on_the_seeds_both_runs_have(tmp_path):
    """`--paired rdu`: rdu minus each other strategy of its ratio and training, and minus the whole
    pool, seed by seed; a seed one of the two lacks is left out; by hand."""
    summarize = _module()
    results = tmp_path / "results"
    results.mkdir()
    for label, top1s in (("rdu-0.1", (0.5, 0.3, 0.4)), ("random-0.1", (0.2, 0.4)), ("random-0.05", (0.9,)),
                         ("rdu-0.1-steps", (0.1,)), ("full", (0.6, 0.6, 0.6))):
        for seed, top1 in enumerate(top1s):
            _result(results / f"{label}-s{seed}.json", label, top1, 0.2)
    pairs = summarize.paired(summarize.runs_by_seed(results), "rdu")
    by = {(p["label"], p["minus"]): p for p in pairs}
    assert set(by) == {("rdu-0.1", "random-0.1"), ("rdu-0.1", "full"), ("rdu-0.1-steps", "full")}
    random = by[("rdu-0.1", "random-0.1")]
    assert random["seeds"] == [0, 1] and random["top1"] == pytest.approx((0.3 - 0.1) / 2)
    assert random["top1_se"] == pytest.approx(statistics.stdev([0.3, -0.1]) / 2 ** 0.5)
    assert random["top1_above"] == 1 and random["task_top1"] == pytest.approx(0.05)
    full = by[("rdu-0.1", "full")]
    assert full["seeds"] == [0, 1, 2] and full["top1"] == pytest.approx(-0.2)
    assert "| rdu-0.1 | random-0.1 | 2 | +0.100 ± 0.200 |" in summarize.paired_table(pairs)


def test_overlap_joins_programs_measured_twice_by_task_and_program():
    """pipelines/newplatform/overlap.py: only programs both occasions hold count; per task the median
    latency ratio, the Spearman correlation and whether the fastest program is the same, by hand."""
    spec = importlib.util.spec_from_file_location("newplatform_overlap", SCRIPT.parent / "overlap.py")
    overlap = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(overlap)
    first = {("a", "p1"): 1.0, ("a", "p2"): 2.0, ("a", "p3"): 3.0, ("a", "p4"): 4.0, ("b", "q1"): 1.0,
             ("b", "q2"): 2.0, ("b", "q3"): 3.0, ("c", "only-first"): 1.0}
    second = {("a", "p1"): 1.1, ("a", "p2"): 2.2, ("a", "p3"): 3.3, ("a", "p4"): 4.4,  # 10 % slower, same order
              ("b", "q1"): 3.0, ("b", "q2"): 2.0, ("b", "q3"): 1.0,  # order reversed
              ("b", "only-second"): 0.5}
    result = overlap.compare(first, second)
    a, b = result["per_task"]
    assert (a["task"], a["programs"], a["same_fastest"]) == ("a", 4, True)
    assert a["median_ratio"] == pytest.approx(1.1) and a["spearman"] == pytest.approx(1.0)
    assert (b["task"], b["programs"], b["same_fastest"]) == ("b", 3, False)
    assert b["median_ratio"] == pytest.approx(1.0) and b["spearman"] == pytest.approx(-1.0)
    assert (result["programs"], result["tasks"], result["same_fastest"]) == (7, 2, 1)
    assert result["mean_spearman"] == pytest.approx(0.0) and result["median_ratio"] == pytest.approx(1.05)


def _trainseeds():
    spec = importlib.util.spec_from_file_location("newplatform_trainseeds",
                                                  SCRIPT.parent / "poolsize" / "trainseeds" / "trainseeds.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_training_seed_decomposition_and_subset_means_paired(tmp_path):
    trainseeds = _trainseeds()
    rounds6, results = tmp_path / "rounds6", tmp_path / "results"
    rounds6.mkdir(), results.mkdir()
    # subset seed -> its runs' top-1 (rounds6's first, training seed = subset seed), two strategies
    top1 = {"a-0.1": {0: [0.2, 0.4], 1: [0.6, 0.8], 2: [0.1, 0.3]},
            "b-0.1": {0: [0.1, 0.3], 1: [0.3, 0.1], 2: [0.2, 0.2]}}
    for label, by_seed in top1.items():
        for seed, (first, again) in by_seed.items():
            (rounds6 / f"{label}-s{seed}.json").write_text(json.dumps({"top1": first, "task_top1": 0.5}))
            (results / f"{label}-s{seed}-t1000.json").write_text(json.dumps({"top1": again, "task_top1": 0.5}))
    (results / "a-0.1-s3-t1000.json").write_text(json.dumps({"top1": 0.9, "task_top1": 0.5}))  # no rounds6 run
    (rounds6 / "a-0.1-rounds6-s0.json").write_text(json.dumps({"top1": 0.9, "task_top1": 0.5}))  # another label

    runs = trainseeds.complete(trainseeds.load(results, rounds6, ("a-0.1", "b-0.1")))
    assert sorted(runs["a-0.1"]) == [0, 1, 2] and [r["top1"] for r in runs["a-0.1"][1]] == [0.6, 0.8]

    d = trainseeds.decompose(runs["a-0.1"], "top1")
    within = statistics.fmean([0.02, 0.02, 0.02])             # each pair differs by 0.2: variance 0.02
    between = statistics.variance([0.3, 0.7, 0.2])
    assert d["sd_training"] == pytest.approx(within ** 0.5)
    assert d["sd_subset"] == pytest.approx((between - within / 2) ** 0.5)
    assert d["training_share"] == pytest.approx(within / (within + between - within / 2))
    # b's subsets differ less than its training runs do: the subset's share floors at 0
    assert trainseeds.decompose(runs["b-0.1"], "top1")["training_share"] == 1.0

    p = trainseeds.paired(runs, "a-0.1", "b-0.1", "top1")
    diffs = [0.3 - 0.2, 0.7 - 0.2, 0.2 - 0.2]
    assert p["mean"] == pytest.approx(statistics.fmean(diffs)) and p["above"] == 2
    assert p["se"] == pytest.approx(statistics.stdev(diffs) / 3 ** 0.5)
    columns = [statistics.fmean([0.2 - 0.1, 0.6 - 0.3, 0.1 - 0.2]), statistics.fmean([0.4 - 0.3, 0.8 - 0.1, 0.3 - 0.2])]
    assert p["by_training_run"] == pytest.approx(columns)
    assert p["se_training_runs"] == pytest.approx(statistics.stdev(columns) / 2 ** 0.5)


def test_whole_pool_paired_by_seed_against_a_baseline_folder(tmp_path):
    trainseeds = _trainseeds()
    here, base = tmp_path / "here", tmp_path / "base"
    here.mkdir(), base.mkdir()
    for seed, (a, b) in enumerate([(0.5, 0.2), (0.6, 0.6), (0.4, 0.3)]):
        (here / f"full-s{seed}.json").write_text(json.dumps({"top1": a}))
        (base / f"full-s{seed}.json").write_text(json.dumps({"top1": b}))
    (base / "full-s7.json").write_text(json.dumps({"top1": 0.9}))   # a seed only the baseline has
    row = trainseeds.whole_pool_row(here, "top1", base)
    assert row["runs"] == 3 and row["mean"] == pytest.approx(0.5)
    b = row["against_baseline"]
    assert b["seeds"] == [0, 1, 2] and b["mean"] == pytest.approx(statistics.fmean([0.3, 0.0, 0.1]))
    assert b["sd_baseline"] == pytest.approx(statistics.stdev([0.2, 0.6, 0.3]))


def test_heavytasks_task_terms_sum_to_each_networks_inverse_top1():
    """trainseeds/heavytasks.py splits a network's 1/top1 into per-task terms share · picked/best; their
    sum is exactly 1 / tcl.metrics' network top-1, for any scores, with and without per-network weights."""
    import numpy as np

    from tcl import metrics as M
    from tests.test_training import make_fs

    spec = importlib.util.spec_from_file_location("newplatform_heavytasks",
                                                  SCRIPT.parent / "poolsize" / "trainseeds" / "heavytasks.py")
    heavytasks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(heavytasks)
    fs = make_fs(n_tasks=6, per_task=10, networks=[["a"], ["a", "b"], ["b"], ["a"], ["b"], ["a", "b"]])
    fs.task_weight = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    scores = np.random.default_rng(0).standard_normal(len(fs))
    for network_weights in (None, [{"a": 3.0}, {"a": 1.0, "b": 7.0}, {"b": 2.0}, {"a": 5.0}, {"b": 1.0},
                                   {"a": 2.0, "b": 4.0}]):
        fs.task_network_weights = network_weights
        top1 = M.top_k_scores(scores, fs.latency, fs.task, fs.task_weight, fs.task_networks, ks=(1,),
                              network_weights=network_weights)
        picked = heavytasks.picked_over_best(scores, fs)
        shares = heavytasks.best_shares(fs)
        assert set(shares) == {"a", "b"} and sum(s for _, s in shares["b"].values()) == pytest.approx(1.0)
        for net, terms in shares.items():
            assert sum(share * picked[t] for t, (_, share) in terms.items()) == pytest.approx(1 / top1[net]["top1"])
