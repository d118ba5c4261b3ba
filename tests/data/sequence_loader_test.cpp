#include "loom/data/sequence_loader.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <thread>

#include "loom/core/error.h"

namespace loom::data {
namespace {

namespace fs = std::filesystem;

constexpr int kSeqLen = 10;

// A dataset whose stream token t has the value t, split into uneven documents, so a sample's
// first token tells which sample it is.
class SequenceLoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("loom_loader_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    prefix_ = (dir_ / "stream").string();
    IndexedDatasetWriter writer(prefix_, TokenDType::kInt32);
    int32_t next = 0;
    for (int length : {1, 333, 17, 0, 650}) {  // 1001 tokens -> (1001 - 1) / 10 = 100 samples
      std::vector<int32_t> doc(static_cast<size_t>(length));
      for (int32_t& token : doc) token = next++;
      writer.add_document(doc);
    }
    writer.finish();
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_;
  std::string prefix_;
};

std::vector<int32_t> read_sample(const SequenceLoader& loader, int64_t g) {
  std::vector<int32_t> tokens(static_cast<size_t>(loader.seq_len()) + 1);
  loader.sample(g, tokens.data());
  return tokens;
}

TEST_F(SequenceLoaderTest, CountsSamples) {
  SequenceLoader loader(prefix_, kSeqLen, 1);
  EXPECT_EQ(loader.num_samples(), 100);
  EXPECT_EQ(SequenceLoader(prefix_, 1000, 1).num_samples(), 1);
}

TEST_F(SequenceLoaderTest, EachEpochIsAPermutationOfContiguousSamples) {
  SequenceLoader loader(prefix_, kSeqLen, 42);
  const int64_t n = loader.num_samples();
  std::vector<int64_t> epoch0, epoch1;
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    std::vector<int> seen(static_cast<size_t>(n), 0);
    for (int64_t p = 0; p < n; ++p) {
      int64_t g = epoch * n + p;
      std::vector<int32_t> tokens = read_sample(loader, g);
      int64_t k = loader.sample_index(g);
      ASSERT_GE(k, 0);
      ASSERT_LT(k, n);
      seen[static_cast<size_t>(k)] += 1;
      for (int t = 0; t <= kSeqLen; ++t) ASSERT_EQ(tokens[static_cast<size_t>(t)], k * kSeqLen + t);
      if (epoch == 0) epoch0.push_back(k);
      if (epoch == 1) epoch1.push_back(k);
    }
    EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; })) << "epoch " << epoch;
  }
  EXPECT_NE(epoch0, epoch1);  // each epoch reshuffles
  std::vector<int64_t> identity(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) identity[static_cast<size_t>(i)] = i;
  EXPECT_NE(epoch0, identity);
}

TEST_F(SequenceLoaderTest, OrderDependsOnlyOnSeedAndGlobalIndex) {
  SequenceLoader fresh(prefix_, kSeqLen, 7);
  const std::vector<int32_t> expected = read_sample(fresh, 257);

  SequenceLoader busy(prefix_, kSeqLen, 7);
  for (int64_t g : {5, 999, 100, 0, 12345, 301, 199}) read_sample(busy, g);  // churn the epoch cache
  EXPECT_EQ(read_sample(busy, 257), expected);
  EXPECT_EQ(read_sample(fresh, 257), expected);

  SequenceLoader other(prefix_, kSeqLen, 8);
  std::vector<int64_t> a, b;
  for (int64_t g = 0; g < other.num_samples(); ++g) {
    a.push_back(fresh.sample_index(g));
    b.push_back(other.sample_index(g));
  }
  EXPECT_NE(a, b);
}

