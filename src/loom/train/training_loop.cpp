#include "loom/train/training_loop.h"

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <csignal>
#include <string>

#include "loom/config/metrics.h"
#include "loom/config/progress.h"
#include "loom/config/yaml_values.h"
#include "loom/train/batch_schedule.h"
#include "loom/train/world_agreements.h"

namespace loom::train {

namespace {

std::atomic<int> g_stop_signal{0};  // the signal that asked this process to stop, 0 if none
// The first SIGINT/SIGTERM stops after the current step with a checkpoint; a second one ends the
// process at once (a rank may be stuck where the step never ends).
extern "C" void request_stop(int signal_number) {
  if (g_stop_signal.exchange(signal_number) != 0) {
    static const char message[] = "\nloom: second signal: exiting now, without a checkpoint\n";
    [[maybe_unused]] const ssize_t written = ::write(STDERR_FILENO, message, sizeof(message) - 1);
    ::_exit(128 + signal_number);
  }
}

// Installs SIGINT/SIGTERM handlers for the duration of training, restoring the old ones after.
class StopSignals {
 public:
  StopSignals() {
    g_stop_signal.store(0);
    previous_int_ = std::signal(SIGINT, request_stop);
    previous_term_ = std::signal(SIGTERM, request_stop);
  }
  ~StopSignals() {
    std::signal(SIGINT, previous_int_);
    std::signal(SIGTERM, previous_term_);
  }

 private:
  void (*previous_int_)(int);
  void (*previous_term_)(int);
};

// This rank's stop request for the next step: a signal it got, else kStopForDuration once
// train.exit_duration_mins have passed since `started`, else 0.
int stop_request(const config::TrainConfig& train, std::chrono::steady_clock::time_point started) {
  if (const int signal = g_stop_signal.load(); signal != 0) return signal;
  if (train.exit_duration_mins <= 0) return 0;
  const double minutes = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count() / 60.0;
  return minutes >= train.exit_duration_mins ? kStopForDuration : 0;
}

// What rank 0 writes and draws: metrics.jsonl and the progress bar.
class Reporter {
 public:
  explicit Reporter(Trainer& trainer) : trainer_(trainer) {
    if (!trainer.reporter()) return;
    const config::RunConfig& run = trainer.config();
    const int64_t step = trainer.progress().step;
    metrics_.emplace(run.run.dir, step + 1, run.log.tensorboard);
    bar_.emplace(static_cast<int>(trainer.total_steps()), static_cast<int>(step),
                 run.log.progress && config::stdout_is_interactive(), run.log.interval, trainer.out());
    // Under a batch ramp-up the later steps are larger: the ETA counts samples.
    if (run.train.rampup_batch_size.on()) {
      bar_->set_work([train = run.train](int s) { return static_cast<double>(samples_after_steps(train, s)); });
    }
  }
  void message(const std::string& text) {
    if (bar_) bar_->message(text);
  }
  // The step's record, with the validation loss and (after the last step) the test loss when evaluated.
  void step(const StepResult& r, const std::optional<double>& val_loss, const std::optional<double>& test_loss,
            TrainSummary& summary);

