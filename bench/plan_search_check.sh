#!/usr/bin/env bash
# Does `loom plan search` pick a layout whose measured step time is close to the best measured?
# Ranks every layout of CONFIG on N ranks with a hardware file of this host (loom bench
# hardware), then trains a spread of them for a few steps (per layout shape — tp, sequence
# parallelism, pp x virtual stages, dp, ZeRO stage, recompute — the micro-batch size the search
# ranks best, at most MAX shapes, the search's pick always among them) and prints predicted and
# measured step times (the median of steps 2-6) and how far the pick is from the best measured.
#   usage: bench/plan_search_check.sh RANKS [MAX=16] [LOOM=build/loom] [CONFIG overrides...]
set -euo pipefail
RANKS=$1
MAX=${2:-16}
LOOM=${3:-build/loom}
shift $(( $# < 3 ? $# : 3 ))
CONFIG=("$@")
[ ${#CONFIG[@]} -eq 0 ] && CONFIG=(configs/tiny.yaml data.seq_len=128 train.global_batch=8)
WORK=$(mktemp -d /tmp/plan-search-check.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
"$LOOM" bench hardware --output "$WORK/host.yaml" >&2
"$LOOM" plan search "${CONFIG[@]}" --hardware "$WORK/host.yaml" --devices "$RANKS" --top 100000 --json > "$WORK/ranked.json"
python3 - "$WORK/ranked.json" "$MAX" > "$WORK/layouts.txt" <<'PY'
import json, sys
ranked = json.load(open(sys.argv[1]))["ranked"]
limit = int(sys.argv[2])
shapes = {}
for i, c in enumerate(ranked):
    shape = tuple(o for o in c["overrides"] if not o.startswith("train.micro_batch"))
    shapes.setdefault(shape, (i, c))
chosen = list(shapes.values())
# The pick, then an even spread over the ranking.
step = max(1, len(chosen) // max(1, limit - 1))
picked = [chosen[0]] + chosen[1::step][: limit - 1]
for i, c in picked:
    print(i + 1, c["time"]["step_s"], " ".join(c["overrides"]))
PY
echo "| search rank | layout | predicted step | measured step |"
echo "|---:|---|---:|---:|"
while read -r rank predicted overrides; do
  # shellcheck disable=SC2086
  out=$("$LOOM" train "${CONFIG[@]}" $overrides "runtime.ranks=$RANKS" "train.threads=$RANKS" train.steps=6 \
        train.eval_interval=0 checkpoint.interval=0 log.progress=false "run.dir=$WORK/run$rank" 2>&1) || {
    echo "| $rank | $overrides | failed: $(tail -1 <<<"$out") | |"; continue; }
  # The median step after the first (metrics.jsonl).
  measured=$(python3 -c 'import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(statistics.median(r["step_time_s"] for r in rows if r["step"] > 1))' "$WORK/run$rank/metrics.jsonl")
  printf '| %s | %s | %.0f ms | %.0f ms |\n' "$rank" "$overrides" "$(python3 -c "print($predicted*1e3)")" \
    "$(python3 -c "print($measured*1e3)")"
  echo "$rank $measured" >> "$WORK/measured.txt"
done < "$WORK/layouts.txt"
python3 - "$WORK/measured.txt" <<'PY'
import sys
rows = [l.split() for l in open(sys.argv[1])]
pick = next(float(m) for r, m in rows if r == "1")
best = min(float(m) for _, m in rows)
print(f"\nsearch's pick measured {pick * 1e3:.0f} ms; best of {len(rows)} measured {best * 1e3:.0f} ms; "
      f"pick / best = {pick / best:.2f}")
PY
