# Shared set-up of the serving benchmarks, sourced with the script's arguments [BUILD_DIR=build]
# [THREADS=2]: repo, build, threads, a temporary work directory, a small corpus, and one_step,
# which trains a config for one step into $work/NAME (speed does not depend on the weights).
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$repo/build}"
threads="${2:-2}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for i in $(seq 1 300); do echo "It is a truth universally acknowledged, item $((i * 7))."; echo; done > "$work/corpus.txt"
"$build/loom" data prepare "$work/corpus.txt" --output "$work/data/c" --val-fraction 0 > /dev/null
one_step() {  # CONFIG NAME
  sed -e "s|dir: runs/.*|dir: $work/$2|" -e "s|train_prefix: data/byte/corpus_train|train_prefix: $work/data/c_train|" \
      -e "/val_prefix/d" -e "s|steps: [0-9]*$|steps: 1|" -e "s|eval_interval: [0-9]*|eval_interval: 0|" \
      -e "s|^  interval: [0-9]*|  interval: 1|" "$1" > "$work/$2.yaml"
  "$build/loom" train "$work/$2.yaml" > /dev/null
}
