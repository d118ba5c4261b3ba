#!/usr/bin/env bash
# End-to-end `loom train` throughput of two loom binaries, timed alternately in one run so that
# the machine's load affects both alike: GPT-2 124M (configs/gpt2-124m.yaml, vocabulary padded to
# 50304 over the byte-level corpus, so the FLOPs are GPT-2 small's) at B=4, T=64, 2 threads.
# Reports each run's mean tokens/s over the steps after the first (metrics.jsonl) and the ratio.
# Usage: bench/compare_train.sh BEFORE_LOOM AFTER_LOOM [rounds] [steps]
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
before="$1" after="$2" rounds="${3:-3}" steps="${4:-6}"
if [ ! -f data/byte/corpus_train.idx ]; then
  "$after" data prepare .cache/data/corpus --tokenizer byte --output data/byte/corpus --val-fraction 0.02 >/dev/null
fi
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
# Mean tokens/s of metrics.jsonl's records after the first (the first pays for allocations).
mean_tokens_per_s() {
  python3 -c 'import json,sys; r=[json.loads(l)["tokens_per_s"] for l in open(sys.argv[1])][1:]; print(f"{sum(r)/len(r):.1f}")' "$1"
}
run() {  # binary name -> tokens/s
  rm -rf "$scratch/$2"
  OMP_NUM_THREADS=2 "$1" train configs/gpt2-124m.yaml run.dir="$scratch/$2" data.tokenizer=byte \
    data.train_prefix=data/byte/corpus_train data.val_prefix= model.vocab_size=50304 data.seq_len=64 \
    train.global_batch=4 train.micro_batch=4 train.threads=2 train.steps="$steps" train.eval_interval=0 \
    checkpoint.interval=0 log.progress=false >/dev/null
  mean_tokens_per_s "$scratch/$2/metrics.jsonl"
}
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
for round in $(seq 1 "$rounds"); do
  b=$(run "$before" before) a=$(run "$after" after)
  echo "round $round: before $b tokens/s, after $a tokens/s, after/before $(python3 -c "print(f'{$a/$b:.3f}')")"
done
