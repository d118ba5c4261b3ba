#pragma once
// Launch options for `ranks` ranks as threads of the test's process (the threads backend), with
// a 30 s timeout so that a test that would hang fails instead. Test support only.
#include <chrono>

#include "loom/comm/launch.h"

namespace loom::testing {

inline comm::LaunchOptions threads(int ranks) {
  comm::LaunchOptions options;
  options.backend = "threads";
  options.ranks = ranks;
  options.comm.timeout = std::chrono::seconds(30);
  return options;
}

}  // namespace loom::testing
