#include "loom/train/trainer.h"

#include <cblas.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iomanip>
#include <sstream>

#include "loom/ckpt/async_writer.h"
#include "loom/ckpt/checkpoint.h"
#include "loom/ckpt/tensor_names.h"
#include "loom/comm/mesh.h"
#include "loom/core/error.h"
#include "loom/data/tokenizer.h"
#include "loom/kernels/types.h"
#include "loom/model/flops.h"
#include "loom/ops/fault_injection.h"
#include "loom/ops/heartbeat_writer.h"
#include "loom/optim/schedule.h"
#include "loom/parallel/context/context_parallel.h"
#include "loom/parallel/data/data_parallel_step.h"
#include "loom/parallel/expert/expert_parallel.h"
#include "loom/parallel/pipeline/pipeline_partition.h"
#include "loom/parallel/pipeline/pipeline_step.h"
#include "loom/train/config_changes.h"
#include "loom/train/layout_check.h"
#include "loom/train/model_setup.h"
#include "loom/train/memory_check.h"
#include "loom/train/outer_step.h"
#include "loom/train/precision_step.h"
#include "loom/train/run_device.h"
#include "loom/train/run_directory.h"
#include "loom/train/sharded_training_state.h"
#include "loom/train/world_agreements.h"

namespace loom::train {

namespace {

using Clock = std::chrono::steady_clock;

// Threads per rank: the threads backend runs every rank in this process, so the cores are shared.
int threads_per_rank(const config::RunConfig& config, const comm::Communicator& world) {
  int total = config.train.threads > 0 ? config.train.threads : omp_get_num_procs();
  if (world.backend() == "threads") total = std::max(1, total / world.size());
  return total;
}

// The data-parallel size the world leaves for tp x pp, checked against the config.
comm::MeshShape mesh_shape(const config::RunConfig& config, const comm::Communicator& world) {
  return check_layout(config, world.size());
}

}  // namespace

struct Trainer::State {
  config::RunConfig run;
  Device device;  // runtime.device: where this rank trains
  std::unique_ptr<comm::Communicator> device_comm;  // the world wrapped for device buffers (run_device.h), or null
  comm::Communicator& world;
  const BatchSource& train;
  MemoryCheck memory_check;  // the resident set before anything of the run is built
  ops::Heartbeat heartbeat;  // for `loom launch` (docs/operations.md)
  ops::FaultInjector faults;
  comm::Mesh mesh;
  int micro_batches = 0, local_batch = 0;
  std::optional<parallel::PipelineSchedule> schedule;
  std::vector<model::LayerRange> chunks;
  std::unique_ptr<model::Transformer> model;
  std::unique_ptr<model::ContextAttention> context;  // parallel.cp > 1: attention over the cp group
  std::unique_ptr<OuterStep> outer;  // parallel.outer=diloco; its site groups outlive the optimizer
  bool has_moe = false;                                // some layer of the model is a mixture of experts
  std::unique_ptr<parallel::ExpertParallel> experts;  // the MoE layers' exchange
  std::unique_ptr<parallel::DataParallelStep> optimizer;
  std::optional<parallel::PipelineStep> pipeline;
  std::unique_ptr<PrecisionStep> precision;
  std::unique_ptr<RunDirectory> run_directory;  // rank 0: the run directory's lock and checks
  TrainingProgress progress;
  TokenBatch batch;
  std::vector<float> saved_from_device;  // a GPU run's checkpoint ranges, copied to the host
  StepObjective* objective = nullptr;  // reinforcement learning's, in place of cross-entropy
  ckpt::AsyncCheckpointWriter async_writer;

  State(const config::RunConfig& config, comm::Communicator& w, const BatchSource& source)
      : run(config),
        device(training_device(config, w.rank(), w.size())),
        device_comm(device_world(config, device, w)),
        world(device_comm ? *device_comm : w),
        train(source),
        heartbeat(w.rank(), w.size()),
        faults(config.fault, w.rank(), w.size()),
        mesh(world, mesh_shape(config, world)) {}

