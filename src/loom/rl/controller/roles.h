#pragma once
// The environment servers and generation workers of a GRPO run, as child processes of the
// controller: started with port 0 (each prints where it listens), their addresses kept here and
// written to run.dir/grpo/roles.json, dead ones restarted (a restarted worker first loads the
// current weights), weights refit on every worker (POST /load_weights).
#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loom/config/run_config.h"
#include "loom/rl/agent_loop.h"
#include "loom/rl/controller/child_process.h"
#include "loom/rl/launch/registration.h"

namespace loom::rl {

struct RoleOptions {
  std::string loom_binary;         // the `loom` executable the roles run
  std::string log_dir;             // one log per start: <role>-<i>.<start>.log
  std::string checkpoint;          // the weights workers start from
  int64_t version = 0;             // and their version (learner steps trained)
  double start_timeout_s = 120.0;  // until a role listens
  // grpo.launch = external: the roles are started by a launcher, each registers itself under
  // grpo_dir/roles (launch/registration.h) and its supervisor restarts its server; these Roles
  // only read the registrations (the learner's too), load the current weights into a worker
  // that registers anew, and ask a supervisor to restart a server that does not answer.
  bool external = false;
  std::string grpo_dir;
};

class Roles {
 public:
  Roles(const config::RunConfig& config, RoleOptions options);
  ~Roles();
  void start_all(std::ostream& log);
  void stop_all();

  // The run's environments (config::run_environments) and, round-robin by `turn`, a server of one.
  const config::GrpoEnvironment& environment(int i) const { return environment_configs_.at(static_cast<size_t>(i)); }
  std::string environment_url(int environment, size_t turn) const;
  std::string worker_url(size_t i) const;
  size_t environment_servers() const { return environments_.size(); }
  size_t workers() const { return workers_.size(); }

  // A rollout saw `url` fail: the next check() probes it (GET /health) and restarts it if it
  // does not answer.
  void report_failure(FailedRole role, const std::string& url);
  // Restarts every role that ended or was reported and does not answer; logs each restart.
  // Throws when a role needed more than grpo.max_role_restarts restarts. External: takes up
  // new registrations, throws when a role's registration says it gave up. Returns whether an
  // address changed (roles.json is then out of date).
  bool check(std::ostream& log);
  int64_t restarts() const;

  // Every worker loads `checkpoint` as weight version `version` (in parallel). With
  // grpo.verify_refit each worker then reports the digest of the weights it holds
  // (GET /weights_digest), which must equal the checkpoint's (`loom ckpt digest`): a worker that
  // differs is an Error naming it. Returns the number of workers verified.
  // `sent`: grpo.refit = comm, the learner already sent the weights to the workers' processes;
  // each worker is then waited for (GET /v1/models) until it serves `version`, not asked to load.
  int refit(const std::string& checkpoint, int64_t version, bool sent = false);
  int64_t version() const;

  // {"environments": [url per server], "environment_names": [its environment's name per server],
  //  "generation_workers": [...], ...}
  nlohmann::json addresses() const;
  // Kills one role with SIGKILL (fault injection and tests): "environment" or "worker", index
  // (environment servers numbered across the environments).
  void kill(const std::string& kind, size_t index);

 private:
  struct Role {
    std::string kind;  // "environment" | "worker"
    size_t index = 0;
    int environment = 0;  // an environment server's: index into environment_configs_
    std::unique_ptr<ChildProcess> process;
    std::string url;
    int starts = 0;
    bool suspect = false;
    std::optional<Registration> registration;  // external: the one in use
    std::optional<Registration> tried;         // external: the last one taken up or refused
  };
  void start(Role& role, std::ostream& log);
  // External: waits (grpo.register_timeout_s) until every role and the learner registered.
  void wait_for_registrations(std::ostream& log);
  // External: a role's registration that is not the one in use is taken up; returns whether.
  bool adopt(Role& role, const Registration& registration, std::ostream& log);
  bool check_registered(std::ostream& log);
  static std::string registered_role(const Role& role) { return role.kind == "worker" ? "generation" : role.kind; }
  std::vector<std::string> command(const Role& role) const;

  const config::RunConfig& config_;
  RoleOptions options_;
  // The body of POST /load_weights that gives a worker the current weights and their version.
  nlohmann::json current_weights() const;

  const std::vector<config::GrpoEnvironment> environment_configs_;
  mutable std::mutex mutex_;  // guards urls, suspect flags, checkpoint_, version_
  std::vector<Role> environments_, workers_;  // environments_: every environment's servers, in order
  std::optional<Registration> learner_;  // external: the learner's rank 0
  // External: when these Roles began; a registration of a dead process written before is an
  // earlier job's (the run started again in its directory).
  const std::filesystem::file_time_type started_ = std::filesystem::file_time_type::clock::now();
  std::string checkpoint_;
  int64_t version_ = 0;
  int64_t restarts_ = 0;
};

}  // namespace loom::rl
