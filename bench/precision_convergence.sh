#!/usr/bin/env bash
# Mixed-precision convergence: trains the embedded default (configs/tiny.yaml, 300 steps) once per
# precision recipe, evaluating every EVAL_INTERVAL steps, then compares each recipe's final
# validation loss with fp32's and plots the loss curves (docs/precision_curves.png).
#
#   bash bench/precision_convergence.sh [loom binary (default build/loom)]
#
# Environment: OUT (runs/precision), THREADS (train.threads, default 1: the runs leave the
# other core to other work), EVAL_INTERVAL (25), RECIPES (all seven), STEPS (300), ATTENTION
# (precision.attention, default auto), PLOT (docs/precision_curves.png). A recipe whose run
# already finished (its metrics.jsonl has the last step) is not rerun; delete its directory to
# redo it. Results go to $OUT/summary.md.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
loom="${1:-build/loom}"
out="${OUT:-runs/precision}"
threads="${THREADS:-1}"
eval_interval="${EVAL_INTERVAL:-25}"
steps="${STEPS:-300}"
plot="${PLOT:-docs/precision_curves.png}"
attention="${ATTENTION:-auto}"
recipes=(${RECIPES:-fp32 bf16 fp16 fp8_delayed fp8_current fp8_blockwise mxfp8})

[ -x "$loom" ] || { echo "no loom binary at $loom (build it: cmake --build build --target loom)" >&2; exit 1; }
# The data, as scripts/run-default.sh prepares it.
if [ ! -f data/byte/corpus_train.idx ] || [ ! -f data/byte/corpus_val.idx ]; then
  [ -d .cache/data/corpus ] || scripts/setup.sh
  "$loom" data prepare .cache/data/corpus --tokenizer byte --output data/byte/corpus --val-fraction 0.02
fi
# matplotlib only for the plot (not a build or CI dependency): the python bench/with_matplotlib.sh finds.
py="$(bash bench/with_matplotlib.sh -c 'import sys; print(sys.executable)')"

mkdir -p "$out"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$out/machine.txt"
for recipe in "${recipes[@]}"; do
  dir="$out/$recipe"
  if [ -f "$dir/metrics.jsonl" ] && grep -q "\"step\":$steps[,}]" "$dir/metrics.jsonl"; then
    echo "== $recipe: already done"
    continue
  fi
  rm -rf "$dir"
  echo "== $recipe ($(date -u +%H:%M:%S) UTC, load $(cut -d' ' -f1 /proc/loadavg))"
  start=$(date +%s)
  "$loom" train configs/tiny.yaml run.dir="$dir" precision.recipe="$recipe" precision.attention="$attention" \
    train.steps="$steps" \
    train.threads="$threads" train.eval_interval="$eval_interval" log.progress=false log.interval=50 \
    > "$dir.log" 2>&1 || { echo "$recipe failed, see $dir.log" >&2; exit 1; }
  echo "   $(( $(date +%s) - start )) s; $(tail -n 2 "$dir.log" | head -n 1)"
done

"$py" - "$out" "$plot" "${recipes[@]}" <<'EOF'
import json, os, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import matplotlib.ticker

out, plot, recipes = sys.argv[1], sys.argv[2], sys.argv[3:]
runs = {}
for r in recipes:
    rows = [json.loads(l) for l in open(os.path.join(out, r, "metrics.jsonl")) if l.strip()]
    runs[r] = rows

def val_curve(rows):
    return [(x["step"], x["val_loss"]) for x in rows if "val_loss" in x]

final = {r: val_curve(rows)[-1][1] for r, rows in runs.items()}
ref = final.get("fp32")
lines = ["| recipe | final val loss | vs fp32 | bound | skipped steps | final loss scale |",
         "|---|---:|---:|---:|---:|---:|"]
for r in recipes:
    rows = runs[r]
    skipped = sum(1 for x in rows if x.get("skipped"))
    scale = rows[-1].get("loss_scale")
    rel = (final[r] - ref) / ref if ref else float("nan")
    bound = "" if r == "fp32" else ("2%" if r in ("bf16", "fp16") else "5%")
    ok = "" if r == "fp32" else (" ok" if abs(rel) <= (0.02 if r in ("bf16", "fp16") else 0.05) else " OVER")
    lines.append(f"| {r} | {final[r]:.4f} | {rel * 100:+.2f}%{ok} | {bound} | {skipped} | "
                 f"{'' if scale is None else f'{scale:g}'} |")
table = "\n".join(lines)
print(table)
with open(os.path.join(out, "summary.md"), "w") as f:
    f.write(table + "\n")

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
for r in recipes:
    rows = runs[r]
    steps = [x["step"] for x in rows]
    loss = [x["loss"] for x in rows]
    # Training loss, mean over a window of 10 steps (one global batch of 16 x 256 bytes each).
    w = 10
    smooth = [sum(loss[max(0, i - w + 1):i + 1]) / (i + 1 - max(0, i - w + 1)) for i in range(len(loss))]
    ax1.plot(steps, smooth, label=r, linewidth=1.2)
    vs, vl = zip(*val_curve(rows))
    ax2.plot(vs, vl, marker="o", markersize=3, label=f"{r} ({final[r]:.3f})", linewidth=1.2)
ax1.set_title("training loss (mean of 10 steps)")
ax2.set_title("validation loss")
for ax in (ax1, ax2):
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/byte)")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%.1f"))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
fig.suptitle("configs/tiny.yaml, 300 steps, by precision.recipe")
fig.tight_layout()
os.makedirs(os.path.dirname(plot) or ".", exist_ok=True)
fig.savefig(plot, dpi=110)
print("wrote", plot)
EOF
