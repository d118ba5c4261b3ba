#pragma once
// The exit statuses of `loom train`, so scripts can tell a finished run from one that was
// interrupted or failed (docs/operations.md). `loom launch` has its own (ops/supervisor.h).
namespace loom::ops {

inline constexpr int kExitFinished = 0;  // reached train.steps, was already complete, or stopped by
                                         // train.exit_interval (a planned stop)
inline constexpr int kExitError = 1;     // bad input or a failure, with a message naming it
// Interrupted by SIGINT/SIGTERM after a step with a checkpoint: 128 + the signal's number (130,
// 143), as a shell reports a process the signal ended; continue with train.resume=true.
inline constexpr int exit_status_interrupted(int signal_number) { return 128 + signal_number; }

}  // namespace loom::ops
