"""The CL and KD phases of continual knowledge distillation, and the two schedules built from them.

For each platform t of a family, in order (``learn_platform``):

1. **AC start**: a fresh AC (``continual.ac_preset``, larger than the KB). After the first
   platform it is taught the KB's ranking before it sees a label (``ac_init: distill``:
   ``ac_init_epochs`` epochs of L_distill(AC ← KB) alone, no labels) on the programs of every seen
   platform whose training data is at hand (the schedule: all; a transfer: the target's subset
   and the sources' training splits when present). The AC is larger than the KB, so weights
   cannot be copied as they are; distillation hands over the KB's function, and on the target's
   own programs exactly where the AC is about to learn. Measured: on the target's 10% subset
   alone (~200 programs, a dozen steps) the fresh AC stayed far below the KB. ``ac_init: grow``
   instead writes the KB's weights into the AC's leading slices (tcl.models.grow: the AC starts
   scoring as the KB does, its extra units scaled by ``ac_grow_noise``); ``ac_init: scratch``
   starts from the fresh AC (an ablation).
2. **CL** (KB frozen): ``L = L_task(AC, D_t) + β·Φ_t(epoch)·L_distill(AC ← KB)`` (tcl.continual.distill).
   Early stopping on D_t's validation set.
3. **KD** (AC frozen): ``L = L_distill(KB ← AC) + α·L_task(KB, D_t) + λ·Σ_i F_i (θ_i − θ*_i)²``
   on D_t's training programs (tcl.continual.ewc; no EWC term before the first platform is
   finished), at KD's lower learning rate (``kd_first`` over it for a fresh KB). α
   (``alpha_task``) > 0 departs from the paper's KD (α = 0, no labels): without it a family's
   first KB was only as good as a few-epoch AC (docs/continual.md). Early stopping on the mean
   validation ``select`` metric of every seen platform. ``kd_guard`` (a KB that already knows
   platforms) then decides which KB leaves the phase: ``target`` (default) keeps, of the KB it
   started from and every KD epoch, the best on D_t's validation ``select`` among those whose
   every earlier platform lost at most ``kd_guard_tolerance`` of it (learn the target, bounded
   forgetting), on each of ``kd_guard_splits`` of that platform (``valid``; ``train``: its
   training programs, where at hand), in ``kd_guard_metric`` (default ``select``); ``mean``
   keeps the starting KB when no epoch beats it on the mean over the seen platforms (measured:
   with three sources that mean hides the target's gain, and the guard kept the source KB in 10
   of 12 study runs, so the KB learned nothing of the target); ``none``
   keeps early stopping's epoch. Then the Fisher information of D_t is added to the KB's state.

**Rehearsal** (``replay`` > 0, off by default: the paper's CL and KD see D_t alone): once a KB
teaches, CL and KD also train on up to ``replay × |D_t|`` measured training programs of each
earlier platform at hand (:func:`replay_sets`; the same programs in both phases), each its own
set: CL's task and distillation terms and KD's distillation and task terms run on them too.

**Unmeasured programs** (``PlatformData.pool``, optional): programs of platform t whose features
are known but whose latencies are not (the pool a sampler chose D_t from; free to generate, costly
to measure). Where given, every distillation term also runs on them: the AC start and CL's
L_distill(AC ← KB), and KD's L_distill(KB ← AC), in batches of their own (a pool batch carries no
task loss); their labels are never read (:func:`unmeasured` blanks them). With 10% of a platform
measured, the teacher then hands over its ranking on all of the platform's programs rather than on
the few hundred measured ones.

A teacher is frozen by construction: its scores on D_t are computed once before the phase and
the phase never touches its weights. Batches never mix platforms (each phase trains on one).
Settings: params.yaml ``continual:`` (:func:`settings`); each phase trains with ``train:``, then
``pipeline.train`` (the main job's sizing for the bundled data), then ``continual.select`` (the
early-stopping metric), then ``continual.cl`` / ``continual.kd`` (``kd_first`` over it on a
family's first platform).

* :func:`run_schedule`: a family's KB from its platforms in order (source CL → source KD → … →
  target CL → target KD), from nothing or continuing a KB; one MLflow parent run, a nested run
  per phase.
* :func:`transfer`: one new platform into an existing KB (`tcl transfer`).

Every phase logs each loss term (``loss_task``, ``loss_distill``, ``loss_ewc``), Φ (``phi``) and
every seen platform's ``seen_<platform>_top1``/``_top5`` (validation split) after every epoch.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tcl import metrics as M
from tcl.continual import crossval
from tcl.continual.distill import DEFAULT_PHI, distill_term, phi_at, teacher_quality, teacher_targets
from tcl.continual.ewc import EWCState, absorb, estimate_fisher
from tcl.io import atomic_write_json, json_safe

DEFAULTS = {
    "experiment": "tcl-continual",
    "kind": "mamba",
    "kb_preset": "kb",
    "ac_preset": "ac",
    "beta": 0.5,
    "lambda_ewc": 10000.0,
    "distill": {"sharpness": 1.0},
    "phi": dict(DEFAULT_PHI),
    "ac_init": "distill",
    "ac_init_epochs": 5,
    # ac_init grow: the scale of the grown AC's new connections (tcl.models.grow)
    "ac_grow_noise": 0.01,
    # which KB leaves KD: target | mean | none (true/false: mean/none); see the module docstring
    "kd_guard": "target",
    # kd_guard target: an earlier platform may lose at most this much of its validation `select`
    "kd_guard_tolerance": 0.01,
    # kd_guard target: the splits of each earlier platform that loss is judged on (valid, train)
    "kd_guard_splits": ["valid"],
    # kd_guard target: the metric that loss is measured in (tcl.training select's names); None: `select`
    "kd_guard_metric": None,
    # kd_guard target: an epoch must also beat the start on the target's validation tasks by this many
    # standard errors of the per-task pairwise gain (mean gain / (sd / sqrt(tasks))); 0: off
    "kd_guard_min_gain_se": 0.0,
    # kd_guard target: also judge the target, cross-validated, on the subset's own tasks in this many
    # folds (tcl.continual.crossval; each task once; KD's early stopping off); 0: off
    "kd_guard_folds": 0,
    "kd_guard_fold_seed": 0,   # deals the subset's tasks into the folds
    # ... and each task's score there: pairwise | task_top1 | task_top5 (crossval.task_scores)
    "kd_guard_fold_metric": "pairwise",
    # KD's task-loss weight α: L = L_distill(KB <- AC) + α·L_task(KB, D_t) + λ·EWC (0: the paper's KD)
    "alpha_task": 0.0,
    # the validation metric of every phase's early stopping and of the KD guard (tcl.training select)
    "select": "top1",
    # rehearsal: a later platform's CL and KD also train on up to replay x |D_t| measured training
    # programs of each earlier platform at hand (drawn once per platform, seeded); 0: off (the paper)
    "replay": 0.0,
    "cl": {},
    "kd": {"lr": 1e-4},
    # over kd for a fresh KB (a family's first platform): no earlier knowledge to protect, so no
    # reason for KD's low learning rate (measured: at 3e-4 a fresh KB stayed far below its AC)
    "kd_first": {},
    # the main job (tcl.pipeline ckd): a family's later platforms learn from this share of their
    # training programs (the sample stage's subset); None: from their whole training split
    "target_ratio": None,
    # the main job: with target_ratio, a later platform's whole training split, its labels blanked
    # (`unmeasured`), is that platform's pool of unmeasured programs (what its subset was chosen from)
    "target_pool": False,
}
KD_GUARDS = ("target", "mean", "none")
GUARD_SPLITS = ("valid", "train")
AC_INITS = ("distill", "grow", "scratch")
MODEL_FILE = "model.pt"
SUMMARY_FILE = "continual.json"
RUN_FILE = "mlflow_run.json"  # as tcl.experiments writes it: `tcl register` finds the run here


class ContinualError(ValueError):
    """A schedule or transfer that cannot start (mismatched features, bad settings, no data)."""


def settings(params: dict) -> dict:
    """``continual:`` of params over the defaults (nested dicts merged one level deep)."""
    given = dict(params.get("continual") or {})
    cfg = {k: ({**v, **(given.get(k) or {})} if isinstance(v, dict) else given.get(k, v))
           for k, v in DEFAULTS.items()}
    unknown = sorted(set(given) - set(DEFAULTS))
    if unknown:
        raise ContinualError(f"unknown continual settings: {', '.join(unknown)} (known: {', '.join(DEFAULTS)})")
    if cfg["ac_init"] not in AC_INITS:
        raise ContinualError(f"continual.ac_init must be one of {', '.join(AC_INITS)}, not {cfg['ac_init']!r}")
    if not float(cfg["ac_grow_noise"]) >= 0:
        raise ContinualError(f"continual.ac_grow_noise must be >= 0, not {cfg['ac_grow_noise']!r}")
    phi_at(0, 0.0, cfg["phi"])  # validates the constants
    if not float(cfg["replay"]) >= 0:
        raise ContinualError(f"continual.replay must be >= 0, not {cfg['replay']!r}")
    if not float(cfg["alpha_task"]) >= 0:
        raise ContinualError(f"continual.alpha_task must be >= 0, not {cfg['alpha_task']!r}")
    cfg["kd_guard"] = {True: "mean", False: "none"}.get(cfg["kd_guard"], cfg["kd_guard"])
    if cfg["kd_guard"] not in KD_GUARDS:
        raise ContinualError(f"continual.kd_guard must be one of {', '.join(KD_GUARDS)}, not {cfg['kd_guard']!r}")
    if not float(cfg["kd_guard_tolerance"]) >= 0:
        raise ContinualError(f"continual.kd_guard_tolerance must be >= 0, not {cfg['kd_guard_tolerance']!r}")
    splits = cfg["kd_guard_splits"]
    splits = splits.split(",") if isinstance(splits, str) else list(splits or [])
    if not splits or any(s not in GUARD_SPLITS for s in splits):
        raise ContinualError(f"continual.kd_guard_splits must be a non-empty list of {', '.join(GUARD_SPLITS)}, "
                             f"not {cfg['kd_guard_splits']!r}")
    cfg["kd_guard_splits"] = sorted(set(splits), key=GUARD_SPLITS.index)
    folds = cfg["kd_guard_folds"]
    if isinstance(folds, bool) or not isinstance(folds, int) or folds < 0 or folds == 1:
        raise ContinualError(f"continual.kd_guard_folds must be 0 (off) or a number of folds >= 2, not {folds!r}")
    if folds and cfg["kd_guard"] != "target":
        raise ContinualError(f"continual.kd_guard_folds needs kd_guard: target, not {cfg['kd_guard']}")
    if not float(cfg["kd_guard_min_gain_se"]) >= 0:
        raise ContinualError(f"continual.kd_guard_min_gain_se must be >= 0, not {cfg['kd_guard_min_gain_se']!r}")
    if float(cfg["kd_guard_min_gain_se"]) > 0 and (folds or cfg["kd_guard"] != "target"):
        raise ContinualError("continual.kd_guard_min_gain_se judges the target's validation tasks: it needs "
                             f"kd_guard: target without kd_guard_folds (got {cfg['kd_guard']}, {folds} folds)")
    if cfg["kd_guard_fold_metric"] not in crossval.FOLD_METRICS:
        raise ContinualError(f"continual.kd_guard_fold_metric must be one of {', '.join(crossval.FOLD_METRICS)}, "
                             f"not {cfg['kd_guard_fold_metric']!r}")
    from tcl.training import selection_key

    for key in ("select", "kd_guard_metric") if cfg["kd_guard_metric"] is not None else ("select",):
        try:
            selection_key({"select": cfg[key]})
        except ValueError as exc:
            raise ContinualError(f"continual.{key}: {exc}") from None
    return cfg


def phase_params(params: dict, cfg: dict, phase: str) -> dict:
    from tcl.training import DEFAULT_TRAIN

    return {**DEFAULT_TRAIN, **(params.get("train") or {}),
            **((params.get("pipeline") or {}).get("train") or {}), "select": cfg["select"], **(cfg[phase] or {})}


@dataclass
class PlatformData:
    """One platform's FeatureSets (any may be None)."""

    platform: str
    train: object = None
    valid: object = None
    test: object = None
    train_file: str | None = None  # where `train` was read from (logged with the runs that train on it)
    # when set, what the per-epoch seen-platform metrics are read on (a study's curves on the held-out
    # split: reported only; early stopping and the KD guard read `valid`)
    curve: object = None
    # the platform's unmeasured programs (features only; `unmeasured`): distillation runs on them too
    pool: object = None

    @property
    def monitor(self):
        """What the per-epoch seen-platform metrics are read on: `curve`, else validation, else test."""
        if self.curve is not None:
            return self.curve
        return self.valid if self.valid is not None else self.test

    @property
    def held_out(self):
        """What before/after comparisons are read on: test, else validation."""
        return self.test if self.test is not None else self.valid


