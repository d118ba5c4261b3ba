// End-to-end checks of what a new user meets first: sizes and tokenizers in Hugging Face
// imports, padded vocabularies at generation, sampling options, datasets whose ids or pointers do
// not fit, prepare-time warnings, --version, help defaults and YAML/path errors.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "cli_support.h"
#include "loom/core/atomic_file.h"

namespace loom::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

void expect_failure_naming(const CommandResult& result, std::initializer_list<std::string> mentions) {
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_EQ(result.output.find("unexpected error"), std::string::npos) << result.output;
  EXPECT_EQ(result.output.find("std::"), std::string::npos) << result.output;
  for (const std::string& m : mentions) EXPECT_NE(result.output.find(m), std::string::npos) << m << "\n" << result.output;
}

class UserInputCli : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(prepare_small_corpus(dir.path(), 200, 0.2).exit_code, 0); }

  std::string write_config(const std::string& name, const std::string& model_extra = "") {
    const std::string path = dir / (name + ".yaml");
    write_text(path, "run:\n  dir: " + (dir / name) + "\n"
                     "model:\n  vocab_size: 0\n  d_model: 32\n  heads: 4\n  layers: 1\n  ffn_size: 64\n"
                     "  max_seq_len: 64\n" + model_extra +
                     "data:\n  tokenizer: byte\n  train_prefix: " + (dir / "data/c_train") + "\n  seq_len: 32\n"
                     "train:\n  steps: 2\n  global_batch: 2\n  micro_batch: 2\n  threads: 1\n");
    return path;
  }
  std::string trained(const std::string& name, const std::string& model_extra = "") {
    CommandResult r = run_loom("train " + write_config(name, model_extra));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return dir / (name + "/checkpoints");
  }

  TempDir dir;
};

// Item 6: sizes from config.json are bounded before anything is allocated; no rope_scaling key converts.
TEST_F(UserInputCli, HfConfigSizesAreBoundedAndRopeScalingMayBeAbsent) {
  const std::string ckpt = trained("llama");
  const std::string hf = dir / "hf";
  ASSERT_EQ(run_loom("convert --to-hf " + ckpt + " " + hf).exit_code, 0);
  json config = json::parse(read_file(hf + "/config.json"));
  config.erase("rope_scaling");
  write_text(hf + "/config.json", config.dump());
  CommandResult ok = run_loom("convert --from-hf " + hf + " " + (dir / "back"));
  EXPECT_EQ(ok.exit_code, 0) << ok.output;

  for (const char* key : {"num_hidden_layers", "hidden_size", "vocab_size", "intermediate_size", "num_attention_heads",
                          "max_position_embeddings"}) {
    json huge = config;
    huge[key] = 2147483647;
    write_text(hf + "/config.json", huge.dump());
    expect_failure_naming(run_loom("convert --from-hf " + hf + " " + (dir / "x")),
                          {"config.json: " + std::string(key), "2147483647", "at most"});
  }
}

// Item 8: a padded vocabulary never samples a padding id; a tokenizer larger than the model is refused.
TEST_F(UserInputCli, PaddedVocabularyGeneratesAndOversizedTokenizerIsRefused) {
  const std::string padded = write_config("padded2");
  std::string text = read_file(padded);
  text.replace(text.find("vocab_size: 0"), 13, "vocab_size: 4096");
  write_text(padded, text);
  ASSERT_EQ(run_loom("train " + padded).exit_code, 0);
  CommandResult g = run_loom("generate " + (dir / "padded2/checkpoints") +
                             " --prompt 'Call' --max-tokens 30 --temperature 100 --seed 3");
  EXPECT_EQ(g.exit_code, 0) << g.output;

  const std::string hf = dir / "hf";
  ASSERT_EQ(run_loom("convert --to-hf " + trained("small") + " " + hf).exit_code, 0);
  expect_failure_naming(run_loom("convert --from-hf " + hf + " " + (dir / "x") + " --tokenizer gpt2"),
                        {"config.json: vocab_size is 256", "tokenizer 'gpt2' has 50257"});
  EXPECT_FALSE(fs::exists(dir / "x"));
}

// Item 9: every tokenizer data prepare accepts is accepted by train and convert.
TEST_F(UserInputCli, P50kTokenizersAreAcceptedEverywhere) {
  for (const char* name : {"p50k_base", "p50k_edit"}) {
    CommandResult r = run_loom("train " + write_config(std::string("t_") + name) + " data.tokenizer=" + name +
                               " train.steps=1");
    EXPECT_EQ(r.exit_code, 0) << r.output;
  }
  CommandResult help = run_loom("convert --help");
  EXPECT_NE(help.output.find("p50k_edit"), std::string::npos) << help.output;
}

