#!/usr/bin/env bash
# End-to-end training benchmark, loom against its peers in one session, same shapes and threads:
# GPT-2 124M at B=4, T=64 with 2 threads (loom, llm.c's train_gpt2.c, PyTorch), the tiny default,
# and the machine's sgemm ceiling. Usage: bench/run_train_bench.sh [rounds]
# With LOOM_BASELINE=path/to/an/older/loom, also times `loom train` on GPT-2 124M with that binary
# and this build alternately (bench/compare_train.sh), to show a change costs no speed.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
rounds="${1:-2}"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target loom_bench_train loom_bench_sgemm >/dev/null
export OMP_NUM_THREADS=2
# loom picks the OpenBLAS kernel for this CPU itself (see README); the PyTorch peer is given
# OPENBLAS_CORETYPE=SkylakeX by run_peers.sh so its BLAS is not handicapped either.
unset OPENBLAS_CORETYPE
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
for round in $(seq 1 "$rounds"); do
  echo "--- round $round"
  build/bench/loom_bench_sgemm 2048 10
  build/bench/loom_bench_train configs/gpt2-124m.yaml train.global_batch=4 train.micro_batch=4 \
    data.seq_len=64 train.threads=2 --steps 8 --warmup 2 | sed 's/^/gpt2-124m B=4 T=64: /'
  build/bench/loom_bench_train configs/tiny.yaml train.threads=2 --steps 8 --warmup 2 | sed 's/^/tiny default: /'
  bench/peers/run_peers.sh
done
if [ -n "${LOOM_BASELINE:-}" ]; then
  cmake --build build -j"$(nproc)" --target loom >/dev/null
  bench/compare_train.sh "$LOOM_BASELINE" build/loom "$rounds"
fi
