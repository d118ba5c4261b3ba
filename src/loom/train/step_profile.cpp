#include "loom/train/step_profile.h"

#include <algorithm>
#include <string>

#include "loom/core/error.h"
#include "loom/kernels/ops.h"
#include "loom/train/batch_schedule.h"

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

std::string describe_profile(const config::RunConfig& run, int64_t done_steps, int64_t total_steps) {
  const config::ProfileConfig& p = run.profile;
  if (p.first_step == 0) return "";
  const int64_t first = p.first_step, last = p.last_step > 0 ? p.last_step : p.first_step;
  const std::string steps = first == last ? "step " + std::to_string(first)
                                          : "steps " + std::to_string(first) + "-" + std::to_string(last);
  if (first > total_steps) {
    return "profile: " + steps + " past " + run_length_key(run.train) + ": no step is traced\n";
  }
  if (last <= done_steps) {
    return "profile: " + steps + " done before this run resumed at step " + std::to_string(done_steps) +
           ": no step is traced\n";
  }
  std::string ranks;
  for (const int r : p.ranks) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  ranks = p.ranks.empty() ? "every rank" : (p.ranks.size() == 1 ? "rank " : "ranks ") + ranks;
  return "profile: " + steps + " of " + ranks + " traced to " + run.run.dir +
         "/profile/rank-<r>.json (a summary printed here when rank 0 is one)\n";
}

}  // namespace loom::train