// Item 10: sampling options are checked with readable messages; a shortened budget is reported.
TEST_F(UserInputCli, SamplingOptionsAreCheckedReadably) {
  const std::string ckpt = trained("s");
  for (const char* bad :
       {"--temperature nan", "--temperature inf", "--top-p nan", "--seed -1", "--max-tokens 0", "--top-k -1"}) {
    CommandResult r = run_loom("generate " + ckpt + " " + bad);
    expect_failure_naming(r, {"must be"});
    EXPECT_EQ(r.output.find("0000000000"), std::string::npos) << r.output;
  }
  CommandResult mesh = run_loom("mesh --tp 0");
  expect_failure_naming(mesh, {"--tp", "positive"});
  EXPECT_EQ(mesh.output.find("0000000000"), std::string::npos) << mesh.output;

  CommandResult big = run_loom("generate " + ckpt + " --prompt 'Call me' --max-tokens 1000 --temperature 0");
  EXPECT_EQ(big.exit_code, 0) << big.output;
  EXPECT_NE(big.output.find("generating 57 tokens, not 1000"), std::string::npos) << big.output;
  EXPECT_NE(big.output.find("model.max_seq_len"), std::string::npos) << big.output;
  EXPECT_EQ(run_loom("generate " + ckpt + " --prompt 'Call me' --max-tokens 4 --seed 18446744073709551615").exit_code, 0);
}

// Item 11: out-of-vocabulary ids are found when training starts, naming the file and the key;
// data prepare defaults to the same tokenizer as training and says so.
TEST_F(UserInputCli, OutOfVocabularyDatasetIsNamedAtStartAndDefaultsAgree) {
  CommandResult r = run_loom("train " + write_config("oov") + " model.vocab_size=100");
  expect_failure_naming(r, {"c_train.bin", "model.vocab_size = 100", "sequence 0"});
  EXPECT_FALSE(fs::exists(dir / "oov/checkpoints"));

  write_text(dir / "d.txt", "Some text.\n");
  CommandResult prepared = run_loom("data prepare " + (dir / "d.txt") + " --output " + (dir / "d/d"));
  EXPECT_EQ(prepared.exit_code, 0) << prepared.output;
  EXPECT_NE(prepared.output.find("with byte"), std::string::npos) << prepared.output;
  EXPECT_NE(run_loom("data prepare --help").output.find("=byte"), std::string::npos);
  EXPECT_NE(run_loom("train --help").output.find("default: byte"), std::string::npos);
}

// A blend's datasets are opened and checked before training starts: a missing one or one with
// ids past the vocabulary is named by its entry's key; a good blend says what it reads.
TEST_F(UserInputCli, BlendDatasetsAreNamedByTheirEntry) {
  write_text(dir / "other.txt", "Some other text, written a few times over.\n\nAnd then some more of it.\n\n");
  const CommandResult prepared =
      run_loom("data prepare " + (dir / "other.txt") + " --val-fraction 0 --output " + (dir / "o/o"));
  ASSERT_EQ(prepared.exit_code, 0) << prepared.output;
  const std::string blend = " data.train_prefix= 'data.train_blend=[{prefix: " + (dir / "data/c_train") +
                            ", weight: 3}, {prefix: " + (dir / "o/o_train") + "}]'";
  CommandResult missing = run_loom("train " + write_config("missing") +
                                   " data.train_prefix= 'data.train_blend=[{prefix: " + (dir / "data/c_train") +
                                   "}, {prefix: " + (dir / "data/none") + "}]'");
  expect_failure_naming(missing, {"data.train_blend[1].prefix", "none.idx", "does not exist"});
  expect_failure_naming(run_loom("train " + write_config("no-data") + " data.train_prefix="),
                        {"no training data", "data.train_prefix", "data.train_blend"});
  expect_failure_naming(run_loom("train " + write_config("oov-blend") + blend + " model.vocab_size=100"),
                        {"c_train.bin", "model.vocab_size = 100"});
  CommandResult ok = run_loom("train " + write_config("blend") + blend);
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_NE(
      ok.output.find("data: blend of 2 datasets; samples [0, 4) read " + (dir / "data/c_train") + " 75.0% (3 samples"),
      std::string::npos)
      << ok.output;
  // A dataset too short for a sample is named by its entry when the run opens it.
  expect_failure_naming(run_loom("train " + write_config("short") + blend + " model.max_seq_len=128 data.seq_len=100"),
                        {"data.train_blend[1].prefix = '" + (dir / "o/o_train") + "'",
                         "seq_len 100 needs at least 101"});
}

