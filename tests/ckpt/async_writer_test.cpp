#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "loom/ckpt/async_writer.h"
#include "loom/ckpt/digest.h"

namespace loom::ckpt {
namespace {

TEST(AsyncCheckpointWriter, WritesTheSnapshotTakenAtSaveTime) {
  std::string root = (std::filesystem::temp_directory_path() / "loom-async-writer-test").string();
  std::filesystem::remove_all(root);
  std::vector<float> weights(100000, 1.0f);
  {
    AsyncCheckpointWriter writer;
    writer.save(root, snapshot_checkpoint(1, {{"w", {100000}, DType::F32, weights.data(), {}}}, {{"step", 1}}, ""), 3);
    weights.assign(weights.size(), 2.0f);  // training moves on while the save is in flight
    writer.save(root, snapshot_checkpoint(2, {{"w", {100000}, DType::F32, weights.data(), {}}}, {{"step", 2}}, ""), 3);
    writer.wait();
    EXPECT_FALSE(writer.busy());
  }
  LoadedCheckpoint first = load_checkpoint(root + "/step-00000001");
  std::vector<float> read(100000);
  first.read("w", read.data(), DType::F32, {100000});
  EXPECT_EQ(read[123], 1.0f);
  EXPECT_EQ(load_checkpoint(root).step(), 2);
  std::filesystem::remove_all(root);
}

TEST(AsyncCheckpointWriter, ReportsABackgroundFailureOnWait) {
  AsyncCheckpointWriter writer;
  std::vector<float> w(4, 0.0f);
  // A root under a regular file cannot be created.
  std::string blocker = (std::filesystem::temp_directory_path() / "loom-async-blocker").string();
  { std::ofstream(blocker) << "x"; }
  writer.save(blocker + "/root", snapshot_checkpoint(1, {{"w", {4}, DType::F32, w.data(), {}}}, {}, ""), 1);
  EXPECT_THROW(writer.wait(), Error);
  std::filesystem::remove(blocker);
}

}  // namespace
}  // namespace loom::ckpt
