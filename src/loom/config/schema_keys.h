#pragma once
// The config schema's building blocks: a key descriptor per field (parse, emit, check), the
// range checks keys use, and the error for an unknown key. run_config.cpp builds its tables from
// these; map_values.h uses them for the map-valued keys.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "loom/config/run_config.h"
#include "loom/config/suggestion.h"
#include "loom/config/yaml_values.h"
#include "loom/core/error.h"

namespace loom::config::detail {

// ---------------------------------------------------------------------------------------------
// Keys: one descriptor per field, built from a pointer to member; a section is a named list of
// keys. Parsing, writing and range checks all walk these tables.

// Returns why a value is invalid ("must be >= 1"), or nothing when it is valid.
template <class T>
using Check = std::function<std::optional<std::string>(const T&)>;

template <class Root>
struct Key {
  std::string name;
  std::function<void(Root&, const YAML::Node&, const Origin&)> parse;
  std::function<void(const Root&, YAML::Emitter&)> emit;
  std::function<void(const Root&, const std::string& path)> check;
};

template <class Root, class T>
Key<Root> field(std::string name, T Root::*member, std::type_identity_t<Check<T>> check = nullptr) {
  Key<Root> key;
  key.name = std::move(name);
  key.parse = [member](Root& root, const YAML::Node& node, const Origin& origin) {
    root.*member = Value<T>::parse(node, origin);
  };
  key.emit = [member](const Root& root, YAML::Emitter& out) { Value<T>::emit(out, root.*member); };
  key.check = [member, check](const Root& root, const std::string& path) {
    const T& value = root.*member;
    if (check) {
      if (auto why = check(value)) throw Error(path + " = " + Value<T>::show(value) + " is invalid: " + *why);
    }
    if constexpr (requires { Value<T>::check(value, path); }) Value<T>::check(value, path);
  };
  return key;
}

template <class T>
inline Check<T> at_least(T low) {
  return [low](const T& value) -> std::optional<std::string> {
    if (value >= low) return std::nullopt;
    return "must be >= " + Value<T>::show(low);
  };
}

// A blend's weight (data.*_blend, sft.train_weights): relative to the others, so any finite
// number > 0.
inline std::optional<std::string> weight_problem(double weight) {
  if (weight > 0 && std::isfinite(weight)) return std::nullopt;
  return std::string("must be a finite number > 0 (weights are relative to each other)");
}

template <class T>
inline Check<T> in_range(T low, T high, std::string why_high) {
  return [low, high, why_high](const T& value) -> std::optional<std::string> {
    if (value >= low && value <= high) return std::nullopt;
    return "must be in [" + Value<T>::show(low) + ", " + Value<T>::show(high) + "]" + why_high;
  };
}

inline Check<double> greater_than(double low) {
  return [low](const double& value) -> std::optional<std::string> {
    if (value > low) return std::nullopt;
    return "must be > " + format_double(low);
  };
}

inline Check<double> in_unit_interval() {
  return [](const double& value) -> std::optional<std::string> {
    if (value >= 0.0 && value < 1.0) return std::nullopt;
    return std::string("must be in [0, 1)");
  };
}

inline Check<std::string> one_of(std::vector<std::string> allowed) {
  return [allowed](const std::string& value) -> std::optional<std::string> {
    if (std::find(allowed.begin(), allowed.end(), value) != allowed.end()) return std::nullopt;
    return "must be one of " + join(allowed) + suggestion(value, allowed);
  };
}


inline std::vector<std::string> names_of(const auto& keys) {
  std::vector<std::string> names;
  for (const auto& key : keys) names.push_back(key.name);
  return names;
}

// Unknown key in a map of `keys`: names it, lists the valid ones, suggests the closest.
// `what` is "section" or "key"; `valid_label` says whose names `valid` are.
[[noreturn]] inline void unknown_key(const std::string& where, const std::string& written, const std::string& what,
                              const std::string& valid_label, const std::vector<std::string>& valid,
                              const std::string& extra_hint = "") {
  std::string key = written.substr(written.rfind('.') == std::string::npos ? 0 : written.rfind('.') + 1);
  throw Error(where + ": unknown " + what + " " + in_quotes(written) + "; valid " + valid_label + ": " +
              join(valid) + (extra_hint.empty() ? suggestion(key, valid) : extra_hint));
}

}  // namespace loom::config::detail
