#!/usr/bin/env bash
# loom's inference engine against llama.cpp on the same model, same machine, same run: a
# Llama-style model the size of configs/tiny.yaml (4.5M parameters, byte tokenizer), trained
# for one step (speed does not depend on the weights), exported with `loom convert --to-gguf`
# (f32, as loom computes). Runs each engine twice, alternated.
# Usage: bench/serve_bench.sh [BUILD_DIR=build] [THREADS=2]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/serve_common.sh" "$@"
one_step "$repo/configs/tiny.yaml" run
"$build/loom" convert --to-gguf "$work/run/checkpoints" "$work/model.gguf" > /dev/null
export OMP_NUM_THREADS="$threads"
for round in 1 2; do
  echo "# round $round"
  "$build/bench/loom_bench_serve" "$work/run/checkpoints" 64 64 448
  node "$repo/bench/peers/llama_cpp_decode.mjs" "$repo/.cache/npm" "$work/model.gguf" "$threads" 64 64 448
done
