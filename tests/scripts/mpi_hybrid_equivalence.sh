#!/usr/bin/env bash
# Nemotron 3 Super's mix (Mamba-2, attention and latent squared-ReLU MoE layers, 2 multi-token
# prediction depths) under MPI computes the same function as one rank: trains 20 steps on one
# rank (threads backend) and on 2 MPI processes at tp 2 with sequence parallelism, pp 2 (stages
# [M, *] and [M, E] + MTP) and ep 2 with ZeRO-1, comparing every step's loss and MTP loss
# (relative 1e-5); then a run saved at pp 2 after 10 steps continues at tp 2 and its last 10
# losses equal the one-rank run's. Usage: mpi_hybrid_equivalence.sh LOOM_BINARY MPIEXEC
set -euo pipefail
loom="$1"
mpiexec="$2"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# shellcheck source=small_corpus.sh
source "$(dirname "$0")/small_corpus.sh"
prepare_small_corpus "$loom" "$work"
cat > "$work/config.yaml" <<YAML
model: {vocab_size: 0, d_model: 32, layers: 4, heads: 4, kv_heads: 2, ffn_size: 48, max_seq_len: 32,
        activation: relu2, tied_embeddings: false, layer_pattern: 'M*ME', mtp_depths: 2,
        moe_experts: 4, moe_top_k: 2, moe_ffn_size: 24, moe_latent_size: 16, moe_shared_ffn_size: 24,
        mamba: {state_size: 8, heads: 4, head_dim: 8, groups: 2, conv_kernel: 4, chunk_size: 6}}
parallel: {pipeline_partition: even}
data: {tokenizer: byte, train_prefix: $work/c_train, seq_len: 16}
optim: {lr: 3.0e-3, warmup_steps: 2}
train: {steps: 20, global_batch: 8, micro_batch: 4, threads: 1}
log: {progress: false, interval: 100}
YAML
"$loom" train "$work/config.yaml" run.dir="$work/one" > /dev/null
values() { sed -E "s/.*\"$2\":([-0-9.e+]+).*/\1/" "$1/metrics.jsonl"; }
compare() {  # compare REFERENCE_DIR RUN_DIR KEY LAYOUT FIRST_STEP
  paste <(values "$1" "$3" | tail -n +"$5") <(values "$2" "$3") | awk -v what="$4 $3" '
    { n++; d = $1 - $2; if (d < 0) d = -d; r = d / ($1 < 0 ? -$1 : $1);
      if (r > 1e-5) { printf "%s, step %d: one rank %s, 2 MPI ranks %s (relative %.2e)\n", what, n, $1, $2, r; bad = 1 } }
    END { if (n == 0) { print what ": no steps"; exit 1 } exit bad }'
}
run() {  # run NAME OVERRIDES...
  local name="$1"
  shift
  "$mpiexec" --allow-run-as-root --oversubscribe -np 2 "$loom" train "$work/config.yaml" runtime.backend=mpi \
    run.dir="$work/$name" "$@" > "$work/$name.log" 2>&1 || { cat "$work/$name.log"; exit 1; }
}
layouts=("parallel.tp=2 parallel.sequence_parallel=true" "parallel.pp=2" "parallel.ep=2 parallel.zero=1")
for i in 0 1 2; do
  # shellcheck disable=SC2086  # the layout is a list of overrides
  run "mpi$i" ${layouts[$i]}
  [ "$(wc -l < "$work/mpi$i/metrics.jsonl")" -eq 20 ] || { echo "${layouts[$i]}: expected 20 steps"; exit 1; }
  compare "$work/one" "$work/mpi$i" loss "${layouts[$i]}" 1
  compare "$work/one" "$work/mpi$i" mtp_loss "${layouts[$i]}" 1
  echo "${layouts[$i]}: 2 MPI ranks match one rank over 20 steps (loss, mtp_loss)"
done
run moved parallel.pp=2 train.exit_interval=10
rm "$work/moved/metrics.jsonl"
run moved parallel.tp=2 train.resume=true
[ "$(wc -l < "$work/moved/metrics.jsonl")" -eq 10 ] || { echo "the resumed run: expected 10 steps"; exit 1; }
compare "$work/one" "$work/moved" loss "saved at pp 2, continued at tp 2" 11
echo "saved at pp 2, continued at tp 2: the last 10 steps match one rank"
