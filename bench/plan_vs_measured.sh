#!/usr/bin/env bash
# Planned memory and step time (loom plan memory / time) against measured training runs on this
# host, one row per layout. Calibrates the host first (loom bench hardware), then trains each
# layout for a few steps and reads the run's own "memory: planned ... measured ..." line and the
# median step time of the steps after the first (metrics.jsonl).
#   usage: bench/plan_vs_measured.sh [LOOM=build/loom] [STEPS=8]
# Needs data/byte/corpus (loom data prepare .cache/data/corpus --tokenizer byte --output data/byte/corpus).
set -euo pipefail
LOOM=${1:-build/loom}
STEPS=${2:-8}
WORK=$(mktemp -d /tmp/plan-vs-measured.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
HW="$WORK/host.yaml"
"$LOOM" bench hardware --output "$HW" >&2
# A small step (8 sequences of 128 bytes) keeps each run short on 2 shared cores.
BASE=(configs/tiny.yaml data.seq_len=128 train.global_batch=8 train.micro_batch=4 train.eval_interval=0
      checkpoint.interval=0 log.progress=false "train.steps=$STEPS")
# One thread per rank (threads_per_rank = train.threads / ranks) unless a layout sets train.threads:
# the host file is per core, with the speed-ups of one process on every processor
# (train.threads=0: the processors over the ranks).
LAYOUTS=(
  "runtime.ranks=1"
  "runtime.ranks=1 train.threads=0"
  "runtime.ranks=1 precision.recipe=bf16 train.threads=0"
  "runtime.ranks=1 model.recompute=true"
  "runtime.ranks=1 precision.recipe=bf16"
  "runtime.ranks=1 precision.recipe=bf16 precision.param_dtype=compute"
  "runtime.ranks=1 precision.recipe=fp8_delayed"
  "runtime.ranks=2 parallel.zero=0"
  "runtime.ranks=2 parallel.zero=1"
  "runtime.ranks=2 parallel.zero=2"
  "runtime.ranks=2 parallel.zero=3"
  "runtime.ranks=2 parallel.zero=1 precision.recipe=bf16 precision.param_dtype=compute"
  "runtime.ranks=2 parallel.zero=3 model.recompute=true"
  "runtime.ranks=2 parallel.tp=2"
  "runtime.ranks=2 parallel.tp=2 parallel.sequence_parallel=true"
  "runtime.ranks=2 parallel.pp=2 train.micro_batch=2"
  "runtime.ranks=2 parallel.pp=2 train.micro_batch=2 parallel.pipeline_schedule=gpipe"
  "runtime.ranks=2 parallel.pp=2 train.micro_batch=2 parallel.pipeline_schedule=interleaved parallel.virtual_stages=3"
  "runtime.ranks=4 parallel.tp=2 parallel.zero=1 train.micro_batch=2"
  "runtime.ranks=4 parallel.pp=2 train.micro_batch=2"
)
echo "| layout | planned memory | measured memory | planned / measured | planned step | measured step | planned / measured |"
echo "|---|---:|---:|---:|---:|---:|---:|"
i=0
for layout in "${LAYOUTS[@]}"; do
  i=$((i + 1))
  # shellcheck disable=SC2206
  extra=($layout)
  ranks=$(grep -o 'runtime.ranks=[0-9]*' <<<"$layout" | cut -d= -f2)
  grep -q 'train.threads=' <<<"$layout" || extra+=("train.threads=$ranks")
  planned_s=$("$LOOM" plan time "${BASE[@]}" "${extra[@]}" --hardware "$HW" --json |
              python3 -c 'import json,sys; print(json.load(sys.stdin)["time"]["step_s"])')
  out=$("$LOOM" train "${BASE[@]}" "${extra[@]}" "run.dir=$WORK/run$i" 2>&1)
  line=$(grep '^memory: planned' <<<"$out")
  python3 - "$layout" "$planned_s" "$line" "$WORK/run$i/metrics.jsonl" <<'PY'
import json, re, statistics, sys
layout, planned_s, line, metrics = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
def mib(text):
    value, unit = text.split()
    return float(value) * {"KiB": 1 / 1024, "MiB": 1, "GiB": 1024}[unit]
planned = mib(re.search(r"planned ([\d.]+ \w+)", line).group(1))
measured = mib(re.search(r"measured ([\d.]+ \w+)", line).group(1))
steps = [json.loads(l) for l in open(metrics) if l.strip()]
step = statistics.median(r["step_time_s"] for r in steps if r["step"] > 1)
print(f"| {layout} | {planned:.1f} MiB | {measured:.1f} MiB | {planned / measured:.2f} | "
      f"{planned_s * 1e3:.0f} ms | {step * 1e3:.0f} ms | {planned_s / step:.2f} |")
PY
done
