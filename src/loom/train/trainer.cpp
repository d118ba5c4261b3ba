#include "loom/train/trainer.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <iomanip>
#include <sstream>

#include "loom/core/error.h"
#include "loom/core/trace.h"
#include "loom/data/tokenizer.h"
#include "loom/kernels/types.h"
#include "loom/optim/schedule.h"
#include "loom/train/batch_schedule.h"
#include "loom/train/layout_check.h"
#include "loom/train/model_setup.h"
#include "loom/train/step_profile.h"
#include "loom/train/trainer_state.h"
#include "loom/train/world_agreements.h"

namespace loom::train {

using Clock = std::chrono::steady_clock;

Trainer::Trainer(const config::RunConfig& config, comm::Communicator& world, const BatchSource& train,
                 const BatchSource* validation, std::ostream& console)
    : state_(std::make_unique<State>(config, world, train)), validation_(validation), out_(&console) {
  State& s = *state_;
  if (!reporter()) out_ = &discard_;  // ranks other than 0 say nothing
  const int threads = threads_per_rank(config, world);
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
  if (const std::string note = oversubscription_note(config, world); !note.empty()) *out_ << note << "\n";
  auto tokenizer = data::make_tokenizer(config.data.tokenizer);
  s.run.model = resolve_model_config(config.model, *tokenizer);
  if (reporter()) s.run_directory = std::make_unique<RunDirectory>(s.run);
  s.total_steps = training_steps(s.run.train);
  s.use_global_batch(s.run.train.global_batch);  // each step sets its own (a ramp-up's)
  s.plan_pipeline();
  s.build_model();
  s.trace = make_step_trace(s.run, s.world.rank(), s.world.size(), s.model->params().device());
  if (s.run_directory) s.run_directory->check_free_space(checkpoint_bytes(s.run.model));
}

Trainer::~Trainer() = default;

bool Trainer::reporter() const { return state_->world.rank() == 0; }
comm::Communicator& Trainer::context_group() { return state_->mesh.cp(); }
bool Trainer::holds_loss() const {
  const State& s = *state_;
  return s.mesh.tp_rank() == 0 && s.mesh.pp_rank() == s.mesh.layout().shape.pp - 1;
}
const config::RunConfig& Trainer::config() const { return state_->run; }
const TrainingProgress& Trainer::progress() const { return state_->progress; }
double Trainer::flops_per_token() const { return state_->model->training_flops_per_token(state_->run.data.seq_len); }
int64_t Trainer::total_steps() const { return state_->total_steps; }
std::string Trainer::peak_memory_report() const { return state_->optimizer->peak_memory_report(); }
void Trainer::start_memory_check() { state_->memory_check.start_step(state_->device); }
std::string Trainer::memory_check_report() const {
  const State& s = *state_;
  try {
    // Planned for the batch the measured step trained on (a ramp-up's first is smaller).
    config::RunConfig measured_step = s.run;
    measured_step.train.global_batch = static_cast<int>(s.step_batch);
    measured_step.train.rampup_batch_size = {};
    const MemoryCheck::Result r = s.memory_check.measure(measured_step, s.mesh.layout().shape, s.mesh.pp_rank(),
                                                         s.world.backend() == "threads");
    return s.memory_check.report(r);
  } catch (const Error& e) {  // a layout the planner does not know yet must not stop the run
    return std::string("memory: no plan for this layout (") + e.what() + ")";
  }
}
int64_t Trainer::skipped_steps() const { return state_->precision->skipped_steps(); }
bool Trainer::loss_scaling() const { return state_->precision->loss_scaling(); }

void Trainer::describe() {
  State& s = *state_;
  const config::RunConfig& run = s.run;
  const comm::MeshShape shape = s.mesh.layout().shape;
  std::ostream& o = out();
  o << "model: " << s.model->params().total() << " parameters, " << run.model.layers << " layers, vocab "
    << run.model.vocab_size << "; " << std::fixed << std::setprecision(3) << flops_per_token() / 1e9
    << " GFLOP per token; " << shape.dp << " data-parallel x " << shape.tp << " tensor-parallel rank(s)"
    << (run.parallel.sequence_parallel && shape.tp > 1 ? " with sequence parallelism" : "");
  if (shape.cp > 1) o << " x " << shape.cp << " context-parallel ranks (" << run.parallel.cp_comm << ")";
  if (!s.model->params().device().is_cpu()) o << " on " << s.model->params().device().name();
  if (s.schedule) {
    o << " x " << shape.pp << " pipeline stages (" << run.parallel.pipeline_schedule;
    if (s.schedule->virtual_stages > 1) o << ", " << s.schedule->virtual_stages << " virtual stages per rank";
    o << "; layers of this rank:";
    for (const model::LayerRange& c : s.chunks) o << " [" << c.first << ", " << c.last << ")";
    o << ")";
  }
  const int64_t per_micro_batch = static_cast<int64_t>(run.train.micro_batch) * shape.dp;
  const config::BatchRampup& ramp = run.train.rampup_batch_size;
  o << " (" << s.world.backend() << ") x ";
  if (ramp.on()) o << ramp.start / per_micro_batch << " to ";
  o << run.train.global_batch / per_micro_batch << " micro-batches of " << run.train.micro_batch << " x "
    << run.data.seq_len << " tokens per step\n"
    << std::defaultfloat << s.optimizer->memory_report() << "\n";
  o << describe_batches(run.train);
  if (run.precision.recipe != config::PrecisionRecipe::Fp32) {
    o << "precision: " << run.precision.recipe << " GEMMs in the linear layers, fp32 master weights and optimizer"
      << (s.precision->loss_scaling() ? ", dynamic loss scale " + std::to_string(s.precision->loss_scale()) : "")
      << "\n";
  }
  const int64_t samples_left =
      std::max<int64_t>(0, samples_after_steps(run.train, s.total_steps) - s.progress.consumed_samples);
  const std::string reading = s.train.describe_reading(s.progress.consumed_samples, samples_left);
  if (!reading.empty() && !run.train.skip_train) o << "data: " << reading << "\n";  // skip_train reads none
  o << describe_profile(run, s.progress.step, s.total_steps);
}

StepResult Trainer::step(int stop_signal) {
  return step(stop_signal, global_batch_at(state_->run.train, state_->progress.consumed_samples));
}

StepResult Trainer::step(int stop_signal, int64_t global_batch) {
  return step(stop_signal, std::span<const int64_t>(&global_batch, 1));
}

StepResult Trainer::step(int stop_signal, std::span<const int64_t> update_batches) {
  State& s = *state_;
  const BatchUnit unit = train::batch_unit(s.run, s.mesh.layout().shape.dp);
  LOOM_CHECK(!update_batches.empty(), "a step takes at least one update");
  for (const int64_t global_batch : update_batches) {
    LOOM_CHECK(global_batch > 0 && global_batch % unit.rows == 0 && global_batch <= s.run.train.global_batch,
               "a step of " + std::to_string(global_batch) + " sequences: valid are multiples of " + unit.what +
                   " = " + std::to_string(unit.rows) + " up to train.global_batch = " +
                   std::to_string(s.run.train.global_batch));
  }
  LOOM_CHECK(update_batches.size() == 1 || !s.outer,
             "a step of " + std::to_string(update_batches.size()) +
                 " optimizer updates under optim.outer (DiLoCo counts one inner step per trainer step)");
  const int64_t step = s.progress.step + 1;
  if (s.trace) s.trace->begin_step(step);
  StepResult result;
  {
    trace::Range range("step", step);
    result = run_step(stop_signal, update_batches);
  }
  if (s.trace) out() << s.trace->end_step(step);
  return result;
}

int64_t Trainer::batch_unit() const {
  return train::batch_unit(state_->run, state_->mesh.layout().shape.dp).rows;
}

void Trainer::agree_losses(StepResult& result, double local_loss_sum, int stop_signal) {
  State& s = *state_;
  // The tensor-parallel ranks of a replica share its loss (computed on the last pipeline
  // stage): one of them contributes it.
  // Multi-token prediction's per-depth loss sums, then their token counts (zeros on the ranks
  // without the head: every rank sends as many).
  const int depths = s.run.model.mtp_depths;
  std::vector<double> mtp_sums(2 * static_cast<size_t>(depths), 0.0);
  if (s.model->mtp_depths() > 0) {
    const model::MtpTotals mtp = s.model->take_mtp_totals();
    std::copy(mtp.loss_sums.begin(), mtp.loss_sums.end(), mtp_sums.begin());
    std::copy(mtp.tokens.begin(), mtp.tokens.end(), mtp_sums.begin() + depths);
  }
  {
    trace::Range range("loss agreement");
    const LossAndStop agreed = agree_loss_and_stop(s.world, holds_loss(), local_loss_sum, stop_signal, mtp_sums);
    result.loss = agreed.loss_sum / static_cast<double>(result.trained_tokens);
    result.stop_signal = agreed.stop_signal;
    for (int k = 0; k < depths; ++k)
      result.mtp_losses.push_back(agreed.extra[k] / std::max(1.0, agreed.extra[depths + k]));
  }
  if (!s.has_moe) return;
  trace::Range range("moe step");
  // Loads summed over the routing ranks move the expert biases, identically on every rank.
  const parallel::MoeStepSummary moe = parallel::finish_moe_step(
      *s.model, s.mesh.dp_cp(), s.mesh.layout().shape.pp > 1 ? &s.mesh.pp() : nullptr, s.experts.get());
  result.moe = {moe.any,      moe.tokens_min, moe.tokens_mean,   moe.tokens_max,       moe.dropped_fraction,
                moe.aux_loss, moe.z_loss,     moe.layer_seconds, moe.exchange_seconds, moe.all_to_all_bytes};
}

namespace {

// A step of several updates from theirs: samples, tokens and times summed; the loss (and each
// depth's) the mean over every update's trained tokens; the gradient norm the mean of the applied
// updates'; MoE routing's extremes over the updates, its means their mean.
void combine_updates(const std::vector<StepResult>& updates, StepResult& step) {
  double loss_sum = 0.0, norm_sum = 0.0;
  int applied = 0;
  step.loss_scale = updates.front().loss_scale;
  step.next_loss_scale = updates.back().next_loss_scale;
  step.mtp_losses.assign(updates.front().mtp_losses.size(), 0.0);
  for (const StepResult& u : updates) {
    step.global_batch += u.global_batch;
    step.trained_tokens += u.trained_tokens;
    loss_sum += u.loss * static_cast<double>(u.trained_tokens);
    for (size_t k = 0; k < u.mtp_losses.size(); ++k)
      step.mtp_losses[k] += u.mtp_losses[k] * static_cast<double>(u.trained_tokens);
    step.skipped = step.skipped || u.skipped;
    if (!u.skipped) norm_sum += u.grad_norm;
    applied += u.skipped ? 0 : 1;
    step.stop_signal = u.stop_signal != 0 ? u.stop_signal : step.stop_signal;
    step.update_losses.push_back(u.loss);
    step.update_grad_norms.push_back(u.grad_norm);
    const bool first_moe = !step.moe.present;
    MoeMetrics& m = step.moe;
    if (!u.moe.present) continue;
    m.present = true;
    m.tokens_min = first_moe ? u.moe.tokens_min : std::min(m.tokens_min, u.moe.tokens_min);
    m.tokens_max = first_moe ? u.moe.tokens_max : std::max(m.tokens_max, u.moe.tokens_max);
    const double share = 1.0 / static_cast<double>(updates.size());
    m.tokens_mean += share * u.moe.tokens_mean;
    m.dropped_fraction += share * u.moe.dropped_fraction;
    m.aux_loss += share * u.moe.aux_loss;
    m.z_loss += share * u.moe.z_loss;
    m.layer_seconds += u.moe.layer_seconds;
    m.exchange_seconds += u.moe.exchange_seconds;
    m.all_to_all_bytes += u.moe.all_to_all_bytes;
  }
  const double tokens = static_cast<double>(std::max<int64_t>(1, step.trained_tokens));
  step.loss = loss_sum / tokens;
  for (double& loss : step.mtp_losses) loss /= tokens;
  step.grad_norm = applied > 0 ? norm_sum / applied : 0.0;
}

}  // namespace

StepResult Trainer::run_step(int stop_signal, std::span<const int64_t> update_batches) {
  State& s = *state_;
  const auto start = Clock::now();
  // The peak of this step on, but for the run's first step (the memory check's, since start-up),
  // reset by rank 0 alone before the step's first collective: no rank of this process (sharing
  // its allocator) can be past it yet.
  Allocator& memory = allocator(s.model->params().device());
  if (reporter() && s.steps_run > 0) memory.reset_peak_bytes();
  ++s.steps_run;
  s.model->tensor_parallel().take_wait_seconds();  // evaluation's and start-up's waits are not the step's
  StepResult result;
  result.step = s.progress.step + 1;
  int64_t step_samples = 0;
  for (const int64_t global_batch : update_batches) step_samples += global_batch;
  result.lr = s.run.train.samples > 0
                  ? optim::learning_rate(s.run.optim, s.progress.consumed_samples + step_samples, s.run.train.samples,
                                         optim::ScheduleUnit::Samples)
                  : optim::learning_rate(s.run.optim, result.step, s.run.train.steps);
  s.heartbeat.phase("forward_backward", result.step);
  s.faults.at_step_start(result.step);
  if (update_batches.size() == 1) {
    run_update(stop_signal, update_batches[0], 0, result);
  } else {
    if (s.objective != nullptr) show_later_updates(update_batches);
    std::vector<StepResult> updates(update_batches.size());
    for (size_t u = 0; u < updates.size(); ++u) {
      updates[u].step = result.step;
      updates[u].lr = result.lr;
      run_update(stop_signal, update_batches[u], static_cast<int>(u), updates[u]);
    }
    combine_updates(updates, result);
  }
  s.progress.step = result.step;
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  result.memory_allocated_bytes = memory.bytes_in_use();
  result.memory_peak_bytes = memory.peak_bytes();
  result.tp_comm_wait_seconds = s.model->tensor_parallel().take_wait_seconds();
  return result;
}

void Trainer::show_later_updates(std::span<const int64_t> update_batches) {
  State& s = *state_;
  trace::Range range("objective before the updates");
  int64_t first = s.progress.consumed_samples + update_batches[0];
  for (size_t u = 1; u < update_batches.size(); ++u) {
    s.use_global_batch(update_batches[u]);
    TokenBatch batch;
    s.make_batch(s.train, first + static_cast<int64_t>(s.mesh.dp_rank()) * s.local_batch, s.local_batch, batch);
    s.objective->before_updates(*this, batch, static_cast<int>(u));
    first += update_batches[u];
  }
}

void Trainer::run_update(int stop_signal, int64_t global_batch, int update, StepResult& result) {
  State& s = *state_;
  s.use_global_batch(global_batch);
  result.global_batch = s.step_batch;
  // This replica's slice of the global batch; its trained tokens are counted here and summed
  // over the replicas, so each micro-batch's gradient is scaled by 1/(global count) and the sum
  // over micro-batches and ranks is the global-batch mean.
  int64_t local_tokens = 0, scale_tokens = 0;
  {
    trace::Range range("batch");
    const int64_t first_sample =
        s.progress.consumed_samples + static_cast<int64_t>(s.mesh.dp_rank()) * s.local_batch;
    local_tokens = s.make_batch(s.train, first_sample, s.local_batch, s.batch);
    result.trained_tokens = agree_token_count(s.replicas(), local_tokens);
    LOOM_CHECK(result.trained_tokens > 0, "step " + std::to_string(result.step) +
                                              (update > 0 ? " (update " + std::to_string(update + 1) + ")" : "") +
                                              " has no target tokens to learn from");
    // fp16: times the dynamic loss scale (a power of two, so exact; 1 for the other recipes).
    // DiLoCo: each site takes a step of its own, over its own tokens.
    scale_tokens = s.outer ? agree_token_count(s.outer->inner_group(), local_tokens) : result.trained_tokens;
  }
  if (s.objective != nullptr) {
    trace::Range range("objective");
    s.objective->prepare(*this, s.batch, update);  // its own forward passes first
  }
  const float loss_scale = s.precision->begin_step();
  const float grad_scale = static_cast<float>(1.0 / static_cast<double>(scale_tokens)) * loss_scale;
  // MoE balancing losses are per micro-batch, averaged over the global batch's micro-batches.
  s.model->set_aux_loss_scale(loss_scale * static_cast<float>(s.run.train.micro_batch) /
                              static_cast<float>(s.step_batch));
  s.model->set_token_objective(s.objective);
  double local_loss_sum = 0.0;
  {
    trace::Range range("forward_backward");
    local_loss_sum = s.forward_backward(grad_scale);
  }
  s.model->set_token_objective(nullptr);
  agree_losses(result, local_loss_sum, stop_signal);
  s.heartbeat.phase("optimizer", result.step);
  trace::Range optimizer_range("optimizer");
  const PrecisionStepResult stepped = s.precision->step(result.lr, result.step);  // optimizer step unless skipped
  if (s.outer && s.outer->syncs_at(result.step)) {
    s.optimizer->gather_full_parameters();  // the update's gathers, where the forward would await them
    if (s.outer->after_step(result.step)) s.optimizer->parameters_changed();
    s.optimizer->release_full_parameters();
  }
  optimizer_range.end();
  result.grad_norm = stepped.grad_norm;
  result.skipped = stepped.skipped;
  result.loss_scale = stepped.loss_scale;
  result.next_loss_scale = stepped.next_loss_scale;
  result.update_losses = {result.loss};
  result.update_grad_norms = {result.grad_norm};
  s.progress.consumed_samples += s.step_batch;
}

void add_mtp_losses(const std::vector<double>& losses, nlohmann::json& record) {
  if (losses.empty()) return;
  double mean = 0.0;
  for (size_t k = 0; k < losses.size(); ++k) {
    record["mtp_loss_" + std::to_string(k + 1)] = losses[k];
    mean += losses[k] / static_cast<double>(losses.size());
  }
  record["mtp_loss"] = mean;
}

void Trainer::add_metrics(const StepResult& result, nlohmann::json& record) const {
  const State& s = *state_;
  record["memory_allocated_bytes"] = result.memory_allocated_bytes;
  record["memory_peak_bytes"] = result.memory_peak_bytes;
  if (s.mesh.layout().shape.dp > 1) record["comm_hidden_fraction"] = s.optimizer->hidden_fraction();
  if (s.mesh.layout().shape.tp > 1) record["tp_comm_wait_s"] = result.tp_comm_wait_seconds;
  if (s.mesh.layout().shape.dp > 1 && (s.run.parallel.zero == 1 || s.run.parallel.zero == 2))
    record["param_gather_wait_s"] = s.optimizer->last_step_parameter_wait_s();
  if (s.optimizer->across_sites()) {  // rank 0's ports: bytes sent per link class, time blocked
    const parallel::SiteTraffic t = s.optimizer->last_step_traffic();
    record["in_site_bytes"] = t.in_site_bytes;
    record["cross_site_bytes"] = t.cross_site_bytes;
    record["cross_site_wait_s"] = t.wait_s;
  }
  if (s.outer) record["cross_site_bytes"] = s.outer->take_cross_site_bytes();
  if (s.precision->loss_scaling()) record["loss_scale"] = result.loss_scale;
  if (s.precision->loss_scaling() || result.skipped) record["skipped"] = result.skipped;
  add_mtp_losses(result.mtp_losses, record);
  if (result.moe.present) {
    record["moe_tokens_per_expert_min"] = result.moe.tokens_min;
    record["moe_tokens_per_expert_mean"] = result.moe.tokens_mean;
    record["moe_tokens_per_expert_max"] = result.moe.tokens_max;
    record["moe_dropped_fraction"] = result.moe.dropped_fraction;
    record["moe_aux_loss"] = result.moe.aux_loss;
    record["moe_z_loss"] = result.moe.z_loss;
    record["moe_layer_s"] = result.moe.layer_seconds;
    record["moe_all_to_all_s"] = result.moe.exchange_seconds;
    record["moe_all_to_all_bytes"] = result.moe.all_to_all_bytes;
  }
}

std::string Trainer::progress_extra(const StepResult& result) {
  std::ostringstream line;
  if (!result.mtp_losses.empty()) {
    line << std::fixed << std::setprecision(4) << "mtp";
    for (double loss : result.mtp_losses) line << " " << loss;
    if (result.moe.present) line << " ";
  }
  if (!result.moe.present) return line.str();
  line << std::fixed << std::setprecision(0) << "moe tok/expert " << result.moe.tokens_min << "/"
       << result.moe.tokens_mean << "/" << result.moe.tokens_max << std::setprecision(1) << " drop "
       << 100.0 * result.moe.dropped_fraction << "%" << std::setprecision(4) << " aux " << result.moe.aux_loss;
  return line.str();
}

void Trainer::set_objective(StepObjective* objective) { state_->objective = objective; }

namespace {
// Writes each row's log-probability at its place in the batch (a forward-only pass's objective).
class LogprobRecorder : public model::TokenObjective {
 public:
  LogprobRecorder(const TokenBatch& batch, std::vector<float>& out) : batch_(batch), out_(out) {}
  double evaluate(const int32_t* targets, const float* logp, int64_t rows, float* gradient) override {
    const int64_t first = targets - batch_.targets.data();
    LOOM_CHECK(first >= 0 && first + rows <= static_cast<int64_t>(batch_.targets.size()),
               "target_logprobs: rows outside the batch they were asked for");
    for (int64_t r = 0; r < rows; ++r) {
      out_[first + r] = targets[r] == kernels::kIgnoreIndex ? 0.0f : logp[r];
      gradient[r] = 0.0f;
    }
    return 0.0;
  }

