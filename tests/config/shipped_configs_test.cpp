// Every recipe shipped in configs/ parses and validates.
#include <gtest/gtest.h>

#include <filesystem>

#include "loom/core/error.h"
#include "loom/config/run_config.h"
#include "support/test_paths.h"

namespace loom::config {
namespace {

TEST(ShippedConfigs, AllParseAndValidate) {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(loom::test_paths::source_dir() + "/configs")) {
    if (entry.path().extension() != ".yaml") continue;
    SCOPED_TRACE(entry.path().string());
    RunConfig config = load_config(entry.path().string(), {});
    EXPECT_NO_THROW(validate_config(config));
    ++count;
  }
  EXPECT_GE(count, 3);
}

}  // namespace
}  // namespace loom::config

namespace loom::config {
namespace {

TEST(ParallelConfig, DataParallelCanBeAuto) {
  RunConfig a = parse_config("parallel:\n  dp: auto\n", "t.yaml", {});
  EXPECT_TRUE(a.parallel.dp.is_auto());
  RunConfig b = parse_config("", "t.yaml", {"parallel.dp=4"});
  EXPECT_EQ(static_cast<int>(b.parallel.dp), 4);
  EXPECT_NE(to_yaml(a).find("dp: auto"), std::string::npos) << to_yaml(a);
  EXPECT_TRUE(parse_config(to_yaml(a), "round-trip", {}).parallel.dp.is_auto());
  try {
    parse_config("", "t.yaml", {"parallel.dp=many"});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a positive integer or auto"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace loom::config
