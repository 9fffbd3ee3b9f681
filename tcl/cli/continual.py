"""`tcl transfer` (a new platform into a family's KB) and `tcl ckd` (a family's KB over its
platforms): thin commands over tcl.continual.schedule, with the registry on either side; `tcl
ckd-study` (pipelines/continual's stages) over tcl.continual.study."""

from __future__ import annotations

import json
import os
import tempfile

import click


def _params(path: str) -> dict:
    from tcl.config import ParamsError, load_params

    try:
        return load_params(path)
    except ParamsError as exc:
        raise click.ClickException(str(exc)) from None


@click.command()
@click.option("--family", required=True, help="hardware family whose KB learns the new platform")
@click.option("--target-data", "target_data", required=True, type=click.Path(exists=True, dir_okay=False),
              help="the new platform's training programs (typically an RDU subset .npz)")
@click.option("--target-valid", "target_valid", type=click.Path(exists=True, dir_okay=False), default=None,
              help="the new platform's validation programs (early stopping)")
@click.option("--target-test", "target_test", type=click.Path(exists=True, dir_okay=False), default=None,
              help="the new platform's held-out programs (before/after top-1; the registered metrics)")
@click.option("--target-pool", "target_pool", type=click.Path(exists=True, dir_okay=False), default=None,
              help="the new platform's unmeasured programs (a feature set, e.g. the pool the subset was "
                   "sampled from; labels never read): the distillation terms run on them too")
@click.option("--from", "start", default=None,
              help="KB to start from: a checkpoint, a training dir, runs:/<run_id>/<path> or models:/tcl-kb-F@alias "
                   "(default: models:/tcl-kb-FAMILY@production, else @candidate)")
@click.option("--sources", default=None,
              help="comma-joined source platforms (default: the family's platforms in the hardware registry)")
@click.option("--splits", "splits_dir", default="data/splits", show_default=True,
              help="directory holding <platform>/{train,valid,test}.npz of the sources")
@click.option("--register", "do_register", is_flag=True, help="register the new KB (alias candidate)")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="output dir (model.pt, ...)")
@click.option("--params", "params_path", default="params.yaml", show_default=True)
@click.option("--seed", type=int, default=None, help="train.seed of every phase and model (default: the params')")
@click.option("--no-track", is_flag=True, help="no MLflow runs (nor --register)")
@click.option("--json", "as_json", is_flag=True, help="print the summary as one JSON line")
def transfer(family, target_data, target_valid, target_test, target_pool, start, sources, splits_dir,
             do_register, out, params_path, seed, no_track, as_json):
    """Bring a new platform's data into FAMILY's KB: target CL (AC learns, KB teaches), then target
    KD (KB learns from the AC under EWC). Writes the new KB to OUT/model.pt."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from tcl import registry
    from tcl.continual.schedule import ContinualError
    from tcl.continual.schedule import transfer as run_transfer

    if do_register and no_track:
        raise click.UsageError("--register needs the MLflow run (drop --no-track)")
    if do_register and target_valid is None and target_test is None:  # now, not after the training
        raise click.UsageError("--register needs held-out metrics for the registry: give --target-valid "
                               "or --target-test")
    from tcl.hardware import load_registry

    families = load_registry().families
    if family not in families:  # before a typo names (and registers) a KB tcl-kb-<typo>
        raise click.UsageError(f"unknown family {family!r}; known: {', '.join(sorted(families))} (add one with "
                               f"`tcl hardware add-family {family} --vendor V --architecture A --isa I`)")
    params = _params(params_path)
    if seed is not None:  # one seed of a several-seed comparison, without a params file per seed
        params = {**params, "train": {**(params.get("train") or {}), "seed": int(seed)}}
    source_list = [s.strip() for s in sources.split(",") if s.strip()] if sources is not None else None
    try:
        with tempfile.TemporaryDirectory(prefix="tcl-transfer-") as tmp:
            local = start
            if start is not None and str(start).startswith("runs:/"):  # as `tcl evaluate --model` takes it
                from tcl.cli.models import resolve_model

                local = str(resolve_model(start, tmp))
            ckpt, info = registry.kb_checkpoint(local, family, tmp)
            start_family = info.get("family") if "version" in info else None
            start_ref = info.get("model_uri") or start or str(ckpt)
            summary = run_transfer(ckpt, family, target_data, params, out, target_valid=target_valid,
                                   target_test=target_test, target_pool=target_pool,
                                   sources=source_list, splits_dir=splits_dir,
                                   start_family=start_family, start_ref=start_ref, track=not no_track)
        if do_register:
            if summary["eval"]["top1"] is None:
                raise click.ClickException("nothing held out to register metrics from: give --target-valid "
                                           "or --target-test")
            version = registry.register_kb(
                summary["checkpoint"], family, summary["platforms"], summary["run_id"], summary["eval"],
                summary["eval_data_hash"], summary["subset_hash"],
                tags={"sources": ",".join(summary["sources"]), "target": summary["target"],
                      "subset_hash": summary["subset_hash"], "start": summary["start"]})
            summary["version"] = version
            summary["model_uri"] = f"models:/{registry.model_name(family)}/{version}"
    except (ContinualError, registry.TclRegistryError) as exc:
        raise click.ClickException(str(exc)) from None
    for note in summary["warnings"]:
        click.echo(f"warning: {note}", err=True)
    if as_json:
        click.echo(json.dumps(summary))
        return
    fmt = lambda v: "n/a" if v is None else f"{v:.4f}"  # noqa: E731
    click.echo(f"{family}: {summary['target']} learned from {summary['start']} -> {summary['checkpoint']} "
               f"(run {summary['run_id']})")
    click.echo(f"  target top-1 {fmt(summary['target_top1_before'])} -> {fmt(summary['target_top1_after'])}; "
               f"phi {', '.join(f'{p:.3f}' for p in summary['phi'])}")
    for p, before in summary["sources_top1_before"].items():
        click.echo(f"  source {p} top-1 {fmt(before)} -> {fmt(summary['sources_top1_after'].get(p))}")
    if "version" in summary:
        click.echo(f"  registered {summary['model_uri']} (alias {registry.alias_new()})")


@click.command()
@click.argument("family")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="output dir (model.pt, ...)")
@click.option("--platforms", default=None,
              help="comma-joined platforms in order (default: families.FAMILY of the params file)")
@click.option("--splits", "splits_dir", default="data/splits", show_default=True,
              help="directory holding <platform>/{train,valid,test}.npz")
@click.option("--params", "params_path", default="params.yaml", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="print the summary as one JSON line")
def ckd(family, out, platforms, splits_dir, params_path, as_json):
    """FAMILY's KB through the CL/KD schedule over its platforms (one MLflow parent run, a
    nested run per phase). Writes OUT/model.pt with its EWC state and OUT/continual.json."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from tcl.continual.schedule import ContinualError, load_platform, run_schedule

    params = _params(params_path)
    names = ([p.strip() for p in platforms.split(",") if p.strip()] if platforms
             else list((params.get("families") or {}).get(family) or []))
    if not names:
        raise click.ClickException(f"no platforms for family {family!r}: give --platforms or list it under "
                                   f"`families:` in {params_path}")
    data = [load_platform(p, splits_dir) for p in names]
    missing = [d.platform for d in data if d.train is None]
    if missing:
        raise click.ClickException(f"no training split for {', '.join(missing)} under {splits_dir} "
                                   f"(run `tcl split` or the pipeline's split stage)")
    try:
        summary = run_schedule(family, data, params, out)
    except ContinualError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps({k: v for k, v in summary.items() if k != "per_platform"}))
        return
    click.echo(f"{family}: KB over {', '.join(names)} -> {summary['checkpoint']} (run {summary['run_id']})")
    for p, m in summary["kb_held_out"].items():
        click.echo(f"  {p}: top-1 {m['top1']:.4f} top-5 {m['top5']:.4f}")


