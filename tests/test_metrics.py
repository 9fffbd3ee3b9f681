"""tcl.metrics and tcl.losses against small hand-computed examples."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tcl import metrics as M

# Three tasks, two networks:
#   task 0: weight 2, in netA          latencies [1, 2, 4]        scores [0.1, 0.9, 0.5]
#   task 1: weight 1, in netA and netB latencies [3, 6]           scores [0.2, 0.8]
#   task 2: weight 3, in netB          latencies [5, 10, 20, 40]  scores [4, 3, 2, 1]
LAT = np.array([1, 2, 4, 3, 6, 5, 10, 20, 40], dtype=np.float64)
SCORES = np.array([0.1, 0.9, 0.5, 0.2, 0.8, 4, 3, 2, 1], dtype=np.float64)
TASK = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2], dtype=np.int32)
WEIGHT = np.array([2.0, 1.0, 3.0])
NETWORKS = [["netA"], ["netA", "netB"], ["netB"]]


def test_task_best_topk_by_hand():
    per_task = M.task_best_topk(SCORES, LAT, TASK, ks=(1, 5))
    # task 0: best 1; top-1 pick is the program scored 0.9 (latency 2); top-5 holds all -> 1
    assert per_task[0] == {"best": 1.0, 1: 2.0, 5: 1.0}
    # task 1: best 3; top-1 pick scored 0.8 has latency 6
    assert per_task[1] == {"best": 3.0, 1: 6.0, 5: 3.0}
    # task 2: scores order programs perfectly
    assert per_task[2] == {"best": 5.0, 1: 5.0, 5: 5.0}


def test_top_k_per_network_by_hand():
    res = M.top_k_scores(SCORES, LAT, TASK, WEIGHT, NETWORKS)
    # netA = tasks 0, 1: top1 = (2*1 + 1*3) / (2*2 + 1*6) = 5/10
    assert res["netA"]["top1"] == pytest.approx(5 / 10)
    # netB = tasks 1, 2: top1 = (1*3 + 3*5) / (1*6 + 3*5) = 18/21
    assert res["netB"]["top1"] == pytest.approx(18 / 21)
    # top-5 contains every program of these small tasks -> 1
    assert res["netA"]["top5"] == pytest.approx(1.0)
    assert res["netB"]["top5"] == pytest.approx(1.0)


def test_pairwise_by_hand():
    # task 0: (1 vs 2): 1 is faster but scored lower -> wrong; (1 vs 4) wrong; (2 vs 4) right -> 1/3
    # task 1: (3 vs 6) wrong -> 0/1;  task 2: all 6 pairs right.  Total 7 of 10.
    assert M.pairwise_accuracy(SCORES, LAT, TASK) == pytest.approx(7 / 10)


def test_pairwise_ties():
    # equal latencies are not a pair; an equal score on a real pair counts 1/2
    lat = np.array([1.0, 1.0, 2.0])
    scores = np.array([5.0, 0.0, 5.0])
    # pairs with different latency: (0,2): scores tie -> 0.5; (1,2): 0 < 5 but 1 is faster -> 0
    assert M.pairwise_accuracy(scores, lat, np.zeros(3, int)) == pytest.approx(0.5 / 2)


def test_spearman_by_hand():
    sp = M.spearman_per_task(SCORES, LAT, TASK)
    # task 0: score ranks [1, 3, 2], throughput ranks [3, 2, 1]; d = [-2, 1, 1], sum d^2 = 6
    #         rho = 1 - 6*6 / (3*(9-1)) = 1 - 36/24 = -0.5
    assert sp[0] == pytest.approx(-0.5)
    assert sp[1] == pytest.approx(-1.0)  # two programs, reversed
    assert sp[2] == pytest.approx(1.0)


def test_spearman_skips_undefined_tasks():
    lat = np.array([1.0, 2.0, 3.0, 3.0, 7.0])
    scores = np.array([1.0, 1.0, 0.0, 1.0, 2.0])
    task = np.array([0, 0, 1, 1, 2])
    # task 0: constant scores -> undefined; task 1: equal latencies -> undefined; task 2: one program
    assert M.spearman_per_task(scores, lat, task) == {}


def test_nan_scores_rank_last():
    lat = np.array([1.0, 2.0])
    scores = np.array([np.nan, 0.1])
    per_task = M.task_best_topk(scores, lat, np.array([0, 0]), ks=(1,))
    assert per_task[0][1] == 2.0  # the NaN-scored program is never the top-1 pick


def test_no_pseudo_network_when_no_network_names():
    assert M.top_k_scores(SCORES, LAT, TASK, WEIGHT, [[], [], []]) == {}


def test_a_shared_task_weighs_its_count_in_each_network_by_hand():
    # task 1 occurs 3 times in netA and once in netB (4 in all); tasks 0 and 2 as above
    per_net = [{"netA": 2.0}, {"netA": 3.0, "netB": 1.0}, {"netB": 3.0}]
    res = M.top_k_scores(SCORES, LAT, TASK, np.array([2.0, 4.0, 3.0]), NETWORKS, network_weights=per_net)
    # netA = tasks 0, 1: (2*1 + 3*3) / (2*2 + 3*6) = 11/22
    assert res["netA"]["top1"] == pytest.approx(11 / 22)
    # netB = tasks 1, 2: (1*3 + 3*5) / (1*6 + 3*5) = 18/21; the total count 4 would give 27/39
    assert res["netB"]["top1"] == pytest.approx(18 / 21)
    assert not math.isclose(18 / 21, 27 / 39)


def test_task_means_by_hand():
    # best / pick per task, top-1: 1/2, 3/6, 5/5; top-5 holds every program: 1, 1, 1
    means = M.task_top_k_means(SCORES, LAT, TASK)
    assert means["task_top1"] == pytest.approx((0.5 + 0.5 + 1.0) / 3)
    assert means["task_top5"] == pytest.approx(1.0)


def test_top1_perfect_and_worst():
    best_first = -LAT  # a model that knows the latencies
    res = M.top_k_scores(best_first, LAT, TASK, WEIGHT, NETWORKS)
    assert all(r["top1"] == pytest.approx(1.0) for r in res.values())
    worst = M.top_k_scores(LAT, LAT, TASK, WEIGHT, NETWORKS)
    # netA worst picks: task0 -> 4, task1 -> 6: (2*1 + 1*3) / (2*4 + 1*6) = 5/14
    assert worst["netA"]["top1"] == pytest.approx(5 / 14)


# ---------------------------------------------------------------------------------------------
# losses


def test_lambdarank_value_by_hand():
    import torch

    from tcl.losses import lambdarank_loss

    y = torch.tensor([1.0, 0.5])
    s = torch.tensor([0.0, 1.0])  # ranked wrong: the better program (y=1) scored lower
    loss = lambdarank_loss(s, y, torch.tensor([0, 0]))
    g0, g1 = 2**1.0 - 1, 2**0.5 - 1                        # gains 2^y - 1
    d_rank0, d_rank1 = 1 / math.log2(2), 1 / math.log2(3)  # discounts at ranks 0 and 1
    idcg = g0 * d_rank0 + g1 * d_rank1                     # ideal order: program 0 first
    delta = abs(g0 - g1) * abs(d_rank1 - d_rank0) / idcg   # |dNDCG| of swapping the two
    expected = delta * math.log(1 + math.exp(-(0.0 - 1.0)))  # one pair
    assert float(loss) == pytest.approx(expected, rel=1e-6)


def test_lambdarank_gradient_fixes_wrong_pair_and_ignores_other_tasks():
    import torch

    from tcl.losses import lambdarank_loss

    s = torch.tensor([0.0, 1.0, 5.0], requires_grad=True)
    y = torch.tensor([1.0, 0.5, 0.1])
    task = torch.tensor([0, 0, 1])  # program 2 is alone in its task
    lambdarank_loss(s, y, task).backward()
    # gradient descent (s -= lr * grad) must raise the better program and lower the worse one
    assert s.grad[0] < 0 and s.grad[1] > 0
    assert s.grad[2] == 0
    # different tasks only: no pairs at all
    s2 = torch.tensor([0.0, 1.0], requires_grad=True)
    loss = lambdarank_loss(s2, torch.tensor([1.0, 0.5]), torch.tensor([0, 1]))
    loss.backward()
    assert loss.detach().item() == 0.0 and torch.all(s2.grad == 0)


def test_lambdarank_ignores_nonfinite_labels():
    import torch

    from tcl.losses import lambdarank_loss

    s = torch.tensor([0.0, 1.0, 2.0], requires_grad=True)
    loss = lambdarank_loss(s, torch.tensor([1.0, 0.5, float("nan")]), torch.tensor([0, 0, 0]))
    ref = lambdarank_loss(torch.tensor([0.0, 1.0]), torch.tensor([1.0, 0.5]), torch.tensor([0, 0]))
    assert torch.isfinite(loss) and loss.detach().item() == pytest.approx(ref.item())


def test_lambdarank_learns_a_synthetic_ranking():
    import torch

    from tcl.losses import lambdarank_loss

    g = torch.Generator().manual_seed(0)
    n_tasks, per_task, dim = 40, 16, 8
    x = torch.randn(n_tasks * per_task, dim, generator=g)
    w_true = torch.randn(dim, generator=g)
    task = torch.arange(n_tasks).repeat_interleave(per_task)
    throughput = torch.exp(x @ w_true * 0.5)
    best = torch.zeros(n_tasks).scatter_reduce(0, task, throughput, "amax")
    y = throughput / best[task]  # in (0, 1], 1 for the best program of each task
    latency = (1.0 / throughput).numpy()

    torch.manual_seed(0)
    model = torch.nn.Linear(dim, 1)
    before = M.pairwise_accuracy(model(x).detach().squeeze(1).numpy(), latency, task.numpy())
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: one thread is fastest on a busy machine
    try:
        for _ in range(100):
            loss = lambdarank_loss(model(x).squeeze(1), y, task)
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)
    after = M.pairwise_accuracy(model(x).detach().squeeze(1).numpy(), latency, task.numpy())
    assert after > 0.95 and after > before + 0.2


def test_mse_by_hand():
    import torch

    from tcl.losses import mse_loss

    loss = mse_loss(torch.tensor([0.5, 1.0, 0.0]), torch.tensor([1.0, 1.0, float("inf")]))
    assert float(loss) == pytest.approx(((0.5 - 1.0) ** 2 + 0.0) / 2)  # the inf label is dropped


def test_evaluate_feature_set_by_hand():
    from tcl.features import FeatureSet

    n = len(LAT)
    fs = FeatureSet(
        x=np.zeros((n, 2, 3), np.float32), mask=np.ones((n, 2), bool),
        y=np.ones(n, np.float32), latency=LAT, task=TASK, program_id=np.array([str(i) for i in range(n)]),
        tasks=["t0", "t1", "t2"], task_desc=["a", "b", "c"], task_weight=WEIGHT, task_networks=NETWORKS,
        platform="p", meta={},
    )
    res = M.evaluate(SCORES, fs)
    assert res["per_network"]["netA"]["top1"] == pytest.approx(5 / 10)
    assert res["top1"] == pytest.approx((5 / 10 + 18 / 21) / 2)  # mean over netA and netB
    assert res["top5"] == pytest.approx(1.0)
    assert res["task_top1"] == pytest.approx(2 / 3) and res["task_top5"] == pytest.approx(1.0)
    assert res["top_k_over"] == "networks"
    assert res["pairwise"] == pytest.approx(7 / 10)
    assert res["spearman"] == pytest.approx((-0.5 - 1.0 + 1.0) / 3)
    assert (res["n_programs"], res["n_tasks"], res["n_networks"]) == (9, 3, 2)
    with pytest.raises(ValueError):
        M.evaluate(SCORES[:-1], fs)


def test_without_network_names_the_task_mean_is_the_headline():
    from tcl.features import FeatureSet

    n = len(LAT)
    fs = FeatureSet(
        x=np.zeros((n, 2, 3), np.float32), mask=np.ones((n, 2), bool),
        y=np.ones(n, np.float32), latency=LAT, task=TASK, program_id=np.array([str(i) for i in range(n)]),
        tasks=["t0", "t1", "t2"], task_desc=["a", "b", "c"], task_weight=np.ones(3), task_networks=[[], [], []],
        platform="p", meta={},
    )
    res = M.evaluate(SCORES, fs)
    assert res["per_network"] == {} and res["n_networks"] == 0 and res["top_k_over"] == "tasks"
    assert res["top1"] == res["task_top1"] == pytest.approx((0.5 + 0.5 + 1.0) / 3)
    assert res["top5"] == res["task_top5"] == pytest.approx(1.0)


def test_test_split_scores_only_its_held_out_networks():
    import numpy as np

    from tcl.features import FeatureSet
    from tcl.metrics import evaluate

    # task 0 belongs to resnet50 and resnet18, task 1 only to resnet50; resnet18 is not held out
    fs = FeatureSet(
        x=np.zeros((4, 2, 3), np.float32), mask=np.ones((4, 2), bool), y=np.ones(4, np.float32),
        latency=np.array([1.0, 2.0, 1.0, 4.0]), task=np.array([0, 0, 1, 1], np.int32),
        program_id=np.array(["a", "b", "c", "d"]), tasks=["t0", "t1"], task_desc=["", ""],
        task_weight=np.array([1.0, 1.0]), task_networks=[["resnet18", "resnet50"], ["resnet50"]],
        platform="p", meta={"split": {"name": "test", "test_networks": ["resnet50", "bert_base"]}},
    )
    scores = np.array([0.0, 1.0, 1.0, 0.0])  # wrong pick in task 0 (latency 2 instead of 1), right in task 1
    result = evaluate(scores, fs)
    assert set(result["per_network"]) == {"resnet50"}
    assert result["top1"] == pytest.approx((1 + 1) / (2 + 1))  # (w·best) / (w·picked) over both tasks
    fs.meta = {}
    assert set(evaluate(scores, fs)["per_network"]) == {"resnet18", "resnet50"}


# -- seed summaries (tcl.summary / `tcl summarize`) ------------------------------------------


def _result(platform, kind, top1, top5, nets=None, task_top1=None):
    out = {"platform": platform, "kind": kind, "top1": top1, "top5": top5, "pairwise": 0.5,
           "spearman": float("nan"), "per_network": nets or {}}
    if task_top1 is not None:
        out.update(task_top1=task_top1, task_top5=1.0)
    return out


def test_summary_mean_sd_by_hand():
    from tcl.summary import as_metrics, format_markdown, summarize

    rows = summarize([
        _result("p", "mamba", 0.6, 0.8, {"resnet50": {"top1": 0.5, "top5": 0.7}}, task_top1=0.9),
        _result("p", "mamba", 0.4, 0.9, {"resnet50": {"top1": 0.3, "top5": 0.9}}, task_top1=0.7),
        _result("p", "tlp", 0.7, 0.7),
        _result("q", "tlp", 0.1, 0.2),
        {**_result("q", "mamba", 0.3, 0.3), "label": "d_conv2"},
    ])
    assert [(r["platform"], r["model"]) for r in rows] == [("p", "tlp"), ("p", "mamba"), ("q", "d_conv2"),
                                                           ("q", "tlp")]
    mamba = rows[1]
    assert mamba["n_runs"] == 2
    assert mamba["top1"]["mean"] == pytest.approx(0.5)
    assert mamba["top1"]["sd"] == pytest.approx((0.02) ** 0.5)  # sample sd of {0.6, 0.4}
    assert (mamba["top1"]["min"], mamba["top1"]["max"]) == (0.4, 0.6)
    assert mamba["per_network"]["resnet50"]["top1"]["mean"] == pytest.approx(0.4)
    assert "spearman" not in mamba  # NaN runs are left out, not averaged into NaN
    assert rows[0]["top1"]["sd"] == 0.0  # one run
    m = as_metrics(rows)
    assert m["p"]["mamba"]["top1"] == 0.5 and m["q"]["tlp"]["n_runs"] == 1
    table = format_markdown(rows)
    # top-1, its range, top-5, then the per-task means beside them
    assert "| p | mamba | 2 | 0.500 ± 0.141 | 0.400–0.600 | 0.850 ± 0.071 | 0.800 ± 0.141 | 1.000 ± 0.000 |" \
        in table
    assert "| p | tlp | 1 | 0.700 ± 0.000 | 0.700–0.700 | 0.700 ± 0.000 | - | - |" in table  # no task means
    assert m["p"]["mamba"]["task_top1"] == 0.8


def test_summarize_cli(tmp_path):
    import json

    from click.testing import CliRunner

    from tcl.cli import main

    paths = []
    for i, t1 in enumerate((0.2, 0.4)):
        p = tmp_path / f"m{i}.json"
        p.write_text(json.dumps(_result("p", "xgb", t1, 0.5)))
        paths.append(str(p))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    res = CliRunner().invoke(main, ["summarize", *paths, str(bad), "--out", str(tmp_path / "s.json")])
    assert res.exit_code != 0 and "bad.json" in res.output
    res = CliRunner().invoke(main, ["summarize", *paths, "--out", str(tmp_path / "s.json"),
                                    "--plot", str(tmp_path / "plot.json")])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "s.json").read_text())["p"]["xgb"]["top1"] == pytest.approx(0.3)
    assert json.loads((tmp_path / "plot.json").read_text()) == [{"run": "p xgb", "top1": 0.3, "top5": 0.5}]
