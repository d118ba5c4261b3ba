#!/usr/bin/env bash
# The GRPO demo of docs/grpo.md, end to end: pre-trains the embedded default (configs/tiny.yaml)
# and fine-tunes it on 2-digit arithmetic chat (configs/tiny-sft.yaml), as bench/sft_demo.sh does
# (both reused when already there), then trains it with GRPO on the 1-digit arithmetic environment
# (configs/tiny-grpo.yaml), measures the greedy exact match (= the environment's reward) of
# held-out prompts every EVAL_EVERY steps, plots it (docs/grpo_reward.png), and runs the same GRPO
# twice more, back to back, with grpo.max_staleness 0 and 1: wall time per step and held-out
# reward gained per wall-clock minute.
#   bash bench/grpo_demo.sh [LOOM] [GRPO_STEPS] [PAIR_STEPS]
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
loom="${1:-build/loom}"
grpo_steps="${2:-40}"
pair_steps="${3:-10}"
eval_every="${EVAL_EVERY:-10}"
out="${OUT:-runs/grpo-demo}"
threads="${THREADS:-2}"
[ -x "$loom" ] || { echo "no loom binary at $loom (build it: cmake --build build --target loom)" >&2; exit 1; }
mkdir -p "$out" data/sft
load() { cut -d' ' -f1-3 /proc/loadavg; }
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; load average $(load)"
if [ ! -f data/byte/corpus_train.idx ]; then
  "$loom" data prepare .cache/data/corpus --tokenizer byte --output data/byte/corpus --val-fraction 0.02
fi
# 1. Pre-training (resumes or finds complete a run already there), then SFT as in docs/sft.md.
"$loom" train configs/tiny.yaml run.dir="$out/pre" train.resume=true train.steps=300 \
  train.threads="$threads" log.progress=false > "$out/pre.log" 2>&1
[ -f data/sft/arithmetic.jsonl ] ||
  "$loom" data synth --task arithmetic --digits 2 --count 20000 --output data/sft/arithmetic.jsonl
if [ ! -f "$out/sft/checkpoints/latest" ]; then
  "$loom" sft configs/tiny-sft.yaml run.dir="$out/sft" run.overwrite=true train.init_from="$out/pre/checkpoints" \
    train.steps=400 train.threads="$threads" log.progress=false train.eval_interval=50 checkpoint.interval=0 \
    > "$out/sft.log" 2>&1
fi
echo "SFT'd: $(cat "$out/sft/checkpoints/latest")"
# 2. Held-out prompts: environment indices from 1000000 on (GRPO samples indices 0, 1, 2, ...),
#    1-digit (the GRPO task) and 2-digit (the SFT task, without its training prompts).
"$loom" data synth --task arithmetic --digits 1 --count 200 --first 1000000 --output "$out/heldout1.jsonl"
"$loom" data synth --task arithmetic --digits 2 --count 400 --first 1000000 --output "$out/heldout2_all.jsonl"
python3 - "$out" "$grpo_steps" <<'PY'
import json, subprocess, sys
out, steps = sys.argv[1], int(sys.argv[2])
prompt = lambda line: json.loads(line)["messages"][0]["content"]
seen = {prompt(l) for l in open("data/sft/arithmetic.jsonl") if l.strip()}
kept = [l for l in open(f"{out}/heldout2_all.jsonl") if l.strip() and prompt(l) not in seen][:200]
open(f"{out}/heldout2.jsonl", "w").writelines(kept)
held = {prompt(l) for l in open(f"{out}/heldout1.jsonl") if l.strip()}
print(f"held out: 200 1-digit prompts ({len(held)} distinct), {len(kept)} 2-digit prompts not in the SFT file")
PY
# Greedy exact match of a checkpoint on a held-out file: prints the fraction.
accuracy() { "$loom" eval tasks "$1" "$2" --max-tokens 16 | tail -n 1 | sed 's/.*= \([0-9.]*\)%.*/\1/'; }
# 3. GRPO: every step's weights are kept (checkpoint.keep) and evaluated afterwards.
grpo=(configs/tiny-grpo.yaml train.init_from="$out/sft/checkpoints" train.threads="$threads" run.overwrite=true)
echo "GRPO: $grpo_steps steps, load average $(load)"
last="$out/grpo/learner/checkpoints/$(printf 'step-%08d' "$grpo_steps")"
if [ ! -d "$last" ]; then   # reused when complete
  start=$(date +%s.%N)
  "$loom" grpo "${grpo[@]}" run.dir="$out/grpo" train.steps="$grpo_steps" > "$out/grpo.log" 2>&1
  echo "GRPO took $(python3 -c "print(f'{$(date +%s.%N) - $start:.0f}')") s, load average $(load)"
