#!/usr/bin/env bash
# Data, tensor, pipeline, context and expert parallelism under MPI compute the same function as
# one rank: trains 20 steps on one rank (threads backend) and on 4 MPI processes (dp 4 with ZeRO
# stages 0 and 1, and 2 with the parameter gathers overlapping the forward (parallel.
# overlap_param_gather: MPI's non-blocking gathers on a split communicator left in flight); tp 2
# x dp 2 with sequence parallelism and ZeRO-1; pp 2 x dp 2 with 1F1B and
# ZeRO-1; the interleaved pipeline at pp 2 x dp 2 with 4 micro-batches per pipeline; cp 2 x dp 2
# with Ulysses all-to-all and ZeRO-1; cp 4 with ring attention; a mixture of
# experts at ep 2 and ep 4 with ZeRO-1, and ep 2 x tp 2), and compares every step's loss
# (relative 1e-5); the pipeline run also traces two steps on every rank (profile.*), each process
# writing its own trace. Usage: mpi_train_equivalence.sh LOOM_BINARY MPIEXEC
set -euo pipefail
loom="$1"
mpiexec="$2"
steps=20
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# shellcheck source=small_corpus.sh
source "$(dirname "$0")/small_corpus.sh"
prepare_small_corpus "$loom" "$work"
cat > "$work/config.yaml" <<YAML
model: {vocab_size: 0, d_model: 32, layers: 2, heads: 4, kv_heads: 2, ffn_size: 48, max_seq_len: 32}
data: {tokenizer: byte, train_prefix: $work/c_train, seq_len: 16}
optim: {lr: 1.0e-3, warmup_steps: 2}
train: {steps: $steps, global_batch: 8, micro_batch: 8, threads: 1}
log: {progress: false, interval: 100}
YAML
"$loom" train "$work/config.yaml" run.dir="$work/one" > /dev/null
losses() { sed -E 's/.*"loss":([-0-9.e+]+).*/\1/' "$1/metrics.jsonl"; }
layouts=("parallel.zero=0 train.micro_batch=2" "parallel.zero=1 train.micro_batch=2"
         "parallel.tp=2 parallel.sequence_parallel=true parallel.zero=1 train.micro_batch=4"
         "parallel.pp=2 parallel.pipeline_schedule=1f1b parallel.zero=1 train.micro_batch=1
          profile.first_step=5 profile.last_step=6 profile.ranks=[]"
         "parallel.cp=2 parallel.cp_comm=a2a parallel.zero=1 train.micro_batch=2"
         "parallel.cp=4 parallel.cp_comm=p2p"
         "parallel.zero=2 parallel.overlap_param_gather=true train.micro_batch=2")
compare() {  # compare REFERENCE_DIR RUN_DIR LAYOUT
  paste <(losses "$1") <(losses "$2") | awk -v layout="$3" -v steps="$steps" '
    { n++; d = $1 - $2; if (d < 0) d = -d; r = d / ($1 < 0 ? -$1 : $1);
      if (r > 1e-5) { printf "%s, step %d: one rank %s, 4 MPI ranks %s (relative %.2e)\n", layout, n, $1, $2, r; bad = 1 } }
    END { if (n != steps) { print "expected " steps " steps, got " n; exit 1 } exit bad }'
}
for zero in 0 1 2 3 4 5 6; do
  # shellcheck disable=SC2086  # the layout is a list of overrides
  "$mpiexec" --allow-run-as-root --oversubscribe -np 4 "$loom" train "$work/config.yaml" runtime.backend=mpi \
    run.dir="$work/mpi$zero" ${layouts[$zero]} > "$work/mpi$zero.log" 2>&1 ||
    { cat "$work/mpi$zero.log"; exit 1; }
  reports=$(grep -c "^trained steps" "$work/mpi$zero.log" || true)
  [ "$reports" -eq 1 ] || { echo "expected one summary (rank 0's), got $reports:"; cat "$work/mpi$zero.log"; exit 1; }
  compare "$work/one" "$work/mpi$zero" "${layouts[$zero]}"
  echo "${layouts[$zero]}: 4 MPI ranks match one rank over $steps steps"
