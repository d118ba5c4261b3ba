#pragma once
// Test support for `--from-hf` checks: a Hugging Face model directory written by hand (config.json
// and model.safetensors from named f32 tensors), imported, and the imported model's logits.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loom/ckpt/checkpoint.h"
#include "loom/core/atomic_file.h"
#include "loom/interop/hf/hf_convert.h"
#include "loom/interop/hf/safetensors.h"
#include "loom/model/transformer.h"
#include "loom/train/model_setup.h"

namespace loom::interop::hf::testing {

struct NamedTensor {
  Shape shape;
  std::vector<float> values;
};
using Tensors = std::map<std::string, NamedTensor>;

// Every parameter of a one-rank model under its loom name.
inline Tensors parameters_of(const model::Transformer& model) {
  Tensors out;
  for (const model::Parameter& p : model.params().list()) {
    const float* v = model.params().values() + p.offset;
    out[p.name] = {p.global_shape(), std::vector<float>(v, v + p.numel)};
  }
  return out;
}

inline void write_hf_dir(const std::string& dir, const nlohmann::json& config, const Tensors& tensors) {
  std::filesystem::create_directories(dir);
  write_file_atomic(dir + "/config.json", config.dump(2));
  std::vector<SafetensorsOutput> out;
  for (const auto& [name, t] : tensors) {
    out.push_back({name, "F32", {t.shape.begin(), t.shape.end()}, [&t](std::span<std::byte> bytes) {
                     std::memcpy(bytes.data(), t.values.data(), bytes.size());
                   }});
  }
  write_safetensors(dir + "/model.safetensors", out, {{"format", "pt"}});
}

// The logits after each of `tokens`, decoded one at a time.
inline std::vector<float> decode_logits(model::Transformer& model, const std::vector<int32_t>& tokens) {
  model::DecodeState state;
  std::vector<float> out;
  const int vocab = model.config().vocab_size;
  for (const int32_t t : tokens) {
    const float* logits = model.decode(state, &t, 1);
    out.insert(out.end(), logits, logits + vocab);
  }
  return out;
}

// Imports `dir` into a fresh checkpoint root under it and returns its logits after `tokens`.
inline std::vector<float> imported_logits(const std::string& dir, const std::string& name,
                                          const std::vector<int32_t>& tokens) {
  const std::string root = dir + "/" + name;
  std::filesystem::remove_all(root);
  HfImportOptions options;
  options.tokenizer = "byte";
  import_from_hf(dir, root, options);
  const ckpt::LoadedCheckpoint checkpoint = ckpt::load_checkpoint(root);
  const config::RunConfig config = config::parse_config(checkpoint.config_yaml(), "manifest", {});
  model::Transformer model(config.model);
  train::load_parameters(checkpoint, model);
  return decode_logits(model, tokens);
}

// The largest |a - b| relative to the largest |a|.
inline double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0.0, scale = 0.0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::abs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::abs(a[i])));
  }
  return a.size() == b.size() ? diff / scale : 1.0;
}

}  // namespace loom::interop::hf::testing
