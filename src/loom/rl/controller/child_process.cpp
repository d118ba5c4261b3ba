#include "loom/rl/controller/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "loom/core/error.h"

namespace loom::rl {

namespace {
std::string describe(int status) {
  if (WIFEXITED(status)) return "exited with " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("killed by signal ") + std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) + ")";
  return "ended";
}

// This process's environment, less what a launcher set for its ranks.
std::vector<std::string> environment_outside_launcher() {
  std::vector<std::string> out;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    bool launcher = false;
    for (const char* prefix : {"OMPI_", "PMIX_", "PMI_", "SLURM_", "OPAL_", "PRTE_"}) launcher |= entry.rfind(prefix, 0) == 0;
    if (!launcher) out.push_back(entry);
  }
  return out;
}

// The file from byte `offset` on.
std::string read_from(const std::string& path, off_t offset) {
  std::ifstream in(path);
  in.seekg(offset);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}
}  // namespace

ChildProcess::ChildProcess(std::vector<std::string> argv, std::string log_path, bool outside_launcher)
    : log_path_(std::move(log_path)) {
  LOOM_CHECK(!argv.empty(), "ChildProcess: empty command");
  const int log = ::open(log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  LOOM_CHECK(log >= 0, "cannot open the role's log '" + log_path_ + "': " + std::strerror(errno));
  log_start_ = ::lseek(log, 0, SEEK_END);  // an earlier run's lines before it are not this start's
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  std::vector<std::string> environment = outside_launcher ? environment_outside_launcher() : std::vector<std::string>();
  std::vector<char*> envp;
  for (auto& e : environment) envp.push_back(e.data());
  envp.push_back(nullptr);
  const pid_t parent = ::getpid();
  pid_ = ::fork();
  if (pid_ < 0) {
    ::close(log);
    throw Error(std::string("fork: ") + std::strerror(errno));
  }
  if (pid_ == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(127);  // the controller is already gone
    ::dup2(log, STDOUT_FILENO);
    ::dup2(log, STDERR_FILENO);
    if (outside_launcher) {
      ::execve(args[0], args.data(), envp.data());
    } else {
      ::execv(args[0], args.data());
    }
    const std::string message = std::string("cannot execute '") + args[0] + "': " + std::strerror(errno) + "\n";
    (void)!::write(STDERR_FILENO, message.data(), message.size());
    ::_exit(127);
  }
  ::setpgid(pid_, pid_);
  ::close(log);
}

ChildProcess::~ChildProcess() {
  try {
    stop(2.0);
  } catch (...) {
  }
}

std::optional<std::string> ChildProcess::ended() {
  if (reaped_) return status_;
  int status = 0;
  const pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == 0) return std::nullopt;
  reaped_ = true;
  status_ = r == pid_ ? describe(status) : "ended (not waitable)";
  return status_;
}

void ChildProcess::stop(double grace_s) {
  if (ended()) return;
  ::kill(-pid_, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_s);
  while (!ended() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  if (!ended()) {
    ::kill(-pid_, SIGKILL);
    while (!ended()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

void ChildProcess::kill_now() {
  if (!ended()) ::kill(-pid_, SIGKILL);
}

std::string wait_for_listening(ChildProcess& child, double timeout_s, const std::string& role) {
  static const std::regex listening("listening on (http://[0-9A-Za-z.:\\-\\[\\]]+:[0-9]+)");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (true) {
    const std::string log = read_from(child.log_path(), child.log_start());
    std::smatch m;
    if (std::regex_search(log, m, listening)) return m[1].str();
    const auto status = child.ended();
    const bool late = std::chrono::steady_clock::now() > deadline;
    if (status || late) {
      const std::string tail = log.size() > 2000 ? log.substr(log.size() - 2000) : log;
      throw Error(role + " (pid " + std::to_string(child.pid()) + ") " +
                  (status ? *status + " before listening" : "did not listen within " + std::to_string(timeout_s) + " s") +
                  "; its log '" + child.log_path() + "' ends:\n" + tail);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace loom::rl
