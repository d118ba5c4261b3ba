#include "loom/data/prepare.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "loom/core/atomic_file.h"
#include "loom/core/error.h"
#include "loom/data/indexed_dataset.h"

#include <nlohmann/json.hpp>
#include <zlib.h>
#include <zstd.h>

namespace loom::data {
namespace {

namespace fs = std::filesystem;

// Byte n -> id n + 1; id 0 is the end-of-text token. Enough to check document structure without
// the real tokenizers.
class ShiftedByteTokenizer : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids;
    ids.reserve(text.size());
    for (unsigned char c : text) ids.push_back(static_cast<int32_t>(c) + 1);
    return ids;
  }
  std::string decode(std::span<const int32_t> ids) const override {
    std::string text;
    for (int32_t id : ids) text.push_back(static_cast<char>(id - 1));
    return text;
  }
  int32_t vocab_size() const override { return 257; }
  int32_t eot_token() const override { return 0; }
  std::string name() const override { return "shifted-byte"; }
};

class PrepareTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("loom_prepare_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "corpus" / "nested");
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream out(dir_ / name, std::ios::binary);
    out << text;
  }

  fs::path dir_;
};

// `count` paragraphs of about `bytes` each, separated by blank lines (one with stray spaces).
std::string paragraphs(const std::string& tag, int count, size_t bytes) {
  std::string text;
  for (int i = 0; i < count; ++i) {
    std::string para = tag + " paragraph " + std::to_string(i) + ":";
    while (para.size() < bytes) para += " lorem ipsum\ndolor";
    text += para + (i % 3 == 1 ? "\n  \n\n" : "\n\n");
  }
  return text;
}

std::vector<std::string> read_documents(const std::string& prefix) {
  IndexedDataset ds = IndexedDataset::open(prefix);
  std::vector<std::string> docs;
  ShiftedByteTokenizer tok;
  for (int64_t i = 0; i < ds.num_sequences(); ++i) {
    std::vector<int32_t> ids = ds.sequence(i);
    EXPECT_FALSE(ids.empty());
    EXPECT_EQ(ids.back(), tok.eot_token()) << "document " << i << " must end with eot";
    ids.pop_back();
    EXPECT_EQ(std::count(ids.begin(), ids.end(), tok.eot_token()), 0) << "eot inside document " << i;
    docs.push_back(tok.decode(ids));
  }
  return docs;
}

TEST(SplitDocuments, MergesParagraphsUntilMinimumSize) {
  std::string text = "\n\n  \nab\ncd\n\nef\r\n \r\ngh\n\n\nij";
  std::vector<std::string_view> docs = split_documents(text, 4);
  ASSERT_EQ(docs.size(), 3u);
  EXPECT_EQ(docs[0], "ab\ncd");
  EXPECT_EQ(docs[1], "ef\r\n \r\ngh");  // "ef" alone is too short: merged with the next paragraph
  EXPECT_EQ(docs[2], "ij");               // a file's last document may be short
  EXPECT_TRUE(split_documents(" \n\t\n").empty());
  EXPECT_EQ(split_documents("one line").size(), 1u);

  std::string big = paragraphs("x", 20, 1000);
  for (std::string_view doc : split_documents(big)) EXPECT_NE(doc.find("paragraph"), std::string::npos);
  std::vector<std::string_view> big_docs = split_documents(big);
  for (size_t i = 0; i + 1 < big_docs.size(); ++i) EXPECT_GE(big_docs[i].size(), kMinDocumentBytes);
  EXPECT_GT(big_docs.size(), 3u);
}