 private:
  const TokenBatch& batch_;
  std::vector<float>& out_;
};
}  // namespace

std::vector<float> Trainer::target_logprobs(const TokenBatch& batch, const Tensor* parameters) {
  State& s = *state_;
  const Device device = s.model->params().device();
  std::vector<float> logp(batch.targets.size(), 0.0f);
  LogprobRecorder recorder(batch, logp);
  s.optimizer->gather_full_parameters();  // ZeRO-3: the forward-only passes need every parameter
  float* values = s.model->params().values();
  const int64_t total = s.model->params().total();
  Tensor current;
  if (parameters != nullptr) {
    LOOM_CHECK(parameters->numel() == total && parameters->device() == device,
               "target_logprobs: " + std::to_string(parameters->numel()) + " parameters on " +
                   parameters->device().name() + " given for a rank holding " + std::to_string(total) + " on " +
                   device.name());
    current = Tensor({total}, DType::F32, device);
    copy_on_device(device, current.data<float>(), values, total);
    copy_on_device(device, values, parameters->data<float>(), total);
  }
  s.model->set_token_objective(&recorder);
  const int micro = s.run.train.micro_batch;
  for (int m = 0; m * micro < batch.batch; ++m) {
    const model::Packing packing = batch.packing().at(static_cast<int64_t>(m) * micro * batch.seq);
    if (s.pipeline) {
      s.pipeline->forward_loss(batch.micro_inputs(m, micro), batch.micro_targets(m, micro), micro, batch.seq, packing);
    } else {
      s.model->forward_loss(batch.micro_inputs(m, micro), batch.micro_targets(m, micro), micro, batch.seq, packing);
    }
  }
  s.model->set_token_objective(nullptr);
  if (parameters != nullptr) copy_on_device(device, values, current.data<float>(), total);
  s.optimizer->release_full_parameters();
  return logp;
}

Tensor Trainer::parameter_copy(const std::string& checkpoint) {
  State& s = *state_;
  const Device device = s.model->params().device();
  LOOM_CHECK(s.run.precision.param_dtype == config::ParamDtype::Fp32,
             "precision.param_dtype = compute keeps the parameters in a compact store between uses; a copy of them "
             "(the reference policy of grpo.kl_coeff) needs precision.param_dtype = fp32");
  s.optimizer->gather_full_parameters();
  float* values = s.model->params().values();
  const int64_t total = s.model->params().total();
  Tensor copy({total}, DType::F32, device);
  copy_on_device(device, copy.data<float>(), values, total);
  if (!checkpoint.empty()) {
    const Tensor current = std::move(copy);
    load_parameters(ckpt::load_checkpoint(checkpoint), *s.model);
    copy = Tensor({total}, DType::F32, device);
    copy_on_device(device, copy.data<float>(), values, total);
    copy_on_device(device, values, current.data<float>(), total);
  }
  s.optimizer->release_full_parameters();
  return copy;
}

std::optional<double> Trainer::evaluate() {
  if (validation_ == nullptr) return std::nullopt;
  return evaluate(*validation_);
}

std::optional<double> Trainer::evaluate(const BatchSource& data) {
  State& s = *state_;
  s.heartbeat.phase("eval", s.progress.step);
  trace::Range range("evaluate");
  // Data-parallel replica 0 evaluates (all its tp ranks and stages), every replica under expert
  // parallelism (replica 0's tokens reach experts others hold); ZeRO-3 gathers parameters first.
  s.optimizer->gather_full_parameters();
  std::optional<double> val_loss;
  if (s.mesh.dp_rank() == 0 || s.mesh.layout().shape.ep > 1) {
    // The same samples at every evaluation.
    TokenBatch batch;
    double loss_sum = 0.0;
    int64_t tokens = 0;
    for (int b = 0; b < s.run.train.eval_batches; ++b) {
      const int64_t first = static_cast<int64_t>(b) * s.run.train.micro_batch;
      tokens += s.make_batch(data, first, s.run.train.micro_batch, batch);
      loss_sum += s.forward_loss(batch);
    }
    // Each context-parallel rank holds its share of the tokens.
    if (s.mesh.layout().shape.cp > 1) sum_loss_and_tokens(s.mesh.cp(), loss_sum, tokens);
    val_loss = loss_sum / static_cast<double>(std::max<int64_t>(1, tokens));
  }
  if (!reporter()) val_loss.reset();
  s.optimizer->release_full_parameters();
  return val_loss;
}

void Trainer::finish() {
  State& s = *state_;
  if (s.trace) out() << s.trace->end_run();  // a run that ended inside its profiled steps
  s.async_writer.wait();
  wait_for_every_rank(s.world);
  s.heartbeat.done(s.progress.step == s.total_steps, s.progress.step);
}

}  // namespace loom::train
