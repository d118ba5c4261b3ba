// The enumerated config keys (config/enums.h): every name parses to its value and back, through
// the enum's table and through the config (YAML and overrides), and an unknown name is the
// config's "must be one of ...; did you mean ...?" error.
#include "loom/config/enums.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "loom/config/run_config.h"
#include "loom/core/error.h"

namespace loom::config {
namespace {

template <class F>
std::string error_of(F&& body) {
  try {
    body();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a loom::Error";
  return "";
}

template <class E>
class ConfigEnum : public ::testing::Test {};

using AllEnums = ::testing::Types<Backend, PrecisionRecipe, GradReduce, ParamDtype, AttentionPrecision,
                                  PipelineScheduleKind, Norm, Activation, Positions, BlockAttention, LrSchedule,
                                  WsdDecay>;
TYPED_TEST_SUITE(ConfigEnum, AllEnums);

TYPED_TEST(ConfigEnum, EveryNameRoundTrips) {
  using E = TypeParam;
  std::set<std::string> seen;
  for (E value : all_values<E>()) {
    const std::string name = to_string(value);
    EXPECT_FALSE(name.empty());
    EXPECT_TRUE(seen.insert(name).second) << "two values named " << name;
    EXPECT_EQ(from_name<E>(name), value) << name;
    EXPECT_EQ(parse_name<E>(name, "key"), value) << name;
    EXPECT_EQ(name_of(value), names(E{})[static_cast<size_t>(value)]);
  }
  EXPECT_EQ(seen.size(), names(E{}).size());
}

TYPED_TEST(ConfigEnum, UnknownNameListsTheNamesAndSuggestsTheClosest) {
  using E = TypeParam;
  std::string all;
  for (E value : all_values<E>()) all += (all.empty() ? "" : ", ") + to_string(value);
  EXPECT_FALSE(from_name<E>("zzzzzzzz").has_value());
  EXPECT_EQ(error_of([] { parse_name<E>("zzzzzzzz", "section.key"); }),
            "section.key = 'zzzzzzzz' is invalid: must be one of " + all);
  for (E value : all_values<E>()) {
    const std::string typo = to_string(value) + "x";
    EXPECT_EQ(error_of([&] { parse_name<E>(typo, "section.key"); }),
              "section.key = '" + typo + "' is invalid: must be one of " + all + "; did you mean '" + to_string(value) +
                  "'?");
  }
}

// Every value of the key `key` set by an override (beside `also(value)`, the keys a value needs),
// read back by `get`, survives to_yaml.
template <class E, class Get>
void expect_every_value_parses(const std::string& key, Get get,
                               std::vector<std::string> (*also)(E) = [](E) { return std::vector<std::string>{}; }) {
  for (E value : all_values<E>()) {
    std::vector<std::string> overrides = also(value);
    overrides.push_back(key + "=" + to_string(value));
    const RunConfig c = parse_config("", "t.yaml", overrides);
    EXPECT_EQ(get(c), value) << key;
    const std::string yaml = to_yaml(c);
    EXPECT_NE(yaml.find(": \"" + to_string(value) + "\""), std::string::npos) << yaml;
    EXPECT_EQ(get(parse_config(yaml, "back.yaml", {})), value) << key;
  }
}

TEST(ConfigEnums, EveryKeyParsesEveryNameAndWritesItBack) {
  expect_every_value_parses<Backend>("runtime.backend", [](const RunConfig& c) { return c.runtime.backend; });
  expect_every_value_parses<PrecisionRecipe>("precision.recipe", [](const RunConfig& c) { return c.precision.recipe; });
  expect_every_value_parses<GradReduce>("precision.grad_reduce",
                                        [](const RunConfig& c) { return c.precision.grad_reduce; });
  expect_every_value_parses<ParamDtype>("precision.param_dtype",
                                        [](const RunConfig& c) { return c.precision.param_dtype; });
  expect_every_value_parses<AttentionPrecision>("precision.attention",
                                                [](const RunConfig& c) { return c.precision.attention; });
  expect_every_value_parses<PipelineScheduleKind>("parallel.pipeline_schedule",
                                                  [](const RunConfig& c) { return c.parallel.pipeline_schedule; });
  expect_every_value_parses<Norm>("model.norm", [](const RunConfig& c) { return c.model.norm; });
  expect_every_value_parses<Activation>("model.activation", [](const RunConfig& c) { return c.model.activation; });
  expect_every_value_parses<Positions>("model.positions", [](const RunConfig& c) { return c.model.positions; });
  expect_every_value_parses<LrSchedule>(
      "optim.schedule", [](const RunConfig& c) { return c.optim.schedule; },
      [](LrSchedule s) {  // wsd needs its annealing's length
        return s == LrSchedule::Wsd ? std::vector<std::string>{"optim.wsd_decay_steps=10"} : std::vector<std::string>{};
      });
  expect_every_value_parses<WsdDecay>("optim.wsd_decay_style",
                                      [](const RunConfig& c) { return c.optim.wsd_decay_style; });
  for (BlockAttention value : all_values<BlockAttention>()) {
    const std::string blocks = "model.block_configs=[{attention: " + to_string(value) + "}, {}, {}, {}]";
    const RunConfig c = parse_config("", "t.yaml", {blocks});
    EXPECT_EQ(c.model.block_configs[0].attention, value);
    EXPECT_EQ(parse_config(to_yaml(c), "back.yaml", {}).model.block_configs[0].attention, value);
  }
}

TEST(ConfigEnums, ConfigsWrittenWithQuotedNamesStillParse) {
  const RunConfig c = parse_config(R"(
runtime: {backend: "mpi"}
parallel: {pipeline_schedule: "interleaved"}
precision: {recipe: "fp8_blockwise", grad_reduce: "bf16", param_dtype: "compute"}
model: {layers: 2, norm: "layer", activation: "gelu", positions: "learned", block_configs: [{attention: "skip"}, {}]}
optim: {schedule: "constant"}
)",
                                   "old.yaml", {});
  EXPECT_EQ(c.runtime.backend, Backend::Mpi);
  EXPECT_EQ(c.parallel.pipeline_schedule, PipelineScheduleKind::Interleaved);
  EXPECT_EQ(c.precision.recipe, PrecisionRecipe::Fp8Blockwise);
  EXPECT_EQ(c.precision.grad_reduce, GradReduce::Bf16);
  EXPECT_EQ(c.precision.param_dtype, ParamDtype::Compute);
  EXPECT_EQ(c.model.norm, Norm::Layer);
  EXPECT_EQ(c.model.activation, Activation::Gelu);
  EXPECT_EQ(c.model.positions, Positions::Learned);
  EXPECT_EQ(c.model.block_configs[0].attention, BlockAttention::Skip);
  EXPECT_EQ(c.optim.schedule, LrSchedule::Constant);
  EXPECT_EQ(to_yaml(parse_config(to_yaml(c), "back.yaml", {})), to_yaml(c));
}

TEST(ConfigEnums, UnknownNameInTheConfigIsTheOneOfError) {
  EXPECT_EQ(error_of([] { parse_config("", "t.yaml", {"precision.recipe=fp8_delay"}); }),
            "t.yaml (with overrides): precision.recipe = 'fp8_delay' is invalid: must be one of fp32, bf16, fp16, "
            "fp8_delayed, fp8_current, fp8_blockwise, mxfp8; did you mean 'fp8_delayed'?");
  EXPECT_EQ(error_of([] { parse_config("model: {norm: rsm}", "t.yaml", {}); }),
            "t.yaml: model.norm = 'rsm' is invalid: must be one of rms, layer; did you mean 'rms'?");
  EXPECT_EQ(error_of([] { parse_config("runtime:\n  backend:\n", "t.yaml", {}); }),
            "t.yaml: runtime.backend = '' is invalid: must be one of threads, mpi, auto");
  EXPECT_EQ(error_of([] { parse_config("model: {layers: 1, block_configs: [{attention: none}]}", "t.yaml", {}); }),
            "t.yaml: model.block_configs[0].attention = 'none' is invalid: must be one of normal, skip");
  EXPECT_NE(error_of([] { parse_config("parallel: {pipeline_schedule: [gpipe]}", "t.yaml", {}); })
                .find("parallel.pipeline_schedule = a list is not a string"),
            std::string::npos);
}

}  // namespace
}  // namespace loom::config
