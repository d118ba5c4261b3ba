#!/usr/bin/env bash
# The GPU training benchmark, run by scripts/gpu_test.sh: the ~1B Llama config
# (configs/llama-1b.yaml, B 4 x T 2048) trained by loom in bf16 and in fp8_current over a few
# hundred steps (tokens/s, MFU, FP8's speedup and the two loss curves, from the same runs), GPT-2
# 124M (configs/gpt2-124m.yaml, B 16 x T 1024) by loom and by llm.c's train_gpt2.cu (with cuBLAS
# alone, and with cuDNN's attention where the bundle has that build), and both shapes by PyTorch
# with torch.compile. bf16 unless named, fp32 master weights, AdamW, one GPU. Each run prints one
# TRAIN line (bench/cuda/train_results.py) into OUT/bench.txt, which bench/cuda/gpu_table.py turns
# into tokens/s, MFU and the ratio to the fastest llm.c build; every run's whole output goes to
# OUT/train.log.
#   bench/cuda/train_bench.sh OUT BUNDLE [RUN ...]   BUNDLE: the unpacked .gpu-bundle (bin/loom,
#                                                    llmc/), or "" to use build-gpu/loom
# RUN, in the default order (that of importance):
#   llama        loom's ~1B for LLAMA_STEPS steps (default 300) in bf16, then in fp8_current, on a
#                byte-level corpus of the repository's docs (the config's schedule); tokens/s of
#                each, then bench/cuda/loss_curves.py compares the curves (10-step averages from
#                step 20, the issue's rule: within 5%) into OUT/fp8_curve.csv; then fp8_delayed's
#                tokens/s over LLAMA_DELAYED_STEPS steps (default 60), with the bf16 edge blocks and
#                with every block in FP8
#   gpt2         loom's GPT-2 124M, 30 steps on random tokens
#   gpt2-gelu-passes  the same with its GELU in passes of its own (precision.gelu_epilogue=false):
#                what the products' GELU epilogues buy
#   llama-offload  loom's ~1B in bf16 for OFFLOAD_STEPS steps (default 10) with the optimizer's moments
#                and update on the host (optim.cpu_offload=true), after the same run without it, then
#                at ZeRO-3 with its parameter and gradient shards on the host too
#                (parallel.offload_params=true), and with the device's copy of the shards for the
#                gathers (parallel.offload_params_device_copy=true): what each costs a step (each
#                run's committed device bytes in OUT/train.log)
#   curves       the llama run's bf16 and fp8_current runs and their curves alone
#   llmc         llm.c's GPT-2 124M, 50 steps on the same tokens (the bundle's prebuilt binaries:
#                LLMC_BUILD=1 builds it there first, about a minute)
#   profile      the ~1B bf16 step's GPU time per kernel under Nsight Compute (OUT/kernel_profile.log)
#   profile-gpt2 the same for GPT-2 124M's bf16 step (OUT/gpt2_kernel_profile.log)
#   torch-gpt2   PyTorch's GPT-2 124M, torch.compile (TORCH_MODES, default compile)
#   torch-llama  PyTorch's ~1B, torch.compile
#   profile-fp8  as profile, for fp8_current (OUT/fp8_kernel_profile.log)
#   profile-fp8-delayed  as profile, for fp8_delayed (OUT/fp8_delayed_kernel_profile.log)
#   timeline     GPT-2 bf16 for 12 steps and the ~1B bf16 for 8 under libloom_step_timeline.so (a CUPTI
#                injection library: LOOM_STEP_TIMELINE_LIB, default next to loom), then where each step
#                left the GPU idle and what the host was doing, and its GPU work by kind and kernel
#                (OUT/gpt2_timeline.log, OUT/llama_timeline.log); llm.c's cuDNN build the same way for
#                12 GPT-2 steps (after loom's GPT-2), appended to OUT/gpt2_timeline.log; steps 3-4 of
#                each loom run profiled with the device waited for per range (OUT/gpt2_phases.log and
#                _profile.json, llama_*)
# PROFILE_BYTES=1: the profiles also take each kernel's DRAM bytes and achieved occupancy (TB/s and
# occ % columns), possibly rerunning the process once per counter pass.
# Every run has its own timeout, cut to what is left before LOOM_GPU_DEADLINE (seconds since the
# epoch; default: now + TRAIN_BENCH_BUDGET_S, default 420); a run that no longer fits is skipped,
# saying so. A traced or profiled run (timeline, profile), whose output is written only as it ends,
# runs only where its whole time is left. TRAIN_BENCH_TORCH_ARGS adds arguments to the PyTorch runs (a smoke test without a
# GPU: "--device cpu --tiny --modes eager").
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="$1" bundle="${2:-}"
shift 2 || shift $#
runs=("$@")
[ "${#runs[@]}" -gt 0 ] || runs=(llama gpt2 llmc profile torch-gpt2 torch-llama profile-gpt2 profile-fp8)
log="$out/train.log" results="$out/bench.txt"
work=/tmp/loom-train-bench
deadline="${LOOM_GPU_DEADLINE:-$(($(date +%s) + ${TRAIN_BENCH_BUDGET_S:-420}))}"
gpt2=(gpt2-124m 16 1024) llama=(llama-1b 4 2048)
# GPT-2's embedding and head padded from 50257 to 50304 rows (a multiple of 128) in loom and
# PyTorch, as llm.c pads its matmuls (its Vp): the same products in all three, and none of them on
# rows of an odd length, which cuBLAS serves with slower kernels. The tokens stay below 50257.
gpt2_vocab=50304
mkdir -p "$out" "$work"
touch "$log" "$results"
nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | sed 's/^/GPU|/' >>"$results"

