#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: builds loom with the CUDA backend and runs the GPU tests (the
# CUDA kernels against the CPU path). One call; the last lines are the test summary.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DLOOM_CUDA=ON -DLOOM_BUILD_BENCH=OFF > /dev/null
cmake --build build-gpu -j"$(nproc)" --target test_cuda
build-gpu/test_cuda
