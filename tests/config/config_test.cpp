#include "loom/config/run_config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "loom/core/error.h"

namespace loom::config {
namespace {

// The message of the loom::Error that `body` throws (fails the test when it throws none).
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

RunConfig parse(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  return parse_config(yaml, "test.yaml", overrides);
}

#define EXPECT_HAS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << "message: " << (text)

TEST(Config, DefaultsWhenEmptyOrSectionsAbsent) {
  RunConfig empty = parse("");
  EXPECT_EQ(empty.train.steps, 100);
  EXPECT_EQ(empty.model.d_model, 256);
  RunConfig partial = parse("train:\n  steps: 7\nmodel:\n");
  EXPECT_EQ(partial.train.steps, 7);
  EXPECT_EQ(partial.train.global_batch, 8);
  EXPECT_EQ(partial.model.layers, 4);
}

TEST(Config, ParsesEveryType) {
  RunConfig c = parse(R"(
run: {dir: /tmp/r, name: test}
model:
  kv_heads: 2
  norm: layer
  tied_embeddings: false
  rope_theta: 500000
  norm_eps: 1.0e-6
data: {tokenizer: gpt2, train_prefix: data/train, seq_len: 64}
optim: {lr: 1e-3, min_lr: 0, schedule: constant}
train: {steps: 10, global_batch: 16, micro_batch: 4, seed: 18446744073709551615, resume: yes}
checkpoint: {interval: 5, keep: 2, async: true, at_end: false}
log: {interval: 3, progress: off}
)");
  EXPECT_EQ(c.run.dir, "/tmp/r");
  EXPECT_EQ(c.model.kv_heads, 2);
  EXPECT_EQ(c.model.norm, Norm::Layer);
  EXPECT_FALSE(c.model.tied_embeddings);
  EXPECT_EQ(c.model.rope_theta, 500000.0);
  EXPECT_EQ(c.model.norm_eps, 1e-6);
  EXPECT_EQ(c.data.tokenizer, "gpt2");
  EXPECT_EQ(c.data.seq_len, 64);
  EXPECT_EQ(c.optim.lr, 1e-3);
  EXPECT_EQ(c.optim.min_lr, 0.0);
  EXPECT_EQ(c.train.global_batch, 16);
  EXPECT_EQ(c.train.seed, 18446744073709551615ull);
  EXPECT_TRUE(c.train.resume);
  EXPECT_TRUE(c.checkpoint.async);
  EXPECT_FALSE(c.checkpoint.at_end);
  EXPECT_EQ(c.log.interval, 3);
  EXPECT_FALSE(c.log.progress);
}

TEST(Config, OverrideForms) {
  RunConfig c = parse("train: {steps: 5}\n",
                      {"train.steps=9", "++optim.lr=0.001", "+train.seed=7", "run.name=my run", "data.val_prefix="});
  EXPECT_EQ(c.train.steps, 9);
  EXPECT_EQ(c.optim.lr, 0.001);
  EXPECT_EQ(c.train.seed, 7u);
  EXPECT_EQ(c.run.name, "my run");
  EXPECT_EQ(c.data.val_prefix, "");
  // Later overrides win.
  EXPECT_EQ(parse("", {"train.steps=3", "train.steps=4"}).train.steps, 4);
}

TEST(Config, BlockConfigsFromYaml) {
  RunConfig c = parse(R"(
model:
  layers: 3
  block_configs:
    - {attention: skip}
    - {kv_heads: 2, ffn_size: 0}
    - {}
)");
  ASSERT_EQ(c.model.block_configs.size(), 3u);
  EXPECT_EQ(c.model.block_configs[0].attention, BlockAttention::Skip);
  EXPECT_EQ(c.model.block_configs[0].ffn_size, -1);
  EXPECT_EQ(c.model.block_configs[1].kv_heads, 2);
  EXPECT_EQ(c.model.block_configs[1].ffn_size, 0);
  EXPECT_EQ(c.model.block_configs[2].attention, BlockAttention::Normal);
}

TEST(Config, BlockConfigsFromOverride) {
  RunConfig c = parse("model: {layers: 2}\n", {"model.block_configs=[{attention: skip}, {ffn_size: 512}]"});
  ASSERT_EQ(c.model.block_configs.size(), 2u);
  EXPECT_EQ(c.model.block_configs[0].attention, BlockAttention::Skip);
  EXPECT_EQ(c.model.block_configs[1].ffn_size, 512);
  EXPECT_TRUE(parse("model: {layers: 1, block_configs: [{}]}", {"model.block_configs=[]"}).model.block_configs.empty());
  std::string msg = error_of([] { parse("model: {layers: 1}", {"model.block_configs=[{ffn_sise: 3}]"}); });
  EXPECT_HAS(msg, "model.block_configs[0].ffn_sise");
  EXPECT_HAS(msg, "did you mean 'ffn_size'?");
  EXPECT_HAS(msg, "override 'model.block_configs=[{ffn_sise: 3}]'");
}

TEST(Config, BlendsFromYamlAndOverrideRoundTrip) {
  RunConfig c = parse(R"(
data:
  train_blend:
    - {prefix: data/web, weight: 0.7}
    - {prefix: data/code, weight: 0.3}
  val_blend: [{prefix: data/web_val}]
)");
  ASSERT_EQ(c.data.train_blend.size(), 2u);
  EXPECT_EQ(c.data.train_blend[1].prefix, "data/code");
  EXPECT_DOUBLE_EQ(c.data.train_blend[1].weight, 0.3);
  ASSERT_EQ(c.data.val_blend.size(), 1u);
  EXPECT_DOUBLE_EQ(c.data.val_blend[0].weight, 1.0);  // the default: equal shares
  const RunConfig back = parse(to_yaml(c));
  ASSERT_EQ(back.data.train_blend.size(), 2u);
  EXPECT_EQ(back.data.train_blend[0].prefix, "data/web");
  EXPECT_DOUBLE_EQ(back.data.train_blend[0].weight, 0.7);
  const RunConfig over = parse("", {"data.train_blend=[{prefix: a, weight: 2}, {prefix: b, weight: 1}]"});
  ASSERT_EQ(over.data.train_blend.size(), 2u);
  EXPECT_EQ(over.data.train_blend[1].prefix, "b");
}

// Megatron's --data-path text works as it is: weights and prefixes in turn, or one prefix.
TEST(Config, BlendsFromMegatronDataPathText) {
  const RunConfig c = parse("data: {train_blend: \"0.7 data/web  0.3 data/code\", val_blend: data/val}");
  ASSERT_EQ(c.data.train_blend.size(), 2u);
  EXPECT_EQ(c.data.train_blend[0].prefix, "data/web");
  EXPECT_DOUBLE_EQ(c.data.train_blend[0].weight, 0.7);
  EXPECT_EQ(c.data.train_blend[1].prefix, "data/code");
  EXPECT_DOUBLE_EQ(c.data.train_blend[1].weight, 0.3);
  ASSERT_EQ(c.data.val_blend.size(), 1u);
  EXPECT_EQ(c.data.val_blend[0].prefix, "data/val");
  const RunConfig over = parse("", {"data.train_blend=2 a 1e-1 b"});
  ASSERT_EQ(over.data.train_blend.size(), 2u);
  EXPECT_DOUBLE_EQ(over.data.train_blend[1].weight, 0.1);
  EXPECT_EQ(parse(to_yaml(c)).data.train_blend.size(), 2u);  // written back as the list of maps
  std::string msg = error_of([] { parse("", {"data.train_blend=0.7 data/web 0.3"}); });
  EXPECT_HAS(msg, "data.train_blend = '0.7 data/web 0.3' is invalid: expected");
  EXPECT_HAS(msg, "--data-path");
  msg = error_of([] { parse("", {"data.train_blend=data/web 0.7 data/code 0.3"}); });
  EXPECT_HAS(msg, "'data/web' (word 1) is not a weight");
  msg = error_of([] { parse("", {"data.train_blend=-1 a 2 b"}); });
  EXPECT_HAS(msg, "data.train_blend[0].weight");
}

TEST(Config, BadBlendsNameTheEntryAndWhatIsValid) {
  std::string msg = error_of([] { parse("data: {train_blend: [{prefix: a, weight: 0}]}"); });
  EXPECT_HAS(msg, "data.train_blend[0].weight");
  EXPECT_HAS(msg, "finite number > 0");
  msg = error_of([] { parse("data: {train_blend: [{prefix: a}, {weight: 2}]}"); });
  EXPECT_HAS(msg, "data.train_blend[1].prefix");
  EXPECT_HAS(msg, "loom data prepare");
  msg = error_of([] { parse("data: {val_blend: [{prefx: a}]}"); });
  EXPECT_HAS(msg, "data.val_blend[0].prefx");
  EXPECT_HAS(msg, "did you mean 'prefix'?");
  msg = error_of([] { parse("data: {train_blend: {prefix: a}}"); });
  EXPECT_HAS(msg, "data.train_blend");
  EXPECT_HAS(msg, "a list of maps with keys prefix, weight");
  msg = error_of([] { parse("data: {train_prefix: x, train_blend: [{prefix: a}]}"); });
  EXPECT_HAS(msg, "data.train_prefix and data.train_blend are both set");
  msg = error_of([] { parse("data: {val_blend: [{prefix: a}, {prefix: b}, {prefix: a, weight: 3}]}"); });
  EXPECT_HAS(msg, "data.val_blend[2].prefix = 'a' is invalid: data.val_blend[0] names it already");
}

TEST(Config, SchedulesParseAndTheirStepCountsAreChecked) {
  RunConfig c = parse("optim: {schedule: wsd, wsd_decay_steps: 20, wsd_decay_style: minus_sqrt, decay_steps: 90}\n"
                      "train: {steps: 100}");
  EXPECT_EQ(c.optim.schedule, LrSchedule::Wsd);
  EXPECT_EQ(c.optim.wsd_decay_style, WsdDecay::MinusSqrt);
  EXPECT_EQ(c.optim.decay_steps, 90);
  EXPECT_EQ(parse("optim: {schedule: inverse_square_root}").optim.schedule, LrSchedule::InverseSquareRoot);
  EXPECT_EQ(parse("optim: {schedule: linear}").optim.schedule, LrSchedule::Linear);
  std::string msg = error_of([] { parse("optim: {schedule: wsd}"); });
  EXPECT_HAS(msg, "optim.schedule = 'wsd' needs optim.wsd_decay_steps");
  msg = error_of([] { parse("optim: {schedule: wsd, wsd_decay_steps: 95, warmup_steps: 10}\ntrain: {steps: 100}"); });
  EXPECT_HAS(msg, "optim.wsd_decay_steps = 95 is invalid");
  EXPECT_HAS(msg, "[1, 90]");
  msg = error_of([] { parse("optim: {wsd_decay_steps: 5}"); });
  EXPECT_HAS(msg, "optim.wsd_decay_steps = 5 is set but optim.schedule is 'cosine'");
  msg = error_of([] { parse("optim: {decay_steps: 10, warmup_steps: 10}"); });
  EXPECT_HAS(msg, "optim.decay_steps = 10 is invalid: must be 0 (= train.steps) or greater than optim.warmup_steps");
  msg = error_of([] { parse("optim: {schedule: wsd_linear}"); });
  EXPECT_HAS(msg, "optim.schedule");
  EXPECT_HAS(msg, "inverse_square_root");
  msg = error_of([] { parse("optim: {wsd_decay_style: sqrt}"); });
  EXPECT_HAS(msg, "minus_sqrt");
}

TEST(Config, BatchRampupParsesAsAListOrMegatronsTextAndRelatesToTheBatch) {
  RunConfig c = parse("train: {global_batch: 64, rampup_batch_size: [16, 16, 1000]}");
  EXPECT_EQ(c.train.rampup_batch_size, (BatchRampup{16, 16, 1000}));
  EXPECT_EQ(parse(to_yaml(c)).train.rampup_batch_size, (BatchRampup{16, 16, 1000}));  // written back as the list
  EXPECT_EQ(parse("train: {global_batch: 64}", {"train.rampup_batch_size=16 16 1000"}).train.rampup_batch_size,
            (BatchRampup{16, 16, 1000}));
  EXPECT_FALSE(parse("train: {rampup_batch_size: []}").train.rampup_batch_size.on());
  EXPECT_FALSE(parse(to_yaml(RunConfig{})).train.rampup_batch_size.on());
  std::string msg = error_of([] { parse("train: {rampup_batch_size: [16, 16]}"); });
  EXPECT_HAS(msg, "train.rampup_batch_size = a list is not three integers [start, increment, samples]");
  msg = error_of([] { parse("train: {rampup_batch_size: '16 x 1000'}"); });
  EXPECT_HAS(msg, "train.rampup_batch_size = 'x' is not an integer");
  msg = error_of([] { parse("train: {rampup_batch_size: [0, 16, 1000]}"); });
  EXPECT_HAS(msg, "train.rampup_batch_size = [0, 16, 1000] is invalid: must be [] (no ramp-up) or three integers >= 1");
  msg = error_of([] { parse("train: {global_batch: 64, rampup_batch_size: [64, 16, 1000]}"); });
  EXPECT_HAS(msg, "train.rampup_batch_size = [64, 16, 1000] is invalid: its start batch must be below "
                  "train.global_batch = 64");
  msg = error_of([] { parse("train: {global_batch: 64, rampup_batch_size: [16, 20, 1000]}"); });
  EXPECT_HAS(msg, "its increment must divide train.global_batch - start = 48");
}

TEST(Config, DataSplitParsesAsMegatronsTextOrAListAndStandsAlone) {
  RunConfig c = parse("data: {split: '969,30,1'}");
  EXPECT_EQ(c.data.split.shares, (std::vector<double>{969, 30, 1}));
  EXPECT_EQ(parse(to_yaml(c)).data.split, c.data.split);  // written back as the text
  EXPECT_EQ(parse("data: {split: [969, 30, 1]}").data.split, c.data.split);
  EXPECT_EQ(parse("", {"data.split=969/30/1"}).data.split, c.data.split);
  EXPECT_EQ(parse("data: {split: 0.9 0.1}").data.split.shares, (std::vector<double>{0.9, 0.1}));
  EXPECT_EQ(parse("data: {split: 1}").data.split.shares, (std::vector<double>{1}));
  EXPECT_FALSE(parse("data: {split: ''}").data.split.on());
  EXPECT_FALSE(parse(to_yaml(RunConfig{})).data.split.on());
  EXPECT_EQ(parse("data: {test_prefix: t, test_blend: []}").data.test_prefix, "t");
  std::string msg = error_of([] { parse("data: {split: '90,5,4,1'}"); });
  EXPECT_HAS(msg, "data.split = 90,5,4,1 is invalid: must be 1 to 3 shares (train, validation, test), not 4");
  msg = error_of([] { parse("data: {split: [90, -5, 5]}"); });
  EXPECT_HAS(msg, "data.split = 90,-5,5 is invalid: must be shares >= 0, not -5");
  msg = error_of([] { parse("data: {split: '0,1,1'}"); });
  EXPECT_HAS(msg, "data.split = 0,1,1 is invalid: must give training a share");
  msg = error_of([] { parse("data: {split: '90,x'}"); });
  EXPECT_HAS(msg, "data.split = 'x' is not a finite number");
  msg = error_of([] { parse("data: {split: '98,1,1', val_prefix: v}"); });
  EXPECT_HAS(msg, "data.split = 98,1,1 takes the validation and test sets from the training datasets, and "
                  "data.val_prefix is set too: give one (the split, or separate datasets)");
  msg = error_of([] { parse("data: {split: '98,1,1', test_blend: [{prefix: t}]}"); });
  EXPECT_HAS(msg, "and data.test_blend is set too");
  msg = error_of([] { parse("data: {test_prefix: t, test_blend: [{prefix: t}]}"); });
  EXPECT_HAS(msg, "data.test_prefix and data.test_blend are both set");
}

TEST(Config, ARunMeasuredInSamplesCountsItsScheduleInSamples) {
  RunConfig c = parse("optim: {warmup_samples: 100, decay_samples: 900, schedule: wsd, wsd_decay_samples: 200}\n"
                      "train: {steps: 0, samples: 1000, global_batch: 8}");
  EXPECT_EQ(c.train.samples, 1000);
  EXPECT_EQ(c.optim.warmup_samples, 100);
  EXPECT_EQ(c.optim.wsd_decay_samples, 200);
  EXPECT_EQ(parse("train: {steps: 0, samples: 5000000000000}").train.samples, 5'000'000'000'000);
  std::string msg = error_of([] { parse("train: {samples: 1000}"); });
  EXPECT_HAS(msg, "train.samples = 1000 and train.steps = 100 both give the run's length: give one "
                  "(train.steps=0 with train.samples)");
  msg = error_of([] { parse("train: {steps: 0}"); });
  EXPECT_HAS(msg, "train.steps = 0 needs train.samples");
  msg = error_of([] { parse("optim: {warmup_steps: 10}\ntrain: {steps: 0, samples: 1000}"); });
  EXPECT_HAS(msg, "optim.warmup_steps = 10 counts steps, but train.samples = 1000 measures this run in samples: use "
                  "optim.warmup_samples (and set optim.warmup_steps=0)");
  msg = error_of([] { parse("optim: {decay_samples: 10}"); });
  EXPECT_HAS(msg, "optim.decay_samples = 10 counts samples, but this run is measured in steps (train.steps = 100");
  msg = error_of([] { parse("train: {steps: 0, samples: 7, global_batch: 8}"); });
  EXPECT_HAS(msg, "train.samples = 7 is less than one global batch (train.global_batch = 8)");
  msg = error_of([] { parse("optim: {schedule: wsd, warmup_samples: 100}\ntrain: {steps: 0, samples: 1000}"); });
  EXPECT_HAS(msg, "optim.schedule = 'wsd' needs optim.wsd_decay_samples: the annealing's samples");
  msg = error_of([] {
    parse("optim: {schedule: wsd, warmup_samples: 100, wsd_decay_samples: 950}\ntrain: {steps: 0, samples: 1000}");
  });
  EXPECT_HAS(msg, "optim.wsd_decay_samples = 950 is invalid: the annealing ends at train.samples = 1000 and cannot "
                  "start before the warm-up's end (optim.warmup_samples = 100), so it must be in [1, 900]");
  msg = error_of([] { parse("train: {steps: 0, samples: 99999999999999999999}"); });
  EXPECT_HAS(msg, "does not fit a 64-bit integer");
}

TEST(Config, SftWeightsGiveOnePerFile) {
  RunConfig c = parse("sft: {train_files: [a.jsonl, b.jsonl], train_weights: [0.7, 0.3]}");
  EXPECT_EQ(c.sft.train_weights, (std::vector<double>{0.7, 0.3}));
  EXPECT_EQ(parse(to_yaml(c)).sft.train_weights, (std::vector<double>{0.7, 0.3}));
  EXPECT_TRUE(parse("sft: {train_files: [a.jsonl]}").sft.train_weights.empty());
  std::string msg = error_of([] { parse("sft: {train_files: [a.jsonl, b.jsonl], train_weights: [1]}"); });
  EXPECT_HAS(msg, "sft.train_weights has 1 weights for 2 sft.train_files entries: give one per entry");
  msg = error_of([] { parse("sft: {train_files: [a.jsonl, b.jsonl], train_weights: [1, 0]}"); });
  EXPECT_HAS(msg, "sft.train_weights = [1, 0] is invalid: each weight must be a finite number > 0 (weights are "
                  "relative");
  msg = error_of([] { parse("sft: {train_files: [a.jsonl], train_weights: [heavy]}"); });
  EXPECT_HAS(msg, "sft.train_weights[0] = 'heavy' is not a finite number");
}

TEST(Config, MalformedYamlNamesFileLineColumn) {
  std::string msg = error_of([] { parse("train:\n  steps: [1, 2\n"); });
  EXPECT_HAS(msg, "test.yaml:");
  EXPECT_HAS(msg, "malformed YAML");
  msg = error_of([] { parse("- a\n- b\n"); });
  EXPECT_HAS(msg, "must be a map of sections");
  msg = error_of([] { parse("", {"model.block_configs=[{"}); });
  EXPECT_HAS(msg, "override 'model.block_configs=[{'");
  EXPECT_HAS(msg, "not valid YAML");
}

TEST(Config, UnknownKeyInFile) {
  std::string msg = error_of([] { parse("train:\n  steps: 5\n  global_bach: 4\n"); });
  EXPECT_HAS(msg, "test.yaml:3:3");
  EXPECT_HAS(msg, "'train.global_bach'");
  EXPECT_HAS(msg, "steps, global_batch, micro_batch");
  EXPECT_HAS(msg, "did you mean 'global_batch'?");
  // A transposition is one typo.
  EXPECT_HAS(error_of([] { parse("train: {stpes: 4}"); }), "did you mean 'steps'?");
  // A key of another section points there.
  EXPECT_HAS(error_of([] { parse("train: {lr: 0.1}"); }), "did you mean 'optim.lr'?");
  // A truncated name is suggested too.
  EXPECT_HAS(error_of([] { parse("train: {global: 4}"); }), "did you mean 'global_batch'?");
  // Nothing close: no suggestion.
  EXPECT_EQ(error_of([] { parse("train: {zzzzzzzz: 4}"); }).find("did you mean"), std::string::npos);
}

TEST(Config, UnknownSection) {
  std::string msg = error_of([] { parse("trian:\n  steps: 5\n"); });
  EXPECT_HAS(msg, "test.yaml:1:1");
  EXPECT_HAS(msg, "unknown section 'trian'");
  EXPECT_HAS(msg, "run, runtime, parallel, precision, topology, model, data, optim, train, checkpoint, sft, grpo, log, "
                  "profile, fault");
  EXPECT_HAS(msg, "did you mean 'train'?");
  msg = error_of([] { parse("", {"optm.lr=1"}); });
  EXPECT_HAS(msg, "override 'optm.lr=1'");
  EXPECT_HAS(msg, "did you mean 'optim'?");
}

TEST(Config, UnknownKeyInOverride) {
  std::string msg = error_of([] { parse("", {"++train.micro_bach=2"}); });
  EXPECT_HAS(msg, "override '++train.micro_bach=2'");
  EXPECT_HAS(msg, "'train.micro_bach'");
  EXPECT_HAS(msg, "did you mean 'micro_batch'?");
  EXPECT_HAS(error_of([] { parse("", {"train.steps"}); }), "expected section.key=value");
  EXPECT_HAS(error_of([] { parse("", {"steps=3"}); }), "did you mean 'train.steps'?");
  EXPECT_HAS(error_of([] { parse("", {"a.b.c=3"}); }), "exactly one '.'");
}

TEST(Config, DuplicateKeyIsAnError) {
  std::string msg = error_of([] { parse("train:\n  steps: 5\n  steps: 6\n"); });
  EXPECT_HAS(msg, "test.yaml:3:3");
  EXPECT_HAS(msg, "'train.steps' is given twice");
}

TEST(Config, WrongTypes) {
  std::string msg = error_of([] { parse("train:\n  steps: ten\n"); });
  EXPECT_HAS(msg, "test.yaml:2:10");
  EXPECT_HAS(msg, "train.steps = 'ten'");
  EXPECT_HAS(msg, "an integer");
  msg = error_of([] { parse("", {"train.global_batch=2.5"}); });
  EXPECT_HAS(msg, "override 'train.global_batch=2.5'");
  EXPECT_HAS(msg, "train.global_batch = '2.5' is not an integer");
  msg = error_of([] { parse("model: {bias: maybe}"); });
  EXPECT_HAS(msg, "model.bias = 'maybe' is not a bool (true or false)");
  msg = error_of([] { parse("optim: {lr: fast}"); });
  EXPECT_HAS(msg, "optim.lr = 'fast' is not a finite number");
  EXPECT_HAS(error_of([] { parse("optim: {lr: .nan}"); }), "is not a finite number");
  msg = error_of([] { parse("train: {seed: -1}"); });
  EXPECT_HAS(msg, "train.seed = '-1' is not a non-negative integer");
  msg = error_of([] { parse("train: {steps: 99999999999}"); });
  EXPECT_HAS(msg, "does not fit a 32-bit integer");
  msg = error_of([] { parse("run: {name: [a, b]}"); });
  EXPECT_HAS(msg, "run.name = a list is not a string");
  msg = error_of([] { parse("model: {block_configs: {attention: skip}}"); });
  EXPECT_HAS(msg, "model.block_configs = a map is not a list of maps");
  msg = error_of([] { parse("train: 5"); });
  EXPECT_HAS(msg, "section 'train' must be a map");
  msg = error_of([] { parse("train: {steps: }"); });
  EXPECT_HAS(msg, "train.steps = nothing is not an integer");
}

struct RangeCase {
  std::vector<std::string> overrides;
  std::vector<std::string> parts;  // each must appear in the message
};

void PrintTo(const RangeCase& c, std::ostream* os) {
  for (const auto& o : c.overrides) *os << o << " ";
}

class ConfigRange : public ::testing::TestWithParam<RangeCase> {};

TEST_P(ConfigRange, NamesKeyValueAndValidRange) {
  std::string msg = error_of([] { parse("", GetParam().overrides); });
  for (const auto& part : GetParam().parts) EXPECT_HAS(msg, part);
}

INSTANTIATE_TEST_SUITE_P(
    Config, ConfigRange,
    ::testing::Values(
        RangeCase{{"train.steps=0"}, {"train.steps = 0", ">= 1"}},
        RangeCase{{"train.global_batch=0"}, {"train.global_batch = 0", ">= 1"}},
        RangeCase{{"train.micro_batch=0"}, {"train.micro_batch = 0", ">= 1"}},
        RangeCase{{"train.global_batch=10", "train.micro_batch=4"},
                  {"train.global_batch = 10", "multiple of train.micro_batch = 4"}},
        RangeCase{{"model.d_model=0"}, {"model.d_model = 0", ">= 1"}},
        RangeCase{{"model.layers=0"}, {"model.layers = 0", ">= 1"}},
        RangeCase{{"model.heads=0"}, {"model.heads = 0", ">= 1"}},
        RangeCase{{"model.kv_heads=3"}, {"model.kv_heads = 3", "divide model.heads = 4", "0, 1, 2, 4"}},
        RangeCase{{"model.kv_heads=-1"}, {"model.kv_heads = -1", ">= 0"}},
        RangeCase{{"model.rope_scaling=llama3", "model.rope_high_freq_factor=1"},
                  {"model.rope_high_freq_factor = 1", "rope_scaling = 'llama3'", "greater than model.rope_low_freq_factor"}},
        RangeCase{{"model.rope_scaling=yarn", "model.rope_beta_fast=0.5"},
                  {"model.rope_beta_fast = 0.5", "greater than model.rope_beta_slow = 1"}},
        RangeCase{{"model.rope_scaling=ntk"}, {"model.rope_scaling", "none, llama3, yarn"}},
        RangeCase{{"model.rope_scaling_factor=0"}, {"model.rope_scaling_factor = 0"}},
        RangeCase{{"model.d_model=250"}, {"model.d_model = 250", "multiple of model.heads = 4"}},
        RangeCase{{"model.d_model=12", "model.heads=4"}, {"model.positions = 'rope'", "even head dimension", "= 3"}},
        RangeCase{{"model.ffn_size=0"}, {"model.ffn_size = 0", ">= 1"}},
        RangeCase{{"model.max_seq_len=0"}, {"model.max_seq_len = 0", ">= 1"}},
        RangeCase{{"data.seq_len=0"}, {"data.seq_len = 0", ">= 1"}},
        RangeCase{{"data.seq_len=512"}, {"data.seq_len = 512", "[1, model.max_seq_len = 256]"}},
        RangeCase{{"optim.lr=0"}, {"optim.lr = 0", "> 0"}},
        RangeCase{{"optim.min_lr=-1"}, {"optim.min_lr = -1", ">= 0"}},
        RangeCase{{"optim.min_lr=0.01"}, {"optim.min_lr = 0.01", "[0, optim.lr = 3e-04]"}},
        RangeCase{{"optim.beta1=1"}, {"optim.beta1 = 1", "[0, 1)"}},
        RangeCase{{"optim.beta2=-0.5"}, {"optim.beta2 = -0.5", "[0, 1)"}},
        RangeCase{{"optim.eps=0"}, {"optim.eps = 0", "> 0"}},
        RangeCase{{"optim.weight_decay=-0.1"}, {"optim.weight_decay = -0.1", ">= 0"}},
        RangeCase{{"optim.clip_grad=-1"}, {"optim.clip_grad = -1", ">= 0"}},
        RangeCase{{"optim.warmup_steps=-1"}, {"optim.warmup_steps = -1", ">= 0"}},
        RangeCase{{"model.norm=rsm"}, {"model.norm = 'rsm'", "rms, layer", "did you mean 'rms'?"}},
        RangeCase{{"model.activation=relu"}, {"model.activation = 'relu'", "swiglu, gelu"}},
        RangeCase{{"model.positions=alibi"}, {"model.positions = 'alibi'", "rope, learned"}},
        RangeCase{{"optim.schedule=exponential"},
                  {"optim.schedule = 'exponential'", "cosine, constant, linear, inverse_square_root, wsd"}},
        RangeCase{{"data.tokenizer=cl100k"},
                  {"data.tokenizer = 'cl100k'", "byte, gpt2, r50k_base, cl100k_base, o200k_base",
                   "did you mean 'cl100k_base'?"}},
        RangeCase{{"model.block_configs=[{attention: none}, {}, {}, {}]"},
                  {"model.block_configs[0].attention = 'none'", "normal, skip"}},
        RangeCase{{"model.block_configs=[{}, {}]"}, {"model.block_configs has 2 entries", "model.layers = 4"}},
        RangeCase{{"model.block_configs=[{}, {}, {kv_heads: 3}, {}]"},
                  {"model.block_configs[2].kv_heads = 3", "divide model.heads = 4"}},
        RangeCase{{"model.block_configs=[{}, {ffn_size: -2}, {}, {}]"},
                  {"model.block_configs[1].ffn_size = -2", "-1 (= model.ffn_size)"}},
        RangeCase{{"checkpoint.keep=0"}, {"checkpoint.keep = 0", ">= 1"}},
        RangeCase{{"checkpoint.interval=-1"}, {"checkpoint.interval = -1", ">= 0"}},
        RangeCase{{"train.eval_interval=-1"}, {"train.eval_interval = -1", ">= 0"}},
        RangeCase{{"train.eval_batches=0"}, {"train.eval_batches = 0", ">= 1"}},
        RangeCase{{"log.interval=0"}, {"log.interval = 0", ">= 1"}},
        RangeCase{{"train.threads=-2"}, {"train.threads = -2", ">= 0"}},
        RangeCase{{"model.vocab_size=-1"}, {"model.vocab_size = -1", ">= 0"}},
        RangeCase{{"model.init_std=0"}, {"model.init_std = 0", "> 0"}},
        RangeCase{{"model.norm_eps=-1e-5"}, {"model.norm_eps = -1e-05", "> 0"}},
        RangeCase{{"model.rope_theta=0"}, {"model.rope_theta = 0", "> 0"}}));

TEST(Config, ValidateConfigDirectly) {
  RunConfig c;
  EXPECT_NO_THROW(validate_config(c));
  c.train.micro_batch = 3;
  EXPECT_HAS(error_of([&] { validate_config(c); }), "train.global_batch = 8");
}

TEST(Config, DocumentOptionsAreOffByDefaultAndChecked) {
  const RunConfig defaults = parse("");
  EXPECT_FALSE(defaults.data.reset_position_ids || defaults.data.reset_attention_mask || defaults.data.eod_mask_loss);
  const RunConfig on = parse("data: {reset_position_ids: true}",
                             {"data.reset_attention_mask=true", "++data.eod_mask_loss=true"});
  EXPECT_TRUE(on.data.reset_position_ids && on.data.reset_attention_mask && on.data.eod_mask_loss);
  EXPECT_HAS(error_of([] { parse("", {"data.reset_attention_mask=maybe"}); }), "data.reset_attention_mask");
  EXPECT_HAS(error_of([] { parse("data: {reset_attention_masks: true}"); }), "did you mean 'reset_attention_mask'?");
}

TEST(Config, ToYamlRoundTrip) {
  RunConfig c;
  c.run.dir = "~";  // would be YAML null if written unquoted
  c.run.name = "a: b # not a comment";
  c.model.layers = 3;
  c.model.kv_heads = 2;
  c.model.block_configs = {BlockConfig{BlockAttention::Skip, 1, 0}, BlockConfig{BlockAttention::Normal, 0, 333}, BlockConfig{}};
  c.model.rope_theta = 1.0 / 3.0;
  c.model.norm_eps = 1e-300;
  c.optim.lr = 0.1 + 0.2;
  c.optim.min_lr = 3e-5;
  c.optim.beta2 = 0.9999999999999999;
  c.train.seed = 18446744073709551615ull;
  c.train.resume = true;
  c.data.val_prefix = "";
  c.checkpoint.dir = "true";
  std::string text = to_yaml(c);
  for (const char* key : {"run:", "dir:", "vocab_size:", "block_configs:", "recompute:", "seed:", "async:",
                          "progress:", "train_prefix:", "warmup_steps:"})
    EXPECT_HAS(text, key);
  RunConfig back = parse_config(text, "roundtrip.yaml", {});
  EXPECT_EQ(back.run.dir, c.run.dir);
  EXPECT_EQ(back.run.name, c.run.name);
  EXPECT_EQ(back.model.rope_theta, c.model.rope_theta);
  EXPECT_EQ(back.model.norm_eps, c.model.norm_eps);
  EXPECT_EQ(back.optim.lr, c.optim.lr);
  EXPECT_EQ(back.optim.beta2, c.optim.beta2);
  EXPECT_EQ(back.train.seed, c.train.seed);
  EXPECT_TRUE(back.train.resume);
  EXPECT_EQ(back.checkpoint.dir, "true");
  ASSERT_EQ(back.model.block_configs.size(), 3u);
  EXPECT_EQ(back.model.block_configs[0].attention, BlockAttention::Skip);
  EXPECT_EQ(back.model.block_configs[0].kv_heads, 1);
  EXPECT_EQ(back.model.block_configs[0].ffn_size, 0);
  EXPECT_EQ(back.model.block_configs[1].ffn_size, 333);
  EXPECT_EQ(back.model.block_configs[2].ffn_size, -1);
  // Serialising again gives the same text: nothing was lost or changed.
  EXPECT_EQ(to_yaml(back), text);
  EXPECT_EQ(to_yaml(parse("")), to_yaml(RunConfig{}));
}

class ConfigFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("loom_config_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
  std::filesystem::path dir_;
};

TEST_F(ConfigFile, LoadsFileWithOverrides) {
  std::string path = write("run.yaml", "train:\n  steps: 20\n");
  RunConfig c = load_config(path, {"train.micro_batch=4"});
  EXPECT_EQ(c.train.steps, 20);
  EXPECT_EQ(c.train.micro_batch, 4);
}

TEST_F(ConfigFile, MissingFileNamesPath) {
  std::string path = (dir_ / "nope.yaml").string();
  std::string msg = error_of([&] { load_config(path, {}); });
  EXPECT_HAS(msg, path);
  EXPECT_HAS(msg, "does not exist");
}

TEST_F(ConfigFile, ErrorsNameTheFile) {
  std::string path = write("bad.yaml", "model:\n  d_model: 64\n  hedas: 2\n");
  std::string msg = error_of([&] { load_config(path, {}); });
  EXPECT_HAS(msg, path + ":3:3");
  EXPECT_HAS(msg, "did you mean 'heads'?");
  path = write("broken.yaml", "train:\n  steps: 5\n bad indent: [\n");
  msg = error_of([&] { load_config(path, {}); });
  EXPECT_HAS(msg, path + ":");
  EXPECT_HAS(msg, "malformed YAML");
}

}  // namespace
}  // namespace loom::config

