// Heartbeats (format, files, the writer), the supervisor's hang and dead-rank rules as pure
// functions, and fault injection's pieces that do not kill the test process.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "loom/ckpt/checkpoint.h"
#include "loom/comm/activity.h"
#include "loom/core/atomic_file.h"
#include "loom/core/error.h"
#include "loom/ops/fault_injection.h"
#include "loom/ops/heartbeat.h"
#include "loom/ops/heartbeat_writer.h"

namespace loom::ops {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "loom-supervision-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDir() { fs::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

HeartbeatRecord record(int rank, int world_size, int64_t step, const std::string& phase, double progress_time) {
  HeartbeatRecord r;
  r.rank = rank;
  r.world_size = world_size;
  r.pid = 1000 + rank;
  r.host = "node1";
  r.step = step;
  r.phase = phase;
  r.time = progress_time;
  r.progress_time = progress_time;
  return r;
}

HeartbeatRecord waiting(HeartbeatRecord r, const std::string& op, const std::string& group, int64_t seq, double since) {
  r.collective = HeartbeatCollective{op, group, seq, since};
  r.progress_time = since;
  return r;
}

TEST(Heartbeat, SerializesAndParsesBack) {
  HeartbeatRecord r = waiting(record(3, 4, 57, "forward_backward", 100.5), "all_reduce", "dp-0", 230, 101.25);
  r.attempt = 2;
  r.time = 102.0;
  r.finished = false;
  const std::optional<HeartbeatRecord> back = parse_heartbeat(serialize_heartbeat(r));
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->rank, 3);
  EXPECT_EQ(back->world_size, 4);
  EXPECT_EQ(back->pid, 1003);
  EXPECT_EQ(back->host, "node1");
  EXPECT_EQ(back->attempt, 2);
  EXPECT_EQ(back->step, 57);
  EXPECT_EQ(back->phase, "forward_backward");
  EXPECT_DOUBLE_EQ(back->time, 102.0);
  EXPECT_DOUBLE_EQ(back->progress_time, 101.25);
  ASSERT_TRUE(back->collective.has_value());
  EXPECT_EQ(back->collective->op, "all_reduce");
  EXPECT_EQ(back->collective->group, "dp-0");
  EXPECT_EQ(back->collective->seq, 230);
  EXPECT_DOUBLE_EQ(back->collective->since, 101.25);
  EXPECT_FALSE(back->finished);

  HeartbeatRecord done = record(0, 1, 8, "done", 5.0);
  done.finished = true;
  const std::optional<HeartbeatRecord> done_back = parse_heartbeat(serialize_heartbeat(done));
  ASSERT_TRUE(done_back.has_value());
  EXPECT_TRUE(done_back->finished);
  EXPECT_FALSE(done_back->collective.has_value());

  // Torn, foreign or inconsistent files are not heartbeats.
  EXPECT_FALSE(parse_heartbeat("").has_value());
  EXPECT_FALSE(parse_heartbeat("{\"rank\": 1").has_value());
  EXPECT_FALSE(parse_heartbeat("{\"rank\": 1}").has_value());
  EXPECT_FALSE(parse_heartbeat(serialize_heartbeat(record(4, 4, 1, "setup", 1.0))).has_value());  // rank >= world
}

TEST(Heartbeat, FilesRoundTripPerAttemptAndClear) {
  TempDir dir;
  HeartbeatRecord a = record(1, 2, 5, "optimizer", 10.0);
  HeartbeatRecord b = record(0, 2, 5, "checkpoint", 11.0);
  HeartbeatRecord old = record(0, 2, 9, "forward_backward", 3.0);
  old.attempt = 0;
  a.attempt = b.attempt = 1;
  write_heartbeat(dir.path(), old);
  write_heartbeat(dir.path(), a);
  EXPECT_TRUE(fs::exists(fs::path(dir.path()) / "rank-00001.json"));
  EXPECT_EQ(heartbeat_file_name(1), "rank-00001.json");
  // rank 0's file now holds attempt 0's record: attempt 1 sees only rank 1.
  std::vector<HeartbeatRecord> got = read_heartbeats(dir.path(), 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].rank, 1);
  write_heartbeat(dir.path(), b);  // replaces rank 0's file
  {
    std::ofstream junk(fs::path(dir.path()) / "rank-00007.json");
    junk << "{not json";
  }
  got = read_heartbeats(dir.path(), 1);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].rank, 0);
  EXPECT_EQ(got[0].phase, "checkpoint");
  EXPECT_EQ(got[1].rank, 1);
  EXPECT_TRUE(read_heartbeats(dir.path(), 0).empty());
  clear_heartbeats(dir.path());
  EXPECT_TRUE(fs::is_empty(dir.path()));
  EXPECT_TRUE(read_heartbeats(dir.path() + "/missing", 0).empty());
}

