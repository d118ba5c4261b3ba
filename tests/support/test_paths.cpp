#include "support/test_paths.h"

namespace loom::test_paths {

std::string binary() { return LOOM_TEST_BINARY; }
std::string source_dir() { return LOOM_TEST_SOURCE_DIR; }
std::string data_dir() { return LOOM_TEST_DATA_DIR; }

}  // namespace loom::test_paths
