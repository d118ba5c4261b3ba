# Shared by the benchmarks that train GPT-2 124M on several ranks of the threads backend
# (multisite_bench.sh, param_gather_bench.sh; sourced after `set -euo pipefail`): the repository
# root as the working directory, $loom (LOOM, else build/loom built here first), the GPT-2
# tokenised corpus prepared where it is missing, $out (a scratch directory removed on exit),
# $batch x $seq tokens per rank and step (BATCH, 2; SEQ, 64), median() of the numbers on stdin, and
# field DIR KEY: KEY's values in DIR/metrics.jsonl after the first step's.
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
loom="${LOOM:-build/loom}"
if [ -z "${LOOM:-}" ]; then
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build -j2 --target loom >/dev/null
fi
unset OPENBLAS_CORETYPE
[ -f data/gpt2/corpus_train.idx ] || "$loom" data prepare .cache/data/corpus --tokenizer gpt2 --output data/gpt2/corpus
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
median() { sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
field() { grep -o "\"$2\":[-0-9.e+]*" "$1/metrics.jsonl" | cut -d: -f2 | tail -n +2; }
batch="${BATCH:-2}" seq="${SEQ:-64}"  # per rank
