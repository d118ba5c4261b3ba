#!/usr/bin/env bash
# Prepares the GPU tests and benchmarks to run on a machine that has the NVIDIA driver, CUDA and
# Python with PyTorch but none of the build's Debian packages and no network (the lent device
# machine; docs/cuda.md). Here: builds test_cuda, test_nccl, loom_bench_gemm_cuda,
# loom_bench_flash_attention_cuda, loom_bench_linear_precision_cuda, loom_bench_cast_cuda,
# loom_bench_grouped_gemm_cuda, loom_bench_ssd_scan_cuda,
# `loom` (for runtime.device=cuda) and libloom_step_timeline.so (a CUPTI injection library, with
# libcupti) with the CUDA backend (nvcc from /usr/local/cuda; sm_90a + compute_90 PTX), strips
# them, and packs them with the shared libraries they need beyond glibc, libstdc++ and the big
# CUDA libraries that machine has itself (cuBLAS, cuBLASLt, NCCL: in its /usr/local/cuda or in
# PyTorch's nvidia-* packages) into .gpu-bundle/payload.tar.xz (ignored by
# git, a few MB). Then checks that every library resolves but the driver's and that test_cuda
# starts and skips here, saying why. It also carries llm.c's GPU trainer, the peer of the GPT-2
# training benchmark (bench/cuda/train_bench.sh): its sources from a fetched mirror of
# karpathy/llm.c (LLMC_SRC, a git dir or checkout; LLMC_REV), which travel only in the bundle, never
# in the repository, checked here by building them with this machine's nvcc.
#   here:  bash scripts/gpu_bundle.sh
#   there: bash scripts/gpu_test.sh        (with .gpu-bundle carried along)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
targets=(test_cuda test_nccl loom_bench_gemm_cuda loom_bench_flash_attention_cuda loom_bench_linear_precision_cuda
  loom_bench_paged_attention_cuda loom_bench_cast_cuda loom_bench_grouped_gemm_cuda loom_bench_ssd_scan_cuda
  loom_bench_serve)
targets+=(loom)  # runtime.device=cuda
targets+=(loom_step_timeline)  # the CUPTI injection library of train_bench.sh's timeline run
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DLOOM_CUDA=ON >/dev/null
cmake --build build -j"$(nproc)" --target "${targets[@]}" >/dev/null
bundle="$repo/.gpu-bundle"
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
cp build/test_cuda build/test_nccl build/bench/loom_bench_gemm_cuda build/bench/loom_bench_flash_attention_cuda \
  build/bench/loom_bench_linear_precision_cuda build/bench/loom_bench_paged_attention_cuda \
  build/bench/loom_bench_cast_cuda build/bench/loom_bench_grouped_gemm_cuda build/bench/loom_bench_ssd_scan_cuda \
  build/bench/loom_bench_serve \
  "$stage/bin/"
