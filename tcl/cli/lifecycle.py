"""`tcl export`, `tcl register`, `tcl promote`, `tcl models {list,show,bench}`, `tcl predict`.

Registry errors (unknown family/version, refused promotion, mismatched features) are printed
without a traceback and exit with code 2. Heavy libraries are imported inside the commands.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

import click

from ..experiments import RUN_FILE  # written by `tcl train` beside the checkpoint



def _registry_errors(fn):
    """Turn TclRegistryError (and subclasses) into a one-line message + exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        from tcl.registry import TclRegistryError

        try:
            return fn(*args, **kwargs)
        except TclRegistryError as exc:
            click.echo(f"Error: {exc}", err=True)
            sys.exit(2)

    return wrapper


def _read_json(path: str) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise click.BadParameter(f"cannot read JSON {path}: {exc}") from None


def _checkpoint_file(checkpoint: str) -> str:
    """CHECKPOINT as a file: a training directory's model file (as `tcl evaluate --model` reads)."""
    from tcl.models import resolve_model_path

    try:
        return str(resolve_model_path(checkpoint))
    except FileNotFoundError as exc:
        raise click.BadParameter(str(exc), param_hint="CHECKPOINT") from None


def _run_id_near(checkpoint: str) -> str | None:
    """run_id from `mlflow_run.json` beside the checkpoint (what `tcl train` writes)."""
    f = Path(checkpoint).resolve().parent / RUN_FILE
    if f.is_file():
        try:
            return json.loads(f.read_text()).get("run_id") or None
        except ValueError:
            return None
    return None


@click.command()
@click.argument("checkpoint", type=click.Path(exists=True))
@click.option("--family", required=True, help="hardware family the model serves")
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False),
              help="ONNX file to write")
@click.option("--source-run", default=None, help="MLflow run id that trained the checkpoint "
              "(default: mlflow_run.json beside the checkpoint)")
@click.option("--opset", type=int, default=None, help="ONNX opset (default: params export.opset)")
@_registry_errors
def export(checkpoint, family, out, source_run, opset):
    """Export CHECKPOINT (a model.pt or its training directory) to ONNX (dynamic batch/length, TCL
    metadata), checked against PyTorch."""
    from tcl.export import ExportError, export_onnx, read_metadata
    from tcl.registry import model_name

    model_name(family)  # validates the name
    checkpoint = _checkpoint_file(checkpoint)
    try:
        path = export_onnx(checkpoint, out, family,
                           source_run=source_run or _run_id_near(checkpoint), opset=opset)
    except ExportError as exc:
        raise click.ClickException(str(exc)) from None
    meta = read_metadata(path)
    click.echo(f"wrote {path} (family={meta['family']} kind={meta.get('kind')} "
               f"features={meta['feature_version']} {meta['max_len']}x{meta['n_features']})")


@click.command()
@click.argument("checkpoint", type=click.Path(exists=True))
@click.option("--family", required=True)
@click.option("--platforms", required=True, help="comma-joined platforms the KB learned, in order")
@click.option("--eval-metrics", "eval_metrics", required=True,
              type=click.Path(exists=True, dir_okay=False),
              help="JSON with held-out top1/top5 (output of `tcl evaluate`)")
@click.option("--onnx", "onnx_path", type=click.Path(exists=True, dir_okay=False), default=None,
              help="ONNX export of CHECKPOINT (default: export now)")
@click.option("--run-id", default=None,
              help="MLflow run that trained it (default: mlflow_run.json beside the checkpoint, "
                   "else a new run in experiment tcl-registry)")
@click.option("--data", "data", multiple=True, type=click.Path(exists=True),
              help="training data (repeatable); hashed with tcl.tracking.data_hash")
@click.option("--data-hash", default=None, help="training-data hash, instead of --data")
@click.option("--eval-data", "eval_data", multiple=True, type=click.Path(exists=True),
              help="held-out evaluation data (repeatable); hashed for promotion gating")
@click.option("--eval-data-hash", default=None, help="eval-data hash, instead of --eval-data")
@click.option("--out", default=None, type=click.Path(dir_okay=False),
              help="also write the version's info as JSON here (a DVC stage output)")
