#pragma once
// Where the build under test lives: the `loom` executable, the repository and the verified data.
// Only tests/support/test_paths.cpp is compiled with these absolute paths, so no other test object
// depends on where the checkout is, and a compiler cache shares them between checkouts.
namespace loom::test_paths {

const char* binary();      // the `loom` executable of this build
const char* source_dir();  // the repository's root
const char* data_dir();    // the build's verified data directory (LOOM_DATA_DIR)

}  // namespace loom::test_paths
