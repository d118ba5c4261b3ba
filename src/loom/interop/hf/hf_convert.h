#pragma once
// `loom convert`: loom checkpoints <-> Hugging Face model directories (config.json +
// model.safetensors). See docs/interop.md for the mapping and hf_config.h for the config keys.
//
// To Hugging Face: the model parameters of a checkpoint (not its `optim.*` optimizer state) under
// their names, which loom already gives as Llama's, in f32 or bf16, and config.json.
// From Hugging Face: a step-0 checkpoint holding the parameters as f32 and zero AdamW moments
// (so `loom train ... train.resume=true` starts from it as from a fresh optimizer), loadable by
// `loom generate`. Loom -> Hugging Face (f32) -> loom keeps `loom ckpt digest`, which covers the
// parameters only.
#include <cstdint>
#include <string>

namespace loom::interop::hf {

struct HfExportOptions {
  std::string dtype = "f32";  // f32 | bf16: the dtype of the tensors in model.safetensors
};

struct HfExportResult {
  std::string checkpoint;    // the step directory read
  int64_t step = 0;
  std::string architecture;  // LlamaForCausalLM, DeciLMForCausalLM, MixtralForCausalLM, Qwen2ForCausalLM,
                             // Qwen2MoeForCausalLM or NemotronHForCausalLM
  size_t tensors = 0;
  uint64_t bytes = 0;        // model.safetensors' size
};

// Reads the checkpoint (a step directory, or a root: its latest good checkpoint) and writes
// out_dir/model.safetensors and out_dir/config.json (creating out_dir; each file replaced
// atomically). Throws loom::Error naming the key when the model is not Llama-style (hf_config.h),
// and naming the tensor when the checkpoint's parameters are not exactly the config's model's.
HfExportResult export_to_hf(const std::string& checkpoint, const std::string& out_dir, const HfExportOptions& options);

struct HfImportOptions {
  // A run config (YAML) whose non-model sections go into the checkpoint's config (what
  // `loom generate` reads the tokenizer from); its model section is replaced by config.json's.
  // Empty: the defaults.
  std::string config_path;
  // data.tokenizer; empty: the directory's own tokenizer (tokenizer.json or tokenizer.model,
  // copied to <out_root>/tokenizer and recorded as hf:<that dir>), else --config's, else the
  // `loom.tokenizer` metadata that --to-hf writes, else the default (byte).
  std::string tokenizer;
};

struct HfImportResult {
  std::string checkpoint;    // the step directory written
  std::string architecture;
  size_t tensors = 0;        // parameters
  std::string tokenizer;
};

// Reads hf_dir/config.json and hf_dir/model.safetensors (or the shards that
// hf_dir/model.safetensors.index.json lists) and writes a step-0 checkpoint under out_root, which
// must not exist or be empty. Every tensor the config's model needs must be present with its
// shape and a float dtype (F32, BF16, F16); a missing, misshapen or unexpected tensor is an
// error naming it and the file.
HfImportResult import_from_hf(const std::string& hf_dir, const std::string& out_root, const HfImportOptions& options);

}  // namespace loom::interop::hf
