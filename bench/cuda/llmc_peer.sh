#!/usr/bin/env bash
# llm.c's GPU trainer (karpathy/llm.c train_gpt2.cu, bf16, cuBLAS/cuBLASLt, no cuDNN, one GPU) as
# the peer of loom's GPT-2 124M training benchmark. The llm.c sources are never in this
# repository: scripts/gpu_bundle.sh copies them from a fetched mirror into the ignored bundle.
#
#   llmc_peer.sh build  SRC WORK           patch a copy of SRC into WORK/src, build WORK/train_gpt2cu
#                                          and WORK/llmc_shard_check (llm.c's own data loader)
#   llmc_peer.sh build-cudnn SRC WORK FRONTEND   WORK/train_gpt2cu_cudnn (USE_CUDNN=1; FRONTEND: a
#                                          cudnn-frontend tree with include/)
#   llmc_peer.sh shards WORK B T           WORK/data/{train,val}.bin, checked by llm.c's loader
#   llmc_peer.sh run    WORK B T STEPS [BINARY]   train GPT-2 124M from scratch (-e d12) for STEPS
#                                          steps of B x T tokens; its output (also in
#                                          WORK/run-BINARY.log), then a TRAIN line
#   llmc_peer.sh all    SRC WORK B T STEPS [PREBUILT [PREBUILT_CUDNN]]   build, shards, run;
#                                          PREBUILT: a train_gpt2cu built elsewhere, used only when
#                                          the build here fails; PREBUILT_CUDNN: also run that one
#   llmc_peer.sh prebuilt SRC WORK B T STEPS PREBUILT [PREBUILT_CUDNN]   shards, then run the
#                                          binaries built elsewhere (the cuDNN one first): no nvcc
#                                          build here, which takes about a minute of GPU time
#   llmc_peer.sh prepare SRC WORK B T PREBUILT [PREBUILT_CUDNN]   the same without the runs (a
#                                          later `run`, e.g. under a tracer)
# LLMC_RESULTS=0: a run prints no TRAIN line (one under a profiler or tracer: not the peer's rate).
#
# The build is llm.c's Makefile's `make train_gpt2cu` spelled out (nvcc -O3 --use_fast_math
# -std=c++17, code for the GPU's compute capability, -DENABLE_BF16, -lcublas -lcublasLt; no NCCL/MPI
# multi-GPU; cuDNN only in build-cudnn), with one patch for CUDA 13, which dropped the int-device
# form of cudaMemAdvise: the out-of-memory fallback to managed memory (the only caller) becomes an
# error. NVCC_LAUNCHER=ccache caches the build where ccache is installed.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cuda="${CUDA_HOME:-/usr/local/cuda}"
nvcc="${NVCC:-$(command -v nvcc || echo "$cuda/bin/nvcc")}"

# Where PyTorch's nvidia-* wheels keep a library or header, for a machine whose toolkit lacks it.
wheel_dir() {
  python3 - "$1" <<'PY' 2>/dev/null || true
import glob, os, sys
try:
    import nvidia
    roots = list(nvidia.__path__)
except Exception:
    roots = []
for root in roots:
    for path in sorted(glob.glob(os.path.join(root, "**", sys.argv[1]), recursive=True)):
        print(os.path.dirname(path)); sys.exit(0)
PY
}

# WORK as an absolute path (the builds run inside WORK/src), made if missing.
absolute() { mkdir -p "$1" && (cd "$1" && pwd); }

# The patched copy of llm.c's sources in WORK/src.
patched_copy() {
  local src="$1" work="$2"
  rm -rf "$work/src" && mkdir -p "$work/src"
  cp -r "$src/train_gpt2.cu" "$src/llmc" "$work/src/"
  local utils="$work/src/llmc/cuda_utils.cuh"
  sed -i -e 's|cudaCheck_(cudaMallocManaged(out, bytes), file, line);|cudaCheck_(err, file, line);  // loom-bench: out of memory is an error, no managed-memory fallback|' \
         -e '/cudaMemAdvise(\*out, bytes, cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId)/d' "$utils"
  if [ "$(grep -c 'loom-bench' "$utils")" != 1 ] || grep -q cudaMemAdvise "$utils"; then
    echo "llm.c: patching $utils failed (llm.c changed?)" >&2; return 1
  fi
}

