"""`tcl sample`: choose which programs to measure (RDU or a baseline) and write them as a
feature set. A thin layer: the work is in tcl.sampling."""

from __future__ import annotations

import json
import tempfile

import click

from ..io import json_safe
from ..sampling import STRATEGIES
from .models import _params, load_model_refs, parse_overrides


@click.command()
@click.argument("features", type=click.Path(exists=True, dir_okay=False))
@click.option("--ratio", type=float, default=None,
              help="Share of the programs to choose, in (0, 1] (default: sample.ratio).")
@click.option("--strategy", type=click.Choice(list(STRATEGIES)), default=None,
              help="Sampling strategy (default: sample.strategy).")
@click.option("--model", "model_refs", multiple=True,
              help="A cost model whose embedding and uncertainty serve from the first round: checkpoint, "
                   "training dir or MLflow URI (models:/..., runs:/...), as `tcl evaluate --model`. "
                   "Repeated: an ensemble (e.g. KBs of several seeds); the first serves the embedding, "
                   "their disagreement the uncertainty.")
@click.option("--rounds", type=int, default=None,
              help="Rounds of choose -> reveal -> retrain (default: sample.rounds).")
@click.option("--seed", type=int, default=None, help="Seed (default: sample.seed).")
@click.option("--params", "params_path", default="params.yaml", show_default=True,
              help="params.yaml with the sample: section (and models:/train: for retraining).")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Override a sample: setting for this run (e.g. mc_dropout=0.1, weights.uncertainty=2); "
                   "the subset records the settings it was chosen with.")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="The chosen programs (.npz feature set).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON line last.")
def sample(features, ratio, strategy, model_refs, rounds, seed, params_path, sets, out, as_json):
    """Choose RATIO of FEATURES' programs to measure and write them as a feature set."""
    from tcl.features import FeatureFileError, load_feature_set
    from tcl.sampling import SamplingError
    from tcl.sampling.subset import run_settings, sample_features

    params = _with_sample_overrides(_params(params_path), parse_overrides(sets))
    run = run_settings(params)
    ratio = run["ratio"] if ratio is None else ratio
    strategy = strategy or run["strategy"]
    if strategy not in STRATEGIES:
        raise click.ClickException(f"{params_path}: sample.strategy {strategy!r} is not one of {', '.join(STRATEGIES)}")
    try:
        ratio = float(ratio)
    except (TypeError, ValueError):  # e.g. sample.ratio of a params file, or --set ratio=...
        raise click.ClickException(f"the sampling ratio must be a number in (0, 1], got {ratio!r}") from None
    if not 0 < ratio <= 1:
        raise click.ClickException(f"--ratio must be in (0, 1], got {ratio}")
    try:  # the step features stay in the file, read in row slices: pools larger than memory
        fs = load_feature_set(features, stored_x=True)
    except FeatureFileError as exc:
        raise click.ClickException(str(exc)) from None
    with tempfile.TemporaryDirectory(prefix="tcl-sample-") as tmp:
        model, model_ref = load_model_refs(model_refs, tmp)
        try:
            subset, selection = sample_features(fs, float(ratio), strategy, params, model=model, rounds=rounds,
                                                seed=seed, model_ref=model_ref)
        except (SamplingError, ValueError) as exc:
            raise click.ClickException(f"{features}: {exc}") from None
    subset.save(out)
    how = subset.meta["sample"]
    summary = {"selected": how["selected"], "ratio": float(ratio), "strategy": strategy,
               "seconds": how["seconds"], "rounds": how["rounds"]}
    if as_json:
        click.echo(json.dumps(json_safe(summary)))
    else:
        click.echo(f"{strategy}: {how['selected']} of {how['pool']} programs in {how['rounds']} round(s) "
                   f"{how['round_sizes']}, {how['seconds']:.2f} s -> {out}")


def _with_sample_overrides(params: dict, overrides: dict) -> dict:
    """`params` with `overrides` (dotted keys: weights.uncertainty) over its sample: section."""
    sample = dict(params.get("sample") or {})
    for key, value in overrides.items():
        *parents, leaf = key.split(".")
        node = sample
        for name in parents:
            child = node.get(name)
            node[name] = dict(child) if isinstance(child, dict) else {}
            node = node[name]
        node[leaf] = value
    return {**params, "sample": sample}
