#!/usr/bin/env bash
# Session 42 (2026-12-07): issue 13's comparison re-run with today's code. The 9-seed figures in
# docs/continual.md (*A cross-validated KD guard*) came from the code before session 40 changed the
# KB's CPU kernels, and the sampling study re-run this session moved by up to 0.2 top-1 with those
# kernels (docs/sampling.md, *Today's code on the 512-a-task pool*). Per family and seed 0-8: the
# same-family source KB (`tcl ckd-study sources`, kept in $WORK), then ckd, scratch-100, finetune and
# mtl on the main job's subset (data/subsets/<target>/rdu-0.1.npz, `dvc repro --glob "sample@*"`).
# Reported whatever it shows, beside the committed figures; nothing is chosen on it.
# Extended (session 43, 2026-12-07, committed before these runs): seeds 9-17 of every variant on both
# families, the same subsets (the session-42 ones, still on disk), because on amd-zen4-avx512 ckd's gap to
# scratch-100 (-0.037 ± 0.032) was within about one standard error. The reading, whatever it shows:
# seeds 0-17 pooled (summary-0-17.md), the targets read on the means and on ckd - variant paired by seed.
# ckd-sig (session 43, committed before its runs; VARIANTS=ckd-sig run.sh FAMILY 0 ... 17): the KD guard
# takes an epoch only when its per-task pairwise gain on the target's validation tasks is at least
# 2 standard errors (continual.kd_guard_min_gain_se 2: the conventional two, not a value read off
# guard_margin.py's test-split diagnostic). The same source KBs and subsets, seeds 0-17, both families.
# The rule: kd_guard_min_gain_se 2 becomes the default only if (1) no run's source loses more than 2
# points of held-out top-1 and (2) on each family ckd-sig's mean target network top-1 is not below
# ckd's by more than one standard error of their difference paired by seed; otherwise reported only.
# Usage: run.sh FAMILY [SEEDS...]   (VARIANTS="..." overrides the variants run)   (one family a core: run.sh amd-zen4-avx512 & run.sh x86-sse)
set -euo pipefail
cd "$(dirname "$0")/../../.."
HERE=pipelines/continual/rerun-2026-12-07
WORK=${WORK:-runs/continual-rerun-2026-12-07}
family=$1; shift
seeds=("$@"); [ ${#seeds[@]} -gt 0 ] || seeds=(0 1 2 3 4 5 6 7 8)
S=(--study-params pipelines/continual/params.yaml --params params.yaml)
mkdir -p "$WORK"
for seed in "${seeds[@]}"; do
  kb=$WORK/$family-same-s$seed
  [ -s "$kb/study.json" ] || tcl ckd-study sources "$family" --sources same --seed "$seed" "${S[@]}" --out "$kb"
  for variant in ${VARIANTS:-ckd scratch-100 finetune mtl}; do
    out=$HERE/$family-$variant-same-s$seed.json
    [ -s "$out" ] && continue   # resumable: a finished run is kept
    from=(--source-kb "$kb"); case $variant in scratch-100|mtl) from=() ;; esac  # they learn without one
    tcl ckd-study run "$family" --variant "$variant" --seed "$seed" "${from[@]}" "${S[@]}" --out "$out.tmp.json"
    mv "$out.tmp.json" "$out"
  done
done