def feature_file(path: str | os.PathLike | None, about: str = ""):
    """The feature set at `path` (None for no path); a file that is not one is a ContinualError
    naming it (after `about`)."""
    from tcl.features import FeatureFileError, load_feature_set

    if not path:
        return None
    try:
        return load_feature_set(path)
    except FeatureFileError as exc:
        raise ContinualError(f"{about}{exc}") from None


def load_platform(platform: str, splits_dir: str | os.PathLike) -> PlatformData:
    """``<splits_dir>/<platform>/{train,valid,test}.npz`` (the ones that exist)."""
    d = Path(splits_dir) / platform
    parts = {part: feature_file(d / f"{part}.npz", f"source {platform!r}: ") if (d / f"{part}.npz").is_file()
             else None for part in ("train", "valid", "test")}
    return PlatformData(platform, **parts, train_file=str(d / "train.npz") if parts["train"] is not None else None)


def unmeasured(fs):
    """`fs` as unmeasured programs: the same features and tasks, every label blanked (y 0, latency
    nan), so nothing downstream can learn from a latency the sampler did not pay for."""
    pool = fs.subset(np.arange(len(fs)))
    pool.y = np.zeros_like(pool.y)
    pool.latency = np.full_like(pool.latency, np.nan)
    pool.meta = {**pool.meta, "unmeasured": True}
    return pool


