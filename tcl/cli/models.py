"""`tcl train`, `tcl evaluate`, `tcl summarize`, `tcl bench {train,predict,ingest,sample,tune}`.

A thin layer: the work is in tcl.experiments, tcl.models and tcl.bench. Heavy libraries (torch,
xgboost, mlflow) are imported inside the commands.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from ..experiments import TRAIN_EXPERIMENT
from ..io import json_safe
from ..models import KINDS
from ..sampling import STRATEGIES as SAMPLING_STRATEGIES


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


def _params(path: str | None, required: bool = False) -> dict:
    from tcl.config import ParamsError, load_params

    try:
        return load_params(path, required=required)
    except ParamsError as exc:
        raise click.ClickException(str(exc)) from None


def _reason(exc: Exception) -> str:
    """The first line of an exception's message: enough to say why, without a traceback."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def resolve_model(ref: str, dst_dir: str | os.PathLike) -> Path:
    """A local model file for a file, a training output dir, or an MLflow URI
    (`models:/tcl-kb-<family>@alias`, `models:/<name>/<version>`, `runs:/<run_id>/<path>`)."""
    from tcl.models import MODEL_FILES, resolve_model_path

    if "://" not in ref and not ref.startswith(("models:/", "runs:/")):
        return resolve_model_path(ref)  # FileNotFoundError: the caller says which command failed
    from tcl import registry, tracking

    tracking.ensure_store()
    kb_version = registry.kb_uri_parts(ref)
    if kb_version:  # the registry's lookup names the versions there are and how to promote one; MLflow's does not
        try:
            registry.show(*kb_version)
        except registry.TclRegistryError as exc:
            raise click.ClickException(f"cannot load model {ref}: {exc}") from None
    import mlflow

    local = Path(mlflow.artifacts.download_artifacts(artifact_uri=ref, dst_path=str(dst_dir)))
    if local.is_file():
        return local
    for pattern in (*MODEL_FILES, "checkpoint.pt", "*.pt"):
        found = sorted(local.rglob(pattern))
        if found:
            return found[0]
    raise click.ClickException(f"{ref} holds no TCL model (model.pt, checkpoint.pt or model.json)")


def load_model_ref(ref: str, dst_dir: str | os.PathLike):
    """The CostModel `ref` names (see resolve_model); a ClickException saying why it cannot load."""
    from tcl.models import load_model

    try:
        return load_model(resolve_model(ref, dst_dir))
    except click.ClickException:
        raise
    except Exception as exc:  # noqa: BLE001 - a missing file, a bad checkpoint, an unknown MLflow URI
        raise click.ClickException(f"cannot load model {ref}: {_reason(exc)}") from None


def load_model_refs(refs, dst_dir: str | os.PathLike):
    """(model, ref) for a sampler from `--model` given 0, 1 or several times: (None, None), (the
    model, its ref), or (the list of models, the list of refs): an ensemble."""
    models = []
    for i, ref in enumerate(refs):  # a folder each: two registry models' artifacts share names
        dst = Path(dst_dir, str(i))
        dst.mkdir(parents=True, exist_ok=True)
        models.append(load_model_ref(ref, dst))
    if len(models) < 2:
        return (models[0], refs[0]) if models else (None, None)
    return models, list(refs)


# ---------------------------------------------------------------------------------------------
# commands


@click.command()
@click.option("--model", "kind", type=click.Choice(KINDS), required=True, help="Model kind.")
@click.option("--data", multiple=True, required=True, type=click.Path(exists=True, dir_okay=False),
              help="Training features of the kind the model reads: step sequences (.npz) or, for "
                   "xgb-ms and mlp-tenset, per-store features (.perstore.npz); repeat for several platforms.")
@click.option("--valid", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="Validation FeatureSet(s) for early stopping on top-1.")
@click.option("--test", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="Held-out FeatureSet(s) evaluated once at the end (logged as test_*).")
@click.option("--preset", default=None,
              help="Preset models.<kind>.<preset> of a kind with presets (Mamba: default kb).")
@click.option("--presets", "presets_path", default=None, type=click.Path(exists=True, dir_okay=False),
              help="YAML file whose models: supplies the config (default: --params).")
@click.option("--params", "params_path", default="params.yaml", show_default=True,
              help="params.yaml with `models:` and `train:` sections.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Override a model config value.")
