#pragma once
// The GRPO controller (`loom grpo`, docs/grpo.md "Controller and refit"): starts the
// environment servers and generation workers (Roles), runs the rollout threads that fill the
// replay buffer, serves the buffer to the learner over HTTP, refits the workers after each
// learner step, restarts dead roles, and writes one metrics row per step. With train.resume it
// goes on from the learner's newest checkpoint (controller/resume.h).
//
// The learner protocol (HTTP on the controller, its address in run.dir/grpo/roles.json):
//   GET  /batch?step=S  -> {"step", "groups": [...], "waited_s"}: blocks until step S's groups
//                          exist (weight version >= S - grpo.max_staleness); asking again for
//                          the same step (a restarted learner) gets the same groups
//   POST /step_done {"step": S, "checkpoint": PATH, "metrics": {...}} -> {"weight_version"}:
//                          step S is trained and its weights saved at PATH (complete); every
//                          worker loads them as version S + 1; with "refit": "comm" the
//                          learner already sent them (grpo.refit = comm) and the controller
//                          waits for every worker to serve version S + 1
//   GET  /health, GET /roles (the addresses)
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <ostream>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "loom/config/metrics.h"
#include "loom/config/run_config.h"
#include "loom/rl/controller/draft_metrics.h"
#include "loom/rl/controller/prompt_mix.h"
#include "loom/rl/controller/roles.h"
#include "loom/rl/controller/step_metrics.h"
#include "loom/rl/replay_buffer.h"

namespace httplib {
class Server;
}

namespace loom::rl {

struct ControllerOptions {
  std::string loom_binary;                // the executable the roles run
  std::string initial_checkpoint;         // weights of version 0 (train.init_from)
  // The learner's command (argv), started once the roles listen and run.dir/grpo/roles.json
  // names the controller (where the learner finds it); empty: the learner is started by
  // someone else (mpirun, srun, a test).
  std::vector<std::string> learner_command;
  int port = 0;                           // the controller's HTTP port (0: any)
};

class Controller {
 public:
  Controller(const config::RunConfig& config, ControllerOptions options, std::ostream& log);
  ~Controller();
  // Runs until the learner reports train.steps steps (0 when it did), or fails (throws).
  int run();
  // Stops run() from another thread (a signal): roles are stopped, run() returns 128 + 15.
  void request_stop();

  // For tests: the roles (to kill one), the URL the learner uses, the buffer.
  Roles& roles() { return *roles_; }
  std::string url() const { return url_; }
  bool listening() const { return listening_; }

 private:
  void serve_learner_api();
  void rollout_loop(int thread);
  nlohmann::json batch_for(int64_t step);
  nlohmann::json step_done(const nlohmann::json& body);
  // Validates the workers' weights (version = learner steps trained); appends the result to
  // run.dir/validation.jsonl and returns it for the step's metrics row.
  nlohmann::json run_validation(int64_t weight_version);
  void write_roles_file(bool finished = false);
  // grpo.dynamic_sampling: counts a dropped zero-variance group; too many in a row end the run.
  void note_filtered_group(const std::string& prompt);
  // "prompt 12 (countdown's task 8)", or "prompt 12" with one environment.
  std::string prompt_name(int64_t index, const EnvironmentPrompt& prompt) const;
  // Ends the run with `message` (run() throws it once the roles are stopped).
  void fail_run(const std::string& message);

  const config::RunConfig& config_;
  ControllerOptions options_;
  std::ostream& log_;
  std::mutex log_mutex_, roles_file_mutex_;
  std::unique_ptr<Roles> roles_;
  ReplayBuffer buffer_;
  PromptMix mix_;  // prompt n's environment and task index
  StepMetrics metrics_;
  DraftMetrics draft_metrics_;  // grpo.worker_speculative_tokens: the workers' drafts kept
  std::unique_ptr<httplib::Server> http_;
  std::string url_;
  std::atomic<bool> listening_{false}, stopping_{false};
  std::atomic<int64_t> next_prompt_{0}, steps_done_{0};
  std::atomic<int64_t> filtered_in_a_row_{0};  // grpo.dynamic_sampling: zero-variance groups since the last kept one
  std::shared_mutex refit_lock_;  // inflight_updates = wait: held shared by a group, exclusively by a refit
  std::mutex batch_mutex_;        // guards batches_
  std::map<int64_t, TakenBatch> batches_;  // handed out, not yet done (a restarted learner asks again)
  std::map<int64_t, std::chrono::steady_clock::time_point> taken_at_;
  std::unique_ptr<config::MetricsWriter> writer_;
  nlohmann::json unwritten_row_;  // train.resume: the stopped run's last reported step's row, if lost
  std::unique_ptr<ChildProcess> learner_;
  std::mutex fatal_mutex_;
  std::string fatal_;             // a rollout thread's error that ends the run
};

}  // namespace loom::rl