def _with_pool(sets: list, data: PlatformData) -> list:
    """`sets` and, when `data` has unmeasured programs, them last (batches never mix sets)."""
    return [*sets, data.pool] if data.pool is not None and len(data.pool) else list(sets)


def replay_sets(data: PlatformData, seen: list[PlatformData], ratio: float, seed: int) -> list:
    """Rehearsal (``continual.replay``): of every earlier seen platform with training programs at
    hand, up to ``ratio × |D_t|`` of them drawn at random (seeded by `seed` and the platform's
    place in `seen`), one set per platform (batches never mix platforms). Their labels are
    measurements already paid for; with them the AC learns D_t beside what the earlier platforms'
    labels say rather than from D_t's few hundred programs alone, and KD hands both on."""
    if ratio <= 0:
        return []
    n = max(1, int(round(ratio * len(data.train))))
    out = []
    for i, d in enumerate(seen):
        if d is data or d.platform == data.platform or d.train is None or not len(d.train):
            continue
        idx = np.arange(len(d.train))
        if n < len(idx):
            idx = np.sort(np.random.default_rng([int(seed), i]).choice(idx, size=n, replace=False))
        out.append(d.train.subset(idx))
    return out


def _measured_task_loss(loss: str, weight: float, n_measured: int):
    """The task loss as an extra term that skips batches of the unmeasured pool (training sets
    `n_measured` and beyond): it replaces fit_net's own ``task`` term (same name), which would
    apply to every set."""
    from tcl.losses import get_loss

    loss_fn = get_loss(loss)

    def term(batch, scores, model):
        if batch.platform >= n_measured:
            return scores.sum() * 0.0
        return weight * loss_fn(scores, batch.y, batch.task)

    return term


def train_data_info(data: PlatformData) -> dict:
    """What a platform was learned from: the file, its hash (tracking.data_hash), its programs and,
    for a sampled subset (``meta["sample"]``, `tcl sample`), how they were chosen."""
    from tcl import tracking

    info = {"file": data.train_file, "programs": int(len(data.train)),
            "hash": tracking.data_hash(data.train_file) if data.train_file else None}
    how = (getattr(data.train, "meta", None) or {}).get("sample")
    if how:
        info["sample"] = {k: how.get(k) for k in ("strategy", "ratio", "seed", "rounds", "selected", "pool",
                                                 "seconds")}
    if data.pool is not None:
        info["unmeasured_programs"] = int(len(data.pool))
    return info


def log_training_data(data: PlatformData, info: dict) -> None:
    """Log to the active MLflow run the file a platform is learned from (param ``data.<platform>``)
    and, when it is a sampled subset, the subset itself as an artifact (``subsets/<platform>/``):
    a few hundred programs, and the record of how they were chosen travels with the run."""
    import mlflow

    mlflow.log_param(f"data.{data.platform}", str(info["file"]))
    mlflow.set_tag(f"data_hash.{data.platform}", str(info["hash"]))
    if "sample" in info and data.train_file:
        mlflow.log_artifact(data.train_file, artifact_path=f"subsets/{data.platform}")


# ---------------------------------------------------------------------------------------------
# logging


class PhaseLog:
    """The `run` of one phase's training loop: adds Φ and every seen platform's top-1/top-5 to
    each epoch's metrics, keeps the rows, and logs them to the active MLflow run when `track`."""

    def __init__(self, model, seen: list[PlatformData], phi=None, track: bool = False, guard=None):
        self.model, self.seen, self.phi, self.track, self.guard = model, seen, phi, track, guard
        self.rows: list[dict] = []

    def log_metrics(self, metrics: dict, step: int) -> None:
        row = dict(metrics)
        if self.phi is not None:
            row["phi"] = self.phi(step)
        for d in self.seen:
            if d.monitor is not None and len(d.monitor):
                r = M.evaluate(self.model.predict_features(d.monitor), d.monitor)
                row[f"seen_{d.platform}_top1"], row[f"seen_{d.platform}_top5"] = r["top1"], r["top5"]
        if self.guard is not None:  # the epoch's weights, before early stopping restores the best
            row.update(self.guard.observe(int(step)))
        self.rows.append({"epoch": int(step), **row})
        if self.track:
            import mlflow

            mlflow.log_metrics({k: float(v) for k, v in row.items()
                                if isinstance(v, (int, float)) and math.isfinite(v)}, step=int(step))


@contextlib.contextmanager
def _phase_run(track: bool, name: str, params: dict):
    """A nested MLflow run under the active parent (nothing when not tracking)."""
    if not track:
        yield None
        return
    import mlflow

    parent = mlflow.active_run()
    with mlflow.start_run(run_name=name, nested=True, experiment_id=parent.info.experiment_id) as run:
        mlflow.log_params({k: str(v)[:6000] for k, v in params.items()})
        yield run