@click.group("ckd-study")
def ckd_study():
    """The CKD studies (pipelines/continual): source KBs and one transfer variant per run."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")


_study_opts = [
    click.option("--seed", type=int, required=True, help="train.seed of every phase and model"),
    click.option("--study-params", "study_path", default="pipelines/continual/params.yaml", show_default=True,
                 help="the study's params (families: target, subset, source sets; the runs' sizes)"),
    click.option("--params", "params_path", default="params.yaml", show_default=True),
    click.option("--splits", "splits_dir", default="data/splits", show_default=True,
                 help="directory holding <platform>/{train,valid,test}.npz"),
]


def _with_study_opts(fn):
    for opt in reversed(_study_opts):
        fn = opt(fn)
    return fn


@ckd_study.command("sources")
@click.argument("family")
@click.option("--sources", "source_set", required=True, help="a source set of the family (same | cross | all)")
@click.option("--from", "start", type=click.Path(exists=True, file_okay=False), default=None,
              help="a source KB of this study whose platforms begin the set (all: the cross KB)")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="output dir (model.pt, study.json)")
@_with_study_opts
def ckd_study_sources(family, source_set, start, out, seed, study_path, params_path, splits_dir):
    """The KB of FAMILY's source set through the CKD schedule (whole training splits)."""
    from tcl.continual.schedule import ContinualError
    from tcl.continual.study import StudyError, learn_sources

    try:
        r = learn_sources(family, source_set, _params(params_path), _params(study_path), seed, out,
                          splits_dir, start=start)
    except (StudyError, ContinualError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{family} {source_set} s{seed}: KB of {', '.join(r['platforms'])} -> {out} ({r['seconds']:.0f} s); "
               + ", ".join(f"{p} top-1 {m['top1']:.3f}" for p, m in r["kb_held_out"].items()))


@ckd_study.command("run")
@click.argument("family")
@click.option("--variant", required=True, help="scratch-10 | scratch-100 | finetune | finetune-wise | mtl | ckd | ckd-fixed-phi | "
                                               "ckd-no-ewc | ckd-no-kd | ckd-pool | ckd-grow | ckd-replay | "
                                               "ckd-guard | ckd-replay-guard | ckd-guard-top1 | ckd-replay-guard-top1")
@click.option("--sources", "source_set", default="same", show_default=True, help="the source set (same | cross | all)")
@click.option("--source-kb", type=click.Path(exists=True, file_okay=False), default=None,
              help="the source set's KB (`tcl ckd-study sources`); finetune and the ckd variants start from it")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="metrics JSON")
@_with_study_opts
def ckd_study_run(family, variant, source_set, source_kb, out, seed, study_path, params_path, splits_dir):
    """One transfer VARIANT to FAMILY's target (its subset), scored on the target's test split."""
    from tcl.continual.schedule import ContinualError
    from tcl.continual.study import StudyError, run_variant

    try:
        r = run_variant(variant, family, _params(params_path), _params(study_path), seed, out, sources=source_set,
                        source_kb=source_kb, splits_dir=splits_dir)
    except (StudyError, ContinualError) as exc:
        raise click.ClickException(str(exc)) from None
    drops = ", ".join(f"{p} {d:+.3f}" for p, d in r["sources_top1_drop"].items())
    click.echo(f"{family} {variant} ({source_set}) s{seed}: {r['platform']} top-1 {r['top1']:.3f} "
               f"top-5 {r['top5']:.3f} task top-1 {r['task_top1']:.3f} ({r['seconds']:.0f} s)"
               + (f"; source top-1 drop {drops}" if drops else ""))
