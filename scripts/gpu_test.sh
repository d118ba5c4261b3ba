#!/usr/bin/env bash
# One call on a machine with an NVIDIA GPU (the device tool: timeout_s 600, carry .gpu-bundle):
# loom's GPU tests and the GPU benchmarks beside their peers, stage by stage in order of
# importance, all within one time budget, and a short table last. A lent machine gives a session
# about 15 minutes of device time, its start included, so everything fits one call.
#   gpu_test.sh [STAGE ...]     default: every stage below, in this order
# Stages:
#   kernels   test_cuda: every CUDA kernel against the CPU path, the cuBLASLt products, attention,
#             the model and the parallel layouts on the GPU against one CPU rank
#   llama     the ~1B config trained 300 steps in bf16, then in fp8_current: tokens/s, MFU, FP8's
#             speedup and the two loss curves; fp8_delayed's speedup over 60 steps (also with every block FP8)
#             (bench/cuda/train_bench.sh llama)
#   curves    (not in the default) the llama stage's bf16 and fp8_current curves alone; LLAMA_SEED
#             another seed, another sample of their difference
#   gpt2      GPT-2 124M by loom and by llm.c (the bundle's prebuilt binaries), then, where time is left,
#             loom with its GELU in passes of its own (precision.gelu_epilogue=false)
#   profile   the ~1B fp8_current step's, GPT-2's and the ~1B bf16 step's GPU time per kernel
#             (Nsight Compute)
#   bytes     (not in the default) the ~1B fp8_delayed step's and GPT-2's kernels with their DRAM
#             TB/s and achieved occupancy (Nsight Compute; each counter pass reruns the process)
#   timeline  (not in the default) the ~1B bf16 and GPT-2 steps' GPU timelines (CUPTI): where the GPU
#             sat idle within a step and what the host was doing then, the work by kind and kernel;
#             llm.c's GPT-2 step the same way (bench/cuda/train_bench.sh timeline)
#   offload   (not in the default) the ~1B bf16 step with the optimizer on the host
#             (optim.cpu_offload=true) beside the same run without it, and at ZeRO-3 with its
#             shards on the host too (parallel.offload_params=true), then with the device's copy
#             of them for the gathers (parallel.offload_params_device_copy=true), 10 steps each
#             (bench/cuda/train_bench.sh llama-offload)
#   nccl      test_nccl; the trainer over NCCL (one rank) and as 2 ranks sharing the GPU
#   torch     PyTorch with torch.compile on both shapes
#   more      the hybrid step, serving on the GPU beside the CPU, compute-sanitizer, the kernel
#             benchmarks beside PyTorch (Mamba-2's scan among them), decoding and prompt rows'
#             attention over a paged cache beside PyTorch's over contiguous tensors
#   spec      (not in the default) speculative decoding on the GPU: bench/speculative_bench.sh's
#             74M-parameter model with 2 MTP depths trained here, then the engine with 0, 1 and 2
#             drafts a step (SPEC lines: loom_bench_serve's JSON, drafts kept, tokens a step)
# The budget is LOOM_GPU_BUDGET_S seconds from the start (default 540); each step has its own
# timeout, cut to what is left, and a step that no longer fits is skipped, saying so. Binaries
# come from .gpu-bundle/ (scripts/gpu_bundle.sh, made on a build machine) when it is there, else
# they are built here (which needs the build's Debian packages). Logs and results go to $OUT (the
# device tool's folder that comes back; at most 8 files) or /tmp/loom-gpu-out.
set -uo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
out="${OUT:-/tmp/loom-gpu-out}"
mkdir -p "$out"
export LOOM_GPU_DEADLINE=$(($(date +%s) + ${LOOM_GPU_BUDGET_S:-540}))
stages=("$@")
[ "${#stages[@]}" -gt 0 ] || stages=(kernels llama gpt2 profile nccl torch more)
for s in "${stages[@]}"; do
  case "$s" in kernels | llama | curves | gpt2 | profile | bytes | timeline | offload | nccl | torch | more | spec) ;;
    *) echo "gpu_test.sh: unknown stage '$s' (kernels, llama, curves, gpt2, profile, bytes, timeline, offload, nccl," \
         "torch, more, spec)" >&2
      exit 2 ;;
  esac
