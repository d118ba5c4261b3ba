#include "loom/rl/launch/placement.h"

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "loom/comm/launch.h"
#include "loom/comm/role_world.h"
#include "loom/config/grpo_environments.h"
#include "loom/core/error.h"

namespace loom::rl {

namespace {
const std::vector<std::string>& role_names() {
  static const std::vector<std::string> names = {"controller", "environment", "generation", "learner"};
  return names;
}

int role_color(const std::string& role) {
  const auto& names = role_names();
  return static_cast<int>(std::find(names.begin(), names.end(), role) - names.begin());
}

int environment_int(const char* name, int fallback) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  char* end = nullptr;
  const long parsed = std::strtol(value, &end, 10);
  LOOM_CHECK(*end == '\0' && parsed >= 0, std::string("loom grpo: the launcher's ") + name + " = '" + value + "' is not an integer >= 0");
  return static_cast<int>(parsed);
}
}  // namespace

void check_role_name(const std::string& role) {
  const auto& names = role_names();
  if (std::find(names.begin(), names.end(), role) != names.end()) return;
  std::string valid;
  for (const auto& n : names) valid += (valid.empty() ? "" : ", ") + n;
  throw Error("loom grpo --role '" + role + "' is not a role; valid: " + valid);
}

RolePlacement place_role(const std::string& role, const config::RunConfig& config) {
  check_role_name(role);
  RolePlacement p;
  p.role = role;
  if (comm::detect_backend() == "mpi") {
    // grpo.refit = comm: the learner's ranks (first) and the workers share a second split.
    const bool exchanges = config.grpo.refit == "comm" && (role == "learner" || role == "generation");
    const comm::RoleWorld world = comm::join_role_world(role_color(role), exchanges ? 0 : -1, role == "learner" ? 0 : 1);
    p.index = world.rank;
    p.count = world.size;
    p.job_rank = world.job_rank;
    p.mpi = true;
  } else {
    p.index = environment_int("SLURM_PROCID", 0);
  }
  const int wanted = role == "controller"    ? 1
                     : role == "environment" ? config::environment_server_count(config.grpo)
                     : role == "generation"  ? config.grpo.generation_workers
                                             : -1;  // the learner: as many ranks as launched
  const std::string key = role == "environment"  ? config::environment_servers_key(config.grpo)
                          : role == "generation" ? "grpo.generation_workers"
                                                 : "one controller";
  if (wanted > 0 && p.mpi) {
    LOOM_CHECK(p.count == wanted, "loom grpo: the launcher started " + std::to_string(p.count) + " process(es) of role " + role +
                                      " but the config asks for " + std::to_string(wanted) + " (" + key + ")");
  } else if (wanted > 0) {
    LOOM_CHECK(p.index < wanted, "loom grpo: role " + role + " has index " + std::to_string(p.index) +
                                     " (SLURM_PROCID) but the config asks for " + std::to_string(wanted) + " (" + key + ")");
  }
  return p;
}

}  // namespace loom::rl
