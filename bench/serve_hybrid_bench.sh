#!/usr/bin/env bash
# loom's inference engine on the hybrid tiny Super config (Mamba-2 state slots beside the paged KV
# cache) next to the dense tiny model, same machine, same run: both byte-tokenizer models trained
# one step (speed does not depend on the weights), then bench/serve_engine_bench.cpp on each,
# alternated, twice (64-token prompts, 64 generated tokens, 192-token prefill: the hybrid
# config's context is 256).
# Usage: bench/serve_hybrid_bench.sh [BUILD_DIR=build] [THREADS=2]
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$repo/build}"
threads="${2:-2}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for i in $(seq 1 300); do echo "It is a truth universally acknowledged, item $((i * 7))."; echo; done > "$work/corpus.txt"
"$build/loom" data prepare "$work/corpus.txt" --output "$work/data/c" --val-fraction 0 > /dev/null
one_step() {  # CONFIG NAME: CONFIG trained one step into $work/NAME
  sed -e "s|dir: runs/.*|dir: $work/$2|" -e "s|train_prefix: data/byte/corpus_train|train_prefix: $work/data/c_train|" \
      -e "/val_prefix/d" -e "s|steps: [0-9]*$|steps: 1|" -e "s|eval_interval: [0-9]*|eval_interval: 0|" \
      -e "s|^  interval: [0-9]*|  interval: 1|" "$1" > "$work/$2.yaml"
  "$build/loom" train "$work/$2.yaml" > /dev/null
}
one_step "$repo/configs/tiny.yaml" dense
one_step "$repo/configs/nemotron3-super-tiny.yaml" hybrid
export OMP_NUM_THREADS="$threads"
for round in 1 2; do
  for model in dense hybrid; do
    echo "# round $round: $model"
    "$build/bench/loom_bench_serve" "$work/$model/checkpoints" 64 64 192
  done
done
