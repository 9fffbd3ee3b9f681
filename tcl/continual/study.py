"""The CKD studies (issue 13 item 8): one run of one transfer variant, for one family and seed.

A study's params (``pipelines/continual/params.yaml``) name, per family, the target platform, the
target's sampled subset and the source sets (``same``: the family's other platforms; ``cross``:
other families' platforms; ``all``: cross then same), the overrides of the root params.yaml that
size every run (``params``), the baselines' training settings (``baseline_train``), the constant
Φ of the ablation (``fixed_phi``), the split the curves are read on (``curves``) and the variants
whose runs read it (``curves_for``, with the ``same`` source KBs they start from; the other runs
read their curves on the validation split, ~10× cheaper per epoch).

* :func:`learn_sources`: the KB of a source set through the CKD schedule (tcl.continual.schedule
  ``run_schedule``), from nothing or continuing a source set's KB (``all`` continues ``cross``).
* :func:`run_variant`: one variant on the target, scored on the target's test split (held-out
  networks), with every source's test top-1 before and after:

  ============== =========================================================================
  scratch-10     a KB-sized Mamba from scratch on the target's subset
  scratch-100    the same on the target's whole training split
  finetune       the source KB fine-tuned on the subset (no teacher, no EWC)
  finetune-wise  finetune, then its weights interpolated with the source KB's,
                 θ = (1 − α)·θ_source + α·θ_finetuned (WiSE-FT, Wortsman et al. 2022), α of the
                 study's ``wise_alphas`` with the best validation `select` (ties: the smallest α)
  mtl            a shared KB-sized backbone with one head per platform (tcl.models.multihead),
                 trained on the sources' training splits and the subset (MTL-TLP's baseline)
  ckd            the schedule's target step: AC start, CL, KD into the source KB
  ckd-fixed-phi  ckd with Φ_t constant (``continual.phi.fixed`` = ``fixed_phi``)
  ckd-no-ewc     ckd with λ = 0 (``continual.lambda_ewc``): the KD term without EWC
  ckd-no-kd      ckd without the KD phase (``continual.kd.epochs`` 0): the result is the AC
                 after target CL, the larger model (``models.mamba.ac``), not a KB
  ckd-pool       ckd with the target's whole training split as unmeasured programs
                 (tcl.continual.schedule ``unmeasured``: features only, labels blanked): every
                 distillation term also runs on them; the labels are the subset's alone
  ckd-grow       ckd with the AC started as the source KB grown to the AC's sizes
                 (``continual.ac_init`` grow, tcl.models.grow) instead of distilled into a
                 fresh AC
  ckd-replay     ckd with rehearsal (``continual.replay`` = the study's ``replay``): target CL
                 and KD also train on that many times the subset's size of each source's
                 training programs (tcl.continual.schedule ``replay_sets``)
  ckd-guard      ckd whose KD guard also judges each source's loss on its training programs, not
                 only on its validation split (the study's ``guard``: ``continual.kd_guard_splits``)
  ckd-replay-guard  ckd-replay with ckd-guard's guard
  ckd-guard-top1 ckd whose KD guard judges each source's loss in top-1 on its training programs,
                 the issue's own bound (the study's ``guard_top1``: ``kd_guard_splits`` train,
                 ``kd_guard_metric`` top1, ``kd_guard_tolerance`` 0.02)
  ckd-replay-guard-top1  ckd-replay with ckd-guard-top1's guard
  ckd-cv         ckd whose KD guard also judges the target on the subset's own tasks,
                 cross-validated in the study's ``cv_folds`` folds (``continual.kd_guard_folds``,
                 tcl.continual.crossval), KD's early stopping off
  ckd-cv-top1    ckd-cv with each judged task scored in task top-1 instead of pairwise accuracy
                 (``continual.kd_guard_fold_metric`` task_top1)
  ckd-sig        ckd whose KD guard takes an epoch only when its per-task gain on the target's
                 validation tasks is at least the study's ``min_gain_se`` (2) standard errors
                 (``continual.kd_guard_min_gain_se``; params.yaml's own setting since it was
                 adopted, so the same as ckd unless the study's params set another)
  ============== =========================================================================

  The ckd variants are the schedule configured, not other code; the baselines train with
  tcl.training. Every variant's early stopping reads the target's validation split only.

Both write JSON with ``curves``: per epoch of every phase of the schedule so far (the source
KB's phases, then the target's), the top-1 of every seen platform on ``curves``' split (test:
the held-out networks; reported only, nothing is chosen by it): the paper's Figure 8.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from tcl.continual.schedule import (PlatformData, held_out_metrics, load_platform, new_net_model, run_schedule,
                                    settings, unmeasured)
from tcl.io import atomic_write_json, json_safe

BASELINES = ("scratch-10", "scratch-100", "mtl")        # need no source KB
FROM_KB = ("finetune", "finetune-wise", "ckd", "ckd-fixed-phi", "ckd-no-ewc", "ckd-no-kd", "ckd-pool", "ckd-grow",
           "ckd-replay", "ckd-guard", "ckd-replay-guard", "ckd-guard-top1",
           "ckd-replay-guard-top1", "ckd-cv", "ckd-cv-top1", "ckd-sig")  # start from the source KB
VARIANTS = BASELINES[:2] + ("finetune", "mtl") + FROM_KB[1:]
WISE_ALPHAS = (0.0, 0.25, 0.5, 0.75, 1.0)  # finetune-wise's grid unless the study's params give one
CURVE_SPLITS = ("test", "valid")
STUDY_FILE = "study.json"  # beside a source KB's model.pt: its curves and held-out metrics
TARGET_KEYS = ("top1", "top5", "task_top1", "task_top5", "pairwise", "spearman", "per_network",
               "n_programs", "n_tasks", "n_networks")


class StudyError(ValueError):
    """A study run that cannot start (unknown family or variant, missing data, a mismatched KB)."""


# ---------------------------------------------------------------------------------------------
# settings


def _merged(base: dict, over: dict) -> dict:
    """`over` on `base`, dicts merged at every depth."""
    out = dict(base)
    for k, v in (over or {}).items():
        out[k] = _merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def family_settings(study: dict, family: str) -> dict:
    """``families.<family>`` of the study's params: {target, subset, sources: {set: [platforms]}}."""
    families = study.get("families") or {}
    if family not in families:
        raise StudyError(f"family {family!r} is not under `families:` of the study's params "
                         f"(known: {', '.join(sorted(families)) or 'none'})")
    fam = families[family]
    missing = [k for k in ("target", "subset", "sources") if not fam.get(k)]
    if missing:
        raise StudyError(f"families.{family} of the study's params lacks {', '.join(missing)}")
    for name, platforms in fam["sources"].items():
        if not platforms or fam["target"] in platforms:
            raise StudyError(f"families.{family}.sources.{name}: a non-empty list without the target "
                             f"{fam['target']!r} (got {platforms!r})")
    return fam


