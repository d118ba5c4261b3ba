// hf:<dir> tokenizers: special and added tokens, the post-processor as an option, the EOS from
// tokenizer_config.json, and errors naming the file and the unsupported component. (Encodings are
// compared with the Rust tokenizers library by tests/scripts/hf/compare_tokenizers.mjs.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "loom/core/atomic_file.h"
#include "loom/core/error.h"
#include "loom/core/tokenizer_names.h"
#include "loom/data/chat_template/chat_template.h"
#include "loom/data/tokenizer.h"
#include "support/test_paths.h"

namespace loom::data {
namespace {

namespace fs = std::filesystem;

std::string hf_dir(const std::string& name) {
  const fs::path dir = fs::path(loom::test_paths::data_dir()) / "hf" / name;
  if (!fs::is_regular_file(dir / "tokenizer.json"))
    throw Error(dir.string() + " missing; run scripts/setup.sh to fetch the verified data");
  return dir.string();
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(HfTokenizer, SpecialTokensPostProcessorAndEos) {
  auto qwen = make_tokenizer("hf:" + hf_dir("qwen3"));
  EXPECT_EQ(qwen->vocab_size(), 151669);
  EXPECT_EQ(qwen->special_token_id("<|im_end|>"), 151645);
  EXPECT_EQ(qwen->eot_token(), 151645);  // tokenizer_config.json's eos_token
  const std::string text = "<|im_start|>user\nhi<|im_end|>";
  const std::vector<int32_t> parsed = qwen->encode(text, EncodeOptions{});
  EXPECT_EQ(parsed.front(), 151644);
  EXPECT_EQ(parsed.back(), 151645);
  const std::vector<int32_t> plain = qwen->encode(text);  // special strings as plain text
  EXPECT_GT(plain.size(), parsed.size());
  EXPECT_EQ(qwen->decode(plain), text);
  EXPECT_EQ(qwen->decode(parsed), text);

  auto llama2 = make_tokenizer("hf:" + hf_dir("llama2"));
  const std::vector<int32_t> with_bos = llama2->encode("Hello", EncodeOptions{.add_special_tokens = true});
  const std::vector<int32_t> without = llama2->encode("Hello", EncodeOptions{});
  ASSERT_EQ(with_bos.size(), without.size() + 1);
  EXPECT_EQ(with_bos.front(), 1);
  EXPECT_EQ(llama2->eot_token(), 2);
  std::string message = error_of([&] { llama2->chat_template(); });
  EXPECT_NE(message.find("no 'chat_template'"), std::string::npos) << message;

  auto llama3 = make_tokenizer("hf:" + hf_dir("llama3"));
  EXPECT_EQ(llama3->vocab_size(), 128256);
  EXPECT_EQ(llama3->chat_template()->bos_token, "<|begin_of_text|>");
}

class HfTokenizerErrors : public ::testing::Test {
 protected:
  void SetUp() override { fs::create_directories(dir); }
  void TearDown() override { fs::remove_all(dir); }

  // A minimal byte-level BPE tokenizer.json with `patch` merged in.
  void write(const nlohmann::json& patch) {
    nlohmann::json vocab = nlohmann::json::object();
    for (int c = 33; c < 127; ++c) vocab[std::string(1, static_cast<char>(c))] = c - 33;
    nlohmann::json spec = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}},
                           {"pre_tokenizer", {{"type", "ByteLevel"}}},
                           {"decoder", {{"type", "ByteLevel"}}}};
    spec.merge_patch(patch);
    write_file_atomic((dir / "tokenizer.json").string(), spec.dump());
  }
  std::string load_error() { return error_of([&] { make_tokenizer("hf:" + dir.string()); }); }

  fs::path dir = fs::temp_directory_path() / ("loom-hf-" + std::to_string(::getpid()));
};

TEST_F(HfTokenizerErrors, NameTheFileAndTheComponent) {
  std::string message = error_of([&] { make_tokenizer("hf:" + (dir / "absent").string()); });
  EXPECT_NE(message.find("is not a directory"), std::string::npos) << message;
  message = load_error();
  EXPECT_NE(message.find("has neither tokenizer.json nor tokenizer.model"), std::string::npos) << message;

  write({{"model", {{"type", "WordPiece"}}}});
  message = load_error();
  EXPECT_NE(message.find("tokenizer.json: model \"WordPiece\" is not supported"), std::string::npos) << message;
  write({{"pre_tokenizer", {{"type", "BertPreTokenizer"}}}});
  message = load_error();
  EXPECT_NE(message.find("pre-tokenizer \"BertPreTokenizer\" is not supported"), std::string::npos) << message;
  write({{"normalizer", {{"type", "BertNormalizer"}}}});
  message = load_error();
  EXPECT_NE(message.find("normalizer \"BertNormalizer\" is not supported"), std::string::npos) << message;
  write({{"decoder", {{"type", "WordPiece"}}}});
  message = load_error();
  EXPECT_NE(message.find("decoder \"WordPiece\" is not supported"), std::string::npos) << message;
  write({{"post_processor", {{"type", "BertProcessing"}}}});
  message = load_error();
  EXPECT_NE(message.find("post-processor \"BertProcessing\" is not supported"), std::string::npos) << message;
  write({{"model", {{"merges", {"! nope"}}}}});
  message = load_error();
  EXPECT_NE(message.find("merge 0 uses a token missing from the vocabulary"), std::string::npos) << message;
  write({{"model", {{"ignore_merges", "yes"}}}});
  message = load_error();
  EXPECT_NE(message.find("tokenizer.json: model.ignore_merges is a JSON string; expected true or false"),
            std::string::npos) << message;
  for (const nlohmann::json& id : {nlohmann::json(-5), nlohmann::json(int64_t{1} << 40), nlohmann::json("7")}) {
    write({{"added_tokens", {{{"id", id}, {"content", "<x>"}, {"special", true}}}}});
    message = load_error();
    EXPECT_NE(message.find("needs an id that is a non-negative integer below 2^30"), std::string::npos) << message;
  }
  // An id far past the vocabulary's entries (it would size the token table by itself).
  write({{"model", {{"vocab", {{"!", (1 << 30) - 1}}}}}});
  message = load_error();
  EXPECT_NE(message.find("model.vocab['!'] = 1073741823 is far past the vocabulary's 94 entries (ids must be below "
                         "65630)"),
            std::string::npos)
      << message;
  // A value of another JSON type inside a section names the section.
  const std::vector<std::pair<const char*, nlohmann::json>> mistyped = {
      {"normalizer", {{"type", "Replace"}, {"pattern", {{"String", 5}}}, {"content", "x"}}},
      {"pre_tokenizer", {{"type", "Split"}, {"pattern", {{"String", 5}}}, {"behavior", "Isolated"}}},
      {"decoder", {{"type", "Replace"}, {"pattern", {{"String", "a"}}}, {"content", 5}}},
      {"post_processor", {{"type", "TemplateProcessing"}, {"single", {{{"SpecialToken", {{"id", 5}}}}}}}}};
  for (const auto& [section, spec] : mistyped) {
    write({{section, spec}});
    message = load_error();
    EXPECT_NE(message.find(std::string("tokenizer.json: '") + section + "' has an unexpected structure"),
              std::string::npos)
        << message;
  }
  write({{"added_tokens", {{{"id", 200}, {"content", 5}}}}});
  message = load_error();
  EXPECT_NE(message.find("tokenizer.json: 'added_tokens' has an unexpected structure"), std::string::npos) << message;
}