# nvcc's flags (NVCC_FLAGS) and libraries (NVCC_LIBS) as llm.c's Makefile sets them for one GPU.
nvcc_flags() {
  local work="$1" cc arch
  cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '. ' || true)
  arch="${cc:-90}"
  NVCC_FLAGS=(-t=0 --use_fast_math -std=c++17 -O3 --generate-code "arch=compute_$arch,code=[compute_$arch,sm_$arch]"
              -DENABLE_BF16)
  NVCC_LIBS=(-lcublas -lcublasLt)
  # The toolkit's cuBLAS headers and link names, else those of PyTorch's nvidia-cublas wheel.
  if [ ! -f "$cuda/include/cublasLt.h" ]; then
    local inc; inc=$(wheel_dir cublasLt.h); [ -n "$inc" ] && NVCC_FLAGS+=(-I"$inc")
  fi
  if [ ! -e "$cuda/lib64/libcublasLt.so" ]; then
    local lib; lib=$(wheel_dir 'libcublasLt.so.*')
    if [ -n "$lib" ]; then
      mkdir -p "$work/link"
      for name in libcublas libcublasLt; do ln -sf "$(ls "$lib/$name.so."* | head -1)" "$work/link/$name.so"; done
      NVCC_FLAGS+=(-L"$work/link")
    fi
  fi
  # llmc/mfu.h uses NVML whenever nvml.h is found; the driver has the library, the toolkit a stub.
  if echo '#include <nvml.h>' | "$nvcc" -E -x cu - >/dev/null 2>&1; then NVCC_LIBS+=(-L"$cuda/lib64/stubs" -lnvidia-ml); fi
}

build() {
  local src="$1" work; work=$(absolute "$2")
  patched_copy "$src" "$work" && nvcc_flags "$work" || return 1
  local cmd=(${NVCC_LAUNCHER:-} "$nvcc" "${NVCC_FLAGS[@]}" train_gpt2.cu "${NVCC_LIBS[@]}" -o "$work/train_gpt2cu")
  echo "llm.c build: ${cmd[*]}"
  (cd "$work/src" && "${cmd[@]}") >"$work/build.log" 2>&1 || { tail -20 "$work/build.log" >&2; return 1; }
  "${CC:-cc}" -O2 -I"$work/src" "$here/llmc_shard_check.c" -lm -o "$work/llmc_shard_check" >>"$work/build.log" 2>&1 ||
    { tail -20 "$work/build.log" >&2; return 1; }
}

# llm.c's USE_CUDNN=1 build: attention through cuDNN's fused (flash) SDPA, its cudnn-frontend
# (header-only) from FRONTEND/include; needs cudnn.h and libcudnn.
build_cudnn() {
  local src="$1" work frontend; work=$(absolute "$2"); frontend=$(cd "$3" && pwd)
  patched_copy "$src" "$work" && nvcc_flags "$work" || return 1
  local flags=("${NVCC_FLAGS[@]}" -DENABLE_CUDNN -I"$frontend/include")
  local object=(${NVCC_LAUNCHER:-} "$nvcc" -c "${flags[@]}" llmc/cudnn_att.cpp -o "$work/cudnn_att.o")
  local link=(${NVCC_LAUNCHER:-} "$nvcc" "${flags[@]}" train_gpt2.cu "$work/cudnn_att.o" "${NVCC_LIBS[@]}" -lcudnn
              -o "$work/train_gpt2cu_cudnn")
  echo "llm.c build (cuDNN): ${object[*]} && ${link[*]}"
  (cd "$work/src" && "${object[@]}" && "${link[@]}") >"$work/build.log" 2>&1 || { tail -20 "$work/build.log" >&2; return 1; }
}

shards() {
  local work B="$2" T="$3"; work=$(absolute "$1")
  # Eight batches per shard; the loader shuffles them and starts again when they run out.
  python3 "$here/token_shards.py" llmc --out "$work/data" --tokens $((8 * B * T + 1)) --vocab 50257
  python3 "$here/token_shards.py" check-llmc "$work/data/train.bin" --batch "$B" --seq "$T"
  # llm.c's own loader must read back the tokens written: the first batch's first inputs and last target.
  local got want
  got=$("$work/llmc_shard_check" "$work/data/train.bin" "$B" "$T")
  want=$(python3 - "$here" "$B" "$T" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
import token_shards
B, T = int(sys.argv[2]), int(sys.argv[3])
t = token_shards.tokens(8 * B * T + 1, 50257, 1234)
print(f"tokens {len(t)} first {t[0]} {t[1]} {t[2]} last_target {t[B * T]}")
PY
)
  if [ "$got" != "$want" ]; then
    echo "llm.c's loader read '$got', the shard holds '$want'" >&2; return 1
  fi
  echo "llm.c's loader reads the shard back: $got"
}