namespace loom::config {
namespace {

TEST(Config, MoeKeysParseAndBadValuesNameTheKey) {
  RunConfig c = parse("model: {layers: 2, moe_experts: 8, moe_top_k: 2, moe_router: sigmoid}\n",
                      {"model.block_configs=[{ffn: dense}, {ffn: moe}]", "parallel.ep=2"});
  EXPECT_EQ(c.model.moe.experts, 8);
  EXPECT_EQ(c.model.moe.router, MoeRouter::Sigmoid);
  EXPECT_EQ(c.model.block_configs[1].ffn, BlockFfn::Moe);
  EXPECT_EQ(c.parallel.ep, 2);
  EXPECT_EQ(parse(to_yaml(c)).model.moe.router, MoeRouter::Sigmoid);  // round-trips
  std::string msg = error_of([] { parse("model: {moe_experts: 4, moe_top_k: 5}\n"); });
  EXPECT_HAS(msg, "model.moe_top_k = 5");
  msg = error_of([] { parse("model: {layers: 1}\n", {"model.block_configs=[{ffn: moe}]"}); });
  EXPECT_HAS(msg, "model.block_configs[0].ffn = 'moe' needs model.moe_experts > 0");
  msg = error_of([] { parse("model: {moe_experts: 4, moe_router: softmax}\n"); });
  EXPECT_HAS(msg, "model.moe_router");
  msg = error_of([] { parse("model: {moe_experts: 4, moe_latent_size: 100000}\n"); });
  EXPECT_HAS(msg, "model.moe_latent_size = 100000");
  msg = error_of([] { parse("model: {moe_capacity_factor: -1}\n"); });
  EXPECT_HAS(msg, "model.moe_capacity_factor");
  // The shared expert's gate (Qwen2-MoE) needs a shared expert.
  EXPECT_TRUE(parse("model: {moe_experts: 4, moe_shared_ffn_size: 8, moe_shared_expert_gate: true}\n")
                  .model.moe.shared_expert_gate);
  msg = error_of([] { parse("model: {moe_experts: 4, moe_shared_expert_gate: true}\n"); });
  EXPECT_HAS(msg, "model.moe_shared_expert_gate = true needs a shared expert");
  EXPECT_EQ(parse("model: {positions: none}\n").model.positions, Positions::None);  // attention without positions
}

}  // namespace
}  // namespace loom::config

