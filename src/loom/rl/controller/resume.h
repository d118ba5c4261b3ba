#pragma once
// Resuming a GRPO run (docs/grpo.md, "Resuming a run"): `loom grpo CONFIG train.resume=true` after
// the controller, its machine or the whole job ended. The learner's newest good checkpoint
// (RUN/learner/checkpoints/latest verified, or the newest sound one before it: the one the learner
// resumes from too) says how many steps are trained: the run goes on at that step, its workers serving those weights as that version. The
// controller's progress file (RUN/grpo/progress.json, rewritten atomically after every step) says
// how many prompts the rollouts had drawn, so the resumed run draws new ones. Metrics rows and
// validations of later steps (a step trained but not saved) are dropped, and, with a local launch,
// the earlier run's role logs kept beside the new ones.
#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "loom/config/run_config.h"

namespace loom::rl {

struct ControllerProgress {
  int64_t steps_done = 0;   // learner steps reported
  int64_t next_prompt = 0;  // prompts the rollouts drew (the next one's number)
  // The metrics row of step `steps_done` as it stood when the learner reported it, before its
  // refit (null when none): the learner has saved that step's weights by then, so a stop before
  // the row is written would otherwise lose it.
  nlohmann::json reported_row;
};

void write_progress(const std::string& grpo_dir, const ControllerProgress& progress);
// Nullopt when there is none; throws naming the file when it is malformed.
std::optional<ControllerProgress> read_progress(const std::string& grpo_dir);

struct ResumePoint {
  int64_t step = 0;         // learner steps trained: the weights' version
  std::string checkpoint;   // those weights
  int64_t next_prompt = 0;  // the first prompt the resumed rollouts draw
  // The row of step `step - 1` when the run stopped between that step's report and its row
  // (progress.json's reported_row), marked "refit_interrupted"; null otherwise.
  nlohmann::json unwritten_row;
};

// With train.resume, where the run goes on (nullopt: nothing saved yet, a fresh run); logs what
// it found.
std::optional<ResumePoint> find_resume_point(const config::RunConfig& config, std::ostream& log);

// Whether the metrics file at `path` holds a row of `step`.
bool has_metrics_row(const std::string& path, int64_t step);

// Renames `dir` to the first free `dir.1`, `dir.2`, ... when it exists (an earlier run's logs).
void set_aside(const std::string& dir, std::ostream& log);

}  // namespace loom::rl
