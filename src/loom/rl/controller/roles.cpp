#include "loom/rl/controller/roles.h"

#include <chrono>
#include <filesystem>
#include <mutex>
#include <ostream>
#include <thread>

#include "loom/ckpt/digest.h"
#include "loom/config/grpo_environments.h"
#include "loom/core/error.h"
#include "loom/rl/http_json.h"
#include "loom/rl/launch/server_command.h"

namespace loom::rl {

Roles::Roles(const config::RunConfig& config, RoleOptions options)
    : config_(config), options_(std::move(options)), environment_configs_(config::run_environments(config.grpo)),
      checkpoint_(options_.checkpoint), version_(options_.version) {
  auto role = [](const std::string& kind, int index, int environment) {
    Role r;
    r.kind = kind;
    r.index = static_cast<size_t>(index);
    r.environment = environment;
    return r;
  };
  for (size_t e = 0; e < environment_configs_.size(); ++e) {
    for (int s = 0; s < environment_configs_[e].servers; ++s)
      environments_.push_back(role("environment", static_cast<int>(environments_.size()), static_cast<int>(e)));
  }
  for (int i = 0; i < config.grpo.generation_workers; ++i) workers_.push_back(role("worker", i, 0));
}

Roles::~Roles() { stop_all(); }

std::vector<std::string> Roles::command(const Role& role) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::string kind = role.kind == "environment" ? "environment" : "generation";
  return server_command(config_, kind, static_cast<int>(role.index), options_.loom_binary, checkpoint_, "");
}

nlohmann::json Roles::current_weights() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {{"path", checkpoint_}, {"version", "step-" + std::to_string(version_)}};
}

void Roles::start(Role& role, std::ostream& log) {
  const std::string name = role.kind + " " + std::to_string(role.index);
  const std::string log_path = options_.log_dir + "/" + role.kind + "-" + std::to_string(role.index) + "." +
                               std::to_string(role.starts++) + ".log";
  role.process = std::make_unique<ChildProcess>(command(role), log_path);
  const std::string url = wait_for_listening(*role.process, options_.start_timeout_s, name);
  if (role.kind == "worker") {
    // Whatever checkpoint it started from, it serves the current weights under their version.
    post_ok(url, "/load_weights", current_weights(), options_.start_timeout_s);
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    role.url = url;
    role.suspect = false;
  }
  log << "loom grpo: " << name << " (pid " << role.process->pid() << ") listening on " << url;
  if (role.kind == "environment") log << " (environment '" << environment(role.environment).name << "')";
  log << std::endl;
}

void Roles::start_all(std::ostream& log) {
  if (options_.external) {
    wait_for_registrations(log);
    return;
  }
  for (Role& r : environments_) start(r, log);
  for (Role& r : workers_) start(r, log);
}

void Roles::stop_all() {
  // External roles are the launcher's: they end when roles.json says the run is finished.
  for (Role& r : workers_) {
    if (r.process) r.process->stop();
  }
  for (Role& r : environments_) {
    if (r.process) r.process->stop();
  }
}

std::string Roles::environment_url(int environment, size_t turn) const {
  // Its servers are consecutive in environments_.
  size_t first = 0;
  for (int e = 0; e < environment; ++e) first += static_cast<size_t>(this->environment(e).servers);
  const size_t servers = static_cast<size_t>(this->environment(environment).servers);
  std::lock_guard<std::mutex> lock(mutex_);
  return environments_.at(first + turn % servers).url;
}

std::string Roles::worker_url(size_t i) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return workers_.at(i % workers_.size()).url;
}

void Roles::report_failure(FailedRole role, const std::string& url) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (Role& r : role == FailedRole::Environment ? environments_ : workers_) {
    if (r.url == url) r.suspect = true;
  }
}

bool Roles::check(std::ostream& log) {
  if (options_.external) return check_registered(log);
  bool changed = false;
  for (auto* list : {&environments_, &workers_}) {
    for (Role& r : *list) {
      std::string why;
      if (const auto status = r.process->ended()) {
        why = *status;
      } else {
        bool suspect = false;
        std::string url;
        {
          std::lock_guard<std::mutex> lock(mutex_);
          suspect = r.suspect;
          url = r.url;
        }
        if (!suspect) continue;
        try {
          if (get_json(url, "/health", 5.0).status == 200) {
            std::lock_guard<std::mutex> lock(mutex_);
            r.suspect = false;
            continue;
          }
          why = "its /health is not ok";
        } catch (const HttpFailure& e) {
          why = std::string("it does not answer /health: ") + e.what();
        }
        r.process->kill_now();
        r.process->stop();
      }
      const std::string name = r.kind + " " + std::to_string(r.index);
      LOOM_CHECK(r.starts <= config_.grpo.max_role_restarts,
                 "loom grpo: " + name + " failed again (" + why + ") after " + std::to_string(r.starts - 1) +
                     " restarts (grpo.max_role_restarts = " + std::to_string(config_.grpo.max_role_restarts) +
                     "); its log: " + r.process->log_path());
      log << "loom grpo: " << name << " (pid " << r.process->pid() << ") " << why << "; restarting it (restart "
          << r.starts << ", log " << r.process->log_path() << ")" << std::endl;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        ++restarts_;
      }
      start(r, log);
      changed = true;
    }
  }
  return changed;
}

