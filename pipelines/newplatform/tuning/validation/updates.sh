#!/usr/bin/env bash
# What the fine-tuning KB's updates cost inside tuning once they got faster (2026-12-07, session 40:
# the Mamba scan's forward and backward in C++, training batches cropped to their longest row,
# each re-export writing the new weights into the graph traced once; `tcl bench fine-tune`).
# The setting is explore.sh's `explore0.2` exactly (the fine-tuning, exploring KB; the four
# validation tasks, 256 trials in batches of 16, min_repeat_ms 20), seed 1, as online.sh's
# `explore0.2-control` seed 1 rows ran it on this host type with the updates on two threads
# before the change. The reading is each run's `update_seconds` and the cost model's share of
# its wall time ((predict_seconds + update_seconds) / seconds, issue 14's <= 10 %); the latencies
# are not compared (one seed; the scan's float rounding changes what the KB learns a little).
#
#   cd <repo> && bash pipelines/newplatform/tuning/validation/updates.sh
set -euo pipefail
here=pipelines/newplatform/tuning/validation
tasks=conv2d_14_64_384_1_1,dense_128_512_128,dense_196_768_192,depthwise_conv2d_14_576_3_1
kb=pipelines/newplatform/models/transfer-rdu-s0
export TCL_HARDWARE=pipelines/newplatform/hardware.json
python pipelines/tuning/validation_study.py run --name explore0.2-fast-updates --cost-model tcl-ft --model "$kb" \
  --explore '{"share_max": 0.2, "patience": 2, "min_gain": 0.01}' --seeds "${SEEDS:-1}" \
  --tasks "$tasks" --trials 256 --trials-per-iter 16 --platform xeon-avx512-t2 --min-repeat-ms 20 \
  --work runs/newplatform-updates --out "$here/updates.jsonl"
