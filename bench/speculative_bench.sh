#!/usr/bin/env bash
# Speculative decoding with multi-token prediction (`loom serve --speculative-config`): the engine
# without drafts and with 1 and 2 drafts a step (bench/serve_engine_bench.cpp), alternated, twice:
# greedy decode tokens/s at 1, 8 and 32 sequences, the share of drafts kept and the tokens per
# forward. Two models, each trained here first (the drafts' worth depends on what the depths
# learned):
# - super: the tiny Nemotron 3 Super config (configs/nemotron3-super-tiny.yaml: Mamba-2, attention
#   and latent MoE layers, 2 MTP depths sharing one set of weights, 2.1M parameters), STEPS steps
#   on the shipped corpus's speeches; prompts cut from a text it did not train on (Moby-Dick);
# - dense: a 74M-parameter Llama-style model (d_model 768, 8 layers, 2 MTP depths) whose decoding
#   step reads more weights than this machine's caches hold, 30 steps on a repetitive corpus
#   ("It is a truth universally acknowledged, item N."), prompted with that text.
# Usage: bench/speculative_bench.sh [BUILD_DIR=build] [THREADS=2] [STEPS=300] [MODELS="super dense"]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/serve_common.sh" "$@"  # repo, build, threads, work, the repetitive corpus
steps="${3:-300}"
models="${4:-super dense}"
corpus="$repo/.cache/data/corpus"
[[ -d "$corpus/sotu" ]] || { echo "no corpus at $corpus (run scripts/setup.sh)" >&2; exit 1; }
export OMP_NUM_THREADS="$threads"
if [[ " $models " == *" super "* ]]; then
  "$build/loom" data prepare "$corpus/sotu" --tokenizer byte --output "$work/data/s" --val-fraction 0.02 > /dev/null
  sed -e "s|dir: runs/.*|dir: $work/super|" -e "s|data/byte/corpus|$work/data/s|g" \
      -e "s|^  steps: [0-9]*$|  steps: $steps|" -e "s|eval_interval: [0-9]*|eval_interval: 0|" \
      "$repo/configs/nemotron3-super-tiny.yaml" > "$work/super.yaml"
  "$build/loom" train "$work/super.yaml" | tail -2
  head -c 200000 "$corpus/moby-dick.txt" | tail -c 100000 > "$work/super-prompts.txt"
fi
if [[ " $models " == *" dense "* ]]; then
  cp "$work/corpus.txt" "$work/dense-prompts.txt"  # serve_common.sh's, prepared as $work/data/c
  cat > "$work/dense.yaml" <<YAML
run: {dir: $work/dense}
model: {vocab_size: 0, d_model: 768, layers: 8, heads: 12, kv_heads: 4, ffn_size: 2048, norm: rms, activation: swiglu,
        positions: rope, tied_embeddings: false, max_seq_len: 256, mtp_depths: 2, mtp_loss_weight: 0.5}
data: {tokenizer: byte, train_prefix: $work/data/c_train, seq_len: 64}
optim: {lr: 1.0e-3, warmup_steps: 5}
train: {steps: 30, global_batch: 8, micro_batch: 8}
log: {progress: false}
YAML
  "$build/loom" train "$work/dense.yaml" | tail -2
fi
for model in $models; do
  for round in 1 2; do
    for spec in 0 1 2; do
      echo "# $model, round $round: $spec drafts a step"
      "$build/bench/loom_bench_serve" "$work/$model/checkpoints" 64 64 192 cpu auto auto "$spec" \
        "$work/$model-prompts.txt"
    done
  done
done
