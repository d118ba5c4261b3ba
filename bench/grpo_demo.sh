#!/usr/bin/env bash
# The GRPO demo of docs/grpo.md, end to end: pre-trains the embedded default (configs/tiny.yaml)
# and fine-tunes it on 2-digit arithmetic chat (configs/tiny-sft.yaml), as bench/sft_demo.sh does
# (both reused when already there), then trains it with GRPO on the 1-digit arithmetic environment
# (configs/tiny-grpo.yaml), which measures the mean reward of held-out prompts every EVAL_EVERY
# steps (grpo.validation_*), plots it (docs/grpo_reward.png), and runs the same GRPO
# twice more, back to back, with grpo.max_staleness 0 and 1: wall time per step and held-out
# reward gained per wall-clock minute.
#   bash bench/grpo_demo.sh [LOOM] [GRPO_STEPS] [PAIR_STEPS]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/demo_common.sh"
grpo_steps="${2:-100}"
pair_steps="${3:-30}"
eval_every="${EVAL_EVERY:-10}"
out="${OUT:-runs/grpo-demo}"
# 1. Pre-training (resumes or finds complete a run already there), then SFT as in docs/sft.md.
tiny_sft "$out"
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
# 3. GRPO with validation (configs/tiny-grpo.yaml: 200 held-out prompts, 4 samples each at the
#    training temperature, every EVAL_EVERY steps and before the first) in RUN/validation.jsonl.
grpo=(configs/tiny-grpo.yaml train.init_from="$out/sft/checkpoints" train.threads="$threads" run.overwrite=true)
echo "GRPO: $grpo_steps steps, load average $(load)"
last="$out/grpo/learner/checkpoints/$(printf 'step-%08d' "$grpo_steps")"
if [ ! -d "$last" ]; then   # reused when complete
  start=$(date +%s.%N)
  "$loom" grpo "${grpo[@]}" run.dir="$out/grpo" train.steps="$grpo_steps" grpo.validation_interval="$eval_every" \
    > "$out/grpo.log" 2>&1
  echo "GRPO took $(python3 -c "print(f'{$(date +%s.%N) - $start:.0f}')") s, load average $(load)"
fi
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
rows = [json.loads(l) for l in open(f"{out}/grpo/validation.jsonl") if l.strip()]
with open(f"{out}/evals.jsonl", "w") as f:
    for r in rows:
        f.write(json.dumps({"step": r["weight_version"], "heldout_reward": r["reward_mean"]}) + "\n")
        print(f"step {r['weight_version']:3d}: held-out reward {r['reward_mean']:.4f} +- {r['reward_stderr']:.4f} "
              f"({r['samples']} samples of {r['prompts']} prompts, {r['truncated']} truncated, {r['seconds']:.0f} s)")
train = [json.loads(l) for l in open(f"{out}/grpo/metrics.jsonl") if l.strip()]
for first in range(0, len(train), 10):
    part = train[first:first + 10]
    zero = sum(r.get("learner", {}).get("zero_variance_groups", 0) for r in part)
    print(f"steps {first}-{first + len(part) - 1}: training reward {sum(r['reward_mean'] for r in part) / len(part):.4f}, "
          f"zero-variance groups {zero} of {sum(r['groups'] for r in part)}, "
          f"truncated {sum(r['truncated'] for r in part)} of {sum(r['samples'] for r in part)}")
PY
# Greedy exact match before and after, on the 1-digit prompts (the GRPO task: the same task
# indices as the validation) and the 2-digit ones (the SFT task, not trained by GRPO).
for file in heldout1 heldout2; do
  echo "$file greedy exact match: $(accuracy "$out/sft/checkpoints" "$out/$file.jsonl")% before GRPO," \
    "$(accuracy "$last" "$out/$file.jsonl")% after $grpo_steps steps"
done
# The validation's greedy form against `loom eval tasks` (another generation path) on the same
# 200 tasks, for the starting weights: the two exact matches must agree.
"$loom" grpo "${grpo[@]}" run.dir="$out/greedy-check" train.steps=1 grpo.validation_temperature=0 \
  grpo.validation_samples=1 checkpoint.keep=1 > "$out/greedy-check.log" 2>&1
echo "greedy validation of the SFT weights: $(head -n 1 "$out/greedy-check/validation.jsonl")"
bash bench/with_matplotlib.sh bench/plot_metrics.py docs/grpo_reward.png \
  "GRPO of the SFT'd tiny model on 1-digit arithmetic (2 cores)" heldout_reward,reward_mean \
  "held-out, 4 samples at temperature 0.8=$out/evals.jsonl" "training groups kept by dynamic sampling, temperature 0.8=$out/grpo"
# 4. Synchronous against asynchronous: the same run, back to back, pair_steps steps each, each
#    validated before its first step and after its last (the validations' time left out).
for k in 0 1; do
  start=$(date +%s.%N)
  "$loom" grpo "${grpo[@]}" run.dir="$out/k$k" train.steps="$pair_steps" grpo.max_staleness=$k \
    grpo.validation_interval="$pair_steps" checkpoint.keep=2 > "$out/k$k.log" 2>&1
  wall=$(python3 -c "print($(date +%s.%N) - $start)")
  python3 - "$out" "$k" "$wall" "$pair_steps" "$(load)" <<'PY'
import json, sys
out, k, wall, steps, load = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
rows = [json.loads(l) for l in open(f"{out}/k{k}/metrics.jsonl") if l.strip()]
vals = [json.loads(l) for l in open(f"{out}/k{k}/validation.jsonl") if l.strip()]
before, after = vals[0]["reward_mean"], vals[-1]["reward_mean"]
wall -= sum(v["seconds"] for v in vals)
mean = lambda key, rs: sum(r[key] for r in rs) / len(rs)
loop = [r["learner_wait_s"] + r["learner_s"] + r["refit_s"] for r in rows[1:]]
stale = {}
for r in rows:
    for age, n in r["staleness"].items():
        stale[age] = stale.get(age, 0) + n
print(f"max_staleness={k}: {wall:.1f} s for {steps} steps without validation ({wall / steps:.2f} s/step with start-up; "
      f"{sum(loop) / len(loop):.2f} s/step over steps 1-{steps - 1}: learner waited {mean('learner_wait_s', rows[1:]):.2f}, "
      f"learner {mean('learner_s', rows[1:]):.2f}, refit {mean('refit_s', rows[1:]):.3f}); "
      f"staleness {stale}; training reward {mean('reward_mean', rows[:5]):.3f} (steps 0-4) -> "
      f"{mean('reward_mean', rows[-5:]):.3f} (last 5); held-out {before:.3f} -> {after:.3f} "
      f"(+- {vals[-1]['reward_stderr']:.3f}): {(after - before) / (wall / 60):+.4f} per wall-clock minute; load average {load}")
PY
done
