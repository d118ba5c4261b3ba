#!/usr/bin/env bash
# The SFT demo of docs/sft.md, end to end: pre-trains the embedded default (configs/tiny.yaml),
# writes synthetic arithmetic chat and a held-out set without the training prompts, measures
# exact match before fine-tuning, fine-tunes (configs/tiny-sft.yaml), measures it after, compares
# packed with padded rows, and plots the fine-tuning loss (docs/sft_loss.png).
#   bash bench/sft_demo.sh [LOOM] [SFT_STEPS] [PRETRAIN_STEPS]
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
loom="${1:-build/loom}"
sft_steps="${2:-400}"
pretrain_steps="${3:-300}"
out="${OUT:-runs/sft-demo}"
threads="${THREADS:-2}"
[ -x "$loom" ] || { echo "no loom binary at $loom (build it: cmake --build build --target loom)" >&2; exit 1; }
mkdir -p "$out" data/sft
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg)"
if [ ! -f data/byte/corpus_train.idx ]; then
  "$loom" data prepare .cache/data/corpus --tokenizer byte --output data/byte/corpus --val-fraction 0.02
fi
# 1. Pre-training (resumes or finds complete a run already there).
"$loom" train configs/tiny.yaml run.dir="$out/pre" train.resume=true train.steps="$pretrain_steps" \
  train.threads="$threads" log.progress=false > "$out/pre.log" 2>&1
echo "pre-trained: $(tail -n 2 "$out/pre.log" | head -n 1)"
# 2. Data: training tasks, and held-out tasks whose prompts never occur in the training file.
"$loom" data synth --task arithmetic --digits 2 --count 20000 --output data/sft/arithmetic.jsonl
"$loom" data synth --task arithmetic --digits 2 --count 400 --first 1000000 --output "$out/heldout_all.jsonl"
python3 - "$out/heldout_all.jsonl" data/sft/arithmetic.jsonl "$out/heldout.jsonl" <<'PY'
import json, sys
held, train, out = sys.argv[1:]
prompt = lambda line: json.loads(line)["messages"][0]["content"]
seen = {prompt(l) for l in open(train) if l.strip()}
kept = [l for l in open(held) if l.strip() and prompt(l) not in seen]
open(out, "w").writelines(kept)
print(f"held out: {len(kept)} problems not in the training file")
PY
# 3. Exact match before fine-tuning (greedy; 16 bytes leave room for the reply and <|im_end|>).
"$loom" eval tasks "$out/pre/checkpoints" "$out/heldout.jsonl" --max-tokens 16 | tail -n 1 | sed 's/^/before: /'
# 4. Fine-tuning, packed.
common=(train.init_from="$out/pre/checkpoints" train.steps="$sft_steps" train.threads="$threads" log.progress=false
        train.eval_interval=50 checkpoint.interval=0)
"$loom" sft configs/tiny-sft.yaml run.dir="$out/packed" run.overwrite=true "${common[@]}" > "$out/packed.log" 2>&1
grep -m1 "packing efficiency" "$out/packed.log" || true
"$loom" eval tasks "$out/packed/checkpoints" "$out/heldout.jsonl" --max-tokens 16 --responses "$out/replies.jsonl" |
  tail -n 1 | sed 's/^/after: /'
# 5. Packed against padded rows: the same 20 steps, tokens/s and trained tokens per step.
for packing in true false; do
  "$loom" sft configs/tiny-sft.yaml run.dir="$out/rows-$packing" run.overwrite=true sft.packing=$packing \
    train.init_from="$out/pre/checkpoints" train.steps=20 train.threads="$threads" log.progress=false \
    train.eval_interval=0 checkpoint.interval=0 > "$out/rows-$packing.log" 2>&1
  python3 - "$out/rows-$packing/metrics.jsonl" "$packing" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()][1:]
mean = lambda k: sum(r[k] for r in rows) / len(rows)
print(f"packing={sys.argv[2]}: {mean('tokens_per_s'):.0f} slots/s, {mean('trained_tokens'):.0f} trained tokens per step")
PY
done
# 6. The loss curve.
bash bench/with_matplotlib.sh bench/plot_metrics.py docs/sft_loss.png \
  "SFT of the tiny model on 2-digit arithmetic chat (assistant tokens)" loss,val_loss packed="$out/packed"
