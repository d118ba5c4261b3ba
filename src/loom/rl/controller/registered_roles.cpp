// Roles with grpo.launch = external (roles.h): the roles register themselves; the controller
// takes their addresses up, loads the current weights into a worker that (re)registers, and
// asks a supervisor to restart a server that does not answer.
#include <chrono>
#include <ostream>
#include <thread>

#include "loom/config/grpo_environments.h"
#include "loom/core/error.h"
#include "loom/rl/controller/roles.h"
#include "loom/rl/http_json.h"

namespace loom::rl {

namespace {
std::string describe(const std::string& role, int index, const Registration& r) {
  return role + " " + std::to_string(index) + " on " + r.host + " (pid " + std::to_string(r.pid) + ")";
}

[[noreturn]] void gave_up(const std::string& role, int index, const Registration& r) {
  throw Error("loom grpo: " + describe(role, index, r) + " gave up: " + r.failed);
}
}  // namespace

bool Roles::adopt(Role& role, const Registration& registration, std::ostream& log) {
  const std::string name = describe(registered_role(role), static_cast<int>(role.index), registration);
  role.tried = registration;
  if (role.kind == "worker") {
    // Whatever it started from, it serves the current weights under their version.
    try {
      post_ok(registration.url, "/load_weights", current_weights(), options_.start_timeout_s);
    } catch (const HttpFailure& e) {
      log << "loom grpo: " << name << " registered " << registration.url << " but did not load the weights (" << e.what()
          << "); waiting for it to register again" << std::endl;
      return false;
    }
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (role.registration) ++restarts_;
    role.url = registration.url;
    role.suspect = false;
    role.registration = registration;
  }
  log << "loom grpo: " << name << " serves on " << registration.url << " (server pid " << registration.server_pid << ", start "
      << registration.starts << ")" << std::endl;
  return true;
}

void Roles::wait_for_registrations(std::ostream& log) {
  const double timeout_s = config_.grpo.register_timeout_s;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (true) {
    std::string missing;
    for (auto* list : {&environments_, &workers_}) {
      for (Role& r : *list) {
        if (r.registration) continue;
        const std::string role = registered_role(r);
        const auto registration = read_registration_since(options_.grpo_dir, role, static_cast<int>(r.index), started_);
        if (registration && !registration->failed.empty()) gave_up(role, static_cast<int>(r.index), *registration);
        if (registration && !(r.tried && r.tried->same_start(*registration)) && adopt(r, *registration, log)) continue;
        missing += (missing.empty() ? "" : ", ") + role + " " + std::to_string(r.index);
      }
    }
    if (!learner_) {
      if (const auto registration = read_registration_since(options_.grpo_dir, "learner", 0, started_)) {
        std::lock_guard<std::mutex> lock(mutex_);
        learner_ = registration;
      } else {
        missing += std::string(missing.empty() ? "" : ", ") + "learner 0";
      }
    }
    if (missing.empty()) return;
    LOOM_CHECK(std::chrono::steady_clock::now() < deadline,
               "loom grpo: after " + std::to_string(timeout_s) + " s (grpo.register_timeout_s) these roles have not registered in " +
                   options_.grpo_dir + "/roles: " + missing + "; grpo.launch = external expects " +
                   std::to_string(environments_.size()) + " environment (" +
                   config::environment_servers_key(config_.grpo) + "), grpo.generation_workers = " +
                   std::to_string(config_.grpo.generation_workers) +
                   " generation and one learner job, each started as `loom grpo --role ROLE CONFIG` with this run.dir");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

bool Roles::check_registered(std::ostream& log) {
  bool changed = false;
  for (auto* list : {&environments_, &workers_}) {
    for (Role& r : *list) {
      const std::string role = registered_role(r);
      const int index = static_cast<int>(r.index);
      const auto registration = read_registration_since(options_.grpo_dir, role, index, started_);
      if (!registration) continue;  // its supervisor ended (the run is finishing)
      if (!registration->failed.empty()) gave_up(role, index, *registration);
      if (!r.registration || !r.registration->same_start(*registration)) {
        if (!(r.tried && r.tried->same_start(*registration))) changed |= adopt(r, *registration, log);
        continue;
      }
      std::string url;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!r.suspect) continue;
        r.suspect = false;
        url = r.url;
      }
      std::string why;
      try {
        if (get_json(url, "/health", 5.0).status == 200) continue;
        why = "answers /health with an error";
      } catch (const HttpFailure& e) {
        why = std::string("does not answer /health: ") + e.what();
      }
      log << "loom grpo: " << describe(role, index, *registration) << ": " << url << " " << why
          << "; asking its supervisor to restart it" << std::endl;
      request_restart(options_.grpo_dir, role, index, {url, why});
    }
  }
  const auto learner = read_registration_since(options_.grpo_dir, "learner", 0, started_);
  if (learner && (!learner_ || !learner_->same_process(*learner))) {
    log << "loom grpo: " << describe("learner", 0, *learner) << " registered (" << learner->ranks << " ranks)" << std::endl;
    std::lock_guard<std::mutex> lock(mutex_);
    learner_ = learner;
    changed = true;
  }
  return changed;
}

}  // namespace loom::rl
