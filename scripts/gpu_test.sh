#!/usr/bin/env bash
# One call on a machine with an NVIDIA GPU: runs loom's GPU tests (every CUDA kernel against the
# CPU path, the cuBLASLt products, flash attention, the NCCL communicator), then the GPU
# benchmarks beside PyTorch on the same GPU and shapes (bf16 / FP8 GEMMs against torch.matmul and
# torch._scaled_mm, flash attention against scaled_dot_product_attention), and prints a short
# table last; one linear layer per precision recipe shows FP8's speedup over bf16, casts included.
# Binaries come from .gpu-bundle/ (scripts/gpu_bundle.sh, made on a build machine)
# when it is there, else they are built here (which needs the build's Debian packages). Logs and
# results go to $OUT (the device tool's folder that comes back) or /tmp/loom-gpu-out. Three modes,
# each one 10-minute device command (give it timeout_s 600), in this order:
#   gpu_test.sh [tests]   the GPU tests, the trainer's and the engine's runs on the GPU (plain,
#                         NCCL, 2 ranks, hybrid, serving beside the CPU), compute-sanitizer;
#   gpu_test.sh bench     the kernel benchmarks beside PyTorch, then the training benchmark
#                         (GPT-2 124M beside llm.c and PyTorch, the ~1B config's MFU, FP8) with
#                         what is left of about 9.5 minutes;
#   gpu_test.sh fp8-curve [STEPS]   FP8 against bf16 over a few hundred steps of the ~1B config.
set -uo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
out="${OUT:-/tmp/loom-gpu-out}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader || true
if [ -f .gpu-bundle/payload.tar.xz ]; then
  work=/tmp/loom-gpu
  rm -rf "$work" && mkdir -p "$work" && tar -C "$work" -xJf .gpu-bundle/payload.tar.xz
  bin="$work/bin" tests="$work/bin"
  libs="$work/lib"
else
  cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DLOOM_CUDA=ON >/dev/null &&
    cmake --build build-gpu -j"$(nproc)" --target test_cuda test_nccl loom_bench_gemm_cuda loom_bench_flash_attention_cuda \
      loom_bench_linear_precision_cuda loom_bench_serve loom \
      >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
  bin="$repo/build-gpu/bench" tests="$repo/build-gpu" libs=""
fi
loom="$tests/loom"  # the trainer (runtime.device=cuda, below)
# cuBLASLt, NCCL and cuDNN (loaded at run time for attention; its runtime-compiled engines load
# NVRTC): the toolkit's, else the ones PyTorch's nvidia-* packages carry.
extra=$(python3 - <<'PY' 2>/dev/null
import glob, os
try:
    import nvidia
    roots = list(nvidia.__path__)
except Exception:
    roots = []
found = set()
for root in roots:
    for pattern in ("libcublasLt.so.*", "libnccl.so.*", "libcudart.so.*", "libcudnn.so.*", "libnvrtc.so.*"):
        for path in glob.glob(os.path.join(root, "**", pattern), recursive=True):
            found.add(os.path.dirname(path))
print(":".join(sorted(found)))
PY
)
export LD_LIBRARY_PATH="${libs:+$libs:}/usr/local/cuda/lib64${extra:+:$extra}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for b in "$tests"/test_cuda "$tests"/test_nccl "$bin"/loom_bench_*cuda "$loom"; do ldd "$b" | grep "not found" && echo "missing libraries for $b"; done
# `gpu_test.sh fp8-curve [STEPS]`: only FP8 against bf16 over a few hundred steps of the ~1B
# config (bench/cuda/fp8_curve.sh; about 5 minutes), a call of its own.
if [ "${1:-}" = fp8-curve ]; then
  bash bench/cuda/fp8_curve.sh "$out" "$loom" "${2:-300}"
  exit 0