  void plan_pipeline();
  void build_model();
  // The sum of token losses of the replica's micro-batches (the last stage's; 0 elsewhere).
  double forward_backward(float grad_scale);
  double forward_loss(const TokenBatch& b);
  // The ranks holding the same parameters: data x context parallel (replicated parameters see
  // different tokens on each).
  comm::Communicator& replicas() { return mesh.layout().shape.cp > 1 ? mesh.dp_cp() : mesh.dp(); }
  // Fills `batch` with global samples from `first`, masks it, keeps this rank's context share and
  // returns the targets that count in it.
  int64_t make_batch(const BatchSource& source, int64_t first, int rows, TokenBatch& batch);
};

// The schedule (checked before anything is built) and this rank's model chunks.
void Trainer::State::plan_pipeline() {
  const int pp = mesh.layout().shape.pp;
  if (pp == 1) {
    LOOM_CHECK(run.parallel.virtual_stages == 1, "parallel.virtual_stages = " +
                                                     std::to_string(run.parallel.virtual_stages) +
                                                     " needs a pipeline: set parallel.pp > 1 (and pipeline_schedule: interleaved)");
    return;
  }
  schedule = parallel::make_pipeline_schedule(run.parallel.pipeline_schedule, pp,
                                              micro_batches, run.parallel.virtual_stages);
  std::vector<double> costs;
  for (const model::LayerSpec& spec : model::resolve_layers(run.model)) {
    costs.push_back(model::layer_training_flops_per_token(run.model, spec, run.data.seq_len));
  }
  const std::vector<int> bounds = parallel::partition_layers(
      run.parallel.pipeline_partition, costs, model::head_training_flops_per_token(run.model, run.data.seq_len),
      schedule->total_stages());
  chunks = parallel::stage_chunks(*schedule, mesh.pp_rank(), bounds);
}

void Trainer::State::build_model() {
  const comm::MeshShape shape = mesh.layout().shape;
  const int pp = shape.pp;
  model = std::make_unique<model::Transformer>(run.model, model::TensorParallel(&mesh.tp(), run.parallel.sequence_parallel),
                                               model::PrecisionPolicy::from_config(run.precision), chunks,
                                               model::ExpertLayout{shape.ep, mesh.ep_rank()}, device);
  model->initialize(run.train.seed);
  context = parallel::make_context_attention(mesh.cp(), run.parallel.cp_comm, model->params().device());
  model->set_context_attention(context.get());
  for (const model::LayerSpec& spec : model->layers()) has_moe = has_moe || spec.moe;
  if (has_moe) {
    // Tokens of the same layers are routed by every data x context parallel rank of the stage.
    experts = std::make_unique<parallel::ExpertParallel>(mesh.ep(), mesh.dp_cp());
    model->set_expert_comm(experts.get());
  }
  outer = OuterStep::make(run, replicas());  // sites and context parallelism exclude each other (layout_check)
  comm::Communicator& reduced_over = outer ? outer->inner_group() : replicas();
  parallel::GradientSyncOptions options;
  options.pp = pp > 1 ? &mesh.pp() : nullptr;
  if (schedule) options.pipeline = parallel::pipeline_sync_options(*model, *schedule, mesh.embedding());
  // Expert parameters are summed over the expert-data-parallel ranks, the rest over dp x cp.
  if (shape.ep > 1) options.groups = parallel::expert_parameter_groups(*model, reduced_over, mesh.expert_dp(), mesh.ep());
  optimizer = std::make_unique<parallel::DataParallelStep>(reduced_over, *model, run, std::move(options));
  if (schedule) pipeline.emplace(mesh.pp(), *model, *schedule, *optimizer, mesh.embedding());
  if (outer) outer->attach(*model);
  // Loss scaling, Inf/NaN skips, FP8 amaxes (agreed among the ranks holding the same layers).
  precision = std::make_unique<PrecisionStep>(run.precision, *model, *optimizer, world,
                                              pp > 1 ? &mesh.add_group(mesh.layout().shape.cp > 1 ? "tp-cp-dp" : "tp-dp") : nullptr);
}

double Trainer::State::forward_backward(float grad_scale) {
  const int micro = run.train.micro_batch, seq = batch.seq;
  // The stages run the replica's micro-batches in the schedule's order; every stage reads them
  // (the first needs the inputs, the last the targets, the first's backward the inputs).
  if (pipeline) return pipeline->run(batch.inputs.data(), batch.targets.data(), micro, seq, grad_scale, batch.packing());
  double loss_sum = 0.0;
  for (int m = 0; m < micro_batches; ++m) {
    const bool last_micro_batch = m + 1 == micro_batches;
    // Gradients of the global mean loss are the sum of every rank's contributions: their
    // reduction starts bucket by bucket during backward (see DataParallelStep).
    optimizer->begin_micro_batch(last_micro_batch);
    loss_sum += model->forward_backward(batch.micro_inputs(m, micro), batch.micro_targets(m, micro), micro, seq,
                                        grad_scale, batch.packing().at(static_cast<int64_t>(m) * micro * seq));
    optimizer->end_micro_batch(last_micro_batch);
  }
  return loss_sum;
}

int64_t Trainer::State::make_batch(const BatchSource& source, int64_t first, int rows, TokenBatch& into) {
  into.resize(rows, run.data.seq_len);
  source.fill(first, into);
  const int64_t tokens = into.mask_and_count(source, first);
  if (mesh.layout().shape.cp == 1) return tokens;
  return into.keep_context_share(mesh.layout().shape.cp, mesh.cp_rank());
}

double Trainer::State::forward_loss(const TokenBatch& b) {
  return pipeline ? pipeline->forward_loss(b.inputs.data(), b.targets.data(), b.batch, b.seq, b.packing())
                  : model->forward_loss(b.inputs.data(), b.targets.data(), b.batch, b.seq, b.packing());
}

Trainer::Trainer(const config::RunConfig& config, comm::Communicator& world, const BatchSource& train,
                 const BatchSource* validation, std::ostream& console)
    : state_(std::make_unique<State>(config, world, train)), validation_(validation), out_(&console) {
  State& s = *state_;
  if (!reporter()) out_ = &discard_;  // ranks other than 0 say nothing
  const int threads = threads_per_rank(config, world);
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
  auto tokenizer = data::make_tokenizer(config.data.tokenizer);
  s.run.model = resolve_model_config(config.model, *tokenizer);
  if (reporter()) s.run_directory = std::make_unique<RunDirectory>(s.run);
  s.local_batch = s.run.train.global_batch / s.mesh.layout().shape.dp;
  s.micro_batches = s.local_batch / s.run.train.micro_batch;
  s.plan_pipeline();
  s.build_model();
  if (s.run_directory) s.run_directory->check_free_space(checkpoint_bytes(s.run.model));
}

Trainer::~Trainer() = default;

bool Trainer::reporter() const { return state_->world.rank() == 0; }
bool Trainer::holds_loss() const {
  const State& s = *state_;
  return s.mesh.tp_rank() == 0 && s.mesh.pp_rank() == s.mesh.layout().shape.pp - 1;
}
const config::RunConfig& Trainer::config() const { return state_->run; }
const TrainingProgress& Trainer::progress() const { return state_->progress; }
double Trainer::flops_per_token() const { return state_->model->training_flops_per_token(state_->run.data.seq_len); }
int64_t Trainer::tokens_per_step() const {
  return static_cast<int64_t>(state_->run.train.global_batch) * state_->run.data.seq_len;
}
std::string Trainer::peak_memory_report() const { return state_->optimizer->peak_memory_report(); }
void Trainer::start_memory_check() { state_->memory_check.start_step(state_->device); }
std::string Trainer::memory_check_report() const {
  const State& s = *state_;
  try {
    const MemoryCheck::Result r =
        s.memory_check.measure(s.run, s.mesh.layout().shape, s.mesh.pp_rank(), s.world.backend() == "threads");
    return s.memory_check.report(r);
  } catch (const Error& e) {  // a layout the planner does not know yet must not stop the run
    return std::string("memory: no plan for this layout (") + e.what() + ")";
  }
}
int64_t Trainer::skipped_steps() const { return state_->precision->skipped_steps(); }
bool Trainer::loss_scaling() const { return state_->precision->loss_scaling(); }

// A model change cannot resume; changed settings are listed (allowed, never silent).
void Trainer::check_resumable(const ckpt::LoadedCheckpoint& checkpoint) {
  train::check_resumable(checkpoint.config_yaml(), checkpoint.path(), state_->run, out());
}

void Trainer::initialize_from(const std::string& path) {
  State& s = *state_;
  ckpt::LoadedCheckpoint checkpoint = ckpt::load_checkpoint(path);
  load_parameters(checkpoint, *s.model);
  // A fresh optimizer: zero moments, and the master weights taken from the loaded parameters.
  const std::vector<float> zeros(s.model->params().total(), 0.0f);
  s.optimizer->load_moments(zeros.data(), zeros.data());
  out() << "train.init_from: parameters of " << checkpoint.path() << " (fresh optimizer, step 0)\n";
}

void Trainer::restore() {
  State& s = *state_;
  const std::string root = checkpoint_root(s.run);
  const bool resumable = s.run.train.resume && std::filesystem::exists(std::filesystem::path(root) / "latest");
  if (!resumable && !s.run.train.init_from.empty()) initialize_from(s.run.train.init_from);
  if (!s.run.train.resume) return;
  if (!resumable) {
    out() << "train.resume: no checkpoint under " << root << ", starting from step 0\n";
    return;
  }
  ckpt::LoadedCheckpoint checkpoint = ckpt::load_checkpoint(root);
  // Full moments read from the checkpoint; each rank keeps its shards.
  std::vector<float> exp_avg(s.model->params().total(), 0.0f), exp_avg_sq(exp_avg.size(), 0.0f);
  s.progress = load_training_checkpoint(checkpoint, *s.model, exp_avg.data(), exp_avg_sq.data());
  if (s.outer) s.outer->restore(checkpoint, *s.model, exp_avg.data(), exp_avg_sq.data());
  check_resumable(checkpoint);  // after the shapes: a shape mismatch names its tensor
  for (model::MoeLayer* layer : s.model->moe_layers()) {
    const std::string name = expert_bias_state_name(*layer);
    if (layer->has_expert_bias() && checkpoint.has(name)) {
      checkpoint.read(name, layer->expert_bias().data(), DType::F32, Shape{layer->experts()});
    }
  }
  s.precision->restore(s.progress.precision, training_state_where(checkpoint) + ".precision");
  s.optimizer->load_moments(exp_avg.data(), exp_avg_sq.data());
  out() << "resumed from " << checkpoint.path() << " at step " << s.progress.step << "\n";
  LOOM_CHECK(s.progress.step <= s.run.train.steps,
             "train.steps = " + std::to_string(s.run.train.steps) + " is behind the checkpoint " + checkpoint.path() +
                 " at step " + std::to_string(s.progress.step) + ": set train.steps above " +
                 std::to_string(s.progress.step) + " to train on, or start a new run in another run.dir");
  if (s.progress.step == s.run.train.steps) {
    out() << "the run is already complete: the checkpoint is at step " << s.progress.step
          << " = train.steps; nothing to train (raise train.steps to continue)\n";
  }
}

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
  o << " (" << s.world.backend() << ") x " << s.micro_batches << " micro-batches of " << run.train.micro_batch << " x "
    << run.data.seq_len << " tokens per step\n"
    << std::defaultfloat << s.optimizer->memory_report() << "\n";
  if (run.precision.recipe != config::PrecisionRecipe::Fp32) {
    o << "precision: " << run.precision.recipe << " GEMMs in the linear layers, fp32 master weights and optimizer"
      << (s.precision->loss_scaling() ? ", dynamic loss scale " + std::to_string(s.precision->loss_scale()) : "")
      << "\n";
  }
}

