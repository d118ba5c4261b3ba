#include "loom/train/pretrain.h"

#include <cblas.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <chrono>
#include <csignal>
#include <functional>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <mutex>
#include <sstream>

#include "loom/ckpt/async_writer.h"
#include "loom/ckpt/checkpoint.h"
#include "loom/comm/launch.h"
#include "loom/comm/mesh.h"
#include "loom/comm/simulated_links.h"
#include "loom/comm/topology.h"
#include "loom/core/error.h"
#include "loom/data/sequence_loader.h"
#include "loom/kernels/types.h"
#include "loom/optim/schedule.h"
#include "loom/parallel/data/data_parallel_step.h"
#include "loom/ops/fault_injection.h"
#include "loom/ops/heartbeat_writer.h"
#include "loom/parallel/pipeline/pipeline_step.h"
#include "loom/model/flops.h"
#include "loom/parallel/pipeline/pipeline_partition.h"
#include "loom/train/model_setup.h"
#include "loom/train/precision_step.h"
#include "loom/train/sharded_training_state.h"
#include "loom/config/metrics.h"
#include "loom/config/progress.h"

namespace loom::train {

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

using Clock = std::chrono::steady_clock;

// Mean token loss over a fixed set of validation samples (the same ones at every evaluation).
// `forward_loss` runs one micro-batch through the model (or its pipeline) and returns the sum.
double evaluate(const std::function<double(const int32_t*, const int32_t*, int64_t, int64_t)>& forward_loss,
                const data::SequenceLoader& loader, const config::RunConfig& config) {
  const int batch = config.train.micro_batch, seq = config.data.seq_len;
  std::vector<int32_t> inputs(static_cast<size_t>(batch) * seq), targets(inputs.size());
  double loss_sum = 0.0;
  int64_t tokens = 0;
  for (int b = 0; b < config.train.eval_batches; ++b) {
    loader.fill_batch(static_cast<int64_t>(b) * batch, batch, inputs.data(), targets.data());
    loss_sum += forward_loss(inputs.data(), targets.data(), batch, seq);
    for (int32_t t : targets) tokens += t != kernels::kIgnoreIndex;
  }
  return loss_sum / static_cast<double>(std::max<int64_t>(1, tokens));
}

}  // namespace

namespace {

// Threads per rank: the threads backend runs every rank in this process, so the cores are shared.
int threads_per_rank(const config::RunConfig& config, const comm::Communicator& world) {
  int total = config.train.threads > 0 ? config.train.threads : omp_get_num_procs();
  if (world.backend() == "threads") total = std::max(1, total / world.size());
  return total;
}

// One rank's share of training. The world is tp x dp x pp: the tensor-parallel ranks of a
// replica's stage each hold their shard of its layers and run the same micro-batches together;
// the pipeline stages of a replica pass each micro-batch's activations forward and gradients
// back in the order of the pipeline schedule; the replicas run their slices of each global batch,
// gradients are summed over the data-parallel group, and the same optimizer step keeps the
// replicas identical. Rank 0 prints and writes files.
TrainSummary train_rank(const config::RunConfig& config, comm::Communicator& world, std::ostream& console) {
  const bool reporter = world.rank() == 0;
  ops::Heartbeat heartbeat(world.rank(), world.size());  // for `loom launch` (docs/operations.md)
  const ops::FaultInjector faults(config.fault, world.rank(), world.size());
  std::ostringstream discard;
  std::ostream& out = reporter ? console : discard;
  const int tp = config.parallel.tp, pp = config.parallel.pp;
  LOOM_CHECK(world.size() % (tp * pp) == 0, "parallel.tp x parallel.pp = " + std::to_string(tp) + " x " +
                                            std::to_string(pp) + " does not divide the world's " +
                                            std::to_string(world.size()) + " ranks (runtime.ranks or the launcher's)");
  const int dp = world.size() / (tp * pp);
  LOOM_CHECK(config.parallel.dp == 0 || config.parallel.dp == dp,
        "parallel.dp is " + std::to_string(config.parallel.dp) + " but the world has " + std::to_string(world.size()) +
            " ranks (runtime.ranks or the launcher's), parallel.tp = " + std::to_string(tp) + " and parallel.pp = " +
            std::to_string(pp) + "; use 0 (auto) or " + std::to_string(dp));
  // Megatron's rank order: tensor-parallel ranks adjacent, then data-parallel, pipeline slowest.
  comm::Mesh mesh(world, comm::MeshShape{.tp = tp, .dp = dp, .pp = pp});
  LOOM_CHECK(config.train.global_batch % (config.train.micro_batch * dp) == 0,
        "train.global_batch " + std::to_string(config.train.global_batch) + " must be a multiple of train.micro_batch " +
            std::to_string(config.train.micro_batch) + " x data-parallel ranks " + std::to_string(dp));
  const int threads = threads_per_rank(config, world);
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);