TEST_F(SequenceLoaderTest, PermutationIsAFixedFunction) {
  // Pins the Fisher-Yates + Philox recipe (values from an independent Python model of the
  // documented steps): a silent change would reorder every run's data.
  std::vector<int64_t> perm = epoch_permutation(10, 1234, "data.shuffle", 0);
  EXPECT_EQ(perm, (std::vector<int64_t>{9, 0, 2, 6, 5, 4, 1, 3, 7, 8}));
  EXPECT_NE(perm, epoch_permutation(10, 1234, "data.shuffle", 1));
  EXPECT_NE(perm, epoch_permutation(10, 1234, "sft.shuffle", 0));
  EXPECT_TRUE(epoch_permutation(0, 1, "x", 0).empty());
  EXPECT_EQ(epoch_permutation(1, 1, "x", 0), std::vector<int64_t>{0});
}

TEST_F(SequenceLoaderTest, FillBatchShiftsTargetsByOne) {
  SequenceLoader loader(prefix_, kSeqLen, 3);
  const int batch = 5;
  const int64_t first = 97;  // straddles the end of epoch 0
  std::vector<int32_t> inputs(batch * kSeqLen), targets(batch * kSeqLen);
  loader.fill_batch(first, batch, inputs.data(), targets.data());
  for (int b = 0; b < batch; ++b) {
    std::vector<int32_t> tokens = read_sample(loader, first + b);
    for (int t = 0; t < kSeqLen; ++t) {
      EXPECT_EQ(inputs[b * kSeqLen + t], tokens[static_cast<size_t>(t)]);
      EXPECT_EQ(targets[b * kSeqLen + t], tokens[static_cast<size_t>(t) + 1]);
    }
  }
}

TEST_F(SequenceLoaderTest, DocumentIdsCountTheBoundariesASampleCrosses) {
  // Token t has value t; documents start at 0, 1, 334, 351 (an empty one), 351 and end at 1001.
  const std::vector<int32_t> starts = {0, 1, 334, 351, 351, 1001};
  auto holding = [&](int32_t token) {
    int32_t s = 0;
    for (int32_t i = 0; i + 1 < static_cast<int32_t>(starts.size()); ++i) {
      if (starts[i] <= token) s = i;
    }
    return s;
  };
  SequenceLoader loader(prefix_, kSeqLen, 5);
  const int batch = static_cast<int>(loader.num_samples());
  std::vector<int32_t> inputs(batch * kSeqLen), targets(inputs.size()), documents(inputs.size());
  loader.fill_batch(0, batch, inputs.data(), targets.data());
  loader.fill_documents(0, batch, documents.data());
  int crossing = 0;
  for (int b = 0; b < batch; ++b) {
    const int32_t* row = inputs.data() + b * kSeqLen;
    for (int t = 0; t < kSeqLen; ++t) {
      EXPECT_EQ(documents[b * kSeqLen + t], holding(row[t]) - holding(row[0])) << "sample " << b << " token " << t;
    }
    crossing += documents[b * kSeqLen + kSeqLen - 1] != 0;
  }
  EXPECT_EQ(crossing, 3);  // the samples holding tokens 1, 334 and 351 after their first
  EXPECT_EQ(loader.dataset().stream_start(5), 1001);
  EXPECT_THROW(loader.dataset().sequence_holding(1001), Error);
}

