#include "loom/recipes/pretrain.h"

#include <cblas.h>
#include <omp.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "loom/ckpt/async_writer.h"
#include "loom/ckpt/checkpoint.h"
#include "loom/core/error.h"
#include "loom/data/sequence_loader.h"
#include "loom/kernels/cpu/cross_entropy.h"
#include "loom/optim/schedule.h"
#include "loom/recipes/model_setup.h"
#include "loom/runtime/metrics.h"
#include "loom/runtime/progress.h"

namespace loom::recipes {

namespace {

std::atomic<bool> g_stop_requested{false};
extern "C" void request_stop(int) { g_stop_requested.store(true); }

// Installs SIGINT/SIGTERM handlers for the duration of training, restoring the old ones after.
class StopSignals {
 public:
  StopSignals() {
    g_stop_requested.store(false);
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

void set_threads(int threads) {
  if (threads <= 0) return;
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
}

using Clock = std::chrono::steady_clock;

// Mean token loss over a fixed set of validation samples (the same ones at every evaluation).
double evaluate(model::Transformer& model, const data::SequenceLoader& loader, const runtime::RunConfig& config) {
  const int batch = config.train.micro_batch, seq = config.data.seq_len;
  std::vector<int32_t> inputs(static_cast<size_t>(batch) * seq), targets(inputs.size());
  double loss_sum = 0.0;
  int64_t tokens = 0;
  for (int b = 0; b < config.train.eval_batches; ++b) {
    loader.fill_batch(static_cast<int64_t>(b) * batch, batch, inputs.data(), targets.data());
    loss_sum += model.forward_loss(inputs.data(), targets.data(), batch, seq);
    for (int32_t t : targets) tokens += t != kernels::cpu::kIgnoreIndex;
  }
  return loss_sum / static_cast<double>(std::max<int64_t>(1, tokens));
}

}  // namespace

TrainSummary pretrain(const runtime::RunConfig& config, std::ostream& out) {
  set_threads(config.train.threads);
  auto tokenizer = data::make_tokenizer(config.data.tokenizer);
  check(!config.data.train_prefix.empty(),
        "data.train_prefix is empty: give the prefix of a dataset made by `loom data prepare`");
  data::SequenceLoader train_data(config.data.train_prefix, config.data.seq_len, config.train.seed);
  std::optional<data::SequenceLoader> val_data;
  if (!config.data.val_prefix.empty()) val_data.emplace(config.data.val_prefix, config.data.seq_len, config.train.seed);

  runtime::RunConfig run = config;
  run.model = resolve_model_config(config.model, *tokenizer);
  model::Transformer model(run.model);
  model.initialize(run.train.seed);
  optim::AdamW optimizer(run.optim, model.params().total(), optimizer_segments(model.params()));

  const std::string root = checkpoint_root(run);
  TrainingProgress progress;
  if (run.train.resume) {
    if (std::filesystem::exists(std::filesystem::path(root) / "latest")) {
      ckpt::LoadedCheckpoint checkpoint = ckpt::load_checkpoint(root);
      progress = load_training_checkpoint(checkpoint, model, optimizer);
      out << "resumed from " << checkpoint.path() << " at step " << progress.step << "\n";
    } else {
      out << "train.resume: no checkpoint under " << root << ", starting from step 0\n";
    }
  }

  const int seq = run.data.seq_len, micro = run.train.micro_batch;
  const int micro_batches = run.train.global_batch / micro;
  const int64_t tokens_per_step = static_cast<int64_t>(run.train.global_batch) * seq;
  const double flops_per_token = model.training_flops_per_token(seq);
  out << "model: " << model.params().total() << " parameters, " << run.model.layers << " layers, vocab "
      << run.model.vocab_size << "; " << std::fixed << std::setprecision(3) << flops_per_token / 1e9
      << " GFLOP per token; " << micro_batches << " micro-batches of " << micro << " x " << seq << " tokens per step\n"
      << std::defaultfloat;

  runtime::MetricsWriter metrics(run.run.dir, progress.step + 1);
  runtime::ProgressBar bar(run.train.steps, static_cast<int>(progress.step),
                           run.log.progress && ::isatty(STDOUT_FILENO), run.log.interval, out);
  StopSignals signals;
  ckpt::AsyncCheckpointWriter async_writer;

  TrainSummary summary;
  summary.first_step = static_cast<int>(progress.step) + 1;
  std::vector<int32_t> inputs(static_cast<size_t>(micro) * seq), targets(inputs.size());
  double timed_seconds = 0.0;
  int64_t timed_tokens = 0;
  int steps_this_run = 0;
  std::string last_checkpoint;

  if (val_data && progress.step == 0 && run.train.eval_interval > 0) {
    summary.first_val_loss = evaluate(model, *val_data, run);
    bar.message("step 0: val_loss " + std::to_string(*summary.first_val_loss));
  }

  for (int step = static_cast<int>(progress.step) + 1; step <= run.train.steps; ++step) {
    const auto start = Clock::now();
    // Tokens that count towards the loss over the whole global batch: each micro-batch's
    // gradient is scaled by 1/total so accumulation gives the global-batch mean exactly.
    int64_t valid_tokens = 0;
    std::vector<std::vector<int32_t>> batch_targets(micro_batches);
    std::vector<std::vector<int32_t>> batch_inputs(micro_batches);
    for (int m = 0; m < micro_batches; ++m) {
      batch_inputs[m].resize(inputs.size());
      batch_targets[m].resize(inputs.size());
      train_data.fill_batch(progress.consumed_samples + static_cast<int64_t>(m) * micro, micro,
                            batch_inputs[m].data(), batch_targets[m].data());
      for (int32_t t : batch_targets[m]) valid_tokens += t != kernels::cpu::kIgnoreIndex;
    }
    check(valid_tokens > 0, "step " + std::to_string(step) + " has no target tokens to learn from");
    const float grad_scale = static_cast<float>(1.0 / static_cast<double>(valid_tokens));
    model.params().zero_grads();
    double loss_sum = 0.0;
    for (int m = 0; m < micro_batches; ++m) {
      loss_sum += model.forward_backward(batch_inputs[m].data(), batch_targets[m].data(), micro, seq, grad_scale);
    }
    const double loss = loss_sum / static_cast<double>(valid_tokens);
    const double lr = optim::learning_rate(run.optim, step, run.train.steps);
    const double grad_norm = optimizer.step(model.params().values(), model.params().grads(), lr, step);
    progress.step = step;
    progress.consumed_samples += run.train.global_batch;
    ++steps_this_run;

    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    const double tokens_per_s = static_cast<double>(tokens_per_step) / seconds;
    if (steps_this_run > 1) {  // the first step pays for allocations
      timed_seconds += seconds;
      timed_tokens += tokens_per_step;
    }
    if (steps_this_run == 1) summary.first_loss = loss;
    summary.last_loss = loss;
    summary.last_step = step;

    nlohmann::json record = {{"step", step},
                             {"loss", loss},
                             {"lr", lr},
                             {"grad_norm", grad_norm},
                             {"tokens_per_s", tokens_per_s},
                             {"gflops_per_s", flops_per_token * tokens_per_s / 1e9},
                             {"step_time_s", seconds},
                             {"consumed_samples", progress.consumed_samples}};
    const bool last = step == run.train.steps;
    const bool stop = g_stop_requested.load() ||
                      (run.train.exit_interval > 0 && steps_this_run >= run.train.exit_interval);
    if (val_data && run.train.eval_interval > 0 && (step % run.train.eval_interval == 0 || last)) {
      const double val_loss = evaluate(model, *val_data, run);
      record["val_loss"] = val_loss;
      if (!summary.first_val_loss) summary.first_val_loss = val_loss;
      summary.last_val_loss = val_loss;
      bar.message("step " + std::to_string(step) + ": val_loss " + std::to_string(val_loss));
    }
    metrics.write(record);
    bar.update(step, loss, lr, grad_norm, tokens_per_s);

    const bool interval_due = run.checkpoint.interval > 0 && step % run.checkpoint.interval == 0;
    if (interval_due || last || stop) {
      ckpt::CheckpointSnapshot snapshot = snapshot_training_state(model, optimizer, progress, run);
      if (run.checkpoint.async) {
        async_writer.save(root, std::move(snapshot), run.checkpoint.keep);  // the disk works while we train
      } else {
        ckpt::write_snapshot(root, snapshot, run.checkpoint.keep);
      }
      last_checkpoint = (std::filesystem::path(root) / ckpt::step_dir_name(step)).string();
    }
    if (stop && !last) {
      bar.message("stopping after step " + std::to_string(step) + "; resume with train.resume=true");
      break;
    }
  }
  async_writer.wait();
  summary.checkpoint = last_checkpoint;
  if (timed_seconds > 0.0) {
    summary.tokens_per_s = static_cast<double>(timed_tokens) / timed_seconds;
    summary.gflops_per_s = flops_per_token * summary.tokens_per_s / 1e9;
  }
  return summary;
}

}  // namespace loom::recipes