def _flat(prefix: str, d: dict) -> dict:
    return {f"{prefix}.{k}": v for k, v in (d or {}).items()}


# ---------------------------------------------------------------------------------------------
# the phases


def new_net_model(params: dict, cfg: dict, role: str, n_features: int, feature_meta: dict, seed: int):
    """A fresh KB (`role` kb) or AC (ac) of ``continual.kind`` and its preset; `seed` draws it."""
    from tcl.models import model_config, new_model
    from tcl.training import seed_everything

    seed_everything(int(seed))
    config = model_config(cfg["kind"], params, cfg[f"{role}_preset"])
    return new_model(cfg["kind"], n_features, config, feature_meta)


def init_ac(ac, kb, data: PlatformData, seen: list[PlatformData], cfg: dict, train_params: dict, out_dir,
            track: bool = False) -> list[dict]:
    """Teach the fresh AC the KB's ranking (L_distill alone, no labels) on the training programs of
    every seen platform at hand, platform t's among them; early stopping on D_t's validation set."""
    from tcl.training import train_model

    sets = _with_pool([d.train for d in seen if d.train is not None and len(d.train) and d is not data]
                      + [data.train], data)
    sharp = cfg["distill"]["sharpness"]
    targets = [teacher_targets(kb.predict_features(fs), fs.task, sharp) for fs in sets]
    p = {**train_params, "loss": "none", "epochs": int(cfg["ac_init_epochs"])}
    log = PhaseLog(ac, [data], track=track)
    train_model(ac, sets, [data.valid] if data.valid is not None else [], p, out_dir, run=log,
                progress=False, extra_losses={"distill": distill_term(targets, lambda e: 1.0)})
    return log.rows


def grow_ac(ac, kb, noise: float) -> dict:
    """The AC as the KB grown to the AC's sizes (tcl.models.grow): it starts scoring exactly as
    the KB does, its extra units scaled by `noise`. Returns what the report records."""
    from tcl.models.grow import GrowError, grow_mamba

    try:
        grow_mamba(kb.net, ac.net, noise)
    except GrowError as exc:
        raise ContinualError(f"continual.ac_init grow: {exc}") from None
    return {"noise": noise}


def cl_phase(ac, kb, data: PlatformData, seen: list[PlatformData], cfg: dict, train_params: dict,
             out_dir, track: bool = False, replay: list = ()) -> dict:
    """Train the AC on D_t: L_task + β·Φ_t(epoch)·L_distill(AC ← KB), the KB frozen (None: the
    first platform, task loss only); both terms also on the `replay` sets (replay_sets) when a KB
    teaches. Returns {"quality", "phi" (per epoch run), "epochs"}."""
    from tcl.training import train_model

    extra, phi, quality = {}, None, None
    sets = [data.train]
    if kb is not None:
        quality = teacher_quality(kb, data.train)
        phi = lambda e: phi_at(e, quality, cfg["phi"])  # noqa: E731
        sets += list(replay)
        measured = len(sets)
        sets = _with_pool(sets, data)  # the KB teaches on the unmeasured programs too
        if len(sets) > measured:
            extra["task"] = _measured_task_loss(train_params["loss"], float(train_params.get("task_weight", 1.0)),
                                                measured)
            train_params = {**train_params, "loss": "none"}
        sharp = cfg["distill"]["sharpness"]
        targets = [teacher_targets(kb.predict_features(fs), fs.task, sharp) for fs in sets]
        beta = float(cfg["beta"])
        extra["distill"] = distill_term(targets, lambda e: beta * phi(e))
    log = PhaseLog(ac, seen, phi, track)
    train_model(ac, sets, [data.valid] if data.valid is not None else [], train_params, out_dir,
                run=log, progress=False, extra_losses=extra)
    return {"quality": quality, "phi": [r["phi"] for r in log.rows] if phi else [], "epochs": log.rows}


def kd_phase(kb, ac, data: PlatformData, seen: list[PlatformData], ewc: EWCState | None, cfg: dict,
             train_params: dict, out_dir, track: bool = False, replay: list = (), cv=None,
             probe=None) -> tuple[EWCState, dict]:
    """Train the KB from the frozen AC on D_t: L_distill(KB ← AC) + α·L_task(KB, D_t) + λ·EWC
    (α = ``continual.alpha_task``; 0 is the paper's KD, without labels), the first two terms also
    on the `replay` sets (CL's rehearsal, replay_sets); then add D_t's Fisher
    information to the KB's EWC state (attached to `kb`). Returns (state, {"epochs", "kept_start",
    "guard", "select", "start_valid", "end_valid", ...}): the guard's mode and metric
    (``continual.select``), its value before and after (``target``: on the target; ``mean``: the
    mean over the seen platforms) and, for ``target``, the kept epoch and the sources' start.
    `cv` (tcl.continual.crossval.TargetCV): the target's cross-validated task scores per epoch, which
    the ``target`` guard averages with its validation split's tasks; `probe` (crossval.FoldProbe): a fold's probe
    run, which scores its held-out fold after every epoch in place of any guard."""
    from tcl.training import train_model

    measured = [data.train, *replay]
    sets = _with_pool(measured, data)  # the AC teaches on the unmeasured programs too
    sharp = cfg["distill"]["sharpness"]
    extra = {"distill": distill_term([teacher_targets(ac.predict_features(fs), fs.task, sharp) for fs in sets],
                                     lambda e: 1.0)}
    if ewc is not None:
        lam = float(cfg["lambda_ewc"])
        extra["ewc"] = lambda batch, scores, model: lam * ewc.penalty(model.net)
    valid = [d.valid for d in seen if d.valid is not None and len(d.valid)]
    start = {k: v.detach().clone() for k, v in kb.net.state_dict().items()}
    known = list(kb.feature_meta.get("platforms") or [])
    metric, mode = cfg["select"], (cfg["kd_guard"] if ewc is not None and probe is None else "none")
    guard = (TargetGuard(kb, data, seen, metric, float(cfg["kd_guard_tolerance"]), cfg["kd_guard_splits"],
                         cfg["kd_guard_metric"] or metric, cv, float(cfg["kd_guard_min_gain_se"]))
             if mode == "target" else None)
    start_valid = _mean_metric(kb, valid, metric) if mode == "mean" else None
    alpha = float(cfg["alpha_task"])
    task = {"loss": train_params["loss"], "task_weight": alpha} if alpha > 0 else {"loss": "none"}
    if alpha > 0 and len(sets) > len(measured):
        extra["task"] = _measured_task_loss(train_params["loss"], alpha, len(measured))
        task = {"loss": "none"}
    log = PhaseLog(kb, seen, track=track, guard=probe if probe is not None else guard)
    train_model(kb, sets, valid, {**train_params, **task}, out_dir, run=log,
                progress=False, extra_losses=extra)
    report = {"guard": mode, "select": metric}
    if probe is not None:  # a cross-validation probe: its KB is thrown away, so no Fisher information
        return ewc, {"epochs": log.rows, "kept_start": False, **report}
    if guard is not None:
        kept = guard.restore()
        report.update(guard.report())
    else:
        end_valid = _mean_metric(kb, valid, metric)
        kept = start_valid is not None and not end_valid > start_valid
        if kept:  # no KD epoch beat the KB it started from on the seen platforms: keep that one
            kb.net.load_state_dict(start)
        report.update({"start_valid": start_valid, "end_valid": end_valid})
    state = absorb(ewc, kb, estimate_fisher(kb, data.train, train_params), data.platform)
    state.attach(kb)
    # the platforms the KB knows: those it named before KD (training renamed them D_t's; a KB
    # trained without CKD has no EWC state to list them), then the EWC state's
    kb.feature_meta = {**kb.feature_meta, "platforms": known + [p for p in state.platforms if p not in known]}
    return state, {"epochs": log.rows, "kept_start": kept, **report}


