#include "loom/rl/launch/registration.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include "loom/core/atomic_file.h"
#include "loom/core/error.h"

namespace loom::rl {

using nlohmann::json;

json Registration::to_json() const {
  json j = {{"role", role}, {"index", index}, {"host", host}, {"pid", pid}, {"url", url}, {"server_pid", server_pid},
            {"starts", starts}, {"job_rank", job_rank}, {"ranks", ranks}};
  if (!failed.empty()) j["failed"] = failed;
  return j;
}

Registration Registration::from_json(const json& j, const std::string& path) {
  LOOM_CHECK(j.is_object() && j.contains("role") && j["role"].is_string() && j.contains("index") &&
                 j["index"].is_number_integer() && j.contains("host") && j["host"].is_string() && j.contains("pid") &&
                 j["pid"].is_number_integer(),
             "the role registration '" + path + "' is not an object with role, index, host and pid");
  Registration r;
  r.role = j["role"].get<std::string>();
  r.index = j["index"].get<int>();
  r.host = j["host"].get<std::string>();
  r.pid = j["pid"].get<int64_t>();
  r.url = j.value("url", "");
  r.server_pid = j.value("server_pid", int64_t{0});
  r.starts = j.value("starts", 1);
  r.job_rank = j.value("job_rank", -1);
  r.ranks = j.value("ranks", 1);
  r.failed = j.value("failed", "");
  return r;
}

std::string registration_path(const std::string& grpo_dir, const std::string& role, int index) {
  return grpo_dir + "/roles/" + role + "-" + std::to_string(index) + ".json";
}

std::optional<Registration> read_registration(const std::string& grpo_dir, const std::string& role, int index) {
  const std::string path = registration_path(grpo_dir, role, index);
  std::string text;
  try {
    text = read_file(path);
  } catch (const Error&) {
    if (!std::filesystem::exists(path)) return std::nullopt;
    throw;
  }
  const json j = json::parse(text, nullptr, false);
  return Registration::from_json(j, path);
}

std::string this_host() {
  char name[256] = {0};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

namespace {
// A process named by a registration may still run: on this node, when its pid is alive; on
// another node there is no telling.
bool may_run(const Registration& r) {
  if (r.host != this_host()) return true;
  return ::kill(static_cast<pid_t>(r.pid), 0) == 0 || errno == EPERM;
}
}  // namespace

std::optional<Registration> read_registration_since(const std::string& grpo_dir, const std::string& role, int index,
                                                    std::filesystem::file_time_type since) {
  std::optional<Registration> r = read_registration(grpo_dir, role, index);
  if (!r || may_run(*r)) return r;
  std::error_code ec;
  const auto written = std::filesystem::last_write_time(registration_path(grpo_dir, role, index), ec);
  return !ec && written < since ? std::nullopt : r;
}

void write_registration(const std::string& grpo_dir, const Registration& registration, bool first) {
  const std::string path = registration_path(grpo_dir, registration.role, registration.index);
  if (const auto existing = read_registration(grpo_dir, registration.role, registration.index);
      existing && !existing->same_process(registration) && (!first || may_run(*existing))) {
    throw Error("loom grpo: " + registration.role + " " + std::to_string(registration.index) +
                " is registered twice: by process " + std::to_string(existing->pid) + " on " + existing->host +
                " and by process " + std::to_string(registration.pid) + " on " + registration.host + " ('" + path +
                "'); each process of a role needs its own index (one MPI job: every role's processes are numbered "
                "by the launcher; otherwise SLURM_PROCID). A file left by a run that is over may be removed");
  }
  make_directories(grpo_dir + "/roles", "the roles' registrations, under run.dir");
  write_file_atomic(path, registration.to_json().dump() + "\n");
}

void remove_registration(const std::string& grpo_dir, const Registration& registration) {
  const auto existing = read_registration(grpo_dir, registration.role, registration.index);
  std::error_code ignored;
  if (existing && existing->same_process(registration))
    std::filesystem::remove(registration_path(grpo_dir, registration.role, registration.index), ignored);
}

namespace {
std::string restart_path(const std::string& grpo_dir, const std::string& role, int index) {
  return grpo_dir + "/roles/" + role + "-" + std::to_string(index) + ".restart";
}
}  // namespace

void request_restart(const std::string& grpo_dir, const std::string& role, int index, const RestartRequest& request) {
  make_directories(grpo_dir + "/roles", "the roles' restart requests, under run.dir");
  write_file_atomic(restart_path(grpo_dir, role, index), json({{"url", request.url}, {"why", request.why}}).dump() + "\n");
}

std::optional<RestartRequest> take_restart_request(const std::string& grpo_dir, const std::string& role, int index) {
  const std::string path = restart_path(grpo_dir, role, index);
  if (!std::filesystem::exists(path)) return std::nullopt;
  json j;
  try {
    j = json::parse(read_file(path), nullptr, false);
  } catch (const Error&) {
    return std::nullopt;
  }
  std::error_code ignored;
  std::filesystem::remove(path, ignored);
  if (!j.is_object()) return std::nullopt;
  return RestartRequest{j.value("url", ""), j.value("why", "")};
}

ControllerView read_controller_view(const std::string& grpo_dir, const Registration& mine) {
  ControllerView view;
  const std::string path = grpo_dir + "/roles.json";
  if (!std::filesystem::exists(path)) return view;
  json roles;
  try {
    roles = json::parse(read_file(path), nullptr, false);
  } catch (const Error&) {
    return view;  // replaced between the check and the read
  }
  if (!roles.is_object() || !roles.contains("registered") || !roles["registered"].is_array()) return view;
  for (const json& r : roles["registered"]) {
    if (!r.is_object()) continue;
    const Registration other = Registration::from_json(r, path);
    if (other.role == mine.role && other.index == mine.index && other.same_process(mine)) view.lists_me = true;
  }
  if (!view.lists_me) return view;
  view.finished = roles.value("finished", false);
  view.controller = roles.value("controller", "");
  return view;
}

}  // namespace loom::rl
