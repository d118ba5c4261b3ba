#include "loom/ops/supervisor.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <ostream>
#include <set>

#include "loom/core/error.h"
#include "loom/ops/heartbeat.h"

extern char** environ;

namespace loom::ops {

namespace fs = std::filesystem;

namespace {

std::atomic<int> g_signal{0};
std::atomic<int> g_signal_count{0};
extern "C" void on_supervisor_signal(int sig) {
  g_signal.store(sig);
  g_signal_count.fetch_add(1);
}

// SIGINT/SIGTERM are recorded (and forwarded to the job by the poll loop) while supervising.
class SignalGuard {
 public:
  SignalGuard() {
    g_signal.store(0);
    g_signal_count.store(0);
    struct sigaction action {};
    action.sa_handler = on_supervisor_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = 0;  // no SA_RESTART: sleeps end at once
    sigaction(SIGINT, &action, &old_int_);
    sigaction(SIGTERM, &action, &old_term_);
  }
  ~SignalGuard() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }

 private:
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
};

void sleep_seconds(double s) {
  timespec t{};
  t.tv_sec = static_cast<time_t>(s);
  t.tv_nsec = static_cast<long>((s - static_cast<double>(t.tv_sec)) * 1e9);
  ::nanosleep(&t, nullptr);  // a signal ends it early, which is what we want
}

bool alive(int64_t pid) {
  return pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM);
}

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return std::to_string(sig) + (abbrev ? " (SIG" + std::string(abbrev) + ")" : "");
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "was killed by signal " + signal_name(WTERMSIG(status));
  return "ended with status " + std::to_string(status);
}

std::string join_command(const std::vector<std::string>& argv) {
  std::string out;
  for (const std::string& a : argv) {
    const bool quote = a.empty() || a.find_first_of(" \t\"'$\\") != std::string::npos;
    out += (out.empty() ? "" : " ") + (quote ? "'" + a + "'" : a);
  }
  return out;
}

