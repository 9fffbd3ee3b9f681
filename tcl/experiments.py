"""Training and evaluation jobs as MLflow runs: what `tcl train`, `tcl evaluate` and the main
job's per-family stages (tcl.pipeline) run.

    summary = run_train("mamba", data, valid, test, params, out)   # one MLflow run
    metrics = evaluate_model(model, feature_sets)

Model configs come from params (``tcl.config.load_params``) through ``tcl.models.model_config``;
the kind is a name in ``tcl.models.KINDS`` and nothing here branches on it.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from tcl.io import json_safe

TRAIN_EXPERIMENT = "tcl-train"
RUN_FILE = "mlflow_run.json"  # beside the checkpoint: the run that trained it


class JobError(ValueError):
    """A training job that cannot start (different job in the output dir, bad config)."""


def _flatten(prefix: str, d: dict) -> dict:
    out = {}
    for k, v in (d or {}).items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict):
            out.update(_flatten(key, v))
        else:
            out[key] = v
    return out


def load_sets(paths) -> list:
    """The feature sets of `paths`: a FeatureSet (step sequences, ``.npz``) or a PerStoreSet
    (MetaSchedule's per-store rows, ``.perstore.npz``), whichever each file holds; a file that
    is neither is a JobError naming the file and reason."""
    from tcl.features import FeatureFileError
    from tcl.perstore import load_feature_file

    try:
        return [load_feature_file(p) for p in paths]
    except FeatureFileError as exc:
        raise JobError(str(exc)) from None


def check_inputs(model, paths, sets) -> None:
    """JobError naming the file when a model cannot read a feature set: a model class, when the
    features are of the other kind (``CostModel.inputs``); a trained model, also when their width,
    version or vocabulary differ from what it was trained on (``CostModel.check_features``)."""
    from tcl.features import FeatureKindError

    for path, fs in zip(paths, sets):
        try:
            if isinstance(model, type):
                model.inputs(fs)
            else:
                model.check_features(fs)
        except FeatureKindError as exc:
            raise JobError(f"{path}: {exc}") from None


def evaluate_model(model, sets) -> dict:
    """Metrics of `model` on each FeatureSet; top-level top1/top5/pairwise/spearman are the mean."""
    from tcl import metrics as M

    per_platform = {fs.platform: M.evaluate(model.predict_features(fs), fs) for fs in sets}
    out = dict(M.mean_metrics(list(per_platform.values())))
    if len(sets) == 1:
        only = next(iter(per_platform.values()))
        out.update({k: v for k, v in only.items() if k not in out})
        out["platform"] = sets[0].platform
    else:
        out["platforms"] = per_platform
    return out


def run_train(kind: str, data: list[str], valid: list[str], test: list[str], params: dict,
              out: str | os.PathLike, preset: str | None = None, model_overrides: dict | None = None,
              train_overrides: dict | None = None, experiment: str = TRAIN_EXPERIMENT,
              run_name: str | None = None, progress: bool | None = None,
              presets: dict | None = None, init: str | os.PathLike | None = None) -> dict:
    """Train one model as an MLflow run; returns a summary dict (also written to out/metrics.json).

    The model config is ``models.<kind>`` (``.<preset>``) of `presets` when given (a study's own
    variants), else of `params`; ``train:`` comes from `params`, then `train_overrides`.
    `init`: a saved model to start from (a warm start) instead of a fresh initialisation.
    Re-running with the same `out` after an interruption resumes both the training state and the
    same MLflow run.
    """
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from tcl import tracking
    from tcl.io import atomic_write_json
    from tcl.models import load_model, model_class, model_config, new_model, resolve_model_path
    from tcl.training import DEFAULT_TRAIN, STATE_FILE, job_fingerprint, saved_fingerprint, seed_everything
    from tcl.training import feature_meta, train_model

    preset = preset or model_class(kind).default_preset
    try:
        config = {**model_config(kind, presets if presets is not None else params, preset),
                  **(model_overrides or {})}
    except KeyError as exc:
        raise JobError(str(exc.args[0])) from None
    train_params = {**DEFAULT_TRAIN, **(params.get("train") or {}), **(train_overrides or {})}
    train_sets, valid_sets, test_sets = load_sets(data), load_sets(valid), load_sets(test)
    for path, fs in zip(data, train_sets):
        if len(fs) == 0:
            raise JobError(f"{path}: no programs to train on")
    check_inputs(model_class(kind), [*data, *valid, *test], [*train_sets, *valid_sets, *test_sets])
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)

    # the model: the seed draws its initial weights, or a warm start from a saved model
    seed_everything(int(train_params["seed"]))
    if init is not None:
        if model_overrides:
            raise JobError("--set changes the model's shape; a warm start (--init) keeps the saved model's config")
        if not model_class(kind).warm_start:
            raise JobError(f"{kind} models retrain from scratch (their library's rule): --init has no effect")
        model = load_model(init)
        if model.kind != kind:
            raise JobError(f"--init {init} is a {model.kind} model, not {kind}")
        config = model.config
    else:
        n_features = int(model_class(kind).inputs(train_sets[0])[0].shape[2])
        model = new_model(kind, n_features, config, feature_meta(train_sets))

    platforms = ",".join(fs.platform for fs in train_sets)
    feature_version = str((train_sets[0].meta or {}).get("feature_version", ""))
    tags = {
        "data_hash": ",".join(tracking.data_hash(p) for p in data),
        "platform": platforms,
        "feature_version": feature_version,
        "seed": str(train_params["seed"]),
        "model_kind": kind,
        "preset": preset or "",
        "git_commit": tracking.git_commit(),
    }
    run_params = {"model": kind, "preset": preset or "", "data": ",".join(map(str, data)),
                  "valid": ",".join(map(str, valid)), "n_train": sum(len(fs) for fs in train_sets),
                  "n_valid": sum(len(fs) for fs in valid_sets)}
    if init is not None:
        run_params["init"] = str(init)
    run_params.update(_flatten("model", config))
    run_params.update(_flatten("train", train_params))

    tracking.ensure_store()
    import mlflow

    # an interrupted job in `out` resumes (training state and MLflow run); a different job is refused
    run_file = out_dir / RUN_FILE
    resume_id = None
    saved = saved_fingerprint(out_dir)
    if saved is not None:
        if saved != job_fingerprint(model, train_sets, train_params):
            raise JobError(f"{out_dir} holds the state of a different training job (other data, "
                           f"model or params); use another --out or delete {out_dir / STATE_FILE}")
        if run_file.is_file():
            resume_id = json.loads(run_file.read_text()).get("run_id")
    if resume_id:
        ctx = mlflow.start_run(run_id=resume_id, tags=tags)
    else:
        ctx = tracking.start_run(experiment, run_name=run_name or f"{kind}{'-' + preset if preset else ''}-{platforms}",
                                 tags=tags)
    with ctx as run:
        run_id = run.info.run_id
        atomic_write_json(run_file, {"run_id": run_id, "tracking_uri": tracking.tracking_uri()})
        if not resume_id:
            mlflow.log_params({k: str(v)[:6000] for k, v in run_params.items()})
        model, history = train_model(model, train_sets, valid_sets, train_params, out_dir,
                                     run=mlflow, progress=progress)

        # final metrics: best_valid_* of the returned model (the best epoch's weights for nets,
        # the final booster for xgb), test_* on held-out data; per-epoch names are not reused
        final: dict = {}
        epochs = [h for h in history if "best_epoch" in h]
        if epochs:
            final["best_epoch"] = epochs[-1]["best_epoch"]
            final["epochs_run"] = len(epochs)
            final["train_samples_per_s"] = sum(h["train_samples_per_s"] for h in epochs) / len(epochs)
        elif history:
            final.update({"boost_rounds": history[-1]["epoch"], "train_seconds": history[-1]["train_seconds"],
                          "train_samples_per_s": history[-1]["train_samples_per_s"]})
        keys = ("top1", "top5", "pairwise", "spearman")
        if valid_sets:
            final.update({f"best_valid_{k}": v for k, v in evaluate_model(model, valid_sets).items() if k in keys})
        if test_sets:
            final.update({f"test_{k}": v for k, v in evaluate_model(model, test_sets).items() if k in keys})
        mlflow.log_metrics({k: float(v) for k, v in final.items()
                            if isinstance(v, (int, float)) and math.isfinite(v)})

        ckpt = resolve_model_path(out_dir)
        mlflow.log_artifact(str(ckpt), artifact_path="checkpoint")
        if (out_dir / "history.json").is_file():
            mlflow.log_artifact(str(out_dir / "history.json"), artifact_path="checkpoint")
        summary = {"run_id": run_id, "model": kind, "preset": preset, "checkpoint": str(ckpt),
                   "artifact_uri": f"runs:/{run_id}/checkpoint/{ckpt.name}", **final}
        atomic_write_json(out_dir / "metrics.json", json_safe(summary))
    return json_safe(summary)

