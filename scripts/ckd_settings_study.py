"""CKD settings study on the validation splits (docs/continual.md, "Choosing the settings").

    python scripts/ckd_settings_study.py NAME '{"continual": {...}}' [FAMILY,FAMILY...]

Runs each family's schedule as the main job does (first platform whole, later platforms from
their sampled subsets in data/subsets; no MLflow) with params.yaml overridden by the JSON, and
scores the resulting KB on every platform's *validation* split (never the test split). NAME
"old" / "scratch" score the main job's current models/ or models-scratch/ instead. Writes
runs/ckd-study/NAME.json.
"""
import json
import sys
import time
from pathlib import Path

import numpy as np

from tcl import metrics as M
from tcl.continual.schedule import load_platform, run_schedule
from tcl.features import load_feature_set
from tcl.models import load_model
from tcl.pipeline import family_platforms, load_params, subset_file, target_subset

OUT = Path("runs/ckd-study")
KEYS = ("top1", "top5", "pairwise", "spearman")

name, over = sys.argv[1], json.loads(sys.argv[2])
families = sys.argv[3].split(",") if len(sys.argv) > 3 else ["amd-zen4-avx512", "x86-avx2", "x86-sse"]
params = load_params("params.yaml")
for key, value in over.items():
    params[key] = {**params.get(key, {}), **value} if isinstance(value, dict) else value
results = {}
for family in families:
    data = [load_platform(p, "data/splits") for p in family_platforms(family, params)]
    target = target_subset(params)
    for d in data[1:] if target else []:
        path = subset_file(d.platform, *target, "data/subsets")
        d.train, d.train_file = load_feature_set(path), path
    t0 = time.time()
    out = OUT / name / family
    if name == "old":
        kb = load_model(f"models/{family}/model.pt")
    elif name == "scratch":
        kb = load_model(f"models-scratch/{family}/model.pt")
    else:
        run_schedule(family, data, params, out, track=False)
        kb = load_model(out / "model.pt")
    seconds = time.time() - t0
    valid = {}
    for d in data:
        e = M.evaluate(kb.predict_features(d.valid), d.valid)
        valid[d.platform] = {k: round(float(e[k]), 4) for k in KEYS}
    results[family] = {"seconds": round(seconds, 1), "valid": valid,
                       "mean": {k: round(float(np.mean([v[k] for v in valid.values()])), 4) for k in KEYS}}
    if name not in ("old", "scratch"):
        schedule = json.loads((out / "continual.json").read_text())
        results[family]["kd_kept_start"] = [p["kd"]["kept_start"] for p in schedule["per_platform"]]
    print(name, family, json.dumps(results[family]), flush=True)
OUT.mkdir(parents=True, exist_ok=True)
(OUT / f"{name}.json").write_text(json.dumps({"over": over, "results": results}, indent=1))
