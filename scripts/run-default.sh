#!/usr/bin/env bash
# Sets up, builds, prepares the shipped corpus and trains the embedded default (configs/tiny.yaml),
# then prints a sample of generated text. Extra arguments are passed to `loom train` as overrides;
# RUN_DIR (default runs/tiny) says where the run, its metrics and checkpoints go.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)" --target loom
tokenizer=byte
if [ ! -f "data/$tokenizer/corpus_train.idx" ] || [ ! -f "data/$tokenizer/corpus_val.idx" ]; then
  build/loom data prepare .cache/data/corpus --tokenizer "$tokenizer" --output "data/$tokenizer/corpus" --val-fraction 0.02
fi
run_dir="${RUN_DIR:-runs/tiny}"
# train.resume: a second run continues (or finds complete) the first instead of being refused.
build/loom train configs/tiny.yaml run.dir="$run_dir" train.resume=true "$@"
echo "--- sample ---"
build/loom generate "$run_dir/checkpoints" --prompt "The whale " --max-tokens 300 --temperature 0.8 --top-k 40 --seed 7
