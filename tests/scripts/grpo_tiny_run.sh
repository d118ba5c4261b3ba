# Sourced by the GRPO launch checks: a tiny checkpoint trained for 2 steps (DIR/tiny) and a
# `loom grpo` config starting from it with every role external (DIR/grpo.yaml, run.dir DIR/run,
# 3 steps, grpo.verify_refit). Usage: prepare_grpo_run LOOM_BINARY DIR
prepare_grpo_run() {
  local loom="$1" work="$2" model
  # shellcheck source=small_corpus.sh
  source "$(dirname "${BASH_SOURCE[0]}")/small_corpus.sh"
  prepare_small_corpus "$loom" "$work"
  model='model: {vocab_size: 0, d_model: 32, layers: 2, heads: 4, kv_heads: 2, ffn_size: 48, norm: rms, activation: swiglu, positions: rope, tied_embeddings: false, max_seq_len: 128}'
  cat > "$work/tiny.yaml" <<YAML
$model
data: {tokenizer: byte, train_prefix: $work/c_train, seq_len: 32}
train: {steps: 2, global_batch: 4, micro_batch: 4, seed: 7}
log: {progress: false}
YAML
  "$loom" train "$work/tiny.yaml" run.dir="$work/tiny" > "$work/tiny.log" 2>&1 || return 1
  cat > "$work/grpo.yaml" <<YAML
run: {dir: $work/run}
$model
data: {tokenizer: byte, seq_len: 128}
optim: {lr: 1.0e-2, warmup_steps: 0}
train: {steps: 3, global_batch: 4, micro_batch: 4, seed: 7, init_from: $work/tiny/checkpoints}
log: {progress: false}
grpo: {launch: external, environment: arithmetic, task_digits: 1, samples_per_prompt: 2, prompts_per_step: 2,
       max_tokens: 4, worker_kv_cache_mb: 4, verify_refit: true, episode_retries: 6, register_timeout_s: 120}
YAML
}
