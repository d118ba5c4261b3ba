#include "loom/train/config_changes.h"

#include <map>

#include <yaml-cpp/yaml.h>

#include "loom/core/error.h"

namespace loom::train {

namespace {

using Flat = std::map<std::string, std::string>;

// section.key -> the value as YAML flow text.
void flatten(const YAML::Node& node, const std::string& prefix, Flat& out) {
  if (node.IsMap() && (prefix.empty() || prefix.find('.') == std::string::npos)) {
    for (const auto& entry : node) {
      const std::string key = entry.first.as<std::string>();
      flatten(entry.second, prefix.empty() ? key : prefix + "." + key, out);
    }
    return;
  }
  YAML::Emitter emitter;
  emitter << YAML::Flow << node;
  out[prefix] = emitter.c_str();
}

Flat flatten_yaml(const std::string& yaml) {
  Flat flat;
  flatten(YAML::Load(yaml), "", flat);
  return flat;
}

// Keys whose change alters the function the model computes.
bool changes_model(const std::string& key) {
  if (key == "model.recompute") return false;  // the same function, recomputed
  return key.rfind("model.", 0) == 0 || key == "data.tokenizer";
}

// The stored config with today's defaults filled in: a key added after the checkpoint was written
// takes its default, which is what the code computed before the key existed. A stored config that
// no longer parses is compared as written.
std::string with_defaults(const std::string& stored_yaml) {
  try {
    return config::to_yaml(config::parse_config(stored_yaml, "the checkpoint's config", {}));
  } catch (const std::exception&) {
    return stored_yaml;
  }
}

}  // namespace

ConfigChanges compare_configs(const std::string& stored_yaml, const config::RunConfig& now) {
  const Flat before = flatten_yaml(with_defaults(stored_yaml)), after = flatten_yaml(config::to_yaml(now));
  ConfigChanges changes;
  auto value = [](const Flat& flat, const std::string& key) {
    auto it = flat.find(key);
    return it == flat.end() ? std::string("(unset)") : it->second;
  };
  Flat keys = before;
  keys.insert(after.begin(), after.end());
  for (const auto& [key, unused] : keys) {
    if (key == "train.resume" || key == "run.overwrite") continue;
    const std::string b = value(before, key), a = value(after, key);
    if (b == a) continue;
    (changes_model(key) ? changes.model : changes.settings).push_back({key, b, a});
  }
  return changes;
}

std::string describe_changes(const std::vector<ConfigChange>& changes) {
  std::string text;
  for (const ConfigChange& c : changes) {
    text += (text.empty() ? "" : "; ") + c.key + " " + c.before + " -> " + c.after;
  }
  return text;
}

void check_resumable(const std::string& stored_yaml, const std::string& path, const config::RunConfig& now,
                     std::ostream& out) {
  if (stored_yaml.empty()) return;
  const ConfigChanges changes = compare_configs(stored_yaml, now);
  LOOM_CHECK(changes.model.empty(), "train.resume: " + path + " was trained with another model: " +
                                        describe_changes(changes.model) +
                                        ". Restore those values to continue it, or start a new run in another run.dir");
  if (!changes.settings.empty()) out << "resume: settings changed since the checkpoint: " << describe_changes(changes.settings) << "\n";
}

}  // namespace loom::train
