"""`tcl train`, `tcl evaluate`, `tcl summarize`, `tcl bench {train,predict,ingest}`.

Heavy libraries (torch, xgboost, mlflow) are imported inside the commands.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import click

from ..io import json_safe

MODEL_KINDS = ["mamba", "mlp", "tlp", "xgb", "xgb-ms", "mlp-tenset"]  # the last two read .perstore.npz
TRAIN_EXPERIMENT = "tcl-train"
RUN_FILE = "mlflow_run.json"


# ---------------------------------------------------------------------------------------------
# helpers (importable; the commands below are thin wrappers)


def read_params(path: str | os.PathLike | None) -> dict:
    """params.yaml as a dict ({} when `path` is None or missing)."""
    import yaml

    if path is None or not Path(path).is_file():
        return {}
    return yaml.safe_load(Path(path).read_text()) or {}


def parse_overrides(items) -> dict:
    """KEY=VALUE strings -> dict, values parsed as YAML scalars (2 -> int, 1e-3 -> float)."""
    import yaml

    out = {}
    for item in items or ():
        if "=" not in item:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        out[key.strip()] = yaml.safe_load(value)
    return out


def model_config(kind: str, preset: str | None, params: dict, presets_path: str | None = None) -> dict:
    """The model config for `kind`: `models.<kind>` (Mamba: `models.mamba.<preset>`) of params,
    or of the YAML file `presets_path` when given."""
    from tcl.models.nets import load_preset

    models = params.get("models") or {}
    if kind == "mamba":
        preset = preset or "kb"
        if presets_path:
            source = presets_path
        elif preset in (models.get("mamba") or {}):
            return dict(models["mamba"][preset])
        else:
            source = "params.yaml"  # the repository's, when the working directory has none
        try:
            return load_preset(preset, source)
        except KeyError as exc:
            raise click.BadParameter(str(exc.args[0])) from None
    if preset:
        raise click.BadParameter(f"--preset applies to --model mamba only, not {kind}")
    return dict(models.get(kind) or {})


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
    """FeatureSets, or PerStoreSets for .perstore.npz files."""
    from tcl.perstore import load_feature_file

    return [load_feature_file(p) for p in paths]


def resolve_model(ref: str, dst_dir: str | os.PathLike) -> Path:
    """A local checkpoint path for a file, a training output dir, or an MLflow URI
    (`models:/tcl-kb-<family>@alias`, `models:/<name>/<version>`, `runs:/<run_id>/<path>`)."""
    from tcl.training import resolve_model_path

    if "://" not in ref and not ref.startswith(("models:/", "runs:/")):
        return resolve_model_path(ref)
    from tcl import tracking

    tracking.ensure_store()
    import mlflow

    local = Path(mlflow.artifacts.download_artifacts(artifact_uri=ref, dst_path=str(dst_dir)))
    if local.is_file():
        return local
    for pattern in ("model.pt", "checkpoint.pt", "model.json", "*.pt"):
        found = sorted(local.rglob(pattern))
        if found:
            return found[0]
    raise click.ClickException(f"{ref} holds no TCL checkpoint (model.pt, checkpoint.pt or model.json)")


def evaluate_model(model, sets) -> dict:
    """Metrics of `model` on each FeatureSet; top-level top1/top5/pairwise/spearman are the mean."""
    from tcl import metrics as M
    from tcl.training import predict_scores

    per_platform = {fs.platform: M.evaluate(predict_scores(model, fs), fs) for fs in sets}
    out = dict(M.mean_metrics(list(per_platform.values())))
    if len(sets) == 1:
        only = next(iter(per_platform.values()))
        out.update({k: v for k, v in only.items() if k not in out})
        out["platform"] = sets[0].platform
    else:
        out["platforms"] = per_platform
    return out


def run_train(kind: str, data: list[str], valid: list[str], test: list[str], preset: str | None,
              params_path: str | None, overrides: dict, train_overrides: dict, out: str,
              experiment: str = TRAIN_EXPERIMENT, run_name: str | None = None,
              progress: bool | None = None, presets_path: str | None = None) -> dict:
    """Train one model as an MLflow run; returns a summary dict (also written to out/metrics.json).

    Model configs come from `params_path`'s ``models:``, or from `presets_path`'s when given
    (a study's own Mamba presets, while ``train:`` still comes from `params_path`).

    Re-running with the same `out` after an interruption resumes both the training state and the
    same MLflow run.
    """
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from tcl import tracking
    from tcl.io import atomic_write_json
    from tcl.training import DEFAULT_TRAIN, STATE_FILE, job_fingerprint, saved_fingerprint, train_model

    if kind == "mamba":
        preset = preset or "kb"
    params = read_params(params_path)
    config = {**model_config(kind, preset, params, presets_path), **overrides}
    train_params = {**DEFAULT_TRAIN, **(params.get("train") or {}), **train_overrides}
    train_sets, valid_sets, test_sets = load_sets(data), load_sets(valid), load_sets(test)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)

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
    run_params.update(_flatten("model", config))
    run_params.update(_flatten("train", train_params))

    tracking.ensure_store()
    import mlflow

    # an interrupted job in `out` resumes (training state and MLflow run); a different job is refused
    run_file = out_dir / RUN_FILE
    resume_id = None
    saved = saved_fingerprint(out_dir)
    if saved is not None:
        if saved != job_fingerprint(kind, train_sets, config, train_params):
            raise click.ClickException(f"{out_dir} holds the state of a different training job "
                                       f"(other data, model or params); use another --out or delete "
                                       f"{out_dir / STATE_FILE}")
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
        model, history = train_model(kind, train_sets, valid_sets, config, train_params, out_dir,
                                     run=mlflow, progress=progress)

        # final metrics: best_valid_* of the returned model (the best epoch's weights for nets,
        # the final booster for xgb), test_* on held-out data; per-epoch names are not reused
        final: dict = {}
        nets_history = [h for h in history if "best_epoch" in h]
        if nets_history:
            final["best_epoch"] = nets_history[-1]["best_epoch"]
            final["epochs_run"] = len(nets_history)
            final["train_samples_per_s"] = sum(h["train_samples_per_s"] for h in nets_history) / len(nets_history)
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

        from tcl.training import resolve_model_path

        ckpt = resolve_model_path(out_dir)
        mlflow.log_artifact(str(ckpt), artifact_path="checkpoint")
        if (out_dir / "history.json").is_file():
            mlflow.log_artifact(str(out_dir / "history.json"), artifact_path="checkpoint")
        summary = {"run_id": run_id, "model": kind, "preset": preset, "checkpoint": str(ckpt),
                   "artifact_uri": f"runs:/{run_id}/checkpoint/{ckpt.name}", **final}
        atomic_write_json(out_dir / "metrics.json", json_safe(summary))
    return json_safe(summary)


# ---------------------------------------------------------------------------------------------
# commands


@click.command()
@click.option("--model", "kind", type=click.Choice(MODEL_KINDS), required=True, help="Model family.")
@click.option("--data", multiple=True, required=True, type=click.Path(exists=True, dir_okay=False),
              help="Training FeatureSet (.npz; .perstore.npz for xgb-ms, mlp-tenset); repeat for several platforms.")
@click.option("--valid", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="Validation FeatureSet(s) for early stopping on top-1.")
@click.option("--test", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="Held-out FeatureSet(s) evaluated once at the end (logged as test_*).")
@click.option("--preset", default=None, help="Mamba preset: models.mamba.<preset> (default kb).")
@click.option("--presets", "presets_path", default=None, type=click.Path(exists=True, dir_okay=False),
              help="YAML file whose models.mamba supplies the --preset (default: --params).")
@click.option("--params", "params_path", default="params.yaml", show_default=True,
              help="params.yaml with `models:` and `train:` sections.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Override a model config value.")
@click.option("--train-set", "train_sets", multiple=True, metavar="KEY=VALUE",
              help="Override a train: parameter (e.g. epochs=5).")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output directory.")
@click.option("--experiment", default=TRAIN_EXPERIMENT, show_default=True, help="MLflow experiment.")
@click.option("--run-name", default=None, help="MLflow run name.")
@click.option("--progress/--no-progress", default=None, help="Progress bars (default: on a terminal).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON line last.")
def train(kind, data, valid, test, preset, presets_path, params_path, sets, train_sets, out, experiment,
          run_name, progress, as_json):
    """Train a cost model; every call is an MLflow run in the local store."""
    summary = run_train(kind, list(data), list(valid), list(test), preset, params_path,
                        parse_overrides(sets), parse_overrides(train_sets), out, experiment,
                        run_name, progress, presets_path=presets_path)
    if not as_json:
        click.echo(f"run {summary['run_id']}  checkpoint {summary['checkpoint']}")
        for key in sorted(summary):
            if key.startswith(("best_valid_", "test_")) and isinstance(summary[key], float):
                click.echo(f"  {key:24s} {summary[key]:.4f}")
    else:
        click.echo(json.dumps(summary, sort_keys=True))


@click.command()
@click.option("--model", "model_ref", required=True,
              help="Checkpoint file, training output dir, or MLflow URI (models:/..., runs:/...).")
@click.option("--data", multiple=True, required=True, type=click.Path(exists=True, dir_okay=False),
              help="FeatureSet(s) to evaluate on (.npz).")
@click.option("--out", default=None, type=click.Path(dir_okay=False), help="Also write the metrics JSON here.")
@click.option("--label", default=None, help="Name the model in the metrics (`tcl summarize` groups by it).")
@click.option("--json", "as_json", is_flag=True, help="Print the metrics as one JSON line last.")
def evaluate(model_ref, data, out, label, as_json):
    """Top-1/top-5 per held-out network, pairwise accuracy and Spearman of a trained model."""
    import tempfile

    from tcl.io import atomic_write_json
    from tcl.training import check_feature_kind, load_trained

    with tempfile.TemporaryDirectory(prefix="tcl-eval-") as tmp:
        path = resolve_model(model_ref, tmp)
        model, info = load_trained(path)
        sets = load_sets(data)
        try:
            check_feature_kind(str(info.get("kind")), sets)
        except ValueError as exc:
            raise click.ClickException(str(exc)) from None
        result = evaluate_model(model, sets)
    result["model"] = model_ref
    result["kind"] = info.get("kind")
    if label:
        result["label"] = label
    result = json_safe(result)
    if out:
        atomic_write_json(out, result)
    if not as_json:
        click.echo(f"{model_ref} ({result['kind']})")
        per_net = result.get("per_network") or {}
        for net, m in per_net.items():
            click.echo(f"  {net:24s} top1 {m['top1']:.4f}  top5 {m['top5']:.4f}")
        for key in ("top1", "top5", "pairwise", "spearman"):
            v = result.get(key)
            click.echo(f"  {key:24s} {v:.4f}" if isinstance(v, float) else f"  {key:24s} {v}")
    else:
        click.echo(json.dumps(result, sort_keys=True))


@click.group()
def bench():
    """Throughput on this machine: training samples/s and prediction speed."""


@bench.command("train")
@click.option("--models", "names", default="mamba-kb,mamba-ac,mlp,tlp,xgb", show_default=True,
              help="Comma-separated: mamba-kb, mamba-ac, mlp, tlp, xgb.")
@click.option("--data", default=None, type=click.Path(exists=True, dir_okay=False),
              help="FeatureSet to time on (default: random tensors of the featurizer's shape).")
@click.option("--samples", default=2048, show_default=True, help="Programs per timed run.")
@click.option("--params", "params_path", default="params.yaml", show_default=True)
@click.option("--device", default="cpu", show_default=True,
              help="torch device of the nets, e.g. cuda (xgb stays on the CPU).")
@click.option("--scan", default="auto", show_default=True,
              help="Mamba scan method: auto, fast, ref, cuda (mamba-ssm's kernel), ...")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as one JSON line last.")
def bench_train_cmd(names, data, samples, params_path, device, scan, as_json):
    """Training samples/s of each model side by side (one short timed run each)."""
    from tcl.bench_train import bench_train, format_table

    fs = load_sets([data])[0] if data else None
    rows = bench_train([n.strip() for n in names.split(",") if n.strip()], fs=fs, n_samples=samples,
                       params=read_params(params_path), device=device, scan=scan)
    click.echo(format_table(rows))
    if as_json:
        click.echo(json.dumps(json_safe(rows)))


@bench.command("predict")
@click.option("--models", "names", default="mamba-kb,mamba-ac,mlp,tlp", show_default=True,
              help="Comma-separated: mamba-kb, mamba-ac, mlp, tlp.")
@click.option("--batch-sizes", default="1,64,1024", show_default=True, help="Comma-separated batch sizes.")
@click.option("--seq-len", default=48, show_default=True, help="Steps per program (L).")
@click.option("--seconds", default=2.0, show_default=True, help="Timing window per measurement.")
@click.option("--threads", default=2, show_default=True, help="torch threads.")
@click.option("--naive/--no-naive", default=True, show_default=True,
              help="Also time the naive (reference) Mamba scan as a baseline.")
@click.option("--params", "params_path", default="params.yaml", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the rows as one JSON line last.")
def bench_predict_cmd(names, batch_sizes, seq_len, seconds, threads, naive, params_path, as_json):
    """Prediction programs/s of each model per batch size (tcl.bench_predict)."""
    from tcl.bench_predict import bench_predict, format_table

    rows = bench_predict(kinds=names, batch_sizes=batch_sizes, seq_len=seq_len, seconds=seconds,
                         threads=threads, naive=naive, params_path=params_path)
    click.echo(format_table(rows))
    if as_json:
        click.echo(json.dumps(json_safe(rows)))


@bench.command("ingest")
@click.option("--records", "n_records", default=200_000, show_default=True,
              help="Ansor records to read (MetaSchedule: a tenth of it).")
@click.option("--workers", default=2, show_default=True, help="Processes reading Ansor lines.")
@click.option("--ansor", "ansor_path", default="tests/fixtures/ansor/tlcbench-t4-bert-early.json",
              show_default=True, type=click.Path(exists=True, dir_okay=False), help="Real records to replicate.")
@click.option("--metaschedule", "ms_path", default="tests/fixtures/metaschedule/conv2d_small",
              show_default=True, type=click.Path(exists=True, file_okay=False), help="Real database to replicate.")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as one JSON line last.")
def bench_ingest_cmd(n_records, workers, ansor_path, ms_path, as_json):
    """Read + validate + featurize records/s for Ansor lines and MetaSchedule databases."""
    from tcl.bench_data import bench_data, format_rows

    rows = bench_data(ansor_path, ms_path, n_records=n_records, workers=workers)
    click.echo(format_rows(rows))
    if as_json:
        click.echo(json.dumps(json_safe(rows)))


@click.command()
@click.argument("metrics", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--out", required=True, type=click.Path(dir_okay=False),
              help="Summary JSON {platform: {model: means and spreads}} (a DVC metrics file).")
@click.option("--markdown", "md_path", default=None, type=click.Path(dir_okay=False), help="Also a Markdown table.")
@click.option("--plot", "plot_path", default=None, type=click.Path(dir_okay=False),
              help="Also flat rows for a `dvc plots` bar chart (JSON).")
def summarize(metrics, out, md_path, plot_path):
    """Mean ± sd over runs (seeds) of `tcl evaluate --out` METRICS files, per platform and model."""
    from tcl.io import atomic_write_json, atomic_write_text
    from tcl.summary import as_metrics, bar_rows, format_markdown
    from tcl.summary import summarize as summarize_results

    results = []
    for path in metrics:
        try:
            results.append(json.loads(Path(path).read_text()))
        except (OSError, ValueError) as exc:
            raise click.ClickException(f"{path}: not a metrics JSON file ({exc})") from exc
    rows = summarize_results(results)
    atomic_write_json(out, as_metrics(rows))
    table = format_markdown(rows)
    if md_path:
        atomic_write_text(md_path, table)
    if plot_path:
        atomic_write_json(plot_path, bar_rows(rows))
    click.echo(table, nl=False)