done
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader || true
if [ -f .gpu-bundle/payload.tar.xz ]; then
  work=/tmp/loom-gpu
  rm -rf "$work" && mkdir -p "$work" && tar -C "$work" -xJf .gpu-bundle/payload.tar.xz
  bin="$work/bin" tests="$work/bin"
  libs="$work/lib"
else
  work=""
  cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DLOOM_CUDA=ON >/dev/null &&
    cmake --build build-gpu -j"$(nproc)" --target test_cuda test_nccl loom_bench_gemm_cuda loom_bench_flash_attention_cuda \
      loom_bench_linear_precision_cuda loom_bench_paged_attention_cuda loom_bench_cast_cuda \
      loom_bench_grouped_gemm_cuda loom_bench_ssd_scan_cuda loom_bench_serve loom \
      >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
  # The timeline's CUPTI injection library, where the toolkit has CUPTI (the timeline stage says so otherwise).
  cmake --build build-gpu -j"$(nproc)" --target loom_step_timeline >>"$out/build.log" 2>&1 || true
  bin="$repo/build-gpu/bench" tests="$repo/build-gpu" libs=""
fi
loom="$tests/loom"  # the trainer (runtime.device=cuda)
# cuBLAS, cuBLASLt, NCCL and cuDNN (loaded at run time for attention; its runtime-compiled engines
# load NVRTC): the toolkit's, else the ones PyTorch's nvidia-* packages carry.
extra=$(python3 - <<'PY' 2>/dev/null
import glob, os
try:
    import nvidia
    roots = list(nvidia.__path__)
except Exception:
    roots = []
found = set()
for root in roots:
    for pattern in ("libcublas.so.*", "libcublasLt.so.*", "libnccl.so.*", "libcudart.so.*", "libcudnn.so.*",
                    "libnvrtc.so.*"):
        for path in glob.glob(os.path.join(root, "**", pattern), recursive=True):
            found.add(os.path.dirname(path))
print(":".join(sorted(found)))
PY
)
export LD_LIBRARY_PATH="${libs:+$libs:}/usr/local/cuda/lib64${extra:+:$extra}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for b in "$tests"/test_cuda "$tests"/test_nccl "$bin"/loom_bench_*cuda "$loom"; do ldd "$b" | grep "not found" && echo "missing libraries for $b"; done
: >"$out/bench.txt"

