// Whole-model checks: finite-difference gradients (GPT-2 style and heterogeneous Llama style),
// recompute equivalence, KV-cache decoding, initialisation identity and memorisation, and the paged
// step's block-table checks.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "../gradient_check.h"
#include "small_configs.h"
#include "loom/core/error.h"
#include "loom/core/philox.h"
#include "loom/kernels/cpu/adamw.h"
#include "loom/kernels/cpu/cross_entropy.h"
#include "loom/model/transformer.h"

namespace loom::model {
namespace {

config::ModelConfig gpt2_style() { return testing::small_gpt2(); }

config::ModelConfig heterogeneous_llama() {
  config::ModelConfig c;
  c.vocab_size = 19;
  c.d_model = 16;
  c.layers = 4;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn_size = 24;
  c.norm = config::Norm::Rms;
  c.activation = config::Activation::Swiglu;
  c.positions = config::Positions::Rope;
  c.tied_embeddings = false;
  c.max_seq_len = 8;
  c.init_std = 0.3;
  using Attention = config::BlockAttention;
  c.block_configs = {{Attention::Normal, 0, -1}, {Attention::Skip, 0, 12}, {Attention::Normal, 1, 32}, {Attention::Normal, 4, 0}};
  return c;
}

struct Batch {
  std::vector<int32_t> inputs, targets;
};

Batch make_batch(int vocab, int64_t batch, int64_t seq, uint64_t seed) {
  Batch b;
  uint64_t key = philox_key(seed, "batch");
  for (int64_t i = 0; i < batch * seq; ++i) {
    b.inputs.push_back(static_cast<int32_t>(philox4x32(key, i)[0] % vocab));
    b.targets.push_back(static_cast<int32_t>(philox4x32(key, i)[1] % vocab));
  }
  b.targets[1] = kernels::cpu::kIgnoreIndex;  // masked position
  return b;
}

void check_model_gradients(const config::ModelConfig& config) {
  Transformer model(config);
  model.initialize(7);
  const int64_t batch = 2, seq = 6;
  Batch data = make_batch(config.vocab_size, batch, seq, 3);
  model.params().zero_grads();
  model.forward_backward(data.inputs.data(), data.targets.data(), batch, seq, 1.0f);
  std::vector<float> analytic(model.params().grads(), model.params().grads() + model.params().total());
  auto loss = [&] { return model.forward_loss(data.inputs.data(), data.targets.data(), batch, seq); };
  for (const Parameter& p : model.params().list()) {
    loom::testing::expect_gradient_matches(p.name, model.params().values() + p.offset, p.numel,
                                           analytic.data() + p.offset, loss, {.eps = 1e-2, .atol = 2e-3, .rtol = 2e-2, .max_checks = 12});
  }
}

TEST(TransformerGradients, Gpt2StyleMatchesFiniteDifferences) { check_model_gradients(gpt2_style()); }

TEST(TransformerGradients, HeterogeneousLlamaMatchesFiniteDifferences) {
  check_model_gradients(heterogeneous_llama());
}

TEST(Transformer, HeterogeneousLayersHaveTheirOwnShapes) {
  Transformer model(heterogeneous_llama());
  const ParameterStore& p = model.params();
  EXPECT_LT(p.find("model.layers.1.self_attn.q_proj.weight"), 0);  // attention skipped
  EXPECT_EQ(p.list()[p.find("model.layers.1.mlp.up_proj.weight")].shape, (Shape{12, 16}));
  EXPECT_EQ(p.list()[p.find("model.layers.2.self_attn.k_proj.weight")].shape, (Shape{4, 16}));  // 1 kv head
  EXPECT_LT(p.find("model.layers.3.mlp.up_proj.weight"), 0);  // MLP skipped
  EXPECT_GE(p.find("lm_head.weight"), 0);
}

TEST(Transformer, BadBlockConfigNamesTheLayer) {
  config::ModelConfig c = heterogeneous_llama();
  c.block_configs[2].kv_heads = 3;
  try {
    Transformer model(c);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer 2"), std::string::npos) << e.what();
  }
}

TEST(Transformer, RecomputeGivesIdenticalGradients) {
  config::ModelConfig c = heterogeneous_llama();
  Transformer plain(c);
  c.recompute = true;
  Transformer recompute(c);
  plain.initialize(5);
  recompute.initialize(5);
  Batch data = make_batch(c.vocab_size, 3, 7, 11);
  plain.params().zero_grads();
  recompute.params().zero_grads();
  double a = plain.forward_backward(data.inputs.data(), data.targets.data(), 3, 7, 0.1f);
  double b = recompute.forward_backward(data.inputs.data(), data.targets.data(), 3, 7, 0.1f);
  EXPECT_EQ(a, b);
  for (int64_t i = 0; i < plain.params().total(); ++i) ASSERT_EQ(plain.params().grads()[i], recompute.params().grads()[i]) << i;
  EXPECT_LT(recompute.activation_bytes(), plain.activation_bytes());
}

TEST(Transformer, InitialValuesDependOnlyOnSeedNameAndIndex) {
  config::ModelConfig small = gpt2_style(), deeper = gpt2_style();
  deeper.layers = 3;
  Transformer a(small), b(deeper);
  a.initialize(9);
  b.initialize(9);
  for (const char* name : {"model.embed_tokens.weight", "model.layers.1.mlp.up_proj.weight"}) {
    const Parameter& pa = a.params().list()[a.params().find(name)];
    const Parameter& pb = b.params().list()[b.params().find(name)];
    for (int64_t i = 0; i < pa.numel; ++i) ASSERT_EQ(a.params().values()[pa.offset + i], b.params().values()[pb.offset + i]);
  }
}

void check_decode_matches_full_forward(const config::ModelConfig& config) {
  Transformer model(config);
  model.initialize(3);
  const int64_t seq = 7;
  Batch data = make_batch(config.vocab_size, 1, seq, 5);
  DecodeState state;
  // Prompt of 3 tokens at once, then one token at a time.
  std::vector<std::vector<float>> decoded;
  const float* logits = model.decode(state, data.inputs.data(), 3);
  decoded.emplace_back(logits, logits + config.vocab_size);
  for (int64_t t = 3; t < seq; ++t) {
    logits = model.decode(state, data.inputs.data() + t, 1);
    decoded.emplace_back(logits, logits + config.vocab_size);
  }
  // Reference: losses of the full forward with each target tells log-softmax; compare via CE.
  for (int64_t t = 2; t < seq; ++t) {
    std::vector<int32_t> targets(seq, kernels::cpu::kIgnoreIndex);
    for (int32_t v = 0; v < 3; ++v) {
      targets[t] = v;
      double full = model.forward_loss(data.inputs.data(), targets.data(), 1, seq);
      std::vector<float> row = decoded[t - 2];
      float loss;
      kernels::cpu::softmax_cross_entropy(row.data(), &loss, &v, 1, config.vocab_size, 0.0f);
      EXPECT_NEAR(full, loss, 1e-4) << "position " << t;
    }
  }
}

TEST(Transformer, KvCacheDecodingMatchesFullForwardRope) { check_decode_matches_full_forward(heterogeneous_llama()); }
TEST(Transformer, KvCacheDecodingMatchesFullForwardLearned) { check_decode_matches_full_forward(gpt2_style()); }

TEST(Transformer, MemorisesOneBatch) {
  config::ModelConfig c;
  c.vocab_size = 32;
  c.d_model = 32;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn_size = 64;
  c.max_seq_len = 16;
  Transformer model(c);
  model.initialize(1);
  Batch data = make_batch(c.vocab_size, 4, 16, 2);
  const float scale = 1.0f / static_cast<float>(4 * 16 - 1);
  std::vector<float> m(model.params().total()), v(model.params().total());
  double first = 0, last = 0;
  for (int step = 1; step <= 300; ++step) {
    model.params().zero_grads();
    last = model.forward_backward(data.inputs.data(), data.targets.data(), 4, 16, scale) * scale;
    if (step == 1) first = last;
    kernels::cpu::adamw_update(model.params().values(), model.params().grads(), m.data(), v.data(),
                               model.params().total(), {3e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, step});
  }
  EXPECT_GT(first, 3.0);
  EXPECT_LT(last, 0.05) << "loss went from " << first << " to " << last;
}

// A paged step's block tables are checked on the host before any kernel reads through them
// (Transformer::forward_paged): a row naming a table entry that is not there, a position past its
// table's width, or a block id outside the cache is an Error naming it, where the kernels would
// read outside the pools (on a GPU an illegal address, which ends the CUDA context).
// One row at position 5 (its keys in blocks 0 and 1 of 4 tokens each), one table entry 2 wide.
PagedBatch one_row(std::vector<int32_t> table, int32_t entry = 0) {
  PagedBatch b;
  b.tokens = {3};
  b.positions = {5};
  b.sequences = {entry};
  b.block_tables = std::move(table);
  b.table_width = 2;
  b.logit_rows = {0};
  return b;
}

std::string error_of(Transformer& model, const PagedBatch& batch, PagedKVCache& cache) {
  PagedScratch scratch;
  try {
    model.forward_paged(batch, cache, scratch);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(PagedBatchChecks, BadTableEntriesAndBlockIdsAreErrorsNamingThem) {
  Transformer model(heterogeneous_llama());
  PagedKVCache cache = model.make_paged_cache(4, 4);
  EXPECT_EQ(error_of(model, one_row({2, 3}), cache), "");  // inside: runs
  EXPECT_NE(error_of(model, one_row({2, 9}), cache).find("names block 9 of a cache of 4"), std::string::npos);
  EXPECT_NE(error_of(model, one_row({-1, 3}), cache).find("names block -1"), std::string::npos);
  EXPECT_NE(error_of(model, one_row({2, 3}, 1), cache).find("row 0 names table entry 1 of 1"), std::string::npos);
  PagedBatch narrow = one_row({2});
  narrow.table_width = 1;
  EXPECT_NE(error_of(model, narrow, cache).find("needs block 1 of a table 1 wide"), std::string::npos);
}

// Prompt entries (PagedBatch::prompt_entries) name table entries, their rows come after every
// decoding row (the tiles of kernels::paged_prompt_attention follow the decoding rows) and a chunk's
// positions are consecutive: otherwise an Error naming the entry or the row.
TEST(PagedBatchChecks, PromptEntriesOutsideTheTablesOrBeforeADecodingRowAreErrors) {
  Transformer model(heterogeneous_llama());
  PagedKVCache cache = model.make_paged_cache(4, 4);
  PagedBatch batch;
  batch.tokens = {3, 4, 5};
  batch.positions = {5, 0, 1};
  batch.sequences = {0, 1, 1};
  batch.block_tables = {2, 3, 0, 0};
  batch.table_width = 2;
  batch.logit_rows = {0, 2};
  batch.prompt_entries = {1};  // one decoding row, then a prompt chunk of two
  EXPECT_EQ(error_of(model, batch, cache), "");
  batch.prompt_entries = {2};
  EXPECT_NE(error_of(model, batch, cache).find("prompt entry 2 of 2 table entries"), std::string::npos);
  batch.prompt_entries = {0};  // the prompt row first, then decoding rows
  EXPECT_NE(error_of(model, batch, cache).find("row 1 decodes after the prompt rows that start at row 0"),
            std::string::npos);
  batch.prompt_entries = {1};
  batch.positions = {5, 0, 2};  // a gap inside the prompt chunk
  EXPECT_NE(error_of(model, batch, cache).find("prompt row 2 at position 2 follows position 0 of its sequence"),
            std::string::npos);
}

}  // namespace
}  // namespace loom::model
