#!/usr/bin/env bash
# Installs what loom's build needs (Debian packages) and the verified data the embedded default
# uses (tokenizer ranks, corpus). Safe to run any number of times.
#   setup.sh                     the build, the data, the server tests' npm clients
#   setup.sh --test-references   also the Debian references the tests compare against beyond
#                                npm: python3-torch (227 packages, about 190 MB: the MoE layer's
#                                PyTorch autograd reference, tests/scripts/moe_torch_reference.sh),
#                                protobuf and crcmod (tests/scripts/tensorboard_reference.sh)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
test_references=0
for arg in "$@"; do
  case "$arg" in
    --test-references) test_references=1 ;;
    *) echo "setup.sh: unknown argument '$arg' (valid: --test-references)" >&2; exit 2 ;;
  esac
done

packages=(
  build-essential cmake pkg-config git python3 ccache  # ccache: rebuilds of unchanged sources read objects back
  libopenblas-openmp-dev libyaml-cpp-dev nlohmann-json3-dev libcli11-dev
  libgtest-dev libgmock-dev libbenchmark-dev libpcre2-dev libssl-dev libxxhash-dev libzstd-dev zlib1g-dev
  libsentencepiece-dev sentencepiece libutf8proc-dev  # Hugging Face tokenizers (spm_train/spm_encode: tests)
  libopenmpi-dev openmpi-bin
  libcpp-httplib-dev  # loom serve's HTTP server
  clang libclang-rt-14-dev  # libFuzzer + AddressSanitizer for tests/scripts/fuzz_parsers.sh
)
# For Debian's /usr/bin/python3: PyTorch (the MoE reference), protobuf and crcmod (TensorBoard's event files).
[ "$test_references" -eq 0 ] || packages+=(python3-torch protobuf-compiler python3-protobuf python3-crcmod)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# npm fetches the data packages; any install of it will do (nodesource's nodejs ships its own).
command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo_cmd apt-get update -qq
  $sudo_cmd apt-get install -y -qq "${missing[@]}"
fi

"$here/fetch-data.sh"

# The reference clients the server tests run against `loom serve` (openai, autocannon) and llama.cpp (node-llama-cpp), pinned
# with their sha512 integrity in scripts/npm/package-lock.json, which npm checks every tarball
# against (`npm install` with the lock rather than `npm ci`: npm's lock leaves out the other
# platforms' optional builds of node-llama-cpp, which `npm ci` then refuses). Installed under .cache/npm; skipped when that lock is already installed.
npm_dir="${LOOM_NPM_DIR:-$here/../.cache/npm}"
if ! cmp -s "$here/npm/package-lock.json" "$npm_dir/package-lock.json" || [ ! -d "$npm_dir/node_modules" ]; then
  echo "setup: installing the test clients (scripts/npm) into $npm_dir"
  mkdir -p "$npm_dir"
  cp "$here/npm/package.json" "$here/npm/package-lock.json" "$npm_dir/"
  # --omit=optional: node-llama-cpp's GPU builds are not needed (its CPU build is listed itself).
  (cd "$npm_dir" && npm install --silent --no-audit --no-fund --no-save --omit=optional)
fi

