#!/usr/bin/env bash
# The host half of an offloaded optimizer (optim.cpu_offload): loom's AdamW update on the host's
# cores (loom_bench_host_adamw) beside PyTorch's CPU AdamW, its per-tensor loop and its foreach
# path (bench/peers/torch_adamw.py), on the same N fp32 elements and threads, alternated ROUNDS
# times; prints each run's line, then a table of the medians and loom's speed over torch's.
#
# Usage: bench/host_adamw_vs_torch.sh        (after building loom_bench_host_adamw)
# Environment:
#   NS        element counts (default "4194304 33554432 134217728": 4M, 32M, 128M)
#   THREADS   thread counts (default "1 2")
#   ROUNDS    alternations (default 3); each run the median of 5 updates after one untimed
#   BIN       loom's bench binary (default build/bench/loom_bench_host_adamw)
#   PYTHON    interpreter for the torch peer (default /usr/bin/python3; if it lacks torch, Debian's
#             python3-torch is installed, as bench/peers/run_peers.sh does)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
NS="${NS:-4194304 33554432 134217728}"
THREADS="${THREADS:-1 2}"
ROUNDS="${ROUNDS:-3}"
BIN="${BIN:-$REPO/build/bench/loom_bench_host_adamw}"
PYTHON="${PYTHON:-/usr/bin/python3}"

[ -x "$BIN" ] || { echo "error: $BIN not built (cmake --build build --target loom_bench_host_adamw)" >&2; exit 1; }
source "$REPO/bench/peers/ensure_torch.sh"
ensure_torch "$PYTHON"

echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
LINES="$(mktemp)"
trap 'rm -f "$LINES"' EXIT
for round in $(seq "$ROUNDS"); do
  for threads in $THREADS; do
    for n in $NS; do
      OMP_WAIT_POLICY=passive "$BIN" "$n" 5 "$threads" | tee -a "$LINES"
      "$PYTHON" "$REPO/bench/peers/torch_adamw.py" "$n" 5 "$threads" 0 | tee -a "$LINES"
      "$PYTHON" "$REPO/bench/peers/torch_adamw.py" "$n" 5 "$threads" 1 | tee -a "$LINES"
    done
  done
done
"$PYTHON" - "$LINES" <<'PY'
import statistics
import sys
rows = {}
for line in open(sys.argv[1]):
    fields = dict(f.split("=", 1) for f in line.split()[1:])
    key = (int(fields["n"]), int(fields["threads"]))
    rows.setdefault(key, {}).setdefault(fields["engine"], []).append(float(fields["ms"]))
print("| elements | threads | loom ms | torch ms | torch foreach ms | loom GB/s | torch / loom | foreach / loom |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|")
for (n, threads), engines in sorted(rows.items()):
    loom, torch, foreach = (statistics.median(engines[e]) for e in ("loom", "torch", "torch-foreach"))
    print(f"| {n} | {threads} | {loom:.2f} | {torch:.2f} | {foreach:.2f} | {28.0 * n / (loom * 1e6):.1f} | "
          f"{torch / loom:.2f} | {foreach / loom:.2f} |")
PY