TEST_F(PrepareTest, SplitsDeterministicallyAndKeepsDocumentStructure) {
  write("corpus/b.txt", paragraphs("b", 60, 900));
  write("corpus/a.txt", paragraphs("a", 80, 700));
  write("corpus/nested/c.txt", "short tail file\n");
  write("corpus/ignored.md", "not text input");
  write("single.txt", paragraphs("s", 30, 1500));
  ShiftedByteTokenizer tok;
  const std::vector<std::string> inputs = {path("corpus"), path("single.txt")};
  const uint64_t seed = 5;

  // Expected documents: files in input order, a directory's files sorted by path.
  std::vector<std::string> expected;
  for (const char* name : {"corpus/a.txt", "corpus/b.txt", "corpus/nested/c.txt", "single.txt"}) {
    std::string text = read_file(path(name));
    for (std::string_view doc : split_documents(text)) expected.emplace_back(doc);
  }
  ASSERT_GT(expected.size(), 20u);
  EXPECT_EQ(list_input_files(inputs), (std::vector<std::string>{path("corpus/a.txt"), path("corpus/b.txt"),
                                                                  path("corpus/nested/c.txt"), path("single.txt")}));

  const std::string prefix = path("out/nested/data");
  PrepareStats stats = prepare_dataset(inputs, tok, prefix, 0.3, seed);
  std::vector<std::string> train = read_documents(prefix + "_train");
  std::vector<std::string> val = read_documents(prefix + "_val");

  std::vector<std::string> expected_train, expected_val;
  int64_t expected_train_tokens = 0, expected_val_tokens = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    bool is_val = is_validation_document(seed, static_cast<int64_t>(i), 0.3);
    (is_val ? expected_val : expected_train).push_back(expected[i]);
    (is_val ? expected_val_tokens : expected_train_tokens) += static_cast<int64_t>(expected[i].size()) + 1;
  }
  EXPECT_EQ(train, expected_train);
  EXPECT_EQ(val, expected_val);
  EXPECT_FALSE(val.empty());
  EXPECT_FALSE(train.empty());
  EXPECT_EQ(stats.files, 4);
  EXPECT_EQ(stats.train_documents, static_cast<int64_t>(expected_train.size()));
  EXPECT_EQ(stats.val_documents, static_cast<int64_t>(expected_val.size()));
  EXPECT_EQ(stats.train_tokens, expected_train_tokens);
  EXPECT_EQ(stats.val_tokens, expected_val_tokens);
  EXPECT_EQ(IndexedDataset::open(prefix + "_train").dtype(), TokenDType::kUInt16);

  // Same seed: identical bytes. Another seed: another split of the same documents.
  const std::string again = path("again");
  prepare_dataset(inputs, tok, again, 0.3, seed);
  for (const char* suffix : {"_train.bin", "_train.idx", "_val.bin", "_val.idx"})
    EXPECT_EQ(read_file(prefix + suffix), read_file(again + suffix)) << suffix;
  const std::string reseeded = path("reseeded");
  PrepareStats other = prepare_dataset(inputs, tok, reseeded, 0.3, seed + 1);
  EXPECT_EQ(other.train_documents + other.val_documents, static_cast<int64_t>(expected.size()));
  EXPECT_NE(read_documents(reseeded + "_val"), val);
}

TEST_F(PrepareTest, ValFractionExtremes) {
  write("a.txt", paragraphs("a", 40, 500));
  ShiftedByteTokenizer tok;
  PrepareStats none = prepare_dataset({path("a.txt")}, tok, path("none"), 0.0, 1);
  EXPECT_EQ(none.val_documents, 0);
  EXPECT_GT(none.train_documents, 0);
  EXPECT_EQ(IndexedDataset::open(path("none_val")).num_documents(), 0);
  PrepareStats all = prepare_dataset({path("a.txt")}, tok, path("all"), 1.0, 1);
  EXPECT_EQ(all.train_documents, 0);
  EXPECT_EQ(all.val_documents, none.train_documents);
  EXPECT_THROW(prepare_dataset({path("a.txt")}, tok, path("bad"), 1.5, 1), Error);
}

TEST_F(PrepareTest, MissingInputIsNamed) {
  write("a.txt", "hello\n");
  ShiftedByteTokenizer tok;
  const std::string missing = path("no_such_file.txt");
  try {
    prepare_dataset({path("a.txt"), missing}, tok, path("out"), 0.1, 1);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(path("out_train.idx")));
}

TEST_F(PrepareTest, EmptyInputsAreAnError) {
  write("blank.txt", "\n \n");
  ShiftedByteTokenizer tok;
  EXPECT_THROW(prepare_dataset({path("blank.txt")}, tok, path("out"), 0.1, 1), Error);
  EXPECT_THROW(list_input_files({path("corpus")}), Error);  // a directory without *.txt files
  // Nothing half-written is left behind.
  for (const fs::directory_entry& entry : fs::directory_iterator(dir_))
    EXPECT_EQ(entry.path().filename().string().rfind(".out", 0), std::string::npos) << entry.path();
}

