#pragma once
// The profiled steps of this rank (profile.*; ops/step_trace.h): its trace, or none when the run
// profiles no step or not this rank.
#include <cstdint>
#include <memory>
#include <string>

#include "loom/config/run_config.h"
#include "loom/core/device.h"
#include "loom/ops/step_trace.h"

namespace loom::train {

// Throws loom::Error naming profile.ranks when it names a rank the world does not have.
std::unique_ptr<ops::StepTrace> make_step_trace(const config::RunConfig& run, int rank, int world_size,
                                                Device device);
// The start-up line about profile.*: which steps of which ranks are traced and where to, or why
// none is (past train.steps, or before the step a resumed run starts after, `done_steps`); "" when
// profiling is off.
std::string describe_profile(const config::RunConfig& run, int64_t done_steps, int64_t total_steps);

}  // namespace loom::train