  auto tokenizer = data::make_tokenizer(config.data.tokenizer);
  LOOM_CHECK(!config.data.train_prefix.empty(),
        "data.train_prefix is empty: give the prefix of a dataset made by `loom data prepare`");
  data::SequenceLoader train_data(config.data.train_prefix, config.data.seq_len, config.train.seed);
  std::optional<data::SequenceLoader> val_data;
  if (!config.data.val_prefix.empty()) val_data.emplace(config.data.val_prefix, config.data.seq_len, config.train.seed);

  config::RunConfig run = config;
  run.model = resolve_model_config(config.model, *tokenizer);
  const int seq = run.data.seq_len, micro = run.train.micro_batch;
  const int local_batch = run.train.global_batch / dp;
  const int micro_batches = local_batch / micro;
  // Pipeline: the schedule (checked before anything is built) and this rank's model chunks.
  std::optional<parallel::PipelineSchedule> schedule;
  std::vector<model::LayerRange> chunks;
  if (pp > 1) {
    schedule = parallel::make_pipeline_schedule(parallel::parse_pipeline_schedule(run.parallel.pipeline_schedule), pp,
                                                micro_batches, run.parallel.virtual_stages);
    std::vector<double> costs;
    for (const model::LayerSpec& spec : model::resolve_layers(run.model)) {
      costs.push_back(model::layer_training_flops_per_token(run.model, spec, seq));
    }
    const std::vector<int> bounds = parallel::partition_layers(
        run.parallel.pipeline_partition, costs, model::head_training_flops_per_token(run.model), schedule->total_stages());
    chunks = parallel::stage_chunks(*schedule, mesh.pp_rank(), bounds);
  } else {
    LOOM_CHECK(run.parallel.virtual_stages == 1, "parallel.virtual_stages = " + std::to_string(run.parallel.virtual_stages) +
                                                " needs a pipeline: set parallel.pp > 1 (and pipeline_schedule: interleaved)");
  }
  model::Transformer model(run.model, model::TensorParallel(&mesh.tp(), run.parallel.sequence_parallel),
                           model::PrecisionPolicy::from_config(run.precision), chunks);
  model.initialize(run.train.seed);
  parallel::DataParallelStep optimizer(mesh.dp(), model, run, pp > 1 ? &mesh.pp() : nullptr);
  std::optional<parallel::PipelineStep> pipeline;
  if (schedule) pipeline.emplace(mesh.pp(), model, *schedule, optimizer, mesh.embedding());
  // Loss scaling, Inf/NaN skips, FP8 amaxes (agreed among the ranks holding the same layers).
  PrecisionStep precision(run.precision, model, optimizer, world, pp > 1 ? &mesh.add_group("tp-dp") : nullptr);

  const std::string root = checkpoint_root(run);
  TrainingProgress progress;
  std::vector<float> exp_avg, exp_avg_sq;  // full moments read from a checkpoint on resume
  if (run.train.resume) {
    if (std::filesystem::exists(std::filesystem::path(root) / "latest")) {
      ckpt::LoadedCheckpoint checkpoint = ckpt::load_checkpoint(root);
      exp_avg.assign(model.params().total(), 0.0f);
      exp_avg_sq.assign(model.params().total(), 0.0f);
      progress = load_training_checkpoint(checkpoint, model, exp_avg.data(), exp_avg_sq.data());
      precision.restore(progress.precision);
      optimizer.load_moments(exp_avg.data(), exp_avg_sq.data());
      out << "resumed from " << checkpoint.path() << " at step " << progress.step << "\n";
    } else {
      out << "train.resume: no checkpoint under " << root << ", starting from step 0\n";
    }
  }

