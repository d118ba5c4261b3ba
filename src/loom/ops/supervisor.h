#pragma once
// `loom launch`: runs a training command (`loom train ...`, `mpirun ... loom train ...`,
// `srun ... loom train ...`) under supervision and restarts it from the latest good checkpoint
// when a rank dies or the job hangs. Usage and rules: docs/operations.md.
//
// Each attempt runs the command in its own process group with LOOM_HEARTBEAT_DIR (where the
// ranks write heartbeats, see heartbeat.h) and LOOM_RESTART_COUNT (0, 1, ...; faults fire only
// at 0) in its environment; restarts append `train.resume=true`. The supervisor polls the
// child and the heartbeats; on a failure (non-zero exit or a signal, a rank process gone, a
// hang) it logs the diagnosis, stops the process group (SIGTERM, SIGKILL after the grace
// period) and starts the next attempt after a backoff, up to max_restarts times. A failure
// before the first step is not restarted.
#include <iosfwd>
#include <string>
#include <vector>

namespace loom::ops {

struct SupervisorOptions {
  std::vector<std::string> command;  // argv of the job
  int max_restarts = 3;
  double hang_timeout_s = 180.0;  // no progress this long = a hang; 0 = do not detect hangs
  double grace_s = 10.0;          // between SIGTERM and SIGKILL when stopping the job
  double poll_s = 0.25;
  std::string heartbeat_dir;      // empty: a fresh directory under $TMPDIR, removed at the end
  bool resume = true;             // append train.resume=true to restarts
  // Seconds to wait before the first restart, doubling for each further one up to
  // kMaxRestartBackoffS (or this value when it is larger); 0 restarts at once.
  double restart_backoff_s = 1.0;
};

inline constexpr double kMaxRestartBackoffS = 30.0;

// Exit codes of supervise().
inline constexpr int kLaunchFinished = 0;       // training finished
inline constexpr int kLaunchGaveUp = 1;         // the last allowed attempt failed too
inline constexpr int kLaunchCannotStart = 2;    // the command could not be executed
inline constexpr int kLaunchStoppedEarly = 3;   // the job exited 0 before its last step
// 128 + signal when the supervisor itself got SIGINT/SIGTERM (forwarded to the job).
// A job that fails before any rank reached its first step (a bad config or layout, a missing
// dataset: it would fail the same way again) is not restarted: its own exit status is returned
// (128 + signal when a signal ended it).

// Runs the job as above, logging to `log` (lines start with "loom launch: ").
int supervise(const SupervisorOptions& options, std::ostream& log);

}  // namespace loom::ops
