# Shared by the GRPO benchmarks (sourced after `set -euo pipefail`): the repository root as the
# working directory, the loom binary ($loom: the script's first argument, build/loom by default)
# checked, $threads (THREADS, 2), load(), the machine line, the byte-level corpus prepared where it
# is missing, and tiny_sft.
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
loom="${1:-build/loom}"
threads="${THREADS:-2}"
[ -x "$loom" ] || { echo "no loom binary at $loom (build it: cmake --build build --target loom)" >&2; exit 1; }
load() { cut -d' ' -f1-3 /proc/loadavg; }
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; load average $(load)"
if [ ! -f data/byte/corpus_train.idx ]; then
  "$loom" data prepare .cache/data/corpus --tokenizer byte --output data/byte/corpus --val-fraction 0.02
fi

# tiny_sft OUT [OVERRIDES...]: the embedded default (configs/tiny.yaml) pre-trained 300 steps into
# OUT/pre, then fine-tuned 400 steps on 2-digit arithmetic chat (configs/tiny-sft.yaml, as
# docs/sft.md) into OUT/sft, both with OVERRIDES (model keys); each reused when already there.
tiny_sft() {
  local out="$1"
  shift
  mkdir -p "$out" data/sft
  "$loom" train configs/tiny.yaml "$@" run.dir="$out/pre" train.resume=true train.steps=300 \
    train.threads="$threads" log.progress=false > "$out/pre.log" 2>&1
  [ -f data/sft/arithmetic.jsonl ] ||
    "$loom" data synth --task arithmetic --digits 2 --count 20000 --output data/sft/arithmetic.jsonl
  if [ ! -f "$out/sft/checkpoints/latest" ]; then
    "$loom" sft configs/tiny-sft.yaml "$@" run.dir="$out/sft" run.overwrite=true train.init_from="$out/pre/checkpoints" \
      train.steps=400 train.threads="$threads" log.progress=false train.eval_interval=50 checkpoint.interval=0 \
      > "$out/sft.log" 2>&1
  fi
  echo "SFT'd: $(cat "$out/sft/checkpoints/latest")"
}