fi
mode="${1:-tests}"
case "$mode" in tests | bench) ;; *) echo "gpu_test.sh: unknown mode '$mode' (tests, bench or fp8-curve)"; exit 2 ;; esac
# The tiny model's corpus: a byte-level corpus of the repository's docs (the trainer's runs below
# and the serving benchmark's checkpoint).
mkdir -p /tmp/loom-train/corpus && for f in docs/*.md; do cp "$f" "/tmp/loom-train/corpus/$(basename "$f" .md).txt"; done
timeout 30 "$loom" data prepare /tmp/loom-train/corpus --tokenizer byte --output /tmp/loom-train/c >"$out/prepare.log" 2>&1
if [ "$mode" = tests ]; then
echo "== tests"
# The whole log goes to a file first: a pipe closed early (head) must not stop the tests.
for t in test_cuda test_nccl; do
  timeout "$([ $t = test_cuda ] && echo 180 || echo 60)" "$tests/$t" --gtest_output="xml:$out/$t.xml" >"$out/$t.log" 2>&1
  echo "$t exit $?"
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|error:|Expected|rel|  Actual" "$out/$t.log" | cut -c1-400 | head -40
done
# Which attention the bf16 operands ran on (cuDNN's, or loom's kernels and why: once per reason).
grep -h "^loom: attention" "$out/test_cuda.log" | sort -u | cut -c1-300 | head -6
# The trainer on the GPU: configs/tiny.yaml (4.5M-parameter Llama-style, fp32) for 30 steps on a
# byte-level corpus of the repository's docs (test_cuda's CudaModel tests compare it with the CPU).
echo "== loom train runtime.device=cuda"
timeout 120 "$loom" train configs/tiny.yaml runtime.device=cuda data.train_prefix=/tmp/loom-train/c_train \
  data.val_prefix=/tmp/loom-train/c_val train.steps=30 train.eval_interval=0 checkpoint.interval=0 log.progress=false \
  log.interval=10 run.dir=/tmp/loom-train/run >"$out/train_cuda.log" 2>&1
echo "loom train exit $?"; grep -E "^model:|^step|^trained|error" "$out/train_cuda.log" | cut -c1-200 | head -8
# The same for 10 steps with the gradients' collectives over NCCL (runtime.device_comm=nccl; one
# rank: the machine has one GPU), then as 2 ranks sharing the GPU (threads, staged through the host).
for run in "runtime.device_comm=nccl" "runtime.ranks=2"; do
  timeout 60 "$loom" train configs/tiny.yaml runtime.device=cuda $run data.train_prefix=/tmp/loom-train/c_train \
    data.val_prefix=/tmp/loom-train/c_val train.steps=10 train.eval_interval=0 checkpoint.interval=0 log.progress=false \
    log.interval=10 run.dir="/tmp/loom-train/run-${run//[.=]/-}" >>"$out/train_cuda.log" 2>&1
  echo "loom train $run exit $?"; grep -E "^step +10|error" "$out/train_cuda.log" | tail -1 | cut -c1-200
done
# A hybrid step beside the attention-only one: configs/tiny.yaml as is and with layers M*M*M*
# (three Mamba-2 mixers of 32 heads in 8 groups in place of attention), 12 steps each; the median
# tokens/s of steps 3-12 from each run's metrics.
for pattern in "" "M*M*M*"; do
  name="hybrid-${pattern:-none}"; name="${name//\*/a}"
  hybrid=(); [ -n "$pattern" ] && hybrid=("model.layer_pattern=$pattern" "model.mamba={groups: 8}")
  timeout 90 "$loom" train configs/tiny.yaml runtime.device=cuda "${hybrid[@]}" \
    data.train_prefix=/tmp/loom-train/c_train data.val_prefix=/tmp/loom-train/c_val train.steps=12 \
    train.eval_interval=0 checkpoint.interval=0 log.progress=false log.interval=1 \
    run.dir="/tmp/loom-train/run-$name" >>"$out/train_cuda.log" 2>&1
  echo "loom train layer_pattern=${pattern:-(attention only)} exit $?"
  python3 - "/tmp/loom-train/run-$name/metrics.jsonl" <<'PY' || true
