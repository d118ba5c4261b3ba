#!/usr/bin/env bash
# Prepares the GPU tests and benchmarks to run on a machine that has the NVIDIA driver, CUDA and
# Python with PyTorch but none of the build's Debian packages and no network (the lent device
# machine; docs/cuda.md). Here: builds test_cuda, test_nccl, loom_bench_gemm_cuda,
# loom_bench_flash_attention_cuda, loom_bench_linear_precision_cuda and `loom` (for
# runtime.device=cuda) with the CUDA backend (nvcc from /usr/local/cuda; sm_90a + compute_90 PTX),
# strips them, and packs them with the shared libraries they need beyond glibc, libstdc++ and the
# big CUDA libraries that machine has itself (cuBLASLt, NCCL: in its
# /usr/local/cuda or in PyTorch's nvidia-* packages) into .gpu-bundle/payload.tar.xz (ignored by
# git, a few MB). Then checks that every library resolves but the driver's and that test_cuda
# starts and skips here, saying why.
#   here:  bash scripts/gpu_bundle.sh
#   there: bash scripts/gpu_test.sh        (with .gpu-bundle carried along)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
targets=(test_cuda test_nccl loom_bench_gemm_cuda loom_bench_flash_attention_cuda loom_bench_linear_precision_cuda)
targets+=(loom)  # runtime.device=cuda
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DLOOM_CUDA=ON >/dev/null
cmake --build build -j"$(nproc)" --target "${targets[@]}" >/dev/null
bundle="$repo/.gpu-bundle"
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
cp build/test_cuda build/test_nccl build/bench/loom_bench_gemm_cuda build/bench/loom_bench_flash_attention_cuda \
  build/bench/loom_bench_linear_precision_cuda "$stage/bin/"
cp build/loom "$stage/bin/"  # runtime.device=cuda
strip --strip-unneeded "$stage"/bin/*
# Libraries outside glibc/libstdc++ (newer on that machine), the driver and the CUDA libraries
# it has travel with the binaries.
for bin in "$stage"/bin/*; do ldd "$bin"; done | awk '/=>/ {print $1, $3}' | sort -u | while read -r name path; do
  case "$name" in
    libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libgcc_s.so*|libstdc++.so*) ;;
    libcuda.so*|libcublas*.so*|libnccl.so*|libcudnn*.so*) ;;
    *) cp -L "$path" "$stage/lib/$name" ;;
  esac
done
rm -rf "$bundle"
mkdir -p "$bundle"
tar -C "$stage" -cJf "$bundle/payload.tar.xz" bin lib
# The checks this machine can make: every library resolves (bundled ones first; CUDA's from
# /usr/local/cuda) and the test binary starts and skips, naming the reason there is no GPU here.
missing=$(for bin in "$stage"/bin/*; do LD_LIBRARY_PATH="$stage/lib:/usr/local/cuda/lib64" ldd "$bin"; done |
          grep "not found" | sort -u || true)
if [ -n "$missing" ]; then echo "gpu bundle: unresolved libraries:" >&2; echo "$missing" >&2; exit 1; fi
LD_LIBRARY_PATH="$stage/lib:/usr/local/cuda/lib64" "$stage/bin/test_cuda" --gtest_filter='CudaDevice.*:CudaGemm.Fp32*' |
  grep -E "Skipped|cuda|PASSED|FAILED" | head -4
echo "gpu bundle: $(du -h "$bundle/payload.tar.xz" | cut -f1) in .gpu-bundle/ ($(ls "$stage/lib" | tr '\n' ' '))"
echo "run on the device machine: bash scripts/gpu_test.sh   (carry .gpu-bundle)"