# run NAME SECONDS COMMAND...: the command under min(SECONDS, what is left before the deadline);
# its TRAIN lines to the results, its "# " lines and, when it fails, its last lines to the console.
run() {
  local name="$1" want="$2" left=$((deadline - $(date +%s))) part="$work/part.log"
  shift 2
  if [ "$left" -lt 20 ]; then echo "$name: skipped, no time left" | tee -a "$log"; return 0; fi
  local limit=$((want < left ? want : left))
  echo "== $name (at most $limit s)" | tee -a "$log"
  # The SM clock, power and what held the clock down, sampled through the run (gpu_clocks.py).
  local sampler=""
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=clocks.sm,power.draw,clocks_event_reasons.active --format=csv,noheader,nounits \
      -lms 250 >"$work/clocks.csv" 2>/dev/null &
    sampler=$!
  fi
  timeout --kill-after=10 "$limit" "$@" >"$part" 2>&1
  local rc=$?
  if [ -n "$sampler" ]; then
    kill "$sampler" 2>/dev/null
    wait "$sampler" 2>/dev/null
    python3 "$here/gpu_clocks.py" "$work/clocks.csv" >>"$part"
  fi
  cat "$part" >>"$log"
  grep '^TRAIN|' "$part" >>"$results"
  grep -E '^(TRAIN\||# |llm.c|model:|trained steps|loom: attention)' "$part"
  [ "$rc" = 0 ] || { echo "$name: exit $rc$([ "$rc" = 124 ] && echo ' (timed out)'); its last lines:"; tail -5 "$part"; }
}
# run_whole NAME SECONDS COMMAND...: as run, but skipped unless all SECONDS are left. For a traced or
# profiled run, which writes its output only when it ends: cut short, it would bring back nothing.
run_whole() {
  local left=$((deadline - $(date +%s)))
  if [ "$left" -lt "$2" ]; then echo "$1: skipped, it needs $2 s and $left are left" | tee -a "$log"; return 0; fi
  run "$@"
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

# `loom train`'s arguments for MODEL at B x T for STEPS steps in RECIPE on the dataset PREFIX, into DIR.
loom_args() {  # MODEL B T STEPS RECIPE PREFIX DIR
  echo "$repo/configs/$1.yaml runtime.device=cuda precision.recipe=$5 data.tokenizer=byte data.train_prefix=$6" \
    "data.val_prefix= train.eval_interval=0 train.steps=$4 train.global_batch=$2 train.micro_batch=$2 data.seq_len=$3" \
    "checkpoint.interval=0 checkpoint.at_end=false run.dir=$7 log.progress=false log.interval=10"
}
# loom_run NAME MODEL B T STEPS SECONDS RECIPE PREFIX DIR [OVERRIDE ...]: a loom run, then its TRAIN
# line from its metrics.jsonl (also after a timeout: the steps it finished).
loom_run() {
  local name="$1" model="$2" B="$3" T="$4" steps="$5" want="$6" recipe="$7" prefix="$8" dir="$9"
  shift 9
  [ -z "$loom_status" ] || { echo "$name: skipped ($loom_status)"; return 0; }
  rm -rf "$dir"
  run "$name $model" "$want" "$loom" train $(loom_args "$model" "$B" "$T" "$steps" "$recipe" "$prefix" "$dir") "$@"
  rm -rf "$dir/checkpoints"  # a run stopped by its timeout saves one as it stops (~13 GB for the ~1B)
  [ -f "$dir/metrics.jsonl" ] &&
    python3 "$here/train_results.py" loom "$dir/metrics.jsonl" --model "$model" --batch "$B" --seq "$T" --impl "$name" |
    tee -a "$results"
}

# A loom run's name in the TRAIN lines: "loom" for bf16 (the table's reference), else "loom RECIPE".
impl_name() { [ "$1" = bf16 ] && echo loom || echo "loom $1"; }

# The byte-level corpus of the repository's docs the ~1B runs train on (a real curve to compare).
docs_corpus() {
  [ -f "$work/docs/c_train.idx" ] && return 0
  mkdir -p "$work/docs/corpus"
  for f in "$repo"/docs/*.md; do cp "$f" "$work/docs/corpus/$(basename "$f" .md).txt"; done
  "$loom" data prepare "$work/docs/corpus" --tokenizer byte --output "$work/docs/c" >>"$log" 2>&1
}
# GPT-2's random tokens below 50257, as loom's indexed dataset and as llm.c's shards (the same ids).
random_tokens() {
  [ -f "$work/random/train.idx" ] && return 0
  mkdir -p "$work/random"
  python3 "$here/token_shards.py" loom --prefix "$work/random/train" --tokens $((8 * gpt2[1] * gpt2[2] + 1)) \
    --vocab 50257 >>"$log"
}

# bf16 and fp8_current over LLAMA_STEPS steps and their loss curves (LLAMA_SEED: the runs' seed,
# default the config's: another seed is another sample of the curves' difference).
llama_curves() {
  [ -z "$loom_status" ] || { echo "llama: skipped ($loom_status)"; return 1; }
  docs_corpus || { echo "llama: preparing the docs corpus failed"; tail -3 "$log"; return 1; }
  local steps="${LLAMA_STEPS:-300}" recipe seed=() csv="$out/fp8_curve.csv"
  [ -n "${LLAMA_SEED:-}" ] && seed=("train.seed=$LLAMA_SEED") && csv="$out/fp8_curve_seed$LLAMA_SEED.csv"
  for recipe in bf16 fp8_current; do
    loom_run "$(impl_name "$recipe")" "${llama[@]}" "$steps" "${LLAMA_RUN_S:-110}" "$recipe" "$work/docs/c_train" \
      "$work/llama-$recipe" "${seed[@]}"
  done
  [ -f "$work/llama-bf16/metrics.jsonl" ] && [ -f "$work/llama-fp8_current/metrics.jsonl" ] &&
    python3 "$here/loss_curves.py" "$work/llama-bf16/metrics.jsonl" "$work/llama-fp8_current/metrics.jsonl" \
      --names "bf16,fp8_current${LLAMA_SEED:+ seed $LLAMA_SEED}" --csv "$csv" | tee -a "$results"
  return 0
}

llama_runs() {
  llama_curves || return 0
  # fp8_delayed's tokens/s from a shorter run (its casts take their amaxes as they read them: the
  # planner's fastest FP8 recipe); the curves above are fp8_current's.
  loom_run "$(impl_name fp8_delayed)" "${llama[@]}" "${LLAMA_DELAYED_STEPS:-60}" 60 fp8_delayed "$work/docs/c_train" \
    "$work/llama-fp8_delayed"
  # And with every block in FP8 (the edge blocks too, as torchtitan's float8 training keeps only
  # the head in bf16): the planner's 1.26x bf16 where the default's bf16 edge blocks give 1.19x.
  loom_run "loom fp8_delayed all" "${llama[@]}" "${LLAMA_DELAYED_STEPS:-60}" 60 fp8_delayed "$work/docs/c_train" \
    "$work/llama-fp8_delayed-all" precision.fp8_edge_layers_bf16=false
}

# The ~1B bf16 step with the optimizer on the host (optim.cpu_offload) beside the same run without,
# and with ZeRO-3's shards on the host too (parallel.offload_params), then with the device's copy of
# the shards for the gathers (parallel.offload_params_device_copy).
offload_runs() {
  [ -z "$loom_status" ] || { echo "llama-offload: skipped ($loom_status)"; return 0; }
  docs_corpus || { echo "llama-offload: preparing the docs corpus failed"; tail -3 "$log"; return 0; }
  local steps="${OFFLOAD_STEPS:-10}"
  loom_run loom "${llama[@]}" "$steps" 60 bf16 "$work/docs/c_train" "$work/llama-offload-peer"
  loom_run "loom offload" "${llama[@]}" "$steps" 90 bf16 "$work/docs/c_train" "$work/llama-offload" \
    optim.cpu_offload=true
  loom_run "loom offload params" "${llama[@]}" "$steps" 120 bf16 "$work/docs/c_train" "$work/llama-offload-params" \
    optim.cpu_offload=true parallel.zero=3 parallel.offload_params=true
  loom_run "loom offload params device copy" "${llama[@]}" "$steps" 120 bf16 "$work/docs/c_train" \
    "$work/llama-offload-params-copy" optim.cpu_offload=true parallel.zero=3 parallel.offload_params=true \
    parallel.offload_params_device_copy=true
  grep -h "committed:" "$log" | tail -4 | cut -c1-300
}

llmc_runs() {
  if [ -z "$bundle" ] || [ ! -f "$bundle/llmc/src/train_gpt2.cu" ]; then
    echo "llm.c: not in the bundle (scripts/gpu_bundle.sh copies its sources from a fetched mirror)" | tee -a "$log"
    return 0
  fi
  echo "$(paste -sd';' "$bundle/llmc/COMMIT" 2>/dev/null || echo "llm.c: commit unknown")" | tee -a "$log"
  # The cuDNN build (llm.c's fastest) first, then cuBLAS alone; built on the build machine with
  # the same flags for sm_90 (LLMC_BUILD=1: build the cuBLAS one here instead).
  local mode=prebuilt
  [ "${LLMC_BUILD:-0}" = 1 ] && mode=all
  run "llm.c ${gpt2[0]}" 120 bash "$here/llmc_peer.sh" "$mode" "$bundle/llmc/src" "$work/llmc" "${gpt2[1]}" "${gpt2[2]}" 50 \
    "$bundle/llmc/train_gpt2cu" "$bundle/llmc/train_gpt2cu_cudnn"
}

torch_run() {  # MODEL B T
  local vocab=()
  [ "$1" = "${gpt2[0]}" ] && vocab=(--vocab-size "$gpt2_vocab")
  run "torch $1" 150 python3 "$here/torch_gpt2_peer.py" --model "$1" --batch "$2" --seq "$3" "${vocab[@]}" \
    --modes "${TORCH_MODES:-compile}" ${TRAIN_BENCH_TORCH_ARGS:-}
}

# Where a step spends its GPU time (bench/cuda/kernel_profile.py): every kernel of 2 steps timed by
# Nsight Compute (one metric: no replay), summed by name, against the step time of the timed run
# above (the rest is the GPU waiting for the host). MODEL B T: the ~1B config on the docs corpus,
# or GPT-2 on the random tokens.
profile_run() {  # RECIPE OUTPUT_NAME MODEL B T
  local recipe="$1" name="$2" model="$3" B="$4" T="$5" ncu prefix
  ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || true)
  [ -n "$ncu" ] || { echo "profile $recipe: no Nsight Compute here"; return 0; }
  [ -z "$loom_status" ] || { echo "profile $recipe: skipped ($loom_status)"; return 0; }
  if [ "$model" = "${gpt2[0]}" ]; then
    random_tokens || return 0
    prefix="$work/random/train"
  else
    docs_corpus || return 0
    prefix="$work/docs/c_train"
  fi
  local dir="$work/profile-$recipe-$model" csv="$work/ncu-$recipe-$model.csv" vocab=()
  [ "$model" = "${gpt2[0]}" ] && vocab=("model.vocab_size=$gpt2_vocab")
  # PROFILE_BYTES=1: also each launch's DRAM bytes and achieved occupancy (kernel_profile.py's TB/s
  # and occ % columns); the counters may take more than one pass, each a rerun of the whole
  # process (application replay: no device memory saved and restored around every launch), so
  # the run directory is replaced on each.
  local metrics=gpu__time_duration.sum replay=() limit=90
  if [ "${PROFILE_BYTES:-0}" = 1 ]; then
    metrics+=",dram__bytes_read.sum,dram__bytes_write.sum,sm__warps_active.avg.pct_of_peak_sustained_active"
    replay=(--replay-mode application)
    limit=180
  fi
  rm -rf "$dir" "$csv"
  run_whole "ncu loom $recipe $model" "$limit" "$ncu" --metrics "$metrics" "${replay[@]}" --csv --clock-control none \
    --log-file "$csv" "$loom" train $(loom_args "$model" "$B" "$T" 2 "$recipe" "$prefix" "$dir") "${vocab[@]}" \
    run.overwrite=true
  local step_ms
  step_ms=$(grep "^TRAIN|$(impl_name "$recipe")|$model|" "$results" | tail -1 | cut -d'|' -f7)
  [ -s "$csv" ] && python3 "$here/kernel_profile.py" "$csv" --steps 2 --top 40 ${step_ms:+--step-ms "$step_ms"} | tee "$out/$name"
}

# The GPU's timeline of a few steps (bench/cuda/step_timeline.cpp, loaded by the CUDA driver through
# CUDA_INJECTION64_PATH into an unmodified loom), cut into steps by bench/cuda/step_timeline.py:
# the GPU's idle gaps within a step and what the host was doing (launching, or waiting in a sync).
# The library: LOOM_STEP_TIMELINE_LIB, else next to loom (the bundle's bin/), else in its build's bench/.
timeline_lib() {
  [ -n "${LOOM_STEP_TIMELINE_LIB:-}" ] && { echo "$LOOM_STEP_TIMELINE_LIB"; return; }
  local dir
  dir="$(cd "$(dirname "$loom")" && pwd)"
  [ -f "$dir/bench/libloom_step_timeline.so" ] && echo "$dir/bench/libloom_step_timeline.so" ||
    echo "$dir/libloom_step_timeline.so"
}
timeline_run() {  # NAME MODEL B T STEPS SECONDS PREFIX [OVERRIDE ...]
  local name="$1" model="$2" B="$3" T="$4" steps="$5" want="$6" prefix="$7" lib
  shift 7
  lib=$(timeline_lib)
  if [ ! -f "$lib" ]; then
    echo "timeline $name: no step timeline library ($lib; scripts/gpu_bundle.sh builds it), skipped" | tee -a "$log"
    return 0
  fi
  local missing
  missing=$(ldd "$lib" | grep "not found" | paste -sd' ')
  [ -z "$missing" ] || { echo "timeline $name: $lib misses libraries ($missing), skipped" | tee -a "$log"; return 0; }
  local dir="$work/timeline-$name" csv="$work/timeline-$name.csv"
  rm -rf "$dir" "$csv"
  # Steps 3-4 are also profiled (profile.*: the device waited for at both ends of every range), far
  # from the last steps the timeline reads: each block's forward and backward as the GPU ran them,
  # the head, the optimizer. Their trace comes back as OUT/NAME_profile.json.
  run_whole "timeline loom $model" "$want" env CUDA_INJECTION64_PATH="$lib" LOOM_TIMELINE_OUT="$csv" \
    "$loom" train $(loom_args "$model" "$B" "$T" "$steps" bf16 "$prefix" "$dir") profile.first_step=3 \
    profile.last_step=4 "$@"
  grep -h "^loom step timeline" "$work/part.log"  # the library's own lines: records written, or why not
  grep -A8 "^profile: rank 0" "$work/part.log" | grep -E "^(profile:|  )" | tee "$out/${name}_phases.log"
  [ -f "$dir/profile/rank-0.json" ] && cp "$dir/profile/rank-0.json" "$out/${name}_profile.json"
  if [ -s "$csv" ]; then
    python3 "$here/step_timeline.py" "$csv" | tee "$out/${name}_timeline.log"
  else
    echo "timeline $name: no timeline written (the run's output is in $log)"
  fi
}
# llm.c's cuDNN build under the same library, 12 steps of GPT-2 124M: its step's kernels as it runs
# them, beside loom's in the same log (OUT/gpt2_timeline.log), no TRAIN line (a traced run).
timeline_llmc() {
  local lib csv="$work/timeline-llmc.csv"
  lib=$(timeline_lib)
  [ -f "$lib" ] || return 0  # timeline_run said why
  if [ -z "$bundle" ] || [ ! -x "$bundle/llmc/train_gpt2cu_cudnn" ]; then
    echo "timeline llm.c: no cuDNN build in the bundle, skipped" | tee -a "$log"
    return 0
  fi
  run_whole "timeline llm.c: shards" 45 bash "$here/llmc_peer.sh" prepare "$bundle/llmc/src" "$work/llmc" "${gpt2[1]}" \
    "${gpt2[2]}" "$bundle/llmc/train_gpt2cu" "$bundle/llmc/train_gpt2cu_cudnn"
  rm -f "$csv"
  run_whole "timeline llm.c ${gpt2[0]}" 60 env CUDA_INJECTION64_PATH="$lib" LOOM_TIMELINE_OUT="$csv" LLMC_RESULTS=0 \
    bash "$here/llmc_peer.sh" run "$work/llmc" "${gpt2[1]}" "${gpt2[2]}" 12 train_gpt2cu_cudnn
  if [ -s "$csv" ]; then
    { echo "== llm.c (cuDNN build)"; python3 "$here/step_timeline.py" "$csv"; } | tee -a "$out/gpt2_timeline.log"
  else
    echo "timeline llm.c: no timeline written (the run's output is in $log)"
  fi
}
# GPT-2 and llm.c's first (the unmet GPT-2 target's gap, kernel by kernel), then the ~1B step.
timeline_runs() {
  [ -z "$loom_status" ] || { echo "timeline: skipped ($loom_status)"; return 0; }
  if random_tokens; then timeline_run gpt2 "${gpt2[@]}" 12 60 "$work/random/train" "model.vocab_size=$gpt2_vocab"
  else echo "timeline gpt2: making the random tokens failed"; tail -3 "$log"; fi
  timeline_llmc
  if docs_corpus; then timeline_run llama "${llama[@]}" 8 90 "$work/docs/c_train"
  else echo "timeline llama: preparing the docs corpus failed"; tail -3 "$log"; fi
}

for r in "${runs[@]}"; do
  case "$r" in
    llama) llama_runs ;;
    curves) llama_curves ;;
    llama-offload) offload_runs ;;
    gpt2) random_tokens && loom_run loom "${gpt2[@]}" 30 60 bf16 "$work/random/train" "$work/gpt2" \
      model.vocab_size=$gpt2_vocab ;;
    gpt2-gelu-passes) random_tokens && loom_run "loom gelu passes" "${gpt2[@]}" 30 60 bf16 "$work/random/train" \
      "$work/gpt2-gelu-passes" model.vocab_size=$gpt2_vocab precision.gelu_epilogue=false ;;
    llmc) llmc_runs ;;
    profile) profile_run bf16 kernel_profile.log "${llama[@]}" ;;
    profile-gpt2) profile_run bf16 gpt2_kernel_profile.log "${gpt2[@]}" ;;
    profile-fp8) profile_run fp8_current fp8_kernel_profile.log "${llama[@]}" ;;
    profile-fp8-delayed) profile_run fp8_delayed fp8_delayed_kernel_profile.log "${llama[@]}" ;;
    torch-gpt2) torch_run "${gpt2[@]}" ;;
    torch-llama) torch_run "${llama[@]}" ;;
    timeline) timeline_runs ;;
    *) echo "train_bench.sh: unknown run '$r' (llama, llama-offload, curves, gpt2, gpt2-gelu-passes, llmc, profile," \
         "torch-gpt2, torch-llama, profile-gpt2, profile-fp8, profile-fp8-delayed, timeline)" >&2; exit 2 ;;
  esac
done
exit 0
