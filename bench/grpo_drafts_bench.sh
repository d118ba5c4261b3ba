#!/usr/bin/env bash
# Speculative decoding in GRPO's generation workers, with and without the depths' draft loss
# (docs/grpo.md, grpo.mtp_loss_weight): pre-trains the embedded default with 2 multi-token
# prediction depths (configs/tiny.yaml, model.mtp_depths=2) and fine-tunes it on 2-digit
# arithmetic chat (configs/tiny-sft.yaml; the depths train along, as in pre-training), both reused
# when already there, then runs the GRPO demo's configuration (configs/tiny-grpo.yaml) with
# workers drafting 2 tokens a step, twice back to back: grpo.mtp_loss_weight 0 (the depths keep
# their SFT weights) and WEIGHT (the learner trains them on the rollouts, apart from the policy).
# Prints, per window of 10 steps, the workers' acceptance rate and tokens per verification (the
# metrics rows' spec_decode), the training reward, the gradient norm and generation tokens/s.
#   bash bench/grpo_drafts_bench.sh [LOOM] [GRPO_STEPS]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/demo_common.sh"
steps="${2:-40}"
weight="${WEIGHT:-0.3}"
out="${OUT:-runs/grpo-drafts}"
depths=(model.mtp_depths=2 model.mtp_loss_weight=0.3)
tiny_sft "$out" "${depths[@]}"
for w in 0 "$weight"; do
  echo "GRPO: $steps steps, grpo.mtp_loss_weight=$w, load average $(load)"
  start=$(date +%s.%N)
  "$loom" grpo configs/tiny-grpo.yaml "${depths[@]}" train.init_from="$out/sft/checkpoints" \
    train.threads="$threads" run.overwrite=true run.dir="$out/grpo-w$w" train.steps="$steps" \
    grpo.validation_prompts=0 grpo.worker_speculative_tokens=2 grpo.mtp_loss_weight="$w" > "$out/grpo-w$w.log" 2>&1
  echo "took $(python3 -c "print(f'{$(date +%s.%N) - $start:.0f}')") s, load average $(load)"
done
python3 - "$out" 0 "$weight" <<'PY'
import json, sys
out, weights = sys.argv[1], sys.argv[2:]
for w in weights:
    rows = [json.loads(l) for l in open(f"{out}/grpo-w{w}/metrics.jsonl") if l.strip()]
    print(f"grpo.mtp_loss_weight={w}")
    for first in range(0, len(rows), 10):
        part = rows[first:first + 10]
        spec = [r["spec_decode"] for r in part]
        drafted = sum(s["draft_tokens"] for s in spec)
        kept = sum(s["accepted_tokens"] for s in spec)
        drafts = sum(s["drafts"] for s in spec)
        depth = [r["learner"].get("mtp_loss_2") for r in part if "mtp_loss_2" in r["learner"]]
        mean = lambda xs: sum(xs) / len(xs)
        line = (f"  steps {first:3d}-{first + len(part) - 1:3d}: acceptance {kept / drafted:.3f} "
                f"({kept:.0f} of {drafted:.0f}), tokens per verification {1 + kept / drafts:.2f}, "
                f"training reward {mean([r['reward_mean'] for r in part]):.3f}, "
                f"grad norm {mean([r['learner']['grad_norm'] for r in part]):.3f}, "
                f"generation {mean([r['generation_tokens_per_s'] for r in part]):.0f} tok/s")
        if depth:
            line += f", depth-2 loss {mean(depth):.3f}"
        print(line)
PY