done
# The pipeline run above traced steps 5-6 on every rank (profile.*): each MPI process wrote its own
# Chrome trace, holding those steps and its stage's micro-batches.
for rank in 0 1 2 3; do
  python3 - "$work/mpi3/profile/rank-$rank.json" <<'PY' || exit 1
import json, sys
names = [e["name"] for e in json.load(open(sys.argv[1]))["traceEvents"] if e["ph"] == "X"]
want = {"step 5", "step 6", "forward micro-batch 0 chunk 0", "backward micro-batch 1 chunk 0", "optimizer"}
missing = want - set(names)
if missing or "step 4" in names or "step 7" in names:
    sys.exit(f"{sys.argv[1]}: missing {sorted(missing)}, or a step outside 5-6")
PY
done
echo "pp 2 x dp 2: every MPI rank traced steps 5-6"
# The interleaved pipeline (4 layers: 2 chunks per stage) with more micro-batches than stages: its
# ranks exchange in lockstep batches with both neighbours (pipeline_schedule.cpp).
sed -e 's/layers: 2,/layers: 4,/' "$work/config.yaml" > "$work/deep.yaml"
"$loom" train "$work/deep.yaml" run.dir="$work/deep-one" > /dev/null
interleaved="parallel.pp=2 parallel.pipeline_schedule=interleaved parallel.virtual_stages=2 train.micro_batch=1"
# shellcheck disable=SC2086  # the layout is a list of overrides
"$mpiexec" --allow-run-as-root --oversubscribe -np 4 "$loom" train "$work/deep.yaml" runtime.backend=mpi \
  run.dir="$work/interleaved" $interleaved > "$work/interleaved.log" 2>&1 || { cat "$work/interleaved.log"; exit 1; }
compare "$work/deep-one" "$work/interleaved" "$interleaved"
echo "$interleaved: 4 MPI ranks (pp 2 x dp 2, 4 micro-batches per pipeline) match one rank over $steps steps"
# Mixture of experts: tokens cross the expert-parallel ranks by all-to-all.
sed -e 's/^model: {\(.*\)}$/model: {\1, moe_experts: 4, moe_top_k: 2, moe_ffn_size: 24, moe_aux_loss_coeff: 0.01,\
        moe_router: sigmoid, moe_expert_bias: true, moe_bias_update_rate: 0.01, moe_capacity_factor: 1.0}/' \
  "$work/config.yaml" > "$work/moe.yaml"
"$loom" train "$work/moe.yaml" run.dir="$work/moe-one" train.micro_batch=2 > /dev/null
# The last two fold the experts onto the tensor-parallel ranks (ep 4 over tp 2 x dp 2).
moe_layouts=("parallel.ep=2 parallel.zero=1 train.micro_batch=2" "parallel.ep=4 train.micro_batch=2"
             "parallel.ep=2 parallel.tp=2 parallel.sequence_parallel=true train.micro_batch=2"
             "parallel.ep=4 parallel.tp=2 train.micro_batch=2")
for i in 0 1 2 3; do
  # shellcheck disable=SC2086  # the layout is a list of overrides
  "$mpiexec" --allow-run-as-root --oversubscribe -np 4 "$loom" train "$work/moe.yaml" runtime.backend=mpi \
    run.dir="$work/moe$i" ${moe_layouts[$i]} > "$work/moe$i.log" 2>&1 || { cat "$work/moe$i.log"; exit 1; }
  compare "$work/moe-one" "$work/moe$i" "${moe_layouts[$i]}"
  echo "MoE ${moe_layouts[$i]}: 4 MPI ranks match one rank over $steps steps"
done
