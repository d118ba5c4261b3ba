#!/usr/bin/env bash
# The tiny Nemotron 3 Super mix (configs/nemotron3-super-tiny.yaml: Mamba-2 / latent MoE /
# attention, 2 MTP depths) against a dense Llama-style model with the same parameters active per
# token (configs/nemotron3-super-tiny-dense.yaml), trained one after the other on the same data,
# steps, schedule and seed; tabulates the validation losses and plots both curves
# (docs/hybrid_vs_dense.png, bench/val_curves.py).
#
#   bash bench/hybrid_vs_dense.sh [loom binary (default build/loom)]
#
# Environment: OUT (runs/hybrid_vs_dense), STEPS (800), WARMUP (20), EVAL_INTERVAL (50),
# EVAL_BATCHES (8), THREADS (train.threads, 1), PLOT (docs/hybrid_vs_dense.png).
# A run whose metrics.jsonl already has the last step is not rerun. Results: $OUT/summary.md.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
loom="${1:-build/loom}"
out="${OUT:-runs/hybrid_vs_dense}"
steps="${STEPS:-800}"
[ -x "$loom" ] || { echo "no loom binary at $loom (build it: cmake --build build --target loom)" >&2; exit 1; }
[ -f data/byte/corpus_train.idx ] && [ -f data/byte/corpus_val.idx ] ||
  "$loom" data prepare .cache/data/corpus --tokenizer byte --output data/byte/corpus

mkdir -p "$out"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores" | tee "$out/machine.txt"
common=(train.steps="$steps" optim.warmup_steps="${WARMUP:-20}" train.eval_interval="${EVAL_INTERVAL:-50}"
        train.eval_batches="${EVAL_BATCHES:-8}" train.threads="${THREADS:-1}" checkpoint.interval=0
        log.progress=false log.interval=10)
for run in hybrid dense; do
  dir="$out/$run" config=configs/nemotron3-super-tiny.yaml
  [ "$run" = dense ] && config=configs/nemotron3-super-tiny-dense.yaml
  if [ -f "$dir/metrics.jsonl" ] && grep -q "\"step\":$steps[,}]" "$dir/metrics.jsonl"; then
    echo "== $run: already done"; continue
  fi
  rm -rf "$dir"
  echo "== $run ($(date -u +%H:%M:%S) UTC, load average $(cut -d' ' -f1-3 /proc/loadavg))" | tee -a "$out/machine.txt"
  start=$(date +%s)
  "$loom" train "$config" run.dir="$dir" "${common[@]}" > "$dir.log" 2>&1 ||
    { echo "$run failed, see $dir.log" >&2; exit 1; }
  echo "   $(( $(date +%s) - start )) s, load average after $(cut -d' ' -f1-3 /proc/loadavg); $(grep '^trained' "$dir.log")" |
    tee -a "$out/machine.txt"
done
bash bench/with_matplotlib.sh bench/val_curves.py "${PLOT:-docs/hybrid_vs_dense.png}" "$out/summary.md" \
  "hybrid (nemotron3-super-tiny)=$out/hybrid" "dense (nemotron3-super-tiny-dense)=$out/dense"
