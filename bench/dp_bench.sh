#!/usr/bin/env bash
# Data-parallel benchmark on the threads backend.
#  1. Step time with dp=2 and dp=4 against compute alone (one rank running one rank's share of
#     the batch on the same number of threads per rank), and the fraction of the gradient
#     communication hidden behind backward (metrics.jsonl: comm_hidden_fraction).
#  2. Per-rank memory of GPT-2 124M with each ZeRO stage at dp=2 and dp=4 (allocated and
#     measured), to set against the formula in docs/benchmarks.md.
# Usage: bench/dp_bench.sh [steps]
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
steps="${1:-6}"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target loom >/dev/null
unset OPENBLAS_CORETYPE
[ -f data/byte/corpus_train.idx ] || build/loom data prepare .cache/data/corpus --tokenizer byte --output data/byte/corpus
[ -f data/gpt2/corpus_train.idx ] || build/loom data prepare .cache/data/corpus --tokenizer gpt2 --output data/gpt2/corpus
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
median() { sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
field() { sed -E "s/.*\"$2\":([-0-9.e+]+).*/\1/" "$1/metrics.jsonl" | tail -n +2; }

echo "== step time (tiny config, 4 x 256 tokens per rank, 1 thread per rank)"
for dp in 1 2 4; do
  build/loom train configs/tiny.yaml runtime.ranks=$dp train.threads=$dp train.global_batch=$((4 * dp)) \
    train.micro_batch=4 train.steps="$steps" train.eval_interval=0 checkpoint.interval=0 log.progress=false \
    run.dir="$out/dp$dp" parallel.bucket_mb=4 > /dev/null
  step=$(field "$out/dp$dp" step_time_s | median)
  hidden=$( [ "$dp" -gt 1 ] && field "$out/dp$dp" comm_hidden_fraction | tail -1 || echo "-")
  echo "dp=$dp median_step_s=$step comm_hidden_fraction=$hidden"
done

echo "== memory per rank, GPT-2 124M (fp32 parameters and gradients)"
for dp in 2 4; do
  for zero in 0 1 2 3; do
    build/loom train configs/gpt2-124m.yaml runtime.ranks=$dp parallel.zero=$zero train.steps=1 \
      train.global_batch=$dp train.micro_batch=1 data.seq_len=64 train.eval_interval=0 checkpoint.interval=0 \
      checkpoint.dir="$out/ckpt" log.progress=false run.dir="$out/mem" 2>&1 | grep -E "^(memory|measured)" |
      sed "s/^/dp=$dp zero=$zero: /"
    rm -rf "$out/ckpt"
  done
done
