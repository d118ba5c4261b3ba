#include "loom/cli/training_report.h"

#include <cmath>
#include <iostream>

#include "loom/ops/exit_status.h"

namespace loom::cli {

int report_training(const train::TrainSummary& s) {
  if (!s.reporter) return ops::kExitFinished;  // another process (MPI rank 0) reports
  if (s.evaluated_only) {
    const auto loss = [](const char* name, double value) {
      std::cout << name << " " << std::to_string(value) << " (perplexity " << std::to_string(std::exp(value)) << ")";
    };
    std::cout << "evaluated step " << s.last_step << ": ";
    if (s.last_val_loss) loss("val_loss", *s.last_val_loss);
    if (s.last_val_loss && s.test_loss) std::cout << ", ";
    if (s.test_loss) loss("test_loss", *s.test_loss);
    std::cout << "\n";
    return ops::kExitFinished;
  }
  if (s.steps_run == 0) return ops::kExitFinished;  // already complete: restore() said so
  std::cout << "trained steps " << s.first_step << ".." << s.last_step << ": loss " << s.first_loss << " -> "
            << s.last_loss;
  if (s.first_val_loss && s.last_val_loss) {
    std::cout << ", val_loss " << *s.first_val_loss << " -> " << *s.last_val_loss;
  }
  if (s.test_loss) std::cout << ", test_loss " << *s.test_loss;
  std::cout << "; " << static_cast<int64_t>(s.tokens_per_s) << " tokens/s, " << s.gflops_per_s << " GFLOP/s\n";
  if (!s.checkpoint.empty()) std::cout << "checkpoint: " << s.checkpoint << "\n";
  if (s.stop_signal != 0) {
    std::cout << "interrupted at step " << s.last_step << " of " << s.total_steps
              << "; continue with train.resume=true\n";
    return ops::exit_status_interrupted(s.stop_signal);
  }
  return ops::kExitFinished;
}

}  // namespace loom::cli
