#pragma once
// Test support for config.json mappings: a config that loom must refuse to import, or a model it
// must refuse to export, with an error naming `key`.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "loom/core/error.h"
#include "loom/interop/hf/hf_config.h"

namespace loom::interop::hf::testing {

inline void expect_refused(const nlohmann::json& c, const std::string& key) {
  try {
    model_config_from_hf(c, "config.json");
    ADD_FAILURE() << "accepted; expected an error naming " << key;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
  }
}

inline void expect_not_exported(const config::ModelConfig& m, const std::string& key) {
  try {
    hf_config_json(m, "float32");
    ADD_FAILURE() << "exported; expected an error naming " << key;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
  }
}

}  // namespace loom::interop::hf::testing