 private:
  Trainer& trainer_;
  std::optional<config::MetricsWriter> metrics_;
  std::optional<config::ProgressBar> bar_;
};

void Reporter::step(const StepResult& r, const std::optional<double>& val_loss, const std::optional<double>& test_loss,
                    TrainSummary& summary) {
  if (!metrics_) return;
  const double tokens_per_s = static_cast<double>(r.global_batch * trainer_.config().data.seq_len) / r.seconds;
  nlohmann::json record = {{"step", r.step},
                           {"loss", r.loss},
                           {"lr", r.lr},
                           {"grad_norm", r.grad_norm},
                           {"tokens_per_s", tokens_per_s},
                           {"gflops_per_s", trainer_.flops_per_token() * tokens_per_s / 1e9},
                           {"step_time_s", r.seconds},
                           {"trained_tokens", r.trained_tokens},
                           {"global_batch", r.global_batch},
                           {"consumed_samples", trainer_.progress().consumed_samples}};
  if (val_loss) {
    record["val_loss"] = *val_loss;
    if (!summary.first_val_loss) summary.first_val_loss = val_loss;
    summary.last_val_loss = val_loss;
    message("step " + std::to_string(r.step) + ": val_loss " + std::to_string(*val_loss));
  }
  if (test_loss) {
    record["test_loss"] = *test_loss;
    summary.test_loss = test_loss;
    message("step " + std::to_string(r.step) + ": test_loss " + std::to_string(*test_loss) + " (perplexity " +
            std::to_string(std::exp(*test_loss)) + ")");
  }
  trainer_.add_metrics(r, record);
  if (r.skipped) {
    message("step " + std::to_string(r.step) + ": skipped (Inf/NaN in the gradients), " +
            std::to_string(trainer_.skipped_steps()) + " skipped so far" +
            (trainer_.loss_scaling() ? "; loss scale now " + std::to_string(r.next_loss_scale) : ""));
  }
  metrics_->write(record);
  bar_->update(static_cast<int>(r.step), r.loss, r.lr, r.grad_norm, tokens_per_s, Trainer::progress_extra(r));
}

}  // namespace

TrainSummary run_training(Trainer& trainer, const BatchSource* test, std::chrono::steady_clock::time_point started) {
  const config::RunConfig& run = trainer.config();
  Reporter reporter(trainer);
  StopSignals signals;
  TrainSummary summary;
  summary.reporter = trainer.reporter();
  summary.total_steps = trainer.total_steps();
  summary.first_step = static_cast<int>(trainer.progress().step) + 1;
  const bool evaluating = trainer.has_validation() && run.train.eval_interval > 0;
  if (evaluating && trainer.progress().step == 0) {
    summary.first_val_loss = trainer.evaluate();
    if (summary.first_val_loss) reporter.message("step 0: val_loss " + std::to_string(*summary.first_val_loss));
  }
  double timed_seconds = 0.0;
  int64_t timed_tokens = 0;
  int steps_this_run = 0;
  while (trainer.progress().step < trainer.total_steps()) {
    if (steps_this_run == 0) trainer.start_memory_check();
    const StepResult r = trainer.step(stop_request(run.train, started));
    ++steps_this_run;
    if (steps_this_run > 1) {  // the first step pays for allocations
      timed_seconds += r.seconds;
      timed_tokens += r.global_batch * run.data.seq_len;
    }
    if (steps_this_run == 1) summary.first_loss = r.loss;
    summary.last_loss = r.loss;
    summary.last_step = static_cast<int>(r.step);
    const bool last = r.step == trainer.total_steps();
    const bool stop =
        r.stop_signal != 0 || (run.train.exit_interval > 0 && steps_this_run >= run.train.exit_interval);
    std::optional<double> val_loss;
    if (evaluating && (r.step % run.train.eval_interval == 0 || last)) val_loss = trainer.evaluate();
    std::optional<double> test_loss;
    if (test != nullptr && last) test_loss = trainer.evaluate(*test);
    if (steps_this_run == 1) {
      trainer.out() << trainer.memory_check_report() << "\n" << trainer.peak_memory_report() << "\n";
    }
    reporter.step(r, val_loss, test_loss, summary);
    const bool interval_due = run.checkpoint.interval > 0 && r.step % run.checkpoint.interval == 0;
    if (interval_due || (last && run.checkpoint.at_end) || stop) summary.checkpoint = trainer.save();
    summary.steps_run = steps_this_run;
    if (stop && !last) {
      summary.stopped_early = true;
      summary.stop_signal = r.stop_signal == kStopForDuration ? 0 : r.stop_signal;  // out of time: a planned stop
      const std::string minutes = config::detail::format_double(run.train.exit_duration_mins);
      const std::string why =
          r.stop_signal == kStopForDuration ? " (train.exit_duration_mins = " + minutes + " passed)" : "";
      reporter.message("stopping after step " + std::to_string(r.step) + why + "; resume with train.resume=true");
      break;
    }
  }
  trainer.finish();
  if (timed_seconds > 0.0) {
    summary.tokens_per_s = static_cast<double>(timed_tokens) / timed_seconds;
    summary.gflops_per_s = trainer.flops_per_token() * summary.tokens_per_s / 1e9;
  }
  return summary;
}

TrainSummary evaluate_only(Trainer& trainer, const BatchSource* test) {
  TrainSummary summary;
  summary.reporter = trainer.reporter();
  summary.evaluated_only = true;
  summary.total_steps = trainer.total_steps();
  summary.first_step = summary.last_step = static_cast<int>(trainer.progress().step);
  if (trainer.has_validation()) summary.first_val_loss = summary.last_val_loss = trainer.evaluate();
  if (test != nullptr) summary.test_loss = trainer.evaluate(*test);
  trainer.finish();
  return summary;
}

}  // namespace loom::train
