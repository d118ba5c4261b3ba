#!/usr/bin/env bash
# Training across two sites on the threads backend with simulated links (topology.simulate):
# scaling efficiency = tokens/s of 2 sites x 1 rank / (2 x tokens/s of 1 site x 1 rank), same
# per-rank batch, GPT-2 124M, for a cross-site round trip of 1, 10, 21, 50 and 100 ms at
# 100 Gbit/s per rank, with the hierarchical path (parallel.dp_sites auto from the topology)
# and the flat all-reduce over the same links (parallel.dp_sites=1). A third reference: the two
# ranks with free links (topology.simulate=false), which separates the cost of the links from
# that of sharing two cores.
# Usage: [BATCH=2 SEQ=64] [LOOM=build/loom] bench/multisite_bench.sh [steps] [latencies_ms...]
#   BATCH x SEQ tokens per rank and step; LOOM given: that binary, nothing is built.
set -euo pipefail
steps="${1:-4}"
shift || true
latencies=("$@")
[ ${#latencies[@]} -gt 0 ] || latencies=(1 10 21 50 100)
source "$(dirname "${BASH_SOURCE[0]}")/gpt2_ranks_common.sh"
common=(configs/gpt2-124m.yaml train.steps="$steps" train.micro_batch=$batch data.seq_len=$seq
        train.eval_interval=0 checkpoint.interval=0 log.progress=false parallel.bucket_mb=16)
run() {  # name, overrides...: prints tokens/s (median step after the first) and, across sites, the wait
  local name="$1"; shift
  "$loom" train "${common[@]}" run.dir="$out/$name" checkpoint.dir="$out/$name/ckpt" "$@" > "$out/$name.log" 2>&1
  local step ranks
  step=$(field "$out/$name" step_time_s | median)
  ranks=$(grep -o 'runtime.ranks=[0-9]*' <<< "$*" | cut -d= -f2 || true)
  awk -v s="$step" -v r="${ranks:-1}" -v b=$batch -v t=$seq 'BEGIN {printf "%.1f %.3f", r * b * t / s, s}'
}
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
one=$(run one-site runtime.ranks=1 train.threads=1 train.global_batch=$batch)
echo "1 site x 1 rank: tokens/s step_s = $one"
# Two independent 1-site runs at once: each site's rank on a core of its own, sharing the host's
# memory system as the two ranks of a 2-site run do here (on real sites each has its own).
run pair-a runtime.ranks=1 train.threads=1 train.global_batch=$batch > "$out/pair-a.txt" &
run pair-b runtime.ranks=1 train.threads=1 train.global_batch=$batch > "$out/pair-b.txt"
wait
pair=$(awk '{s += $1} END {printf "%.1f", s / 2}' "$out/pair-a.txt" "$out/pair-b.txt")
echo "1 site x 1 rank, two independent runs at once: tokens/s each = $pair"
two=(runtime.ranks=2 train.threads=2 train.global_batch=$((2 * batch)))
free=$(run free-links "${two[@]}" parallel.dp_sites=2)
echo "2 sites x 1 rank, free links: tokens/s step_s = $free"
links=(topology.simulate=true topology.ranks_per_node=1 topology.nodes_per_site=1 topology.cross_site_bandwidth_gbps=100)
for ms in "${latencies[@]}"; do
  one_way=$(awk -v m="$ms" 'BEGIN {print m * 500}')
  hier=$(run "hier-$ms" "${two[@]}" "${links[@]}" topology.cross_site_latency_us="$one_way")
  wait_s=$(field "$out/hier-$ms" cross_site_wait_s | median)
  flat=$(run "flat-$ms" "${two[@]}" "${links[@]}" topology.cross_site_latency_us="$one_way" parallel.dp_sites=1)
  awk -v ms="$ms" -v one="${one%% *}" -v pair="$pair" -v free="${free%% *}" -v h="${hier%% *}" -v hs="${hier##* }" \
      -v f="${flat%% *}" -v w="$wait_s" \
    'BEGIN {printf "rtt %3d ms: hierarchical %.1f tok/s, step %.2f s, blocked on communication %.3f s (%.1f%% of the step not blocked), efficiency %.1f%% (vs two 1-site runs at once %.1f%%, vs free links %.1f%%); flat %.1f tok/s, efficiency %.1f%% (vs two at once %.1f%%, vs free links %.1f%%)\n",
            ms, h, hs, w, 100 * (1 - w / hs), 100 * h / (2 * one), 100 * h / (2 * pair), 100 * h / free, f, 100 * f / (2 * one), 100 * f / (2 * pair), 100 * f / free}'
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
