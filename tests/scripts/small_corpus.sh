# Sourced by the script tests: prepares the small byte-level dataset every scripted run trains
# on, as prefix DIR/c (train split DIR/c_train). Usage: prepare_small_corpus LOOM_BINARY DIR
prepare_small_corpus() {
  local loom="$1" dir="$2" i
  for i in $(seq 1 300); do printf 'It is a truth universally acknowledged, item %d.\n\n' "$((i * 7))"; done > "$dir/corpus.txt"
  "$loom" data prepare "$dir/corpus.txt" --tokenizer byte --val-fraction 0 --output "$dir/c" > /dev/null
}