run() {
  local work B="$2" T="$3" steps="$4" binary="${5:-train_gpt2cu}" impl=llm.c
  [ "$binary" = train_gpt2cu ] || impl="llm.c cudnn"
  work=$(absolute "$1")
  # GPT-2 124M from scratch (-e d12: 12 layers, d 768, vocab 50257 padded to 50304), llm.c's AdamW
  # (betas 0.9/0.95, clipping at 1.0) with loom's gpt2-124m lr and weight decay, no activation
  # recompute (-r 0, as llm.c's own GPT-2 124M script); validation only at the first and last
  # step (-v large, one batch), no sampling, no HellaSwag, no checkpoints.
  local cmd=("$work/$binary" -i "$work/data/train.bin" -j "$work/data/val.bin" -e d12 -b "$B" -t "$T"
             -x "$steps" -l 0.0006 -c 0.1 -r 0 -v 1000000 -m 1 -s 0 -h 0 -n 0)
  echo "llm.c run: ${cmd[*]}"
  # cuDNN from the toolkit, else from PyTorch's nvidia-cudnn wheel.
  local cudnn; cudnn=$(wheel_dir 'libcudnn.so.9')
  (cd "$work" && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}${cudnn:+:$cudnn}" "${cmd[@]}") 2>&1 | tee "$work/run-$binary.log" ||
    return 1
  [ "${LLMC_RESULTS:-1}" = 0 ] && return 0
  python3 "$here/train_results.py" llmc "$work/run-$binary.log" --impl "$impl" --model gpt2-124m --batch "$B" --seq "$T"
}

# The binaries built elsewhere (the cuDNN one where given) in WORK, the shard checker built, the
# shards written: what a run needs.
place_prebuilt() {  # SRC WORK B T PREBUILT [PREBUILT_CUDNN]
  local src="$1" work="$2"
  [ -x "$5" ] || { echo "llm.c: no prebuilt binary '$5'" >&2; exit 1; }
  cp "$5" "$work/train_gpt2cu"
  if [ -n "$6" ] && [ -x "$6" ]; then cp "$6" "$work/train_gpt2cu_cudnn"; fi
  "${CC:-cc}" -O2 -I"$src" "$here/llmc_shard_check.c" -lm -o "$work/llmc_shard_check"
  shards "$work" "$3" "$4"
}

case "${1:-}" in
  build) build "$2" "$3" ;;
  build-cudnn) build_cudnn "$2" "$3" "$4" ;;
  shards) shards "$2" "$3" "$4" ;;
  run) run "$2" "$3" "$4" "$5" "${6:-}" ;;
  all)
    src="$2" work=$(absolute "$3")
    if ! build "$src" "$work"; then
      [ -n "${7:-}" ] && [ -x "$7" ] || { echo "llm.c: the build failed and there is no prebuilt binary" >&2; exit 1; }
      echo "llm.c: the build here failed; using the prebuilt $7"
      cp "$7" "$work/train_gpt2cu"
      "${CC:-cc}" -O2 -I"$work/src" "$here/llmc_shard_check.c" -lm -o "$work/llmc_shard_check"
    fi
    shards "$work" "$4" "$5"
    status=0
    run "$work" "$4" "$5" "$6" || status=1
    if [ -n "${8:-}" ] && [ -x "$8" ]; then
      cp "$8" "$work/train_gpt2cu_cudnn"
      run "$work" "$4" "$5" "$6" train_gpt2cu_cudnn || status=1
    fi
    exit $status ;;
  prepare)
    work=$(absolute "$3")
    place_prebuilt "$2" "$work" "$4" "$5" "${6:-}" "${7:-}" ;;
  prebuilt)
    work=$(absolute "$3")
    place_prebuilt "$2" "$work" "$4" "$5" "${7:-}" "${8:-}"
    status=0
    if [ -n "${8:-}" ] && [ -x "$8" ]; then run "$work" "$4" "$5" "$6" train_gpt2cu_cudnn || status=1; fi
    run "$work" "$4" "$5" "$6" || status=1
    exit $status ;;
  *) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" >&2; exit 2 ;;
esac
