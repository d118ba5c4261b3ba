#!/usr/bin/env bash
# ZeRO-1's parameter all-gather waited for in the update against overlapped with the next forward
# (parallel.overlap_param_gather), GPT-2 124M at dp 2 on the threads backend, the two ranks on
# nodes of their own over simulated links (topology.simulate) of 5, 10 and 25 Gbit/s per rank.
# The references, measured in the same run: one rank alone with one rank's batch (compute
# alone) and the two ranks with free links (what sharing this host's two cores costs).
# Prints per run tokens/s, the median step, the seconds a step blocked on the parameter gathers
# (metrics.jsonl's param_gather_wait_s) and the overlapped run's speed over the blocking one's.
# Usage: [BATCH=2 SEQ=64] [LOOM=build/loom] bench/param_gather_bench.sh [steps] [gbps...]
#   BATCH x SEQ tokens per rank and step; LOOM given: that binary, nothing is built.
set -euo pipefail
steps="${1:-6}"
shift || true
rates=("$@")
[ ${#rates[@]} -gt 0 ] || rates=(5 10 25)
source "$(dirname "${BASH_SOURCE[0]}")/gpt2_ranks_common.sh"
common=(configs/gpt2-124m.yaml train.steps="$steps" train.micro_batch=$batch data.seq_len=$seq
        train.eval_interval=0 checkpoint.interval=0 log.progress=false parallel.bucket_mb=16)
two=(runtime.ranks=2 train.threads=2 train.global_batch=$((2 * batch)) parallel.zero=1)
run() {  # name, overrides...: prints tokens/s, the median step (s) and the median gather wait (s)
  local name="$1"; shift
  "$loom" train "${common[@]}" run.dir="$out/$name" checkpoint.dir="$out/$name/ckpt" "$@" > "$out/$name.log" 2>&1
  local step wait_s ranks
  step=$(field "$out/$name" step_time_s | median)
  wait_s=$(field "$out/$name" param_gather_wait_s | median)
  ranks=$(grep -o 'runtime.ranks=[0-9]*' <<< "$*" | cut -d= -f2 || true)
  awk -v s="$step" -v w="${wait_s:-0}" -v r="${ranks:-1}" -v b=$batch -v t=$seq \
      'BEGIN {printf "%.1f %.3f %.3f", r * b * t / s, s, w}'
}
show() {
  awk -v name="$1" '{printf "%-34s %7.1f tok/s  step %.3f s  waiting for gathers %.3f s\n", name, $1, $2, $3}' <<< "$2"
}
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
one=$(run one-rank runtime.ranks=1 train.threads=1 train.global_batch=$batch)
show "1 rank (compute alone)" "$one"
free=$(run free-links "${two[@]}")
show "dp 2, zero 1, free links" "$free"
free_overlap=$(run free-links-overlap "${two[@]}" parallel.overlap_param_gather=true)
show "dp 2, zero 1, free links, overlap" "$free_overlap"
for gbps in "${rates[@]}"; do
  links=(topology.simulate=true topology.ranks_per_node=1 topology.nodes_per_site=2
         topology.site_bandwidth_gbps="$gbps" topology.site_latency_us=5)
  blocking=$(run "blocking-$gbps" "${two[@]}" "${links[@]}")
  show "dp 2, zero 1, $gbps Gbit/s, blocking" "$blocking"
  overlapped=$(run "overlapped-$gbps" "${two[@]}" "${links[@]}" parallel.overlap_param_gather=true)
  show "dp 2, zero 1, $gbps Gbit/s, overlapped" "$overlapped"
  awk -v b="${blocking%% *}" -v o="${overlapped%% *}" -v f="${free%% *}" -v g="$gbps" \
      'BEGIN {printf "  %s Gbit/s: overlapped / blocking %.3f; of free links: blocking %.1f%%, overlapped %.1f%%\n",
              g, o / b, 100 * b / f, 100 * o / f}'
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
