#!/usr/bin/env bash
# ZeRO-1's parameter all-gather waited for in the update against overlapped with the next forward
# (parallel.overlap_param_gather) over a real network stack: two hosts, each a Linux network
# namespace with a hostname of its own, joined by a veth pair shaped with `tc tbf` to RATE both
# ways, GPT-2 124M at dp 2 under mpirun over Open MPI's TCP transport (the MPI backend, its
# collectives progressed by each group's communication thread). The reference in the same run:
# the same two ranks over an unshaped veth pair. bench/param_gather_bench.sh measures the same
# over the threads backend's simulated links (no kernel network stack in the way).
# Prints per run tokens/s, the median step and param_gather_wait_s, and overlapped over waited.
# Usage (as root): [BATCH=2 SEQ=64] [LOOM=build/loom] bench/param_gather_netns_bench.sh [steps] [rates...]
#   rates as tc writes them (default 2gbit 5gbit); LOOM given: that binary, nothing is built.
set -euo pipefail
steps="${1:-8}"
shift || true
rates=("$@")
[ ${#rates[@]} -gt 0 ] || rates=(2gbit 5gbit)
source "$(dirname "${BASH_SOURCE[0]}")/gpt2_ranks_common.sh"
[ "$(id -u)" -eq 0 ] || { echo "network namespaces need root" >&2; exit 1; }
mpiexec="$(command -v mpiexec)"
tag="pg$$"
namespaces=()
cleanup() {
  local ns
  for ns in "${namespaces[@]}"; do ip netns del "$ns" 2> /dev/null || true; done
  rm -rf "$out"
}
trap cleanup EXIT
# Host h = 0, 1 at 10.202.0.(h + 1), joined by one veth pair.
hosts=(10.202.0.1 10.202.0.2) host_ns=("${tag}h0" "${tag}h1")
for h in 0 1; do
  ip netns add "${host_ns[$h]}"
  namespaces+=("${host_ns[$h]}")
  ip -n "${host_ns[$h]}" link set lo up
done
ip link add "${tag}v0" type veth peer name "${tag}v1"
for h in 0 1; do
  ip link set "${tag}v$h" netns "${host_ns[$h]}"
  ip -n "${host_ns[$h]}" addr add "${hosts[$h]}/24" dev "${tag}v$h"
  ip -n "${host_ns[$h]}" link set "${tag}v$h" up
done
shape() {  # RATE or "none": the veth pair's qdisc, both ways
  local h
  for h in 0 1; do
    ip netns exec "${host_ns[$h]}" tc qdisc del dev "${tag}v$h" root 2> /dev/null || true
    [ "$1" = none ] ||
      ip netns exec "${host_ns[$h]}" tc qdisc add dev "${tag}v$h" root tbf rate "$1" burst 1mb latency 50ms
  done
}
# Open MPI's launch agent (called like ssh: agent HOST COMMAND...) runs the command in HOST's
# namespace under the namespace's name as hostname, so that each namespace is a node to MPI.
agent="$out/netns_agent.sh"
cat > "$agent" <<AGENT
#!/usr/bin/env bash
host="\$1"; shift
case "\$host" in
  ${hosts[0]}) ns=${host_ns[0]} ;;
  ${hosts[1]}) ns=${host_ns[1]} ;;
  *) echo "unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec "\$ns" unshare --uts sh -c "hostname \$ns; \$*"
AGENT
chmod +x "$agent"
mpi=(--allow-run-as-root --oversubscribe -np 2 --host "${hosts[0]}:1,${hosts[1]}:1" --mca plm_rsh_agent "$agent"
     --mca plm_rsh_no_tree_spawn 1 --mca btl tcp,self --mca btl_tcp_if_include 10.202.0.0/24
     --mca oob_tcp_if_include 10.202.0.0/24 -x PATH -x OMP_WAIT_POLICY)
common=(configs/gpt2-124m.yaml train.steps="$steps" train.micro_batch=$batch data.seq_len=$seq train.threads=1
        train.global_batch=$((2 * batch)) train.eval_interval=0 checkpoint.interval=0 log.progress=false
        parallel.bucket_mb=16 parallel.zero=1 runtime.backend=mpi)
run() {  # name, overrides...: prints tokens/s, the median step (s) and the median gather wait (s)
  local name="$1"; shift
  ip netns exec "${host_ns[0]}" unshare --uts sh -c "hostname ${host_ns[0]}; exec \"\$0\" \"\$@\"" \
    "$mpiexec" "${mpi[@]}" "$(realpath "$loom")" train "${common[@]}" run.dir="$out/$name" \
    checkpoint.dir="$out/$name/ckpt" "$@" > "$out/$name.log" 2>&1 || { cat "$out/$name.log"; exit 1; }
  local step wait_s
  step=$(field "$out/$name" step_time_s | median)
  wait_s=$(field "$out/$name" param_gather_wait_s | median)
  awk -v s="$step" -v w="$wait_s" -v b=$batch -v t=$seq 'BEGIN {printf "%.1f %.3f %.3f", 2 * b * t / s, s, w}'
}
show() {
  awk -v name="$1" '{printf "%-36s %7.1f tok/s  step %.3f s  waiting for gathers %.3f s\n", name, $1, $2, $3}' <<< "$2"
}
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
shape none
free=$(run free)
show "dp 2 over veth, unshaped, waited" "$free"
show "dp 2 over veth, unshaped, overlapped" "$(run free-overlap parallel.overlap_param_gather=true)"
for rate in "${rates[@]}"; do
  shape "$rate"
  blocking=$(run "blocking-$rate")
  show "dp 2 over veth, tbf $rate, waited" "$blocking"
  overlapped=$(run "overlapped-$rate" parallel.overlap_param_gather=true)
  show "dp 2 over veth, tbf $rate, overlapped" "$overlapped"
  awk -v b="${blocking%% *}" -v o="${overlapped%% *}" -v f="${free%% *}" -v r="$rate" \
      'BEGIN {printf "  %s: overlapped / waited %.3f; of the unshaped run: waited %.1f%%, overlapped %.1f%%\n",
              r, o / b, 100 * b / f, 100 * o / f}'
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
