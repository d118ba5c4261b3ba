#include "loom/data/indexed_dataset.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "loom/core/atomic_file.h"
#include "loom/core/error.h"

namespace loom::data {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test, removed afterwards.
class IndexedDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("loom_idx_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string prefix(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

template <class T>
void put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof value);
}

// The .idx bytes as Megatron's _IndexWriter lays them out, built field by field.
std::string megatron_idx(uint8_t code, const std::vector<int32_t>& lengths, const std::vector<int64_t>& pointers,
                         const std::vector<int64_t>& documents) {
  std::string out("MMIDIDX\0\0", 9);
  put<uint64_t>(out, 1);
  put<uint8_t>(out, code);
  put<uint64_t>(out, lengths.size());
  put<uint64_t>(out, documents.size());
  for (int32_t v : lengths) put(out, v);
  for (int64_t v : pointers) put(out, v);
  for (int64_t v : documents) put(out, v);
  return out;
}

void write_raw(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string error_of(const std::string& prefix) {
  try {
    IndexedDataset::open(prefix);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

std::vector<std::vector<int32_t>> sample_documents(int32_t max_token) {
  std::vector<std::vector<int32_t>> docs = {{5, 0, max_token}, {}, {1}, {}};
  std::vector<int32_t> long_doc(1000);
  for (size_t i = 0; i < long_doc.size(); ++i) long_doc[i] = static_cast<int32_t>((i * 7919) % (max_token + 1));
  docs.push_back(long_doc);
  return docs;
}

void write_dataset(const std::string& prefix, TokenDType dtype, const std::vector<std::vector<int32_t>>& docs) {
  IndexedDatasetWriter writer(prefix, dtype);
  for (const auto& doc : docs) writer.add_document(doc);
  writer.finish();
}

void expect_round_trip(const std::string& prefix, TokenDType dtype, int32_t max_token) {
  auto docs = sample_documents(max_token);
  write_dataset(prefix, dtype, docs);
  IndexedDataset ds = IndexedDataset::open(prefix);
  EXPECT_EQ(ds.dtype(), dtype);
  ASSERT_EQ(ds.num_sequences(), static_cast<int64_t>(docs.size()));
  EXPECT_EQ(ds.num_documents(), static_cast<int64_t>(docs.size()));
  std::vector<int32_t> stream;
  for (size_t i = 0; i < docs.size(); ++i) {
    EXPECT_EQ(ds.sequence(static_cast<int64_t>(i)), docs[i]) << "sequence " << i;
    EXPECT_EQ(ds.document_index(static_cast<int64_t>(i)), static_cast<int64_t>(i));
    stream.insert(stream.end(), docs[i].begin(), docs[i].end());
  }
  EXPECT_EQ(ds.document_index(ds.num_documents()), ds.num_sequences());
  EXPECT_EQ(ds.total_tokens(), static_cast<int64_t>(stream.size()));
  // A window straddling sequence boundaries reads the concatenated stream.
  std::vector<int32_t> window(6);
  ds.read_tokens(1, 6, window.data());
  EXPECT_EQ(window, std::vector<int32_t>(stream.begin() + 1, stream.begin() + 7));
  EXPECT_EQ(fs::file_size(bin_path(prefix)), stream.size() * token_dtype_size(dtype));
}

TEST_F(IndexedDatasetTest, RoundTripsUInt16) { expect_round_trip(prefix("u16"), TokenDType::kUInt16, 65535); }

TEST_F(IndexedDatasetTest, RoundTripsInt32) { expect_round_trip(prefix("i32"), TokenDType::kInt32, 200000); }

TEST_F(IndexedDatasetTest, DtypeForVocabFollowsMegatron) {
  EXPECT_EQ(dtype_for_vocab(256), TokenDType::kUInt16);
  EXPECT_EQ(dtype_for_vocab(50257), TokenDType::kUInt16);
  EXPECT_EQ(dtype_for_vocab(65499), TokenDType::kUInt16);
  EXPECT_EQ(dtype_for_vocab(65500), TokenDType::kInt32);
  EXPECT_EQ(dtype_for_vocab(100277), TokenDType::kInt32);
  EXPECT_THROW(dtype_for_vocab(0), Error);
}

TEST_F(IndexedDatasetTest, WritesMegatronLayoutByteForByte) {
  const std::string p = prefix("tiny");
  write_dataset(p, TokenDType::kUInt16, {{1, 2, 3}, {4, 5}});
  // document_indices = [0, 1, 2]: a leading 0, then each document's end (one sequence each).
  std::string expected_idx = megatron_idx(8, {3, 2}, {0, 6}, {0, 1, 2});
  EXPECT_EQ(expected_idx.size(), 34u + 2 * 4 + 2 * 8 + 3 * 8);
  EXPECT_EQ(read_file(idx_path(p)), expected_idx);
  EXPECT_EQ(read_file(bin_path(p)), std::string("\1\0\2\0\3\0\4\0\5\0", 10));

  // Hand-checked header bytes, in case the builder above shared a mistake with the writer.
  std::string idx = read_file(idx_path(p));
  EXPECT_EQ(idx.substr(0, 18), std::string("MMIDIDX\0\0\1\0\0\0\0\0\0\0\x08", 18));
}

TEST_F(IndexedDatasetTest, EmptyDatasetRoundTrips) {
  const std::string p = prefix("empty");
  write_dataset(p, TokenDType::kUInt16, {});
  EXPECT_EQ(read_file(idx_path(p)), megatron_idx(8, {}, {}, {0}));
  IndexedDataset ds = IndexedDataset::open(p);
  EXPECT_EQ(ds.num_sequences(), 0);
  EXPECT_EQ(ds.num_documents(), 0);
  EXPECT_EQ(ds.total_tokens(), 0);
}

TEST_F(IndexedDatasetTest, ReadsSequencesStoredOutOfOrder) {
  // Megatron's format allows any pointers; the stream follows sequence order, not file order.
  const std::string p = prefix("shuffled");
  std::string bin;
  for (int32_t v : {40, 41, 10, 11, 12, 30}) put(bin, v);
  write_raw(bin_path(p), bin);
  // Sequence 0 = {10,11,12} at byte 8, sequence 1 = {30} at 20, sequence 2 = {40,41} at 0.
  write_raw(idx_path(p), megatron_idx(4, {3, 1, 2}, {8, 20, 0}, {0, 2, 3}));
  IndexedDataset ds = IndexedDataset::open(p);
  EXPECT_EQ(ds.num_documents(), 2);
  EXPECT_EQ(ds.total_tokens(), 6);
  EXPECT_EQ(ds.sequence(2), (std::vector<int32_t>{40, 41}));
  std::vector<int32_t> all(6);
  ds.read_tokens(0, 6, all.data());
  EXPECT_EQ(all, (std::vector<int32_t>{10, 11, 12, 30, 40, 41}));
  std::vector<int32_t> middle(3);
  ds.read_tokens(2, 3, middle.data());
  EXPECT_EQ(middle, (std::vector<int32_t>{12, 30, 40}));
}

TEST_F(IndexedDatasetTest, WriterRejectsTokensOutsideDtype) {
  IndexedDatasetWriter writer(prefix("narrow"), TokenDType::kUInt16);
  std::vector<int32_t> doc = {1, 70000};
  try {
    writer.add_document(doc);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("70000"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("uint16"), std::string::npos) << e.what();
  }
  EXPECT_THROW(IndexedDatasetWriter(prefix("f"), TokenDType::kFloat32), Error);
}

TEST_F(IndexedDatasetTest, UnfinishedWriterLeavesNothing) {
  {
    IndexedDatasetWriter writer(prefix("abandoned"), TokenDType::kInt32);
    std::vector<int32_t> doc = {1, 2, 3};
    writer.add_document(doc);
  }
  EXPECT_TRUE(fs::is_empty(dir_));
}

TEST_F(IndexedDatasetTest, MissingFileIsNamed) {
  const std::string p = prefix("missing");
  std::string message = error_of(p);
  EXPECT_NE(message.find(idx_path(p)), std::string::npos) << message;
  write_dataset(p, TokenDType::kUInt16, {{1, 2}});
  fs::remove(bin_path(p));
  message = error_of(p);
  EXPECT_NE(message.find(bin_path(p)), std::string::npos) << message;
}

TEST_F(IndexedDatasetTest, TruncatedIndexSaysExpectedBytes) {
  const std::string p = prefix("truncated");
  write_dataset(p, TokenDType::kUInt16, {{1, 2, 3}, {4, 5}});
  const uintmax_t full = fs::file_size(idx_path(p));
  fs::resize_file(idx_path(p), full - 3);
  std::string message = error_of(p);
  EXPECT_NE(message.find(idx_path(p)), std::string::npos) << message;
  EXPECT_NE(message.find("expected " + std::to_string(full)), std::string::npos) << message;
  EXPECT_NE(message.find(std::to_string(full - 3)), std::string::npos) << message;

  fs::resize_file(idx_path(p), 20);  // inside the header
  message = error_of(p);
  EXPECT_NE(message.find(idx_path(p)), std::string::npos) << message;
  EXPECT_NE(message.find("truncated"), std::string::npos) << message;
}

TEST_F(IndexedDatasetTest, BadMagicVersionAndDtypeAreRejected) {
  const std::string p = prefix("bad");
  write_dataset(p, TokenDType::kUInt16, {{1, 2, 3}});
  const std::string good = read_file(idx_path(p));

  std::string bad = good;
  bad[0] = 'X';
  write_raw(idx_path(p), bad);
  std::string message = error_of(p);
  EXPECT_NE(message.find(idx_path(p)), std::string::npos) << message;
  EXPECT_NE(message.find("MMIDIDX"), std::string::npos) << message;

  bad = good;
  bad[9] = 2;
  write_raw(idx_path(p), bad);
  message = error_of(p);
  EXPECT_NE(message.find("version 2"), std::string::npos) << message;

  bad = good;
  bad[17] = 42;
  write_raw(idx_path(p), bad);
  message = error_of(p);
  EXPECT_NE(message.find("dtype code 42"), std::string::npos) << message;

  bad = good;
  bad[17] = 7;  // float32: a valid Megatron code, but not a token type
  write_raw(idx_path(p), bad);
  message = error_of(p);
  EXPECT_NE(message.find("float32"), std::string::npos) << message;
}

TEST_F(IndexedDatasetTest, BinSizeMustMatchIndex) {
  const std::string p = prefix("short_bin");
  write_dataset(p, TokenDType::kUInt16, {{1, 2, 3}, {4, 5}});
  fs::resize_file(bin_path(p), 8);
  std::string message = error_of(p);
  EXPECT_NE(message.find(bin_path(p)), std::string::npos) << message;
  EXPECT_NE(message.find("too short"), std::string::npos) << message;

  fs::resize_file(bin_path(p), 12);  // two bytes more than the index describes
  message = error_of(p);
  EXPECT_NE(message.find(bin_path(p)), std::string::npos) << message;
  EXPECT_NE(message.find("10 bytes"), std::string::npos) << message;
}

TEST_F(IndexedDatasetTest, DocumentIndicesAreValidated) {
  const std::string p = prefix("docs");
  write_raw(bin_path(p), std::string("\1\0\2\0", 4));
  write_raw(idx_path(p), megatron_idx(8, {1, 1}, {0, 2}, {0, 1}));  // must end at 2
  std::string message = error_of(p);
  EXPECT_NE(message.find("expected the sequence count 2"), std::string::npos) << message;
}

TEST_F(IndexedDatasetTest, OutOfRangeAccessThrows) {
  const std::string p = prefix("range");
  write_dataset(p, TokenDType::kInt32, {{1, 2, 3}});
  IndexedDataset ds = IndexedDataset::open(p);
  std::vector<int32_t> out(4);
  EXPECT_THROW(ds.sequence(1), Error);
  EXPECT_THROW(ds.read_tokens(0, 4, out.data()), Error);
  EXPECT_THROW(ds.read_tokens(-1, 1, out.data()), Error);
}

}  // namespace
}  // namespace loom::data
