// The refit over the communication layer (rl/refit_communication.h) on the threads backend: two
// learner ranks holding tensor-parallel halves (rows of one tensor, columns of another, a ZeRO-style
// flat range split into rectangles, a whole tensor on one rank) send them in small buckets to two
// workers, which reassemble every tensor bit for bit; shards that do not cover a tensor are an
// error naming it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "loom/ckpt/digest.h"
#include "loom/ckpt/slice.h"
#include "loom/comm/launch.h"
#include "loom/rl/refit_communication.h"

namespace loom::rl {
namespace {

struct Full {
  std::string name;
  Shape shape;
  std::vector<float> values;
};

std::vector<Full> full_tensors() {
  std::vector<Full> out = {{"layers.0.attn.wq", {6, 4}, {}}, {"layers.0.attn.wo", {4, 6}, {}}, {"embed", {5, 3}, {}},
                           {"final_norm", {7}, {}}};
  float v = 0.25f;
  for (Full& t : out) {
    t.values.resize(static_cast<size_t>(shape_numel(t.shape)));
    for (float& x : t.values) x = (v += 1.37f);
  }
  return out;
}

// The elements of `slice` of a full row-major tensor.
std::vector<float> cut(const Full& t, const ckpt::Slice& slice) {
  std::vector<float> out(static_cast<size_t>(ckpt::slice_numel(slice)));
  ckpt::copy_region(t.values.data(), ckpt::full_slice(t.shape), out.data(), slice, slice, sizeof(float));
  return out;
}

// Learner rank r's shards: wq's rows, wo's columns halved; embed's flat range [0, 8) or [8, 15);
// final_norm whole on rank 0. `gap`: rank 1 leaves its half of wq out.
std::vector<std::pair<ckpt::TensorRef, std::vector<float>>> shards_of(int rank, const std::vector<Full>& full, bool gap) {
  std::vector<std::pair<ckpt::TensorRef, std::vector<float>>> out;
  auto add = [&](const Full& t, const ckpt::Slice& s) { out.push_back({{t.name, t.shape, DType::F32, nullptr, s}, cut(t, s)}); };
  if (!(gap && rank == 1)) add(full[0], {{rank * 3, 3}, {0, 4}});
  add(full[1], {{0, 4}, {rank * 3, 3}});
  for (const ckpt::Slice& s : ckpt::flat_range_slices(full[2].shape, rank == 0 ? 0 : 8, rank == 0 ? 8 : 7)) add(full[2], s);
  if (rank == 0) add(full[3], ckpt::full_slice(full[3].shape));
  for (auto& [ref, data] : out) ref.data = data.data();
  return out;
}

void run(bool gap, std::vector<std::string>* errors, std::vector<ReceivedParameters>* received) {
  const std::vector<Full> full = full_tensors();
  comm::LaunchOptions options;
  options.backend = "threads";
  options.ranks = 4;  // learner ranks 0, 1; workers 2, 3
  options.comm.timeout = std::chrono::seconds(30);
  std::mutex mutex;
  comm::launch(options, [&](comm::Communicator& group) {
    try {
      if (group.rank() < 2) {
        auto shards = shards_of(group.rank(), full, gap);
        std::vector<ckpt::TensorRef> refs;
        for (auto& s : shards) refs.push_back(s.first);
        send_parameters(group, 2, refs, "step-4", 20);  // 20-byte buckets: many messages per stream
      } else {
        ReceivedParameters r = receive_parameters(group, 2, 20);
        std::lock_guard<std::mutex> lock(mutex);
        received->push_back(std::move(r));
      }
    } catch (const Error& e) {
      std::lock_guard<std::mutex> lock(mutex);
      errors->push_back(e.what());
    }
  });
}

TEST(RefitCommunication, WorkersReassembleEveryTensorBitForBit) {
  std::vector<std::string> errors;
  std::vector<ReceivedParameters> received;
  run(false, &errors, &received);
  ASSERT_TRUE(errors.empty()) << errors.front();
  ASSERT_EQ(received.size(), 2u);
  const std::vector<Full> full = full_tensors();
  std::vector<ckpt::TensorRef> whole;
  for (const Full& t : full) whole.push_back({t.name, t.shape, DType::F32, t.values.data(), ckpt::full_slice(t.shape)});
  for (const ReceivedParameters& r : received) {
    EXPECT_EQ(r.version, "step-4");
    ASSERT_EQ(r.names.size(), full.size());
    for (const Full& t : full) {
      const size_t i = static_cast<size_t>(std::find(r.names.begin(), r.names.end(), t.name) - r.names.begin());
      ASSERT_LT(i, r.names.size()) << t.name;
      EXPECT_EQ(r.shapes[i], t.shape);
      ASSERT_EQ(r.data[i].size(), t.values.size() * sizeof(float));
      EXPECT_EQ(std::memcmp(r.data[i].data(), t.values.data(), r.data[i].size()), 0) << t.name;
    }
    EXPECT_EQ(ckpt::parameter_digest(r.refs()), ckpt::parameter_digest(whole));
  }
}

TEST(RefitCommunication, ATensorTheShardsDoNotCoverIsAnError) {
  std::vector<std::string> errors;
  std::vector<ReceivedParameters> received;
  run(true, &errors, &received);
  EXPECT_TRUE(received.empty());
  ASSERT_EQ(errors.size(), 2u);  // each worker
  for (const std::string& e : errors)
    EXPECT_NE(e.find("the learner ranks' shards of 'layers.0.attn.wq' cover 12 of its 24 elements"), std::string::npos) << e;
}

}  // namespace
}  // namespace loom::rl