fi
: > "$out/evals.jsonl"
for step in $(seq 0 "$eval_every" "$grpo_steps"); do
  ckpt="$out/sft/checkpoints"
  [ "$step" = 0 ] || ckpt="$out/grpo/learner/checkpoints/$(printf 'step-%08d' "$step")"
  echo "{\"step\": $step, \"heldout_reward\": $(python3 -c "print($(accuracy "$ckpt" "$out/heldout1.jsonl") / 100)")}" |
    tee -a "$out/evals.jsonl"
done
# The SFT task (2-digit, not trained by GRPO) before and after: what GRPO on 1-digit did to it.
echo "2-digit held-out exact match: $(accuracy "$out/sft/checkpoints" "$out/heldout2.jsonl")% before GRPO," \
  "$(accuracy "$last" "$out/heldout2.jsonl")% after $grpo_steps steps"
bash bench/with_matplotlib.sh bench/plot_metrics.py docs/grpo_reward.png \
  "GRPO of the SFT'd tiny model on 1-digit arithmetic (2 cores)" heldout_reward,reward_mean \
  "held-out, greedy=$out/evals.jsonl" "training samples, temperature 0.8=$out/grpo"
# 4. Synchronous against asynchronous: the same run, back to back, pair_steps steps each.
for k in 0 1; do
  start=$(date +%s.%N)
  "$loom" grpo "${grpo[@]}" run.dir="$out/k$k" train.steps="$pair_steps" grpo.max_staleness=$k \
    checkpoint.keep=2 > "$out/k$k.log" 2>&1
  wall=$(python3 -c "print($(date +%s.%N) - $start)")
  after=$(accuracy "$out/k$k/learner/checkpoints" "$out/heldout1.jsonl")
  python3 - "$out" "$k" "$wall" "$after" "$pair_steps" "$(load)" <<'PY'
import json, sys
out, k, wall, after, steps, load = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]) / 100, int(sys.argv[5]), sys.argv[6]
before = next(json.loads(l) for l in open(f"{out}/evals.jsonl"))["heldout_reward"]
rows = [json.loads(l) for l in open(f"{out}/k{k}/metrics.jsonl") if l.strip()]
mean = lambda key, rs: sum(r[key] for r in rs) / len(rs)
loop = [r["learner_wait_s"] + r["learner_s"] + r["refit_s"] for r in rows[1:]]
stale = {}
for r in rows:
    for age, n in r["staleness"].items():
        stale[age] = stale.get(age, 0) + n
print(f"max_staleness={k}: {wall:.1f} s for {steps} steps ({wall / steps:.2f} s/step with start-up; "
      f"{sum(loop) / len(loop):.2f} s/step over steps 1-{steps - 1}: learner waited {mean('learner_wait_s', rows[1:]):.2f}, "
      f"learner {mean('learner_s', rows[1:]):.2f}, refit {mean('refit_s', rows[1:]):.3f}); "
      f"staleness {stale}; training reward {mean('reward_mean', rows[:5]):.3f} (steps 0-4) -> "
      f"{mean('reward_mean', rows[-5:]):.3f} (last 5); held-out {before:.3f} -> {after:.3f}: "
      f"{(after - before) / (wall / 60):+.4f} per wall-clock minute; load average {load}")
PY
done
