"""Choose the sampler's settings without reading the test split: cross-validation over the
training split's tasks (issue 12's "validation protocol with enough tasks").

Per platform, the training split's tasks are dealt into `folds` groups (a seeded shuffle). For each fold, each
candidate (a named override of the root params.yaml `sample:`, or a baseline strategy) chooses
`ratio` of the *other* folds' programs, a Mamba kb is trained on that subset (the main job's
`pipeline.train`, early stopping on the platform's validation split) and scored on the held-out
fold's tasks, which neither the sampler nor the training saw. The score is the mean over folds
and seeds; per-task top-1 leads (the held-out tasks are a few per network, so the network top-1
of a fold weighs a handful of tasks).

    python pipelines/sampling/cv_settings.py run --platform x86-sse-t1 --params params.yaml \
        --study-params pipelines/sampling/params.yaml --out pipelines/sampling/cv/x86-sse-t1.json
    python pipelines/sampling/cv_settings.py summary --runs pipelines/sampling/cv \
        --out pipelines/sampling/cv.json --markdown pipelines/sampling/cv.md

`run` writes one platform's runs; `summary` pools every platform's: mean ± sd over platforms ×
folds × seeds, and each candidate paired with the reference on the same platform, fold and seed.
Settings: `cv:` in pipelines/sampling/params.yaml (platforms, folds, ratios, seeds, candidates),
or the section `--section` names (`cv_ensemble:`, a later study with its own stages).

A candidate with `model: sibling` samples with a knowledge base, as `tcl sample --model` does on a
family's new platform: a Mamba kb trained (seed `kb_seed`) on the whole training split of the
first other platform of `platforms` in the same hardware family serves the embedding from the
first round and is fine-tuned on the revealed programs between rounds. It never saw the target
platform's labels; on a platform without a sibling in `platforms` the candidate is not run. A
candidate's `kb:` overrides that KB's model config (e.g. `{dropout: 0.1}`: a KB trained with
dropout, whose MC dropout then serves from the first round), its `kb_seeds` (a list) samples with
an ensemble of KBs trained with those seeds (`tcl sample --model` repeated); one KB is trained per
distinct `kb:` and seed.

`train_runs: n` (default 1) trains each subset n times, with training seeds seed, seed + 100, ...:
a model's training run moves its held-out top-1 about as much as the subset does (docs/sampling.md,
*The subset or the training run?*), so the summaries first average a subset's runs (each row keeps its
`train_seed`), then compare subsets; the markdown adds the sd between a subset's training runs.
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
import time
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from quick_study import train_and_score, train_mamba  # this folder's in-process driver (the script's directory is on sys.path)

from tcl.config import load_params
from tcl.features import load_feature_set
from tcl.hardware import family_of
from tcl.models import load_model
from tcl.io import atomic_write_json, atomic_write_text
from tcl.sampling.subset import sample_features

KEYS = ("task_top1", "task_top5", "top1", "top5", "pairwise")


def task_folds(n_tasks: int, folds: int, seed: int) -> list[np.ndarray]:
    """The task ids dealt into `folds` groups after a seeded shuffle."""
    order = np.random.default_rng(seed).permutation(n_tasks)
    return [np.sort(order[f::folds]) for f in range(folds)]


def candidate_params(params: dict, override: dict) -> dict:
    """params with `override` (keys of `sample:`, nested dicts merged one level) over `sample:`."""
    out = copy.deepcopy(params)
    sample = out.setdefault("sample", {})
    for key, value in override.items():
        sample[key] = {**sample.get(key, {}), **value} if isinstance(value, dict) else value
    return out


TRAIN_SEED_STEP = 100  # training run r of a subset sampled with seed s trains with seed s + 100·r


def subset_means(rows: list[dict]) -> list[dict]:
    """One row per subset (platform, candidate, ratio, fold, seed): its training runs' mean of each
    metric, `train_runs` their number and `<key>_train_sd` their sd (0 for a single run)."""
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["platform"], r["candidate"], r["ratio"], r["fold"], r["seed"]), []).append(r)
    out = []
    for rs in groups.values():
        row = {**rs[0], "train_runs": len(rs),
               "sampler_seconds": float(np.mean([r["sampler_seconds"] for r in rs]))}
        for k in KEYS:
            v = np.array([r[k] for r in rs])
            row[k] = float(v.mean())
            row[f"{k}_train_sd"] = float(v.std(ddof=1)) if len(v) > 1 else 0.0
        out.append(row)
    return out


def summarize(rows: list[dict]) -> list[dict]:
    """Mean, sd and se of each metric over a candidate's subsets (rows of `subset_means`)."""
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["candidate"], r["ratio"]), []).append(r)
    out = []
    for (name, ratio), rs in groups.items():
        cell = {"candidate": name, "ratio": ratio, "runs": len(rs),
                "train_runs": max(r["train_runs"] for r in rs),
                "sampler_seconds": float(np.mean([r["sampler_seconds"] for r in rs]))}
        for k in KEYS:
            v = np.array([r[k] for r in rs])
            cell[k] = float(v.mean())
            cell[f"{k}_sd"] = float(v.std(ddof=1)) if len(v) > 1 else 0.0
            cell[f"{k}_se"] = cell[f"{k}_sd"] / np.sqrt(len(v))
            cell[f"{k}_train_sd"] = float(np.mean([r[f"{k}_train_sd"] for r in rs]))
        out.append(cell)
    return sorted(out, key=lambda c: (c["ratio"], -c["task_top1"]))


