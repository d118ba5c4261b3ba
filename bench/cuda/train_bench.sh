#!/usr/bin/env bash
# The GPU training benchmark, a stage of scripts/gpu_test.sh: GPT-2 124M (configs/gpt2-124m.yaml,
# B 16 x T 1024) trained by llm.c's train_gpt2.cu (with cuBLAS alone, and with cuDNN's attention
# where the bundle has that build), by loom and by PyTorch (eager and torch.compile), and the ~1B
# Llama config (configs/llama-1b.yaml, B 4 x T 2048) by loom (bf16, then fp8_current) and PyTorch,
# bf16 unless named, with fp32 master weights and AdamW, one GPU, random tokens. Each run prints one TRAIN line
# (bench/cuda/train_results.py) into OUT/bench.txt, which bench/cuda/gpu_table.py turns into
# tokens/s, MFU and the ratio to the fastest llm.c build; every run's whole output goes to
# OUT/train.log. Last, when Nsight Compute is there, loom's ~1B bf16 step's GPU time per kernel
# (OUT/kernel_profile.log, bench/cuda/kernel_profile.py).
#   bench/cuda/train_bench.sh OUT [BUNDLE]   BUNDLE: the unpacked .gpu-bundle (bin/loom, llmc/)
# The stage keeps to TRAIN_BENCH_BUDGET_S seconds (default 360), each run to its own timeout
# within what is left (then SIGTERM, SIGKILL 20 s later); runs that no longer fit are skipped,
# saying so. TRAIN_BENCH_TORCH_ARGS adds arguments to the PyTorch runs (a smoke test without a
# GPU: "--device cpu --tiny --modes eager").
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="$1" bundle="${2:-}"
log="$out/train.log" results="$out/bench.txt"
work=/tmp/loom-train-bench
deadline=$((SECONDS + ${TRAIN_BENCH_BUDGET_S:-360}))
gpt2=(gpt2-124m 16 1024) llama=(llama-1b 4 2048)
mkdir -p "$out" "$work"
: >"$log"
nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | sed 's/^/GPU|/' >>"$results"

# run NAME SECONDS COMMAND...: the command under min(SECONDS, what the budget has left); its TRAIN
# lines to the results, its "# " lines and, when it fails, its last lines to the console.
run() {
  local name="$1" want="$2" left=$((deadline - SECONDS)) part="$work/part.log"
  shift 2
  if [ "$left" -lt 20 ]; then echo "$name: skipped, the stage's time is spent" | tee -a "$log"; return 0; fi
  local limit=$((want < left ? want : left))
  echo "== $name (at most $limit s)" | tee -a "$log"
  timeout --kill-after=20 "$limit" "$@" >"$part" 2>&1
  local rc=$?
  cat "$part" >>"$log"
  grep '^TRAIN|' "$part" >>"$results"
  grep -E '^(TRAIN\||# |llm.c|model:|trained steps|loom: attention)' "$part"
  [ "$rc" = 0 ] || { echo "$name: exit $rc$([ "$rc" = 124 ] && echo ' (timed out)'); its last lines:"; tail -5 "$part"; }
}

# loom's own run of a shape (when the bundle's loom trains on the GPU), on the same random tokens
# written as loom's indexed dataset; tokens/s from its metrics.jsonl, also after a timeout (the
# steps it finished).
# loom_args MODEL B T STEPS RECIPE DIR: `loom train`'s arguments for a run of the shape on DIR's tokens.
loom_args() {
  echo "$repo/configs/$1.yaml runtime.device=cuda precision.recipe=$5 data.tokenizer=byte data.train_prefix=$6/data/train" \
    "data.val_prefix= train.eval_interval=0 train.steps=$4 train.global_batch=$2 train.micro_batch=$2 data.seq_len=$3" \
    "run.dir=$6/run log.progress=false log.interval=5"
}
loom_run() {
  local model="$1" B="$2" T="$3" steps="$4" want="$5" recipe="${6:-bf16}" dir="$work/loom-$1"
  local impl="loom${6:+ $6}"
  rm -rf "$dir" && mkdir -p "$dir"
  python3 "$here/token_shards.py" loom --prefix "$dir/data/train" --tokens $((8 * B * T + 1)) --vocab 50257 >>"$log"
  run "$impl $model" "$want" "$loom" train $(loom_args "$model" "$B" "$T" "$steps" "$recipe" "$dir")
  [ -f "$dir/run/metrics.jsonl" ] &&
    python3 "$here/train_results.py" loom "$dir/run/metrics.jsonl" --model "$model" --batch "$B" --seq "$T" --impl "$impl" |
    tee -a "$results"
}

