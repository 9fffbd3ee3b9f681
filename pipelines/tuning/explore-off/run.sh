#!/usr/bin/env bash
# Session 41 (2026-12-07): the long-explore stages' KB lost the three dense tasks to XGBoost, but that
# occasion changed two things at once (exploring, and a main-job KB re-trained by the current code).
# This runs the same fine-tuning KB (models/amd-zen4-avx512) with exploring off (--explore 0) on those
# three tasks, seeds 12-13, every other setting as the long-explore stages (256 trials, batches of 16,
# min_repeat_ms 20). Rule, fixed before it ran: if the non-exploring KB's final latency (mean of the
# two seeds) is also above XGBoost's of the long-explore occasion on a dense task, that loss belongs
# to the KB; where it reaches XGBoost's final latency and the exploring KB did not, exploring cost it.
# Reports: explore-off/<task>-seed<S>.json (the last JSON line of `tcl tune --json`).
set -euo pipefail
cd "$(dirname "$0")/../../.."
for task in dense_128_768_768 dense_128_3072_768 dense_128_768_3072; do
  for seed in 12 13; do
    report=pipelines/tuning/explore-off/$task-seed$seed.json
    [ -s "$report" ] && continue   # resumable: a finished run is kept
    tcl tune --platform znver4-avx512-t2 --workload "$task" --trials 256 --trials-per-iter 16 \
      --cost-model tcl --model models/amd-zen4-avx512 --fine-tune --explore 0 --seed "$seed" \
      --min-repeat-ms 20 --out "runs/explore-off/$task-seed$seed" --no-progress --json | tail -1 > "$report.tmp"
    mv "$report.tmp" "$report"
  done
done