def source_names(fam: dict, family: str, sources: str) -> list[str]:
    """The platforms of source set `sources` of a family's settings (`family_settings`)."""
    names = list(fam["sources"].get(sources) or [])
    if not names:
        raise StudyError(f"families.{family}.sources has no set {sources!r} (sets: {', '.join(fam['sources'])})")
    return names


def run_params(root: dict, study: dict, seed: int, variant: str = "ckd") -> dict:
    """The root params with the study's ``params`` over them, ``train.seed`` = `seed`, and the
    ablation's one change for a ckd variant."""
    if variant not in VARIANTS:
        raise StudyError(f"unknown variant {variant!r} (one of {', '.join(VARIANTS)})")
    params = _merged(root, study.get("params") or {})
    params = _merged(params, {"train": {"seed": int(seed)}})
    replay = float(study.get("replay", 1.0))
    folds = int(study.get("cv_folds", 4))  # ckd-cv*: the KD guard's cross-validation folds
    guard = dict(study.get("guard") or {"kd_guard_splits": ["valid", "train"]})
    guard_top1 = dict(study.get("guard_top1") or {"kd_guard_splits": ["train"], "kd_guard_metric": "top1",
                                                  "kd_guard_tolerance": 0.02})
    change = {"ckd-fixed-phi": {"phi": {"fixed": float(study.get("fixed_phi", 1.0))}},
              "ckd-no-ewc": {"lambda_ewc": 0.0},
              "ckd-no-kd": {"kd": {"epochs": 0}},
              "ckd-grow": {"ac_init": "grow"},
              "ckd-replay": {"replay": replay},
              "ckd-guard": guard,
              "ckd-replay-guard": {"replay": replay, **guard},
              "ckd-guard-top1": guard_top1,
              "ckd-replay-guard-top1": {"replay": replay, **guard_top1},
              "ckd-cv": {"kd_guard_folds": folds},
              "ckd-cv-top1": {"kd_guard_folds": folds, "kd_guard_fold_metric": "task_top1"},
              "ckd-sig": {"kd_guard_min_gain_se": float(study.get("min_gain_se", 2.0))}}.get(variant)
    if change:
        params = _merged(params, {"continual": change})
    settings(params)  # a clear error for a bad continual section
    return params


