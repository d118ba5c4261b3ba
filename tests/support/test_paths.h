#pragma once
// Where the build under test lives: the `loom` executable, the repository and the verified data.
// Only tests/support/test_paths.cpp is compiled with these absolute paths, so no other test object
// depends on where the checkout is, and a compiler cache shares them between checkouts.
#include <string>

namespace loom::test_paths {

std::string binary();      // the `loom` executable of this build
std::string source_dir();  // the repository's root
std::string data_dir();    // the build's verified data directory (LOOM_DATA_DIR)

}  // namespace loom::test_paths
