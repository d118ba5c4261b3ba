#include <gtest/gtest.h>

#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "cli_support.h"
#include "support/test_paths.h"

namespace loom::testing {
namespace {

TEST(PlanCli, PrintsTheTimelineAndTheBubble) {
  CommandResult r = run_loom("plan schedule --pp 4 --microbatches 8 --schedule interleaved --virtual 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("stage 3 |"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("F7b"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("bubble fraction 0.1875 (theory (p - 1) / (v m) = 0.1875)"), std::string::npos) << r.output;
  r = run_loom("plan schedule --pp 2 --microbatches 3 --list");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("stage 1: recv_forward(0) forward(0) backward(0) send_backward(0)"), std::string::npos)
      << r.output;
}

TEST(PlanCli, ScheduleThatCannotRunIsAClearError) {
  CommandResult r = run_loom("plan schedule --pp 4 --microbatches 6 --schedule interleaved --virtual 2");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("multiple of the stages (4)"), std::string::npos) << r.output;
}

std::string source(const std::string& path) { return loom::test_paths::source_dir() + "/" + path; }

TEST(PlanCli, MemoryPrintsEveryCategoryPerStageAndJson) {
  CommandResult r = run_loom("plan memory " + source("configs/tiny.yaml") +
                             " runtime.ranks=2 parallel.pp=2 train.micro_batch=2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("layout: tp 1 x dp 1 x pp 2, 8 micro-batches per step"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("| parameters | gradients | master | moments | comm buffers |"), std::string::npos);
  EXPECT_NE(r.output.find("| 0 | [0,3) | 2278912 |"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("| 1 | [3,6) | 2279168 |"), std::string::npos) << r.output;
  r = run_loom("plan memory " + source("configs/tiny.yaml") + " --json --kv-cache 4,256");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\"parameter_count\": 4492544"), std::string::npos) << r.output;
  // 6 layers x k and v x 4 kv heads x 32 x 256 positions x 4 sequences x 2 bytes.
  EXPECT_NE(r.output.find("\"kv_cache\": " + std::to_string(6 * 2 * 128 * 256 * 4 * 2)), std::string::npos) << r.output;
}

TEST(PlanCli, TheFortyNineBModelPlansInAMomentAndNeedsTwoNodes) {
  const std::string config = source("configs/nemotron-super-49b.yaml");
  CommandResult r = run_loom("plan memory " + config + " --ranks 8 parallel.tp=8 --activation-bytes 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("| 0 | [0,80) | 6234324992 |"), std::string::npos) << r.output;  // 49.87B / 8
  const std::string hardware = source("configs/hardware/h100-sxm.yaml");
  r = run_loom("plan search " + config + " --hardware " + hardware + " --devices 8 --top 1");
  EXPECT_EQ(r.exit_code, 1) << r.output;  // 18 bytes x 49.9B over 8 x 80 GB does not fit
  EXPECT_NE(r.output.find("0 ranked"), std::string::npos) << r.output;
  // Planned as it runs on the GPUs (runtime.device=cuda): under bf16 its norms' rows are gathered
  // in bf16 into attention and the MLPs, where the CPU path's fp32 gathers put tp 4 x cp 2 ahead.
  r = run_loom("plan search " + config + " --hardware " + hardware + " --devices 16 --top 1 runtime.device=cuda");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("| 1 | tp 8"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("best: loom train CONFIG parallel.tp=8"), std::string::npos) << r.output;
}

// Nemotron 3 Super at full size: the main model holds the published 120.6B parameters (its
// multi-token prediction block, run twice, 2.9B more), in about 41,000 tensors, most of them experts.
TEST(PlanCli, NemotronThreeSuperHoldsItsPublishedParameters) {
  const std::string config = source("configs/nemotron3-super-120b.yaml");
  CommandResult r = run_loom("plan memory " + config + " model.mtp_depths=0 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\"parameter_count\": 120668687360"), std::string::npos) << r.output;
  r = run_loom("plan memory " + config + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\"parameter_count\": 123611012096"), std::string::npos) << r.output;
}

