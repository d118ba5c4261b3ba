#!/usr/bin/env bash
# Tensor parallelism's backward collectives waited for where they start against run beside the
# column-parallel layers' GEMMs (parallel.overlap_tp_comm), GPT-2 124M at tp 2 on the threads
# backend, the two ranks joined by simulated links (topology.simulate: one node, its link of
# RATE Gbit/s per rank; the transfers sleep, so they take no core), with and without sequence
# parallelism. The reference in the same run: the same two ranks over free links.
# Prints per run tokens/s, the median step and the median seconds a step waited for its
# tensor-parallel collectives (metrics.jsonl's tp_comm_wait_s), and overlapped over waited; then
# what the planner says of each (`loom plan time` on this host's calibration, measured first).
# Usage: [BATCH=2 SEQ=64] [LOOM=build/loom] bench/tp_overlap_bench.sh [steps] [gbps...]
#   BATCH x SEQ tokens per step (each tensor-parallel rank runs them all); LOOM given: that binary,
#   nothing is built.
set -euo pipefail
steps="${1:-6}"
shift || true
rates=("$@")
[ ${#rates[@]} -gt 0 ] || rates=(1 2)
source "$(dirname "${BASH_SOURCE[0]}")/gpt2_ranks_common.sh"
common=(configs/gpt2-124m.yaml train.steps="$steps" train.micro_batch=$batch data.seq_len=$seq
        train.global_batch=$batch train.eval_interval=0 checkpoint.interval=0 log.progress=false
        runtime.ranks=2 train.threads=2 parallel.tp=2)
run() {  # name, overrides...: prints tokens/s, the median step (s) and the median wait (s)
  local name="$1"; shift
  "$loom" train "${common[@]}" run.dir="$out/$name" checkpoint.dir="$out/$name/ckpt" "$@" > "$out/$name.log" 2>&1 ||
    { cat "$out/$name.log"; exit 1; }
  local step wait_s
  step=$(field "$out/$name" step_time_s | median)
  wait_s=$(field "$out/$name" tp_comm_wait_s | median)
  awk -v s="$step" -v w="$wait_s" -v b=$batch -v t=$seq 'BEGIN {printf "%.1f %.3f %.3f", b * t / s, s, w}'
}
show() {
  awk -v name="$1" '{printf "%-44s %7.1f tok/s  step %.3f s  waiting for tp %.3f s\n", name, $1, $2, $3}' <<< "$2"
}
"$loom" bench hardware --output "$out/host.yaml" > /dev/null
planned() {  # gbps, overrides...: the planner's step (ms) and its tensor-parallel wait (ms), the host's
  local gbps="$1"; shift  # calibration with the simulated link as its node link
  sed -e "s/^  node_bandwidth_gbps: .*/  node_bandwidth_gbps: $gbps/" \
      -e "s/^  node_latency_us: .*/  node_latency_us: 5/" "$out/host.yaml" > "$out/host-$gbps.yaml"
  "$loom" plan time "${common[@]}" --hardware "$out/host-$gbps.yaml" --json "$@" |
    python3 -c 'import json, sys; t = json.load(sys.stdin)["time"]
print("%.0f %.0f" % (1e3 * t["step_s"], 1e3 * t["tp_comm_s"]))'
}
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
for sp in false true; do
  layout="tp 2"
  [ $sp = false ] || layout="tp 2, sequence parallel"
  show "$layout, free links" "$(run "free-$sp" parallel.sequence_parallel=$sp)"
  for gbps in "${rates[@]}"; do
    links=(parallel.sequence_parallel=$sp topology.simulate=true topology.ranks_per_node=2
           topology.node_bandwidth_gbps="$gbps" topology.node_latency_us=5)
    waited=$(run "waited-$sp-$gbps" "${links[@]}" parallel.overlap_tp_comm=false)
    show "$layout, $gbps Gbit/s, waited" "$waited"
    overlapped=$(run "overlapped-$sp-$gbps" "${links[@]}")
    show "$layout, $gbps Gbit/s, overlapped" "$overlapped"
    awk -v w="$waited" -v o="$overlapped" -v g="$gbps" 'BEGIN {split(w, a, " "); split(o, b, " ");
        printf "  %s Gbit/s: step overlapped / waited %.3f, tp wait %.3f -> %.3f s\n", g, b[2] / a[2], a[3], b[3]}'
    read -r plan_waited tp_waited <<< "$(planned "$gbps" "${links[@]}" parallel.overlap_tp_comm=false)"
    read -r plan_overlapped tp_overlapped <<< "$(planned "$gbps" "${links[@]}")"
    echo "  planned: waited ${plan_waited} ms (tp ${tp_waited}), overlapped ${plan_overlapped} ms (tp ${tp_overlapped})"
  done
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
