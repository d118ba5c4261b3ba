// The parameter list comes from the modules' own registration on a shapes-only store: the same
// list as a built model's, and nothing allocated for it, however large the config.
#include <gtest/gtest.h>

#include "loom/core/device.h"
#include "loom/model/parameter_shapes.h"
#include "loom/model/transformer.h"

namespace loom::model {
namespace {

TEST(ParameterList, LargeModelAllocatesNothing) {
  config::ModelConfig m;  // Llama-3-70B-sized
  m.vocab_size = 128256;
  m.d_model = 8192;
  m.layers = 80;
  m.heads = 64;
  m.kv_heads = 8;
  m.ffn_size = 28672;
  m.max_seq_len = 131072;
  m.tied_embeddings = false;
  const Allocator& host = allocator(Device::cpu());
  const int64_t in_use = host.bytes_in_use(), peak = host.peak_bytes();
  const std::vector<Parameter> list = Transformer::parameter_list(m);
  const std::vector<ParameterShape> shapes = model_parameter_shapes(m);
  EXPECT_EQ(host.bytes_in_use(), in_use);
  EXPECT_EQ(host.peak_bytes(), peak);
  ASSERT_EQ(list.size(), shapes.size());
  int64_t total = 0;
  for (const Parameter& p : list) total += p.numel;
  EXPECT_GT(total, 70'000'000'000);
  EXPECT_EQ(list.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(list.back().name, "lm_head.weight");
  EXPECT_FALSE(list.back().shape.empty());
}

TEST(ParameterList, SameAsTheBuiltModel) {
  config::ModelConfig m;
  m.vocab_size = 97;
  m.d_model = 32;
  m.layers = 2;
  m.heads = 4;
  m.kv_heads = 2;
  m.ffn_size = 64;
  m.max_seq_len = 16;
  Transformer model(m);
  const std::vector<Parameter> list = Transformer::parameter_list(m);
  ASSERT_EQ(list.size(), model.params().list().size());
  for (size_t i = 0; i < list.size(); ++i) {
    const Parameter& a = list[i];
    const Parameter& b = model.params().list()[i];
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.shape, b.shape);
    EXPECT_EQ(a.offset, b.offset);
    EXPECT_EQ(a.weight_decay, b.weight_decay);
  }
}

}  // namespace
}  // namespace loom::model
