// The Mamba-2 mixer as a module: decoding step by step with its caches equals the full forward, so
// does a prompt prefilled in chunks, and packed documents are independent (a packed row equals
// each document run on its own).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "../gradient_check.h"
#include "loom/model/mamba2_mixer.h"

namespace loom::model {
namespace {

config::ModelConfig tiny_config() {
  config::ModelConfig c;
  c.d_model = 8;
  c.mamba = {.state_size = 4, .heads = 4, .head_dim = 3, .groups = 2, .conv_kernel = 4, .chunk_size = 3, .expand = 2};
  return c;
}

struct Fixture {
  config::ModelConfig config = tiny_config();
  ParameterStore store;
  TensorParallel tp;
  Mamba2Mixer mixer{store, tp, 0, "model.layers.0.mixer", config, 0.3f, 0.3f};
  ParallelScratch scratch;
  Workspace work;
  Fixture() {
    store.allocate();
    store.initialize(5);
  }
  // residual + mixer(normed) over [batch, seq].
  std::vector<float> forward(const std::vector<float>& normed, int64_t batch, int64_t seq, const Packing& packing,
                             Mamba2Mixer::Saved& saved) {
    std::vector<float> out(normed.size(), 0.0f);
    mixer.forward(saved, out.data(), normed.data(), batch, seq, packing, scratch);
    return out;
  }
};

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double rel = 1e-5) {
  double scale = 0.0;
  for (float v : want) scale = std::max(scale, std::fabs(static_cast<double>(v)));
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], rel * scale) << i;
}

// A prompt prefilled in chunks (each continuing the caches' state and window in one run: the
// chunked scan and convolution from them) and decoded token by token: the full forward, whatever
// the cuts.
TEST(Mamba2Mixer, DecodingAndPrefillInChunksWithCachesEqualTheFullForward) {
  Fixture f;
  const int64_t seq = 14, d = f.config.d_model;
  const auto normed = loom::testing::random_vector(seq * d, 2);
  Mamba2Mixer::Saved saved, scratch;
  const std::vector<float> full = f.forward(normed, 1, seq, {}, saved);
  std::vector<int64_t> prompt_then_tokens(11, 1);
  prompt_then_tokens[0] = 4;
  const std::vector<std::vector<int64_t>> all_cuts = {prompt_then_tokens, {5, 2, 4, 1, 2}, {2, 3, 7, 2}, {1, 13}};
  for (const std::vector<int64_t>& cuts : all_cuts) {
    std::vector<float> decoded(seq * d, 0.0f);
    MambaCache cache;
    int64_t t = 0;
    for (int64_t rows : cuts) {
      f.mixer.decode(decoded.data() + t * d, normed.data() + t * d, rows, cache, scratch, f.scratch);
      t += rows;
    }
    SCOPED_TRACE(cuts.size());
    ASSERT_EQ(t, seq);
    expect_close(decoded, full);
  }
}

TEST(Mamba2Mixer, PackedDocumentsAreIndependent) {
  Fixture f;
  const int64_t seq = 10, split = 6, d = f.config.d_model;
  const auto normed = loom::testing::random_vector(seq * d, 2);
  const auto dy = loom::testing::random_vector(seq * d, 3);
  std::vector<int32_t> docs(seq, 0);
  std::fill(docs.begin() + split, docs.end(), 1);
  Mamba2Mixer::Saved packed_saved, a_saved, b_saved;
  const std::vector<float> packed = f.forward(normed, 1, seq, {nullptr, docs.data()}, packed_saved);
  const std::vector<float> first(normed.begin(), normed.begin() + split * d), second(normed.begin() + split * d, normed.end());
  std::vector<float> separate = f.forward(first, 1, split, {}, a_saved);
  const std::vector<float> b = f.forward(second, 1, seq - split, {}, b_saved);
  separate.insert(separate.end(), b.begin(), b.end());
  expect_close(packed, separate);
  // Input gradients: the packed row's equal each document's own.
  std::vector<float> d_packed(seq * d, 0.0f), d_separate(seq * d, 0.0f);
  f.mixer.backward(d_packed.data(), dy.data(), normed.data(), packed_saved, f.work, 1, seq, {nullptr, docs.data()},
                   f.scratch);
  f.mixer.backward(d_separate.data(), dy.data(), first.data(), a_saved, f.work, 1, split, {}, f.scratch);
  f.mixer.backward(d_separate.data() + split * d, dy.data() + split * d, second.data(), b_saved, f.work, 1,
                   seq - split, {}, f.scratch);
  expect_close(d_packed, d_separate);
  // Without the document ids the second document sees the first (the check can fail).
  Mamba2Mixer::Saved plain_saved;
  const std::vector<float> plain = f.forward(normed, 1, seq, {}, plain_saved);
  EXPECT_NE(plain, packed);
}

}  // namespace
}  // namespace loom::model
