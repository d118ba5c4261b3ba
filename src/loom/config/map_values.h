#pragma once
// YAML values of the map-valued keys: `model.block_configs` (a list of per-layer maps),
// `data.train_blend` / `data.val_blend` (lists of weighted datasets) and `model.mamba` (a map),
// each with its own key table, parsed, written and checked key by key.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <type_traits>
#include <vector>

#include "loom/config/run_config.h"
#include "loom/config/suggestion.h"
#include "loom/config/yaml_values.h"
#include "loom/core/error.h"
#include "loom/config/schema_keys.h"

namespace loom::config::detail {

// Keys of one `model.block_configs` entry.
inline const std::vector<Key<BlockConfig>>& block_keys() {
  static const std::vector<Key<BlockConfig>> keys = {
      field("attention", &BlockConfig::attention),
      field("kv_heads", &BlockConfig::kv_heads, at_least(0)),
      field("ffn", &BlockConfig::ffn),
      field("ffn_size", &BlockConfig::ffn_size,
            [](const int& v) -> std::optional<std::string> {
              if (v >= -1) return std::nullopt;
              return std::string("must be -1 (= model.ffn_size), 0 (no MLP) or a positive size");
            }),
  };
  return keys;
}


// One map's keys (at origin.path) into `item`, each by its entry in `keys`; `what` names the map's
// keys in messages. A YAML null leaves `item` as it is.
template <class T>
void parse_map(T& item, const YAML::Node& map, const Origin& origin, const std::vector<Key<T>>& keys,
               const std::string& what) {
  if (map.IsNull()) return;
  if (!map.IsMap()) wrong_type(origin, map, "a map with keys " + join(names_of(keys)));
  for (const auto& pair : map) {
    const std::string name = pair.first.Scalar();
    auto key = std::find_if(keys.begin(), keys.end(), [&](const auto& k) { return k.name == name; });
    if (key == keys.end()) unknown_key(origin.where, origin.path + "." + name, "key", what, names_of(keys));
    key->parse(item, pair.second, Origin{origin.where, origin.path + "." + name});
  }
}

// One map's keys as a YAML flow map.
template <class T>
void emit_map(YAML::Emitter& out, const T& item, const std::vector<Key<T>>& keys) {
  out << YAML::Flow << YAML::BeginMap;
  for (const auto& key : keys) {
    out << YAML::Key << key.name << YAML::Value;
    key.emit(item, out);
  }
  out << YAML::EndMap;
}

// The Value of a list of maps (block_configs, a blend's entries): each map's keys parsed, written
// and checked by Names::keys(); Names::kExpected says what the list is, Names::kEntry names one map.
template <class T, class Names>
struct MapListValue {
  static std::vector<T> parse(const YAML::Node& node, const Origin& origin) {
    const std::vector<Key<T>>& keys = Names::keys();
    if (node.IsNull()) return {};
    if (!node.IsSequence()) wrong_type(origin, node, Names::kExpected);
    std::vector<T> items;
    for (size_t i = 0; i < node.size(); ++i) {
      T item;
      parse_map(item, node[i], Origin{origin.where, origin.path + "[" + std::to_string(i) + "]"}, keys,
                std::string("keys of ") + Names::kEntry);
      items.push_back(item);
    }
    return items;
  }
  static void emit(YAML::Emitter& out, const std::vector<T>& items) {
    const std::vector<Key<T>>& keys = Names::keys();
    if (items.empty()) out << YAML::Flow;  // "[]" on the key's line
    out << YAML::BeginSeq;
    for (const T& item : items) emit_map(out, item, keys);
    out << YAML::EndSeq;
  }
  static std::string show(const std::vector<T>& items) {
    return "a list of " + std::to_string(items.size()) + (items.size() == 1 ? " entry" : " entries");
  }
  static void check(const std::vector<T>& items, const std::string& path) {
    for (size_t i = 0; i < items.size(); ++i) {
      for (const auto& key : Names::keys()) key.check(items[i], path + "[" + std::to_string(i) + "]." + key.name);
    }
  }
};

struct BlockConfigNames {
  static const std::vector<Key<BlockConfig>>& keys() { return block_keys(); }
  static constexpr const char* kExpected =
      "a list of maps with keys attention, kv_heads, ffn, ffn_size (e.g. [{attention: skip}, {ffn_size: 512}])";
  static constexpr const char* kEntry = "a block_configs entry";
};

template <>
struct Value<std::vector<BlockConfig>> : MapListValue<BlockConfig, BlockConfigNames> {};

// Keys of one entry of `data.train_blend` / `data.val_blend`.
inline const std::vector<Key<BlendEntry>>& blend_keys() {
  static const std::vector<Key<BlendEntry>> keys = {
      field("prefix", &BlendEntry::prefix,
            [](const std::string& v) -> std::optional<std::string> {
              if (!v.empty()) return std::nullopt;
              return std::string("must name a dataset made by `loom data prepare` (its path without .bin/.idx)");
            }),
      field("weight", &BlendEntry::weight, [](const double& v) { return weight_problem(v); }),
  };
  return keys;
}

// Megatron's --data-path text, "0.7 data/web 0.3 data/code" (weights and prefixes in turn) or a
// lone prefix, as blend entries.
inline std::vector<BlendEntry> blend_from_text(const std::string& text, const Origin& origin, const char* expected) {
  std::vector<std::string> words;
  std::istringstream in(text);
  for (std::string word; in >> word;) words.push_back(word);
  if (words.size() == 1) return {BlendEntry{words[0], 1.0}};
  if (words.empty() || words.size() % 2 != 0) {
    throw Error(origin.where + ": " + origin.path + " = " + in_quotes(text) + " is invalid: expected " + expected);
  }
  std::vector<BlendEntry> entries;
  for (size_t i = 0; i < words.size(); i += 2) {
    double weight = 0;
    const auto [end, error] = std::from_chars(words[i].data(), words[i].data() + words[i].size(), weight);
    if (error != std::errc() || end != words[i].data() + words[i].size()) {
      throw Error(origin.where + ": " + origin.path + " = " + in_quotes(text) + " is invalid: " + in_quotes(words[i]) +
                  " (word " + std::to_string(i + 1) + ") is not a weight; expected " + expected);
    }
    entries.push_back({words[i + 1], weight});
  }
  return entries;
}

struct BlendNames {
  static const std::vector<Key<BlendEntry>>& keys() { return blend_keys(); }
  static constexpr const char* kExpected =
      "a list of maps with keys prefix, weight "
      "(e.g. [{prefix: data/web, weight: 0.7}, {prefix: data/code, weight: 0.3}]), or Megatron's --data-path text "
      "(\"0.7 data/web 0.3 data/code\")";
  static constexpr const char* kEntry = "a blend entry";
};

// Also Megatron's --data-path text (a YAML string) in place of the list.
template <>
struct Value<std::vector<BlendEntry>> : MapListValue<BlendEntry, BlendNames> {
  static std::vector<BlendEntry> parse(const YAML::Node& node, const Origin& origin) {
    if (node.IsScalar()) return blend_from_text(node.Scalar(), origin, BlendNames::kExpected);
    return MapListValue::parse(node, origin);
  }
};

// Keys of `model.mamba` (a map).
inline const std::vector<Key<MambaConfig>>& mamba_keys() {
  static const std::vector<Key<MambaConfig>> keys = {
      field("state_size", &MambaConfig::state_size, at_least(1)),
      field("heads", &MambaConfig::heads, at_least(0)),
      field("head_dim", &MambaConfig::head_dim, at_least(1)),
      field("groups", &MambaConfig::groups, at_least(1)),
      field("conv_kernel", &MambaConfig::conv_kernel, at_least(1)),
      field("chunk_size", &MambaConfig::chunk_size, at_least(1)),
      field("expand", &MambaConfig::expand, at_least(1)),
  };
  return keys;
}

template <>
struct Value<MambaConfig> {
  static MambaConfig parse(const YAML::Node& node, const Origin& origin) {
    MambaConfig mamba;
    parse_map(mamba, node, origin, mamba_keys(), "keys of model.mamba");
    return mamba;
  }
  static void emit(YAML::Emitter& out, const MambaConfig& mamba) { emit_map(out, mamba, mamba_keys()); }
  static std::string show(const MambaConfig&) { return "a map"; }
  static void check(const MambaConfig& mamba, const std::string& path) {
    for (const auto& key : mamba_keys()) key.check(mamba, path + "." + key.name);
  }
};

}  // namespace loom::config::detail
