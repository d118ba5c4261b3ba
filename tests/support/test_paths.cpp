#include "support/test_paths.h"

namespace loom::test_paths {

const char* binary() { return LOOM_TEST_BINARY; }
const char* source_dir() { return LOOM_TEST_SOURCE_DIR; }
const char* data_dir() { return LOOM_TEST_DATA_DIR; }

}  // namespace loom::test_paths
