#include "loom/rl/launch/role_supervisor.h"

#include <unistd.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <ostream>
#include <thread>

#include "loom/core/atomic_file.h"
#include "loom/core/error.h"
#include "loom/rl/controller/child_process.h"
#include "loom/rl/launch/comm_refit_receiver.h"
#include "loom/rl/launch/registration.h"
#include "loom/rl/launch/server_command.h"

namespace loom::rl {

namespace {

class Supervisor {
 public:
  Supervisor(const config::RunConfig& config, const SupervisorOptions& options, std::ostream& log)
      : config_(config), options_(options), log_(log) {
    me_.role = options.placement.role;
    me_.index = options.placement.index;
    me_.host = this_host();
    me_.pid = ::getpid();
    me_.job_rank = options.placement.job_rank;
    me_.starts = 0;
    name_ = me_.role + " " + std::to_string(me_.index);
  }

  // Starts (or restarts) the server and registers its address.
  void start() {
    const std::string log_path = options_.grpo_dir + "/logs/" + me_.role + "-" + std::to_string(me_.index) + "." +
                                 std::to_string(me_.starts) + ".log";
    server_ = std::make_unique<ChildProcess>(
        server_command(config_, me_.role, me_.index, options_.loom_binary, config_.train.init_from, "0.0.0.0"), log_path,
        true);
    const std::string url = url_on_host(wait_for_listening(*server_, options_.start_timeout_s, name_), me_.host);
    ++me_.starts;
    {
      std::lock_guard<std::mutex> lock(url_mutex_);
      me_.url = url;
    }
    me_.server_pid = server_->pid();
    write_registration(options_.grpo_dir, me_, me_.starts == 1);
    log_ << "loom grpo: " << name_ << " on " << me_.host << " (server pid " << me_.server_pid << ") listening on " << url
         << "; registered in " << registration_path(options_.grpo_dir, me_.role, me_.index) << std::endl;
  }

  // grpo.refit = comm: receives each step's weights for the server (after the first start).
  void receive_refits() {
    receiver_ = std::make_unique<CommRefitReceiver>(config_, [this] {
      std::lock_guard<std::mutex> lock(url_mutex_);
      return me_.url;
    }, log_);
  }

  // One look at the server and the run; returns false once the run is finished.
  bool check() {
    if (receiver_ && !receiver_->error().empty()) throw Error("loom grpo: " + name_ + ": " + receiver_->error());
    if (read_controller_view(options_.grpo_dir, me_).finished) return false;
    // Another process took this role's index: a duplicate (both were launched as it).
    const auto registered = read_registration(options_.grpo_dir, me_.role, me_.index);
    if (registered && !registered->same_process(me_)) write_registration(options_.grpo_dir, me_, false);  // throws naming both
    std::string why;
    if (const auto status = server_->ended()) {
      why = "its server (pid " + std::to_string(server_->pid()) + ") " + *status;
    } else if (const auto request = take_restart_request(options_.grpo_dir, me_.role, me_.index); request && request->url == me_.url) {
      why = "the controller reports that its server " + me_.url + " " + request->why;
      server_->kill_now();
      server_->stop();
    } else {
      return true;
    }
    if (me_.starts > config_.grpo.max_role_restarts) {
      me_.failed = why + ", after " + std::to_string(me_.starts - 1) + " restarts (grpo.max_role_restarts = " +
                   std::to_string(config_.grpo.max_role_restarts) + "); its log: " + server_->log_path();
      write_registration(options_.grpo_dir, me_, false);
      throw Error("loom grpo: " + name_ + ": " + me_.failed);
    }
    log_ << "loom grpo: " << name_ << ": " << why << "; restarting it (restart " << me_.starts << ", log "
         << server_->log_path() << ")" << std::endl;
    start();
    return true;
  }

  // Stops the server; `unregister`: its registration goes too (not when it records a failure).
  void stop(bool unregister) {
    if (server_) server_->stop();
    if (unregister) remove_registration(options_.grpo_dir, me_);
  }

 private:
  const config::RunConfig& config_;
  const SupervisorOptions& options_;
  std::ostream& log_;
  Registration me_;
  std::string name_;
  std::unique_ptr<ChildProcess> server_;
  std::mutex url_mutex_;  // me_.url, read by the refit receiver's thread
  std::unique_ptr<CommRefitReceiver> receiver_;
};

}  // namespace

int supervise_role(const config::RunConfig& config, const SupervisorOptions& options, std::ostream& log,
                   const std::atomic<bool>& stop) {
  LOOM_CHECK(options.placement.role == "environment" || options.placement.role == "generation",
             "supervise_role: role '" + options.placement.role + "' has no server");
  LOOM_CHECK(!config.train.init_from.empty() || options.placement.role == "environment",
             "loom grpo: train.init_from must name the checkpoint the generation workers start from");
  make_directories(options.grpo_dir + "/logs", "the role's logs, under run.dir");
  Supervisor supervisor(config, options, log);
  try {
    supervisor.start();
    if (config.grpo.refit == "comm" && options.placement.role == "generation") {
      LOOM_CHECK(options.placement.mpi, "grpo.refit = 'comm': generation " + std::to_string(options.placement.index) +
                                            " is not in an MPI job with the learner (one mpirun with every role, srun "
                                            "--multi-prog, a heterogeneous Slurm job)");
      supervisor.receive_refits();
    }
    while (!stop) {
      if (!supervisor.check()) {
        log << "loom grpo: " << options.placement.role << " " << options.placement.index << ": the run is finished" << std::endl;
        supervisor.stop(true);
        return 0;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
  } catch (...) {
    supervisor.stop(false);
    throw;
  }
  supervisor.stop(true);
  return 128 + 15;
}

}  // namespace loom::rl