class TargetGuard:
    """``kd_guard: target``: of the KB KD starts from and the KB after each KD epoch, keep the one
    best on the target's validation `metric` among those whose every earlier platform is within
    `tolerance` of the starting KB's `source_metric` (default `metric`) on it, on each of `splits`
    (``valid``: its validation programs; ``train``: its training programs, where the platform has
    them at hand). The start always qualifies, so the kept KB never ranks the target's validation
    programs worse than the start did, and an earlier platform never loses more than `tolerance`
    on the judged programs. Without target validation programs the target is judged on its training programs
    (in-sample: any epoch that fits them better and keeps the sources wins).

    Why ``train`` exists: a validation split holds a handful of tasks (4 a platform in the bundle),
    and a KD epoch can keep their pairwise accuracy within 0.01 while the source's held-out top-1
    falls by 10-17 points; its training programs are every training task, thousands of programs.
    Measured (docs/continual.md, *Judging forgetting on the sources' training programs*): in
    pairwise or in top-1 they did not catch those losses either, so the default stays ``valid``.

    With `cv` (tcl.continual.crossval.TargetCV) the target's score of an epoch is the mean of the
    cv's per-task metric over the validation split's tasks and the cross-validated folds' tasks of
    that epoch, each task once (the folds alone when the target has no validation split);
    an epoch past the folds' last is not kept.

    With `min_gain_se` > 0 an epoch must also beat the start on the target's judged tasks by that
    many standard errors: per task its pairwise accuracy minus the start's, the mean of those
    gains over their standard error (sd / sqrt(tasks)). Why: on a 4-task validation split most
    accepted KD epochs gained 0.0001-0.002 pairwise, and those moved a source's held-out top-1 by
    up to 12.8 points (docs/continual.md, *Eighteen seeds of the same comparison*)."""

    def __init__(self, kb, target: PlatformData, seen: list[PlatformData], metric: str, tolerance: float,
                 splits=("valid",), source_metric: str | None = None, cv=None, min_gain_se: float = 0.0):
        self.kb, self.metric, self.tolerance, self.cv = kb, metric, tolerance, cv
        self.min_gain_se = float(min_gain_se)
        self.source_metric = source_metric or metric
        has_valid = target.valid is not None and len(target.valid)
        self.target_set, self.target_split = (target.valid, "valid") if has_valid else (target.train, "train")
        if cv is not None:  # the folds judge the target out of sample: its training programs are not needed
            self.target_set, self.target_split = (target.valid, "valid+folds") if has_valid else (None, "folds")
        # (key, split, programs) of every earlier platform's judged split; a platform's validation
        # split keys by its name alone (the reports' `start_sources` as before), others `name/split`
        self.sources = [(d.platform if split == "valid" else f"{d.platform}/{split}", split, fs)
                        for d in seen if d.platform != target.platform
                        for split, fs in ((s, getattr(d, s)) for s in splits) if fs is not None and len(fs)]
        self.splits = list(splits)
        self.start = self._scores(None)
        self.start_tasks = (np.asarray(crossval.task_scores(kb, self.target_set), np.float64)
                            if self.min_gain_se > 0 else None)
        self.best = {"epoch": None, "target": self.start[0],
                     "state": {k: v.detach().clone() for k, v in kb.net.state_dict().items()}}

    def _scores(self, epoch: int | None) -> tuple[float, dict]:
        """(the target's score, {source key: its score}) of the KB's current weights, at KD epoch
        `epoch` (None: the start; it picks the folds' task scores)."""
        def score(fs, metric):
            return float(M.evaluate(self.kb.predict_features(fs), fs)[metric])
        sources = {key: score(fs, self.source_metric) for key, _, fs in self.sources}
        if self.cv is None:
            return score(self.target_set, self.metric), sources
        folds = self.cv.at(epoch)
        if folds is None:
            return float("nan"), sources
        valid = [crossval.task_scores(self.kb, self.target_set, self.cv.metric)] if self.target_set is not None else []
        return crossval.pooled(*valid, folds), sources

    def observe(self, epoch: int) -> dict:
        """Score the KB's current weights; keep them when they qualify and beat the best so far.
        Returns the epoch's guard metrics (logged with the phase's rows): with more than one judged
        split, also each split's worst drop (``guard_worst_source_drop_<split>``)."""
        target, sources = self._scores(epoch)
        drops = {key: self.start[1][key] - sources[key] for key in sources}
        worst = max(drops.values(), default=0.0)
        better = worst <= self.tolerance and target > self.best["target"]
        gain_se = self._gain_se() if self.start_tasks is not None else None
        if gain_se is not None:
            better = better and gain_se >= self.min_gain_se
        if better:
            self.best = {"epoch": epoch, "target": target,
                         "state": {k: v.detach().clone() for k, v in self.kb.net.state_dict().items()}}
        row = {"guard_target": target, "guard_worst_source_drop": worst, "guard_kept": float(better)}
        if gain_se is not None:
            row["guard_gain_se"] = gain_se
        if self.cv is not None and self.cv.at(epoch) is not None:
            row["guard_cv"] = crossval.pooled(self.cv.at(epoch))
        if len(self.splits) > 1:
            for split in self.splits:
                row[f"guard_worst_source_drop_{split}"] = max(
                    (drops[key] for key, s, _ in self.sources if s == split), default=0.0)
        return row

    def _gain_se(self) -> float:
        """The current weights' mean per-task gain over the start on the target's judged tasks, in
        standard errors (0 with fewer than 2 tasks; gains without spread count as a tiny se, so the
        figure stays finite for the logs)."""
        gains = np.asarray(crossval.task_scores(self.kb, self.target_set), np.float64) - self.start_tasks
        if len(gains) < 2:
            return 0.0
        se = max(float(gains.std(ddof=1)) / np.sqrt(len(gains)), 1e-12)
        return float(gains.mean() / se)

    def restore(self) -> bool:
        """Load the kept weights into the KB; True when that is the KB KD started from."""
        self.kb.net.load_state_dict(self.best["state"])
        return self.best["epoch"] is None

    def report(self) -> dict:
        out = {"tolerance": self.tolerance, "target_split": self.target_split, "kept_epoch": self.best["epoch"],
               "start_valid": self.start[0], "end_valid": self.best["target"],
               "start_sources": self.start[1]}
        if self.splits != ["valid"]:
            out["source_splits"] = self.splits
        if self.source_metric != self.metric:
            out["source_metric"] = self.source_metric
        if self.min_gain_se > 0:
            out["min_gain_se"] = self.min_gain_se
        if self.cv is not None:
            out["cv"] = self.cv.report()
        return out


