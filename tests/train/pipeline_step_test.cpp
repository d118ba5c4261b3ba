// The pipeline executor on its own (threads backend, no optimizer step): for each schedule at
// p = 2 and 4 with 8 micro-batches, every stage's gradients (tied embedding summed over the first
// and last stage) and the loss equal the whole model's on one rank, and each stage holds at most
// the activations its schedule promises (1F1B: p - stage; GPipe: all m), which are the
// simulation's peaks. Under NCCL's point-to-point semantics (a send waits for its recv, messages
// paired in issue order) the interleaved schedule with more micro-batches than stages runs and
// gives the same gradients bit for bit.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>

#include "loom/comm/launch.h"
#include "loom/comm/mesh.h"
#include "loom/parallel/pipeline/pipeline_partition.h"
#include "loom/parallel/pipeline/pipeline_simulation.h"
#include "loom/parallel/data/data_parallel_step.h"
#include "loom/parallel/pipeline/pipeline_step.h"
#include "support/rendezvous_comm.h"

namespace loom::train {
namespace {

constexpr int kMicroBatches = 8;
constexpr int64_t kBatch = 2, kSeq = 8;

config::ModelConfig model_config() {
  config::ModelConfig c;
  c.vocab_size = 61;
  c.d_model = 16;
  c.layers = 8;
  c.heads = 2;
  c.kv_heads = 1;
  c.ffn_size = 24;
  c.max_seq_len = 16;
  return c;
}

struct Tokens {
  std::vector<int32_t> inputs, targets;
};
Tokens make_tokens() {
  Tokens t;
  for (int64_t i = 0; i < kMicroBatches * kBatch * kSeq; ++i) {
    t.inputs.push_back(static_cast<int32_t>((i * 37 + 5) % 61));
    t.targets.push_back(static_cast<int32_t>((i * 11 + 3) % 61));
  }
  return t;
}

TEST(PipelineStep, EveryScheduleGivesTheWholeModelsGradientsWithinItsActivationBound) {
  const Tokens tokens = make_tokens();
  const float scale = 1.0f / (kMicroBatches * kBatch * kSeq);
  model::Transformer whole(model_config());
  whole.initialize(7);
  double whole_loss = 0.0;
  for (int m = 0; m < kMicroBatches; ++m) {
    whole_loss += whole.forward_backward(tokens.inputs.data() + m * kBatch * kSeq,
                                         tokens.targets.data() + m * kBatch * kSeq, kBatch, kSeq, scale);
  }
  using Kind = parallel::PipelineScheduleKind;
  for (int p : {2, 4}) {
    for (auto [kind, v] : {std::pair{Kind::GPipe, 1}, std::pair{Kind::OneFOneB, 1}, std::pair{Kind::Interleaved, 2}}) {
      const parallel::PipelineSchedule schedule = parallel::make_pipeline_schedule(kind, p, kMicroBatches, v);
      const parallel::PipelineSimulation simulation = parallel::simulate_pipeline(schedule);
      SCOPED_TRACE(parallel::pipeline_schedule_name(kind) + " p=" + std::to_string(p));
      comm::LaunchOptions options;
      options.backend = "threads";
      options.ranks = p;
      std::mutex mutex;
      comm::launch(options, [&](comm::Communicator& world) {
        comm::Mesh mesh(world, comm::MeshShape{.dp = 1, .pp = p});
        const std::vector<int> bounds = parallel::partition_layers(
            "even", std::vector<double>(model_config().layers, 1.0), 0.0, schedule.total_stages());
        model::Transformer stage(model_config(), {}, {}, parallel::stage_chunks(schedule, mesh.pp_rank(), bounds));
        stage.initialize(7);
        config::RunConfig config;
        parallel::DataParallelStep dp(mesh.dp(), stage, config, &mesh.pp(),
                                      parallel::pipeline_sync_options(stage, schedule, mesh.embedding()));
        parallel::PipelineStep pipeline(mesh.pp(), stage, schedule, dp, mesh.embedding());
        const double loss = pipeline.run(tokens.inputs.data(), tokens.targets.data(), kBatch, kSeq, scale);

        std::lock_guard<std::mutex> lock(mutex);
        const int r = mesh.pp_rank();
        if (r == p - 1) {
          EXPECT_NEAR(loss, whole_loss, 1e-5 * whole_loss);
        } else {
          EXPECT_EQ(loss, 0.0);
        }
        EXPECT_EQ(pipeline.last_stats().peak_in_flight, simulation.peak_in_flight[r]) << "stage " << r;
        if (kind == Kind::OneFOneB) {
          EXPECT_LE(pipeline.last_stats().peak_in_flight, p - r);
        }
        if (kind == Kind::GPipe) {
          EXPECT_EQ(pipeline.last_stats().peak_in_flight, kMicroBatches);
        }
        for (const model::Parameter& param : stage.params().list()) {
          const int id = whole.params().find(param.name);
          ASSERT_GE(id, 0) << param.name;
          const float* expected = whole.params().grad(id);
          const float* actual = stage.params().grads() + param.offset;
          double worst = 0.0, top = 1e-30;
          for (int64_t i = 0; i < param.numel; ++i) {
            worst = std::max(worst, static_cast<double>(std::fabs(expected[i] - actual[i])));
            top = std::max(top, static_cast<double>(std::fabs(expected[i])));
          }
          EXPECT_LE(worst / top, 1e-5) << "stage " << r << " " << param.name;
        }
      });
    }
  }
}

// One step of `schedule` over threads; each stage's gradients (by pipeline rank) and the last
// stage's loss. `rendezvous`: the pipeline group with NCCL's semantics (support/rendezvous_comm.h).
struct StageRun {
  std::vector<std::vector<float>> grads;
  double loss = 0.0;
};
StageRun run_stages(const parallel::PipelineSchedule& schedule, bool rendezvous, bool recompute) {
  const Tokens tokens = make_tokens();
  const float scale = 1.0f / (kMicroBatches * kBatch * kSeq);
  const int p = schedule.stages;
  StageRun out;
  out.grads.resize(p);
  comm::LaunchOptions options;
  options.backend = "threads";
  options.ranks = p;
  options.comm.timeout = std::chrono::seconds(30);  // a deadlock fails, naming the send
  std::mutex mutex;
  comm::launch(options, [&](comm::Communicator& world) {
    comm::Mesh mesh(world, comm::MeshShape{.dp = 1, .pp = p});
    std::unique_ptr<comm::Communicator> nccl_like;
    if (rendezvous) nccl_like = std::make_unique<testing::RendezvousCommunicator>(mesh.pp().split(0, mesh.pp_rank(), "pp-rendezvous"));
    comm::Communicator& pp = rendezvous ? *nccl_like : mesh.pp();
    config::ModelConfig config_of_model = model_config();
    config_of_model.recompute = recompute;
    const std::vector<int> bounds = parallel::partition_layers(
        "even", std::vector<double>(config_of_model.layers, 1.0), 0.0, schedule.total_stages());
    model::Transformer stage(config_of_model, {}, {}, parallel::stage_chunks(schedule, mesh.pp_rank(), bounds));
    stage.initialize(7);
    config::RunConfig config;
    parallel::DataParallelStep dp(mesh.dp(), stage, config, &mesh.pp(),
                                  parallel::pipeline_sync_options(stage, schedule, mesh.embedding()));
    double loss = 0.0;
    {
      parallel::PipelineStep pipeline(pp, stage, schedule, dp, mesh.embedding());
      loss = pipeline.run(tokens.inputs.data(), tokens.targets.data(), kBatch, kSeq, scale);
    }
    std::lock_guard<std::mutex> lock(mutex);
    out.grads[mesh.pp_rank()].assign(stage.params().grads(), stage.params().grads() + stage.params().total());
    if (mesh.pp_rank() == schedule.rank_of(schedule.total_stages() - 1)) out.loss = loss;
  });
  return out;
}

TEST(PipelineStep, InterleavedWithMoreMicroBatchesThanStagesRunsWhereSendsWaitForTheirRecv) {
  using Kind = parallel::PipelineScheduleKind;
  struct Shape {
    int p, v, m;
    bool recompute;
  };
  for (const Shape& shape : {Shape{2, 2, 4, false}, Shape{2, 2, 6, true}, Shape{3, 2, 3, false}, Shape{3, 2, 6, false},
                             Shape{2, 3, 8, false}, Shape{4, 2, 8, true}, Shape{2, 4, 8, false}}) {
    SCOPED_TRACE("p=" + std::to_string(shape.p) + " v=" + std::to_string(shape.v) + " m=" + std::to_string(shape.m));
    ASSERT_LE(shape.m, kMicroBatches);
    const parallel::PipelineSchedule schedule = parallel::make_pipeline_schedule(Kind::Interleaved, shape.p, shape.m, shape.v);
    const StageRun buffered = run_stages(schedule, false, shape.recompute);
    const StageRun nccl_like = run_stages(schedule, true, shape.recompute);
    EXPECT_EQ(nccl_like.loss, buffered.loss);
    EXPECT_NE(buffered.loss, 0.0);
    for (int r = 0; r < shape.p; ++r) {
      ASSERT_EQ(nccl_like.grads[r].size(), buffered.grads[r].size());
      EXPECT_EQ(std::memcmp(nccl_like.grads[r].data(), buffered.grads[r].data(), buffered.grads[r].size() * sizeof(float)), 0)
          << "stage " << r;
    }
  }
}

}  // namespace
}  // namespace loom::train