StepResult Trainer::step(int stop_signal) {
  State& s = *state_;
  const auto start = Clock::now();
  StepResult result;
  result.step = s.progress.step + 1;
  s.heartbeat.phase("forward_backward", result.step);
  s.faults.at_step_start(result.step);
  // This replica's slice of the global batch; its trained tokens are counted here and summed
  // over the replicas, so each micro-batch's gradient is scaled by 1/(global count) and the sum
  // over micro-batches and ranks is the global-batch mean.
  const int64_t first_sample = s.progress.consumed_samples + static_cast<int64_t>(s.mesh.dp_rank()) * s.local_batch;
  const int64_t local_tokens = s.make_batch(s.train, first_sample, s.local_batch, s.batch);
  result.trained_tokens = agree_token_count(s.replicas(), local_tokens);
  LOOM_CHECK(result.trained_tokens > 0, "step " + std::to_string(result.step) + " has no target tokens to learn from");
  // fp16: times the dynamic loss scale (a power of two, so exact; 1 for the other recipes).
  // DiLoCo: each site takes a step of its own, over its own tokens.
  const int64_t scale_tokens = s.outer ? agree_token_count(s.outer->inner_group(), local_tokens) : result.trained_tokens;
  if (s.objective != nullptr) s.objective->prepare(*this, s.batch);  // its own forward passes first
  const float loss_scale = s.precision->begin_step();
  const float grad_scale = static_cast<float>(1.0 / static_cast<double>(scale_tokens)) * loss_scale;
  // MoE balancing losses are per micro-batch, averaged over the global batch's micro-batches.
  s.model->set_aux_loss_scale(loss_scale * static_cast<float>(s.run.train.micro_batch) /
                              static_cast<float>(s.run.train.global_batch));
  s.model->set_token_objective(s.objective);
  const double local_loss_sum = s.forward_backward(grad_scale);
  s.model->set_token_objective(nullptr);
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
  const LossAndStop agreed = agree_loss_and_stop(s.world, holds_loss(), local_loss_sum, stop_signal, mtp_sums);
  result.loss = agreed.loss_sum / static_cast<double>(result.trained_tokens);
  result.stop_signal = agreed.stop_signal;
  for (int k = 0; k < depths; ++k) result.mtp_losses.push_back(agreed.extra[k] / std::max(1.0, agreed.extra[depths + k]));
  if (s.has_moe) {
    // Loads summed over the routing ranks move the expert biases, identically on every rank.
    const parallel::MoeStepSummary moe =
        parallel::finish_moe_step(*s.model, s.mesh.dp_cp(), s.mesh.layout().shape.pp > 1 ? &s.mesh.pp() : nullptr,
                                  s.experts.get());
    result.moe = {moe.any,      moe.tokens_min,    moe.tokens_mean,      moe.tokens_max,          moe.dropped_fraction,
                  moe.aux_loss, moe.z_loss,        moe.layer_seconds,    moe.exchange_seconds,    moe.all_to_all_bytes};
  }
  result.lr = optim::learning_rate(s.run.optim, result.step, s.run.train.steps);
  s.heartbeat.phase("optimizer", result.step);
  const PrecisionStepResult stepped = s.precision->step(result.lr, result.step);  // optimizer step unless skipped
  if (s.outer && s.outer->after_step(result.step)) s.optimizer->parameters_changed();
  result.grad_norm = stepped.grad_norm;
  result.skipped = stepped.skipped;
  result.loss_scale = stepped.loss_scale;
  result.next_loss_scale = stepped.next_loss_scale;
  s.progress.step = result.step;
  s.progress.consumed_samples += s.run.train.global_batch;
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

void Trainer::add_metrics(const StepResult& result, nlohmann::json& record) const {
  const State& s = *state_;
  if (s.mesh.layout().shape.dp > 1) record["comm_hidden_fraction"] = s.optimizer->hidden_fraction();
  if (s.optimizer->across_sites()) {  // rank 0's ports: bytes sent per link class, time blocked
    const parallel::SiteTraffic t = s.optimizer->last_step_traffic();
    record["in_site_bytes"] = t.in_site_bytes;
    record["cross_site_bytes"] = t.cross_site_bytes;
    record["cross_site_wait_s"] = t.wait_s;
  }
  if (s.outer) record["cross_site_bytes"] = s.outer->take_cross_site_bytes();
  if (s.precision->loss_scaling()) record["loss_scale"] = result.loss_scale;
  if (s.precision->loss_scaling() || result.skipped) record["skipped"] = result.skipped;
  if (!result.mtp_losses.empty()) {
    double mean = 0.0;
    for (size_t k = 0; k < result.mtp_losses.size(); ++k) {
      record["mtp_loss_" + std::to_string(k + 1)] = result.mtp_losses[k];
      mean += result.mtp_losses[k] / static_cast<double>(result.mtp_losses.size());
    }
    record["mtp_loss"] = mean;
  }
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

void Trainer::set_objective(StepObjective* objective) {
  LOOM_CHECK(objective == nullptr || state_->mesh.layout().shape.cp == 1,
             "parallel.cp = " + std::to_string(state_->mesh.layout().shape.cp) +
                 ": a per-token objective (GRPO) under context parallelism is not built yet; use parallel.cp = 1");
  state_->objective = objective;
}

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
  State& s = *state_;
  if (validation_ == nullptr) return std::nullopt;
  s.heartbeat.phase("eval", s.progress.step);
  // Data-parallel replica 0 evaluates (all its tp ranks and stages), every replica under expert
  // parallelism (replica 0's tokens reach experts others hold); ZeRO-3 gathers parameters first.
  s.optimizer->gather_full_parameters();
  std::optional<double> val_loss;
  if (s.mesh.dp_rank() == 0 || s.mesh.layout().shape.ep > 1) {
    // The same validation samples at every evaluation.
    TokenBatch batch;
    double loss_sum = 0.0;
    int64_t tokens = 0;
    for (int b = 0; b < s.run.train.eval_batches; ++b) {
      const int64_t first = static_cast<int64_t>(b) * s.run.train.micro_batch;
      tokens += s.make_batch(*validation_, first, s.run.train.micro_batch, batch);
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

std::vector<ckpt::TensorRef> Trainer::parameter_shards() {
  State& s = *state_;
  std::vector<parallel::OwnedRange> values = s.optimizer->checkpoint_ranges();
  for (parallel::OwnedRange& r : values) r.exp_avg = r.exp_avg_sq = nullptr;  // a GPU copies the values only
  const auto owned = host_ranges(s.model->params().device(), std::move(values), s.saved_from_device);
  std::vector<ckpt::TensorRef> refs = owned_training_state(*s.model, owned);
  if (s.outer) refs = s.outer->checkpoint_tensors(*s.model, std::move(refs), owned);
  std::erase_if(refs, [](const ckpt::TensorRef& r) { return !ckpt::is_model_parameter(r.name); });
  return refs;
}

std::string Trainer::save() {
  State& s = *state_;
  const int64_t step = s.progress.step;
  s.heartbeat.phase("checkpoint", step);
  const std::string root = checkpoint_root(s.run);
  // Every rank writes the shards it owns (its tensor-parallel slices, its stage's layers, its
  // part of the data-parallel state) into one shared directory; rank 0 publishes the
  // checkpoint once every rank's part is there.
  const std::vector<parallel::OwnedRange> owned = host_ranges(s.model->params().device(),
                                                              s.optimizer->checkpoint_ranges(), s.saved_from_device);
  std::vector<ckpt::TensorRef> refs = owned_training_state(*s.model, owned);
  if (s.outer) refs = s.outer->checkpoint_tensors(*s.model, std::move(refs), owned);
  if (s.mesh.dp_rank() == 0 && s.mesh.tp_rank() == 0) {
    for (const model::MoeLayer* layer : s.model->moe_layers()) {  // the same on every rank: one writes it
      if (!layer->has_expert_bias()) continue;
      const Shape shape{layer->experts()};
      refs.push_back({expert_bias_state_name(*layer), shape, DType::F32, layer->expert_bias().data(), ckpt::full_slice(shape)});
    }
  }
  if (s.mesh.layout().shape.pp > 1) {
    if (s.mesh.dp_rank() == 0 && s.mesh.tp_rank() == 0) {
      s.progress.precision = s.precision->pipeline_state(s.mesh.pp());  // every stage's FP8 histories
    }
  } else {
    s.progress.precision = s.precision->state();
  }
  // The state and config travel in rank 0's part: it writes the manifest.
  ckpt::CheckpointSnapshot snapshot = ckpt::snapshot_checkpoint(
      step, refs, reporter() ? training_state(s.progress, s.run) : nlohmann::json::object(),
      reporter() ? config::to_yaml(s.run) : std::string(), ckpt::ManifestScope::RankPart,
      s.async_writer.take_arena());  // waits only for a save still in flight
  const int64_t token = agree_save_token(s.world, static_cast<int64_t>(::getpid()));
  const ckpt::SaveRank who{s.world.rank(), s.world.size(), token,
                           std::chrono::milliseconds(static_cast<int64_t>(s.run.runtime.timeout_s * 1000.0))};
  if (s.run.checkpoint.async) {
    s.async_writer.save(root, std::move(snapshot), s.run.checkpoint.keep, who);  // the disk works while we train
  } else {
    ckpt::write_snapshot(root, snapshot, s.run.checkpoint.keep, who);
  }
  if (reporter()) s.faults.after_checkpoint(step, root, [&] { s.async_writer.wait(); });
  return (std::filesystem::path(root) / ckpt::step_dir_name(step)).string();
}

void Trainer::finish() {
  State& s = *state_;
  s.async_writer.wait();
  wait_for_every_rank(s.world);
  s.heartbeat.done(s.progress.step == s.run.train.steps, s.progress.step);
}

}  // namespace loom::train