TEST(PlanCli, TimePrintsTheBreakdown) {
  CommandResult r = run_loom("plan time " + source("configs/tiny.yaml") + " runtime.ranks=2 parallel.tp=2 --hardware " +
                             source("configs/hardware/h100-sxm.yaml"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("step time on H100 SXM 80GB:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("| compute | casts | memory faults | bubble | core wait | tp comm | cp comm | ep comm | "
                          "pp comm | dp comm (exposed) | host link | optimizer | overhead | step |"),
            std::string::npos)
      << r.output;
  r = run_loom("plan time " + source("configs/tiny.yaml") + " --json --hardware " + source("configs/hardware/h100-sxm.yaml"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\"step_s\""), std::string::npos) << r.output;
}

// The run's time: every batch it trains on planned as a run of that batch, times its steps.
TEST(PlanCli, TimeAddsUpTheRunOverItsBatches) {
  const std::string hardware = " --hardware " + source("configs/hardware/h100-sxm.yaml");
  const std::string ramp = " train.steps=0 train.samples=1600 train.rampup_batch_size='8 8 480' optim.warmup_steps=0";
  CommandResult r = run_loom("plan time " + source("configs/tiny.yaml") + ramp + hardware);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Steps that start before 480 samples train on 8 (60 of them), the rest on 16: 1120 / 16 = 70.
  EXPECT_NE(r.output.find("run of train.samples = 1600 (130 steps): 60 steps of 8 sequences x "), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find(" + 70 steps of 16 sequences x "), std::string::npos) << r.output;
  r = run_loom("plan time " + source("configs/tiny.yaml") + ramp + " --json" + hardware);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json run = nlohmann::json::parse(r.output).at("run");
  ASSERT_EQ(run.at("by_batch").size(), 2u);
  const nlohmann::json& small = run["by_batch"][0];
  const nlohmann::json& full = run["by_batch"][1];
  EXPECT_EQ(run.at("steps").get<int64_t>(), 130);
  EXPECT_LT(small.at("step_s").get<double>(), full.at("step_s").get<double>());  // half the batch, less time
  const double expected = 60 * small.at("step_s").get<double>() + 70 * full.at("step_s").get<double>();
  EXPECT_NEAR(run.at("seconds").get<double>(), expected, 1e-12);
  // Without a ramp-up: train.steps steps of the step the table shows.
  r = run_loom("plan time " + source("configs/tiny.yaml") + " --json" + hardware);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json plain = nlohmann::json::parse(r.output);
  EXPECT_NEAR(plain.at("run").at("seconds").get<double>(), 300 * plain.at("time").at("step_s").get<double>(), 1e-12);
}

// A layout whose micro-batches x dp do not divide a ramp-up's batches cannot run: the search leaves
// it out (dp 2 x micro-batch 8 = 16 does not divide the ramp's first batch of 8).
TEST(PlanCli, SearchLeavesOutLayoutsThatCannotSplitARampUp) {
  const std::string search = "plan search " + source("configs/tiny.yaml") + " --hardware " +
                             source("configs/hardware/h100-sxm.yaml") + " --devices 2 --top 200";
  CommandResult plain = run_loom(search);
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  EXPECT_NE(plain.output.find("dp 2, zero 1, micro-batch 8"), std::string::npos) << plain.output;
  CommandResult ramp = run_loom(search + " 'train.rampup_batch_size=[8, 8, 480]'");
  ASSERT_EQ(ramp.exit_code, 0) << ramp.output;
  EXPECT_EQ(ramp.output.find("dp 2, zero 1, micro-batch 8"), std::string::npos) << ramp.output;
  EXPECT_NE(ramp.output.find("dp 2, zero 1, micro-batch 4"), std::string::npos) << ramp.output;
}

TEST(PlanCli, BadInputIsAClearError) {
  TempDir dir;
  write_text(dir / "hw.yaml", "device: {peak_tflops: 1, memory_gb: 80}\n");
  CommandResult r = run_loom("plan time " + source("configs/tiny.yaml") + " --hardware " + (dir / "hw.yaml"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(dir / "hw.yaml" + ": hardware key 'device.memory_gb' is not known"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("did you mean 'memory_gib'?"), std::string::npos) << r.output;
  r = run_loom("plan time " + source("configs/tiny.yaml") + " --hardware " + (dir / "missing.yaml"));
  EXPECT_NE(r.output.find("cannot read hardware file"), std::string::npos) << r.output;
  r = run_loom("plan memory " + source("configs/tiny.yaml") + " runtime.ranks=3 parallel.tp=2");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("parallel.tp x parallel.pp = 2 x 1 does not divide"), std::string::npos) << r.output;
  r = run_loom("plan memory " + source("configs/tiny.yaml") + " parallel.tp=3 runtime.ranks=3");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("attention heads cannot be split over 3"), std::string::npos) << r.output;
  r = run_loom("plan memory " + source("configs/tiny.yaml") + " parallel.zer=1");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("parallel.zer"), std::string::npos) << r.output;
  r = run_loom("plan search " + source("configs/tiny.yaml") + " --hardware " + source("configs/hardware/h100-sxm.yaml"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--devices"), std::string::npos) << r.output;
}

TEST(PlanCli, BenchHardwareWritesAFileThatPlanTimeReads) {
  TempDir dir;
  CommandResult r = run_loom("bench hardware --output " + (dir / "host.yaml"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("effective cores"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("GFLOP/s; handed-back memory"), std::string::npos) << r.output;  // the scan's rate
  std::ifstream written(dir / "host.yaml");
  const std::string text((std::istreambuf_iterator<char>(written)), std::istreambuf_iterator<char>());
  const size_t scan = text.find("scan_tflops: ");
  ASSERT_NE(scan, std::string::npos) << text;
  EXPECT_GT(std::stod(text.substr(scan + 13)), 0.0) << text;
  // One process on every processor: its threads' speed-ups over one thread.
  EXPECT_NE(r.output.find("the GEMM "), std::string::npos) << r.output;
  for (const char* key : {"processors: ", "gemm_thread_speedup: ", "memory_thread_speedup: "}) {
    const size_t at = text.find(key);
    ASSERT_NE(at, std::string::npos) << key << " in " << text;
    EXPECT_GT(std::stod(text.substr(at + std::string(key).size())), 0.0) << text;
  }
  r = run_loom("plan time " + source("configs/tiny.yaml") + " runtime.ranks=2 --hardware " + (dir / "host.yaml"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("step time on this host (loom bench hardware):"), std::string::npos) << r.output;
}

// A training run prints the planned memory next to what its first step measured; loom's
// allocator counts exactly what the plan counts (the resident set adds the binary's and the BLAS
// library's own pages): on one rank, on two with ZeRO-1 whose buckets (0.25 MiB) are smaller
// than the largest parameters, which then size the reduction's staging slots, and on two
// context-parallel ranks, ring and all-to-all, with a model small and sequences long enough that
// their exchange buffers (and all-to-all's gathered heads) are 7-17% of what a rank holds; and the
// Nemotron 3 Super hybrid (Mamba-2 mixers, latent MoE layers with a shared expert, multi-token
// prediction) on one rank, under sequence parallelism (whose summed expert gradients take
// buffers as large as a layer's experts), recompute (one saved set as large as each kind of
// layer needs), a pipeline, expert parallelism and bf16; and the precision recipes' operand
// copies, with kv heads replicated over 4 tensor-parallel ranks (their summed gradients).
TEST(PlanCli, TrainingComparesThePlanWithTheFirstStep) {
  TempDir dir;
  ASSERT_EQ(prepare_small_corpus(dir.path(), 60, 0.0).exit_code, 0);
  const std::string tiny = source("configs/tiny.yaml") + " data.seq_len=64 train.global_batch=4 train.micro_batch=2";
  const std::string hybrid = source("configs/nemotron3-super-tiny.yaml");
  const std::vector<std::string> runs = {
      tiny, tiny + " runtime.ranks=2 parallel.zero=1 parallel.bucket_mb=0.25",
      tiny + " runtime.ranks=2 parallel.cp=2 parallel.cp_comm=p2p parallel.zero=1 data.seq_len=256 model.d_model=64 "
             "model.heads=4 model.kv_heads=2 model.ffn_size=128 model.layers=2",
      tiny + " runtime.ranks=2 parallel.cp=2 parallel.cp_comm=a2a data.seq_len=256 model.d_model=64 model.heads=4 "
             "model.kv_heads=2 model.ffn_size=128 model.layers=2",
      hybrid, hybrid + " runtime.ranks=2 parallel.tp=2 parallel.sequence_parallel=true",
      hybrid + " model.recompute=true", hybrid + " runtime.ranks=2 parallel.pp=2",
      // The mixers' head exchange and scratch, beside the ring's buffers or Ulysses' (shared exchange).
      hybrid + " runtime.ranks=2 parallel.cp=2", hybrid + " runtime.ranks=2 parallel.cp=2 parallel.cp_comm=a2a",
      hybrid + " runtime.ranks=2 parallel.ep=2", hybrid + " precision.recipe=bf16",
      // FP8 routed experts, their rows padded to 16 (planned at the bound).
      hybrid + " precision.recipe=fp8_current precision.fp8_edge_layers_bf16=false",
      tiny + " runtime.ranks=4 parallel.tp=4 model.kv_heads=2 precision.recipe=fp8_delayed",
      // The measured step is a ramp-up's first, of one micro-batch where the full batch has two in flight.
      tiny + " runtime.ranks=2 parallel.pp=2 parallel.pipeline_schedule=gpipe train.rampup_batch_size=[2,2,1000]"};
  for (size_t i = 0; i < runs.size(); ++i) {
    SCOPED_TRACE(runs[i]);
    CommandResult r = run_loom("train " + runs[i] + " data.train_prefix=" + (dir / "data/c_train") +
                               " data.val_prefix= train.steps=1 checkpoint.interval=0 checkpoint.at_end=false "
                               "log.progress=false run.dir=" + (dir / ("run" + std::to_string(i))));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const size_t at = r.output.find("memory: planned ");
    ASSERT_NE(at, std::string::npos) << r.output;
    const std::string line = r.output.substr(at, r.output.find('\n', at) - at);
    auto mib_after = [&](const std::string& key) {
      const size_t k = line.find(key);
      EXPECT_NE(k, std::string::npos) << line;
      const double value = std::stod(line.substr(k + key.size()));
      const bool kib = line.compare(line.find(' ', k + key.size()) + 1, 3, "KiB") == 0;
      return kib ? value / 1024 : value;
    };
    // Within 2%, and the 0.05 MiB each printed value is rounded by.
    EXPECT_NEAR(mib_after("planned "), mib_after("allocator peak "), 0.02 * mib_after("allocator peak ") + 0.1) << line;
    EXPECT_NE(line.find("planned / measured"), std::string::npos) << line;
  }
}

}  // namespace
}  // namespace loom::testing