  const int64_t tokens_per_step = static_cast<int64_t>(run.train.global_batch) * seq;
  const double flops_per_token = model.training_flops_per_token(seq);
  out << "model: " << model.params().total() << " parameters, " << run.model.layers << " layers, vocab "
      << run.model.vocab_size << "; " << std::fixed << std::setprecision(3) << flops_per_token / 1e9
      << " GFLOP per token; " << dp << " data-parallel x " << tp << " tensor-parallel rank(s)"
      << (run.parallel.sequence_parallel && tp > 1 ? " with sequence parallelism" : "");
  if (schedule) {
    out << " x " << pp << " pipeline stages (" << run.parallel.pipeline_schedule;
    if (schedule->virtual_stages > 1) out << ", " << schedule->virtual_stages << " virtual stages per rank";
    out << "; layers of this rank:";
    for (const model::LayerRange& c : chunks) out << " [" << c.first << ", " << c.last << ")";
    out << ")";
  }
  out << " (" << world.backend()
      << ") x " << micro_batches
      << " micro-batches of " << micro << " x " << seq << " tokens per step\n"
      << std::defaultfloat << optimizer.memory_report() << "\n";
  if (run.precision.recipe != "fp32") {
    out << "precision: " << run.precision.recipe << " GEMMs in the linear layers, fp32 master weights and optimizer"
        << (precision.loss_scaling() ? ", dynamic loss scale " + std::to_string(precision.loss_scale()) : "") << "\n";
  }

  std::optional<config::MetricsWriter> metrics;
  std::optional<config::ProgressBar> bar;
  if (reporter) {
    metrics.emplace(run.run.dir, progress.step + 1);
    bar.emplace(run.train.steps, static_cast<int>(progress.step), run.log.progress && ::isatty(STDOUT_FILENO),
                run.log.interval, out);
  }
  auto message = [&](const std::string& text) {
    if (bar) bar->message(text);
  };
  StopSignals signals;
  ckpt::AsyncCheckpointWriter async_writer;

  TrainSummary summary;
  summary.reporter = reporter;
  summary.first_step = static_cast<int>(progress.step) + 1;
  std::vector<int32_t> inputs(static_cast<size_t>(micro) * seq), targets(inputs.size());
  std::vector<int32_t> all_targets(static_cast<size_t>(run.train.global_batch) * seq);
  std::vector<int32_t> scratch_inputs(all_targets.size());
  std::vector<int32_t> step_inputs(pipeline ? static_cast<size_t>(local_batch) * seq : 0), step_targets(step_inputs.size());
  double timed_seconds = 0.0;
  int64_t timed_tokens = 0;
  int steps_this_run = 0;
  std::string last_checkpoint;

  // Data-parallel replica 0 evaluates (all its tensor-parallel ranks: the forward pass needs
  // them) and rank 0 reports; with ZeRO-3 every rank first contributes its shard of the parameters.
  auto evaluate_on_rank0 = [&]() -> std::optional<double> {
    heartbeat.phase("eval", progress.step);
    optimizer.gather_full_parameters();
    std::optional<double> val_loss;
    if (mesh.dp_rank() == 0) {
      val_loss = evaluate(
          [&](const int32_t* in, const int32_t* tg, int64_t b, int64_t t) {
            return pipeline ? pipeline->forward_loss(in, tg, b, t) : model.forward_loss(in, tg, b, t);
          },
          *val_data, run);
    }
    if (!reporter) val_loss.reset();
    optimizer.release_full_parameters();
    return val_loss;
  };
  if (val_data && progress.step == 0 && run.train.eval_interval > 0) {
    summary.first_val_loss = evaluate_on_rank0();
    if (reporter) message("step 0: val_loss " + std::to_string(*summary.first_val_loss));
  }