def _mean_metric(model, sets, metric: str) -> float | None:
    """The mean of one metric (tcl.metrics.evaluate's top1, pairwise, ...) over the sets (None
    without any)."""
    if not sets:
        return None
    return float(np.mean([M.evaluate(model.predict_features(fs), fs)[metric] for fs in sets]))


def learn_platform(kb, data: PlatformData, seen: list[PlatformData], params: dict, cfg: dict,
                   out_dir, step: int, track: bool = False, probe=None) -> tuple[object, object, dict]:
    """AC start, CL and KD on one platform; `kb` None before the first. Returns (KB, AC, report).
    With ``kd_guard_folds`` and a KB, the target's folds run first (tcl.continual.crossval), each
    through this function with its `probe` (the held-out fold's scorer, in place of the guard)."""
    from tcl.training import feature_meta

    if data.train is None or len(data.train) == 0:
        raise ContinualError(f"platform {data.platform!r}: no training programs")
    out_dir = Path(out_dir)
    cl_p, kd_p = phase_params(params, cfg, "cl"), phase_params(params, cfg, "kd")
    if kb is None:
        kd_p = {**kd_p, **(cfg["kd_first"] or {})}
    cv = None
    if kb is not None and int(cfg["kd_guard_folds"]):
        kd_p = {**kd_p, "patience": int(kd_p["epochs"])}  # the guard judges every epoch: no early stop
        if probe is None:
            cv = crossval.target_cv(kb, data, seen, params, cfg, step, learn_platform)
    seed = int(cl_p["seed"]) + step
    n_features = int(data.train.x.shape[2])
    meta = feature_meta([data.train])
    report: dict = {"platform": data.platform, "runs": {}}
    # rehearsal (continual.replay): the same earlier programs in CL and KD, only once a KB teaches
    replay = replay_sets(data, seen, float(cfg["replay"]), seed) if kb is not None else []
    if replay:
        report["replay"] = {fs.platform: int(len(fs)) for fs in replay}

    ac = new_net_model(params, cfg, "ac", n_features, meta, seed)
    if kb is not None and cfg["ac_init"] == "grow":
        report["ac_grown"] = grow_ac(ac, kb, float(cfg["ac_grow_noise"]))
    elif kb is not None and cfg["ac_init"] == "distill" and int(cfg["ac_init_epochs"]) > 0:
        with _phase_run(track, f"ac-init-{data.platform}", {"phase": "ac-init", "platform": data.platform,
                                                            "data": data.train_file, **_flat("train", cl_p)}) as run:
            report["ac_init"] = init_ac(ac, kb, data, seen, cfg, cl_p, out_dir / f"{step:02d}-ac-init-{data.platform}",
                                        track)
            report["runs"]["ac_init"] = run.info.run_id if run else None
    with _phase_run(track, f"cl-{data.platform}", {"phase": "cl", "platform": data.platform,
                                                   "data": data.train_file, "beta": cfg["beta"],
                                                   "replay": cfg["replay"], **_flat("phi", cfg["phi"]),
                                                   **_flat("train", cl_p)}) as run:
        cl_dir = out_dir / f"{step:02d}-cl-{data.platform}"
        report["cl"] = cl_phase(ac, kb, data, seen, cfg, cl_p, cl_dir, track, replay)
        report["ac_checkpoint"] = str(cl_dir / MODEL_FILE)  # the AC after CL (the phase's kept epoch)
        report["runs"]["cl"] = run.info.run_id if run else None

    ewc = EWCState.from_model(kb) if kb is not None else None
    if kb is None:
        kb = new_net_model(params, cfg, "kb", n_features, meta, seed)
    with _phase_run(track, f"kd-{data.platform}", {"phase": "kd", "platform": data.platform,
                                                   "data": data.train_file, "lambda_ewc": cfg["lambda_ewc"],
                                                   "ewc": ewc is not None, "replay": cfg["replay"],
                                                   "kd_guard": cfg["kd_guard"],
                                                   "kd_guard_splits": ",".join(cfg["kd_guard_splits"]),
                                                   "kd_guard_metric": cfg["kd_guard_metric"] or cfg["select"],
                                                   "kd_guard_folds": cfg["kd_guard_folds"],
                                                   "kd_guard_fold_metric": cfg["kd_guard_fold_metric"],
                                                   **_flat("train", kd_p)}) as run:
        kd_dir = out_dir / f"{step:02d}-kd-{data.platform}"
        _, report["kd"] = kd_phase(kb, ac, data, seen, ewc, cfg, kd_p, kd_dir, track, replay, cv=cv, probe=probe)
        report["runs"]["kd"] = run.info.run_id if run else None
        if run:
            import mlflow

            mlflow.log_metric("kd_kept_start", float(report["kd"]["kept_start"]))
    return kb, ac, report


