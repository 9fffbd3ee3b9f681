#!/usr/bin/env bash
# The fine-tuning KB's cost-model share on the two held-out tasks where it was highest before the
# updates got faster (2026-12-07, session 40; updates.sh has the validation tasks): dense_128_768_768
# (15.9 % at seed 5, a 197 s run) and dense_128_768_3072 (16.9 % over seeds 2-3). The exploring,
# fine-tuning KB alone (`tcl bench tune --cost-models tcl-ft`), as tune-seed-5 ran it, on a fresh
# seed 6. Read: `cost_model.share_with_updates` in each report; the latencies are not read
# (one seed of one model: no comparison is made from them).
#
#   cd <repo> && bash pipelines/newplatform/tuning/validation/updates-heldout.sh
set -euo pipefail
here=pipelines/newplatform/tuning/validation/updates-heldout
mkdir -p "$here"
export TCL_HARDWARE=pipelines/newplatform/hardware.json
for task in dense_128_768_768 dense_128_768_3072; do
  tcl bench tune --platform xeon-avx512-t2 --workload "$task" --trials 256 --trials-per-iter 16 --seeds 6 \
    --cost-models tcl-ft --kb-checkpoint pipelines/newplatform/models/transfer-rdu-s0 --min-repeat-ms 20 \
    --out "runs/newplatform-updates-heldout/$task" --no-progress --json > "$here/$task.json"
done