@click.option("--json", "as_json", is_flag=True)
@_registry_errors
def register(checkpoint, family, platforms, eval_metrics, onnx_path, run_id, data, data_hash,
             eval_data, eval_data_hash, out, as_json):
    """Register CHECKPOINT (a model.pt or its training directory) as a new version of
    tcl-kb-FAMILY (alias `candidate`).

    Re-registering the same checkpoint returns the existing version. The data hashes default to
    `data_hash` / `eval_data_hash` keys of the metrics JSON when not given.
    """
    from tcl import registry, tracking

    checkpoint = _checkpoint_file(checkpoint)
    metrics = _read_json(eval_metrics)
    if data:
        data_hash = ",".join(tracking.data_hash(p) for p in data)
    if eval_data:
        eval_data_hash = ",".join(tracking.data_hash(p) for p in eval_data)
    data_hash = data_hash or metrics.get("data_hash")
    eval_data_hash = eval_data_hash or metrics.get("eval_data_hash")
    if not data_hash:
        raise click.UsageError("give --data or --data-hash (training data identity)")
    if not eval_data_hash:
        raise click.UsageError("give --eval-data or --eval-data-hash (held-out data identity)")
    version = registry.register_kb(checkpoint, family, platforms,
                                   run_id or _run_id_near(checkpoint), metrics, eval_data_hash,
                                   data_hash, onnx_path=onnx_path)
    info = registry.show(family, version)
    if out:
        from tcl.io import atomic_write_text

        atomic_write_text(out, registry.dumps(info, indent=2) + "\n")
    if as_json:
        click.echo(registry.dumps(info))
    else:
        click.echo(f"{info['name']} version {version} (aliases: {', '.join(info['aliases'])}; "
                   f"top1={info['top1']:.4f} top5={info['top5']:.4f})")


@click.command()
@click.argument("family")
@click.argument("version")
@click.option("--alias", default=None, help="alias to move (default: params registry.alias_serve)")
@click.option("--force", is_flag=True, help="promote even if top-1 is lower on the same eval data")
@click.option("--json", "as_json", is_flag=True)
@_registry_errors
def promote(family, version, alias, force, as_json):
    """Point ALIAS (production) of tcl-kb-FAMILY at VERSION (a number or an alias).

    Refused when the current holder has a higher held-out top-1 on the same eval data.
    """
    from tcl import registry

    res = registry.promote(family, version, alias=alias, force=force)
    if as_json:
        click.echo(registry.dumps(res))
        return
    if res["status"] == "unchanged":
        click.echo(f"{res['name']}@{res['alias']} is already version {res['version']}")
        return
    prev = "none" if res["previous"] is None else f"version {res['previous']}"
    note = ""
    if res["previous"] is not None and not res["comparable"]:
        note = " (previous was evaluated on different data: top-1 not compared)"
    elif res["forced"]:
        note = " (forced)"
    click.echo(f"promoted {res['name']} version {res['version']} to @{res['alias']} "
               f"(was {prev}){note}")


@click.group()
def models():
    """Registered KB models (one per hardware family)."""


def _fmt_row(d: dict) -> str:
    t = d["tags"]
    return (f"{d['name']:<28} {d['version']:>3}  {','.join(d['aliases']) or '-':<22} "
            f"{d['top1']:>6.4f} {d['top5']:>6.4f}  {t.get('platforms', ''):<30} "
            f"{t.get('feature_version', ''):<10} {t.get('git_commit', '')[:12]}")


@models.command("list")
@click.option("--family", default=None)
@click.option("--json", "as_json", is_flag=True)
@_registry_errors
def models_list(family, as_json):
    """Every registered KB version with aliases and held-out metrics."""
    from tcl import registry

    rows = registry.list_models(family)
    if as_json:
        click.echo(registry.dumps(rows))
        return
    if not rows:
        click.echo("no registered KB models")
        return
    click.echo(f"{'model':<28} {'ver':>3}  {'aliases':<22} {'top1':>6} {'top5':>6}  "
               f"{'platforms':<30} {'features':<10} commit")
    for d in rows:
        click.echo(_fmt_row(d))


@models.command("show")
@click.argument("family")
@click.argument("version", required=False)
@_registry_errors
def models_show(family, version):
    """One version (number or alias; default: production, else the latest) as JSON."""
    from tcl import registry

    click.echo(registry.dumps(registry.show(family, version), indent=2))


