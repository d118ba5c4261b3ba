#!/usr/bin/env bash
# Builds test binaries with AddressSanitizer and UndefinedBehaviorSanitizer (a build of its own,
# build-asan/, without the CUDA backend: the emulated device runs the device code paths) and runs
# them; any sanitizer report fails the run. Slower than the suite (about 30 minutes cold on 2
# cores for the default layers, ccache keeping later builds short), so not part of CI.
#   bash scripts/sanitize.sh [LAYER ...]            default: kernels precision model train
#   GTEST_FILTER='Device*' bash scripts/sanitize.sh train
# Death tests are left out: they expect a plain SIGSEGV, which the sanitizer turns into its report.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
layers=("$@")
[ "${#layers[@]}" -gt 0 ] || layers=(kernels precision model train)
targets=()
for layer in "${layers[@]}"; do
  [ -d "tests/$layer" ] || { echo "sanitize.sh: no tests/$layer (a layer such as kernels, model, train)" >&2; exit 2; }
  targets+=("test_$layer")
done
# The suite's Release optimisation (-O3), so its fp32 results, which the layout tests compare at
# 1e-5, are summed as in the suite (an -O2 build contracts other multiply-adds).
flags="-g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Release -DLOOM_CUDA=OFF -DCMAKE_CXX_FLAGS="$flags" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
cmake --build build-asan -j"$(nproc)" --target "${targets[@]}"
export OMP_WAIT_POLICY=passive ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1
filter="${GTEST_FILTER:-*}"
failed=0
for t in "${targets[@]}"; do
  echo "== $t"
  if ! (cd build-asan && "./$t" --gtest_filter="$filter:-*DeathTest*" --gtest_brief=1); then
    failed=1
    echo "sanitize.sh: $t failed (above)" >&2
  fi
done
exit "$failed"