int64_t Roles::restarts() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return restarts_;
}

int64_t Roles::version() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return version_;
}

namespace {
// grpo.refit = comm: waits until the worker at `url` serves `version` (its process loads what
// the learner sent); an HttpFailure when it does not within timeout_s.
void wait_for_version(const std::string& url, const std::string& version, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (true) {
    const JsonReply reply = get_json(url, "/v1/models", timeout_s);
    if (reply.status == 200 && reply.body.contains("data") && reply.body["data"].is_array() && !reply.body["data"].empty() &&
        reply.body["data"][0].value("weight_version", "") == version)
      return;
    if (std::chrono::steady_clock::now() > deadline)
      throw HttpFailure(url + " does not serve weight version " + version + " within " + std::to_string(timeout_s) + " s");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}
}  // namespace

int Roles::refit(const std::string& checkpoint, int64_t version, bool sent) {
  // An asynchronous save renames its directory into place once complete: wait for it.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(config_.grpo.generation_timeout_s);
  while (!std::filesystem::exists(checkpoint)) {
    LOOM_CHECK(std::chrono::steady_clock::now() < deadline,
               "loom grpo: the learner's checkpoint '" + checkpoint + "' did not appear within grpo.generation_timeout_s = " +
                   std::to_string(config_.grpo.generation_timeout_s) + " s");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::vector<std::string> urls;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    checkpoint_ = checkpoint;  // a worker restarted from now on starts from these weights
    for (const Role& r : workers_) urls.push_back(r.url);
  }
  const std::string expected = config_.grpo.verify_refit ? ckpt::parameter_digest(checkpoint) : "";
  std::mutex checked_mutex;
  std::vector<std::string> mismatches;
  int verified = 0;
  std::vector<std::thread> threads;
  for (const std::string& url : urls) {
    threads.emplace_back([&, url] {
      try {
        if (sent) {
          wait_for_version(url, "step-" + std::to_string(version), config_.grpo.generation_timeout_s);
        } else {
          post_ok(url, "/load_weights", {{"path", checkpoint}, {"version", "step-" + std::to_string(version)}},
                  config_.grpo.generation_timeout_s);
        }
        if (expected.empty()) return;
        const JsonReply reply = get_json(url, "/weights_digest", config_.grpo.generation_timeout_s);
        if (reply.status != 200) throw HttpFailure(url + "/weights_digest: " + reply.error_message());
        const std::string held = reply.body.value("digest", "");
        std::lock_guard<std::mutex> lock(checked_mutex);
        if (held == expected) {
          ++verified;
        } else {
          mismatches.push_back("generation worker " + url + " holds weights of digest " + held);
        }
      } catch (const HttpFailure&) {
        report_failure(FailedRole::Generation, url);  // restarted by check(), with these weights
      }
    });
  }
  for (auto& t : threads) t.join();
  if (!mismatches.empty()) {
    std::string message = "loom grpo: after the refit to " + checkpoint + " (digest " + expected + "):";
    for (const std::string& m : mismatches) message += "\n  " + m;
    throw Error(message);
  }
  // Only now may rollouts count on the new version (reservations are made with it).
  std::lock_guard<std::mutex> lock(mutex_);
  version_ = version;
  return verified;
}

nlohmann::json Roles::addresses() const {
  std::lock_guard<std::mutex> lock(mutex_);
  nlohmann::json env = nlohmann::json::array(), names = nlohmann::json::array(), workers = nlohmann::json::array(),
                 pids = nlohmann::json::object();
  for (const Role& r : environments_) {
    env.push_back(r.url);
    names.push_back(environment(r.environment).name);
  }
  for (const Role& r : workers_) workers.push_back(r.url);
  for (const auto* list : {&environments_, &workers_}) {
    for (const Role& r : *list) {
      if (r.process) pids[r.url] = r.process->pid();
    }
  }
  nlohmann::json out = {{"environments", env},         {"environment_names", names}, {"generation_workers", workers},
                        {"pids", pids},               {"weight_version", version_}, {"checkpoint", checkpoint_},
                        {"launch", options_.external ? "external" : "local"}};
  if (options_.external) {
    nlohmann::json registered = nlohmann::json::array();
    for (const auto* list : {&environments_, &workers_}) {
      for (const Role& r : *list) {
        if (r.registration) {
          registered.push_back(r.registration->to_json());
          pids[r.url] = r.registration->server_pid;
        }
      }
    }
    if (learner_) registered.push_back(learner_->to_json());
    out["registered"] = registered;
    out["pids"] = pids;
  }
  return out;
}

void Roles::kill(const std::string& kind, size_t index) {
  auto& list = kind == "environment" ? environments_ : workers_;
  LOOM_CHECK(!options_.external, "Roles::kill: the roles of an external launch are not this process's children");
  LOOM_CHECK(index < list.size(), "no " + kind + " " + std::to_string(index));
  list[index].process->kill_now();
}

}  // namespace loom::rl
