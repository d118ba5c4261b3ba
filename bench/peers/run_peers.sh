#!/usr/bin/env bash
# Run the two peers of loom's end-to-end training benchmark (GPT-2 124M,
# B=4, T=64, 2 threads, AdamW, fp32) and print one summary line per peer:
#   peer=llmc tokens_per_s=...
#   peer=pytorch tokens_per_s=...
#
# Usage: bench/peers/run_peers.sh [llmc|pytorch|all]   (default: all)
#
# Environment:
#   LLMC_SRC      llm.c source: either a checkout (dir containing train_gpt2.c)
#                 or a (bare) git dir. Default: /work/.mirror/karpathy+llm.c/repo
#   LLMC_REV      revision to extract from a git dir (default HEAD)
#   LLMC_STEPS    llm.c training steps incl. the warm-up step 0 (default 6)
#   TORCH_WARMUP  PyTorch warm-up steps (default 2)
#   TORCH_STEPS   PyTorch measured steps (default 8)
#   THREADS       threads for both peers (default 2)
#   PEERS_CACHE   work dir (default <repo>/.cache/peers, git-ignored)
#   PYTHON        interpreter for the torch peer (default /usr/bin/python3)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/ensure_torch.sh"
REPO="$(cd "$HERE/../.." && pwd)"
WHICH="${1:-all}"
LLMC_SRC="${LLMC_SRC:-/work/.mirror/karpathy+llm.c/repo}"
LLMC_REV="${LLMC_REV:-HEAD}"
LLMC_STEPS="${LLMC_STEPS:-6}"
TORCH_WARMUP="${TORCH_WARMUP:-2}"
TORCH_STEPS="${TORCH_STEPS:-8}"
THREADS="${THREADS:-2}"
CACHE="${PEERS_CACHE:-$REPO/.cache/peers}"
PYTHON="${PYTHON:-/usr/bin/python3}"
B=4
T=64

export OPENBLAS_CORETYPE=SkylakeX   # OpenBLAS misdetects this CPU
export OMP_NUM_THREADS="$THREADS"

mkdir -p "$CACHE"
SUMMARY=()

