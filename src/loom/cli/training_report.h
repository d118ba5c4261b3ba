#pragma once
// The summary `loom train` and `loom sft` print when a run ends, and their exit status.
#include "loom/train/training_loop.h"

namespace loom::cli {

// Prints the summary (on the reporting process) and returns the exit status (ops/exit_status.h).
int report_training(const train::TrainSummary& summary);

}  // namespace loom::cli