@click.option("--train-set", "train_sets", multiple=True, metavar="KEY=VALUE",
              help="Override a train: parameter (e.g. epochs=5).")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output directory.")
@click.option("--init", "init", default=None, type=click.Path(exists=True),
              help="Start from this saved model (file or training dir) instead of a fresh one.")
@click.option("--experiment", default=TRAIN_EXPERIMENT, show_default=True, help="MLflow experiment.")
@click.option("--run-name", default=None, help="MLflow run name.")
@click.option("--progress/--no-progress", default=None, help="Progress bars (default: on a terminal).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON line last.")
def train(kind, data, valid, test, preset, presets_path, params_path, sets, train_sets, out, init,
          experiment, run_name, progress, as_json):
    """Train a cost model; every call is an MLflow run in the local store."""
    from tcl.experiments import JobError, run_train

    try:
        summary = run_train(kind, list(data), list(valid), list(test), _params(params_path), out,
                            preset=preset, model_overrides=parse_overrides(sets),
                            train_overrides=parse_overrides(train_sets), experiment=experiment,
                            run_name=run_name, progress=progress, init=init,
                            presets=_params(presets_path, required=True) if presets_path else None)
    except JobError as exc:
        raise click.ClickException(str(exc)) from None
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
              help="Feature set(s) to evaluate on (.npz, or .perstore.npz for the per-store kinds).")
@click.option("--out", default=None, type=click.Path(dir_okay=False), help="Also write the metrics JSON here.")
@click.option("--label", default=None, help="Name the model in the metrics (`tcl summarize` groups by it).")
@click.option("--json", "as_json", is_flag=True, help="Print the metrics as one JSON line last.")
def evaluate(model_ref, data, out, label, as_json):
    """Top-1/top-5 per held-out network, pairwise accuracy and Spearman of a trained model."""
    import tempfile

    from tcl.experiments import JobError, check_inputs, evaluate_model, load_sets
    from tcl.io import atomic_write_json

    try:
        sets = load_sets(data)
    except JobError as exc:
        raise click.ClickException(str(exc)) from None
    with tempfile.TemporaryDirectory(prefix="tcl-eval-") as tmp:
        model = load_model_ref(model_ref, tmp)
        try:
            check_inputs(model, data, sets)
        except JobError as exc:
            raise click.ClickException(str(exc)) from None
        result = evaluate_model(model, sets)
    result["model"] = model_ref
    result["kind"] = model.kind
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
        for key in ("top1", "top5", "task_top1", "task_top5", "pairwise", "spearman"):
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
              help="Mamba scan method: auto, fused (C++), fast (torch ops), ref, cuda (mamba-ssm's kernel), ...; "
                   "comma-separated: a row each, the first the baseline (e.g. fast,fused).")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as one JSON line last.")
def bench_train_cmd(names, data, samples, params_path, device, scan, as_json):
    """Training samples/s of each model side by side (one short timed run each)."""
    from tcl.bench.train import bench_train, format_table
    from tcl.experiments import load_sets

    fs = load_sets([data])[0] if data else None
    rows = bench_train([n.strip() for n in names.split(",") if n.strip()], fs=fs, n_samples=samples,
                       params=_params(params_path), device=device,
                       scan=tuple(m.strip() for m in scan.split(",") if m.strip()))
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
    """Prediction programs/s of each model per batch size (tcl.bench.predict)."""
    from tcl.bench.predict import bench_predict, format_table

    rows = bench_predict(kinds=names, batch_sizes=batch_sizes, seq_len=seq_len, seconds=seconds,
                         threads=threads, naive=naive, params=_params(params_path))
    click.echo(format_table(rows))
    if as_json:
        click.echo(json.dumps(json_safe(rows)))


@bench.command("ingest")
@click.option("--records", "n_records", default=200_000, show_default=True,
              help="Ansor lines: the real fixture's, then mutated copies of them (see tcl.bench.ingest).")
@click.option("--workers", default=2, show_default=True, help="Processes reading and featurizing.")
@click.option("--ansor", "ansor_path", default="tests/fixtures/ansor/tlcbench-t4-bert-early.json",
              show_default=True, type=click.Path(exists=True, dir_okay=False),
              help="Real Ansor records the input is built from.")