def baseline_train_params(params: dict, study: dict) -> dict:
    """The baselines' training settings: ``train:``, ``pipeline.train``, ``continual.select`` (the
    early-stopping metric of every CKD phase), then the study's ``baseline_train``."""
    from tcl.training import DEFAULT_TRAIN

    return {**DEFAULT_TRAIN, **(params.get("train") or {}), **((params.get("pipeline") or {}).get("train") or {}),
            "select": settings(params)["select"], **(study.get("baseline_train") or {})}


# ---------------------------------------------------------------------------------------------
# data


def _platform(name: str, splits_dir, curves: str) -> PlatformData:
    d = load_platform(name, splits_dir)
    if d.train is None or d.valid is None or d.test is None:
        raise StudyError(f"platform {name!r}: the study needs train, valid and test splits under "
                         f"{Path(splits_dir) / name}")
    d.curve = d.test if curves == "test" else d.valid
    return d


def _curve_split(study: dict, sources: str, variant: str | None = None) -> str:
    """``curves`` for the runs of ``curves_for`` on the ``same`` sources and for the ``same``
    source KBs they start from (`variant` None), the validation split for the others."""
    curves = str(study.get("curves", "test"))
    if curves not in CURVE_SPLITS:
        raise StudyError(f"curves must be one of {', '.join(CURVE_SPLITS)}, not {curves!r}")
    wanted = sources == "same" and (variant is None or variant in (study.get("curves_for") or ["ckd"]))
    return curves if wanted else "valid"


# ---------------------------------------------------------------------------------------------
# curves


def schedule_curves(summary: dict) -> list[dict]:
    """One row per epoch of every phase of a run_schedule summary, in order: {learning (the
    platform the phase learns), phase (ac-init | cl | kd), model (ac | kb), epoch (within the
    phase), top1: {seen platform: top-1}, and phi (CL) / loss_ewc (KD) where logged}."""
    rows = []
    for report in summary["per_platform"]:
        phases = (("ac-init", "ac", report.get("ac_init") or []), ("cl", "ac", report["cl"]["epochs"]),
                  ("kd", "kb", report["kd"]["epochs"]))
        for phase, model, epochs in phases:
            for r in epochs:
                row = {"learning": report["platform"], "phase": phase, "model": model, "epoch": int(r["epoch"]),
                       "top1": {k[len("seen_"):-len("_top1")]: v for k, v in r.items()
                                if k.startswith("seen_") and k.endswith("_top1")}}
                row.update({k: r[k] for k in ("phi", "loss_ewc", "loss_distill") if k in r})
                rows.append(row)
    return rows


def _held_top1(model, platforms: list[PlatformData]) -> dict:
    return {p: m["top1"] for p, m in held_out_metrics(model, platforms).items()}


# ---------------------------------------------------------------------------------------------
# source KBs


def learn_sources(family: str, sources: str, root: dict, study: dict, seed: int, out: str | os.PathLike,
                  splits_dir: str | os.PathLike = "data/splits", start: str | os.PathLike | None = None) -> dict:
    """The KB of source set `sources` (``families.<family>.sources.<sources>``) through the CKD
    schedule, each platform from its whole training split. `start`: a source KB directory whose
    platforms begin the set (``all`` from ``cross``); the rest are learned after them. Writes
    ``out/model.pt`` and ``out/study.json`` (curves, the KB's held-out top-1/top-5 per platform,
    seconds); returns the latter."""
    from tcl.continual.ewc import EWCState
    from tcl.models import load_model

    t0 = time.perf_counter()
    fam = family_settings(study, family)
    curves = _curve_split(study, sources)
    names = source_names(fam, family, sources)
    params = run_params(root, study, seed)
    kb, done, before_curves = None, [], []
    if start is not None:
        kb = load_model(Path(start) / "model.pt")
        state = EWCState.from_model(kb)
        done = list(state.platforms) if state else []
        if names[:len(done)] != done or len(done) >= len(names):
            raise StudyError(f"{start}: a KB of {done}, not a beginning of source set {sources!r} {names}")
        before_curves = _start_curves(start, curves)
    learned = [_platform(p, splits_dir, curves) for p in done]
    todo = [_platform(p, splits_dir, curves) for p in names[len(done):]]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tcl-ckd-study-") as tmp:
        summary = run_schedule(family, todo, params, tmp, track=False, start=kb, learned=learned)
        shutil.copyfile(Path(tmp) / "model.pt", out / "model.pt")
    result = json_safe({"family": family, "sources": sources, "platforms": names, "seed": int(seed),
                        "start": str(start) if start else None, "kb_held_out": summary["kb_held_out"],
                        "curves_split": curves, "curves": before_curves + schedule_curves(summary),
                        "seconds": time.perf_counter() - t0})
    atomic_write_json(out / STUDY_FILE, result)
    return result


