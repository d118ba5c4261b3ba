#include "loom/ckpt/checkpoint.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <xxhash.h>

#include <csignal>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "ckpt_test_util.h"
#include "loom/core/error.h"

namespace loom::ckpt {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::HostTensor;
using test::TempDir;

std::vector<HostTensor> model_tensors(unsigned seed) {
  return {
      HostTensor("model.embed_tokens.weight", {7, 5}, DType::F32, seed + 1),
      HostTensor("model.layers.0.self_attn.q_proj.weight", {5, 5}, DType::BF16, seed + 2),
      HostTensor("model.norm.weight", {5}, DType::F16, seed + 3),
      HostTensor("model.positions", {2, 3, 4}, DType::I64, seed + 4),
      HostTensor("model.scale", {}, DType::F32, seed + 5),            // a scalar
      HostTensor("model.empty", {0, 4}, DType::F32, seed + 6),        // no elements
      HostTensor("model.fp8.weight", {13}, DType::F8E4M3, seed + 7),  // odd byte count
      HostTensor("optim.exp_avg.model.norm.weight", {5}, DType::F32, seed + 8),
      HostTensor("optim.exp_avg_sq.model.norm.weight", {5}, DType::F32, seed + 9),
  };
}

json trainer_state(int64_t step) {
  return {{"step", step}, {"data_position", 1234 * step}, {"rng", {1, 2, 3}}, {"loss_scale", 65536.0}};
}

const char* kConfig = "model:\n  d_model: 5\n  layers: 1\ntrain:\n  steps: 100\n";

void save_step(const std::string& root, int64_t step, int keep = 0, unsigned seed = 0) {
  auto tensors = model_tensors(seed + static_cast<unsigned>(step));
  save_checkpoint(root, step, test::refs_of(tensors), trainer_state(step), kConfig, keep);
}

void expect_step_data(const LoadedCheckpoint& c, int64_t step, unsigned seed = 0) {
  for (const auto& t : model_tensors(seed + static_cast<unsigned>(step))) {
    ASSERT_TRUE(c.has(t.name)) << t.name;
    EXPECT_EQ(c.shape(t.name), t.shape) << t.name;
    EXPECT_EQ(c.dtype(t.name), t.dtype) << t.name;
    EXPECT_EQ(test::read_all(c, t.name), t.bytes) << t.name;
  }
}

std::vector<std::string> dir_names(const std::string& root) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(root)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(Checkpoint, RoundTripsDtypesShapesStateAndConfig) {
  TempDir dir;
  save_step(dir.str(), 10);
  for (const std::string& where : {dir.str(), dir / "step-00000010"}) {
    LoadedCheckpoint c = load_checkpoint(where);
    EXPECT_EQ(c.step(), 10);
    EXPECT_EQ(c.path(), dir / "step-00000010");
    EXPECT_EQ(c.state(), trainer_state(10));
    EXPECT_EQ(c.config_yaml(), kConfig);
    expect_step_data(c, 10);
    EXPECT_EQ(c.names().size(), 9u);
    std::vector<std::string> params = c.parameter_names();
    EXPECT_EQ(params.size(), 7u);
    for (const auto& p : params) EXPECT_FALSE(p.starts_with("optim.")) << p;
    EXPECT_TRUE(std::is_sorted(params.begin(), params.end()));
  }
  EXPECT_EQ(dir_names(dir.str()), (std::vector<std::string>{"latest", "step-00000010"}));
  EXPECT_EQ(dir_names(dir / "step-00000010"), (std::vector<std::string>{"manifest.json", "rank-00000.bin"}));
}

TEST(Checkpoint, ManifestListsShardsWithChecksums) {
  TempDir dir;
  auto tensors = model_tensors(0);
  save_checkpoint(dir.str(), 3, test::refs_of(tensors), trainer_state(3), kConfig, 0);
  json m = json::parse(read_file(dir / "step-00000003/manifest.json"));
  EXPECT_EQ(m["format"], "loom-checkpoint");
  EXPECT_EQ(m["version"], kFormatVersion);
  EXPECT_EQ(m["step"], 3);
  EXPECT_EQ(m["config_yaml"], kConfig);
  EXPECT_EQ(m["state"], trainer_state(3));
  ASSERT_EQ(m["files"].size(), 1u);
  EXPECT_EQ(m["files"][0]["name"], "rank-00000.bin");
  EXPECT_EQ(m["files"][0]["bytes"].get<uint64_t>(), fs::file_size(dir / "step-00000003/rank-00000.bin"));
  ASSERT_EQ(m["tensors"].size(), tensors.size());
  for (const auto& t : tensors) {
    auto it = std::find_if(m["tensors"].begin(), m["tensors"].end(), [&](const json& j) { return j["name"] == t.name; });
    ASSERT_NE(it, m["tensors"].end()) << t.name;
    EXPECT_EQ((*it)["dtype"], dtype_name(t.dtype));
    EXPECT_EQ((*it)["shape"].get<Shape>(), t.shape);
    ASSERT_EQ((*it)["shards"].size(), 1u);
    const json& s = (*it)["shards"][0];
    EXPECT_EQ(s["file"], "rank-00000.bin");
    EXPECT_EQ(s["offset"].get<uint64_t>() % 64, 0u);
    EXPECT_EQ(s["bytes"].get<uint64_t>(), t.bytes.size());
    json slice = json::array();
    for (int64_t d : t.shape) slice.push_back({0, d});
    EXPECT_EQ(s["slice"], slice);
    EXPECT_EQ(s["xxh3"], hex64(XXH3_64bits(t.bytes.data(), t.bytes.size()))) << t.name;
  }
}

TEST(Checkpoint, LatestPointsAtNewestSave) {
  TempDir dir;
  save_step(dir.str(), 1);
  EXPECT_EQ(test::latest_of(dir.str()), "step-00000001");
  save_step(dir.str(), 2);
  EXPECT_EQ(test::latest_of(dir.str()), "step-00000002");
  EXPECT_EQ(resolve_checkpoint(dir.str()), dir / "step-00000002");
  EXPECT_EQ(resolve_checkpoint(dir / "step-00000001"), dir / "step-00000001");
  EXPECT_EQ(load_checkpoint(dir.str()).step(), 2);
}

TEST(Checkpoint, RetentionKeepsNewestK) {
  TempDir dir;
  for (int64_t s = 1; s <= 5; ++s) save_step(dir.str(), s, /*keep=*/2);
  EXPECT_EQ(dir_names(dir.str()), (std::vector<std::string>{"latest", "step-00000004", "step-00000005"}));
  TempDir all;
  for (int64_t s = 1; s <= 3; ++s) save_step(all.str(), s, /*keep=*/0);
  EXPECT_EQ(list_checkpoints(all.str()).size(), 3u);
}

TEST(Checkpoint, RetentionDeletesLeftoversOfDeadSavesOnly) {
  TempDir dir;
  pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ::waitpid(child, nullptr, 0);  // now a pid with no process
  std::string dead = dir / (".tmp-step-00000009-" + std::to_string(child));
  std::string alive = dir / (".tmp-step-00000009-" + std::to_string(::getpid()));
  fs::create_directories(dead);
  fs::create_directories(alive);
  save_step(dir.str(), 1, 3);
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(fs::exists(alive));  // may belong to a save still running
}

TEST(Checkpoint, ResavingAStepReplacesIt) {
  TempDir dir;
  save_step(dir.str(), 4, 0, /*seed=*/100);
  save_step(dir.str(), 4, 0, /*seed=*/200);
  expect_step_data(load_checkpoint(dir.str()), 4, 200);
  EXPECT_EQ(dir_names(dir.str()), (std::vector<std::string>{"latest", "step-00000004"}));
}

TEST(Checkpoint, CorruptByteInNewestFallsBackToPrevious) {
  TempDir dir;
  save_step(dir.str(), 1);
  save_step(dir.str(), 2);
  std::string data = dir / "step-00000002/rank-00000.bin";
  test::flip_byte(data, 70);
  testing::internal::CaptureStderr();
  LoadedCheckpoint c = load_checkpoint(dir.str());
  std::string warning = testing::internal::GetCapturedStderr();
  EXPECT_EQ(c.step(), 1);
  expect_step_data(c, 1);
  EXPECT_NE(warning.find(data), std::string::npos) << warning;
  EXPECT_NE(warning.find("corrupt"), std::string::npos) << warning;
  EXPECT_NE(warning.find("step-00000001"), std::string::npos) << warning;
}

TEST(Checkpoint, TruncatedNewestFallsBackToPrevious) {
  TempDir dir;
  save_step(dir.str(), 1);
  save_step(dir.str(), 2);
  std::string data = dir / "step-00000002/rank-00000.bin";
  fs::resize_file(data, fs::file_size(data) / 2);
  testing::internal::CaptureStderr();
  LoadedCheckpoint c = load_checkpoint(dir.str());
  std::string warning = testing::internal::GetCapturedStderr();
  EXPECT_EQ(c.step(), 1);
  EXPECT_NE(warning.find(data), std::string::npos) << warning;
  EXPECT_NE(warning.find("truncated"), std::string::npos) << warning;
}

TEST(Checkpoint, CorruptManifestFallsBackToPrevious) {
  TempDir dir;
  save_step(dir.str(), 1);
  save_step(dir.str(), 2);
  std::string manifest = dir / "step-00000002/manifest.json";
  std::string text = read_file(manifest);
  size_t at = text.find("2468", text.find("\"data_position\""));
  ASSERT_NE(at, std::string::npos) << text;
  text.replace(at, 4, "2469");  // valid JSON, wrong content
  write_file_atomic(manifest, text);
  testing::internal::CaptureStderr();
  EXPECT_EQ(load_checkpoint(dir.str()).step(), 1);
  std::string warning = testing::internal::GetCapturedStderr();
  EXPECT_NE(warning.find(manifest), std::string::npos) << warning;
  EXPECT_NE(warning.find("checksum"), std::string::npos) << warning;
}

TEST(Checkpoint, MissingLatestTargetFallsBack) {
  TempDir dir;
  save_step(dir.str(), 1);
  save_step(dir.str(), 2);
  fs::remove_all(dir / "step-00000002");
  testing::internal::CaptureStderr();
  EXPECT_EQ(load_checkpoint(dir.str()).step(), 1);
  EXPECT_NE(testing::internal::GetCapturedStderr().find("step-00000002"), std::string::npos);
  // Without `latest`, the newest step directory is the first candidate.
  fs::remove(dir / "latest");
  save_step(dir.str(), 3);
  fs::remove(dir / "latest");
  EXPECT_EQ(load_checkpoint(dir.str()).step(), 3);
}

TEST(Checkpoint, CorruptOnlyCheckpointThrowsNamingTheFile) {
  TempDir dir;
  save_step(dir.str(), 7);
  std::string data = dir / "step-00000007/rank-00000.bin";
  test::flip_byte(data, 3);
  try {
    testing::internal::CaptureStderr();
    load_checkpoint(dir.str());
    testing::internal::GetCapturedStderr();
    FAIL() << "expected loom::Error";
  } catch (const Error& e) {
    testing::internal::GetCapturedStderr();
    EXPECT_NE(std::string(e.what()).find(data), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("no usable checkpoint"), std::string::npos) << e.what();
  }
  try {
    load_checkpoint(dir / "step-00000007");  // a specific directory: no fallback
    FAIL() << "expected loom::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(data), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_checkpoint(dir / "nowhere"), Error);
  TempDir empty;
  EXPECT_THROW(load_checkpoint(empty.str()), Error);
}

// A save aborted at each stage leaves the previous checkpoint and `latest` as they were.
TEST(Checkpoint, FailedSaveLeavesPreviousCheckpointIntact) {
  for (SaveStage fail_at : {SaveStage::DataWritten, SaveStage::ManifestWritten, SaveStage::Published}) {
    TempDir dir;
    save_step(dir.str(), 1);
    auto tensors = model_tensors(2);
    auto observer = [&](SaveStage stage, const std::string&) {
      if (stage == fail_at) throw Error("injected failure");
    };
    EXPECT_THROW(save_checkpoint(dir.str(), 2, test::refs_of(tensors), trainer_state(2), kConfig, 1, observer), Error);
    EXPECT_EQ(test::latest_of(dir.str()), "step-00000001");
    LoadedCheckpoint c = load_checkpoint(dir.str());
    EXPECT_EQ(c.step(), 1);
    expect_step_data(c, 1);
    for (const std::string& name : dir_names(dir.str())) {
      EXPECT_FALSE(name.starts_with(".tmp-")) << "leftover " << name;
      // Only a save that got as far as publishing may leave its (complete) directory behind.
      if (fail_at != SaveStage::Published) {
        EXPECT_NE(name, "step-00000002");
      }
    }
  }
}

// A write error from the OS (as when the disk fills up) aborts the save cleanly.
TEST(Checkpoint, WriteErrorLeavesPreviousCheckpointIntact) {
  TempDir dir;
  save_step(dir.str(), 1);
  HostTensor big("model.big", {64, 1024}, DType::F32, 9);
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);  // get EFBIG instead of a signal
  rlimit small = old;
  small.rlim_cur = 16 * 1024;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string message;
  try {
    save_checkpoint(dir.str(), 2, {big.ref()}, trainer_state(2), kConfig, 1);
  } catch (const Error& e) {
    message = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_NE(message.find("rank-00000.bin"), std::string::npos) << message;
  EXPECT_EQ(test::latest_of(dir.str()), "step-00000001");
  EXPECT_EQ(dir_names(dir.str()), (std::vector<std::string>{"latest", "step-00000001"}));
  expect_step_data(load_checkpoint(dir.str()), 1);
}

TEST(Checkpoint, ShapeMismatchNamesTensorAndBothShapes) {
  TempDir dir;
  save_step(dir.str(), 1);
  LoadedCheckpoint c = load_checkpoint(dir.str());
  std::vector<float> out(64);
  try {
    c.read("model.embed_tokens.weight", out.data(), DType::F32, {8, 5});
    FAIL() << "expected loom::Error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("model.embed_tokens.weight"), std::string::npos) << m;
    EXPECT_NE(m.find("[7, 5]"), std::string::npos) << m;
    EXPECT_NE(m.find("[8, 5]"), std::string::npos) << m;
    EXPECT_NE(m.find("incompatible model config"), std::string::npos) << m;
  }
  EXPECT_THROW(c.read("model.embed_tokens.weight", out.data(), DType::BF16, {7, 5}), Error);
  EXPECT_THROW(c.read("model.missing.weight", out.data(), DType::F32, {7, 5}), Error);
}

TEST(Checkpoint, ShardedTensorsReassembleAndReadAnySlice) {
  TempDir dir;
  HostTensor whole("model.w", {6, 10}, DType::F32, 5);
  const Shape shape = whole.shape;
  auto slice_bytes = [&](const Slice& s) {
    std::vector<std::byte> out(static_cast<size_t>(slice_numel(s)) * 4);
    copy_region(whole.bytes.data(), full_slice(shape), out.data(), s, s, 4);
    return out;
  };
  // Rows 0-1 as a tensor-parallel style block, the rest as a ZeRO style flat range.
  std::vector<Slice> slices = {{{0, 2}, {0, 10}}};
  for (const Slice& s : flat_range_slices(shape, 20, 40)) slices.push_back(s);
  std::vector<std::vector<std::byte>> pieces;
  for (const Slice& s : slices) pieces.push_back(slice_bytes(s));
  std::vector<TensorRef> refs;
  for (size_t i = 0; i < slices.size(); ++i) refs.push_back({"model.w", shape, DType::F32, pieces[i].data(), slices[i]});
  save_checkpoint(dir.str(), 1, refs, json::object(), "", 0);

  LoadedCheckpoint c = load_checkpoint(dir.str());
  EXPECT_EQ(c.manifest().tensors[0].shards.size(), slices.size());
  EXPECT_EQ(test::read_all(c, "model.w"), whole.bytes);
  Slice part = {{1, 4}, {3, 5}};  // crosses every stored shard boundary
  std::vector<std::byte> got(static_cast<size_t>(slice_numel(part)) * 4);
  c.read_slice("model.w", part, got.data(), DType::F32);
  EXPECT_EQ(got, slice_bytes(part));
}

TEST(Checkpoint, RejectsRefsThatDoNotTileTheTensor) {
  TempDir dir;
  HostTensor t("model.w", {4, 4}, DType::F32, 1);
  TensorRef half{"model.w", {4, 4}, DType::F32, t.bytes.data(), {{0, 2}, {0, 4}}};
  EXPECT_THROW(save_checkpoint(dir.str(), 1, {half}, json::object(), "", 0), Error);  // gap
  TensorRef overlap{"model.w", {4, 4}, DType::F32, t.bytes.data(), {{1, 3}, {0, 4}}};
  EXPECT_THROW(save_checkpoint(dir.str(), 1, {half, overlap}, json::object(), "", 0), Error);
  TensorRef outside{"model.w", {4, 4}, DType::F32, t.bytes.data(), {{3, 2}, {0, 4}}};
  EXPECT_THROW(save_checkpoint(dir.str(), 1, {outside}, json::object(), "", 0), Error);
  EXPECT_THROW(save_checkpoint(dir.str(), 1, {t.ref(), t.ref()}, json::object(), "", 0), Error);
  TensorRef bad_name{"model. w", {4, 4}, DType::F32, t.bytes.data(), {}};
  EXPECT_THROW(save_checkpoint(dir.str(), 1, {bad_name}, json::object(), "", 0), Error);
  EXPECT_THROW(save_checkpoint(dir.str(), 1, {t.ref()}, json::array(), "", 0), Error);
  EXPECT_TRUE(list_checkpoints(dir.str()).empty());
}

TEST(Checkpoint, SnapshotCopiesTensorsAtSnapshotTime) {
  TempDir dir;
  auto tensors = model_tensors(1);
  CheckpointSnapshot snap = snapshot_checkpoint(1, test::refs_of(tensors), trainer_state(1), kConfig);
  for (auto& t : tensors) std::fill(t.bytes.begin(), t.bytes.end(), std::byte{0});  // training moves on
  CheckpointSnapshot moved = std::move(snap);
  write_snapshot(dir.str(), moved, 0);
  expect_step_data(load_checkpoint(dir.str()), 1);
}

TEST(Checkpoint, DataFileIndependentOfTensorOrder) {
  TempDir a, b;
  auto tensors = model_tensors(3);
  auto refs = test::refs_of(tensors);
  save_checkpoint(a.str(), 1, refs, trainer_state(1), kConfig, 0);
  std::reverse(refs.begin(), refs.end());
  save_checkpoint(b.str(), 1, refs, trainer_state(1), kConfig, 0);
  EXPECT_EQ(read_file(a / "step-00000001/rank-00000.bin"), read_file(b / "step-00000001/rank-00000.bin"));
  EXPECT_EQ(read_file(a / "step-00000001/manifest.json"), read_file(b / "step-00000001/manifest.json"));
}

}  // namespace
}  // namespace loom::ckpt
