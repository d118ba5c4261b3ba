#pragma once
// Typed, checked reads of a Hugging Face config.json's keys, shared by the architectures' readers
// (hf_config.cpp, hf_nemotron_h.cpp): every refusal names the file and the key.
#include <climits>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "loom/core/error.h"

namespace loom::interop::hf {

// A value from the file in a message: short scalars as JSON, anything else by its type.
inline std::string shown(const nlohmann::json& value) {
  if (value.is_primitive()) {
    std::string text = value.dump();
    if (text.size() <= 80) return text;
  }
  return std::string("a JSON ") + value.type_name();
}

// The largest value loom accepts for each size read from config.json, checked before anything
// is allocated from it: far above any published model, far below what would exhaust memory.
inline int64_t max_size(std::string_view key) {
  static const std::pair<std::string_view, int64_t> limits[] = {
      {"hidden_size", 65536},           {"num_hidden_layers", 1024},   {"num_attention_heads", 1024},
      {"num_key_value_heads", 1024},    {"head_dim", 65536},           {"vocab_size", 4194304},
      {"intermediate_size", 1048576},   {"max_position_embeddings", 1048576},
      {"n_heads_in_group", 1024},       {"mamba_num_heads", 65536},    {"mamba_head_dim", 65536},
      {"ssm_state_size", 65536},        {"n_groups", 65536},           {"conv_kernel", 64},
      {"chunk_size", 65536},            {"n_routed_experts", 65536},   {"num_experts_per_tok", 1024},
      {"moe_intermediate_size", 1048576}, {"moe_shared_expert_intermediate_size", 1048576},
      {"moe_latent_size", 65536},
  };
  for (const auto& [name, limit] : limits)
    if (name == key) return limit;
  return INT_MAX;
}

// Typed reads of config.json keys; absent and null both mean "use the default".
class ConfigReader {
 public:
  ConfigReader(const nlohmann::json& object, std::string where) : object_(object), where_(std::move(where)) {}

  bool has(const char* key) const { return object_.contains(key) && !object_.at(key).is_null(); }
  const nlohmann::json& at(const char* key) const { return object_.at(key); }
  std::string where(const char* key) const { return where_ + ": " + key; }

  int positive_int(const char* key) const {
    LOOM_CHECK(has(key), where_ + ": missing key '" + key + "' (a positive integer)");
    return positive_int_value(at(key), where(key), max_size(key));
  }
  std::optional<int> optional_positive_int(const char* key) const {
    if (!has(key)) return std::nullopt;
    return positive_int_value(at(key), where(key), max_size(key));
  }
  int positive_int_or(const char* key, int fallback) const { return optional_positive_int(key).value_or(fallback); }
  double positive_number(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    const nlohmann::json& v = at(key);
    LOOM_CHECK(v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() > 0.0,
          where(key) + " is " + shown(v) + "; expected a positive number");
    return v.get<double>();
  }
  bool boolean(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    LOOM_CHECK(at(key).is_boolean(), where(key) + " is " + shown(at(key)) + "; expected true or false");
    return at(key).get<bool>();
  }

  static int positive_int_value(const nlohmann::json& v, const std::string& what, int64_t max) {
    LOOM_CHECK(v.is_number_integer() && v.get<int64_t>() >= 1 && v.get<int64_t>() <= max,
          what + " is " + shown(v) + "; expected a positive integer of at most " + std::to_string(max));
    return static_cast<int>(v.get<int64_t>());
  }

 private:
  const nlohmann::json& object_;
  std::string where_;
};

}  // namespace loom::interop::hf
