#include "loom/train/step_profile.h"

#include <algorithm>
#include <string>

#include "loom/core/error.h"
#include "loom/kernels/ops.h"

namespace loom::train {

std::unique_ptr<ops::StepTrace> make_step_trace(const config::RunConfig& run, int rank, int world_size,
                                                Device device) {
  const config::ProfileConfig& p = run.profile;
  for (const int r : p.ranks) {
    LOOM_CHECK(r < world_size, "profile.ranks names rank " + std::to_string(r) + ", but the run has " +
                                   std::to_string(world_size) + " rank(s) (valid: 0.." +
                                   std::to_string(world_size - 1) + ", or [] for every rank)");
  }
  const bool traced = p.ranks.empty() || std::find(p.ranks.begin(), p.ranks.end(), rank) != p.ranks.end();
  if (p.first_step == 0 || !traced) return nullptr;
  ops::StepTraceSettings settings;
  settings.first_step = p.first_step;
  settings.last_step = p.last_step > 0 ? p.last_step : p.first_step;
  settings.rank = rank;
  settings.path = run.run.dir + "/profile/rank-" + std::to_string(rank) + ".json";
  if (!device.is_cpu()) {
    if (p.synchronize) settings.synchronize = [device] { allocator(device).synchronize(); };
    settings.device_profiler = [device](bool start) { kernels::device_profiler_capture(device, start); };
  }
  return std::make_unique<ops::StepTrace>(std::move(settings));
}

}  // namespace loom::train