def _start_curves(kb_dir, split: str) -> list[dict]:
    """The curves of the schedule that made a source KB, when read on the same split."""
    study = _read_study(kb_dir)
    return study["curves"] if study.get("curves_split") == split else []


def _read_study(kb_dir) -> dict:
    import json

    path = Path(kb_dir) / STUDY_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise StudyError(f"{path}: not a source KB of the study ({exc})") from None


# ---------------------------------------------------------------------------------------------
# variants


def run_variant(variant: str, family: str, root: dict, study: dict, seed: int, out: str | os.PathLike,
                sources: str = "same", source_kb: str | os.PathLike | None = None,
                splits_dir: str | os.PathLike = "data/splits") -> dict:
    """One variant (module docstring) on `family`'s target for one seed; writes the metrics JSON
    `out` and returns it: the target's test metrics at the top level (``top1``, ``top5``,
    ``task_top1``, ... as tcl.metrics.evaluate; ``platform`` the target, ``label`` the variant),
    ``model`` (kb | ac | scratch | mtl: what was scored), ``target_before`` (the source KB's),
    ``sources_top1_before`` / ``_after`` / ``_drop`` per source, ``train_programs``, ``phi``,
    ``loss_ewc`` (per KD epoch), ``kd_kept_start``, ``curves``, ``seconds``."""
    from tcl import metrics as M
    from tcl.continual.ewc import EWCState
    from tcl.features import FeatureFileError, load_feature_set
    from tcl.models import load_model

    t0 = time.perf_counter()
    fam = family_settings(study, family)
    params = run_params(root, study, seed, variant)
    curves = _curve_split(study, sources, variant)
    names = source_names(fam, family, sources)
    if variant in FROM_KB and source_kb is None:
        raise StudyError(f"variant {variant} starts from the source KB: give its directory")
    if variant in BASELINES and source_kb is not None:
        raise StudyError(f"variant {variant} does not start from a source KB (it learns without one)")
    target = _platform(fam["target"], splits_dir, curves)
    try:
        subset = load_feature_set(fam["subset"])
    except FeatureFileError as exc:
        raise StudyError(str(exc)) from None
    if subset.platform != target.platform:
        raise StudyError(f"{fam['subset']} holds programs of {subset.platform!r}, not the target {target.platform!r}")
    src = [_platform(p, splits_dir, curves) for p in names]

    kb, before, target_before, start_curves = None, {}, None, []
    if source_kb is not None:
        kb = load_model(Path(source_kb) / "model.pt")
        state = EWCState.from_model(kb)
        if state is None or list(state.platforms) != names:
            raise StudyError(f"{source_kb}: a KB of {state.platforms if state else 'no recorded platforms'}, "
                             f"not of source set {sources!r} {names}")
        before = _held_top1(kb, src)
        target_before = {k: v for k, v in M.evaluate(kb.predict_features(target.test), target.test).items()
                         if k in ("top1", "top5", "task_top1", "task_top5")}
        start_curves = _start_curves(source_kb, curves)

    extra: dict = {}
    with tempfile.TemporaryDirectory(prefix="tcl-ckd-study-") as tmp:
        if variant.startswith("ckd"):
            if variant == "ckd-pool":  # the programs the subset was chosen from, unmeasured
                target.pool = unmeasured(target.train)
            target.train, target.train_file = subset, str(fam["subset"])
            summary = run_schedule(family, [target], params, tmp, track=False, start=kb, learned=src)
            report = summary["per_platform"][-1]
            result_model, model_name = load_model(Path(tmp) / "model.pt"), "kb"
            if variant == "ckd-no-kd":
                result_model, model_name = load_model(report["ac_checkpoint"]), "ac"
            extra = {"phi": report["cl"]["phi"], "teacher_quality": report["cl"]["quality"],
                     "loss_ewc": [r.get("loss_ewc", 0.0) for r in report["kd"]["epochs"]],
                     "kd_kept_start": report["kd"]["kept_start"],
                     # the guard's view: its kept epoch, the target's score before and kept, the
                     # folds' cross-validated curve (ckd-cv), and per KD epoch what it read
                     "kd_guard": {k: report["kd"][k] for k in ("kept_epoch", "start_valid", "end_valid", "cv")
                                  if k in report["kd"]},
                     "kd_guard_epochs": [{k: r[k] for k in ("epoch", "guard_target", "guard_cv",
                                                             "guard_worst_source_drop") if k in r}
                                         for r in report["kd"]["epochs"]],
                     "curves": start_curves + schedule_curves(summary)}
            train_programs = len(subset)
        else:
            kb_start = ({k: v.detach().clone() for k, v in kb.net.state_dict().items()}
                        if variant == "finetune-wise" else None)  # the source KB's, before fine-tuning moves them
            result_model, model_name, train_programs = _train_baseline(
                variant, kb, target, subset, src, params, study, seed, tmp)
            if variant == "finetune-wise":
                extra = {"wise": interpolate_to_best(result_model, kb_start, target.valid,
                                                     baseline_train_params(params, study),
                                                     study.get("wise_alphas") or WISE_ALPHAS)}
    after = _held_top1(result_model, src)
    scored = M.evaluate(result_model.predict_features(target.test), target.test)
    result = json_safe({
        "family": family, "platform": target.platform, "label": variant, "variant": variant, "seed": int(seed),
        "sources_set": sources, "sources": names, "model": model_name, "kind": result_model.kind,
        **{k: scored[k] for k in TARGET_KEYS}, "target_before": target_before,
        "sources_top1_before": before, "sources_top1_after": after,
        "sources_top1_drop": {p: before[p] - after[p] for p in before if p in after},
        "train_programs": int(train_programs), "subset": str(fam["subset"]), "curves_split": curves,
        "phi": [], "loss_ewc": [], "kd_kept_start": None, "curves": [], **extra,
        "seconds": time.perf_counter() - t0})
    atomic_write_json(out, result)
    return result


