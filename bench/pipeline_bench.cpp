// Pipeline schedules on the threads backend: for GPipe, 1F1B and interleaved 1F1B (v = 2) at
// p stages and m micro-batches, the measured idle fraction of each stage (time blocked waiting
// for activations or gradients, over time computing) against the theory ((p - 1) / m, and
// (p - 1) / (v m) interleaved, for equal forward and backward cost; the simulation of the same
// instruction lists with backward = 2 x forward), the step time against the whole model on one
// rank, and the peak activation memory each stage holds.
//   usage: loom_bench_pipeline [stages=4] [micro_batches=8] [steps=3]
// Every stage is one thread with one OpenMP thread: on a machine with fewer cores than stages,
// busy stages share cores, which stretches compute when many are busy and so understates idle.
#include <cblas.h>
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "loom/comm/launch.h"
#include "loom/comm/mesh.h"
#include "loom/parallel/pipeline/pipeline_partition.h"
#include "loom/parallel/pipeline/pipeline_simulation.h"
#include "loom/parallel/data/data_parallel_step.h"
#include "loom/parallel/pipeline/pipeline_step.h"

namespace {

using namespace loom;
using Clock = std::chrono::steady_clock;

struct StageResult {
  double compute = 0, wait = 0;
  int peak_in_flight = 0;
  int64_t peak_bytes = 0;
};

struct Result {
  double step_seconds = 0;
  std::vector<StageResult> stages;
};

config::ModelConfig model_config() {
  config::ModelConfig c;
  c.vocab_size = 256;
  c.d_model = 128;
  c.layers = 8;
  c.heads = 4;
  c.kv_heads = 4;
  c.ffn_size = 512;
  c.max_seq_len = 128;
  return c;
}

Result run(const parallel::PipelineSchedule& schedule, int64_t batch, int64_t seq, int steps,
           const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets) {
  const int p = schedule.stages;
  comm::LaunchOptions options;
  options.backend = "threads";
  options.ranks = p;
  Result result;
  result.stages.resize(p);
  std::mutex mutex;
  comm::launch(options, [&](comm::Communicator& world) {
    omp_set_num_threads(1);
    openblas_set_num_threads(1);
    comm::Mesh mesh(world, comm::MeshShape{.dp = 1, .pp = p});
    const config::ModelConfig config = model_config();
    const std::vector<int> bounds = parallel::partition_layers(
        "even", std::vector<double>(config.layers, 1.0), 0.0, schedule.total_stages());
    model::Transformer model(config, {}, {},
                             p > 1 ? parallel::stage_chunks(schedule, mesh.pp_rank(), bounds) : std::vector<model::LayerRange>{});
    model.initialize(1);
    config::RunConfig run_config;
    run_config.model = config;
    parallel::DataParallelStep optimizer(mesh.dp(), model, run_config, p > 1 ? &mesh.pp() : nullptr,
                                         parallel::pipeline_sync_options(model, schedule, mesh.embedding()));
    parallel::PipelineStep pipeline(mesh.pp(), model, schedule, optimizer, mesh.embedding());
    auto step = [&] {
      if (p > 1) {
        pipeline.run(tokens.data(), targets.data(), batch, seq, 1e-3f);
      } else {
        for (int m = 0; m < schedule.micro_batches; ++m) {
          optimizer.begin_micro_batch(m + 1 == schedule.micro_batches);
          model.forward_backward(tokens.data() + m * batch * seq, targets.data() + m * batch * seq, batch, seq, 1e-3f);
          optimizer.end_micro_batch(m + 1 == schedule.micro_batches);
        }
      }
      optimizer.step(1e-4, 1);
    };
    step();  // warm-up: buffers
    world.barrier();
    StageResult mine;
    const Clock::time_point start = Clock::now();
    for (int i = 0; i < steps; ++i) {
      step();
      mine.compute += pipeline.last_stats().compute_seconds;
      mine.wait += pipeline.last_stats().wait_seconds;
      mine.peak_in_flight = pipeline.last_stats().peak_in_flight;
      mine.peak_bytes = pipeline.last_stats().peak_activation_bytes;
    }
    world.barrier();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count() / steps;
    std::lock_guard<std::mutex> lock(mutex);
    result.stages[world.rank()] = mine;
    if (world.rank() == 0) result.step_seconds = seconds;
  });
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  const int p = argc > 1 ? std::atoi(argv[1]) : 4;
  const int m = argc > 2 ? std::atoi(argv[2]) : 8;
  const int steps = argc > 3 ? std::atoi(argv[3]) : 3;
  const int64_t batch = 2, seq = 64;
  std::vector<int32_t> tokens(m * batch * seq), targets(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int32_t>((i * 7919) % 256);
    targets[i] = static_cast<int32_t>((i * 104729 + 1) % 256);
  }
  std::printf("model: 8 layers, d_model 128, ffn 512, vocab 256; %d micro-batches of %lld x %lld tokens; %d stages; "
              "%d cores\n",
              m, static_cast<long long>(batch), static_cast<long long>(seq), p, omp_get_num_procs());
  const Result one = run(parallel::make_pipeline_schedule(parallel::PipelineScheduleKind::GPipe, 1, m), batch, seq,
                         steps, tokens, targets);
  std::printf("one rank, whole model: step %.1f ms\n\n", one.step_seconds * 1e3);
  std::printf("%-16s %8s %9s %9s %9s %10s %10s %12s\n", "schedule", "step ms", "vs 1 rank", "stage", "idle/busy",
              "theory", "simulated", "peak act MiB");
  const struct {
    parallel::PipelineScheduleKind kind;
    int v;
  } cases[] = {{parallel::PipelineScheduleKind::GPipe, 1},
               {parallel::PipelineScheduleKind::OneFOneB, 1},
               {parallel::PipelineScheduleKind::Interleaved, 2}};
  for (const auto& c : cases) {
    const parallel::PipelineSchedule schedule = parallel::make_pipeline_schedule(c.kind, p, m, c.v);
    const parallel::PipelineSimulation sim = parallel::simulate_pipeline(schedule);
    const Result r = run(schedule, batch, seq, steps, tokens, targets);
    const double theory = static_cast<double>(p - 1) / (c.v * m);
    std::string name = parallel::pipeline_schedule_name(c.kind);
    if (c.v > 1) name += " v=" + std::to_string(c.v);
    for (int s = 0; s < p; ++s) {
      const StageResult& st = r.stages[s];
      std::printf("%-16s %8s %9s %9d %9.3f %10.3f %10.3f %12.2f\n", s == 0 ? name.c_str() : "",
                  s == 0 ? std::to_string(static_cast<int>(r.step_seconds * 1e3 + 0.5)).c_str() : "",
                  s == 0 ? (std::to_string(r.step_seconds / one.step_seconds).substr(0, 4) + "x").c_str() : "", s,
                  st.wait / st.compute, theory, sim.idle[s] / sim.busy[s], st.peak_bytes / 1048576.0);
    }
  }
  return 0;
}