namespace loom::config {
namespace {

TEST(Config, ProfileKeysParseRoundTripAndBadValuesNameTheKey) {
  const RunConfig off = parse("");
  EXPECT_EQ(off.profile.first_step, 0);
  EXPECT_EQ(off.profile.ranks, std::vector<int>{0});
  EXPECT_TRUE(off.profile.synchronize);
  const RunConfig on = parse("profile: {first_step: 10, last_step: 12, ranks: [0, 4], synchronize: false}");
  EXPECT_EQ(on.profile.first_step, 10);
  EXPECT_EQ(on.profile.last_step, 12);
  EXPECT_EQ(on.profile.ranks, (std::vector<int>{0, 4}));
  EXPECT_FALSE(on.profile.synchronize);
  EXPECT_EQ(parse(to_yaml(on)).profile.ranks, (std::vector<int>{0, 4}));
  EXPECT_EQ(parse("", {"profile.ranks=3"}).profile.ranks, std::vector<int>{3});
  EXPECT_TRUE(parse("", {"profile.ranks=[]"}).profile.ranks.empty());
  EXPECT_HAS(error_of([] { parse("profile: {last_step: 5}"); }), "profile.last_step = 5 needs profile.first_step");
  EXPECT_HAS(error_of([] { parse("profile: {first_step: 5, last_step: 4}"); }),
             "must be 0 (first_step alone) or >= profile.first_step = 5");
  EXPECT_HAS(error_of([] { parse("profile: {first_step: 1, ranks: [0, -1]}"); }), "profile.ranks = [0, -1] is invalid");
  EXPECT_HAS(error_of([] { parse("profile: {ranks: [0, a]}"); }), "profile.ranks[1]");
  EXPECT_HAS(error_of([] { parse("profile: {first_step: -2}"); }), "profile.first_step = -2 is invalid");
}

}  // namespace
}  // namespace loom::config
