#include "loom/ckpt/manifest.h"

#include <gtest/gtest.h>

#include "loom/ckpt/checkpoint_root.h"
#include "loom/ckpt/tensor_names.h"
#include "loom/core/error.h"

namespace loom::ckpt {
namespace {

Manifest sample() {
  Manifest m;
  m.step = 42;
  m.files = {{"rank-00000.bin", 0, 144}};
  m.tensors = {{"model.a", {4, 4}, DType::F32, {{"rank-00000.bin", 0, 32, {{0, 2}, {0, 4}}, 0x1234},
                                                 {"rank-00000.bin", 64, 16, {{2, 2}, {0, 2}}, 0x5678},
                                                 {"rank-00000.bin", 128, 16, {{2, 2}, {2, 2}}, 0x9abc}}}};
  m.state = {{"step", 42}, {"loss_scale", 1024.5}};
  m.config_yaml = "model:\n  d_model: 4\n";
  return m;
}

std::string message_of(const std::string& text) {
  try {
    parse_manifest(text, "dir/manifest.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Manifest, SerializesAndParsesBack) {
  std::string text = serialize_manifest(sample());
  Manifest m = parse_manifest(text, "dir/manifest.json");
  EXPECT_EQ(m.step, 42);
  EXPECT_EQ(m.state, sample().state);
  EXPECT_EQ(m.config_yaml, sample().config_yaml);
  ASSERT_EQ(m.tensors.size(), 1u);
  ASSERT_EQ(m.tensors[0].shards.size(), 3u);
  EXPECT_EQ(m.tensors[0].shards[2].slice, (Slice{{2, 2}, {2, 2}}));
  EXPECT_EQ(m.tensors[0].shards[2].xxh3, 0x9abcu);
  EXPECT_EQ(serialize_manifest(m), text);
}

TEST(Manifest, RejectsBrokenOrInconsistentManifests) {
  EXPECT_NE(message_of("{not json").find("dir/manifest.json"), std::string::npos);
  Manifest gap = sample();
  gap.tensors[0].shards.pop_back();
  EXPECT_NE(message_of(serialize_manifest(gap)).find("cover 12 of 16"), std::string::npos);
  Manifest beyond = sample();
  beyond.files[0].bytes = 100;
  EXPECT_NE(message_of(serialize_manifest(beyond)).find("beyond the end"), std::string::npos);
  Manifest newer = sample();
  newer.version = kFormatVersion + 1;
  EXPECT_NE(message_of(serialize_manifest(newer)).find("newer loom"), std::string::npos);
  Manifest wrong_bytes = sample();
  wrong_bytes.tensors[0].shards[0].bytes = 30;
  EXPECT_NE(message_of(serialize_manifest(wrong_bytes)).find("needs 32"), std::string::npos);
  Manifest overlap = sample();
  overlap.tensors[0].shards[2].slice = {{1, 2}, {2, 2}};
  EXPECT_NE(message_of(serialize_manifest(overlap)).find("overlap"), std::string::npos);
}

TEST(TensorNames, ParametersAndOptimizerStateAreToldApart) {
  EXPECT_EQ(optimizer_state_name("exp_avg", "model.norm.weight"), "optim.exp_avg.model.norm.weight");
  EXPECT_TRUE(is_model_parameter("model.layers.0.self_attn.q_proj.weight"));
  EXPECT_TRUE(is_model_parameter("lm_head.weight"));
  EXPECT_FALSE(is_model_parameter("optim.exp_avg_sq.lm_head.weight"));
  EXPECT_EQ(tensor_kind("optim.master.lm_head.weight"), TensorKind::OptimizerState);
  EXPECT_THROW(check_tensor_name(""), Error);
  EXPECT_THROW(optimizer_state_name("a.b", "x"), Error);
}

TEST(CheckpointRoot, StepDirectoryNames) {
  EXPECT_EQ(step_dir_name(60), "step-00000060");
  EXPECT_EQ(step_dir_name(123456789), "step-123456789");
  EXPECT_EQ(parse_step_dir_name("step-00000060"), 60);
  EXPECT_EQ(parse_step_dir_name("step-123456789"), 123456789);
  EXPECT_FALSE(parse_step_dir_name("step-60").has_value());
  EXPECT_FALSE(parse_step_dir_name(".tmp-step-00000060-12").has_value());
  EXPECT_THROW(step_dir_name(-1), Error);
}

}  // namespace
}  // namespace loom::ckpt