  for (int step = static_cast<int>(progress.step) + 1; step <= run.train.steps; ++step) {
    const auto start = Clock::now();
    heartbeat.phase("forward_backward", step);
    faults.at_step_start(step);
    // Tokens that count towards the loss over the whole global batch (every rank counts them
    // all, exactly): each micro-batch's gradient is scaled by 1/total, so summing over
    // micro-batches and ranks gives the global-batch mean.
    train_data.fill_batch(progress.consumed_samples, run.train.global_batch, scratch_inputs.data(), all_targets.data());
    int64_t valid_tokens = 0;
    for (int32_t t : all_targets) valid_tokens += t != kernels::kIgnoreIndex;
    LOOM_CHECK(valid_tokens > 0, "step " + std::to_string(step) + " has no target tokens to learn from");
    // fp16: times the dynamic loss scale (a power of two, so exact; 1 for the other recipes).
    const float grad_scale = static_cast<float>(1.0 / static_cast<double>(valid_tokens)) * precision.begin_step();

    double local_loss_sum = 0.0;
    const int64_t first_sample = progress.consumed_samples + static_cast<int64_t>(mesh.dp_rank()) * local_batch;
    if (pipeline) {
      // The stages run the replica's micro-batches in the schedule's order; every stage reads
      // them (the first needs the inputs, the last the targets, the first's backward the inputs).
      train_data.fill_batch(first_sample, local_batch, step_inputs.data(), step_targets.data());
      local_loss_sum = pipeline->run(step_inputs.data(), step_targets.data(), micro, seq, grad_scale);
    }
    for (int m = 0; m < micro_batches && !pipeline; ++m) {
      const bool last_micro_batch = m + 1 == micro_batches;
      train_data.fill_batch(first_sample + static_cast<int64_t>(m) * micro, micro, inputs.data(), targets.data());
      // Gradients of the global mean loss are the sum of every rank's contributions: their
      // reduction starts bucket by bucket during backward (see parallel::DataParallelStep).
      optimizer.begin_micro_batch(last_micro_batch);
      local_loss_sum += model.forward_backward(inputs.data(), targets.data(), micro, seq, grad_scale);
      optimizer.end_micro_batch(last_micro_batch);
    }
    double loss_sum = local_loss_sum;
    bool stop_requested = g_stop_requested.load();
    if (world.size() > 1) {
      // Loss and the stop decision travel together, so every rank stops after the same step.
      // The tensor-parallel ranks of a replica share its loss (computed on the last pipeline
      // stage): one of them contributes it.
      const bool contributes = mesh.tp_rank() == 0 && mesh.pp_rank() == pp - 1;
      float shared[2] = {contributes ? static_cast<float>(local_loss_sum) : 0.0f, stop_requested ? 1.0f : 0.0f};
      world.all_reduce(shared, 2, DType::F32, comm::ReduceOp::Sum);
      loss_sum = shared[0];
      stop_requested = shared[1] > 0.0f;
    }
    const double loss = loss_sum / static_cast<double>(valid_tokens);
    const double lr = optim::learning_rate(run.optim, step, run.train.steps);
    heartbeat.phase("optimizer", step);
    const PrecisionStepResult stepped = precision.step(lr, step);  // optimizer.step unless skipped
    const double grad_norm = stepped.grad_norm;
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

    const bool last = step == run.train.steps;
    const bool stop = stop_requested || (run.train.exit_interval > 0 && steps_this_run >= run.train.exit_interval);
    std::optional<double> val_loss;
    if (val_data && run.train.eval_interval > 0 && (step % run.train.eval_interval == 0 || last)) {
      val_loss = evaluate_on_rank0();
    }
    if (steps_this_run == 1) out << optimizer.peak_memory_report() << "\n";
    if (reporter) {
      nlohmann::json record = {{"step", step},
                               {"loss", loss},
                               {"lr", lr},
                               {"grad_norm", grad_norm},
                               {"tokens_per_s", tokens_per_s},
                               {"gflops_per_s", flops_per_token * tokens_per_s / 1e9},
                               {"step_time_s", seconds},
                               {"consumed_samples", progress.consumed_samples}};
      if (val_loss) {
        record["val_loss"] = *val_loss;
        if (!summary.first_val_loss) summary.first_val_loss = val_loss;
        summary.last_val_loss = val_loss;
        message("step " + std::to_string(step) + ": val_loss " + std::to_string(*val_loss));
      }
      if (dp > 1) record["comm_hidden_fraction"] = optimizer.hidden_fraction();
      if (precision.loss_scaling()) record["loss_scale"] = stepped.loss_scale;
      if (precision.loss_scaling() || stepped.skipped) record["skipped"] = stepped.skipped;
      if (stepped.skipped) {
        message("step " + std::to_string(step) + ": skipped (Inf/NaN in the gradients), " +
                std::to_string(precision.skipped_steps()) + " skipped so far" +
                (precision.loss_scaling() ? "; loss scale now " + std::to_string(stepped.next_loss_scale) : ""));
      }
      metrics->write(record);
      bar->update(step, loss, lr, grad_norm, tokens_per_s);
    }

    const bool interval_due = run.checkpoint.interval > 0 && step % run.checkpoint.interval == 0;
    if (interval_due || last || stop) {
      heartbeat.phase("checkpoint", step);
      // Every rank writes the shards it owns (its tensor-parallel slices, its stage's layers, its
      // part of the data-parallel state) into one shared directory; rank 0 publishes the
      // checkpoint once every rank's part is there.
      const std::vector<parallel::OwnedRange> owned = optimizer.checkpoint_ranges();
      const std::vector<ckpt::TensorRef> refs = owned_training_state(model, owned);
      if (pp > 1 && mesh.dp_rank() == 0 && mesh.tp_rank() == 0) {
        progress.precision = precision.pipeline_state(mesh.pp());  // every stage's FP8 histories
      } else if (pp == 1) {
        progress.precision = precision.state();
      }
      // The state and config travel in rank 0's part: it writes the manifest.
      ckpt::CheckpointSnapshot snapshot =
          ckpt::snapshot_checkpoint(progress.step, refs, reporter ? training_state(progress, run) : nlohmann::json::object(),
                                    reporter ? config::to_yaml(run) : std::string(), ckpt::ManifestScope::RankPart,
                                    async_writer.take_arena());  // waits only for a save still in flight
      int64_t token = reporter ? static_cast<int64_t>(::getpid()) : 0;
      if (world.size() > 1) world.broadcast(&token, 1, DType::I64, 0);
      const ckpt::SaveRank who{world.rank(), world.size(), token,
                               std::chrono::milliseconds(static_cast<int64_t>(run.runtime.timeout_s * 1000.0))};
      if (run.checkpoint.async) {
        async_writer.save(root, std::move(snapshot), run.checkpoint.keep, who);  // the disk works while we train
      } else {
        ckpt::write_snapshot(root, snapshot, run.checkpoint.keep, who);
      }
      if (reporter) faults.after_checkpoint(step, root, [&] { async_writer.wait(); });
      last_checkpoint = (std::filesystem::path(root) / ckpt::step_dir_name(step)).string();
    }
    if (stop && !last) {
      message("stopping after step " + std::to_string(step) + "; resume with train.resume=true");
      break;
    }
  }
  async_writer.wait();
  // Nobody returns (and, with MPI, finalises) before the files are complete.
  world.barrier();
  heartbeat.done(progress.step == run.train.steps, progress.step);
  summary.checkpoint = last_checkpoint;
  if (timed_seconds > 0.0) {
    summary.tokens_per_s = static_cast<double>(timed_tokens) / timed_seconds;
    summary.gflops_per_s = flops_per_token * summary.tokens_per_s / 1e9;
  }
  return summary;
}

}  // namespace