import json, statistics, sys
rates = [r["tokens_per_s"] for r in map(json.loads, open(sys.argv[1])) if "tokens_per_s" in r and r["step"] > 2]
print(f"  median tokens/s over {len(rates)} steps: {statistics.median(rates):.0f}" if rates else "  no steps")
PY
done
# The hand-written kernels once more under compute-sanitizer's memcheck, on the tests' small
# shapes (out-of-bounds and misaligned accesses; it works on the Firecracker machines).
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
if [ -n "$sanitizer" ]; then
  echo "== memcheck"
  timeout 60 "$sanitizer" --tool memcheck --print-limit 5 "$tests/test_cuda" \
    --gtest_filter='*one_token*:*key_block*:*Paged*:*documents_d128*:*Mx*:*Blockwise*:*LayerNorm*:*Rope*:*Embedding*:*Linear*:*CudaMamba*:*DeviceAmax*' \
    >"$out/memcheck.log" 2>&1
  grep -E "ERROR SUMMARY|Invalid|PASSED|FAILED" "$out/memcheck.log" | head -12
  # Shared-memory races in loom's tensor-core attention kernels (racecheck; small shapes; not
  # cuDNN's, which LOOM_ATTENTION=loom keeps out).
  echo "== racecheck"
  LOOM_ATTENTION=loom timeout 120 "$sanitizer" --tool racecheck --print-limit 5 "$tests/test_cuda" \
    --gtest_filter='*Bf16*documents_d128*:*Bf16*causal_gqa_d64*' >"$out/racecheck.log" 2>&1
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|hazard|PASSED|FAILED" "$out/racecheck.log" | head -8
fi
: >"$out/bench.txt"
echo "== serving"
# Serving: the engine on the tiny model trained above (loom_bench_serve: decode tokens/s with 1, 8
# and 32 sequences, prefill tokens/s), on the GPU and on this machine's CPU in the same call.
for device in cuda cpu; do
  timeout 60 "$bin/loom_bench_serve" /tmp/loom-train/run/checkpoints 64 32 448 "$device" 2>&1 |
    sed "s/^/SERVE|$device|/" | tee -a "$out/bench.txt" | cut -c1-200
done
python3 bench/cuda/gpu_table.py "$out/bench.txt" "$out/test_cuda.xml" "$out/test_nccl.xml"
fi
if [ "$mode" = bench ]; then
: >"$out/bench.txt"
# GPT-2 124M and the ~1B Llama config trained by llm.c (GPT-2 only), loom and PyTorch on the same
# shapes, first: the issue's numbers. Its budget: 7 minutes (its runs in order of importance).
echo "== training"
train_budget=$((420 - SECONDS))
TRAIN_BENCH_BUDGET_S=$train_budget timeout $((train_budget + 30)) bash bench/cuda/train_bench.sh "$out" "${work:-}" ||
  echo "training benchmark: exit $?"
# The kernel benchmarks beside PyTorch with what is left of about 9.5 minutes: each runs when its
# timeout still fits, else says it was skipped.
echo "== benchmarks"
kernel_bench() {  # SECONDS COMMAND...
  local want="$1"
  shift
  if [ $((SECONDS + want)) -gt 560 ]; then echo "skipped (no time left): $*"; return 0; fi
  timeout "$want" "$@" 2>&1 | tee -a "$out/bench.txt" | grep -v "^RESULT" || true
}
kernel_bench 45 "$bin/loom_bench_gemm_cuda"
kernel_bench 45 python3 bench/cuda/torch_cuda_peer.py gemm
kernel_bench 60 "$bin/loom_bench_linear_precision_cuda"
kernel_bench 90 "$bin/loom_bench_flash_attention_cuda"
kernel_bench 60 python3 bench/cuda/torch_cuda_peer.py attention
python3 bench/cuda/gpu_table.py "$out/bench.txt"
fi
# The device tool brings back at most 8 files from $OUT: the logs travel as one archive.
(cd "$out" && ls ./*.log >/dev/null 2>&1 && tar -czf logs.tar.gz ./*.log && rm -f ./*.log)