// A minimal SentencePiece tokenizer.model, its protobuf written by hand: a unigram model of
// <unk> (0), <s> (1), </s> (2), the word boundary and the letters a-z.
std::string sentencepiece_model() {
  // A field of length-delimited bytes (wire type 2) with field number 1.
  auto field = [](const std::string& bytes) { return std::string{'\x0a', static_cast<char>(bytes.size())} + bytes; };
  auto piece = [&](const std::string& text, float score, char type) {
    char bytes[sizeof score];
    std::memcpy(bytes, &score, sizeof score);
    return field(field(text) + '\x15' + std::string(bytes, sizeof bytes) + std::string{'\x18', type});
  };
  std::string model = piece("<unk>", 0, 2) + piece("<s>", 0, 3) + piece("</s>", 0, 3) + piece("\u2581", -1, 1);
  for (char c = 'a'; c <= 'z'; ++c) model += piece(std::string(1, c), -2.0f - static_cast<float>(c - 'a'), 1);
  return model;
}

TEST_F(HfTokenizerErrors, TokenizerConfigKeysOfAnotherTypeAreNamed) {
  const std::string config = (dir / "tokenizer_config.json").string();
  write(nlohmann::json::object());
  write_file_atomic(config, R"({"bos_token": ["<s>"]})");
  std::string message = load_error();
  EXPECT_NE(message.find(config + ": bos_token is a JSON array; expected the token's text"), std::string::npos)
      << message;
  write_file_atomic(config, R"({"eos_token": {"text": "!"}})");
  message = load_error();
  EXPECT_NE(message.find(config + ": eos_token is an object without a string 'content'"), std::string::npos) << message;

  // SentencePiece's tokenizer.model takes add_bos_token, add_eos_token and added_tokens_decoder.
  fs::remove(dir / "tokenizer.json");
  write_file_atomic((dir / "tokenizer.model").string(), sentencepiece_model());
  const std::pair<const char*, const char*> cases[] = {
      {R"({"add_bos_token": "yes"})", ": add_bos_token is a JSON string; expected true or false"},
      {R"({"add_eos_token": 1})", ": add_eos_token is a JSON number; expected true or false"},
      {R"({"added_tokens_decoder": []})", ": added_tokens_decoder is a JSON array; expected an object"},
      {R"({"added_tokens_decoder": {"1": "<s>"}})", ": added_tokens_decoder['1'] is a JSON string; expected an object"},
      {R"({"added_tokens_decoder": {"1": {"special": true}}})", ": added_tokens_decoder['1'].content is missing"},
      {R"({"added_tokens_decoder": {"1": {"content": "<s>", "special": 1}}})",
       ": added_tokens_decoder['1'].special is a JSON number; expected true or false"},
      {R"({"added_tokens_decoder": {"1": {"content": "<s>", "lstrip": "no"}}})",
       ": added_tokens_decoder['1'].lstrip is a JSON string; expected true or false"},
  };
  for (const auto& [text, expected] : cases) {
    write_file_atomic(config, text);
    message = load_error();
    EXPECT_NE(message.find(config + expected), std::string::npos) << text << ": " << message;
  }
  write_file_atomic(config,
                    R"({"add_bos_token": true, "added_tokens_decoder": {"1": {"content": "<s>", "special": true}}})");
  auto tokenizer = make_tokenizer("hf:" + dir.string());
  EXPECT_EQ(tokenizer->encode("ab", EncodeOptions{.add_special_tokens = true}), (std::vector<int32_t>{1, 3, 4, 5}));
}

TEST(HfTokenizerNames, AcceptedWhereverATokenizerIsNamed) {
  EXPECT_TRUE(is_valid_tokenizer_name("hf:/models/llama"));
  EXPECT_FALSE(is_valid_tokenizer_name("hf:"));
  EXPECT_FALSE(is_valid_tokenizer_name("hf/models"));
  EXPECT_NE(known_tokenizer_list().find("hf:<dir>"), std::string::npos);
}

}  // namespace
}  // namespace loom::data