TEST(HangDetection, HealthyJobsAndStartupAreNotHangs) {
  const double t0 = 1000.0;
  std::vector<HeartbeatRecord> healthy = {record(0, 2, 5, "forward_backward", t0 + 8.0),
                                          waiting(record(1, 2, 5, "forward_backward", 0), "all_reduce", "world", 9,
                                                  t0 + 9.0)};
  EXPECT_FALSE(diagnose_hang(healthy, t0 + 10.0, t0, 5.0).has_value());
  // Nobody has reported yet, but the timeout since the start has not passed.
  EXPECT_FALSE(diagnose_hang({}, t0 + 4.0, t0, 5.0).has_value());
  // Disabled.
  EXPECT_FALSE(diagnose_hang({record(0, 1, 1, "forward_backward", t0)}, t0 + 1e6, t0, 0.0).has_value());
  // A finished rank never hangs, however old its record.
  HeartbeatRecord done = record(0, 1, 8, "done", t0);
  done.finished = true;
  EXPECT_FALSE(diagnose_hang({done}, t0 + 100.0, t0, 5.0).has_value());
}

TEST(HangDetection, NamesTheStuckRankAndTheCollectiveTheOthersWaitIn) {
  const double t0 = 1000.0;
  std::vector<HeartbeatRecord> records = {
      waiting(record(0, 4, 57, "forward_backward", 0), "all_reduce", "dp-0", 230, t0 + 1.0),
      waiting(record(1, 4, 57, "forward_backward", 0), "all_reduce", "dp-0", 230, t0 + 1.5),
      record(2, 4, 57, "forward_backward", t0),
      waiting(record(3, 4, 57, "forward_backward", 0), "all_reduce", "dp-0", 230, t0 + 1.2)};
  records[2].pid = 1234;
  const std::optional<std::string> d = diagnose_hang(records, t0 + 31.0, t0 - 10.0, 30.0);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(*d,
            "no progress for 31.0 s (hang timeout 30 s): rank 2 (pid 1234 on node1) stuck for 31.0 s in "
            "forward_backward of step 57, not in a collective; ranks 0,1,3 waiting for 30.0 s in all_reduce on "
            "group 'dp-0' #230 (step 57)");

  // Every rank waits, in different collectives: each group is listed.
  std::vector<HeartbeatRecord> mismatch = {
      waiting(record(0, 2, 3, "optimizer", 0), "all_gather", "world", 12, t0),
      waiting(record(1, 2, 3, "optimizer", 0), "reduce_scatter", "world", 12, t0)};
  const std::optional<std::string> m = diagnose_hang(mismatch, t0 + 6.0, t0 - 100.0, 5.0);
  ASSERT_TRUE(m.has_value());
  EXPECT_NE(m->find("rank 0 waiting for 6.0 s in all_gather on group 'world' #12"), std::string::npos) << *m;
  EXPECT_NE(m->find("rank 1 waiting for 6.0 s in reduce_scatter on group 'world' #12"), std::string::npos) << *m;
}

TEST(HangDetection, RanksThatNeverReportAreAHangAfterTheTimeout) {
  const double t0 = 1000.0;
  std::vector<HeartbeatRecord> partial = {record(0, 3, 0, "setup", t0 + 9.0), record(2, 3, 0, "setup", t0 + 9.0)};
  EXPECT_FALSE(diagnose_hang(partial, t0 + 4.0, t0, 5.0).has_value());
  const std::optional<std::string> d = diagnose_hang(partial, t0 + 9.5, t0, 5.0);
  ASSERT_TRUE(d.has_value());
  EXPECT_NE(d->find("rank 1 never wrote a heartbeat"), std::string::npos) << *d;
  const std::optional<std::string> none = diagnose_hang({}, t0 + 6.0, t0, 5.0);
  ASSERT_TRUE(none.has_value());
  EXPECT_NE(none->find("no rank wrote a heartbeat"), std::string::npos) << *none;
  EXPECT_NE(none->find("LOOM_HEARTBEAT_DIR"), std::string::npos) << *none;
}

TEST(DeadRanks, OnlyLocalUnfinishedRanksWhoseProcessIsGone) {
  std::vector<HeartbeatRecord> records = {record(0, 4, 5, "optimizer", 1.0), record(1, 4, 5, "optimizer", 1.0),
                                          record(2, 4, 5, "optimizer", 1.0), record(3, 4, 8, "done", 1.0)};
  records[2].host = "node2";  // another host: its pid means nothing here
  records[3].finished = true;
  auto alive = [](int64_t pid) { return pid == 1000; };
  const std::optional<std::string> d = diagnose_dead_ranks(records, "node1", alive);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(*d, "rank 1 (pid 1001 on node1) died in optimizer of step 5");
  EXPECT_FALSE(diagnose_dead_ranks(records, "node1", [](int64_t) { return true; }).has_value());
}

