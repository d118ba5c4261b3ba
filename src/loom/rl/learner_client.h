#pragma once
// The learner's side of the controller's HTTP protocol (controller/controller.h): the
// controller's address from run.dir/grpo/roles.json, a step's groups, and the report that a
// step's weights are saved.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loom/rl/launch/registration.h"
#include "loom/rl/rollout.h"

namespace loom::rl {

// Waits up to wait_s for `grpo_dir`/roles.json to name the controller; returns its URL.
std::string find_controller(const std::string& grpo_dir, double wait_s);
// grpo.launch = external: waits up to wait_s for a roles.json that lists `me` (the learner's
// registration: a controller of this run took it up, not one of an earlier run); its controller's URL.
std::string find_controller_listing(const std::string& grpo_dir, const Registration& me, double wait_s);

class LearnerClient {
 public:
  LearnerClient(std::string controller_url, double step_timeout_s) : url_(std::move(controller_url)), timeout_s_(step_timeout_s) {}
  // The JSON text of step `step`'s groups (blocks while the controller waits for them).
  std::string batch_text(int64_t step) const;
  // How many steps the controller has seen reported (GET /health).
  int64_t steps_done() const;
  // Step `step` is trained and its weights are complete at `checkpoint`; returns the workers' new version.
  // `refit`: "checkpoint" (the controller has the workers load it) or "comm" (the learner sent
  // the weights to the workers itself; the controller waits for them to report the version).
  std::string step_done(int64_t step, const std::string& checkpoint, const nlohmann::json& metrics,
                        const std::string& refit = "checkpoint") const;

 private:
  std::string url_;
  double timeout_s_;
};

// The groups of a /batch answer's text; throws naming the field when it is malformed.
std::vector<RolloutGroup> groups_of_batch(const std::string& text, int64_t step);

}  // namespace loom::rl
