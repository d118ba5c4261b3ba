#pragma once
// A role's process as the controller runs it: argv executed in its own process group with
// stdout and stderr appended to a log file, SIGTERM to it if the controller dies
// (PR_SET_PDEATHSIG); polled for exit, stopped with SIGTERM then SIGKILL.
#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace loom::rl {

class ChildProcess {
 public:
  // Starts argv[0] (a path) with the rest as arguments; throws loom::Error when it cannot.
  // `outside_launcher`: without the variables an MPI or Slurm launcher gave this process
  // (OMPI_*, PMIX_*, PMI_*, SLURM_*), so that the child is not taken for one of the job's ranks.
  ChildProcess(std::vector<std::string> argv, std::string log_path, bool outside_launcher = false);
  ~ChildProcess();  // stops it
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  // The exit status once it has ended ("exited with 1", "killed by signal 9"), else nothing.
  std::optional<std::string> ended();
  // SIGTERM to its process group, SIGKILL after grace_s; waits for it.
  void stop(double grace_s = 5.0);
  void kill_now();  // SIGKILL (fault tests)
  const std::string& log_path() const { return log_path_; }
  // Where this start's output begins in the log (the log is appended to: a run started again in
  // its run directory finds the earlier run's output before it).
  off_t log_start() const { return log_start_; }

 private:
  pid_t pid_ = -1;
  off_t log_start_ = 0;
  bool reaped_ = false;
  std::string status_, log_path_;
};

// Waits up to timeout_s for a line "listening on http://HOST:PORT" in the log file after
// log_start() (what `loom serve` and `loom env serve` print once they listen) and returns "http://HOST:PORT";
// throws naming the log and its tail when the process ends first or the time runs out.
std::string wait_for_listening(ChildProcess& child, double timeout_s, const std::string& role);

}  // namespace loom::rl
