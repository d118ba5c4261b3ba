// End-to-end: `loom launch` supervising `loom train` (2 ranks, threads backend) with injected
// faults: a killed rank, a stalled rank, a corrupted checkpoint, restarts used up. Each recovered
// run ends with the same parameters as an uninterrupted one (`loom ckpt digest`).
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>

#include "cli_support.h"
#include "support/test_paths.h"

namespace loom::testing {
namespace {

namespace fs = std::filesystem;

class LaunchCli : public ::testing::Test {
 protected:
  void SetUp() override {
    CommandResult prepared = prepare_small_corpus(dir.path(), 300, 0.2);
    ASSERT_EQ(prepared.exit_code, 0) << prepared.output;
    write_text(dir / "config.yaml",
               "model:\n  vocab_size: 0\n  d_model: 32\n  layers: 2\n  heads: 4\n  kv_heads: 2\n  ffn_size: 64\n"
               "  max_seq_len: 64\n"
               "data:\n  tokenizer: byte\n  train_prefix: " + (dir / "data/c_train") + "\n  val_prefix: " +
               (dir / "data/c_val") + "\n  seq_len: 32\n"
               "optim:\n  lr: 3.0e-3\n  warmup_steps: 2\n"
               "train:\n  steps: 8\n  global_batch: 4\n  micro_batch: 2\n  eval_interval: 4\n  eval_batches: 2\n"
               "  threads: 1\n"
               "runtime:\n  ranks: 2\n"
               "checkpoint:\n  interval: 2\n  keep: 3\n"
               "log:\n  progress: false\n");
  }

  std::string train_command(const std::string& run, const std::string& overrides) {
    return loom::test_paths::binary() + " train " + (dir / "config.yaml") + " run.dir=" + (dir / run) + " " + overrides;
  }
  CommandResult launch(const std::string& options, const std::string& run, const std::string& overrides) {
    return run_loom("launch " + options + " -- " + train_command(run, overrides));
  }
  std::string digest(const std::string& run) { return last_line(run_loom("ckpt digest " + (dir / run) + "/checkpoints").output); }
  std::string uninterrupted_digest() {
    CommandResult full = run_loom("train " + (dir / "config.yaml") + " run.dir=" + (dir / "full"));
    EXPECT_EQ(full.exit_code, 0) << full.output;
    return digest("full");
  }
  static bool has(const CommandResult& r, const std::string& text) { return r.output.find(text) != std::string::npos; }

  TempDir dir;
};

// Three SIGKILLs of random ranks at random steps (each attempt dies 1-2 steps after it starts,
// one step after its last checkpoint at the latest): the job still finishes with the parameters of
// an uninterrupted run.
TEST_F(LaunchCli, ThreeRandomKillsStillFinishWithTheUninterruptedParameters) {
  CommandResult r = launch("--max-restarts 3 --hang-timeout-s 60 --grace-s 1", "random",
                           "fault.random_kills=3 fault.random_kill_window=2 fault.seed=7 checkpoint.interval=1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (int attempt = 1; attempt <= 3; ++attempt) {
    EXPECT_TRUE(has(r, "attempt " + std::to_string(attempt) + " failed: the job was killed by signal 9 (SIGKILL)"))
        << r.output;
  }
  EXPECT_TRUE(has(r, "fault.random_kills: attempt 2 of 3")) << r.output;
  EXPECT_TRUE(has(r, "training finished on attempt 4 (3 restart(s))")) << r.output;
  EXPECT_EQ(digest("random"), uninterrupted_digest());
}

TEST_F(LaunchCli, KilledRankIsRestartedFromTheLastCheckpointAndFinishes) {
  CommandResult r = launch("--max-restarts 2 --hang-timeout-s 60 --grace-s 1", "kill", "fault.kill_rank=1 fault.kill_step=5");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r, "fault injection: rank 1")) << r.output;
  EXPECT_TRUE(has(r, "attempt 1 failed: the job was killed by signal 9 (SIGKILL)")) << r.output;
  EXPECT_TRUE(has(r, "restart 1 of 2 after the job was killed by signal 9")) << r.output;
  EXPECT_TRUE(has(r, "train.resume=true")) << r.output;
  EXPECT_TRUE(has(r, "resumed from")) << r.output;
  EXPECT_TRUE(has(r, "faults are configured but off on restart 1")) << r.output;
  EXPECT_TRUE(has(r, "training finished on attempt 2 (1 restart(s))")) << r.output;
  EXPECT_EQ(digest("kill"), uninterrupted_digest());
}

TEST_F(LaunchCli, StalledRankIsDiagnosedAsAHangAndRestarted) {
  CommandResult r = launch("--max-restarts 1 --hang-timeout-s 2 --grace-s 0.5", "stall",
                           "fault.stall_rank=1 fault.stall_step=5 fault.stall_s=0");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r, "fault injection: rank 1 stalls at step 5 forever")) << r.output;
  // The stalled rank is named outside any collective; rank 0 waits for it in the step's all-reduce.
  EXPECT_TRUE(has(r, "hang: no progress for")) << r.output;
  EXPECT_TRUE(has(r, "rank 1 (pid ")) << r.output;
  EXPECT_TRUE(has(r, "in forward_backward of step 5, not in a collective")) << r.output;
  EXPECT_TRUE(has(r, "rank 0 waiting for")) << r.output;
  EXPECT_TRUE(has(r, "in all_reduce on group '")) << r.output;  // the data-parallel group
  EXPECT_TRUE(has(r, "restart 1 of 1 after a hang")) << r.output;
  EXPECT_TRUE(has(r, "training finished on attempt 2")) << r.output;
  EXPECT_EQ(digest("stall"), uninterrupted_digest());
}