@click.option("--metaschedule", "ms_paths", multiple=True, type=click.Path(exists=True, file_okay=False),
              help="MetaSchedule database folder (repeatable; default: every data/raw/<platform>/).")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as one JSON line last.")
def bench_ingest_cmd(n_records, workers, ansor_path, ms_paths, as_json):
    """Read + validate + featurize records/s for Ansor lines and MetaSchedule databases."""
    from tcl.bench.ingest import bench_ingest, format_rows

    dbs = list(ms_paths) or sorted(str(p.parent) for p in Path("data/raw").glob("*/database_tuning_record.json*"))
    if not dbs:
        raise click.ClickException("no MetaSchedule database under data/raw/; pass --metaschedule DIR")
    rows = bench_ingest(ansor_path, dbs, n_records=n_records, workers=workers)
    click.echo(format_rows(rows))
    if as_json:
        click.echo(json.dumps(json_safe(rows)))


@bench.command("sample")
@click.option("--sizes", default="10000,100000,1000000", show_default=True, help="Comma-separated pool sizes.")
@click.option("--ratio", default=0.1, show_default=True, type=click.FloatRange(0, 1, min_open=True),
              help="Share of each pool to choose.")
@click.option("--strategy", default="rdu", show_default=True, type=click.Choice(list(SAMPLING_STRATEGIES)),
              help="Sampling strategy timed.")
@click.option("--rounds", default=None, type=click.IntRange(min=1),
              help="Rounds (no net is retrained between them; default: params.yaml sample.rounds, what "
                   "`tcl sample` runs).")
@click.option("--params", "params_path", default="params.yaml", show_default=True,
              help="params.yaml: its sample: settings and featurize.max_len.")
@click.option("--from-file", is_flag=True,
              help="Write each pool as a feature file and time `tcl sample FILE` on it end to end "
                   "(~17 KB of disk a program at the default shape), beside --strategy random.")
@click.option("--workdir", type=click.Path(file_okay=False, exists=True), default=None,
              help="With --from-file: where the pool files are written (default: the temp directory).")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as one JSON line last.")
def bench_sample_cmd(sizes, ratio, strategy, rounds, params_path, from_file, workdir, as_json):
    """Seconds and peak memory to choose RATIO of synthetic pools, beside random selection and one
    K-Means fit measured in the same process (tcl.bench.sample); with --from-file, of the
    `tcl sample` command on the pool written as a feature file."""
    from tcl.bench.sample import bench_sample, format_table
    from tcl.sampling.subset import run_settings

    try:
        pool_sizes = [int(float(n)) for n in sizes.split(",") if n.strip()]
    except ValueError:
        raise click.BadParameter(f"--sizes: expected comma-separated integers, got {sizes!r}") from None
    if not pool_sizes or min(pool_sizes) < 1:
        raise click.BadParameter(f"--sizes: expected positive pool sizes, got {sizes!r}")
    try:
        params = _params(params_path)
        rounds = rounds or int(run_settings(params)["rounds"])
        rows = bench_sample(pool_sizes, ratio=ratio, strategy=strategy, rounds=rounds, params=params,
                            from_file=from_file, workdir=workdir)
    except RuntimeError as exc:  # a child's failure, with its stderr's tail
        raise click.ClickException(str(exc)) from None
    click.echo(format_table(rows))
    if as_json:
        click.echo(json.dumps(json_safe(rows)))



@bench.command("fine-tune")
@click.option("--model", required=True, help="The KB's checkpoint (models:/ URI, checkpoint file or directory).")
@click.option("--data", required=True, type=click.Path(exists=True, dir_okay=False),
              help="A feature file (.npz) whose measured programs stand in for a run's.")
@click.option("--trials", default=256, show_default=True, help="Programs handed to the fine-tuner in all.")
@click.option("--trials-per-iter", default=16, show_default=True, help="Programs per update.")
@click.option("--threads", default="2", show_default=True, help="Comma-separated torch thread counts.")
@click.option("--scan", "scans", default="fast,fused", show_default=True,
              help="Comma-separated Mamba scans: fused (C++) and/or fast (torch ops).")
@click.option("--export", "exports", default="full,reexport", show_default=True,
              help="Comma-separated exports after an update: full (traced each time) and/or reexport.")
