#!/usr/bin/env bash
# Fuzzes the parsers of files loom reads from outside: builds fuzz/ with clang (libFuzzer +
# AddressSanitizer) in its own build directory, writes a small seed corpus, runs each target for
# a bounded time and fails on any crash, sanitizer report or escaped non-loom exception (the
# input that caused it is kept as crash-* under the build directory and printed as hex).
# Exits 77 (CTest: skipped) when clang or libFuzzer is not installed.
# Usage: fuzz_parsers.sh SOURCE_DIR BUILD_DIR [SECONDS_PER_TARGET]
set -euo pipefail
source_dir="$1"
build_dir="$2"
seconds="${3:-20}"

skip() { echo "fuzz_parsers: SKIPPED: $*"; exit 77; }
command -v clang >/dev/null 2>&1 && command -v clang++ >/dev/null 2>&1 ||
  skip "clang is not installed (scripts/setup.sh installs clang and libclang-rt-14-dev)"
probe="$(mktemp -d)"
trap 'rm -rf "$probe"' EXIT
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' > "$probe/probe.cpp"
clang++ -fsanitize=fuzzer,address "$probe/probe.cpp" -o "$probe/probe" > "$probe/log" 2>&1 ||
  skip "clang cannot link a libFuzzer target (install libclang-rt-14-dev): $(head -c 300 "$probe/log")"

# -O0: a bounded smoke run; compiling at -O1 would take longer than the fuzzing itself.
cmake -S "$source_dir" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++ -DLOOM_BUILD_FUZZERS=ON -DLOOM_BUILD_TESTS=OFF -DLOOM_BUILD_BENCH=OFF \
  -DLOOM_FUZZ_COMPILE_FLAGS="-O0;-g1" > "$probe/configure.log" 2>&1 ||
  { cat "$probe/configure.log"; exit 1; }
cmake --build "$build_dir" -j2 --target safetensors_fuzz manifest_fuzz > "$probe/build.log" 2>&1 ||
  { cat "$probe/build.log"; exit 1; }

# Seeds: valid files of each format and a few near misses, so the fuzzers start past the basics.
seeds="$build_dir/fuzz-seeds"
rm -rf "$seeds"
mkdir -p "$seeds/safetensors" "$seeds/manifest"
safetensors_seed() {  # NAME HEADER DATA_BYTES: 8-byte little-endian header length, header, data
  local name="$1" header="$2" data_bytes="$3" n="${#2}" length="" i
  for i in 0 1 2 3 4 5 6 7; do length+="$(printf '\\x%02x' $(( (n >> (8 * i)) & 255 )))"; done
  { printf "$length"; printf '%s' "$header"; head -c "$data_bytes" /dev/zero; } > "$seeds/safetensors/$name"
}
safetensors_seed empty '{}' 0
safetensors_seed one '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}' 8
safetensors_seed two '{"__metadata__":{"format":"pt"},"w":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]},"b":{"dtype":"F16","shape":[],"data_offsets":[8,10]}}  ' 10
safetensors_seed gap '{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"I64","shape":[1],"data_offsets":[2,10]}}' 10
safetensors_seed overlap '{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"I16","shape":[1],"data_offsets":[2,4]}}' 4
cat > "$seeds/manifest/one.json" <<'JSON'
{"format": "loom-checkpoint", "version": 1, "step": 3,
 "files": [{"name": "rank-00000.bin", "rank": 0, "bytes": 48}],
 "tensors": [{"name": "model.norm.weight", "dtype": "f32", "shape": [4, 3],
              "shards": [{"file": "rank-00000.bin", "offset": 0, "bytes": 24, "slice": [[0, 2], [0, 3]], "xxh3": "0000000000000000"},
                         {"file": "rank-00000.bin", "offset": 24, "bytes": 24, "slice": [[2, 2], [0, 3]], "xxh3": "0123456789abcdef"}]}],
 "state": {"step": 3, "consumed_samples": 12}, "config_yaml": "model:\n  d_model: 4\n",
 "manifest_xxh3": "0000000000000000"}
JSON
printf '{"format": "loom-checkpoint", "version": 1, "step": 0, "files": [], "tensors": [], "state": {}, "config_yaml": ""}' \
  > "$seeds/manifest/empty.json"

status=0
for target in safetensors manifest; do
  corpus="$build_dir/fuzz-corpus/$target"
  artifacts="$build_dir/fuzz-artifacts/$target/"
  rm -rf "$artifacts"  # only this run's findings
  mkdir -p "$corpus" "$artifacts"
  log="$build_dir/fuzz-$target.log"
  echo "fuzz_parsers: ${target}_fuzz for ${seconds} s"
  if "$build_dir/fuzz/${target}_fuzz" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=8192 \
      -print_final_stats=1 -artifact_prefix="$artifacts" "$corpus" "$seeds/$target" > "$log" 2>&1; then
    runs="$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+).*/\1/p' "$log" | tail -1)"
    cov="$(grep -oE 'cov: [0-9]+' "$log" | tail -1 || true)"
    echo "fuzz_parsers: ${target}_fuzz: ${runs:-?} executions in ${seconds} s, ${cov:-cov: ?}, no crash"
  else
    status=1
    echo "fuzz_parsers: ${target}_fuzz FAILED; its log ($log) ends:"
    tail -n 60 "$log"
    for crash in "$artifacts"*; do
      [ -f "$crash" ] || continue
      echo "fuzz_parsers: input $crash:"
      od -A d -t x1z "$crash" | head -n 40
    done
  fi
done
exit "$status"
