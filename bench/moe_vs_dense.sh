#!/usr/bin/env bash
# Dense against MoE at the same active parameters: trains the embedded default
# (configs/tiny.yaml) and its mixture-of-experts variant (configs/tiny-moe.yaml) on the same data,
# steps and schedule, one after the other, then tabulates the validation losses and plots both
# curves (docs/moe_vs_dense.png).
#
#   bash bench/moe_vs_dense.sh [loom binary (default build/loom)]
#
# Environment: OUT (runs/moe_vs_dense), STEPS (100), WARMUP (10), EVAL_INTERVAL (20), THREADS
# (train.threads, 1), PLOT (docs/moe_vs_dense.png), MOE_KEYS (extra keys for the MoE run only),
# RUNS ("dense moe": which to train; the table and plot need both).
# A run whose metrics.jsonl already has the last step is not rerun. Results: $OUT/summary.md.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
loom="${1:-build/loom}"
out="${OUT:-runs/moe_vs_dense}"
steps="${STEPS:-100}"
warmup="${WARMUP:-10}"
eval_interval="${EVAL_INTERVAL:-20}"
threads="${THREADS:-1}"
plot="${PLOT:-docs/moe_vs_dense.png}"

[ -x "$loom" ] || { echo "no loom binary at $loom (build it: cmake --build build --target loom)" >&2; exit 1; }
if [ ! -f data/byte/corpus_train.idx ] || [ ! -f data/byte/corpus_val.idx ]; then
  [ -d .cache/data/corpus ] || scripts/setup.sh
  "$loom" data prepare .cache/data/corpus --tokenizer byte --output data/byte/corpus
fi
mkdir -p "$out"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores" | tee "$out/machine.txt"
common=(train.steps="$steps" optim.warmup_steps="$warmup" train.eval_interval="$eval_interval"
        train.threads="$threads" checkpoint.interval=0 log.progress=false log.interval=10)
for run in ${RUNS:-dense moe}; do
  dir="$out/$run"
  if [ -f "$dir/metrics.jsonl" ] && grep -q "\"step\":$steps[,}]" "$dir/metrics.jsonl"; then
    echo "== $run: already done"
    continue
  fi
  rm -rf "$dir"
  config=configs/tiny.yaml extra=()
  if [ "$run" = moe ]; then config=configs/tiny-moe.yaml; extra=(${MOE_KEYS:-}); fi
  echo "== $run ($(date -u +%H:%M:%S) UTC, load average $(cut -d' ' -f1-3 /proc/loadavg))" | tee -a "$out/machine.txt"
  start=$(date +%s)
  "$loom" train "$config" run.dir="$dir" "${common[@]}" "${extra[@]}" > "$dir.log" 2>&1 ||
    { echo "$run failed, see $dir.log" >&2; exit 1; }
  echo "   $(( $(date +%s) - start )) s, load average after $(cut -d' ' -f1-3 /proc/loadavg); $(tail -n 2 "$dir.log" | head -n 1)" |
    tee -a "$out/machine.txt"
done

for run in dense moe; do [ -f "$out/$run/metrics.jsonl" ] || { echo "no $run run yet: no table or plot"; exit 0; }; done
bash bench/with_matplotlib.sh bench/val_curves.py "$plot" "$out/summary.md" --row moe_tokens_per_expert_max \
  "dense=$out/dense" "MoE=$out/moe"