// A JSONL corpus (Megatron's preprocess_data.py input): one document per line, the string of the
// key given, in file order; the same bytes out of .jsonl, .jsonl.zst and .jsonl.gz; a directory
// takes JSONL files beside text files, sorted by path.
TEST_F(PrepareTest, JsonLinesAreOneDocumentPerLine) {
  std::vector<std::string> texts;
  std::string jsonl;
  for (int i = 0; i < 300; ++i) {
    texts.push_back("Document " + std::to_string(i) + " says \"hi\"\n\twith a tab, é and 日本" +
                    std::string(static_cast<size_t>(i % 7) * 50, '.'));
    jsonl += nlohmann::json{{"id", i}, {"text", texts.back()}, {"meta", {{"source", "test"}}}}.dump() + "\n";
    if (i % 50 == 0) jsonl += "\n";  // blank lines are skipped
  }
  jsonl += R"({"id": 300, "text": ""})" "\n";  // an empty text is left out, with a warning
  write("corpus.jsonl", jsonl);
  {
    std::string frame(ZSTD_compressBound(jsonl.size()), '\0');
    frame.resize(ZSTD_compress(frame.data(), frame.size(), jsonl.data(), jsonl.size(), 3));
    write("corpus.jsonl.zst", frame);
    gzFile file = gzopen(path("corpus.json.gz").c_str(), "wb");
    gzwrite(file, jsonl.data(), static_cast<unsigned>(jsonl.size()));
    gzclose(file);
  }
  ShiftedByteTokenizer tok;
  const PrepareStats stats = prepare_dataset({path("corpus.jsonl")}, tok, path("plain"), 0.2, 9);
  std::vector<std::string> want_train, want_val;
  for (size_t i = 0; i < texts.size(); ++i) {
    (is_validation_document(9, static_cast<int64_t>(i), 0.2) ? want_val : want_train).push_back(texts[i]);
  }
  EXPECT_EQ(read_documents(path("plain_train")), want_train);
  EXPECT_EQ(read_documents(path("plain_val")), want_val);
  EXPECT_EQ(stats.bytes, static_cast<int64_t>(jsonl.size()));
  EXPECT_EQ(stats.empty_records, 1);
  ASSERT_EQ(stats.warnings.size(), 1u);
  EXPECT_NE(stats.warnings[0].find("1 JSON line(s) had an empty 'text'"), std::string::npos) << stats.warnings[0];
  for (const char* name : {"corpus.jsonl.zst", "corpus.json.gz"}) {
    prepare_dataset({path(name)}, tok, path("packed"), 0.2, 9);
    for (const char* suffix : {"_train.bin", "_train.idx", "_val.bin", "_val.idx"}) {
      EXPECT_EQ(read_file(path("plain") + suffix), read_file(path("packed") + suffix)) << name << suffix;
    }
  }
  // Another key; a directory of both kinds.
  write("corpus/b.jsonl", R"({"content": "from b"})" "\n");
  write("corpus/a.txt", "from a\n");
  write("corpus/nested/c.jsonl.zst", read_file(path("corpus.jsonl.zst")));
  EXPECT_EQ(list_input_files({path("corpus")}), (std::vector<std::string>{path("corpus/a.txt"), path("corpus/b.jsonl"),
                                                                          path("corpus/nested/c.jsonl.zst")}));
  prepare_dataset({path("corpus/b.jsonl")}, tok, path("content"), 0.0, 1, "content");
  EXPECT_EQ(read_documents(path("content_train")), (std::vector<std::string>{"from b"}));
}

TEST_F(PrepareTest, BadJsonLinesNameTheFileAndLine) {
  ShiftedByteTokenizer tok;
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {R"({"text": "fine"})" "\n" R"({"text": "cut)", {"line 2 is not JSON"}},
      {R"({"text": "fine"})" "\n\n" R"(["text"])", {"line 3 is not a JSON object"}},
      {R"({"body": "x", "id": 1})", {"line 1 has no key 'text' (its keys: body, id)", "--json-key"}},
      {R"({"text": 7})", {"line 1: 'text' is number, not a string"}},
      {"{\"text\": \"bad \xff byte\"}", {"line 1 is not JSON"}},  // not UTF-8
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string name = "bad" + std::to_string(i) + ".jsonl";
    write(name, cases[i].first);
    try {
      prepare_dataset({path(name)}, tok, path("out"), 0.1, 1);
      ADD_FAILURE() << name << ": expected an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("'" + path(name) + "' "), std::string::npos) << e.what();
      for (const std::string& part : cases[i].second) {
        EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
      }
    }
    EXPECT_FALSE(fs::exists(path("out_train.idx"))) << name;
  }
}

}  // namespace
}  // namespace loom::data