TrainSummary pretrain(const config::RunConfig& config, std::ostream& out) {
  comm::LaunchOptions options;
  options.backend = config.runtime.backend;
  options.ranks = config.runtime.ranks;
  options.comm.timeout =
      std::chrono::milliseconds(static_cast<int64_t>(std::llround(config.runtime.timeout_s * 1000.0)));
  std::shared_ptr<comm::SimulatedLinks> links;
  if (config.topology.simulate) {
    // The threads backend delays every inter-rank copy by its link class and counts the bytes.
    const std::string backend =
        config.runtime.backend == "auto" ? comm::detect_backend() : config.runtime.backend;
    LOOM_CHECK(backend == "threads", "topology.simulate needs the threads backend (runtime.backend is '" + backend +
                                    "'; real launchers have real links)");
    const config::TopologyConfig& t = config.topology;
    links = std::make_shared<comm::SimulatedLinks>(
        comm::topology_from_blocks(config.runtime.ranks, t.ranks_per_node, t.nodes_per_site),
        comm::LinkSpecs{{t.node_latency_us, t.node_bandwidth_gbps},
                        {t.site_latency_us, t.site_bandwidth_gbps},
                        {t.cross_site_latency_us, t.cross_site_bandwidth_gbps}});
    options.link_model = links;
  }
  TrainSummary summary;
  summary.reporter = false;  // set by the rank that reports (in this process, if any)
  std::mutex summary_mutex;
  comm::launch(options, [&](comm::Communicator& world) {
    TrainSummary mine = train_rank(config, world, out);
    if (mine.reporter) {
      std::lock_guard<std::mutex> lock(summary_mutex);
      summary = mine;
    }
  });
  if (links) out << "simulated links: " << links->describe_traffic() << "\n";
  return summary;
}

}  // namespace loom::train
