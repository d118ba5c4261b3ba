#include "loom/rl/learner_client.h"

#include <chrono>
#include <filesystem>
#include <thread>

#include "loom/core/atomic_file.h"
#include "loom/core/error.h"
#include "loom/rl/http_json.h"
#include "loom/rl/rollout_json.h"

namespace loom::rl {

using nlohmann::json;

std::string find_controller(const std::string& grpo_dir, double wait_s) {
  const std::string path = grpo_dir + "/roles.json";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
  while (true) {
    if (std::filesystem::exists(path)) {
      const json roles = json::parse(read_file(path), nullptr, false);
      if (roles.is_object() && roles.contains("controller") && roles["controller"].is_string() &&
          !roles["controller"].get<std::string>().empty())
        return roles["controller"].get<std::string>();
    }
    LOOM_CHECK(std::chrono::steady_clock::now() < deadline,
               "loom grpo learner: no controller named in '" + path + "' after " + std::to_string(wait_s) +
                   " s (is `loom grpo` running with this run.dir?)");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

std::string find_controller_listing(const std::string& grpo_dir, const Registration& me, double wait_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
  while (true) {
    const ControllerView view = read_controller_view(grpo_dir, me);
    if (view.lists_me && !view.controller.empty()) return view.controller;
    LOOM_CHECK(std::chrono::steady_clock::now() < deadline,
               "loom grpo learner: no controller took up its registration ('" + registration_path(grpo_dir, me.role, me.index) +
                   "') in '" + grpo_dir + "/roles.json' after " + std::to_string(wait_s) +
                   " s (is `loom grpo --role controller` running with this run.dir and grpo.launch=external?)");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

std::string LearnerClient::batch_text(int64_t step) const {
  // The controller answers when the step's groups exist: wait as long as it may.
  const JsonReply reply = get_json(url_, "/batch?step=" + std::to_string(step), timeout_s_ + 60.0);
  LOOM_CHECK(reply.status == 200, "loom grpo learner: the controller " + url_ + " refused the batch of step " +
                                      std::to_string(step) + ": " + reply.error_message());
  return reply.body.dump();
}

int64_t LearnerClient::steps_done() const {
  const JsonReply reply = get_json(url_, "/health", 30.0);
  LOOM_CHECK(reply.status == 200 && reply.body.contains("steps_done") && reply.body["steps_done"].is_number_integer(),
             "loom grpo learner: the controller " + url_ + " did not answer /health with steps_done");
  return reply.body["steps_done"].get<int64_t>();
}

std::string LearnerClient::step_done(int64_t step, const std::string& checkpoint, const json& metrics,
                                     const std::string& refit) const {
  const json reply =
      post_ok(url_, "/step_done", {{"step", step}, {"checkpoint", checkpoint}, {"metrics", metrics}, {"refit", refit}}, timeout_s_);
  return reply.value("weight_version", "");
}

std::vector<RolloutGroup> groups_of_batch(const std::string& text, int64_t step) {
  const json batch = json::parse(text, nullptr, false);
  LOOM_CHECK(batch.is_object() && batch.contains("groups"), "the controller's batch of step " + std::to_string(step) + " is not a batch object");
  LOOM_CHECK(batch.value("step", int64_t{-1}) == step, "the controller answered the batch of step " +
                                                          std::to_string(batch.value("step", int64_t{-1})) + " for step " + std::to_string(step));
  return groups_from_json(batch["groups"], "batch.groups");
}

}  // namespace loom::rl