loom="${bundle:+$bundle/bin/loom}"
[ -n "$loom" ] && [ -x "$loom" ] || loom="$repo/build-gpu/loom"
if [ ! -x "$loom" ]; then
  loom_status="loom on cuda: no loom binary in the bundle"
elif "$loom" train "$repo/configs/gpt2-124m.yaml" runtime.device=cuda train.steps=0 2>&1 | grep -q "unknown key 'runtime.device'"; then
  loom_status="loom on cuda: not in this build"
else
  loom_status=""
fi
[ -z "$loom_status" ] || echo "$loom_status" | tee -a "$log"

# In order of importance, so that a short budget keeps what matters most: loom's ~1B config in
# bf16 (the MFU target) and in FP8 (per-tensor current scaling, as torchtitan's float8 tensorwise;
# its tokens/s over the bf16 run's is the table's last column), then GPT-2 124M by loom and
# llm.c, then the PyTorch peers.
[ -n "$loom_status" ] || loom_run "${llama[@]}" 20 120
[ -n "$loom_status" ] || loom_run "${llama[@]}" 20 100 fp8_current
[ -n "$loom_status" ] || loom_run "${gpt2[@]}" 30 100
if [ -n "$bundle" ] && [ -f "$bundle/llmc/src/train_gpt2.cu" ]; then
  echo "$(paste -sd';' "$bundle/llmc/COMMIT" 2>/dev/null || echo "llm.c: commit unknown")" | tee -a "$log"
  # Built here with cuBLAS only; then, when the bundle has it, the cuDNN build made with the bundle.
  run "llm.c ${gpt2[0]}" 150 bash "$here/llmc_peer.sh" all "$bundle/llmc/src" "$work/llmc" "${gpt2[1]}" "${gpt2[2]}" 50 \
    "$bundle/llmc/train_gpt2cu" "$bundle/llmc/train_gpt2cu_cudnn"
else
  echo "llm.c: not in the bundle (scripts/gpu_bundle.sh copies its sources from a fetched mirror)" | tee -a "$log"
fi
run "torch ${gpt2[0]}" 150 python3 "$here/torch_gpt2_peer.py" --model "${gpt2[0]}" --batch "${gpt2[1]}" --seq "${gpt2[2]}" \
  ${TRAIN_BENCH_TORCH_ARGS:-}
run "torch ${llama[0]}" 180 python3 "$here/torch_gpt2_peer.py" --model "${llama[0]}" --batch "${llama[1]}" --seq "${llama[2]}" \
  ${TRAIN_BENCH_TORCH_ARGS:-}
# Where loom's ~1B bf16 step spends its GPU time (bench/cuda/kernel_profile.py): every kernel of
# 3 steps timed by Nsight Compute (one metric: no replay), summed by name, against the step time
# of the bf16 run above (the rest is the GPU waiting for the host).
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || true)
if [ -z "$loom_status" ] && [ -n "$ncu" ] && [ -d "$work/loom-${llama[0]}/data" ]; then
  dir="$work/loom-${llama[0]}" profile="$work/ncu.csv"
  rm -rf "$dir/run" "$profile"
  run "ncu loom ${llama[0]}" 120 "$ncu" --metrics gpu__time_duration.sum --csv --clock-control none --log-file "$profile" \
    "$loom" train $(loom_args "${llama[0]}" "${llama[1]}" "${llama[2]}" 3 bf16 "$dir")
  step_ms=$(grep "^TRAIN|loom|${llama[0]}|" "$results" | tail -1 | cut -d'|' -f7)
  [ -s "$profile" ] && python3 "$here/kernel_profile.py" "$profile" --steps 3 ${step_ms:+--step-ms "$step_ms"} |
    tee "$out/kernel_profile.log"
fi
exit 0
