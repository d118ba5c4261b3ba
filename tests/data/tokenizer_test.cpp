#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <random>
#include <sstream>

#include "loom/core/atomic_file.h"
#include "loom/core/error.h"
#include "loom/data/tokenizer.h"
#include "support/test_paths.h"

namespace loom::data {
namespace {

namespace fs = std::filesystem;

const std::string kSetupHint = "run scripts/setup.sh to fetch the verified data into " + loom::test_paths::data_dir();

// Absent data is a failure, not a skip: the suite must not pass without the reference vectors.
std::unique_ptr<Tokenizer> load(const std::string& name) {
  if (!fs::is_directory(fs::path(loom::test_paths::data_dir()) / "gpt-tokenizer"))
    throw Error("tokenizer data missing; " + kSetupHint);
  return make_tokenizer(name);
}

struct TestVector {
  std::string encoding;
  std::string sample;
  std::vector<int32_t> ids;
  int line;
};

// gpt-tokenizer's TestPlans.txt: blocks of "EncodingName: X", "Sample: TEXT" (TEXT may continue
// over further lines, joined by '\n'), "Encoded: [id, id, ...]", separated by blank lines.
std::vector<TestVector> read_test_plans() {
  const fs::path path = fs::path(loom::test_paths::data_dir()) / "gpt-tokenizer" / "TestPlans.txt";
  if (!fs::is_regular_file(path)) throw Error(path.string() + " missing; " + kSetupHint);
  std::istringstream in(read_file(path.string()));
  std::vector<TestVector> vectors;
  TestVector current;
  bool in_sample = false;
  std::string line;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    auto after = [&](std::string_view prefix) {
      return line.compare(0, prefix.size(), prefix) == 0 ? line.substr(prefix.size()) : std::string();
    };
    if (line.starts_with("EncodingName: ")) {
      current = TestVector{after("EncodingName: "), "", {}, line_no};
    } else if (line.starts_with("Sample: ")) {
      current.sample = after("Sample: ");
      in_sample = true;
    } else if (line.starts_with("Encoded: [")) {
      std::string list = after("Encoded: [");
      LOOM_CHECK(list.ends_with("]"), path.string() + " line " + std::to_string(line_no) + ": expected ']'");
      list.pop_back();
      std::istringstream numbers(list);
      for (std::string item; std::getline(numbers, item, ',');) current.ids.push_back(std::stoi(item));
      vectors.push_back(current);
      in_sample = false;
    } else if (in_sample) {
      current.sample += "\n" + line;
    }
  }
  return vectors;
}

TEST(Tokenizer, MatchesEveryGptTokenizerTestVector) {
  std::vector<TestVector> vectors = read_test_plans();
  ASSERT_EQ(vectors.size(), 313u) << "TestPlans.txt changed; " << kSetupHint;
  std::map<std::string, std::unique_ptr<Tokenizer>> tokenizers;
  for (const TestVector& v : vectors) {
    auto& tok = tokenizers[v.encoding];
    if (!tok) tok = load(v.encoding);
    std::vector<int32_t> ids = tok->encode(v.sample);
    EXPECT_EQ(ids, v.ids) << v.encoding << " sample at TestPlans.txt line " << v.line << ": " << v.sample;
    EXPECT_EQ(tok->decode(ids), v.sample) << v.encoding << " line " << v.line;
  }
  EXPECT_EQ(tokenizers.size(), 5u);  // r50k_base, p50k_base, p50k_edit, cl100k_base, o200k_base
}

TEST(Tokenizer, SizesAndSpecialTokens) {
  struct Expected {
    const char* name;
    const char* encoding;
    int32_t vocab;
    int32_t eot;
  };
  for (const Expected& e : {Expected{"gpt2", "r50k_base", 50257, 50256}, Expected{"r50k_base", "r50k_base", 50257, 50256},
                            Expected{"p50k_edit", "p50k_edit", 50284, 50256},
                            Expected{"cl100k_base", "cl100k_base", 100277, 100257},
                            Expected{"o200k_base", "o200k_base", 200019, 199999}}) {
    auto tok = load(e.name);
    EXPECT_EQ(tok->name(), e.encoding);
    EXPECT_EQ(tok->vocab_size(), e.vocab) << e.name;
    EXPECT_EQ(tok->eot_token(), e.eot) << e.name;
    std::vector<int32_t> eot = {e.eot};
    EXPECT_EQ(tok->decode(eot), "<|endoftext|>") << e.name;
    // encode treats special-token text as ordinary text.
    std::vector<int32_t> ids = tok->encode("a<|endoftext|>b");
    EXPECT_EQ(std::count(ids.begin(), ids.end(), e.eot), 0) << e.name;
    EXPECT_EQ(tok->decode(ids), "a<|endoftext|>b") << e.name;
    EXPECT_THROW(tok->decode(std::vector<int32_t>{e.vocab}), Error) << e.name;
    EXPECT_THROW(tok->decode(std::vector<int32_t>{-1}), Error) << e.name;
  }
  auto cl100k = load("cl100k_base");
  std::vector<int32_t> specials = {100258, 100259, 100260, 100276};
  EXPECT_EQ(cl100k->decode(specials), "<|fim_prefix|><|fim_middle|><|fim_suffix|><|endofprompt|>");
  EXPECT_THROW(cl100k->decode(std::vector<int32_t>{100261}), Error);  // unused id between specials
  EXPECT_EQ(load("o200k_base")->decode(std::vector<int32_t>{200018}), "<|endofprompt|>");
}

TEST(Tokenizer, RoundTripsArbitraryBytes) {
  std::mt19937 rng(1234);
  std::string bytes(5000, '\0');
  for (char& c : bytes) c = static_cast<char>(rng() & 0xff);
  // Mixed with text, so invalid UTF-8 meets letters, digits and spaces.
  std::string mixed = "Hello, world 123\n\n  \t" + bytes.substr(0, 100) + " caf\xc3\xa9 \xe2\x82" + bytes.substr(100);
  for (const char* name : {"gpt2", "cl100k_base", "o200k_base"}) {
    auto tok = load(name);
    for (const std::string& text : {bytes, mixed}) EXPECT_EQ(tok->decode(tok->encode(text)), text) << name;
  }
  auto byte = make_tokenizer("byte");
  EXPECT_EQ(byte->name(), "byte");
  EXPECT_EQ(byte->vocab_size(), 256);
  EXPECT_EQ(byte->eot_token(), 0);
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  std::vector<int32_t> ids = byte->encode(all + bytes);
  ASSERT_EQ(ids.size(), 256 + bytes.size());
  for (int b = 0; b < 256; ++b) EXPECT_EQ(ids[static_cast<size_t>(b)], b);
  EXPECT_EQ(byte->decode(ids), all + bytes);
  EXPECT_THROW(byte->decode(std::vector<int32_t>{256}), Error);
}

// tiktoken's \s is Unicode White_Space, which U+180E (MONGOLIAN VOWEL SEPARATOR) left in Unicode
// 6.3; PCRE2's own \s still takes it. As punctuation it joins the space before it: " \u180E" is
// one piece, whose first two bytes " \xe1" merge into 28053.
TEST(Tokenizer, SplitsOnUnicodeWhiteSpaceAsTiktokenDoes) {
  auto tok = load("gpt2");
  EXPECT_EQ(tok->encode(" \xe1\xa0\x8ex"), (std::vector<int32_t>{28053, 254, 236, 87}));
  EXPECT_EQ(tok->encode("\xc2\x85\x61"), (std::vector<int32_t>{126, 227, 64}));  // U+0085 is white space
}

TEST(Tokenizer, LongPiecesStayFast) {
  auto tok = load("gpt2");
  // One piece of 200k letters, one of 200k digits, and megabyte whitespace runs (which the split
  // patterns backtrack over): all must round-trip, without quadratic time or regex stack limits.
  for (const std::string& text : {std::string(200000, 'a'), std::string(200000, '7'),
                                  std::string(1 << 20, ' ') + "x" + std::string(1 << 20, '\n')}) {
    std::vector<int32_t> ids = tok->encode(text);
    EXPECT_LT(ids.size(), text.size());
    EXPECT_EQ(tok->decode(ids), text);
  }
}

class TempDir {
 public:
  TempDir() : path_(fs::path(testing::TempDir()) / ("loom-tokenizer-" + std::to_string(::getpid()))) {
    fs::remove_all(path_);
    fs::create_directories(path_ / "gpt-tokenizer");
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no loom::Error thrown)";
}

TEST(Tokenizer, RankFileWithWrongHashIsRejected) {
  load("gpt2");  // the data is there
  TempDir dir;
  std::string ranks = read_file((fs::path(loom::test_paths::data_dir()) / "gpt-tokenizer" / "r50k_base.tiktoken").string());
  ranks[0] = ranks[0] == 'I' ? 'J' : 'I';
  const std::string copy = (dir.path() / "gpt-tokenizer" / "r50k_base.tiktoken").string();
  write_file_atomic(copy, ranks);
  std::string message = error_of([&] { make_tokenizer("gpt2", dir.path().string()); });
  EXPECT_NE(message.find(copy), std::string::npos) << message;
  EXPECT_NE(message.find("306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"), std::string::npos)
      << message;
  EXPECT_NE(message.find("scripts/setup.sh"), std::string::npos) << message;

  message = error_of([&] { make_tokenizer("cl100k_base", dir.path().string()); });
  EXPECT_NE(message.find("cl100k_base.tiktoken"), std::string::npos) << message;
  EXPECT_NE(message.find("not found"), std::string::npos) << message;
  EXPECT_NE(message.find("scripts/setup.sh"), std::string::npos) << message;
}

TEST(Tokenizer, UnknownNameListsValidNames) {
  std::string message = error_of([] { make_tokenizer("gpt5"); });
  EXPECT_NE(message.find("'gpt5'"), std::string::npos) << message;
  for (const std::string& name : tokenizer_names()) EXPECT_NE(message.find(name), std::string::npos) << message;
  EXPECT_EQ(tokenizer_names().front(), "byte");
}

}  // namespace
}  // namespace loom::data
