#!/usr/bin/env bash
# MetaSchedule's XGBoost learning the run beside the KB (tcl.tuner.online, `tcl tune --online-weight`):
# once XGBoost has 100 of the run's measurements (its own warm-up), each chunk the fine-tuning,
# exploring KB scores is ranked by 0.5 * KB rank + 0.5 * XGBoost rank. Tried on the four tasks of
# the transferred KB's validation split, as explore.sh tried the exploration (same tasks, seeds,
# trials, batches and measurement settings), never on the held-out networks' tasks. Rows append to
# online.jsonl; a re-run resumes.
#
# Why: on the held-out tasks XGBoost ends below the KB where the KB ranks the fastest schedules
# badly (docs/new-platform.md, "Six tasks"), and the KB leads early everywhere; the target
# (>= 3x sooner than XGBoost) needs both.
#
# The rule, fixed before any run (2026-12-07, session 39): the fine-tuning KB with params.yaml's
# tune.explore (share_max 0.2, as explore0.2 ran) and tune.online {weight: 0.5, warmup: 100},
# seeds 0-2, 256 trials in batches of 16, min_repeat_ms 20. Its baseline is explore.sh's
# `explore0.2` rows (the same KB, tasks and host type, 2026-12-05/06; with weight 0 the cost model
# runs their code). weight 0.5 becomes params.yaml's default only if, over seeds 0-2, the geometric
# mean over the four tasks of its final latency over explore0.2's is <= 0.99 and no task's final is
# more than 2 % above explore0.2's (the rule explore0.2 itself was held to), and the cost model
# (predict and XGBoost's training) stays within issue 14's 10 % of every run's wall time: XGBoost's
# per-store features cost it 14-24 % of the wall time in its own runs on this host. The host moves a run
# by a few per cent between occasions, so explore0.2 seed 0 is re-run here as a control
# (`explore0.2-control`, after the online runs): if the control's geometric mean over the four
# tasks is more than 2 % from its 2026-12-05/06 rows, the reading is "the occasion moved", not an
# adoption, whichever way it falls. Adopted or not, it is then tried on the held-out tasks only
# in a later, separately fixed run.
#
#   cd <repo> && bash pipelines/newplatform/tuning/validation/online.sh
#   V=pipelines/newplatform/tuning/validation
#   python pipelines/tuning/validation_study.py summary $V/explore.jsonl $V/online.jsonl \
#       --baseline explore0.2 --reference online0.5 --names explore0.2,online0.5           # the rule (seeds 0-2)
#   python pipelines/tuning/validation_study.py summary $V/explore.jsonl $V/online.jsonl \
#       --baseline explore0.2 --reference explore0.2-control --names explore0.2,explore0.2-control  # seed 0
set -euo pipefail
here=pipelines/newplatform/tuning/validation
tasks=conv2d_14_64_384_1_1,dense_128_512_128,dense_196_768_192,depthwise_conv2d_14_576_3_1
kb=pipelines/newplatform/models/transfer-rdu-s0
export TCL_HARDWARE=pipelines/newplatform/hardware.json
for seed in ${SEEDS:-0 1 2}; do
  python pipelines/tuning/validation_study.py run --name online0.5 --cost-model tcl-ft --model "$kb" \
    --explore '{"share_max": 0.2, "patience": 2, "min_gain": 0.01}' --online '{"weight": 0.5, "warmup": 100}' \
    --seeds "$seed" --tasks "$tasks" --trials 256 --trials-per-iter 16 --platform xeon-avx512-t2 \
    --min-repeat-ms 20 --work runs/newplatform-online --out "$here/online.jsonl"
done
if [ -z "${SKIP_CONTROL:-}" ]; then
  python pipelines/tuning/validation_study.py run --name explore0.2-control --cost-model tcl-ft --model "$kb" \
    --explore '{"share_max": 0.2, "patience": 2, "min_gain": 0.01}' --seeds 0 \
    --tasks "$tasks" --trials 256 --trials-per-iter 16 --platform xeon-avx512-t2 --min-repeat-ms 20 \
    --work runs/newplatform-online --out "$here/online.jsonl"
fi
