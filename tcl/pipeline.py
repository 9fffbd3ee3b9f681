"""The per-family stages of the main job (`dvc repro`): train, evaluate, register.

A hardware family is trained from the platforms listed for it under ``families:`` in
params.yaml, one FeatureSet per platform (``data/splits/<platform>/{train,valid,test}.npz``).
DVC cannot expand a list into a command line or into ``deps``, so each family stage of
dvc.yaml is one call of this module with the family name::

    python -m tcl.pipeline ckd      amd-zen4-avx512 --out models/amd-zen4-avx512 ...   # the KB (CKD)
    python -m tcl.pipeline train    amd-zen4-avx512 --out models-scratch/amd-zen4-avx512 ...  # comparison
    python -m tcl.pipeline evaluate amd-zen4-avx512 --model models/amd-zen4-avx512 --scratch ...
    python -m tcl.pipeline register amd-zen4-avx512 --checkpoint ... --onnx ... --metrics ...
    python -m tcl.pipeline profile-args params-paper.yaml   # -S flags for `dvc exp run`

The work itself is done by the same functions as `tcl train`, `tcl evaluate` and
`tcl register` (tcl.experiments.run_train, tcl.metrics, tcl.registry.register_kb).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from .io import json_safe

SPLITS_DIR = "data/splits"
SUBSETS_DIR = "data/subsets"
DEFAULT_EXPERIMENT = "tcl-pipeline"


# ---------------------------------------------------------------------------------------------
# params


def load_params(path: str | os.PathLike = "params.yaml") -> dict:
    from tcl.config import ParamsError
    from tcl.config import load_params as load

    try:
        return load(path)
    except ParamsError as exc:
        raise click.ClickException(str(exc)) from None


def family_platforms(family: str, params: dict) -> list[str]:
    """The platforms of `family` under ``families:``, checked against the hardware registry."""
    from tcl.hardware import family_of

    families = params.get("families") or {}
    if family not in families:
        raise click.ClickException(f"family {family!r} is not under `families:` in params.yaml "
                                   f"(known: {', '.join(sorted(families)) or 'none'})")
    platforms = families[family]
    if isinstance(platforms, str):
        platforms = [platforms]
    platforms = [str(p) for p in platforms or []]
    if not platforms:
        raise click.ClickException(f"family {family!r} lists no platforms")
    if len(set(platforms)) != len(platforms):
        raise click.ClickException(f"family {family!r} lists a platform twice: {platforms}")
    for p in platforms:
        try:
            actual = family_of(p)
        except (KeyError, ValueError) as exc:  # ValueError: a broken user hardware.json
            raise click.ClickException(str(exc.args[0])) from None
        if actual != family:
            raise click.ClickException(f"platform {p!r} belongs to family {actual!r}, not {family!r} "
                                       f"(tcl/data/hardware.json)")
    return platforms


def split_files(platforms: list[str], part: str, splits_dir: str | os.PathLike = SPLITS_DIR) -> list[str]:
    files = [str(Path(splits_dir) / p / f"{part}.npz") for p in platforms]
    missing = [f for f in files if not Path(f).is_file()]
    if missing:
        raise click.ClickException(f"missing split files (run the split stage): {', '.join(missing)}")
    return files


def subset_file(platform: str, strategy: str, ratio, subsets_dir: str | os.PathLike = SUBSETS_DIR) -> str:
    """Where the sample stage writes `platform`'s subset: ``<subsets_dir>/<platform>/<strategy>-<ratio>.npz``,
    the ratio spelled as params.yaml gives it (str of the YAML value, as DVC renders ``${item.ratio}``)."""
    return str(Path(subsets_dir) / platform / f"{strategy}-{ratio}.npz")


def target_subset(params: dict) -> tuple[str, object] | None:
    """(strategy, ratio) of the subsets a family's later platforms learn from in the main job:
    ``sample.strategy`` and ``continual.target_ratio``, which must be one of ``sample.ratios``
    (the ratios the sample stage makes). None when ``target_ratio`` is unset (whole splits)."""
    ratio = (params.get("continual") or {}).get("target_ratio")
    if ratio is None:
        return None
    sample = params.get("sample") or {}
    ratios = sample.get("ratios") or []
    if ratio not in ratios:
        raise click.ClickException(f"continual.target_ratio {ratio} is not one of sample.ratios {ratios} in "
                                   f"params.yaml: the sample stage makes no such subset")
    return str(sample.get("strategy", "rdu")), ratio


# ---------------------------------------------------------------------------------------------
# plot files


def learning_curves(history: list[dict]) -> tuple[list[dict], list[dict]]:
    """Per-epoch rows for `dvc plots` from a training history: (epoch, train_loss, lr) and
    (epoch, valid_top1, valid_top5, valid_pairwise). Two files because the LambdaRank loss (~1e-3) and top-k
    (~0.5) would share one y axis otherwise."""
    loss, valid = [], []
    for h in history:
        if "train_loss" not in h:  # XGBoost rounds have no loss; not used by the pipeline
            continue
        loss.append(json_safe({"epoch": int(h["epoch"]), "train_loss": h["train_loss"], "lr": h.get("lr")}))
        if "valid_top1" in h:
            valid.append(json_safe({"epoch": int(h["epoch"]), "valid_top1": h["valid_top1"],
                                  "valid_top5": h.get("valid_top5"), "valid_pairwise": h.get("valid_pairwise")}))
    return loss, valid


def topk_rows(per_platform: dict[str, dict], model: str = "kb", label_prefix: str = "") -> list[dict]:
    """One row per (platform, held-out network, k) for a horizontal bar chart, plus the wide
    values: model, platform, network, top1, top5, metric (``top1``/``top5``), score, label
    (``<label_prefix><platform>/<network> <k>``: a prefix tells a comparison's bars apart). Every
    row has every key (`dvc plots` fails on rows that differ)."""
    rows = []
    for platform, res in per_platform.items():
        for net, m in (res.get("per_network") or {}).items():
            for k in ("top1", "top5"):
                rows.append(json_safe({"label": f"{label_prefix}{platform}/{net} {k}", "model": model,
                                     "platform": platform, "network": net, "metric": k, "score": m.get(k),
                                     "top1": m.get("top1"), "top5": m.get("top5")}))
    return rows


# ---------------------------------------------------------------------------------------------
# stages


def train_family(family: str, out: str, loss_plot: str, valid_plot: str,
                 params_path: str = "params.yaml", splits_dir: str = SPLITS_DIR,
                 preset: str | None = None, experiment: str | None = None,
                 train_overrides: dict | None = None, run_name: str | None = None) -> dict:
    """Train a KB-sized model (Mamba, ``pipeline.preset``) from scratch on the family's platforms'
    whole train splits with the valid splits for early stopping (the main job's comparison for the
    CKD KB). Training settings: ``train:``, then ``pipeline.train``, then `train_overrides` (what
    the DVC stage passes on its command line). One MLflow run (`run_name`, default
    ``<preset>-<family>``)."""
    from tcl.experiments import JobError, run_train
    from tcl.io import atomic_write_json

    params = load_params(params_path)
    platforms = family_platforms(family, params)
    pipe = params.get("pipeline") or {}
    preset = preset or str(pipe.get("preset", "kb"))
    try:
        summary = run_train(
            "mamba",
            split_files(platforms, "train", splits_dir),
            split_files(platforms, "valid", splits_dir),
            split_files(platforms, "test", splits_dir),
            params, out, preset=preset,
            train_overrides={**(pipe.get("train") or {}), **(train_overrides or {})},
            experiment=experiment or str(pipe.get("experiment", DEFAULT_EXPERIMENT)),
            run_name=run_name or f"{preset}-{family}", progress=False)
    except JobError as exc:
        raise click.ClickException(str(exc)) from None
    loss, valid = learning_curves(json.loads((Path(out) / "history.json").read_text()))
    atomic_write_json(loss_plot, loss)
    atomic_write_json(valid_plot, valid)
    return summary


def ckd_family(family: str, out: str, loss_plot: str, valid_plot: str, params_path: str = "params.yaml",
               splits_dir: str = SPLITS_DIR, train_overrides: dict | None = None,
               subsets_dir: str = SUBSETS_DIR) -> dict:
    """The family's KB through continual knowledge distillation over its platforms, in the order
    of ``families:`` (tcl.continual.schedule.run_schedule: per platform AC start, CL, KD; one
    MLflow parent run, a nested run per phase). The first platform is learned from its whole
    training split; each later one, when ``continual.target_ratio`` is set, from its sampled
    subset (:func:`subset_file`, the sample stage's out; logged as an artifact of the parent run),
    as a new platform joins a family with ~10% of its programs measured; with
    ``continual.target_pool`` its whole training split, labels blanked, is its pool of unmeasured
    programs (the distillation terms run on them too). Validation and test
    splits are whole. `train_overrides` (the stage's command line) go over ``pipeline.train``.
    The plots are the KD phases' epochs, one after another."""
    from tcl.continual.schedule import ContinualError, load_platform, run_schedule, settings, unmeasured
    from tcl.features import FeatureFileError, load_feature_set
    from tcl.io import atomic_write_json

    params = load_params(params_path)
    platforms = family_platforms(family, params)
    split_files(platforms, "train", splits_dir)  # a clear error when a split is missing
    target = target_subset(params)
    try:
        pool = bool(settings(params)["target_pool"])
    except ContinualError as exc:
        raise click.ClickException(str(exc)) from None
    data = [load_platform(p, splits_dir) for p in platforms]
    for d in data[1:] if target else []:
        path = subset_file(d.platform, *target, subsets_dir)
        if not Path(path).is_file():
            raise click.ClickException(f"missing subset {path} (run the sample stage: "
                                       f"`dvc repro sample`, or `tcl sample`)")
        try:
            subset = load_feature_set(path)
        except FeatureFileError as exc:
            raise click.ClickException(str(exc)) from None
        if subset.platform != d.platform:
            raise click.ClickException(f"{path} holds programs of platform {subset.platform!r}, not {d.platform!r}")
        if pool:  # the programs the subset was chosen from, unmeasured
            d.pool = unmeasured(d.train)
        d.train, d.train_file = subset, path
    pipe = dict(params.get("pipeline") or {})
    params = {**params, "pipeline": {**pipe, "train": {**(pipe.get("train") or {}), **(train_overrides or {})}}}
    try:
        summary = run_schedule(family, data, params, out)
    except ContinualError as exc:
        raise click.ClickException(str(exc)) from None
    rows = [r for report in summary["per_platform"] for r in report["kd"]["epochs"]]
    loss, valid = learning_curves([{**r, "epoch": i} for i, r in enumerate(rows)])
    atomic_write_json(loss_plot, loss)
    atomic_write_json(valid_plot, valid)
    return summary


def continual_summary(model: str | os.PathLike) -> dict | None:
    """The ``continual.json`` a CKD schedule wrote beside the checkpoint (`model`: the file or its
    directory), None for a model trained otherwise."""
    from tcl.continual.schedule import SUMMARY_FILE

    p = Path(model)
    path = (p if p.is_dir() else p.parent) / SUMMARY_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def held_out_results(model: str, platforms: list[str], files: list[str]) -> dict:
    """A model on each platform's test split: the means over the platforms (tcl.metrics.MEAN_KEYS),
    ``n_programs``, ``kind`` and ``per_platform.<platform>`` (tcl.metrics.evaluate)."""
    from tcl import metrics as M
    from tcl.features import FeatureSet
    from tcl.models import load_model

    net = load_model(model)
    per_platform = {}
    for platform, path in zip(platforms, files):
        fs = FeatureSet.load(path)
        if len(fs) == 0:
            raise click.ClickException(f"{path} is empty: no held-out programs to evaluate on")
        per_platform[platform] = M.evaluate(net.predict_features(fs), fs)
    return {"kind": net.kind, **M.mean_metrics(list(per_platform.values())),
            "n_programs": sum(r["n_programs"] for r in per_platform.values()), "per_platform": per_platform}


def evaluate_family(family: str, model: str, out: str, plot: str, params_path: str = "params.yaml",
                    splits_dir: str = SPLITS_DIR, scratch: str | None = None) -> dict:
    """Held-out metrics of the family's model on each platform's test split.

    Top level: ``top1``, ``top5``, ``pairwise``, ``spearman`` (means over the platforms);
    ``per_platform.<platform>`` has the same plus ``per_network.<network>.{top1,top5}``. For a
    CKD model, ``model: ckd`` and ``train_data`` (per platform: the file it learned from, its
    programs, and for a subset how they were chosen). With `scratch` (the from-scratch model on
    100% of the data), ``scratch`` holds its metrics in the same layout and ``ckd_minus_scratch``
    the differences of the means, and the plot gets its rows beside the model's.
    """
    from tcl.io import atomic_write_json

    params = load_params(params_path)
    platforms = family_platforms(family, params)
    files = split_files(platforms, "test", splits_dir)
    summary = continual_summary(model)
    result = {"family": family, "platforms": platforms, **held_out_results(model, platforms, files)}
    rows = topk_rows(result["per_platform"])
    if summary is not None:
        result["model"] = "ckd"
        result["train_data"] = summary.get("train_data")
    if scratch is not None:
        other = held_out_results(scratch, platforms, files)
        result["scratch"] = other
        result["ckd_minus_scratch"] = {k: result[k] - other[k] for k in ("top1", "top5", "task_top1", "task_top5")}
        rows += topk_rows(other["per_platform"], model="scratch", label_prefix="scratch: ")
    result = json_safe(result)
    atomic_write_json(out, result)
    atomic_write_json(plot, rows)
    return result


def register_family(family: str, checkpoint: str, onnx_path: str, metrics_path: str, out: str,
                    params_path: str = "params.yaml", splits_dir: str = SPLITS_DIR,
                    alias: str | None = None) -> dict:
    """Register the exported KB as a version of ``tcl-kb-<family>`` (alias ``candidate``), tagged
    per docs/lifecycle.md. Idempotent: the same checkpoint of the same run is not registered twice."""
    from tcl import registry, tracking
    from tcl.io import atomic_write_text

    params = load_params(params_path)
    platforms = family_platforms(family, params)
    metrics = json.loads(Path(metrics_path).read_text())
    run_file = Path(checkpoint).resolve().parent / "mlflow_run.json"
    run_id = json.loads(run_file.read_text()).get("run_id") if run_file.is_file() else None
    trained = (continual_summary(checkpoint) or {}).get("train_data")
    tags = None
    if trained:  # a CKD KB: the files it learned from, the last platform the target
        missing = [p for p in platforms if p not in trained]
        if missing:
            raise click.ClickException(f"{checkpoint}: the KB did not learn {', '.join(missing)} "
                                       f"(continual.json); rerun the ckd stage")
        data_hash = ",".join(str(trained[p]["hash"]) for p in platforms)
        subsets = [trained[p] for p in platforms if "sample" in trained[p]]
        tags = {"schedule": "ckd", "sources": ",".join(platforms[:-1]) or "none", "target": platforms[-1],
                "subset_hash": ",".join(str(t["hash"]) for t in subsets) or "none"}
    else:
        data_hash = ",".join(tracking.data_hash(p) for p in split_files(platforms, "train", splits_dir))
    eval_hash = ",".join(tracking.data_hash(p) for p in split_files(platforms, "test", splits_dir))
    version = registry.register_kb(checkpoint, family, platforms, run_id, metrics, eval_hash,
                                   data_hash, onnx_path=onnx_path,
                                   alias=alias or (params.get("registry") or {}).get("alias_new"), tags=tags)
    info = registry.show(family, version)
    atomic_write_text(out, registry.dumps(info, indent=2) + "\n")
    return info


def profile_args(path: str | os.PathLike) -> list[str]:
    """``-S key=value`` arguments for `dvc exp run` from a params profile (nested keys dotted)."""
    data = load_params(path)
    args: list[str] = []

    def walk(prefix: str, node) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            value = json.dumps(node) if isinstance(node, (list, bool)) or node is None else str(node)
            args.extend(["-S", f"{prefix}={value}"])

    walk("", data)
    return args


# ---------------------------------------------------------------------------------------------
# command line (python -m tcl.pipeline ...)


@click.group()
def main() -> None:
    """Per-family stages of the main DVC pipeline (one command per family)."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")


_params_opt = click.option("--params", "params_path", default="params.yaml", show_default=True)
_splits_opt = click.option("--splits", "splits_dir", default=SPLITS_DIR, show_default=True,
                           help="directory holding <platform>/{train,valid,test}.npz")


def parse_train_args(args: list[str]) -> dict:
    """``--key value`` pairs (DVC's rendering of a params dict on a command line) -> dict, values
    parsed as YAML scalars; a ``--flag`` without a value is True. A repeated key: the last wins."""
    import yaml

    out, i = {}, 0
    while i < len(args):
        if not args[i].startswith("--") or len(args[i]) < 3:
            raise click.UsageError(f"expected --KEY VALUE training settings, got {args[i]!r}")
        key = args[i][2:].replace("-", "_")
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            out[key] = yaml.safe_load(args[i + 1])
            i += 2
        else:
            out[key] = True
            i += 1
    return out


@main.command("train", context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("family")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="training output dir")
@click.option("--loss-plot", required=True, type=click.Path(dir_okay=False),
              help="per-epoch train loss JSON")
@click.option("--valid-plot", required=True, type=click.Path(dir_okay=False),
              help="per-epoch validation top-1/top-5 JSON")
@click.option("--preset", default=None, help="models.mamba.<preset> (default: pipeline.preset)")
@click.option("--experiment", default=None, help="MLflow experiment (default: pipeline.experiment)")
@click.option("--run-name", default=None, help="MLflow run name (default: <preset>-<family>)")
@_params_opt
@_splits_opt
@click.pass_context
def train_cmd(ctx, family, out, loss_plot, valid_plot, preset, experiment, run_name, params_path, splits_dir):
    """Train a model from scratch on FAMILY's platforms' whole train splits (an MLflow run).

    Extra ``--KEY VALUE`` arguments set ``train:`` values (e.g. ``--epochs 5``), over
    ``pipeline.train`` of the params file.
    """
    s = train_family(family, out, loss_plot, valid_plot, params_path, splits_dir, preset=preset,
                     experiment=experiment, train_overrides=parse_train_args(ctx.args), run_name=run_name)
    keys = [k for k in sorted(s) if k.startswith(("best_valid_", "test_")) or k in ("best_epoch", "epochs_run")]
    click.echo(f"{family}: run {s['run_id']} -> {s['checkpoint']}  " +
               "  ".join(f"{k}={s[k]:.4g}" if isinstance(s[k], float) else f"{k}={s[k]}" for k in keys))


@main.command("ckd", context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("family")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="output dir (model.pt = the KB)")
@click.option("--loss-plot", required=True, type=click.Path(dir_okay=False),
              help="per-epoch KD train loss JSON")
@click.option("--valid-plot", required=True, type=click.Path(dir_okay=False),
              help="per-epoch KD validation top-1/top-5 JSON")
@click.option("--subsets", "subsets_dir", default=SUBSETS_DIR, show_default=True,
              help="directory holding <platform>/<strategy>-<ratio>.npz (the sample stage's subsets)")
@_params_opt
@_splits_opt
@click.pass_context
def ckd_cmd(ctx, family, out, loss_plot, valid_plot, subsets_dir, params_path, splits_dir):
    """FAMILY's KB through the CL/KD schedule over its platforms (continual: in params.yaml): the
    first from its whole train split, the later ones from their continual.target_ratio subsets.

    Extra ``--KEY VALUE`` arguments set ``train:`` values over ``pipeline.train``.
    """
    s = ckd_family(family, out, loss_plot, valid_plot, params_path, splits_dir,
                   train_overrides=parse_train_args(ctx.args), subsets_dir=subsets_dir)
    click.echo(f"{family}: run {s['run_id']} -> {s['checkpoint']}  " +
               "  ".join(f"{p}_top1={m['top1']:.4g}" for p, m in s["kb_held_out"].items()))


@main.command("evaluate")
@click.argument("family")
@click.option("--model", required=True, type=click.Path(exists=True), help="checkpoint or training dir")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="metrics JSON")
@click.option("--plot", required=True, type=click.Path(dir_okay=False), help="top-k per network JSON")
@click.option("--scratch", type=click.Path(exists=True), default=None,
              help="a from-scratch model to report beside it (metrics under `scratch`)")
@_params_opt
@_splits_opt
def evaluate_cmd(family, model, out, plot, scratch, params_path, splits_dir):
    """Evaluate FAMILY's model on its platforms' held-out test splits."""
    r = evaluate_family(family, model, out, plot, params_path, splits_dir, scratch=scratch)
    click.echo(f"{family}: top1={r['top1']} top5={r['top5']} pairwise={r['pairwise']} "
               f"spearman={r['spearman']} ({r['n_programs']} programs) -> {out}")
    if scratch is not None:
        click.echo(f"{family} from scratch: top1={r['scratch']['top1']} top5={r['scratch']['top5']}")


@main.command("register")
@click.argument("family")
@click.option("--checkpoint", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--onnx", "onnx_path", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--metrics", "metrics_path", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="version info JSON")
@click.option("--alias", default=None, help="alias of the new version (default: registry.alias_new)")
@_params_opt
@_splits_opt
def register_cmd(family, checkpoint, onnx_path, metrics_path, out, alias, params_path, splits_dir):
    """Register FAMILY's exported KB in the MLflow registry (alias candidate)."""
    from tcl.registry import TclRegistryError

    try:
        info = register_family(family, checkpoint, onnx_path, metrics_path, out, params_path,
                               splits_dir, alias=alias)
    except TclRegistryError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{info['name']} version {info['version']} (aliases: {', '.join(info['aliases'])}) -> {out}")


@main.command("profile-args")
@click.argument("profile", type=click.Path(exists=True, dir_okay=False))
def profile_args_cmd(profile):
    """Print `-S key=value` flags for `dvc exp run` from a params profile (params-paper.yaml)."""
    import shlex

    click.echo(" ".join(shlex.quote(a) for a in profile_args(profile)))


if __name__ == "__main__":
    main()
