#include <gtest/gtest.h>

#include <set>
#include <string>

#include "loom/model/transformer.h"

namespace loom::model {
namespace {

struct Recorder : ParameterHooks {
  std::vector<std::string> calls;
  void record(char what, int unit) {
    std::string call(1, what);
    call.append(std::to_string(unit));
    calls.push_back(call);
  }
  void before_forward(int u) override { record('F', u); }
  void after_forward(int u) override { record('f', u); }
  void before_backward(int u) override { record('B', u); }
  void after_backward(int u) override { record('b', u); }
};

TEST(ParameterHooks, UnitsAreVisitedInOrderAndCoverEveryParameter) {
  config::ModelConfig c;
  c.vocab_size = 11;
  c.d_model = 8;
  c.layers = 2;
  c.heads = 2;
  c.ffn_size = 8;
  c.max_seq_len = 4;
  Transformer model(c);
  model.initialize(1);
  Recorder recorder;
  model.set_hooks(&recorder);
  std::vector<int32_t> tokens = {1, 2, 3, 4}, targets = {2, 3, 4, 5};
  model.forward_backward(tokens.data(), targets.data(), 1, 4, 0.25f);
  std::vector<std::string> expect = {"F0", "f0", "F1", "f1", "F2", "f2", "F3", "f3",
                                     "B3", "b3", "B2", "b2", "B1", "b1", "B0", "b0"};
  EXPECT_EQ(recorder.calls, expect);

  std::set<int> covered;
  for (int u = 0; u < model.units(); ++u) covered.insert(model.unit_parameters(u).begin(), model.unit_parameters(u).end());
  EXPECT_EQ(covered.size(), model.params().list().size());
  // Tied embeddings: the head unit reads the embedding, whose gradient completes in unit 0.
  const int embed = model.params().find("model.embed_tokens.weight");
  const auto& head = model.unit_parameters(3);
  EXPECT_NE(std::find(head.begin(), head.end(), embed), head.end());
  EXPECT_EQ(model.gradient_ready_unit()[embed], 0);
  EXPECT_EQ(model.gradient_ready_unit()[model.params().find("model.norm.weight")], 3);
  EXPECT_EQ(model.gradient_ready_unit()[model.params().find("model.layers.1.mlp.down_proj.weight")], 2);
}

}  // namespace
}  // namespace loom::model
