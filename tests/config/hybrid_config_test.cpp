// model.layer_pattern and model.mamba: parsed, written back, and every invalid combination an
// error naming the key (and the layer).
#include <gtest/gtest.h>

#include "loom/config/run_config.h"
#include "loom/core/error.h"

namespace loom::config {
namespace {

std::string error_of(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  try {
    parse_config(yaml, "hybrid.yaml", overrides);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a loom::Error";
  return "";
}

#define EXPECT_HAS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << "message: " << (text)

const std::string kHybrid =
    "model: {d_model: 32, layers: 4, heads: 4, layer_pattern: 'M*M-',\n"
    "        mamba: {state_size: 8, heads: 4, head_dim: 8, groups: 2, chunk_size: 16}}\n";

TEST(HybridConfig, ParsesAndRoundTrips) {
  const RunConfig c = parse_config(kHybrid, "hybrid.yaml", {});
  EXPECT_EQ(c.model.layer_pattern, "M*M-");
  EXPECT_EQ(c.model.mamba.state_size, 8);
  EXPECT_EQ(c.model.mamba.groups, 2);
  EXPECT_EQ(c.model.mamba.conv_kernel, 4);  // default
  const RunConfig again = parse_config(to_yaml(c), "again.yaml", {});
  EXPECT_EQ(again.model.layer_pattern, "M*M-");
  EXPECT_EQ(again.model.mamba.chunk_size, 16);
  const RunConfig overridden = parse_config(kHybrid, "hybrid.yaml", {"model.mamba={state_size: 4, heads: 2}"});
  EXPECT_EQ(overridden.model.mamba.state_size, 4);
}

TEST(HybridConfig, InvalidPatternsAndSizesNameTheKey) {
  EXPECT_HAS(error_of(kHybrid, {"model.layer_pattern=M*M"}), "model.layer_pattern");
  EXPECT_HAS(error_of(kHybrid, {"model.layer_pattern=M*M"}), "model.layers = 4");
  const std::string bad_char = error_of(kHybrid, {"model.layer_pattern=M*Mx"});
  EXPECT_HAS(bad_char, "layer 3");
  EXPECT_HAS(bad_char, "valid characters");
  EXPECT_HAS(error_of(kHybrid, {"model.layer_pattern=M*ME"}), "model.moe_experts");
  EXPECT_HAS(error_of(kHybrid, {"model.mamba={heads: 4, groups: 3}"}), "model.mamba.groups");
  EXPECT_HAS(error_of(kHybrid, {"model.mamba={head_dim: 0}"}), "model.mamba.head_dim");
  EXPECT_HAS(error_of(kHybrid, {"model.mamba={stat_size: 4}"}), "keys of model.mamba");
  // Context parallelism splits each tensor-parallel rank's Mamba heads and groups (2 groups here).
  EXPECT_EQ(parse_config(kHybrid, "hybrid.yaml", {"parallel.cp=2", "runtime.ranks=2"}).parallel.cp, 2);
  EXPECT_HAS(error_of(kHybrid, {"parallel.cp=4", "runtime.ranks=4"}),
             "parallel.cp = 4 splits the Mamba-2 heads and groups of each tensor-parallel rank over the "
             "context-parallel ranks, but a rank (parallel.tp = 1) holds 4 / 1 heads in model.mamba.groups = 2 / 1 "
             "groups: both must be multiples of parallel.cp");
  EXPECT_HAS(error_of(kHybrid, {"parallel.cp=2", "parallel.tp=2", "runtime.ranks=4"}), "model.mamba.groups = 2 / 2");
  EXPECT_HAS(error_of(kHybrid, {"model.mtp_depths=-1"}), "model.mtp_depths");
  EXPECT_HAS(error_of(kHybrid, {"model.mtp_loss_weight=-0.5"}), "model.mtp_loss_weight");
}

// Nemotron-H's latent MoE (squared-ReLU experts) and multi-token prediction are accepted, MTP
// with context parallelism too.
TEST(HybridConfig, SquaredReluExpertsAndMultiTokenPrediction) {
  const RunConfig c = parse_config(kHybrid, "hybrid.yaml",
                                   {"model.layer_pattern=M*ME", "model.activation=relu2", "model.moe_experts=4",
                                    "model.moe_latent_size=16", "model.mtp_depths=2"});
  EXPECT_EQ(c.model.mtp_depths, 2);
  EXPECT_DOUBLE_EQ(c.model.mtp_loss_weight, 0.3);
  EXPECT_EQ(parse_config(to_yaml(c), "again.yaml", {}).model.mtp_depths, 2);
  const std::string dense = "model: {d_model: 32, layers: 2, heads: 4, mtp_depths: 1}\n";
  EXPECT_EQ(parse_config(dense, "dense.yaml", {"parallel.cp=2", "runtime.ranks=2"}).parallel.cp, 2);
}

}  // namespace
}  // namespace loom::config