@models.command("bench")
@click.option("--checkpoint", type=click.Path(exists=True, dir_okay=False), default=None,
              help="KB checkpoint (default: a random KB from params models.mamba.kb)")
@click.option("--batch-sizes", default="1,64,1024")
@click.option("--seconds", type=float, default=1.0, help="timing per measurement")
@click.option("--threads", type=int, default=2)
@click.option("--no-sweep", is_flag=True, help="skip the opt-level x threads sweep")
@click.option("--json", "as_json", is_flag=True)
def models_bench(checkpoint, batch_sizes, seconds, threads, no_sweep, as_json):
    """Serving throughput: onnxruntime vs PyTorch, FLOPs/prediction, matmul GFLOP/s."""
    from tcl import registry
    from tcl.bench.serving import bench_serving, format_bench

    sizes = tuple(int(s) for s in batch_sizes.split(",") if s.strip())
    res = bench_serving(sizes, checkpoint=checkpoint, seconds=seconds, threads=threads,
                        sweep=not no_sweep)
    click.echo(registry.dumps(res) if as_json else format_bench(res))


@click.command()
@click.argument("features", type=click.Path(exists=True, dir_okay=False))
@click.option("--model", "model_ref", required=True,
              help="models:/tcl-kb-<family>@production, models:/tcl-kb-<family>/<version> "
                   "or an .onnx file")
@click.option("--family", default=None,
              help="family of the features' platform (default: from the hardware registry)")
@click.option("--out", default=None, type=click.Path(dir_okay=False), help="write scores (.npy)")
@click.option("--chunk", type=int, default=4096)
@click.option("--json", "as_json", is_flag=True, help="print scores and per-task picks as JSON")
@click.option("--fused/--no-fused", default=None,
              help="run the Mamba conv and scan as TCL's onnxruntime operators (default: when "
                   "the library is built) or as the exported standard ops")
@_registry_errors
def predict(features, model_ref, family, out, chunk, as_json, fused):
    """Score the programs of a FEATURES.npz with a served KB model (onnxruntime).

    Refuses features whose version, shape, vocabulary or hardware family differ from the model's.
    """
    import numpy as np

    from tcl.features import FeatureFileError, load_feature_set, nonfinite_programs
    from tcl.serving import load_predictor

    try:
        fs = load_feature_set(features, finite_only=False)  # one score per row of the file
    except FeatureFileError as exc:
        raise click.ClickException(str(exc)) from None
    pred = load_predictor(model_ref, chunk=chunk, fused=fused)
    # a program with NaN/inf features gets no score (NaN; null in JSON), the others are scored
    bad = nonfinite_programs(fs.x)
    if len(bad):
        click.echo(f"warning: {features}: {len(bad)} of {len(fs)} programs have features that are not finite "
                   f"(NaN/inf; first row {int(bad[0])}): not scored", err=True)
    scores = np.full(len(fs), np.nan, np.float32)
    kept = np.setdiff1d(np.arange(len(fs)), bad)
    if not len(bad):
        scores = pred.predict_features(fs, family=family)
    elif len(kept):
        scores[kept] = pred.predict_features(fs.subset(kept), family=family)
    if out:
        from tcl.io import atomic_path

        with atomic_path(out, suffix=".npy") as tmp:
            with open(tmp, "wb") as f:
                np.save(f, scores)
    picks = {}
    for t, name in enumerate(fs.tasks):
        idx = np.flatnonzero((fs.task == t) & np.isfinite(scores))
        if len(idx):
            best = idx[int(np.argmax(scores[idx]))]
            picks[name] = {"index": int(best), "program_id": str(fs.program_id[best]),
                           "score": float(scores[best])}
    if as_json:
        click.echo(json.dumps({"model": model_ref, "version": pred.version,
                               "family": pred.family, "n": int(len(scores)),
                               "scores": [float(s) if np.isfinite(s) else None for s in scores],
                               "top1_per_task": picks},
                              indent=2))
        return
    click.echo(f"{pred!r}: scored {int(np.isfinite(scores).sum())} programs of {len(fs.tasks)} tasks "
               f"({fs.platform})")
    for name, p in list(picks.items())[:20]:
        click.echo(f"  {name[:60]:<60} best #{p['index']} score {p['score']:.4f}")
    if len(picks) > 20:
        click.echo(f"  ... {len(picks) - 20} more tasks")