def _train_baseline(variant, kb, target: PlatformData, subset, src: list[PlatformData], params: dict,
                    study: dict, seed: int, tmp) -> tuple[object, str, int]:
    """(trained model, what it is, training programs) for scratch-10/-100, finetune and mtl."""
    from tcl.models import model_config, new_model
    from tcl.training import feature_meta, seed_everything, train_model

    train_params = baseline_train_params(params, study)
    cfg = settings(params)
    n_features = int(subset.x.shape[2])
    if variant in ("finetune", "finetune-wise"):
        model, name, sets = kb, "kb", [subset]
    elif variant == "mtl":
        sets = [d.train for d in src] + [subset]
        config = {**model_config(cfg["kind"], params, cfg["kb_preset"]), "platforms": [fs.platform for fs in sets]}
        seed_everything(int(seed))
        model, name = new_model("mtl", n_features, config, feature_meta(sets)), "mtl"
    else:
        sets = [subset] if variant == "scratch-10" else [target.train]
        model, name = new_net_model(params, cfg, "kb", n_features, feature_meta(sets), int(seed)), "scratch"
    train_model(model, sets, [target.valid], train_params, tmp, progress=False, resume=False)
    return model, name, sum(len(fs) for fs in sets)


def interpolate_to_best(model, start: dict, valid, train_params: dict, alphas) -> dict:
    """Set `model`'s weights to ``(1 − α)·start + α·(its weights)`` for the α of `alphas` with the
    best validation `select` on `valid` (ties: the smallest α, the nearer the start); returns
    ``{"alpha", "select": the metric's key, "valid": {α: score}}``. Weights that are not floating
    point keep the model's."""
    import torch

    from tcl.training import selection_key, validate

    key = selection_key(train_params)
    tuned = {k: v.detach().clone() for k, v in model.net.state_dict().items()}

    def mix(alpha: float) -> None:
        model.net.load_state_dict({k: (torch.lerp(start[k].to(v.dtype), v, alpha) if v.is_floating_point() else v)
                                   for k, v in tuned.items()})

    scores = {}
    for alpha in sorted(float(a) for a in alphas):
        mix(alpha)
        scores[alpha] = float(validate(model, [valid])[key])
    best = max(scores, key=lambda a: (scores[a], -a))
    mix(best)
    return {"alpha": best, "select": key, "valid": scores}