@click.option("--seed", default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON line last.")
def bench_fine_tune_cmd(model, data, trials, trials_per_iter, threads, scans, exports, seed, as_json):
    """Seconds of a tuning run's fine-tuning updates per setup: every combination of --threads,
    --scan and --export, the first the baseline (tcl.bench.fine_tune)."""
    from tcl.bench.fine_tune import bench_fine_tune, format_fine_tune

    def items(text):
        return tuple(t.strip() for t in text.split(",") if t.strip())

    try:
        report = bench_fine_tune(model, data, trials, trials_per_iter, tuple(int(t) for t in items(threads)),
                                 seed, items(scans), items(exports))
    except (KeyError, ValueError) as exc:
        raise click.ClickException(exc.args[0] if exc.args else str(exc)) from None
    click.echo(format_fine_tune(report), err=as_json)
    if as_json:
        click.echo(json.dumps(report))


@bench.command("tune")
@click.option("--platform", "platform_name", default="znver4-avx512-t2", show_default=True)
@click.option("--workload", default="dense_128_768_768", show_default=True,
              help="Task tuned (default: one of bert_base's, held out from the KB's training).")
@click.option("--trials", default=64, show_default=True, help="Measurements per run.")
@click.option("--trials-per-iter", default=16, show_default=True, help="Candidates measured per batch.")
@click.option("--seeds", default="0", show_default=True, help="Comma-separated seeds.")
@click.option("--cost-models", default="tcl,xgb,random", show_default=True,
              help="Of tcl, tcl-ft (the KB fine-tuning on the run's measurements), xgb, mlp, random.")
@click.option("--model", default=None, help="The KB (models:/ URI or .onnx; default the family's @production, else @candidate).")
@click.option("--mlp-model", default=None, help="A trained mlp-tenset model, for --cost-models ...,mlp.")
@click.option("--fine-tune", is_flag=True, help="The KB fine-tunes on each run's measurements (`tcl tune --fine-tune`).")
@click.option("--kb-checkpoint", default=None,
              help="The KB's checkpoint (models:/ URI, checkpoint file or directory) for tcl-ft (default: --model).")
@click.option("--out", "out_dir", default="runs/bench-tune", show_default=True, type=click.Path(file_okay=False),
              help="Where the tuning databases go (one per model and seed).")
@click.option("--min-repeat-ms", default=20, show_default=True)
@click.option("--candidates", type=int, default=None,
              help="Instead of the study: time the KB's trace -> feature -> score on this many candidates.")
@click.option("--progress/--no-progress", default=True, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON line last.")
def bench_tune_cmd(platform_name, workload, trials, trials_per_iter, seeds, cost_models, model, mlp_model,
                   fine_tune, kb_checkpoint, out_dir, min_repeat_ms, candidates, progress, as_json):
    """Short tuning study: best latency vs trials per cost model and TCL's two ratios (tcl.bench.tune)."""
    from tcl.bench.tune import bench_cost_model, bench_tune, format_cost_model, format_report
    from tcl.collect.measure import MeasureSettings
    from tcl.hardware import get_platform
    from tcl.registry import TclRegistryError

    try:
        if candidates:
            if model is None:
                from tcl.registry import default_kb_uri

                model, note = default_kb_uri(get_platform(platform_name).family)
                if note:
                    click.echo(f"warning: {note}", err=True)
            row = bench_cost_model(model, workload, candidates, platform_name)
            click.echo(format_cost_model(row), err=as_json)
            if as_json:
                click.echo(json.dumps(row))
            return
        report = bench_tune(platform_name, workload, trials, trials_per_iter,
                            tuple(int(s) for s in seeds.split(",") if s.strip()),
                            tuple(n.strip() for n in cost_models.split(",") if n.strip()), model, mlp_model,
                            out_dir, MeasureSettings(number=1, repeat=3, min_repeat_ms=min_repeat_ms),
                            progress, fine_tune, kb_checkpoint)
    except (KeyError, ValueError, TclRegistryError, NotImplementedError) as exc:
        raise click.ClickException(exc.args[0] if exc.args else str(exc)) from None
    for note in report.get("warnings", []):
        click.echo(f"warning: {note}", err=True)
    click.echo(format_report(report), err=as_json)
    if as_json:
        from tcl.io import json_safe

        click.echo(json.dumps(json_safe(report)))  # no valid program yet: inf -> null

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