left() { echo $((LOOM_GPU_DEADLINE - $(date +%s))); }
exec 3>&1  # the console, for what must be seen whatever a step's output is redirected to
# capped NAME SECONDS COMMAND...: COMMAND under min(SECONDS, what is left), or a line on the
# console saying it was skipped when under 15 seconds are left; returns COMMAND's status.
capped() {
  local name="$1" want="$2" rest
  shift 2
  rest=$(left)
  if [ "$rest" -lt 15 ]; then echo "$name: skipped, no time left" >&3; return 0; fi
  timeout --kill-after=10 "$((want < rest ? want : rest))" "$@"
}
# A gtest binary's result: from its XML, else (killed before writing it) counted off its log.
gtest_summary() {  # NAME LOG
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|error:|Expected|rel|  Actual" "$2" | cut -c1-400 | head -40
  [ -f "$out/$1.xml" ] || echo "$1: no XML (stopped early): $(grep -c '^\[       OK \]' "$2") passed, $(grep -c '^\[  FAILED  \]' "$2") failed so far; last started: $(grep '^\[ RUN' "$2" | tail -1)"
}
gtest_run() {  # NAME BINARY SECONDS [ARGS...]: results in NAME.xml and NAME.log
  local name="$1" binary="$2" want="$3"
  shift 3
  # The whole log goes to a file first: a pipe closed early (head) must not stop the tests.
  capped "$name" "$want" "$tests/$binary" --gtest_output="xml:$out/$name.xml" "$@" >"$out/$name.log" 2>&1
  echo "$name exit $?"
  gtest_summary "$name" "$out/$name.log"
}
# The tiny model's corpus: a byte-level corpus of the repository's docs (the trainer's small runs
# and the serving benchmark's checkpoint).
tiny_corpus() {
  [ -f /tmp/loom-train/c_train.idx ] && return 0
  mkdir -p /tmp/loom-train/corpus && for f in docs/*.md; do cp "$f" "/tmp/loom-train/corpus/$(basename "$f" .md).txt"; done
  timeout 30 "$loom" data prepare /tmp/loom-train/corpus --tokenizer byte --output /tmp/loom-train/c >"$out/prepare.log" 2>&1
}
# tiny_train NAME STEPS SECONDS [OVERRIDE ...]: configs/tiny.yaml on the GPU, into /tmp/loom-train/run-NAME.
tiny_train() {
  local name="$1" steps="$2" want="$3"
  shift 3
  tiny_corpus
  capped "loom train $name" "$want" "$loom" train configs/tiny.yaml runtime.device=cuda "$@" \
    data.train_prefix=/tmp/loom-train/c_train data.val_prefix=/tmp/loom-train/c_val train.steps="$steps" \
    train.eval_interval=0 checkpoint.interval="$steps" log.progress=false log.interval=1 run.dir="/tmp/loom-train/run-$name" \
    >>"$out/train_cuda.log" 2>&1
  echo "loom train $name exit $?"
  grep -E "^step|error" "$out/train_cuda.log" | tail -1 | cut -c1-200
}
train_bench() { bash bench/cuda/train_bench.sh "$out" "$work" "$@"; }

# test_cuda in three runs, the kernels first: a hang among the trainer's tests (several ranks on the
# GPU) must not cost the kernels' results, nor cuDNN's plans, compiled at run time (seconds each),
# the time of the other kernels' tests.
model_tests='CudaModel.*:CudaReleasableMemory.*:CudaComputeStreams.*'
cudnn_tests='Cudnn*:*/Cudnn*'  # parameterised suites are named Instance/Suite
stage_kernels() {
  # cuDNN's own errors and warnings (why an engine or plan was refused: its SDPA engines compile at
  # run time) into a log per run, for the tests only (a training run would repeat them).
  export CUDNN_LOGLEVEL_DBG=2
  CUDNN_LOGDEST_DBG="$out/cudnn_kernels.log" gtest_run test_cuda test_cuda 90 \
    --gtest_filter="-$model_tests:$cudnn_tests"
  CUDNN_LOGDEST_DBG="$out/cudnn_attention.log" gtest_run test_cuda_cudnn test_cuda 60 --gtest_filter="$cudnn_tests"
  CUDNN_LOGDEST_DBG="$out/cudnn_model.log" gtest_run test_cuda_model test_cuda 120 --gtest_filter="$model_tests"
  # The tiny Super hybrid trained with the scan's chunk-parallel form (kernels/cuda/ssd_chunk_scan.h;
  # the kernel tests above hold both forms to the CPU), as on the CPU.
  LOOM_SSD_SCAN=chunks gtest_run test_cuda_scan_chunks test_cuda 45 --gtest_filter='CudaModel.TinySuperHybrid*'
  unset CUDNN_LOGLEVEL_DBG
  # Which attention the bf16 operands ran on (cuDNN's, or loom's kernels and why: once per reason).
  grep -h "^loom: attention" "$out"/test_cuda*.log | sort -u | cut -c1-300 | head -6
  local log
  for log in "$out"/cudnn_kernels.log "$out"/cudnn_attention.log "$out"/cudnn_model.log; do
    [ -s "$log" ] || continue
    echo "cuDNN's $(basename "$log"): $(wc -l <"$log") lines; its first errors:"
    grep -m 4 -iE "error|fail" "$log" | cut -c1-240
  done
  # The FP8 casts against a device copy of the same bytes, at the ~1B step's shapes, with either
  # tile height of the packed transposed cast (CAST lines: which one the step should take).
  capped loom_bench_cast_cuda 40 "$bin/loom_bench_cast_cuda" 2>&1 | tee -a "$out/bench.txt" || true
  # An MoE layer's experts' GEMMs grouped against one by one (GROUPED lines: up to what rows per
  # expert grouping wins, grouped_gemm_most_rows' default).
  capped loom_bench_grouped_gemm_cuda 30 "$bin/loom_bench_grouped_gemm_cuda" 2>&1 | tee -a "$out/bench.txt" || true
}

stage_nccl() {
  # 60 s: the waits' tests add a 1 GiB reduce_scatter, a 300 ms timeout held a second, and a death
  # test whose fresh process starts CUDA and NCCL again.
  gtest_run test_nccl test_nccl 60
  # The gradients' collectives over NCCL (one rank: the machine has one GPU), then 2 ranks sharing
  # the GPU (threads, staged through the host).
  tiny_train nccl 10 40 runtime.device_comm=nccl
  tiny_train ranks2 10 40 runtime.ranks=2
}

stage_more() {
  # A hybrid step beside the attention-only one: configs/tiny.yaml as is and with layers M*M*M*
  # (three Mamba-2 mixers of 32 heads in 8 groups in place of attention), 12 steps each; the
  # median tokens/s of steps 3-12 from each run's metrics. The first also serves the serving
  # benchmark's checkpoint.
  local pattern name
  for pattern in "" "M*M*M*"; do
    name="hybrid-${pattern:-none}"; name="${name//\*/a}"
    if [ -n "$pattern" ]; then tiny_train "$name" 12 45 "model.layer_pattern=$pattern" "model.mamba={groups: 8}"
    else tiny_train "$name" 12 45; fi
    [ -f "/tmp/loom-train/run-$name/metrics.jsonl" ] || continue
    python3 - "/tmp/loom-train/run-$name/metrics.jsonl" <<'PY' || true
import json, statistics, sys
rates = [r["tokens_per_s"] for r in map(json.loads, open(sys.argv[1])) if "tokens_per_s" in r and r["step"] > 2]
print(f"  median tokens/s over {len(rates)} steps: {statistics.median(rates):.0f}" if rates else "  no steps")
PY
  done
  # Serving: the engine on the tiny model trained above (loom_bench_serve: decode tokens/s with 1,
  # 8 and 32 sequences, prefill tokens/s), on the GPU with bf16 GEMMs (`--dtype auto` there) and
  # fp32 ones, and on this machine's CPU.
  if [ -d /tmp/loom-train/run-hybrid-none/checkpoints ]; then
    echo "== serving"
    local run
    for run in "cuda bf16" "cuda fp32" "cpu fp32"; do
      set -- $run
      capped "serve $1 $2" 45 "$bin/loom_bench_serve" /tmp/loom-train/run-hybrid-none/checkpoints 64 32 448 \
        "$1" "$2" 2>&1 |
        sed "s/^/SERVE|$1 $2|/" | tee -a "$out/bench.txt" | cut -c1-200
    done
  fi
  # The hand-written kernels once more under compute-sanitizer's memcheck, on the tests' small
  # shapes (out-of-bounds and misaligned accesses; not the long slices' cases), and loom's
  # tensor-core attention (training's and prompt rows') under racecheck (not cuDNN's, which
  # LOOM_ATTENTION=loom keeps out).
  local sanitizer
  sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
  if [ -n "$sanitizer" ]; then
    echo "== memcheck"
    capped memcheck 60 "$sanitizer" --tool memcheck --print-limit 5 "$tests/test_cuda" \
      --gtest_filter='*one_token*:*key_block*:*Paged*:*documents_d128*:*Mx*:*Blockwise*:*LayerNorm*:*Rope*:*Embedding*:*Linear*:*CudaMamba*:*DeviceAmax*-*Slices*' \
      >"$out/memcheck.log" 2>&1
    grep -E "ERROR SUMMARY|Invalid|PASSED|FAILED|skipped" "$out/memcheck.log" | head -12
    echo "== racecheck"
    LOOM_ATTENTION=loom capped racecheck 90 "$sanitizer" --tool racecheck --print-limit 5 "$tests/test_cuda" \
      --gtest_filter='*Bf16*documents_d128*:*Bf16*causal_gqa_d64*:*PagedPromptAttention.MatchesTheCpu*/*_d64' \
      >"$out/racecheck.log" 2>&1
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|hazard|PASSED|FAILED|skipped" "$out/racecheck.log" | head -8
  fi
  # The kernel benchmarks beside PyTorch (each prints RESULT lines for the table).
  echo "== kernel benchmarks"
  local b
  for b in "60 $bin/loom_bench_linear_precision_cuda" "45 $bin/loom_bench_gemm_cuda" "45 python3 bench/cuda/torch_cuda_peer.py gemm" \
           "90 $bin/loom_bench_flash_attention_cuda" "60 python3 bench/cuda/torch_cuda_peer.py attention"; do
    # shellcheck disable=SC2086
    capped "${b#* }" ${b} 2>&1 | tee -a "$out/bench.txt" | grep -v "^RESULT" || true
  done
  # Mamba-2's chunked scan in both forms (the chunk-parallel one on batched DGEMMs first, then the
  # (row, head) loops in double on CUDA cores) beside PyTorch's einsums over blocks in fp32 and with
  # bf16 products: which form the entries should take, and what rate the planner should give the
  # scan (RESULT lines, "ssd scan").
  for b in "60 $bin/loom_bench_ssd_scan_cuda" "90 python3 bench/cuda/torch_ssd_peer.py"; do
    # shellcheck disable=SC2086
    capped "${b#* }" ${b} 2>&1 | tee -a "$out/bench.txt" | grep -v "^RESULT" || true
  done
  # Decoding attention: loom's paged kernel against PyTorch's SDPA, GB/s of the cache read (DECODE
  # lines); prompt rows on CUDA cores and on tensor cores beside SDPA, TFLOP/s (PREFILL lines).
  for b in "40 $bin/loom_bench_paged_attention_cuda" "50 python3 bench/cuda/torch_cuda_peer.py decode"; do
    # shellcheck disable=SC2086
    capped "${b#* }" ${b} 2>&1 | tee -a "$out/bench.txt" | grep -vE "^(DECODE|PREFILL)" || true
  done
}

stage_spec() {
  # The model of bench/speculative_bench.sh's dense part (d_model 768, 8 layers, 2 MTP depths)
  # trained 30 steps on its repetitive corpus, on the GPU; then greedy decoding with 0, 1 and 2
  # drafts a step at 1, 8 and 32 sequences, prompts from that corpus.
  local dir=/tmp/loom-spec spec
  mkdir -p "$dir"
  for i in $(seq 1 300); do echo "It is a truth universally acknowledged, item $((i * 7))."; echo; done >"$dir/corpus.txt"
  timeout 30 "$loom" data prepare "$dir/corpus.txt" --output "$dir/c" --val-fraction 0 >"$out/prepare_spec.log" 2>&1
  cat >"$dir/dense.yaml" <<YAML
run: {dir: $dir/run, overwrite: true}
model: {vocab_size: 0, d_model: 768, layers: 8, heads: 12, kv_heads: 4, ffn_size: 2048, norm: rms, activation: swiglu,
        positions: rope, tied_embeddings: false, max_seq_len: 256, mtp_depths: 2, mtp_loss_weight: 0.5}
data: {tokenizer: byte, train_prefix: $dir/c_train, seq_len: 64}
optim: {lr: 1.0e-3, warmup_steps: 5}
train: {steps: 30, global_batch: 8, micro_batch: 8}
runtime: {device: cuda}
log: {progress: false}
YAML
  capped "loom train spec" 90 "$loom" train "$dir/dense.yaml" >>"$out/train_cuda.log" 2>&1
  echo "loom train spec exit $?"
  grep -E "^trained|error" "$out/train_cuda.log" | tail -1 | cut -c1-200
  [ -d "$dir/run/checkpoints" ] || return 0
  for spec in 0 1 2; do
    capped "serve spec $spec" 45 "$bin/loom_bench_serve" "$dir/run/checkpoints" 64 64 192 cuda auto auto "$spec" \
      "$dir/corpus.txt" 2>&1 | sed "s/^/SPEC|drafts $spec|/" | tee -a "$out/bench.txt" | cut -c1-240
  done
}

for s in "${stages[@]}"; do
  echo "== stage $s ($(left) s left)"
  case "$s" in
    kernels) stage_kernels ;;
    llama) train_bench llama ;;
    curves) train_bench curves ;;
    gpt2) train_bench gpt2 llmc gpt2-gelu-passes ;;  # the last only where time is left
    profile) train_bench profile-fp8 profile-gpt2 profile ;;
    bytes) PROFILE_BYTES=1 train_bench profile-fp8-delayed profile-gpt2 ;;
    timeline) train_bench timeline ;;
    offload) train_bench llama-offload ;;
    nccl) stage_nccl ;;
    torch) train_bench torch-gpt2 torch-llama ;;
    more) stage_more ;;
    spec) stage_spec ;;
  esac
done
echo "== done ($(left) s of the budget left)"
xmls=()
for t in test_cuda test_cuda_cudnn test_cuda_model test_cuda_scan_chunks test_nccl; do
  [ -f "$out/$t.xml" ] && xmls+=("$out/$t.xml")
done
python3 bench/cuda/gpu_table.py "$out/bench.txt" "${xmls[@]}"
# The device tool brings back at most 8 files from $OUT: the logs travel as one archive.
(cd "$out" && ls ./*.log >/dev/null 2>&1 && tar -czf logs.tar.gz ./*.log && rm -f ./*.log)
