#!/usr/bin/env bash
# `loom launch` supervising an MPI job: rank 1 of `mpirun -np 2` is killed at step 5 (then,
# in a second job, stalls at step 5); the supervisor restarts the job from the latest good
# checkpoint and it ends with the parameters of an uninterrupted MPI run.
# Usage: mpi_launch_recovery.sh LOOM_BINARY MPIEXEC
set -euo pipefail
loom="$1"
mpiexec="$2"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# shellcheck source=small_corpus.sh
source "$(dirname "$0")/small_corpus.sh"
prepare_small_corpus "$loom" "$work"
cat > "$work/config.yaml" <<YAML
model: {vocab_size: 0, d_model: 32, layers: 2, heads: 4, kv_heads: 2, ffn_size: 48, max_seq_len: 32}
data: {tokenizer: byte, train_prefix: $work/c_train, seq_len: 16}
optim: {lr: 1.0e-3, warmup_steps: 2}
train: {steps: 8, global_batch: 8, micro_batch: 2, threads: 1}
checkpoint: {interval: 2}
runtime: {backend: mpi}
log: {progress: false}
YAML
mpi=("$mpiexec" --allow-run-as-root --oversubscribe -np 2 "$loom" train "$work/config.yaml")
"${mpi[@]}" run.dir="$work/full" > "$work/full.log" 2>&1 || { cat "$work/full.log"; exit 1; }
expected=$("$loom" ckpt digest "$work/full/checkpoints" | tail -n 1)
check() {  # NAME LOG: finished after one restart with the uninterrupted digest
  grep -q "training finished on attempt 2" "$2" || { echo "$1: did not finish after a restart:"; cat "$2"; exit 1; }
  got=$("$loom" ckpt digest "$work/$1/checkpoints" | tail -n 1)
  [ "$got" = "$expected" ] || { echo "$1: digest $got, uninterrupted $expected"; cat "$2"; exit 1; }
  echo "$1: recovered after one restart, digest $got matches the uninterrupted run"
}
"$loom" launch --max-restarts 2 --hang-timeout-s 60 --grace-s 5 -- "${mpi[@]}" run.dir="$work/kill" \
  fault.kill_rank=1 fault.kill_step=5 > "$work/kill.log" 2>&1 || { cat "$work/kill.log"; exit 1; }
grep -q "attempt 1 failed" "$work/kill.log" || { cat "$work/kill.log"; exit 1; }
check kill "$work/kill.log"
"$loom" launch --max-restarts 2 --hang-timeout-s 3 --grace-s 1 -- "${mpi[@]}" run.dir="$work/stall" \
  fault.stall_rank=1 fault.stall_step=5 > "$work/stall.log" 2>&1 || { cat "$work/stall.log"; exit 1; }
grep -q "rank 1 (pid [0-9]* on .*) stuck for .* not in a collective; rank 0 waiting for .* in all_reduce" "$work/stall.log" ||
  { echo "stall: no diagnosis naming rank 1 and rank 0's all_reduce:"; cat "$work/stall.log"; exit 1; }
check stall "$work/stall.log"