TEST_F(SequenceLoaderTest, ConcurrentReadersSeeTheSerialOrder) {
  SequenceLoader loader(prefix_, kSeqLen, 11);
  const int64_t total = 8 * loader.num_samples();
  std::vector<int64_t> serial(static_cast<size_t>(total));
  {
    SequenceLoader reference(prefix_, kSeqLen, 11);
    for (int64_t g = 0; g < total; ++g) serial[static_cast<size_t>(g)] = reference.sample_index(g);
  }
  std::vector<int64_t> parallel(static_cast<size_t>(total), -1);
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r) {
    // Strided like dp ranks, so the threads sit in different epochs at the same time.
    threads.emplace_back([&, r] {
      for (int64_t g = r; g < total; g += 4) parallel[static_cast<size_t>(g)] = loader.sample_index(g);
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(parallel, serial);
}

TEST_F(SequenceLoaderTest, TooFewTokensNamesPrefixCountAndSeqLen) {
  try {
    SequenceLoader loader(prefix_, 1001, 1);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string message = e.what();
    EXPECT_NE(message.find(prefix_), std::string::npos) << message;
    EXPECT_NE(message.find("1001 tokens"), std::string::npos) << message;
    EXPECT_NE(message.find("seq_len 1001"), std::string::npos) << message;
  }
  EXPECT_THROW(SequenceLoader(prefix_, 0, 1), Error);
  SequenceLoader loader(prefix_, kSeqLen, 1);
  std::vector<int32_t> tokens(kSeqLen + 1);
  EXPECT_THROW(loader.sample(-1, tokens.data()), Error);
}

// A range of sequences (a part of data.split) reads what a dataset of those sequences alone reads:
// the same samples in the same order, with the same document ids, epoch after epoch.
TEST_F(SequenceLoaderTest, ARangeReadsAsADatasetOfItsSequencesAlone) {
  const IndexedDataset whole = IndexedDataset::open(prefix_);
  for (const SequenceRange range :
       {SequenceRange{1, 3}, SequenceRange{2, 5}, SequenceRange{0, 5}, SequenceRange{4, 5}}) {
    SCOPED_TRACE("sequences [" + std::to_string(range.begin) + ", " + std::to_string(range.end) + ")");
    const std::string alone =
        (dir_ / ("alone_" + std::to_string(range.begin) + "_" + std::to_string(range.end))).string();
    IndexedDatasetWriter writer(alone, TokenDType::kInt32);
    for (int64_t i = range.begin; i < range.end; ++i) writer.add_document(whole.sequence(i));
    writer.finish();
    const SequenceLoader part(IndexedDataset::open(prefix_), kSeqLen, 9, range), reference(alone, kSeqLen, 9);
    ASSERT_EQ(part.num_samples(), reference.num_samples());
    EXPECT_EQ(part.range().begin, range.begin);
    const int batch = static_cast<int>(3 * part.num_samples() + 1);  // over three epochs
    const size_t values = static_cast<size_t>(batch) * kSeqLen;
    std::vector<int32_t> inputs(values), targets(values), documents(values);
    std::vector<int32_t> expected_inputs(values), expected_targets(values), expected_documents(values);
    part.fill_batch(2, batch, inputs.data(), targets.data());
    part.fill_documents(2, batch, documents.data());
    reference.fill_batch(2, batch, expected_inputs.data(), expected_targets.data());
    reference.fill_documents(2, batch, expected_documents.data());
    EXPECT_EQ(inputs, expected_inputs);
    EXPECT_EQ(targets, expected_targets);
    EXPECT_EQ(documents, expected_documents);
    EXPECT_EQ(read_sample(part, 5), read_sample(reference, 5));
  }
  // The whole dataset as a range is the dataset.
  EXPECT_EQ(SequenceLoader(IndexedDataset::open(prefix_), kSeqLen, 9, std::nullopt).range().end, 5);
}

TEST_F(SequenceLoaderTest, ARangeTooSmallOrOutsideIsAnError) {
  try {
    SequenceLoader(IndexedDataset::open(prefix_), kSeqLen, 1, SequenceRange{2, 4});  // 17 tokens and an empty one
    SequenceLoader(IndexedDataset::open(prefix_), 17, 1, SequenceRange{2, 4});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("sequences [2, 4) have 17 tokens; seq_len 17 needs at least 18"), std::string::npos)
        << message;
  }
  EXPECT_THROW(SequenceLoader(IndexedDataset::open(prefix_), kSeqLen, 1, SequenceRange{3, 3}), Error);
  EXPECT_THROW(SequenceLoader(IndexedDataset::open(prefix_), kSeqLen, 1, SequenceRange{4, 6}), Error);
  EXPECT_THROW(SequenceLoader(IndexedDataset::open(prefix_), kSeqLen, 1, SequenceRange{-1, 2}), Error);
  EXPECT_THROW(SequenceLoader(IndexedDataset::open(prefix_), kSeqLen, 1, SequenceRange{3, 2}), Error);
}

}  // namespace
}  // namespace loom::data
