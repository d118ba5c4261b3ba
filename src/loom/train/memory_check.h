#pragma once
// The line a training run prints after its first step: the memory `loom plan memory` planned for
// this layout against what the step measured. Measured = the process's resident-set high-water
// mark during the first step (reset as it starts, /proc/self/clear_refs) less the resident set
// before the trainer built anything, so start-up (a ZeRO-3 model initialised in full before it is
// sharded) and the binary's own pages are left out. The threads backend runs every rank in one
// process: the plan is then summed over the ranks. On a GPU it adds the device allocator's
// committed bytes at their peak during the first step (ZeRO 2 and 3 decommit what they release).
#include <cstdint>
#include <string>

#include "loom/comm/mesh.h"
#include "loom/config/run_config.h"
#include "loom/core/device.h"

namespace loom::train {

class MemoryCheck {
 public:
  MemoryCheck();  // records the resident set now (before the model is built)
  void start_step(Device device);  // resets the high-water marks (the process's and the device's)
  // Planned and measured bytes for the ranks of this process; `threads`: every rank is here.
  struct Result {
    int64_t planned = 0, measured = 0, allocator_peak = 0;
    // On a GPU: its allocator's committed bytes at their peak in the step, and after it.
    int64_t device_peak = 0, device_now = 0;
    int ranks = 1;
  };
  Result measure(const config::RunConfig& run, comm::MeshShape shape, int pp_rank, bool threads) const;
  std::string report(const Result& result) const;

 private:
  int64_t rss_start_ = 0;
  bool peak_reset_ = false;
  Device device_;
};

}  // namespace loom::train