// Starts `argv` in a new process group with the supervisor's variables in its environment.
// Returns the pid, or -1 with `error` set when the command cannot be executed.
pid_t spawn(const std::vector<std::string>& argv, const std::string& heartbeat_dir, int attempt, std::string& error) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view entry(*e);
    if (entry.starts_with(std::string(kHeartbeatDirEnv) + "=") || entry.starts_with(std::string(kRestartCountEnv) + "=")) {
      continue;
    }
    env_strings.emplace_back(entry);
  }
  env_strings.push_back(std::string(kHeartbeatDirEnv) + "=" + heartbeat_dir);
  env_strings.push_back(std::string(kRestartCountEnv) + "=" + std::to_string(attempt));
  std::vector<char*> envp, args;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (std::string& s : argv_copy) args.push_back(s.data());
  args.push_back(nullptr);

  int fds[2];
  LOOM_CHECK(::pipe2(fds, O_CLOEXEC) == 0, std::string("loom launch: pipe: ") + std::strerror(errno));
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    throw Error(std::string("loom launch: fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    // If the supervisor dies (even by SIGKILL) the job gets SIGTERM rather than running on unwatched.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(127);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGINT, &dfl, nullptr);
    sigaction(SIGTERM, &dfl, nullptr);
    ::execvpe(args[0], args.data(), envp.data());
    const int err = errno;
    [[maybe_unused]] ssize_t n = ::write(fds[1], &err, sizeof err);
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here, so that signals to the group cannot race the child's own call
  ::close(fds[1]);
  int err = 0;
  ssize_t n;
  do {
    n = ::read(fds[0], &err, sizeof err);
  } while (n < 0 && errno == EINTR);
  ::close(fds[0]);
  if (n == static_cast<ssize_t>(sizeof err)) {
    ::waitpid(pid, nullptr, 0);
    error = "cannot execute '" + argv[0] + "': " + std::strerror(err);
    return -1;
  }
  return pid;
}

// Stops the job: SIGTERM to its process group, SIGKILL after the grace period (also to the
// rank processes on this host that the heartbeats name), then waits until those are gone.
void stop_job(pid_t pid, bool reaped, const std::vector<HeartbeatRecord>& records, double grace_s, std::ostream& log) {
  if (::kill(-pid, 0) == 0) ::kill(-pid, SIGTERM);
  const double deadline = wall_seconds() + grace_s;
  while (!reaped && wall_seconds() < deadline) {
    if (::waitpid(pid, nullptr, WNOHANG) == pid) {
      reaped = true;
      break;
    }
    sleep_seconds(0.05);
  }
  const std::string host = host_name();
  std::set<int64_t> ranks;
  for (const HeartbeatRecord& r : records) {
    if (r.host == host && r.pid > 0 && r.pid != pid) ranks.insert(r.pid);
  }
  if (!reaped) {
    log << "loom launch: the job did not stop within " << grace_s << " s of SIGTERM; sending SIGKILL" << std::endl;
  }
  if (::kill(-pid, 0) == 0) ::kill(-pid, SIGKILL);
  if (!reaped) {
    while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
  const double rank_deadline = wall_seconds() + std::max(grace_s, 1.0);
  for (int64_t rank_pid : ranks) {
    while (alive(rank_pid) && wall_seconds() < rank_deadline) sleep_seconds(0.05);
    if (alive(rank_pid)) ::kill(static_cast<pid_t>(rank_pid), SIGKILL);
  }
}

struct AttemptResult {
  enum class Kind { Exited, Failed, Interrupted } kind = Kind::Failed;
  int status = 0;      // waitpid status when the child exited
  std::string reason;  // for failures
  std::string cause;   // the reason in a few words
  bool logged = false;  // the failure was logged already
  bool child_exited = false;  // the failure is the job's own exit (status holds it)
  std::vector<HeartbeatRecord> last_records;
};

AttemptResult run_attempt(const SupervisorOptions& options, const std::vector<std::string>& argv,
                          const std::string& heartbeat_dir, int attempt, std::ostream& log) {
  clear_heartbeats(heartbeat_dir);
  std::string error;
  const double started = wall_seconds();
  const pid_t pid = spawn(argv, heartbeat_dir, attempt, error);
  AttemptResult result;
  if (pid < 0) {  // kind stays Failed
    result.status = -1;
    result.reason = error;
    result.cause = error;
    return result;
  }
  const std::string host = host_name();
  int forwarded = 0;
  for (;;) {
    int status = 0;
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    std::vector<HeartbeatRecord> records = read_heartbeats(heartbeat_dir, attempt);
    if (!records.empty()) result.last_records = records;
    if (done == pid) {
      result.status = status;
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (ok) {
        result.kind = AttemptResult::Kind::Exited;
      } else {
        result.kind = AttemptResult::Kind::Failed;
        result.child_exited = true;
        result.reason = "the job " + describe_status(status);
        result.cause = result.reason;
        // Processes of the job may linger (e.g. ranks of a launcher that died).
        stop_job(pid, true, result.last_records, options.grace_s, log);
      }
      if (forwarded > 0) result.kind = AttemptResult::Kind::Interrupted;
      return result;
    }
    if (const int sig = g_signal.load(); sig != 0) {
      const int count = g_signal_count.load();
      if (count > forwarded) {
        const int how = count >= 2 ? SIGKILL : SIGTERM;
        log << "loom launch: got signal " << signal_name(sig) << "; sending " << (how == SIGKILL ? "SIGKILL" : "SIGTERM")
            << " to the job" << (how == SIGTERM ? " (it saves a checkpoint and stops; signal again to kill it)" : "")
            << std::endl;
        ::kill(-pid, how);
        forwarded = count;
      }
    } else {
      std::optional<std::string> failure =
          diagnose_dead_ranks(records, host, [&](int64_t p) { return p == pid || alive(p); });
      if (failure) {
        failure = "a rank process died: " + *failure;
        result.cause = "a rank process died";
      } else if (std::optional<std::string> hang = diagnose_hang(records, wall_seconds(), started, options.hang_timeout_s)) {
        failure = "hang: " + *hang;
        result.cause = "a hang";
      }
      if (failure) {
        result.kind = AttemptResult::Kind::Failed;
        result.reason = *failure;
        result.logged = true;
        log << "loom launch: attempt " << attempt + 1 << " failed: " << result.reason << std::endl;
        bool reaped = false;
        if (result.cause == "a rank process died") {
          // A launcher (mpirun, srun) notices a dead rank and aborts the job itself: let it, for up
          // to the grace period, rather than signal it in the middle of its own abort.
          const double deadline = wall_seconds() + options.grace_s;
          while (!reaped && wall_seconds() < deadline) {
            reaped = ::waitpid(pid, &status, WNOHANG) == pid;
            if (!reaped) sleep_seconds(0.05);
          }
          if (reaped) log << "loom launch: the job " << describe_status(status) << std::endl;
        }
        if (!reaped) log << "loom launch: stopping the job (process group " << pid << ")" << std::endl;
        stop_job(pid, reaped, records, options.grace_s, log);
        return result;
      }
    }
    sleep_seconds(options.poll_s);
  }
}

// Whether any rank's heartbeat got as far as a step: before that (config, layout, data, the
// run directory, loading a checkpoint) a failure is deterministic and a restart repeats it.
bool reached_a_step(const std::vector<HeartbeatRecord>& records) {
  return std::any_of(records.begin(), records.end(), [](const HeartbeatRecord& r) { return r.step > 0; });
}

// The status a shell would report for the job's waitpid status.
int shell_status(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return kLaunchGaveUp;
}

// The wait before restart `restart` (1, 2, ...): the initial backoff, doubling, capped.
double restart_backoff(const SupervisorOptions& options, int restart) {
  const double cap = std::max(kMaxRestartBackoffS, options.restart_backoff_s);
  double wait = options.restart_backoff_s;
  for (int i = 1; i < restart && wait < cap; ++i) wait *= 2.0;
  return std::min(wait, cap);
}

// Sleeps `seconds` unless SIGINT/SIGTERM arrives first; false then.
bool wait_unless_signalled(double seconds) {
  const double deadline = wall_seconds() + seconds;
  while (g_signal.load() == 0) {
    const double left = deadline - wall_seconds();
    if (left <= 0) return true;
    sleep_seconds(std::min(left, 0.25));
  }
  return false;
}

// Where the ranks write heartbeats: --heartbeat-dir (created), or a fresh directory under
// $TMPDIR that `own` says to remove at the end.
std::string heartbeat_directory(const SupervisorOptions& options, bool& own) {
  own = options.heartbeat_dir.empty();
  if (own) {
    std::string pattern = (fs::temp_directory_path() / "loom-launch-XXXXXX").string();  // mkdtemp fills the Xs
    LOOM_CHECK(::mkdtemp(pattern.data()) != nullptr,
               "loom launch: cannot create a heartbeat directory under " + fs::temp_directory_path().string() +
                   ": " + std::strerror(errno));
    return pattern;
  }
  std::error_code ec;
  fs::create_directories(options.heartbeat_dir, ec);
  LOOM_CHECK(!ec, "loom launch: cannot create --heartbeat-dir '" + options.heartbeat_dir + "': " + ec.message());
  return fs::absolute(options.heartbeat_dir).string();
}

// The end of an attempt whose job exited 0: finished, or stopped early on purpose.
int exited_cleanly(const AttemptResult& result, int attempt, std::ostream& log) {
  const auto rank0 = std::find_if(result.last_records.begin(), result.last_records.end(),
                                  [](const HeartbeatRecord& r) { return r.rank == 0; });
  if (rank0 != result.last_records.end() && !rank0->finished) {
    log << "loom launch: the job exited 0 at step " << rank0->step
        << " before its last step (stopped by train.exit_interval or a signal); not restarting" << std::endl;
    return kLaunchStoppedEarly;
  }
  log << "loom launch: training finished on attempt " << attempt + 1 << " (" << attempt << " restart(s))"
      << std::endl;
  return kLaunchFinished;
}

}  // namespace

int supervise(const SupervisorOptions& options, std::ostream& log) {
  LOOM_CHECK(!options.command.empty(), "loom launch: no command given (loom launch [options] -- loom train CONFIG ...)");
  LOOM_CHECK(options.max_restarts >= 0, "loom launch: --max-restarts must be >= 0");
  LOOM_CHECK(options.restart_backoff_s >= 0, "loom launch: --restart-backoff-s must be >= 0");
  bool own_dir = false;
  const std::string heartbeat_dir = heartbeat_directory(options, own_dir);
  struct Cleanup {
    std::string dir;
    bool own;
    ~Cleanup() {
      std::error_code ec;
      if (own) fs::remove_all(dir, ec);
    }
  } cleanup{heartbeat_dir, own_dir};

  SignalGuard signals;
  log << "loom launch: heartbeats in " << heartbeat_dir << "; hang timeout ";
  if (options.hang_timeout_s > 0) {
    log << options.hang_timeout_s << " s";
  } else {
    log << "off";
  }
  log << "; up to " << options.max_restarts << " restart(s)" << std::endl;
  for (int attempt = 0;; ++attempt) {
    std::vector<std::string> argv = options.command;
    if (attempt > 0 && options.resume) argv.push_back("train.resume=true");
    log << "loom launch: attempt " << attempt + 1 << " of " << options.max_restarts + 1 << ": " << join_command(argv)
        << std::endl;
    AttemptResult result = run_attempt(options, argv, heartbeat_dir, attempt, log);
    if (result.kind == AttemptResult::Kind::Interrupted) {
      const int sig = g_signal.load();
      log << "loom launch: interrupted by signal " << signal_name(sig) << "; the job " << describe_status(result.status)
          << "; not restarting" << std::endl;
      return 128 + sig;
    }
    if (result.kind == AttemptResult::Kind::Exited) return exited_cleanly(result, attempt, log);
    if (result.status == -1 && attempt == 0) {  // could not execute the command at all
      log << "loom launch: " << result.reason << std::endl;
      return kLaunchCannotStart;
    }
    if (!result.logged) log << "loom launch: attempt " << attempt + 1 << " failed: " << result.reason << std::endl;
    log << "loom launch: last heartbeats: " << summarize_heartbeats(result.last_records) << std::endl;
    if (result.child_exited && !reached_a_step(result.last_records)) {
      log << "loom launch: the job failed before any rank reached its first step (its error is above); a restart "
             "would fail the same way: not restarting"
          << std::endl;
      return shell_status(result.status);
    }
    if (attempt >= options.max_restarts) {
      log << "loom launch: giving up: " << options.max_restarts << " restart(s) used up (--max-restarts "
          << options.max_restarts << "); training did not finish. Last failure: " << result.reason << std::endl;
      return kLaunchGaveUp;
    }
    const double backoff = restart_backoff(options, attempt + 1);
    log << "loom launch: restart " << attempt + 1 << " of " << options.max_restarts << " after " << result.cause
        << (options.resume ? "; resuming from the latest good checkpoint (train.resume=true)" : "");
    if (backoff > 0) log << " in " << backoff << " s";
    log << std::endl;
    if (!wait_unless_signalled(backoff)) {
      const int sig = g_signal.load();
      log << "loom launch: interrupted by signal " << signal_name(sig) << " before restart " << attempt + 1
          << "; not restarting" << std::endl;
      return 128 + sig;
    }
  }
}

}  // namespace loom::ops
