#pragma once
// What changed between the config a checkpoint was written with and the one resuming it. A
// change of the model's function (its shapes, rope, norms, activations, vocabulary, tokenizer)
// cannot resume; a change of run settings (learning rate, steps, batch, seed, layout, ...) is
// allowed, as NeMo allows overrides on resume, and listed so that it is never silent.
#include <ostream>
#include <string>
#include <vector>

#include "loom/config/run_config.h"

namespace loom::train {

struct ConfigChange {
  std::string key;  // section.key
  std::string before, after;
};

struct ConfigChanges {
  std::vector<ConfigChange> model;     // change the function the model computes
  std::vector<ConfigChange> settings;  // everything else
};

// `stored_yaml` as written into a checkpoint (config::to_yaml). Keys that only say how this run
// starts (train.resume, run.overwrite) are not compared.
ConfigChanges compare_configs(const std::string& stored_yaml, const config::RunConfig& now);

// "key before -> after; ..." for messages.
std::string describe_changes(const std::vector<ConfigChange>& changes);

// train.resume from the checkpoint at `path` written with `stored_yaml` (empty: an import, not
// checked): a model change is an Error naming each key; changed settings are listed to `out`.
void check_resumable(const std::string& stored_yaml, const std::string& path, const config::RunConfig& now,
                     std::ostream& out);

}  // namespace loom::train
