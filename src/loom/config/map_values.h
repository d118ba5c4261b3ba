#pragma once
// YAML values of the map-valued keys: `model.block_configs` (a list of per-layer maps),
// `data.train_blend` / `data.val_blend` (lists of weighted datasets) and `model.mamba` (a map),
// each with its own key table, parsed, written and checked key by key.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <sstream>
#include <system_error>
#include <functional>
#include <optional>
#include <string>
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


// A list of maps (block_configs, a blend's entries), each map's keys parsed, written and
// checked by `keys`; `entry` names one map in messages.
template <class T>
struct MapList {
  static std::vector<T> parse(const YAML::Node& node, const Origin& origin, const std::vector<Key<T>>& keys,
                              const std::string& expected, const std::string& entry) {
    if (node.IsNull()) return {};
    if (!node.IsSequence()) wrong_type(origin, node, expected);
    std::vector<T> items;
    for (size_t i = 0; i < node.size(); ++i) {
      const YAML::Node map = node[i];
      Origin item_origin{origin.where, origin.path + "[" + std::to_string(i) + "]"};
      T item;
      if (!map.IsNull()) {
        if (!map.IsMap()) wrong_type(item_origin, map, "a map with keys " + join(names_of(keys)));
        for (const auto& pair : map) {
          const std::string name = pair.first.Scalar();
          auto key = std::find_if(keys.begin(), keys.end(), [&](const auto& k) { return k.name == name; });
          if (key == keys.end())
            unknown_key(origin.where, item_origin.path + "." + name, "key", "keys of " + entry, names_of(keys));
          key->parse(item, pair.second, Origin{origin.where, item_origin.path + "." + name});
        }
      }
      items.push_back(item);
    }
    return items;
  }
  static void emit(YAML::Emitter& out, const std::vector<T>& items, const std::vector<Key<T>>& keys) {
    if (items.empty()) out << YAML::Flow;  // "[]" on the key's line
    out << YAML::BeginSeq;
    for (const T& item : items) {
      out << YAML::Flow << YAML::BeginMap;
      for (const auto& key : keys) {
        out << YAML::Key << key.name << YAML::Value;
        key.emit(item, out);
      }
      out << YAML::EndMap;
    }
    out << YAML::EndSeq;
  }
  static std::string show(const std::vector<T>& items) {
    return "a list of " + std::to_string(items.size()) + (items.size() == 1 ? " entry" : " entries");
  }
  static void check(const std::vector<T>& items, const std::string& path, const std::vector<Key<T>>& keys) {
    for (size_t i = 0; i < items.size(); ++i) {
      for (const auto& key : keys) key.check(items[i], path + "[" + std::to_string(i) + "]." + key.name);
    }
  }
};

template <>
struct Value<std::vector<BlockConfig>> {
  static constexpr const char* kExpected =
      "a list of maps with keys attention, kv_heads, ffn, ffn_size (e.g. [{attention: skip}, {ffn_size: 512}])";
  using List = MapList<BlockConfig>;
  static std::vector<BlockConfig> parse(const YAML::Node& node, const Origin& origin) {
    return List::parse(node, origin, block_keys(), kExpected, "a block_configs entry");
  }
  static void emit(YAML::Emitter& out, const std::vector<BlockConfig>& blocks) {
    List::emit(out, blocks, block_keys());
  }
  static std::string show(const std::vector<BlockConfig>& blocks) { return List::show(blocks); }
  static void check(const std::vector<BlockConfig>& blocks, const std::string& path) {
    List::check(blocks, path, block_keys());
  }
};

// Keys of one entry of `data.train_blend` / `data.val_blend`.
inline const std::vector<Key<BlendEntry>>& blend_keys() {
  static const std::vector<Key<BlendEntry>> keys = {
      field("prefix", &BlendEntry::prefix,
            [](const std::string& v) -> std::optional<std::string> {
              if (!v.empty()) return std::nullopt;
              return std::string("must name a dataset made by `loom data prepare` (its path without .bin/.idx)");
            }),
      field("weight", &BlendEntry::weight,
            [](const double& v) -> std::optional<std::string> {
              if (v > 0 && std::isfinite(v)) return std::nullopt;
              return std::string("must be a finite number > 0 (the entries' weights are relative to each other)");
            }),
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

template <>
struct Value<std::vector<BlendEntry>> {
  static constexpr const char* kExpected =
      "a list of maps with keys prefix, weight "
      "(e.g. [{prefix: data/web, weight: 0.7}, {prefix: data/code, weight: 0.3}]), or Megatron's --data-path text "
      "(\"0.7 data/web 0.3 data/code\")";
  using List = MapList<BlendEntry>;
  static std::vector<BlendEntry> parse(const YAML::Node& node, const Origin& origin) {
    if (node.IsScalar()) return blend_from_text(node.Scalar(), origin, kExpected);
    return List::parse(node, origin, blend_keys(), kExpected, "a blend entry");
  }
  static void emit(YAML::Emitter& out, const std::vector<BlendEntry>& entries) {
    List::emit(out, entries, blend_keys());
  }
  static std::string show(const std::vector<BlendEntry>& entries) { return List::show(entries); }
  static void check(const std::vector<BlendEntry>& entries, const std::string& path) {
    List::check(entries, path, blend_keys());
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
    if (node.IsNull()) return mamba;
    if (!node.IsMap()) wrong_type(origin, node, "a map with keys " + join(names_of(mamba_keys())));
    for (const auto& item : node) {
      const std::string name = item.first.Scalar();
      const auto& keys = mamba_keys();
      auto key = std::find_if(keys.begin(), keys.end(), [&](const auto& k) { return k.name == name; });
      if (key == keys.end()) unknown_key(origin.where, origin.path + "." + name, "key", "keys of model.mamba", names_of(keys));
      key->parse(mamba, item.second, Origin{origin.where, origin.path + "." + name});
    }
    return mamba;
  }
  static void emit(YAML::Emitter& out, const MambaConfig& mamba) {
    out << YAML::Flow << YAML::BeginMap;
    for (const auto& key : mamba_keys()) {
      out << YAML::Key << key.name << YAML::Value;
      key.emit(mamba, out);
    }
    out << YAML::EndMap;
  }
  static std::string show(const MambaConfig&) { return "a map"; }
  static void check(const MambaConfig& mamba, const std::string& path) {
    for (const auto& key : mamba_keys()) key.check(mamba, path + "." + key.name);
  }
};

}  // namespace loom::config::detail
