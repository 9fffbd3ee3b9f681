"""A first, quick version of the sampling study (issue 12, item 6) on one platform's splits:
top-1 / top-5 on the held-out networks of a Mamba (kb) trained on each strategy's subset of the
train split, per ratio and seed, beside the model trained on all of it. In one process (the
library calls behind `tcl sample`, `tcl train`, `tcl evaluate`), no MLflow.

    python pipelines/sampling/quick_study.py SPLITS_DIR --ratios 0.05,0.1 --seeds 0,1,2 --out study.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import numpy as np

from tcl.config import load_params
from tcl.experiments import evaluate_model
from tcl.features import load_feature_set
from tcl.models import model_config, new_model
from tcl.sampling import STRATEGIES
from tcl.sampling.subset import sample_features
from tcl.training import DEFAULT_TRAIN, seed_everything, train_model

KEYS = ("top1", "top5", "task_top1", "task_top5")


def train_mamba(train, valid, params, seed, **train_overrides):
    """A Mamba (the main job's preset and `pipeline.train`) trained on `train` with early stopping
    on `valid`."""
    config = model_config("mamba", params, params.get("pipeline", {}).get("preset", "kb"))
    tp = {**DEFAULT_TRAIN, **params.get("train", {}), **params.get("pipeline", {}).get("train", {}), "seed": seed,
          **train_overrides}
    seed_everything(seed)
    model = new_model("mamba", train.x.shape[2], config, train.meta)
    with tempfile.TemporaryDirectory() as tmp:
        model, _ = train_model(model, train, valid, tp, tmp, progress=False, resume=False)
    return model


def train_and_score(train, valid, test, params, seed, keys=KEYS, **train_overrides):
    """`train_mamba` scored on `test`: {key: value} of tcl.metrics.evaluate."""
    model = train_mamba(train, valid, params, seed, **train_overrides)
    m = evaluate_model(model, [test])
    return {k: float(m[k]) for k in keys}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("splits")
    ap.add_argument("--ratios", default="0.05,0.1")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--skip-full", action="store_true", help="Do not train the 100% reference.")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    params = load_params(a.params)
    train, valid, test = (load_feature_set(f"{a.splits}/{n}.npz") for n in ("train", "valid", "test"))
    seeds = [int(s) for s in a.seeds.split(",")]
    rows = []
    for seed in seeds if not a.skip_full else ():
        t0 = time.perf_counter()
        rows.append({"strategy": "full", "ratio": 1.0, "seed": seed, "sampler_seconds": 0.0,
                     **train_and_score(train, valid, test, params, seed), "seconds": time.perf_counter() - t0})
        print(json.dumps(rows[-1]), flush=True)
    for ratio in (float(r) for r in a.ratios.split(",")):
        for strategy in a.strategies.split(","):
            for seed in seeds:
                t0 = time.perf_counter()
                sub, sel = sample_features(train, ratio, strategy, params, rounds=a.rounds, seed=seed)
                rows.append({"strategy": strategy, "ratio": ratio, "seed": seed, "selected": len(sub),
                             "sampler_seconds": sel.seconds,
                             **train_and_score(sub, valid, test, params, seed),
                             "seconds": time.perf_counter() - t0})
                print(json.dumps(rows[-1]), flush=True)
    with open(a.out, "w") as f:
        json.dump(rows, f, indent=1)
    groups = {}
    for r in rows:
        groups.setdefault((r["strategy"], r["ratio"]), []).append(r)
    print(f"{'strategy':12s} {'ratio':>6s} " + " ".join(f"{k:>15s}" for k in KEYS) + f" {'sampler s':>10s}")
    for (s, ratio), rs in groups.items():
        cells = " ".join(f"{np.mean([r[k] for r in rs]):7.3f}±{np.std([r[k] for r in rs], ddof=1) if len(rs) > 1 else 0:6.3f}"
                         for k in KEYS)
        print(f"{s:12s} {ratio:6.2f} {cells} {np.mean([r['sampler_seconds'] for r in rs]):10.2f}")


if __name__ == "__main__":
    main()