# ---------------------------------------------------------------------------------------------
# schedules


def held_out_metrics(model, platforms: list[PlatformData]) -> dict:
    """{platform: {"top1", "top5"}} on each platform's held-out set (test, else validation)."""
    out = {}
    for d in platforms:
        if d.held_out is not None and len(d.held_out):
            r = M.evaluate(model.predict_features(d.held_out), d.held_out)
            out[d.platform] = {"top1": r["top1"], "top5": r["top5"]}
    return out


def _save_kb(kb, out: Path, extra: dict) -> Path:
    path = out / MODEL_FILE
    state = EWCState.from_model(kb)
    kb.save(path, extra={**extra, **(state.extra() if state else {})})
    return path


def run_schedule(family: str, platforms: list[PlatformData], params: dict, out: str | os.PathLike,
                 track: bool = True, start=None, learned: list[PlatformData] = ()) -> dict:
    """A family's KB learned over `platforms` in order (each: AC start, CL, KD). Writes
    ``out/model.pt`` (the KB with its EWC state), ``out/mlflow_run.json`` and
    ``out/continual.json``: per platform Φ, the runs, and the KB's held-out top-1/top-5 on every
    seen platform after it (forgetting). One MLflow parent run when `track`.

    `start`: a KB to continue (its EWC state with it) instead of a fresh one; `learned`: the
    platforms it already knows, seen by every later phase (AC start, forgetting, KD guard) as
    if learned earlier in this schedule."""
    cfg = settings(params)
    if not platforms:
        raise ContinualError(f"family {family!r}: no platforms to learn")
    learned = list(learned)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    names = [d.platform for d in platforms]
    ctx = contextlib.nullcontext(None)
    if track:
        from tcl import tracking

        ctx = tracking.start_run(cfg["experiment"], run_name=f"ckd-{family}",
                                 tags={"family": family, "platforms": ",".join(names), "schedule": "ckd"})
    kb, reports = start, []
    train_data = {d.platform: train_data_info(d) for d in platforms}
    with ctx as parent:
        run_id = parent.info.run_id if parent else None
        if parent:
            import mlflow

            atomic_write_json(out / RUN_FILE, {"run_id": run_id, "tracking_uri": tracking.tracking_uri()})
            mlflow.log_params({"family": family, "platforms": ",".join(names), "beta": cfg["beta"],
                               "lambda_ewc": cfg["lambda_ewc"], "ac_init": cfg["ac_init"], "replay": cfg["replay"]})
            for d in platforms:
                log_training_data(d, train_data[d.platform])
        for i, data in enumerate(platforms):
            seen = [*learned, *platforms[:i + 1]]
            step = len(learned) + i
            kb, _, report = learn_platform(kb, data, seen, params, cfg, out / "phases", step, track)
            report["kb_held_out"] = held_out_metrics(kb, seen)
            reports.append(report)
            if parent:
                import mlflow

                mlflow.log_metrics({f"kb_{p}_top1": m["top1"] for p, m in report["kb_held_out"].items()}, step=i)
        ckpt = _save_kb(kb, out, {"run_id": run_id, "family": family})
    summary = json_safe({"family": family, "platforms": names, "learned": [d.platform for d in learned],
                         "run_id": run_id, "checkpoint": str(ckpt),
                         "phi": {r["platform"]: r["cl"]["phi"] for r in reports},
                         "kb_held_out": reports[-1]["kb_held_out"], "train_data": train_data,
                         "per_platform": reports})
    atomic_write_json(out / SUMMARY_FILE, summary)
    return summary


def family_warnings(family: str, start_platforms: list[str], sources: list[str],
                    start_family: str | None = None, target: str | None = None) -> list[str]:
    """Why a transfer into `family` may interfere: a starting KB, a source or the target of another
    family (transfer helps within a family and can hurt across, paper Table 5)."""
    from tcl.hardware import family_of

    def fam(p):
        try:
            return family_of(p)
        except (KeyError, ValueError):
            return None

    out = []
    if start_family and start_family != family:
        out.append(f"the starting KB is the registered KB of family {start_family!r}, not {family!r}: "
                   f"transfer across families can hurt (negative transfer, paper Table 5)")
    for p in start_platforms:
        f = fam(p)
        if f is not None and f != family:
            out.append(f"the starting KB learned platform {p!r} of family {f!r}, not {family!r}: "
                       f"transfer across families can hurt (negative transfer, paper Table 5)")

    def check(role: str, p: str, family_hint: str, risk: str) -> None:
        f = fam(p)
        if f is None:
            out.append(f"{role} {p!r} is not in the hardware registry: its family is unknown "
                       f"(register it with `tcl hardware add {p} --family {family_hint}`)")
        elif f != family:
            out.append(f"{role} {p!r} belongs to family {f!r}, not {family!r}: {risk}")

    if target is not None:
        check("the target", target, family, "the KB of another family learns it (negative transfer, paper Table 5)")
    for p in sources:
        check("source", p, "FAMILY", "its knowledge may interfere rather than help (paper Table 5)")
    return out


def default_sources(family: str, target: str) -> list[str]:
    """The family's platforms in the hardware registry, the target excepted."""
    from tcl.hardware import platforms as registry_platforms

    return [name for name, p in registry_platforms().items() if p.family == family and name != target]