// Item 12: an .idx whose dtype or pointers do not match its .bin is refused naming the sequence;
// binary inputs and empty splits are flagged by data prepare.
TEST_F(UserInputCli, CorruptIndexesAreRefusedAndPrepareWarns) {
  const std::string idx = dir / "data/c_train.idx";
  std::string bytes = read_file(idx);
  std::string relabelled = bytes;
  ASSERT_EQ(relabelled[17], 8);  // uint16
  relabelled[17] = 1;            // uint8
  write_text(idx, relabelled);
  expect_failure_naming(run_loom("train " + write_config("r")), {"c_train.idx", "sequence 1", "uint8"});

  const uint64_t n = *reinterpret_cast<const uint64_t*>(bytes.data() + 18);
  ASSERT_GE(n, 2u);
  const size_t pointer1 = 34 + 4 * n + 8;  // sequence 1's pointer (i64)
  auto with_pointer1_moved = [&](int64_t by) {
    std::string changed = bytes;
    int64_t pointer = 0;
    std::memcpy(&pointer, changed.data() + pointer1, 8);
    pointer += by;
    std::memcpy(changed.data() + pointer1, &pointer, 8);
    return changed;
  };
  write_text(idx, with_pointer1_moved(1));
  expect_failure_naming(run_loom("train " + write_config("m")), {"c_train.idx", "sequence 1", "not a multiple"});
  write_text(idx, with_pointer1_moved(-2));
  expect_failure_naming(run_loom("train " + write_config("o")), {"c_train.idx", "sequence 1", "overlaps sequence 0"});

  write_text(dir / "blob.bin", std::string("\x7f" "ELF\0\0\xff\xfe", 8));
  CommandResult binary = run_loom("data prepare " + (dir / "blob.bin") + " --output " + (dir / "b/b"));
  EXPECT_EQ(binary.exit_code, 0) << binary.output;
  EXPECT_NE(binary.output.find("warning: input '" + (dir / "blob.bin") + "' is not UTF-8 text"), std::string::npos)
      << binary.output;

  write_text(dir / "one.txt", "One short paragraph.\n");
  CommandResult no_val = run_loom("data prepare " + (dir / "one.txt") + " --val-fraction 0.01 --output " + (dir / "e/e"));
  EXPECT_NE(no_val.output.find("validation split '" + (dir / "e/e") + "_val' is empty"), std::string::npos) << no_val.output;
  EXPECT_NE(no_val.output.find("val fraction 0.01"), std::string::npos) << no_val.output;
  CommandResult no_train = run_loom("data prepare " + (dir / "one.txt") + " --val-fraction 1 --output " + (dir / "f/f"));
  EXPECT_NE(no_train.output.find("train split '" + (dir / "f/f") + "_train' is empty"), std::string::npos)
      << no_train.output;
}

// Item 16: --version, defaults in help, YAML tabs, the working directory of relative paths.
TEST_F(UserInputCli, VersionHelpDefaultsTabsAndRelativePaths) {
  CommandResult version = run_loom("--version");
  EXPECT_EQ(version.exit_code, 0) << version.output;
  EXPECT_EQ(version.output.rfind("loom 0.", 0), 0u) << version.output;

  CommandResult help = run_loom("generate --help");
  for (const char* shown : {"=100", "=1", "=0"}) EXPECT_NE(help.output.find(shown), std::string::npos) << help.output;
  CommandResult prepare_help = run_loom("data prepare --help");
  for (const char* shown : {"=0.02", "=1234"}) EXPECT_NE(prepare_help.output.find(shown), std::string::npos);

  const std::string tabbed = dir / "tabbed.yaml";
  write_text(tabbed, "train:\n  steps: 2\nmodel:\n\td_model: 32\n");
  expect_failure_naming(run_loom("train " + tabbed), {"tabbed.yaml:4", "tabs are not allowed"});

  CommandResult relative = run_loom("train " + write_config("rel") + " data.train_prefix=no/such/prefix");
  expect_failure_naming(relative, {"no/such/prefix.idx", "working directory '" + fs::current_path().string() + "'"});
}

}  // namespace
}  // namespace loom::testing