def paired(rows: list[dict], reference: str, key: str = "task_top1") -> list[dict]:
    """Each candidate minus `reference` on the same platform, fold and seed (the folds' tasks differ
    in difficulty far more than the candidates do, so the paired difference is the sharper test)."""
    ref = {(r["platform"], r["ratio"], r["fold"], r["seed"]): r[key] for r in rows if r["candidate"] == reference}
    groups: dict = {}
    for r in rows:
        k = (r["platform"], r["ratio"], r["fold"], r["seed"])
        if r["candidate"] != reference and k in ref:
            groups.setdefault((r["candidate"], r["ratio"]), []).append(r[key] - ref[k])
    out = []
    for (name, ratio), d in sorted(groups.items(), key=lambda g: (g[0][1], g[0][0])):
        d = np.asarray(d)
        out.append({"candidate": name, "ratio": ratio, "reference": reference, "key": key, "runs": len(d),
                    "mean": float(d.mean()), "se": float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else 0.0,
                    "wins": int((d > 0).sum())})
    return out


def markdown(cells: list[dict], diffs: list[dict], per_platform: dict[str, list[dict]], cv: dict,
             sizes: dict[str, dict], pairs: list[dict] = ()) -> str:
    platforms = ", ".join(f"{p} ({n['programs']} programs, {n['tasks']} tasks)" for p, n in sizes.items())
    train_runs = max(c["train_runs"] for c in cells)
    trained = (f" Each subset trained {train_runs} times (training seeds seed + {TRAIN_SEED_STEP}·r): their mean is "
               "the subset's figure, and `train sd` the sd of task top-1 between a subset's runs."
               if train_runs > 1 else "")
    lines = [f"Cross-validation over the training tasks of {platforms}; {cv['folds']} folds by task, seeds "
             f"{', '.join(map(str, cv['seeds']))}: mean ± sd over platforms × folds × seeds "
             "(± se: the standard error of the mean)." + trained, "",
             "| ratio | candidate | runs | task top-1 | ± se | train sd | task top-5 | top-1 | top-5 | pairwise | sampler s |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in cells:
        lines.append(f"| {c['ratio']:.0%} | {c['candidate']} | {c['runs']} | {c['task_top1']:.3f} ± {c['task_top1_sd']:.3f} "
                     f"| {c['task_top1_se']:.3f} | {c['task_top1_train_sd']:.3f} "
                     f"| {c['task_top5']:.3f} ± {c['task_top5_sd']:.3f} "
                     f"| {c['top1']:.3f} ± {c['top1_sd']:.3f} | {c['top5']:.3f} ± {c['top5_sd']:.3f} "
                     f"| {c['pairwise']:.3f} | {c['sampler_seconds']:.2f} |")
    if diffs:
        lines += ["", f"Paired with {diffs[0]['reference']} (same platform, fold and seed), task top-1 difference:", "",
                  "| ratio | candidate | runs | mean difference | ± se | runs above |", "|---:|---|---:|---:|---:|---:|"]
        lines += [f"| {d['ratio']:.0%} | {d['candidate']} | {d['runs']} | {d['mean']:+.3f} | {d['se']:.3f} "
                  f"| {d['wins']} of {d['runs']} |" for d in diffs]
    if len(per_platform) > 1:
        names = sorted({(d["candidate"], d["ratio"]) for ds in per_platform.values() for d in ds},
                       key=lambda k: (k[1], k[0]))
        lines += ["", "The same difference per platform (mean ± se over its folds × seeds):", "",
                  "| ratio | candidate | " + " | ".join(per_platform) + " |",
                  "|---:|---|" + "---:|" * len(per_platform)]
        for name, ratio in names:
            cells_p = []
            for ds in per_platform.values():
                d = next((d for d in ds if d["candidate"] == name and d["ratio"] == ratio), None)
                cells_p.append("-" if d is None else f"{d['mean']:+.3f} ± {d['se']:.3f}")
            lines.append(f"| {ratio:.0%} | {name} | " + " | ".join(cells_p) + " |")
    if pairs:
        lines += ["", "Other pairs (`cv.pairs`: the first minus the second, same platform, fold and seed), "
                  "task top-1 difference:", "",
                  "| ratio | pair | runs | mean difference | ± se | runs above |", "|---:|---|---:|---:|---:|---:|"]
        lines += [f"| {d['ratio']:.0%} | {d['candidate']} − {d['reference']} | {d['runs']} | {d['mean']:+.3f} "
                  f"| {d['se']:.3f} | {d['wins']} of {d['runs']} |" for d in pairs]
    return "\n".join(lines) + "\n"


def sibling_platform(platform: str, platforms: list[str]) -> str | None:
    """The first other platform of `platforms` in `platform`'s hardware family (None: there is none)."""
    family = family_of(platform)
    return next((p for p in platforms if p != platform and family_of(p) == family), None)


def train_sibling_kb(sibling: str, params: dict, seed: int, out: Path) -> dict:
    """A Mamba kb on `sibling`'s whole training split (early stopping on its validation split),
    saved at `out`: what a family's knowledge base knows before its next platform arrives."""
    split = f"data/splits/{sibling}"
    train, valid = load_feature_set(f"{split}/train.npz"), load_feature_set(f"{split}/valid.npz")
    t0 = time.perf_counter()
    train_mamba(train, valid, params, seed, threads=1).save(out)
    return {"platform": sibling, "programs": len(train), "seed": seed, "seconds": time.perf_counter() - t0}


def kb_params(params: dict, override: dict) -> dict:
    """params whose KB preset (`pipeline.preset`, default kb) has `override` over its config."""
    out = copy.deepcopy(params)
    preset = out.get("pipeline", {}).get("preset", "kb")
    mamba = out.setdefault("models", {}).setdefault("mamba", {})
    mamba[preset] = {**(mamba.get(preset) or {}), **override}
    return out


def run_platform(platform: str, params: dict, cv: dict) -> dict:
    """Every (fold, ratio, candidate, seed) of one platform: its rows and the split's size. The
    split is the main job's (`data/splits/<platform>`) unless the section's `splits:` names
    another folder for the platform (e.g. a study's larger measured pool)."""
    split = (cv.get("splits") or {}).get(platform, f"data/splits/{platform}")
    train, valid = load_feature_set(f"{split}/train.npz"), load_feature_set(f"{split}/valid.npz")
    folds = task_folds(len(train.tasks), int(cv["folds"]), int(cv["fold_seed"]))
    wants_kb = {name for name, spec in cv["candidates"].items() if spec.get("model") == "sibling"}
    sibling = sibling_platform(platform, cv["platforms"]) if wants_kb else None
    if wants_kb and sibling is None:
        print(f"cv {platform}: no other platform of family {family_of(platform)} in cv.platforms; "
              "the sibling-KB candidates are not run", flush=True)
    runnable = [name for name in cv["candidates"] if name not in wants_kb or sibling is not None]
    jobs = [(f, name, float(ratio), int(seed)) for f in range(len(folds)) for ratio in cv["ratios"]
            for name in runnable for seed in cv["seeds"]]
    rows, kbs, models = [], {}, {}

    def kb_keys(spec: dict) -> list[tuple[str, int]]:
        """(config, seed) of each KB the candidate samples with: `kb_seeds` several (an ensemble)."""
        config = json.dumps(spec.get("kb") or {}, sort_keys=True)
        return [(config, int(seed)) for seed in spec.get("kb_seeds", [cv.get("kb_seed", 0)])]

    def given(spec: dict):
        members = [models[key] for key in kb_keys(spec)]
        return members[0] if len(members) == 1 else members

    with tempfile.TemporaryDirectory(prefix="tcl-cv-kb-") as tmp:
        if sibling is not None:  # one KB per distinct `kb:` config override and seed
            for i, key in enumerate(sorted({k for name in wants_kb for k in kb_keys(cv["candidates"][name])})):
                path = Path(tmp, f"kb-{i}.pt")
                kbs[key] = {"kb": json.loads(key[0]), **train_sibling_kb(
                    sibling, kb_params(params, json.loads(key[0])), key[1], path)}
                models[key] = load_model(path)  # the sampler fine-tunes a copy, never this one
        for f, name, ratio, seed in tqdm(jobs, desc=f"cv {platform}"):
            held_mask = np.isin(train.task, folds[f])
            pool, held = train.subset(~held_mask), train.subset(held_mask)
            spec = cv["candidates"][name]
            t0 = time.perf_counter()
            sub, sel = sample_features(pool, ratio, spec.get("strategy", "rdu"),
                                       candidate_params(params, spec.get("sample", {})),
                                       model=given(spec) if name in wants_kb else None, seed=seed)
            for run in range(int(cv.get("train_runs", 1))):
                train_seed = seed + TRAIN_SEED_STEP * run
                rows.append({"platform": platform, "candidate": name, "ratio": ratio, "seed": seed, "fold": f,
                             "train_seed": train_seed, "selected": len(sub),
                             "held_tasks": [train.tasks[t] for t in folds[f]], "sampler_seconds": sel.seconds,
                             **train_and_score(sub, valid, held, params, train_seed, KEYS, threads=1),
                             "seconds": time.perf_counter() - t0})
                t0 = time.perf_counter()
    return {"platform": platform, "cv": cv, "train_programs": len(train), "train_tasks": len(train.tasks),
            "sibling_kbs": list(kbs.values()), "runs": rows}


def pool_parts(platform: str, runs: list[str]) -> dict:
    """One platform's `run` output: <platform>.json, or its parts <platform>.<part>.json (runs
    split by ratio or seed), in each folder of `runs`, as one, their runs concatenated."""
    files = [f for folder in runs for f in (sorted(Path(folder).glob(f"{platform}.json"))
                                            or sorted(Path(folder).glob(f"{platform}.*.json")))]
    if not files:
        raise SystemExit(f"cv summary: no {platform}.json or {platform}.<part>.json under {', '.join(runs)}")
    parts = [json.loads(f.read_text()) for f in files]
    return {**parts[0], "runs": [r for part in parts for r in part["runs"]]}


def summarize_platforms(results: list[dict], cv: dict) -> tuple[dict, str]:
    """Pool the platforms' runs: the summary JSON and its markdown."""
    # only the section's candidates: a reused folder may hold others
    rows = subset_means([r for res in results for r in res["runs"] if r["candidate"] in cv["candidates"]])
    reference = cv.get("reference", "random")
    cells, diffs = summarize(rows), paired(rows, reference)
    per_platform = {res["platform"]: paired([r for r in rows if r["platform"] == res["platform"]], reference)
                    for res in results}
    sizes = {res["platform"]: {"programs": res["train_programs"], "tasks": res["train_tasks"]} for res in results}
    # `cv.pairs`: [candidate, other] compared directly (e.g. a setting with and without one change)
    pairs = [d for first, second in cv.get("pairs") or []
             for d in paired([r for r in rows if r["candidate"] in (first, second)], second)]
    out = {"cv": cv, "platforms": sizes, "summary": cells, "paired": diffs, "paired_per_platform": per_platform,
           "pairs": pairs}
    return out, markdown(cells, diffs, per_platform, cv, sizes, pairs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="one platform's runs")
    run.add_argument("--platform", required=True)
    run.add_argument("--params", default="params.yaml")
    run.add_argument("--study-params", default="pipelines/sampling/params.yaml")
    run.add_argument("--out", required=True)
    run.add_argument("--ratios", help="comma-separated: run only these of the section's ratios "
                                      "(two processes sharing a study; `summary` pools the parts)")
    run.add_argument("--seeds", help="comma-separated: run only these of the section's seeds")
    run.add_argument("--candidates", help="comma-separated: run only these of the section's candidates "
                                          "(the others' runs come from an earlier study's `--runs` folder)")
    summary = sub.add_parser("summary", help="pool the platforms' runs")
    summary.add_argument("--runs", required=True, action="append",
                         help="folder of `run` outputs (<platform>.json, or parts <platform>.<part>.json); "
                              "repeated: the folders' runs pooled (a study reusing an earlier one's runs)")
    summary.add_argument("--study-params", default="pipelines/sampling/params.yaml")
    summary.add_argument("--out", required=True)
    summary.add_argument("--markdown", required=True)
    for p in (run, summary):
        p.add_argument("--section", default="cv", help="the study params' section with the settings")
    a = ap.parse_args()
    cv = load_params(a.study_params)[a.section]
    if a.command == "run":
        cv = {**cv, **{key: [cast(v) for v in getattr(a, key).split(",")]
                       for key, cast in (("ratios", float), ("seeds", int)) if getattr(a, key)}}
        if a.candidates:
            wanted = a.candidates.split(",")
            unknown = set(wanted) - set(cv["candidates"])
            if unknown:
                raise SystemExit(f"cv run: {sorted(unknown)} not among section {a.section}'s candidates")
            cv["candidates"] = {n: spec for n, spec in cv["candidates"].items() if n in wanted}
        atomic_write_json(a.out, run_platform(a.platform, load_params(a.params), cv))
        return
    # the platforms of params.yaml, in its order: a stale file of a dropped platform is not read
    results = [pool_parts(p, a.runs) for p in cv["platforms"]]
    out, text = summarize_platforms(results, cv)
    atomic_write_json(a.out, out)
    atomic_write_text(a.markdown, text)
    print(text)


if __name__ == "__main__":
    main()
