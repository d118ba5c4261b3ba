// Every recipe shipped in configs/ parses and validates.
#include <gtest/gtest.h>

#include <filesystem>

#include "loom/runtime/config.h"

namespace loom::runtime {
namespace {

TEST(ShippedConfigs, AllParseAndValidate) {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(LOOM_SOURCE_DIR) + "/configs")) {
    if (entry.path().extension() != ".yaml") continue;
    SCOPED_TRACE(entry.path().string());
    RunConfig config = load_config(entry.path().string(), {});
    EXPECT_NO_THROW(validate_config(config));
    ++count;
  }
  EXPECT_GE(count, 3);
}

}  // namespace
}  // namespace loom::runtime
