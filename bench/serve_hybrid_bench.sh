#!/usr/bin/env bash
# loom's inference engine on the hybrid tiny Super config (Mamba-2 state slots beside the paged KV
# cache) next to the dense tiny model, same machine, same run: both byte-tokenizer models trained
# one step (speed does not depend on the weights), then bench/serve_engine_bench.cpp on each,
# alternated, twice (64-token prompts, 64 generated tokens, 192-token prefill: the hybrid
# config's context is 256).
# Usage: bench/serve_hybrid_bench.sh [BUILD_DIR=build] [THREADS=2]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/serve_common.sh" "$@"
one_step "$repo/configs/tiny.yaml" dense
one_step "$repo/configs/nemotron3-super-tiny.yaml" hybrid
export OMP_NUM_THREADS="$threads"
for round in 1 2; do
  for model in dense hybrid; do
    echo "# round $round: $model"
    "$build/bench/loom_bench_serve" "$work/$model/checkpoints" 64 64 192
  done
done