run_llmc() {
  local W="$CACHE/llmc"
  local commit
  rm -rf "$W/src"
  mkdir -p "$W/src"
  if [ -f "$LLMC_SRC/train_gpt2.c" ]; then
    commit="$(git -C "$LLMC_SRC" rev-parse HEAD 2>/dev/null || echo unknown)"
    cp -r "$LLMC_SRC/Makefile" "$LLMC_SRC/train_gpt2.c" "$LLMC_SRC/llmc" "$W/src/"
  elif git --git-dir="$LLMC_SRC" rev-parse --verify -q "$LLMC_REV^{commit}" >/dev/null; then
    commit="$(git --git-dir="$LLMC_SRC" rev-parse "$LLMC_REV^{commit}")"
    git --git-dir="$LLMC_SRC" archive "$commit" Makefile train_gpt2.c llmc | tar -x -C "$W/src"
  else
    echo "error: LLMC_SRC=$LLMC_SRC is neither an llm.c checkout nor a git dir" >&2
    echo "       (get one with the fetch tool: github:karpathy/llm.c)" >&2
    return 1
  fi
  echo "== llm.c commit $commit"

  # Patch the extracted copy (never the repo): B/T are hardcoded in main();
  # check they are 4/64, cut the step count, and skip the periodic validation
  # (step % 10) and sampling (step % 20) so only training steps run.
  local f="$W/src/train_gpt2.c"
  grep -q 'int B = 4;' "$f" && grep -q 'int T = 64;' "$f" || {
    echo "error: train_gpt2.c does not hardcode B=4, T=64 any more" >&2; return 1; }
  sed -i \
    -e "s/for (int step = 0; step <= 40; step++)/for (int step = 0; step < $LLMC_STEPS; step++)/" \
    -e 's/if (step % 10 == 0) {/if (0) { \/\/ loom-bench: val disabled/' \
    -e 's/if (step > 0 \&\& step % 20 == 0) {/if (0) { \/\/ loom-bench: sampling disabled/' \
    "$f"
  [ "$(grep -c 'loom-bench' "$f")" = 2 ] && grep -q "step < $LLMC_STEPS;" "$f" || {
    echo "error: patching train_gpt2.c failed (upstream changed?)" >&2; return 1; }

  # Build with llm.c's own Makefile (CPU target), exactly as `make train_gpt2`.
  echo "== building train_gpt2 with llm.c Makefile"
  (cd "$W/src" && make -B train_gpt2) > "$W/build.log" 2>&1 || {
    cat "$W/build.log" >&2; return 1; }
  local cmd
  cmd="$(grep -E 'train_gpt2\.c' "$W/build.log" | grep -E -- '-o train_gpt2' | tail -1)"
  local cc="${cmd%% *}"
  echo "== build: $cmd"
  echo "== $cc: $("$cc" --version | head -1); -march=native resolves to $("$cc" -march=native -Q --help=target 2>/dev/null | awk '$1 == "-march=" {print $2; exit}')"

  # Inputs (random-init checkpoint + random tokens); the checkpoint is reused.
  "$PYTHON" "$HERE/make_llmc_inputs.py" --out "$W/src" --C 768 --L 12 --NH 12 \
    --maxT 1024 --V 50257 --Vp 50304 >/dev/null
  if [ ! -e "$W/src/gpt2_124M.bin" ]; then echo "error: no checkpoint" >&2; return 1; fi

  echo "== running: OMP_NUM_THREADS=$OMP_NUM_THREADS ./train_gpt2 ($LLMC_STEPS steps); loadavg before: $(cut -d' ' -f1-3 /proc/loadavg)"
  (cd "$W/src" && ./train_gpt2) > "$W/run.log" 2>&1 || { cat "$W/run.log" >&2; return 1; }
  grep -E '^step ' "$W/run.log"
  local line
  line="$(awk -v B=$B -v T=$T '
    /^step [0-9]+: train loss .* \(took [0-9.]+ ms\)/ {
      s = $2; sub(":", "", s); ms = $(NF-1); sub("\\(took ", "", ms)
      if (s + 0 > 0) { n++; v[n] = ms + 0 }   # step 0 is the warm-up
    }
    END {
      if (n == 0) { exit 1 }
      for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
      med = (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
      printf "peer=llmc tokens_per_s=%.2f step_ms=%.1f B=%d T=%d measured_steps=%d", B * T * 1000 / med, med, B, T, n
    }' "$W/run.log")" || { echo "error: no step timings in $W/run.log" >&2; return 1; }
  SUMMARY+=("$line threads=$OMP_NUM_THREADS commit=$commit cc=\"$("$cc" --version | head -1)\" flags=\"${cmd#* }\"")
}

run_pytorch() {
  ensure_torch "$PYTHON"
  echo "== running: OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE $PYTHON torch_gpt2.py --threads $THREADS; loadavg before: $(cut -d' ' -f1-3 /proc/loadavg)"
  local out
  out="$("$PYTHON" "$HERE/torch_gpt2.py" --B $B --T $T --threads "$THREADS" \
          --warmup "$TORCH_WARMUP" --steps "$TORCH_STEPS")"
  echo "$out" | grep '^#' || true
  local line
  line="$(echo "$out" | grep '^peer=pytorch')"
  local cfg
  # Debian's torch links the generic libblas.so.3; report what it resolves to.
  cfg="blas=$(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null || echo '?')"
  SUMMARY+=("$line $cfg python=$("$PYTHON" -c 'import platform; print(platform.python_version())')")
}

echo "== $(date -u +%FT%TZ) host=$(hostname) nproc=$(nproc) cpu=\"$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')\""
case "$WHICH" in
  llmc) run_llmc ;;
  pytorch) run_pytorch ;;
  all) run_llmc; run_pytorch ;;
  *) echo "usage: $0 [llmc|pytorch|all]" >&2; exit 2 ;;
esac
echo "== summary (loadavg after: $(cut -d' ' -f1-3 /proc/loadavg); other jobs on these 2 cores skew results)"
printf '%s\n' "${SUMMARY[@]}"
