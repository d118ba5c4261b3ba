#pragma once
// The step loop every recipe runs on its Trainer: steps to its end (train.steps or train.samples),
// evaluating every train.eval_interval steps (and on the test set after the last step), writing
// metrics.jsonl and the progress bar (rank 0), saving every
// checkpoint.interval steps and at the end, and stopping after a step with a checkpoint on
// SIGINT/SIGTERM, after train.exit_interval steps or once train.exit_duration_mins have passed.
#include <chrono>
#include <optional>
#include <string>

#include "loom/train/trainer.h"

namespace loom::train {

struct TrainSummary {
  bool reporter = true;  // this process hosts rank 0 (the one that prints and writes files)
  int first_step = 0;    // the first step this invocation ran
  int last_step = 0;     // the last step completed
  int steps_run = 0;     // steps this invocation ran (0: the run was already complete)
  int64_t total_steps = 0;  // the run's steps (train.steps, or those of train.samples)
  bool stopped_early = false;  // stopped before train.steps (a signal, train.exit_interval, exit_duration_mins)
  int stop_signal = 0;         // the signal (SIGINT, SIGTERM) that stopped it, 0 if none
  double first_loss = 0.0, last_loss = 0.0;
  std::optional<double> first_val_loss, last_val_loss;
  std::optional<double> test_loss;  // on the test set, after the last step
  double tokens_per_s = 0.0;  // mean over steps after the first
  double gflops_per_s = 0.0;  // achieved model FLOP/s over the same steps
  std::string checkpoint;     // the last checkpoint written
  bool evaluated_only = false;  // train.skip_train: last_step is the evaluated step, nothing was trained
};

// Runs `trainer` (restored already) to the end, and evaluates `test` (when not null) after the
// last step. Collective over the trainer's world. `started`: when this rank began
// (train.exit_duration_mins counts from it).
TrainSummary run_training(Trainer& trainer, const BatchSource* test = nullptr,
                          std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now());

// train.skip_train: evaluates `trainer` (restored already) once on its validation set and `test`
// (either may be missing, not both), writing nothing. Collective over the trainer's world.
TrainSummary evaluate_only(Trainer& trainer, const BatchSource* test);

}  // namespace loom::train
