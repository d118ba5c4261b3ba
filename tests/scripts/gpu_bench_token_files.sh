#!/usr/bin/env bash
# The GPU training benchmark's token files (bench/cuda/token_shards.py) against their readers that
# CI has: loom reads the indexed dataset it writes (every token id as written: a model vocabulary
# below the largest id is refused) and refuses it with a damaged index; llm.c's shard checks pass
# on the shard it writes and fail on a truncated one. (llm.c's own loader reads the shards in
# scripts/gpu_bundle.sh, where llm.c's sources are.)
#   gpu_bench_token_files.sh LOOM
set -uo pipefail
loom="$1"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
shards="$repo/bench/cuda/token_shards.py"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
train() {
  "$loom" train "$repo/configs/tiny.yaml" data.tokenizer=byte data.train_prefix="$tmp/d" data.val_prefix= \
    train.steps=1 train.global_batch=1 train.micro_batch=1 data.seq_len=16 train.eval_interval=0 \
    run.dir="$tmp/run-$1" "model.vocab_size=$1" log.progress=false >"$tmp/train-$1.log" 2>&1
}

python3 "$shards" loom --prefix "$tmp/d" --tokens 1000 --vocab 512 --doc 100 >/dev/null || fail "writing the dataset"
train 512 || { cat "$tmp/train-512.log"; fail "loom did not train on the written dataset"; }
grep -q '"trained_tokens":16' "$tmp/run-512/metrics.jsonl" || fail "no step of 16 tokens in metrics.jsonl"
python3 "$repo/bench/cuda/train_results.py" loom "$tmp/run-512/metrics.jsonl" --model tiny --batch 1 --seq 16 \
  --warmup 0 | grep -q '^TRAIN|loom|tiny|1|16|' || fail "no TRAIN line from loom's metrics.jsonl"
# Ids up to 511 were written: a 256-entry vocabulary must be refused, naming a token.
train 256 && fail "loom accepted ids >= 256 with model.vocab_size=256"
grep -qi "token" "$tmp/train-256.log" || { cat "$tmp/train-256.log"; fail "the refusal names no token"; }
printf 'X' | dd of="$tmp/d.idx" bs=1 conv=notrunc status=none
train 512 && fail "loom read an index with a damaged magic"

python3 "$shards" llmc --out "$tmp/llmc" --tokens 4097 >/dev/null || fail "writing llm.c shards"
python3 "$shards" check-llmc "$tmp/llmc/train.bin" --batch 4 --seq 1024 >/dev/null || fail "a fresh shard fails llm.c's checks"
python3 "$shards" check-llmc "$tmp/llmc/train.bin" --batch 4 --seq 1025 2>/dev/null && fail "a shard shorter than B x T + 1 passed"
truncate -s -2 "$tmp/llmc/val.bin"
python3 "$shards" check-llmc "$tmp/llmc/val.bin" --batch 1 --seq 16 2>/dev/null && fail "a truncated shard passed"
echo "PASS: token files read back by loom and checked as llm.c checks them"
