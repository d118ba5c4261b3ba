#pragma once
// A generation role's side of grpo.refit = comm (rl/refit_communication.h): a thread of the
// role's process (an MPI process of the job the learner shares) receives every learner step's
// parameters in buckets, places them in full tensors, hands them to its server child as a
// checkpoint in memory (/dev/shm, the newest kept) with POST /load_weights under the step's weight
// version, and goes on until the version of train.steps. The controller, told by the learner,
// waits for the worker to report that version.
#include <atomic>
#include <functional>
#include <iosfwd>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "loom/comm/communicator.h"
#include "loom/config/run_config.h"

namespace loom::rl {

class CommRefitReceiver {
 public:
  // `server_url`: the server's current address (it changes when the server is restarted).
  // Collective with the learner's ranks (the refit group is made here).
  CommRefitReceiver(const config::RunConfig& config, std::function<std::string()> server_url, std::ostream& log);
  ~CommRefitReceiver();
  // The receiver's error (a refit that failed), empty while none.
  std::string error() const;
  bool done() const { return done_; }

 private:
  void run();

  const config::RunConfig& config_;
  std::function<std::string()> server_url_;
  std::ostream& log_;
  std::unique_ptr<comm::Communicator> group_;
  std::string root_;  // the in-memory checkpoints' root
  mutable std::mutex mutex_;
  std::string error_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

}  // namespace loom::rl
