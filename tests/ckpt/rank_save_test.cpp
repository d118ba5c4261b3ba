// Checkpoints saved by several ranks together: each writes only its shards, rank 0 merges the
// parts into one manifest and publishes; a rank that never writes, or parts that leave a tensor
// uncovered, publish nothing and leave earlier checkpoints alone.
#include <gtest/gtest.h>

#include <thread>

#include "ckpt_test_util.h"
#include "loom/ckpt/checkpoint.h"
#include "loom/core/error.h"

namespace loom::ckpt {
namespace {

using test::TempDir;

constexpr int kRanks = 3;

// A [6, 4] weight split by rows over the ranks (2 rows each) and a [5] norm held by rank 1.
struct RankData {
  std::vector<float> weight_rows, norm;
};
RankData data_of(int rank) {
  RankData d;
  for (int i = 0; i < 8; ++i) d.weight_rows.push_back(static_cast<float>(rank * 8 + i));
  if (rank == 1) d.norm = {0.5f, 1.5f, 2.5f, 3.5f, 4.5f};
  return d;
}

std::vector<TensorRef> refs_of(int rank, const RankData& d) {
  std::vector<TensorRef> refs = {{"model.layers.0.mlp.up_proj.weight", {6, 4}, DType::F32, d.weight_rows.data(),
                                  {{2 * rank, 2}, {0, 4}}}};
  if (rank == 1) refs.push_back({"model.norm.weight", {5}, DType::F32, d.norm.data(), {}});
  return refs;
}

void save_by_ranks(const std::string& root, int64_t step, const std::vector<int>& writers, int timeout_ms = 60000) {
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(kRanks);
  for (int r : writers) {
    threads.emplace_back([&, r] {
      try {
        const RankData d = data_of(r);
        const nlohmann::json state = r == 0 ? nlohmann::json{{"step", step}} : nlohmann::json::object();
        CheckpointSnapshot snapshot = snapshot_checkpoint(step, refs_of(r, d), state, "", ManifestScope::RankPart);
        write_snapshot(root, snapshot, 0, SaveRank{r, kRanks, 4242, std::chrono::milliseconds(timeout_ms)});
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

TEST(RankSave, EveryRankWritesItsShardsAndRankZeroPublishesOneManifest) {
  TempDir dir;
  save_by_ranks(dir.str(), 5, {0, 1, 2});
  LoadedCheckpoint c = load_checkpoint(dir.str());
  EXPECT_EQ(c.step(), 5);
  EXPECT_EQ(c.state().at("step"), 5);
  ASSERT_EQ(c.manifest().files.size(), 3u);
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(c.manifest().files[r].name, rank_file_name(r));
    EXPECT_EQ(c.manifest().files[r].rank, r);
  }
  std::vector<float> weight(24), norm(5);
  c.read("model.layers.0.mlp.up_proj.weight", weight.data(), DType::F32, {6, 4});
  for (int i = 0; i < 24; ++i) EXPECT_EQ(weight[i], static_cast<float>(i));
  c.read("model.norm.weight", norm.data(), DType::F32, {5});
  EXPECT_EQ(norm, data_of(1).norm);
  // Only the checkpoint and `latest` remain: no parts, no temporary directory.
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir.str())) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest", "step-00000005"}));
  for (const auto& e : std::filesystem::directory_iterator(c.path())) {
    EXPECT_EQ(e.path().extension(), e.path().filename() == "manifest.json" ? ".json" : ".bin") << e.path();
  }
}

TEST(RankSave, ARankThatNeverWritesPublishesNothing) {
  TempDir dir;
  save_by_ranks(dir.str(), 1, {0, 1, 2});
  try {
    save_by_ranks(dir.str(), 2, {0, 2}, 300);
    FAIL() << "published without rank 1";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 of 3 did not write its shards"), std::string::npos) << e.what();
  }
  EXPECT_EQ(load_checkpoint(dir.str()).step(), 1);  // the earlier checkpoint is intact and still latest
  EXPECT_FALSE(std::filesystem::exists(dir / "step-00000002"));
}

TEST(RankSave, PartsThatLeaveATensorUncoveredAreRejected) {
  TempDir dir;
  std::vector<std::thread> threads;
  std::string error;
  std::vector<float> rows(8, 1.0f);
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      // Two ranks each write rows [2r, 2r + 2) of a 6-row tensor: rows 4-5 are missing.
      std::vector<TensorRef> refs = {{"model.layers.0.mlp.up_proj.weight", {6, 4}, DType::F32, rows.data(),
                                      {{2 * r, 2}, {0, 4}}}};
      try {
        write_snapshot(dir.str(), snapshot_checkpoint(3, refs, {}, "", ManifestScope::RankPart), 0,
                       SaveRank{r, 2, 7, std::chrono::milliseconds(60000)});
      } catch (const Error& e) {
        error = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_NE(error.find("model.layers.0.mlp.up_proj.weight"), std::string::npos) << error;
  EXPECT_NE(error.find("cover 16 of 24"), std::string::npos) << error;
  EXPECT_FALSE(std::filesystem::exists(dir / "step-00000003"));
}

}  // namespace
}  // namespace loom::ckpt
