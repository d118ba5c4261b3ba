#!/usr/bin/env bash
# log.tensorboard's event files read back by Google's protobuf runtime and crcmod (Debian's
# protobuf-compiler, python3-protobuf and python3-crcmod: scripts/setup.sh --test-references): a
# run stopped after step 4 and resumed to step 6 leaves two files whose scalars are metrics.jsonl's
# numbers step by step, the second starting (SessionLog START) at step 5. Exit 77 (skipped) where
# those references are not installed.
#   tensorboard_reference.sh LOOM
set -uo pipefail
loom="$1"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
python=""
for candidate in python3 /usr/bin/python3; do
  if "$candidate" -c "import google.protobuf, crcmod.predefined" >/dev/null 2>&1; then python=$candidate; break; fi
done
if [ -z "$python" ] || ! command -v protoc >/dev/null 2>&1; then
  echo "SKIP: protoc, python3-protobuf or python3-crcmod is not installed (scripts/setup.sh --test-references)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

for i in $(seq 1 200); do
  echo "{\"text\": \"Line $i of a small corpus for the event files.\"}"
done >"$tmp/corpus.jsonl"
"$loom" data prepare "$tmp/corpus.jsonl" --tokenizer byte --output "$tmp/d" --val-fraction 0.1 >/dev/null ||
  fail "preparing the dataset"
train() {
  "$loom" train "$repo/configs/tiny.yaml" data.train_prefix="$tmp/d_train" data.val_prefix="$tmp/d_val" \
    model.d_model=64 model.heads=4 model.kv_heads=2 model.ffn_size=128 model.layers=2 data.seq_len=32 \
    train.steps=6 train.global_batch=4 train.micro_batch=2 train.eval_interval=3 train.eval_batches=1 \
    checkpoint.interval=0 run.dir="$tmp/run" log.progress=false log.tensorboard=true "$@" >>"$tmp/train.log" 2>&1
}
train train.exit_interval=4 || { cat "$tmp/train.log"; fail "the first run"; }
sleep 1  # the second file's name carries a later second
train train.resume=true || { cat "$tmp/train.log"; fail "the resumed run"; }
protoc --proto_path="$here" --python_out="$tmp" "$here/tensorboard_event.proto" || fail "protoc"
"$python" "$here/tensorboard_reference.py" "$tmp" "$tmp/run" 1,5 || fail "the event files do not match metrics.jsonl"
echo "PASS: event files read back by protobuf and crcmod equal metrics.jsonl"
