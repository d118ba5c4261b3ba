#!/usr/bin/env bash
# hf:<dir> with a SentencePiece tokenizer.model (and no tokenizer.json): trains a small BPE model
# with byte fallback on Moby-Dick (spm_train; identity normalization, digits split, whitespace kept,
# as in Llama 2's tokenizer.model), then compares `loom tokenize` with spm_encode /
# spm_decode (BOS added as Llama's tokenizer_config.json does by default) on the corpus's lines
# and on lines of emoji, CJK, combining marks, whitespace runs and numbers.
# usage: sentencepiece_model.sh LOOM DATA_DIR
set -euo pipefail
loom="$1"
data="$2"
for tool in spm_train spm_encode spm_decode python3; do
  command -v "$tool" >/dev/null || { echo "sentencepiece_model: $tool not found; run scripts/setup.sh" >&2; exit 1; }
done
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
mkdir "$scratch/tok"

head -n 4000 "$data/corpus/moby-dick.txt" | grep -v '^[[:space:]]*$' > "$scratch/lines.txt"
cat >> "$scratch/lines.txt" <<'TEXT'
👋🏽 Hello 🌍! 👨‍👩‍👧‍👦 family 🤖🤖🤖
日本語のテキストです。中文测试，한국어 텍스트입니다.
café naïve Ünïcödé e◌́ Å ñ हिन्दी مرحبا
a    b			c   d     e
 leading space and trailing space 
1234567890 3.14159 1,000,000 0x1F 2024-11-24 ١٢٣٤
I'm, you're, he'll, they've, she'd, it's, DON'T
TEXT
spm_train --input="$scratch/lines.txt" --model_prefix="$scratch/tok/tokenizer" --vocab_size=1200 --model_type=bpe \
  --byte_fallback=true --character_coverage=0.9995 --normalization_rule_name=identity --remove_extra_whitespaces=false \
  --split_digits=true --minloglevel=2 >/dev/null 2>&1

spm_encode --model="$scratch/tok/tokenizer.model" --output_format=id --extra_options=bos < "$scratch/lines.txt" \
  > "$scratch/expected.ids"
python3 - "$scratch" <<'PY'
import json, sys
d = sys.argv[1]
with open(d + "/lines.txt", encoding="utf-8") as f:
    lines = f.read().split("\n")[:-1]
with open(d + "/lines.jsonl", "w") as out:
    for line in lines:
        out.write(json.dumps(line) + "\n")
with open(d + "/expected.ids") as f, open(d + "/expected.jsonl", "w") as out, open(d + "/no_bos.jsonl", "w") as nb, \
        open(d + "/no_bos.ids", "w") as nb_ids:
    for line in f:
        ids = [int(x) for x in line.split()]
        out.write(json.dumps(ids) + "\n")
        nb.write(json.dumps(ids[1:]) + "\n")
        nb_ids.write(" ".join(map(str, ids[1:])) + "\n")
PY
"$loom" tokenize --tokenizer "hf:$scratch/tok" --jsonl --add-special-tokens --no-special "$scratch/lines.jsonl" \
  > "$scratch/loom.jsonl"
# Decoded without the BOS, whose text spm_decode leaves out (loom writes added tokens' text).
"$loom" tokenize --tokenizer "hf:$scratch/tok" --jsonl --decode "$scratch/no_bos.jsonl" > "$scratch/loom.decoded.jsonl"
spm_decode --model="$scratch/tok/tokenizer.model" --input_format=id < "$scratch/no_bos.ids" > "$scratch/spm.decoded.txt"
# A tokenizer_config.json whose added_tokens_decoder has a key that is not a token id: a clear error
# naming the key, exit status 1.
mkdir "$scratch/bad" && cp "$scratch/tok/tokenizer.model" "$scratch/bad/"
echo '{"added_tokens_decoder": {"abc": {"content": "<x>", "special": true}}}' > "$scratch/bad/tokenizer_config.json"
status=0
"$loom" tokenize --tokenizer "hf:$scratch/bad" "$scratch/lines.jsonl" > "$scratch/bad.out" 2>&1 || status=$?
if [ "$status" -ne 1 ] || ! grep -q "added_tokens_decoder key 'abc'" "$scratch/bad.out"; then
  echo "a bad added_tokens_decoder key: exit $status, not 1 with the key named:"; cat "$scratch/bad.out"
  echo "0 passed, 1 failed"
  exit 1
fi
python3 - "$scratch" <<'PY'
import json, sys
d = sys.argv[1]
lines = [json.loads(l) for l in open(d + "/lines.jsonl")]
expected = [json.loads(l) for l in open(d + "/expected.jsonl")]
got = [json.loads(l) for l in open(d + "/loom.jsonl")]
decoded = [json.loads(l) for l in open(d + "/loom.decoded.jsonl")]
spm_decoded = open(d + "/spm.decoded.txt", encoding="utf-8").read().split("\n")
bad = 0
for i, text in enumerate(lines):
    if i >= len(got) or got[i] != expected[i] or decoded[i] != spm_decoded[i] or decoded[i] != text:
        bad += 1
        if bad <= 5:
            print(f"line {i} {text[:120]!r}\n  spm  {expected[i][:40]}\n  loom {got[i][:40] if i < len(got) else None}\n  decoded {decoded[i][:120]!r} spm_decode {spm_decoded[i][:120]!r}")
tokens = sum(len(e) for e in expected)
print(f"tokenizer.model: {len(lines)} lines, {tokens} tokens: " + ("identical ids and decoded text, decode round-trips" if bad == 0 else f"{bad} lines differ"))
print(f"{1 if bad == 0 else 0} passed, {1 if bad else 0} failed")
sys.exit(1 if bad else 0)
PY
