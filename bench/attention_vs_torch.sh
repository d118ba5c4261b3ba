#!/usr/bin/env bash
# Causal attention forward + backward: loom's tiled kernel (loom_bench_attention tiled) against
# PyTorch (bench/peers/torch_attention.py) on the same shapes, batch 1, HEADS heads of HEAD_DIM,
# fp32, for each T and thread count. The two run alternately, one process per T (so each peak RSS
# is that T's), and a table of loom / torch time ratios is printed at the end (< 1: loom faster).
#
# Usage: bench/attention_vs_torch.sh            (after building loom_bench_attention)
# Environment:
#   TS        sequence lengths (default "256 512 1024 2048 4096 8192")
#   THREADS   thread counts (default "1 2")
#   HEADS, HEAD_DIM   (default 4, 64: docs/benchmarks.md's attention shapes)
#   TORCH_FN  sdpa (torch's fused causal function; default) or math (matmul, masked softmax, matmul)
#   BIN       loom's bench binary (default build/bench/loom_bench_attention)
#   PYTHON    interpreter for the torch peer (default /usr/bin/python3; if it lacks torch, Debian's
#             python3-torch is installed, as bench/peers/run_peers.sh does)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TS="${TS:-256 512 1024 2048 4096 8192}"
THREADS="${THREADS:-1 2}"
HEADS="${HEADS:-4}"
HEAD_DIM="${HEAD_DIM:-64}"
TORCH_FN="${TORCH_FN:-sdpa}"
BIN="${BIN:-$REPO/build/bench/loom_bench_attention}"
PYTHON="${PYTHON:-/usr/bin/python3}"
export OPENBLAS_CORETYPE=SkylakeX   # OpenBLAS 0.3.21 misdetects this CPU

[ -x "$BIN" ] || { echo "error: $BIN not built (cmake --build build --target loom_bench_attention)" >&2; exit 1; }
source "$REPO/bench/peers/ensure_torch.sh"
ensure_torch "$PYTHON"

# Median of 5 runs up to T = 1024, 3 up to 4096, 1 above (each after one warm-up run), as loom's bench.
repeats() { if [ "$1" -le 1024 ]; then echo 5; elif [ "$1" -le 4096 ]; then echo 3; else echo 1; fi; }
field() { tr ' ' '\n' <<<"$1" | sed -n "s/^$2=//p"; }

echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
ROWS=()
for threads in $THREADS; do
  for T in $TS; do
    r="$(repeats "$T")"
    loom="$(OMP_NUM_THREADS="$threads" "$BIN" tiled "$T" "$HEADS" "$HEAD_DIM" "$r")"
    echo "$loom"
    torch="$(OMP_NUM_THREADS="$threads" "$PYTHON" "$REPO/bench/peers/torch_attention.py" "$T" --heads "$HEADS" \
      --head-dim "$HEAD_DIM" --threads "$threads" --repeats "$r" --fn "$TORCH_FN")"
    echo "$torch"
    ROWS+=("$threads $T $(field "$loom" ms) $(field "$torch" ms) $(field "$loom" maxrss_mib) $(field "$loom" base_mib) $(field "$torch" maxrss_mib) $(field "$torch" base_mib) $(field "$torch" fn)")
  done
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"

echo
echo "peak RSS: the process's peak (base: its peak before the first run: binary or interpreter, libraries, inputs)"
echo "| threads | T | loom (ms) | torch (ms) | loom / torch | loom peak RSS (MiB) | loom base | torch peak RSS (MiB) | torch base | torch function |"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
for row in "${ROWS[@]}"; do
  read -r threads T lms tms lrss lbase trss tbase fn <<<"$row"
  awk -v th="$threads" -v T="$T" -v l="$lms" -v t="$tms" -v lr="$lrss" -v lb="$lbase" -v tr="$trss" -v tb="$tbase" \
    -v fn="$fn" 'BEGIN { printf "| %s | %s | %.1f | %.1f | %.2f | %.0f | %.0f | %.0f | %.0f | %s |\n",
                         th, T, l, t, l / t, lr, lb, tr, tb, fn }'
done
