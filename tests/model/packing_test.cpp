// Packed documents: a row holding several documents (positions restarting at 0, no attention
// across a boundary) computes exactly what the same documents give one per row, each padded
// with untrained targets: the same loss sum and the same parameter gradients. For RoPE and
// learned positions, with recompute and with tensor + sequence parallelism.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <vector>

#include "loom/comm/launch.h"
#include "loom/core/error.h"
#include "loom/core/philox.h"
#include "loom/kernels/types.h"
#include "loom/model/transformer.h"
#include "support/emulated_cuda.h"

namespace loom::model {
namespace {

config::ModelConfig llama_style() {
  config::ModelConfig c;
  c.vocab_size = 29;
  c.d_model = 16;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn_size = 24;
  c.norm = config::Norm::Rms;
  c.activation = config::Activation::Swiglu;
  c.positions = config::Positions::Rope;
  c.max_seq_len = 80;
  c.init_std = 0.3;
  return c;
}

config::ModelConfig gpt2_style() {
  config::ModelConfig c = llama_style();
  c.kv_heads = 4;
  c.norm = config::Norm::Layer;
  c.activation = config::Activation::Gelu;
  c.positions = config::Positions::Learned;
  c.tied_embeddings = true;
  c.bias = true;
  return c;
}

// The documents, packed into rows of `seq` tokens (one row per entry of `rows`, each a list of
// document indices) or one per row.
struct Layout {
  int64_t batch = 0, seq = 0;
  std::vector<int32_t> inputs, targets, positions, documents;
  Packing packing() const { return {positions.data(), documents.data()}; }
};

struct Documents {
  std::vector<std::vector<int32_t>> tokens, targets;
};

Documents make_documents(const std::vector<int>& lengths, int vocab) {
  Documents d;
  const uint64_t key = philox_key(7, "documents");
  uint32_t n = 0;
  for (int length : lengths) {
    d.tokens.emplace_back();
    d.targets.emplace_back();
    for (int t = 0; t < length; ++t, ++n) {
      d.tokens.back().push_back(static_cast<int32_t>(philox4x32(key, n)[0] % vocab));
      d.targets.back().push_back(static_cast<int32_t>(philox4x32(key, n)[1] % vocab));
    }
  }
  return d;
}

Layout pack_rows(const Documents& d, const std::vector<std::vector<int>>& rows, int64_t seq) {
  Layout l;
  l.batch = static_cast<int64_t>(rows.size());
  l.seq = seq;
  for (const std::vector<int>& row : rows) {
    int64_t used = 0;
    for (size_t i = 0; i < row.size(); ++i) {
      const std::vector<int32_t>& tokens = d.tokens[row[i]];
      for (size_t t = 0; t < tokens.size(); ++t) {
        l.inputs.push_back(tokens[t]);
        l.targets.push_back(d.targets[row[i]][t]);
        l.positions.push_back(static_cast<int32_t>(t));
        l.documents.push_back(static_cast<int32_t>(i));
      }
      used += static_cast<int64_t>(tokens.size());
    }
    for (; used < seq; ++used) {  // padding: its own document, never trained
      l.inputs.push_back(0);
      l.targets.push_back(kernels::kIgnoreIndex);
      l.positions.push_back(static_cast<int32_t>(used));
      l.documents.push_back(static_cast<int32_t>(row.size()));
    }
  }
  return l;
}

struct Result {
  double loss = 0.0;
  std::vector<float> grads;
};

Result run(Transformer& model, const Layout& l, bool packed) {
  std::fill(model.params().grads(), model.params().grads() + model.params().total(), 0.0f);
  Result r;
  r.loss = model.forward_backward(l.inputs.data(), l.targets.data(), l.batch, l.seq, 1.0f,
                                  packed ? l.packing() : Packing{});
  r.grads.assign(model.params().grads(), model.params().grads() + model.params().total());
  return r;
}

void expect_same(const Result& a, const Result& b) {
  EXPECT_NEAR(a.loss, b.loss, 1e-5 * std::fabs(b.loss));
  float scale = 0.0f;
  for (float g : b.grads) scale = std::max(scale, std::fabs(g));
  int failures = 0;
  for (size_t i = 0; i < a.grads.size() && failures < 5; ++i) {
    if (std::fabs(a.grads[i] - b.grads[i]) > 1e-5f * scale) {
      ++failures;
      ADD_FAILURE() << "gradient " << i << ": " << a.grads[i] << " packed vs " << b.grads[i] << " one per row";
    }
  }
}

// Lengths 1, primes, one longer than an attention block (64); three rows of 80.
const std::vector<int> kLengths = {1, 7, 13, 66, 5, 3, 31, 29, 11};
const std::vector<std::vector<int>> kPacked = {{0, 1, 2, 8}, {3, 4, 5}, {6, 7}};

void check_packed_equals_one_per_row(const config::ModelConfig& config) {
  Transformer model(config);
  model.initialize(3);
  const Documents docs = make_documents(kLengths, config.vocab_size);
  std::vector<std::vector<int>> single;
  for (size_t i = 0; i < kLengths.size(); ++i) single.push_back({static_cast<int>(i)});
  const Layout packed = pack_rows(docs, kPacked, 80), rows = pack_rows(docs, single, 80);
  const Result reference = run(model, rows, false);
  expect_same(run(model, packed, true), reference);
  // The same packed rows without their documents mix documents: a different function.
  const Result mixed = run(model, packed, false);
  EXPECT_GT(std::fabs(mixed.loss - reference.loss), 1e-3 * std::fabs(reference.loss));
}

TEST(Packing, PackedRowsEqualOneDocumentPerRowRope) { check_packed_equals_one_per_row(llama_style()); }
TEST(Packing, PackedRowsEqualOneDocumentPerRowLearnedPositions) { check_packed_equals_one_per_row(gpt2_style()); }

TEST(Packing, RecomputeKeepsThePacking) {
  config::ModelConfig config = llama_style();
  config.recompute = true;
  check_packed_equals_one_per_row(config);
}

TEST(Packing, PositionsRestartPerDocument) {
  // Learned positions: positions along the row differ from positions restarted per document.
  // (RoPE scores depend only on offsets, so within isolated documents a shift changes nothing.)
  Transformer model(gpt2_style());
  model.initialize(3);
  const Documents docs = make_documents(kLengths, 29);
  Layout packed = pack_rows(docs, kPacked, 80);
  const double restarted = run(model, packed, true).loss;
  for (int64_t r = 0; r < packed.batch; ++r) {
    for (int64_t t = 0; t < packed.seq; ++t) packed.positions[r * packed.seq + t] = static_cast<int32_t>(t);
  }
  EXPECT_GT(std::fabs(run(model, packed, true).loss - restarted), 1e-4 * std::fabs(restarted));
}

TEST(Packing, PositionBeyondMaxSeqLenIsAnError) {
  Transformer model(llama_style());
  model.initialize(3);
  Layout l = pack_rows(make_documents({80}, 29), {{0}}, 80);
  l.positions[5] = 80;
  EXPECT_THROW(run(model, l, true), loom::Error);
}

TEST(Packing, TensorAndSequenceParallelRanksCarryThePacking) {
  const config::ModelConfig config = llama_style();
  const Documents docs = make_documents(kLengths, config.vocab_size);
  const Layout packed = pack_rows(docs, kPacked, 80);
  Transformer one(config);
  one.initialize(3);
  const Result reference = run(one, packed, true);
  // Two tensor-parallel ranks with sequence parallelism: the same loss on both.
  std::vector<double> losses(2);
  comm::LaunchOptions options;
  options.backend = "threads";
  options.ranks = 2;
  options.comm.timeout = std::chrono::seconds(30);
  comm::launch(options, [&](comm::Communicator& world) {
    Transformer model(config, TensorParallel(&world, true));
    model.initialize(3);
    losses[world.rank()] = run(model, packed, true).loss;
  });
  for (double loss : losses) EXPECT_NEAR(loss, reference.loss, 1e-5 * std::fabs(reference.loss));
}

// On the emulated CUDA device (tests/support/emulated_cuda.h: the CPU kernels behind pointers the
// host cannot read), packed rows compute exactly the CPU's loss and gradients: positions and
// document ids reach the kernels as device arrays.
Result run_on_device(Transformer& model, const Layout& l) {
  model.params().zero_grads();
  Result r;
  r.loss = model.forward_backward(l.inputs.data(), l.targets.data(), l.batch, l.seq, 1.0f, l.packing());
  r.grads.resize(static_cast<size_t>(model.params().total()));
  copy_to_host(model.params().device(), r.grads.data(), model.params().grads(), model.params().total());
  return r;
}

void check_packed_on_device(const config::ModelConfig& config) {
  ::loom::testing::install_emulated_cuda();
  const Layout packed = pack_rows(make_documents(kLengths, config.vocab_size), kPacked, 80);
  Transformer cpu(config), gpu(config, {}, {}, {}, {}, Device::cuda(0));
  cpu.initialize(3);
  gpu.initialize(3);
  const Result want = run(cpu, packed, true), got = run_on_device(gpu, packed);
  EXPECT_EQ(got.loss, want.loss);
  EXPECT_EQ(got.grads, want.grads);
}

TEST(Packing, PackedRowsOnTheDeviceEqualTheCpuBitForBit) {
  check_packed_on_device(llama_style());
  check_packed_on_device(gpt2_style());
  config::ModelConfig recompute = llama_style();
  recompute.recompute = true;
  check_packed_on_device(recompute);
}

}  // namespace
}  // namespace loom::model
