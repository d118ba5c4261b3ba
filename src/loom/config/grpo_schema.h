#pragma once
// The `grpo` section's keys and the checks relating them (run_config.cpp lists the section,
// validate_config calls check_grpo).
#include <vector>

#include "loom/config/grpo_config.h"
#include "loom/config/run_config.h"
#include "loom/config/schema_keys.h"

namespace loom::config {

namespace detail {
std::vector<Key<GrpoConfig>> grpo_keys();
}  // namespace detail

// Throws an Error naming the key when grpo settings contradict each other.
void check_grpo(const RunConfig& config);

}  // namespace loom::config
