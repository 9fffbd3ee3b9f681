#!/usr/bin/env bash
# Session 44 (2026-12-07, committed before any of these runs). run.sh found the training run, not the
# subset, behind nearly all of a 10% strategy's spread on the held-out tasks (summary-10.md: the subset's
# share of a run's network top-1 variance 0 for rdu and random, 0.10 for kmeans). Its training keeps the
# epoch of the best validation top-1 (`tcl train`'s default select) on the pool's 4 validation tasks, which
# jumps by 0.2-0.5 between adjacent epochs while the validation pairwise accuracy climbs smoothly (the whole
# pool, seed 2: stopped at epoch 11 keeping epoch 0, pairwise 0.69 against 0.73-0.74 later). The continual
# module selects on pairwise for that reason (params.yaml continual.select). Here: the same runs with
# `--train-set select=pairwise`, nothing else changed: the whole pool seeds 0-11 and the 10% subsets of
# rdu, random and kmeans, subset seeds 0-11, training seeds = the subset seed, 1000, 1001, 1002.
# The reading, whatever it shows (trainseeds.py --results results-pairwise --rounds6 '' --whole-pool
# results-pairwise): (1) the training sd of network and per-task top-1, against summary-10.md's;
# (2) the strategies on subset means, as run.sh's rule. `train.select` (params.yaml, `tcl train`'s
# default) becomes pairwise only if on the whole pool (seeds 0-11, paired by seed with rounds6's top1
# runs) the sd of network top-1 over seeds is not larger and the mean network top-1 is not lower by more
# than one standard error of the paired difference; the sampling figures are then re-read with it.
# Results: trainseeds/results-pairwise/<label>-s<subset seed>-t<training seed>.json, full-s<seed>.json.
# Usage: pairwise.sh full SEEDS... | pairwise.sh SEEDS...   (two processes, as run.sh)
set -euo pipefail
cd "$(dirname "$0")/../../../.."
export TCL_HARDWARE=pipelines/newplatform/hardware.json
HERE=pipelines/newplatform/poolsize/trainseeds
WORK=${WORK:-runs/poolsize-rounds6}
DATA=pipelines/newplatform/data/split-pool512
OUT=$HERE/results-pairwise
mkdir -p "$OUT" "$WORK/pairwise"

one() {  # one() DATA.npz NAME LABEL TRAIN_SEED: train with select=pairwise, score on the held-out tasks
  local data=$1 name=$2 label=$3 train_seed=$4 result=$OUT/$2.json
  [ -s "$result" ] && return 0   # resumable: a finished run is kept
  tcl train --model mamba --preset kb --data "$data" --valid $DATA/valid.npz --train-set select=pairwise \
    --train-set seed="$train_seed" --train-set epochs=30 --train-set batch_size=64 --train-set lr=0.002 \
    --train-set warmup_epochs=1 --train-set schedule=cosine --train-set patience=10 --train-set threads=1 \
    --experiment tcl-newplatform --out "$WORK/pairwise/$name" --no-progress > /dev/null
  tcl evaluate --model "$WORK/pairwise/$name" --data pipelines/newplatform/data/test.npz --label "$label" \
    --out "$result.tmp" > /dev/null
  mv "$result.tmp" "$result"
}

if [ "${1:-}" = full ]; then
  shift
  for seed in "$@"; do one $DATA/train.npz "full-s$seed" full "$seed"; done
  exit 0
fi
for seed in "$@"; do
  for strategy in rdu random kmeans; do
    subset=$WORK/$strategy-0.1-s$seed.npz
    [ -s "$subset" ] || { echo "missing $subset: run.sh $seed first" >&2; exit 1; }
    for train_seed in "$seed" 1000 1001 1002; do
      one "$subset" "$strategy-0.1-s$seed-t$train_seed" "$strategy-0.1" "$train_seed"
    done
  done
done
