# Sourced from the repository root by the pool-size study's scripts (rounds6/run.sh,
# trainseeds/run.sh, trainseeds/pairwise.sh): the pool's data and how each of their runs trains and
# is scored, so every run of the study is the same training.
export TCL_HARDWARE=pipelines/newplatform/hardware.json
POOL=pipelines/newplatform/data/split-pool512
TEST=pipelines/newplatform/data/test.npz
WORK=${WORK:-runs/poolsize-rounds6}   # subsets and models (git-ignored)

# train_and_score DATA.npz MODEL_DIR LABEL RESULT.json SEED [--train-set KEY=VALUE ...]: a KB from
# scratch with the main job's training (early stopping on the pool's 4 validation tasks), scored on
# the 32 held-out tasks (`tcl evaluate --out`). A finished RESULT is kept (resumable); it is written
# to a temporary name first, so a killed run leaves none.
train_and_score() {
  local data=$1 model=$2 label=$3 result=$4 seed=$5
  shift 5
  [ -s "$result" ] && return 0
  tcl train --model mamba --preset kb --data "$data" --valid $POOL/valid.npz "$@" \
    --train-set seed="$seed" --train-set epochs=30 --train-set batch_size=64 --train-set lr=0.002 \
    --train-set warmup_epochs=1 --train-set schedule=cosine --train-set patience=10 --train-set threads=1 \
    --experiment tcl-newplatform --out "$model" --no-progress > /dev/null
  tcl evaluate --model "$model" --data $TEST --label "$label" --out "$result.tmp" > /dev/null
  mv "$result.tmp" "$result"
}
