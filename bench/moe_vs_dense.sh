#!/usr/bin/env bash
# Dense against MoE at the same active parameters: trains the embedded default
# (configs/tiny.yaml) and its mixture-of-experts variant (configs/tiny-moe.yaml) on the same data,
# steps and schedule, one after the other, then tabulates the validation losses and plots both
# curves (docs/moe_vs_dense.png).
#
#   bash bench/moe_vs_dense.sh [loom binary (default build/loom)]
#
# Environment: OUT (runs/moe_vs_dense), STEPS (100), WARMUP (10), EVAL_INTERVAL (20), THREADS
# (train.threads, 1), PLOT (docs/moe_vs_dense.png), MOE_KEYS (extra keys for the MoE run only),
# RUNS ("dense moe": which to train; the table and plot need both).
# A run whose metrics.jsonl already has the last step is not rerun. Results: $OUT/summary.md.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
loom="${1:-build/loom}"
out="${OUT:-runs/moe_vs_dense}"
steps="${STEPS:-100}"
warmup="${WARMUP:-10}"
eval_interval="${EVAL_INTERVAL:-20}"
threads="${THREADS:-1}"
plot="${PLOT:-docs/moe_vs_dense.png}"

[ -x "$loom" ] || { echo "no loom binary at $loom (build it: cmake --build build --target loom)" >&2; exit 1; }
if [ ! -f data/byte/corpus_train.idx ] || [ ! -f data/byte/corpus_val.idx ]; then
  [ -d .cache/data/corpus ] || scripts/setup.sh
  "$loom" data prepare .cache/data/corpus --tokenizer byte --output data/byte/corpus
fi
# matplotlib only for the plot (Debian's python3-matplotlib, as bench/precision_convergence.sh).
py=python3
if ! "$py" -c "import matplotlib" 2>/dev/null; then
  py=/usr/bin/python3
  if ! "$py" -c "import matplotlib" 2>/dev/null; then
    sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get install -y -q python3-matplotlib >/dev/null || { $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q python3-matplotlib >/dev/null; }
  fi
fi

mkdir -p "$out"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores" | tee "$out/machine.txt"
common=(train.steps="$steps" optim.warmup_steps="$warmup" train.eval_interval="$eval_interval"
        train.threads="$threads" checkpoint.interval=0 log.progress=false log.interval=10)
for run in ${RUNS:-dense moe}; do
  dir="$out/$run"
  if [ -f "$dir/metrics.jsonl" ] && grep -q "\"step\":$steps[,}]" "$dir/metrics.jsonl"; then
    echo "== $run: already done"
    continue
  fi
  rm -rf "$dir"
  config=configs/tiny.yaml extra=()
  if [ "$run" = moe ]; then config=configs/tiny-moe.yaml; extra=(${MOE_KEYS:-}); fi
  echo "== $run ($(date -u +%H:%M:%S) UTC, load average $(cut -d' ' -f1-3 /proc/loadavg))" | tee -a "$out/machine.txt"
  start=$(date +%s)
  "$loom" train "$config" run.dir="$dir" "${common[@]}" "${extra[@]}" > "$dir.log" 2>&1 ||
    { echo "$run failed, see $dir.log" >&2; exit 1; }
  echo "   $(( $(date +%s) - start )) s, load average after $(cut -d' ' -f1-3 /proc/loadavg); $(tail -n 2 "$dir.log" | head -n 1)" |
    tee -a "$out/machine.txt"
done

for run in dense moe; do [ -f "$out/$run/metrics.jsonl" ] || { echo "no $run run yet: no table or plot"; exit 0; }; done
"$py" - "$out" "$plot" <<'EOF'
import json, os, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

out, plot = sys.argv[1], sys.argv[2]
runs = {r: [json.loads(l) for l in open(os.path.join(out, r, "metrics.jsonl")) if l.strip()] for r in ("dense", "moe")}
val = {r: [(x["step"], x["val_loss"]) for x in rows if "val_loss" in x] for r, rows in runs.items()}
steps = [s for s, _ in val["dense"]]
lines = ["| validation loss (nats/byte) | " + " | ".join(f"step {s}" for s in steps) + " |",
         "|---|" + "---:|" * len(steps)]
for r, name in (("dense", "dense (`tiny.yaml`)"), ("moe", "MoE (`tiny-moe.yaml`)")):
    lines.append(f"| {name} | " + " | ".join(f"{v:.3f}" for _, v in val[r]) + " |")
lines.append("| MoE - dense | " + " | ".join(f"{m - d:+.3f}" for (_, d), (_, m) in zip(val["dense"], val["moe"])) + " |")
busiest = [x.get("moe_tokens_per_expert_max") for x in runs["moe"] if "val_loss" in x]
lines.append("| MoE busiest (layer, expert) | " + " | ".join("-" if b is None else f"{b:.0f}" for b in busiest) + " |")
table = "\n".join(lines)
print(table)
with open(os.path.join(out, "summary.md"), "w") as f:
    f.write(table + "\n")

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
for r, rows in runs.items():
    loss = [x["loss"] for x in rows]
    w = 5
    smooth = [sum(loss[max(0, i - w + 1):i + 1]) / (i + 1 - max(0, i - w + 1)) for i in range(len(loss))]
    ax1.plot([x["step"] for x in rows], smooth, label=r, linewidth=1.2)
    vs, vl = zip(*val[r])
    ax2.plot(vs, vl, marker="o", markersize=3, label=f"{r} ({vl[-1]:.3f})", linewidth=1.2)
ax1.set_title("training loss (mean of 5 steps)")
ax2.set_title("validation loss")
for ax in (ax1, ax2):
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/byte)")
    ax.set_ylim(top=4.0)
    ax.grid(True, alpha=0.3)
    ax.legend()
fig.suptitle(f"dense vs MoE at the same active parameters (configs/tiny.yaml, configs/tiny-moe.yaml), {steps[-1]} steps")
fig.tight_layout()
os.makedirs(os.path.dirname(plot) or ".", exist_ok=True)
fig.savefig(plot, dpi=100)
print("wrote", plot)
EOF
