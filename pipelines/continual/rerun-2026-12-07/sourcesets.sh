#!/usr/bin/env bash
# Session 45 (2026-12-07, committed before any of these runs): issue 13's Table 5 with today's code. In the
# 2026-12-01 study (3 seeds, the code before session 40's kernels, the earlier KD guard) x86-sse-t2 learned
# from the `all` sources (znver4-avx512-t2, x86-avx2-t2, then x86-sse-t1) read 0.703 ± 0.081 network top-1,
# level with from scratch on 100%, where from its family's source alone it reads 0.550 today (ckd-sig,
# 18 seeds) against scratch-100's 0.671. Here, per seed: the `cross` KB and the `all` KB that continues it
# (`tcl ckd-study sources`), then `ckd` from each on the main job's 10% subset (today's params.yaml: the KD
# guard with kd_guard_min_gain_se 2, which is the ckd-sig variant of run.sh). x86-sse first, seeds 0-8;
# then amd-zen4-avx512, same seeds, as time allows. The reading, whatever it shows: ckd-all and ckd-cross
# against this folder's scratch-100 and ckd-sig (same sources) runs of the same seeds, paired by seed
# (mean ± standard error), network and per-task top-1; issue 13's target (CKD on 10% >= from scratch on
# 100%) read on the means per source set, and the sources' drop as in (a). It changes no setting: the main
# job's sources stay the family's own platforms (issue 13 item 6).
# Extended (session 45, committed after reading seeds 0-8, before these runs): x86-sse seeds 9-17, because
# there ckd-all against scratch-100 read -0.019 ± 0.062 network top-1 on seeds 0-8 (level within one se)
# and run.sh's other variants have seeds 0-17. The reading, whatever it shows: x86-sse seeds 0-17 pooled
# (paired.py x86-sse ckd-all ... -> sourcesets-x86-sse-0-17.md), as above; it changes no setting.
# Extended (session 46, 2026-12-07 22:25 UTC, committed before these runs): amd-zen4-avx512 seeds 9-17, so that
# both families' Table 5 rows stand on 18 seeds as run.sh's other variants do (seeds 0-8 read ckd-all against
# scratch-100 -0.001 ± 0.025 network, -0.043 ± 0.018 per task). The reading, whatever it shows: amd seeds 0-17
# pooled (paired.py amd-zen4-avx512 ckd-all ... -> sourcesets-amd-zen4-avx512-0-17.md), as above; it changes
# no setting.
# Results: <family>-ckd-<cross|all>-s<seed>.json here; KBs in $WORK. Usage: sourcesets.sh FAMILY SEEDS...
set -euo pipefail
cd "$(dirname "$0")/../../.."
HERE=pipelines/continual/rerun-2026-12-07
WORK=${WORK:-runs/continual-rerun-2026-12-07}
family=$1; shift
S=(--study-params pipelines/continual/params.yaml --params params.yaml)
mkdir -p "$WORK"
for seed in "$@"; do
  cross=$WORK/$family-cross-s$seed all=$WORK/$family-all-s$seed
  [ -s "$cross/study.json" ] || tcl ckd-study sources "$family" --sources cross --seed "$seed" "${S[@]}" --out "$cross"
  [ -s "$all/study.json" ] || tcl ckd-study sources "$family" --sources all --from "$cross" --seed "$seed" "${S[@]}" --out "$all"
  for sources in all cross; do
    out=$HERE/$family-ckd-$sources-s$seed.json
    [ -s "$out" ] && continue   # resumable: a finished run is kept
    kb=$WORK/$family-$sources-s$seed
    tcl ckd-study run "$family" --variant ckd --sources "$sources" --seed "$seed" --source-kb "$kb" "${S[@]}" \
      --out "$out.tmp.json"
    mv "$out.tmp.json" "$out"
  done
done