cp build/loom "$stage/bin/"  # runtime.device=cuda
# Next to loom, where train_bench.sh looks for it; libcupti travels in lib/ (the ldd loop below).
cp build/bench/libloom_step_timeline.so "$stage/bin/"
strip --strip-unneeded "$stage"/bin/*  # keeps the dynamic symbols (the library's InitializeInjection)
# Libraries outside glibc/libstdc++ (newer on that machine), the driver and the CUDA libraries
# it has travel with the binaries.
for bin in "$stage"/bin/*; do ldd "$bin"; done | awk '/=>/ {print $1, $3}' | sort -u | while read -r name path; do
  case "$name" in
    libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libgcc_s.so*|libstdc++.so*) ;;
    libcuda.so*|libcublas*.so*|libnccl.so*|libcudnn*.so*) ;;
    *) cp -L "$path" "$stage/lib/$name" ;;
  esac
done
# llm.c's train_gpt2.cu and llmc/ headers into llmc/src (with llmc/COMMIT), built here once as a
# check (and kept as llmc/train_gpt2cu, used there only if its own build fails), its token shards
# read back by llm.c's own loader. Without a mirror the bundle goes without the llm.c peer.
bundle_llmc() {
  local src="${LLMC_SRC:-/work/.mirror/karpathy+llm.c/repo}" rev="${LLMC_REV:-f1e2ace651495b74ae22d45d1723443fd00ecd3a}"
  mkdir -p "$stage/llmc/src"
  if git --git-dir="$src" cat-file -e "$rev^{commit}" 2>/dev/null; then
    git --git-dir="$src" archive "$rev" train_gpt2.cu llmc | tar -x -C "$stage/llmc/src"
  elif [ -f "$src/train_gpt2.cu" ]; then
    rev=$(git -C "$src" rev-parse HEAD 2>/dev/null || echo unknown)
    cp -r "$src/train_gpt2.cu" "$src/llmc" "$stage/llmc/src/"
  else
    echo "gpu bundle: no llm.c at $src (fetch github:karpathy/llm.c, or set LLMC_SRC); no llm.c peer in the bundle" >&2
    rm -rf "$stage/llmc"
    return 0
  fi
  echo "llm.c $rev" >"$stage/llmc/COMMIT"
  # Built under build/ (a fixed path, so that ccache finds the last build).
  NVCC_LAUNCHER="$(command -v ccache || true)" bash bench/cuda/llmc_peer.sh build "$stage/llmc/src" build/llmc
  bash bench/cuda/llmc_peer.sh shards build/llmc 16 1024 | tail -1
  cp build/llmc/train_gpt2cu "$stage/llmc/train_gpt2cu"
  bundle_llmc_cudnn
}

# llm.c's fastest single-GPU build (USE_CUDNN=1: cuDNN's flash attention) is built here, where
# cuDNN's headers are, against cudnn-frontend (header-only, a fetched mirror of
# NVIDIA/cudnn-frontend: CUDNN_FRONTEND_SRC, CUDNN_FRONTEND_REV, default v1.18.0, the last before it
# needed NVRTC); only the binary travels, as llmc/train_gpt2cu_cudnn, and runs there with the
# image's cuDNN 9. LLMC_CUDNN=0 skips it (its first build takes a few minutes; ccache keeps it).
bundle_llmc_cudnn() {
  local src="${CUDNN_FRONTEND_SRC:-/work/.mirror/NVIDIA+cudnn-frontend/repo}" rev="${CUDNN_FRONTEND_REV:-v1.18.0}"
  [ "${LLMC_CUDNN:-1}" != 0 ] || return 0
  if [ ! -f /usr/local/cuda/include/cudnn.h ] || ! git --git-dir="$src" cat-file -e "$rev^{commit}" 2>/dev/null; then
    echo "gpu bundle: no cudnn.h here or no cudnn-frontend $rev at $src; no llm.c cuDNN build in the bundle" >&2
    return 0
  fi
  rm -rf build/cudnn-frontend && mkdir -p build/cudnn-frontend
  git --git-dir="$src" archive "$rev" include | tar -x -C build/cudnn-frontend
  NVCC_LAUNCHER="$(command -v ccache || true)" bash bench/cuda/llmc_peer.sh build-cudnn "$stage/llmc/src" \
    build/llmc-cudnn "$repo/build/cudnn-frontend"
  cp build/llmc-cudnn/train_gpt2cu_cudnn "$stage/llmc/"
  echo "cudnn-frontend $rev $(git --git-dir="$src" rev-parse "$rev^{commit}")" >>"$stage/llmc/COMMIT"
}
bundle_llmc

rm -rf "$bundle"
mkdir -p "$bundle"
tar -C "$stage" -cJf "$bundle/payload.tar.xz" bin lib $([ -d "$stage/llmc" ] && echo llmc)
# The checks this machine can make: every library resolves (bundled ones first; CUDA's from
# /usr/local/cuda) and the test binary starts and skips, naming the reason there is no GPU here.
missing=$(for bin in "$stage"/bin/*; do LD_LIBRARY_PATH="$stage/lib:/usr/local/cuda/lib64" ldd "$bin"; done |
          grep "not found" | sort -u || true)
if [ -n "$missing" ]; then echo "gpu bundle: unresolved libraries:" >&2; echo "$missing" >&2; exit 1; fi
LD_LIBRARY_PATH="$stage/lib:/usr/local/cuda/lib64" "$stage/bin/test_cuda" --gtest_filter='CudaDevice.*:CudaGemm.Fp32*' |
  grep -E "Skipped|cuda|PASSED|FAILED" | head -4
echo "gpu bundle: $(du -h "$bundle/payload.tar.xz" | cut -f1) in .gpu-bundle/ ($(ls "$stage/lib" | tr '\n' ' '))$([ -d "$stage/llmc" ] && echo "; $(cut -c1-20 "$stage/llmc/COMMIT" | paste -sd, -)")"
echo "run on the device machine: bash scripts/gpu_test.sh   (carry .gpu-bundle)"