def transfer(start_checkpoint: str | os.PathLike, family: str, target_data: str | os.PathLike,
             params: dict, out: str | os.PathLike, target_valid: str | os.PathLike | None = None,
             target_test: str | os.PathLike | None = None, sources: list[str] | None = None,
             splits_dir: str | os.PathLike = "data/splits", start_family: str | None = None,
             start_ref: str = "", track: bool = True, target_pool: str | os.PathLike | None = None) -> dict:
    """Bring a new platform's data (typically an RDU subset) into a family's KB: target CL then
    target KD from the KB at `start_checkpoint`. Writes the new KB to ``out/model.pt`` (the
    format `tcl evaluate`, `tcl export` and `tcl register` read) with ``out/mlflow_run.json``
    and ``out/continual.json``; returns the summary (run id, checkpoint, Φ per epoch, sources'
    and target's held-out top-1 before and after, warnings, what to register it with).

    Sources (default: the family's other platforms in the hardware registry) are read from
    ``<splits_dir>/<platform>/``: their held-out split measures forgetting, and when the KB
    carries no EWC state (a KB not trained by CKD) their training split gives it one.

    `target_pool`: the target's unmeasured programs (a feature file; its labels, if any, are
    blanked, see :func:`unmeasured`): the distillation terms of the AC start, CL and KD run on them
    too."""
    from tcl import tracking
    from tcl.models import load_model

    cfg = settings(params)
    out = Path(out)
    try:
        kb = load_model(start_checkpoint)
    except (ValueError, KeyError, RuntimeError, OSError) as exc:
        raise ContinualError(f"{start_checkpoint}: not a TCL checkpoint ({exc})") from None
    if not hasattr(kb, "net"):
        raise ContinualError(f"{start_checkpoint}: a {kb.kind} model; continual learning needs a torch net KB")
    target_fs = feature_file(target_data)
    target = PlatformData(target_fs.platform, target_fs, feature_file(target_valid), feature_file(target_test),
                          train_file=str(target_data),
                          pool=unmeasured(feature_file(target_pool)) if target_pool else None)
    if target.pool is not None and target.pool.platform != target.platform:
        raise ContinualError(f"{target_pool} holds programs of platform {target.pool.platform!r}, "
                             f"not the target {target.platform!r}")
    if len(target.train) == 0:  # before the sources' Fisher information and an MLflow run
        raise ContinualError(f"{target_data}: no programs to learn from")
    from tcl.features import FeatureKindError

    for path, fs in ((target_data, target.train), (target_valid, target.valid), (target_test, target.test),
                     (target_pool, target.pool)):
        try:
            if fs is not None:
                kb.check_features(fs, str(path))
        except FeatureKindError as exc:
            raise ContinualError(f"the KB cannot learn from {exc}") from None
    explicit = sources is not None
    source_names = list(sources) if explicit else default_sources(family, target.platform)
    notes = family_warnings(family, list(kb.feature_meta.get("platforms") or []),
                            source_names if explicit else [], start_family, target=target.platform)
    if target.valid is None:  # the KD guard then keeps any epoch that fits the training programs better
        notes.append("no --target-valid: the KD guard judges the target on its training programs "
                     "(in-sample) and nothing held out stops a phase early: the KB can overfit them")
    src = []
    for name in source_names:
        d = load_platform(name, splits_dir)
        if d.train is None and d.valid is None and d.test is None:
            notes.append(f"source {name!r}: no data under {Path(splits_dir) / name}; not evaluated")
            continue
        try:
            for fs in (d.train, d.valid, d.test):
                if fs is not None:
                    kb.check_features(fs)
        except FeatureKindError as exc:
            notes.append(f"source {name!r}: {exc}; not evaluated")
            continue
        src.append(d)

    ewc = EWCState.from_model(kb)
    if ewc is None:
        with_train = [d for d in src if d.train is not None and len(d.train)]
        for d in with_train:
            ewc = absorb(ewc, kb, estimate_fisher(kb, d.train, phase_params(params, cfg, "kd")), d.platform)
        if ewc is None:
            notes.append("the starting KB carries no EWC state and no source has training data: "
                         "the target KD runs without the EWC penalty")
        else:
            ewc.attach(kb)
            notes.append("the starting KB carried no EWC state: Fisher information estimated on the "
                         f"training splits of {', '.join(ewc.platforms)}")

    before = held_out_metrics(kb, src)
    target_before = held_out_metrics(kb, [target])
    subset_hash = tracking.data_hash(target_data)
    ctx = contextlib.nullcontext(None)
    if track:
        ctx = tracking.start_run(cfg["experiment"], run_name=f"transfer-{family}-{target.platform}",
                                 tags={"family": family, "target": target.platform, "subset_hash": subset_hash,
                                       "sources": ",".join(d.platform for d in src), "schedule": "transfer",
                                       "start": str(start_ref or start_checkpoint)})
    out.mkdir(parents=True, exist_ok=True)
    with ctx as parent:
        run_id = parent.info.run_id if parent else None
        if parent:
            atomic_write_json(out / RUN_FILE, {"run_id": run_id, "tracking_uri": tracking.tracking_uri()})
            log_training_data(target, train_data_info(target))
        kb, _, report = learn_platform(kb, target, [*src, target], params, cfg, out / "phases", 0, track)
        after = held_out_metrics(kb, src)
        target_after = held_out_metrics(kb, [target])
        if parent:
            import mlflow

            mlflow.log_metrics({**{f"source_{p}_top1_before": m["top1"] for p, m in before.items()},
                                **{f"source_{p}_top1_after": m["top1"] for p, m in after.items()},
                                **{f"target_top1_{w}": m[target.platform]["top1"]
                                   for w, m in (("before", target_before), ("after", target_after)) if m}})
        ckpt = _save_kb(kb, out, {"run_id": run_id, "family": family, "target": target.platform,
                                  "subset_hash": subset_hash})

    # what a registration is evaluated on: the target's held-out set and the sources' test splits
    eval_files = [str(p) for p in ([target_test] if target_test else [target_valid] if target_valid else [])]
    eval_files += [str(Path(splits_dir) / d.platform / "test.npz") for d in src if d.test is not None]
    evals = [m for m in (target_after.get(target.platform), *(after[d.platform] for d in src if d.test is not None))
             if m is not None]
    summary = json_safe({
        "family": family, "target": target.platform, "run_id": run_id, "checkpoint": str(ckpt),
        "start": str(start_ref or start_checkpoint), "sources": [d.platform for d in src],
        "platforms": list(kb.feature_meta.get("platforms") or []), "subset_hash": subset_hash,
        "phi": report["cl"]["phi"], "teacher_quality": report["cl"]["quality"],
        "kd_kept_start": report["kd"]["kept_start"],
        "pool_programs": len(target.pool) if target.pool is not None else 0,
        "replay_programs": report.get("replay", {}),
        "sources_top1_before": {p: m["top1"] for p, m in before.items()},
        "sources_top1_after": {p: m["top1"] for p, m in after.items()},
        "target_top1_before": (target_before.get(target.platform) or {}).get("top1"),
        "target_top1_after": (target_after.get(target.platform) or {}).get("top1"),
        "eval": {"top1": float(np.mean([m["top1"] for m in evals])) if evals else None,
                 "top5": float(np.mean([m["top5"] for m in evals])) if evals else None},
        "eval_data_hash": ",".join(tracking.data_hash(f) for f in eval_files) if eval_files else subset_hash,
        "runs": report["runs"], "warnings": notes,
    })
    atomic_write_json(out / SUMMARY_FILE, summary)
    return summary