TEST_F(LaunchCli, CorruptCheckpointFallsBackToThePreviousOne) {
  // Rank 0 damages step 4's checkpoint right after saving it and dies at the start of step 5:
  // the restart finds `latest` (step 4) corrupt, warns naming the file and resumes from step 2.
  CommandResult r = launch("--max-restarts 1 --hang-timeout-s 60 --grace-s 1", "corrupt",
                           "fault.corrupt_step=4 fault.kill_rank=0 fault.kill_step=5");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r, "fault injection: corrupted checkpoint")) << r.output;
  EXPECT_TRUE(has(r, "step-00000004/rank-00000.bin' is corrupt")) << r.output;
  EXPECT_TRUE(has(r, "falling back to '" + (dir / "corrupt/checkpoints/step-00000002") + "'")) << r.output;
  EXPECT_TRUE(has(r, "resumed from " + (dir / "corrupt/checkpoints/step-00000002") + " at step 2")) << r.output;
  EXPECT_EQ(digest("corrupt"), uninterrupted_digest());
}

TEST_F(LaunchCli, UsedUpRestartsFailClearly) {
  CommandResult r = launch("--max-restarts 1 --hang-timeout-s 60 --grace-s 1", "repeat",
                           "fault.kill_rank=1 fault.kill_step=5 fault.repeat=true");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(has(r, "attempt 2 failed: the job was killed by signal 9 (SIGKILL)")) << r.output;
  EXPECT_TRUE(has(r, "giving up: 1 restart(s) used up (--max-restarts 1); training did not finish")) << r.output;
  // The checkpoints written before the failures are intact.
  EXPECT_EQ(run_loom("ckpt digest " + (dir / "repeat/checkpoints")).exit_code, 0);
}

TEST_F(LaunchCli, CleanRunsEarlyStopsAndBadCommands) {
  CommandResult ok = launch("", "clean", "");
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_TRUE(has(ok, "training finished on attempt 1 (0 restart(s))")) << ok.output;
  // A deliberate early stop is not a failure to restart from, nor a finished training.
  CommandResult early = launch("", "early", "train.exit_interval=3");
  EXPECT_EQ(early.exit_code, 3) << early.output;
  EXPECT_TRUE(has(early, "before its last step")) << early.output;
  CommandResult missing = run_loom("launch -- " + (dir / "no-such-program"));
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_TRUE(has(missing, "cannot execute")) << missing.output;
  EXPECT_NE(run_loom("launch --max-restarts 1").exit_code, 0);  // no command
}

// A rank killed right after its step began leaves that step behind in the last heartbeats (a
// writer that batched changes showed "setup" here: the job died before its first periodic write).
TEST_F(LaunchCli, LastHeartbeatsShowEachRanksLatestStep) {
  CommandResult r = launch("--max-restarts 0 --hang-timeout-s 60 --grace-s 1", "latest", "fault.kill_rank=1 fault.kill_step=5");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(has(r, "last heartbeats: rank 0 ")) << r.output;
  EXPECT_TRUE(has(r, "; rank 1 forward_backward of step 5\n")) << r.output;
  EXPECT_FALSE(has(r, "setup")) << r.output;
}

// A job that fails before its first step (here a layout that does not fit the world) would fail
// the same way again: it is not restarted, and launch exits with the job's status.
TEST_F(LaunchCli, FailureBeforeTheFirstStepIsNotRestarted) {
  CommandResult r = launch("--max-restarts 3 --restart-backoff-s 0", "layout", "runtime.ranks=3");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(has(r, "train.global_batch 4 must be a multiple of train.micro_batch 2 x data-parallel ranks 3"))
      << r.output;
  EXPECT_TRUE(has(r, "attempt 1 failed: the job exited with code 1")) << r.output;
  EXPECT_TRUE(has(r, "before any rank reached its first step")) << r.output;
  EXPECT_FALSE(has(r, "attempt 2")) << r.output;
  EXPECT_FALSE(has(r, "giving up")) << r.output;
}

// Restarts wait: 0.4 s before the first, 0.8 s before the second.
TEST_F(LaunchCli, RestartsBackOff) {
  const auto start = std::chrono::steady_clock::now();
  CommandResult r = launch("--max-restarts 2 --restart-backoff-s 0.4 --hang-timeout-s 60 --grace-s 1", "backoff",
                           "fault.kill_rank=1 fault.kill_step=3 fault.repeat=true");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(has(r, "restart 1 of 2 after the job was killed by signal 9 (SIGKILL); resuming from the latest good "
                     "checkpoint (train.resume=true) in 0.4 s")) << r.output;
  EXPECT_TRUE(has(r, "restart 2 of 2 after the job was killed by signal 9 (SIGKILL); resuming from the latest good "
                     "checkpoint (train.resume=true) in 0.8 s")) << r.output;
  EXPECT_TRUE(has(r, "giving up: 2 restart(s) used up")) << r.output;
  EXPECT_GE(seconds, 1.2) << r.output;
  EXPECT_NE(run_loom("launch --restart-backoff-s -1 -- true").exit_code, 0);
}

}  // namespace
}  // namespace loom::testing
