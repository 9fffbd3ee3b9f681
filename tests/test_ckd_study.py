"""The CKD studies (tcl.continual.study, `tcl ckd-study`, pipelines/continual): every variant runs on
tiny data and writes its fields; the ablations change what they say they change; the multi-task
model scores with each platform's own head; the summary's numbers by hand."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from tcl.continual.distill import phi_at, teacher_quality
from tcl.continual.study import VARIANTS, StudyError, learn_sources, run_params, run_variant
from tcl.models import load_model, new_model

from .conftest import REPO
from .test_continual import PARAMS, TINY
from .test_training import F, L, make_fs

SOURCE, TARGET, OTHER = "src-p", "tgt-p", "far-p"


@pytest.fixture(scope="module")
def study_data(tmp_path_factory):
    """Splits of three platforms (tiny programs), the target's subset, and the study's params."""
    root = tmp_path_factory.mktemp("study")
    for i, name in enumerate((SOURCE, TARGET, OTHER)):
        d = root / "splits" / name
        d.mkdir(parents=True)
        make_fs(seed=i + 1, platform=name).save(d / "train.npz")
        make_fs(seed=i + 11, n_tasks=4, platform=name).save(d / "valid.npz")
        make_fs(seed=i + 21, n_tasks=6, platform=name).save(d / "test.npz")
    full = make_fs(seed=2, platform=TARGET)
    rows = np.flatnonzero(np.arange(len(full)) % 4 == 0)  # a quarter of every task
    (root / "subset.npz").parent.mkdir(exist_ok=True)
    full.subset(rows).save(root / "subset.npz")
    study = {"families": {"fam": {"target": TARGET, "subset": str(root / "subset.npz"),
                                  "sources": {"same": [SOURCE], "cross": [OTHER], "all": [OTHER, SOURCE]}}},
             "fixed_phi": 1.0, "curves": "test", "params": {"continual": {"kd": {"epochs": 3}}},
             "baseline_train": {"epochs": 2}}
    return root, study


@pytest.fixture(scope="module")
def source_kb(study_data, tmp_path_factory):
    root, study = study_data
    out = tmp_path_factory.mktemp("kb") / "same"
    torch.set_num_threads(1)
    learn_sources("fam", "same", PARAMS, study, 0, out, root / "splits")
    return out


def _run(variant, study_data, source_kb, tmp_path, sources="same", kb=None):
    root, study = study_data
    from tcl.continual.study import FROM_KB

    start = kb if kb is not None else (source_kb if variant in FROM_KB else None)
    out = tmp_path / f"{variant}.json"
    result = run_variant(variant, "fam", PARAMS, study, 0, out, sources=sources, source_kb=start,
                         splits_dir=root / "splits")
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    return result


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_runs_and_writes_its_fields(variant, study_data, source_kb, tmp_path, one_torch_thread):
    from tcl import metrics as M
    from tcl.features import FeatureSet

    r = _run(variant, study_data, source_kb, tmp_path)
    root, _ = study_data
    test = FeatureSet.load(root / "splits" / TARGET / "test.npz")
    assert r["platform"] == TARGET and r["label"] == variant and r["seed"] == 0 and r["sources"] == [SOURCE]
    for key in ("top1", "top5", "task_top1", "task_top5", "pairwise", "spearman"):
        assert 0.0 <= r[key] <= 1.0 or (key == "spearman" and -1.0 <= r[key] <= 1.0), key
    assert r["n_programs"] == len(test) and set(r["per_network"]) == {"net0", "net1", "net2"}
    assert set(r["sources_top1_after"]) == {SOURCE}
    subset = FeatureSet.load(root / "subset.npz")
    expected = {"scratch-100": len(FeatureSet.load(root / "splits" / TARGET / "train.npz")),
                "mtl": len(subset) + len(FeatureSet.load(root / "splits" / SOURCE / "train.npz"))}
    assert r["train_programs"] == expected.get(variant, len(subset))
    if variant in ("scratch-10", "scratch-100", "mtl"):
        assert r["sources_top1_before"] == {} and r["target_before"] is None and r["curves"] == []
    else:  # from the source KB: its top-1 on the source before, the drop = before - after
        kb = load_model(source_kb / "model.pt")
        src = FeatureSet.load(root / "splits" / SOURCE / "test.npz")
        assert r["sources_top1_before"][SOURCE] == pytest.approx(M.evaluate(kb.predict_features(src), src)["top1"])
        assert r["sources_top1_drop"][SOURCE] == pytest.approx(
            r["sources_top1_before"][SOURCE] - r["sources_top1_after"][SOURCE])
        assert r["target_before"]["top1"] == pytest.approx(M.evaluate(kb.predict_features(test), test)["top1"])
    what = {"scratch-10": "scratch", "scratch-100": "scratch", "mtl": "mtl", "ckd-no-kd": "ac"}
    assert r["model"] == what.get(variant, "kb")


def test_ablations_change_only_what_they_name(study_data, source_kb, tmp_path, one_torch_thread):
    """ckd: Φ by the KB-quality rule (recomputed by hand) and a positive EWC term in KD;
    ckd-fixed-phi: Φ = 1 in every CL epoch; ckd-no-ewc: the EWC term is 0 in every KD epoch;
    ckd-no-kd: no KD epoch, the result is the AC (the ac preset)."""
    from tcl.features import FeatureSet

    root, study = study_data
    ckd = _run("ckd", study_data, source_kb, tmp_path)
    kb = load_model(source_kb / "model.pt")
    q = teacher_quality(kb, FeatureSet.load(root / "subset.npz"))
    phi = PARAMS["continual"]["phi"]
    hand = [max(phi["floor"], min(max(q / phi["trust"], 0.0), 1.0) * phi["decay"] ** e)
            for e in range(PARAMS["continual"]["cl"]["epochs"])]
    assert ckd["phi"] == pytest.approx(hand) and ckd["teacher_quality"] == pytest.approx(q)
    assert len(ckd["loss_ewc"]) == 3 and max(ckd["loss_ewc"]) > 0

    fixed = _run("ckd-fixed-phi", study_data, source_kb, tmp_path)
    assert fixed["phi"] == [1.0] * PARAMS["continual"]["cl"]["epochs"]
    assert fixed["phi"] != ckd["phi"]
    # curves_for (default: ckd): the other runs read their curves on the validation split, without
    # the source KB's (read on the test split)
    assert fixed["curves_split"] == "valid" and {row["learning"] for row in fixed["curves"]} == {TARGET}

    no_ewc = _run("ckd-no-ewc", study_data, source_kb, tmp_path)
    assert len(no_ewc["loss_ewc"]) == 3 and all(v == 0.0 for v in no_ewc["loss_ewc"])
    assert no_ewc["phi"] == pytest.approx(ckd["phi"])

    no_kd = _run("ckd-no-kd", study_data, source_kb, tmp_path)
    assert no_kd["loss_ewc"] == [] and no_kd["model"] == "ac"
    assert not [r for r in no_kd["curves"] if r["learning"] == TARGET and r["phase"] == "kd"]
    assert run_params(PARAMS, study, 0, "ckd-no-kd")["continual"]["kd"]["epochs"] == 0
    assert run_params(PARAMS, study, 0, "ckd")["continual"]["kd"]["epochs"] == 3
    # the guard variants change only the KD guard's sources (and, with replay, the rehearsal)
    guard = {v: run_params(PARAMS, {**study, "replay": 0.5}, 0, v)["continual"]
             for v in ("ckd", "ckd-guard", "ckd-replay-guard", "ckd-guard-top1", "ckd-replay-guard-top1")}
    assert guard["ckd"].get("kd_guard_splits") is None and guard["ckd"].get("replay") is None
    assert guard["ckd-guard"]["kd_guard_splits"] == ["valid", "train"] and guard["ckd-guard"].get("replay") is None
    assert guard["ckd-replay-guard"]["replay"] == 0.5 and guard["ckd-replay-guard"]["kd_guard_splits"] == ["valid", "train"]
    for v in ("ckd-guard-top1", "ckd-replay-guard-top1"):
        assert (guard[v]["kd_guard_splits"], guard[v]["kd_guard_metric"], guard[v]["kd_guard_tolerance"]) == (
            ["train"], "top1", 0.02)
    assert guard["ckd-replay-guard-top1"]["replay"] == 0.5
    # ckd-cv: the guard's folds (the study's cv_folds, default 4), nothing else
    for folds, over in ((4, {}), (3, {"cv_folds": 3})):
        cv = run_params(PARAMS, {**study, **over}, 0, "ckd-cv")["continual"]
        assert cv == {**guard["ckd"], "kd_guard_folds": folds}
        cv_top1 = run_params(PARAMS, {**study, **over}, 0, "ckd-cv-top1")["continual"]
        assert cv_top1 == {**cv, "kd_guard_fold_metric": "task_top1"}


def test_finetune_wise_interpolates_between_the_source_kb_and_finetune(study_data, source_kb, tmp_path,
                                                                      one_torch_thread):
    """α = 1 is finetune, α = 0 the source KB; on the default grid the α kept has the best
    validation score (ties: the smaller)."""
    root, study = study_data
    finetune = _run("finetune", study_data, source_kb, tmp_path)
    wise = _run("finetune-wise", study_data, source_kb, tmp_path)
    scores = {float(a): v for a, v in wise["wise"]["valid"].items()}
    assert sorted(scores) == [0.0, 0.25, 0.5, 0.75, 1.0] and wise["wise"]["select"].startswith("valid_")
    best = max(scores.values())
    assert wise["wise"]["alpha"] == min(a for a, v in scores.items() if v == best)
    for alpha, same_as in ((1.0, finetune), (0.0, finetune["target_before"])):
        r = run_variant("finetune-wise", "fam", PARAMS, {**study, "wise_alphas": [alpha]}, 0, tmp_path / "w.json",
                        source_kb=source_kb, splits_dir=root / "splits")
        assert r["wise"]["alpha"] == alpha
        for key in ("top1", "top5", "task_top1"):
            assert r[key] == pytest.approx(same_as[key], abs=1e-12), (alpha, key)


def test_ckd_curves_follow_the_schedule_with_every_seen_platform(study_data, source_kb, tmp_path, one_torch_thread):
    """Figure 8's rows: the source KB's phases (source CL, KD), then the target's (AC start, CL,
    KD), each epoch with the top-1 of every platform seen so far on its test split."""
    from tcl import metrics as M
    from tcl.features import FeatureSet

    root, _ = study_data
    r = _run("ckd", study_data, source_kb, tmp_path)
    phases = [(row["learning"], row["phase"]) for row in r["curves"]]
    assert list(dict.fromkeys(phases)) == [(SOURCE, "cl"), (SOURCE, "kd"), (TARGET, "ac-init"), (TARGET, "cl"),
                                           (TARGET, "kd")]
    assert all(set(row["top1"]) == {SOURCE} for row in r["curves"] if row["learning"] == SOURCE)
    assert all(set(row["top1"]) == {SOURCE, TARGET} for row in r["curves"] if row["phase"] in ("cl", "kd")
               and row["learning"] == TARGET)
    assert all(row["phi"] == p for row, p in zip([x for x in r["curves"] if x["learning"] == TARGET and
                                                   x["phase"] == "cl"], r["phi"]))
    # read on the test split: the source KB's last KD epoch kept is the KB the study scored before
    study = json.loads((source_kb / "study.json").read_text())
    test = FeatureSet.load(root / "splits" / SOURCE / "test.npz")
    kb = load_model(source_kb / "model.pt")
    assert study["kb_held_out"][SOURCE]["top1"] == pytest.approx(M.evaluate(kb.predict_features(test), test)["top1"])
    assert r["curves_split"] == "test"


def test_all_sources_continue_the_cross_kb_and_a_mismatched_kb_is_refused(study_data, tmp_path, one_torch_thread):
    from tcl.continual.ewc import EWCState

    root, study = study_data
    learn_sources("fam", "cross", PARAMS, study, 0, tmp_path / "cross", root / "splits")
    res = learn_sources("fam", "all", PARAMS, study, 0, tmp_path / "all", root / "splits", start=tmp_path / "cross")
    kb = load_model(tmp_path / "all" / "model.pt")
    assert EWCState.from_model(kb).platforms == [OTHER, SOURCE]
    assert set(res["kb_held_out"]) == {OTHER, SOURCE}
    assert [row["learning"] for row in res["curves"]][0] == OTHER and res["curves"][-1]["learning"] == SOURCE
    r = run_variant("ckd", "fam", PARAMS, study, 0, tmp_path / "c.json", sources="all", source_kb=tmp_path / "all",
                    splits_dir=root / "splits")
    assert set(r["sources_top1_after"]) == {OTHER, SOURCE} and r["sources_set"] == "all"
    with pytest.raises(StudyError, match="not of source set 'same'"):
        run_variant("ckd", "fam", PARAMS, study, 0, tmp_path / "x.json", sources="same", source_kb=tmp_path / "all",
                    splits_dir=root / "splits")
    with pytest.raises(StudyError, match="not a beginning of source set 'cross'"):
        learn_sources("fam", "cross", PARAMS, study, 0, tmp_path / "y", root / "splits", start=tmp_path / "all")
    with pytest.raises(StudyError, match="unknown variant"):
        run_params(PARAMS, study, 0, "ckd-no-everything")
    with pytest.raises(StudyError, match="starts from the source KB"):
        run_variant("finetune", "fam", PARAMS, study, 0, tmp_path / "z.json", splits_dir=root / "splits")
    with pytest.raises(StudyError, match="does not start from a source KB"):
        run_variant("mtl", "fam", PARAMS, study, 0, tmp_path / "z.json", source_kb=tmp_path / "all",
                    splits_dir=root / "splits")


def test_cli_runs_a_variant_and_names_a_missing_family(study_data, source_kb, tmp_path, one_torch_thread):
    import yaml

    from tcl.cli import main

    root, study = study_data
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(PARAMS))
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    common = ["--seed", "1", "--study-params", str(tmp_path / "study.yaml"), "--params", str(tmp_path / "params.yaml"),
              "--splits", str(root / "splits")]
    res = CliRunner().invoke(main, ["ckd-study", "run", "fam", "--variant", "scratch-10", "--out",
                                    str(tmp_path / "m.json"), *common])
    assert res.exit_code == 0, res.output
    assert f"{TARGET} top-1" in res.output and json.loads((tmp_path / "m.json").read_text())["seed"] == 1
    bad = CliRunner().invoke(main, ["ckd-study", "sources", "nofam", "--sources", "same", "--out",
                                    str(tmp_path / "kb"), *common])
    assert bad.exit_code != 0 and "family 'nofam' is not under `families:`" in bad.output


# ---------------------------------------------------------------------------------------------
# the multi-task model


def test_mtl_scores_each_platform_with_its_own_head_float64_reference(one_torch_thread):
    torch.manual_seed(0)
    model = new_model("mtl", F, {**TINY["kb"], "platforms": ["a", "b"]}, {"max_len": L, "n_features": F})
    a, b = make_fs(seed=1, platform="a"), make_fs(seed=1, platform="b")  # same programs, two platforms
    x = torch.from_numpy(a.x[:16])
    with torch.no_grad():
        pooled = model.net.pool(x, torch.from_numpy(a.mask[:16])).double()  # (16, d_model)

    def by_hand(head):  # Linear -> SiLU -> Linear in float64
        w1, b1, w2, b2 = (t.detach().double() for t in (head[0].weight, head[0].bias, head[2].weight, head[2].bias))
        h = pooled @ w1.T + b1
        return ((h * torch.sigmoid(h)) @ w2.T + b2).squeeze(-1).numpy()

    got_a = model.predict_features(a.subset(np.arange(16)))
    got_b = model.predict_features(b.subset(np.arange(16)))
    np.testing.assert_allclose(got_a, by_hand(model.net.heads[0]), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_b, by_hand(model.net.heads[1]), rtol=1e-5, atol=1e-6)
    assert not np.allclose(got_a, got_b)  # two heads, each with its own initial weights
    assert model.predict(a.x[:16], a.mask[:16]).shape == (16,)  # no platform named: the last head's
    np.testing.assert_allclose(model.predict(a.x[:16], a.mask[:16]), got_b, rtol=1e-6)
    assert model.embed(a.x[:16], a.mask[:16]).shape == (16, TINY["kb"]["d_model"])


def test_mtl_training_moves_only_the_heads_of_the_platforms_it_sees_and_round_trips(tmp_path, one_torch_thread):
    from tcl.training import train_model

    torch.manual_seed(0)
    model = new_model("mtl", F, {**TINY["kb"], "platforms": ["a", "b", "c"]}, {"max_len": L, "n_features": F})
    before = {k: v.clone() for k, v in model.net.state_dict().items()}
    train_model(model, [make_fs(seed=1, platform="a"), make_fs(seed=2, platform="c")],
                [make_fs(seed=3, n_tasks=4, platform="c")], {**PARAMS["train"], "epochs": 2}, tmp_path / "fit")
    after = model.net.state_dict()
    changed = {k for k in after if not torch.equal(after[k], before[k])}
    assert any(k.startswith("heads.0.") for k in changed) and any(k.startswith("heads.2.") for k in changed)
    assert not any(k.startswith("heads.1.") for k in changed)  # platform b had no batch
    assert any(k.startswith("backbone.") for k in changed)
    loaded = load_model(tmp_path / "fit")
    fs = make_fs(seed=4, platform="a")
    np.testing.assert_array_equal(loaded.predict_features(fs), model.predict_features(fs))
    assert loaded.kind == "mtl" and loaded.config["platforms"] == ["a", "b", "c"]
    with pytest.raises(NotImplementedError):
        model.to_onnx(L)
    with pytest.raises(ValueError, match="distinct platform names"):
        new_model("mtl", F, {**TINY["kb"], "platforms": []})


def test_fixed_phi_is_a_constant_and_is_range_checked():
    assert [phi_at(e, q, {"fixed": 0.3}) for e, q in ((0, 0.9), (5, -1.0), (50, float("nan")))] == [0.3] * 3
    with pytest.raises(ValueError, match="phi.fixed"):
        phi_at(0, 0.5, {"fixed": 1.5})


# ---------------------------------------------------------------------------------------------
# the summary


def _metrics(family, variant, seed, top1, sources_set="same", drop=None, curves=(), before=None):
    return {"family": family, "platform": "t", "label": variant, "variant": variant, "sources_set": sources_set,
            "seed": seed, "sources": ["s"], "model": "kb", "kind": "mamba", "top1": top1, "top5": 0.9,
            "task_top1": top1 / 2, "task_top5": 1.0, "pairwise": 0.6, "spearman": 0.2, "per_network": {},
            "seconds": 10.0 + seed, "train_programs": 25,
            "sources_top1_drop": {} if drop is None else {"s": drop, "s2": drop - 0.1},
            "curves": list(curves), "kd_kept_start": None if variant != "ckd" else seed == 1,
            "target_before": None if before is None else {"top1": before, "top5": 0.8, "task_top1": 0.4,
                                                          "task_top5": 0.9}}


def test_summary_tables_targets_and_curves_by_hand(tmp_path):
    m = tmp_path / "metrics"
    m.mkdir()
    curve = lambda v: [{"learning": "s", "phase": "cl", "model": "ac", "epoch": 0, "top1": {"s": v}},  # noqa: E731
                       {"learning": "t", "phase": "cl", "model": "ac", "epoch": 0, "top1": {"s": v, "t": v / 2}}]
    runs = [_metrics("f", "ckd", 0, 0.6, drop=0.01, curves=curve(0.4), before=0.55),
            _metrics("f", "ckd", 1, 0.8, drop=0.03, curves=curve(0.6), before=0.65),
            _metrics("f", "scratch-100", 0, 0.5), _metrics("f", "scratch-100", 1, 0.9),
            _metrics("f", "finetune", 0, 0.5, drop=0.2), _metrics("f", "scratch-10", 0, 0.3),
            _metrics("f", "ckd", 0, 0.4, sources_set="cross", drop=0.0)]
    for i, r in enumerate(runs):
        (m / f"{i}.json").write_text(json.dumps(r))
    out = tmp_path / "out"
    cmd = [sys.executable, str(REPO / "pipelines" / "continual" / "summarize_study.py"), "--metrics", str(m),
           "--out", str(out / "s.json"), "--markdown", str(out / "s.md"), "--plots", str(out / "plots"),
           "--png-ablation", str(out / "a.png"), "--png-curves", str(out / "c.png"),
           "--png-sources", str(out / "t.png")]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    s = json.loads((out / "s.json").read_text())
    ckd = s["ablation"]["f"]["ckd"]
    # mean of {0.6, 0.8}, sample sd sqrt(0.02); the worst source's drop per run {0.01, 0.03}
    assert ckd["top1"] == 0.7 and ckd["top1_sd"] == round(math.sqrt(0.02), 4) and ckd["task_top1"] == 0.35
    assert ckd["source_drop"] == 0.02 and ckd["source_drop_max"] == 0.03
    # targets: ckd 0.7 = scratch-100 0.7 (>=), > finetune 0.5; the worst drop 0.03 > 2 points
    assert s["targets"]["f"] == {"ckd_ge_scratch_100": True, "ckd_ge_finetune": True, "source_drop_max": 0.03,
                                 "source_drop_le_2_points": False}
    assert set(s["ablation"]["f"]) == {"source-kb", "scratch-10", "scratch-100", "finetune", "ckd"}
    assert s["ablation"]["f"]["source-kb"]["top1"] == 0.6  # the source KB on the target: mean of 0.55, 0.65
    assert s["sources"]["f"]["none"] == {"n_runs": 1, "top1": 0.3, "top1_sd": 0.0, "top5": 0.9, "top5_sd": 0.0,
                                         "task_top1": 0.15, "task_top1_sd": 0.0, "task_top5": 1.0,
                                         "task_top5_sd": 0.0}
    assert set(s["sources"]["f"]) == {"none", "same", "cross"}
    assert s["sources"]["f"]["cross"]["top1"] == 0.4 and s["sources"]["f"]["same"]["top1"] == 0.7
    md = (out / "s.md").read_text()
    assert "| f | t | ckd | kb | 2 | 25 | 0.700 ± 0.141 |" in md and "| 0.020 ± 0.014 | 1/2 | 10 |" in md
    assert ckd["kd_kept_start"] == "1/2"  # seed 1's KD guard kept the source KB
    table5 = [line.split(" | ")[2] for line in md.split("## (c)")[1].splitlines() if line.startswith("| f |")]
    assert table5 == ["none", "same", "cross"]  # Table 5's rows: no source, then same, cross, all
    # Figure 8 rows: per step, the mean over seeds of each seen platform
    assert json.loads((out / "plots" / "curves.json").read_text()) == [
        {"family": "f", "step": 0, "phase": "cl s", "s": 0.5},
        {"family": "f", "step": 1, "phase": "cl t", "s": 0.5, "t": 0.25}]
    for png in ("a.png", "c.png", "t.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