TEST(HeartbeatWriter, WritesPhaseCollectiveAndCompletion) {
  TempDir dir;
  ::setenv(kHeartbeatDirEnv, dir.path().c_str(), 1);
  ::setenv(kRestartCountEnv, "2", 1);
  {
    Heartbeat heartbeat(1, 2);
    ASSERT_TRUE(heartbeat.active());
    std::vector<HeartbeatRecord> got = read_heartbeats(dir.path(), 2);
    ASSERT_EQ(got.size(), 1u);  // registration writes at once
    EXPECT_EQ(got[0].phase, "setup");
    EXPECT_EQ(got[0].pid, ::getpid());
    heartbeat.phase("forward_backward", 3);
    {
      comm::activity::Scope scope(1, "all_reduce", "world", 17);
      std::this_thread::sleep_for(std::chrono::milliseconds(1200));  // the background thread writes
      got = read_heartbeats(dir.path(), 2);
      ASSERT_EQ(got.size(), 1u);
      EXPECT_EQ(got[0].step, 3);
      EXPECT_EQ(got[0].phase, "forward_backward");
      ASSERT_TRUE(got[0].collective.has_value());
      EXPECT_EQ(got[0].collective->op, "all_reduce");
      EXPECT_EQ(got[0].collective->group, "world");
      EXPECT_EQ(got[0].collective->seq, 17);
      EXPECT_GE(got[0].time, got[0].progress_time);
    }
    heartbeat.done(true, 3);
    got = read_heartbeats(dir.path(), 2);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].phase, "done");
    EXPECT_TRUE(got[0].finished);
    EXPECT_FALSE(got[0].collective.has_value());
  }
  ::unsetenv(kHeartbeatDirEnv);
  ::unsetenv(kRestartCountEnv);
  Heartbeat off(0, 1);
  EXPECT_FALSE(off.active());
}

// Each change of step or phase is in the file when phase() returns, however soon after the last
// write: a rank killed right after it leaves its latest step behind.
TEST(HeartbeatWriter, EveryChangeIsWrittenAtOnce) {
  TempDir dir;
  ::setenv(kHeartbeatDirEnv, dir.path().c_str(), 1);
  ::setenv(kRestartCountEnv, "0", 1);
  {
    Heartbeat heartbeat(0, 1);
    for (int64_t step = 1; step <= 5; ++step) {
      for (const char* phase : {"forward_backward", "optimizer"}) {
        heartbeat.phase(phase, step);
        const std::vector<HeartbeatRecord> got = read_heartbeats(dir.path(), 0);
        ASSERT_EQ(got.size(), 1u);
        EXPECT_EQ(got[0].step, step);
        EXPECT_EQ(got[0].phase, phase);
      }
    }
  }
  ::unsetenv(kHeartbeatDirEnv);
  ::unsetenv(kRestartCountEnv);
}

TEST(FaultInjection, FiresOnlyOnTheFirstAttemptUnlessRepeated) {
  config::FaultConfig config;
  EXPECT_FALSE(FaultInjector(config, 0, 2).armed());
  config.kill_rank = 1;
  config.kill_step = 5;
  ::unsetenv(kRestartCountEnv);
  EXPECT_TRUE(FaultInjector(config, 0, 2).armed());
  ::setenv(kRestartCountEnv, "0", 1);
  EXPECT_TRUE(FaultInjector(config, 0, 2).armed());
  ::setenv(kRestartCountEnv, "1", 1);
  EXPECT_FALSE(FaultInjector(config, 0, 2).armed());
  config.repeat = true;
  EXPECT_TRUE(FaultInjector(config, 0, 2).armed());
  ::unsetenv(kRestartCountEnv);
  // Steps other than kill_step, and other ranks, are not touched (this process survives).
  FaultInjector(config, 0, 2).at_step_start(5);
  FaultInjector(config, 1, 2).at_step_start(4);
  // A rank outside the world is an error naming the key.
  config.kill_rank = 2;
  try {
    FaultInjector(config, 0, 2);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fault.kill_rank is 2"), std::string::npos) << e.what();
  }
  config::FaultConfig stall;
  stall.stall_rank = 0;
  stall.stall_step = 2;
  stall.stall_s = 0.2;
  const auto start = std::chrono::steady_clock::now();
  FaultInjector(stall, 0, 1).at_step_start(2);
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(200));
}

TEST(FaultInjection, CorruptedShardMakesLoadingFallBack) {
  TempDir dir;
  const std::string root = dir.path() + "/ckpt";
  std::vector<float> weights(64, 0.5f);
  for (int step : {2, 4}) {
    weights[0] = static_cast<float>(step);
    ckpt::save_checkpoint(root, step, {{"model.w", {8, 8}, DType::F32, weights.data(), {}}}, nlohmann::json::object(),
                          "", 3);
  }
  config::FaultConfig config;
  config.corrupt_step = 4;
  FaultInjector faults(config, 0, 1);
  bool waited = false;
  faults.after_checkpoint(2, root, [&] { waited = true; });
  EXPECT_FALSE(waited);  // not the corrupt step
  faults.after_checkpoint(4, root, [&] { waited = true; });
  EXPECT_TRUE(waited);
  EXPECT_THROW(ckpt::open_checkpoint_dir(root + "/step-00000004"), Error);
  EXPECT_EQ(ckpt::load_checkpoint(root).step(), 2);
}

}  // namespace
}  // namespace loom::ops
