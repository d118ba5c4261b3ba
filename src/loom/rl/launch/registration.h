#pragma once
// How roles started by a launcher (grpo.launch = external) find each other: through files in
// the run directory, on a file system every node shares. Each role process writes, atomically,
// RUN/grpo/roles/<role>-<index>.json with where it serves; the controller reads them, writes
// RUN/grpo/roles.json (which names the controller and every role's registering process), and
// the roles wait until roles.json names them (then it is this run's, not a stale one).
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace loom::rl {

struct Registration {
  std::string role;        // environment | generation | learner
  int index = 0;           // among the processes of its role
  std::string host;        // this node's name (reachable from the others)
  int64_t pid = 0;         // the registering process (a server's supervisor, the learner's rank 0)
  std::string url;         // environment, generation: http://HOST:PORT of its server
  int64_t server_pid = 0;  // the server child's pid (on `host`)
  int starts = 1;          // starts of the server so far (a restart re-registers)
  int job_rank = -1;       // the process's rank in the launcher's job, -1 when not an MPI job
  int ranks = 1;           // learner: its ranks
  std::string failed;      // set when the role gave up (why); the controller fails naming it

  nlohmann::json to_json() const;
  static Registration from_json(const nlohmann::json& j, const std::string& path);
  // The same process and the same start of its server.
  bool same_start(const Registration& other) const {
    return host == other.host && pid == other.pid && starts == other.starts && url == other.url;
  }
  bool same_process(const Registration& other) const { return host == other.host && pid == other.pid; }
};

std::string registration_path(const std::string& grpo_dir, const std::string& role, int index);
// Null when the file does not exist; throws naming the file when it is malformed.
std::optional<Registration> read_registration(const std::string& grpo_dir, const std::string& role, int index);
// The same, but null also for a registration an earlier job left: written before `since` (the
// reader's start) by a process of this node that no longer runs (a job run again in its run
// directory, train.resume; one of another node cannot be told from a live one).
std::optional<Registration> read_registration_since(const std::string& grpo_dir, const std::string& role, int index,
                                                    std::filesystem::file_time_type since);
// Writes it atomically. A first registration (`first`) refuses a file naming another process
// of this role and index that may still run (a duplicate index: two processes launched as the
// same role), naming both.
void write_registration(const std::string& grpo_dir, const Registration& registration, bool first);
void remove_registration(const std::string& grpo_dir, const Registration& registration);

// The controller asks a role's supervisor to restart its server at `url` (it does not answer
// /health): RUN/grpo/roles/<role>-<index>.restart holds the URL and why. The supervisor takes
// the request (the file is removed) and restarts the server when the URL is still its own.
struct RestartRequest {
  std::string url, why;
};
void request_restart(const std::string& grpo_dir, const std::string& role, int index, const RestartRequest& request);
std::optional<RestartRequest> take_restart_request(const std::string& grpo_dir, const std::string& role, int index);

// This node's host name (gethostname).
std::string this_host();

// Whether roles.json (the controller's) names `mine`'s process as its role's `index` and has
// "finished": true / exists at all: how a role knows the run is over, or the controller there.
struct ControllerView {
  bool lists_me = false;
  bool finished = false;
  std::string controller;  // its URL
};
ControllerView read_controller_view(const std::string& grpo_dir, const Registration& mine);

}  // namespace loom::rl
