// Packed documents in training: a batch packing several documents per row (positions restarting,
// no attention across a boundary) trains exactly as the same documents one per padded row, on
// one rank and with tensor + sequence or pipeline parallelism; Megatron's document options
// (data.reset_position_ids, data.reset_attention_mask, data.eod_mask_loss) each change what they
// should, and layouts train the same function as one rank with them on.
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>

#include "loom/config/run_config.h"
#include "loom/core/philox.h"
#include "loom/data/indexed_dataset.h"
#include "loom/train/batch_source.h"
#include "loom/train/run_ranks.h"
#include "training_runs.h"

namespace loom::train {
namespace {

namespace fs = std::filesystem;

constexpr int kSeq = 16, kDocsPerRow = 3;
constexpr int32_t kEod = 0;  // the byte tokenizer's end of text

// Document d: 1 to 5 tokens, then the end-of-document token.
std::vector<int32_t> document(int64_t d) {
  const uint64_t key = philox_key(11, "documents");
  std::vector<int32_t> tokens(1 + static_cast<size_t>(d * 7 % 5));
  for (size_t t = 0; t < tokens.size(); ++t) tokens[t] = 1 + static_cast<int32_t>(philox4x32(key, d, t)[0] % 255);
  tokens.push_back(kEod);
  return tokens;
}

// Rows of documents: sample g holds documents [g * per_row, (g + 1) * per_row), each predicting
// its next token (the end-of-document token predicts nothing), padding untrained. `packed`: the
// row carries positions and document ids; else one document per row, plain.
class DocumentSource : public BatchSource {
 public:
  explicit DocumentSource(bool packed) : per_row_(packed ? kDocsPerRow : 1), packed_(packed) {}
  void fill(int64_t first, TokenBatch& batch) const override {
    if (packed_) {
      batch.positions.assign(batch.inputs.size(), 0);
      batch.documents.assign(batch.inputs.size(), 0);
    }
    for (int b = 0; b < batch.batch; ++b) {
      const size_t row = static_cast<size_t>(b) * kSeq;
      int t = 0, id = 0;
      for (int64_t d = (first + b) * per_row_; d < (first + b + 1) * per_row_; ++d, ++id) {
        const std::vector<int32_t> tokens = document(d);
        for (size_t i = 0; i < tokens.size(); ++i, ++t) put(batch, row + t, tokens, i, id);
      }
      for (int p = 0; t < kSeq; ++t, ++p) put(batch, row + t, {kEod}, 0, id, p);
    }
  }
  std::string describe() const override { return packed_ ? "packed documents" : "documents one per row"; }

 private:
  // Token i of `tokens` at batch position `at`; padding (padding_index >= 0) is untrained.
  void put(TokenBatch& batch, size_t at, const std::vector<int32_t>& tokens, size_t i, int id,
           int padding_index = -1) const {
    const bool last = i + 1 == tokens.size();
    batch.inputs[at] = tokens[i];
    batch.targets[at] = last ? kEod : tokens[i + 1];
    batch.loss_weights[at] = (last || padding_index >= 0) ? 0.0f : 1.0f;
    if (!packed_) return;
    batch.positions[at] = static_cast<int32_t>(padding_index >= 0 ? padding_index : i);
    batch.documents[at] = id;
  }
  int per_row_;
  bool packed_;
};

class PackedDocuments : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = testing::make_training_root("packed-test");
    // A byte dataset of short documents (1 to 9 bytes, each ending with the end of text), so
    // most 16-token samples span several.
    data::IndexedDatasetWriter writer(root_ + "/data/short_train", data::TokenDType::kUInt16);
    for (int64_t d = 0; d < 400; ++d) {
      std::vector<int32_t> tokens = document(d);
      tokens.insert(tokens.begin(), static_cast<int32_t>('a' + d % 26));
      if (d % 3 == 0) tokens.insert(tokens.begin(), {'x', 'y', 'z'});
      writer.add_document(tokens);
    }
    writer.finish();
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  static std::string model_yaml(const std::string& name, const std::string& prefix, int global_batch) {
    return "run: {dir: " + root_ + "/" + name + "}\n" +
           "model: {vocab_size: 0, d_model: 32, layers: 2, heads: 4, kv_heads: 2, ffn_size: 48, max_seq_len: 32}\n" +
           "data: {tokenizer: byte, train_prefix: " + prefix + ", seq_len: 16}\n" +
           "optim: {lr: 1.0e-3, warmup_steps: 2, clip_grad: 1.0}\n" +
           "train: {steps: 4, global_batch: " + std::to_string(global_batch) + ", micro_batch: " +
           std::to_string(global_batch) + ", threads: 1, seed: 1234}\n" + "log: {progress: false, interval: 100}\n";
  }

  // Trains on the document source; returns the per-step losses.
  std::vector<double> train_documents(const std::string& name, bool packed, const std::vector<std::string>& overrides) {
    const int global_batch = packed ? 2 : 2 * kDocsPerRow;
    const config::RunConfig config =
        config::parse_config(model_yaml(name, root_ + "/data/c_train", global_batch), name, overrides);
    std::ostringstream out;
    const DocumentSource source(packed);
    run_on_ranks(config, out, [&](comm::Communicator& world) { return train_rank(config, world, source, {}, out); });
    return read_losses(name);
  }

  // pretrain() on the short-document dataset.
  std::vector<double> pretrain_short(const std::string& name, const std::vector<std::string>& overrides) {
    std::ostringstream out;
    pretrain(config::parse_config(model_yaml(name, root_ + "/data/short_train", 8), name, overrides), out);
    return read_losses(name);
  }

  std::vector<double> read_losses(const std::string& name) {
    std::vector<nlohmann::json> records;
    std::ifstream metrics(root_ + "/" + name + "/metrics.jsonl");
    std::string line;
    while (std::getline(metrics, line)) records.push_back(nlohmann::json::parse(line));
    return testing::losses_of(records);
  }

  static std::string root_;
};
std::string PackedDocuments::root_;

TEST_F(PackedDocuments, PackedRowsTrainAsTheSameDocumentsOnePerRow) {
  const std::vector<double> rows = train_documents("rows", false, {});
  ASSERT_EQ(rows.size(), 4u);
  const std::vector<std::vector<std::string>> layouts = {
      {},
      {"runtime.ranks=2", "parallel.tp=2", "parallel.sequence_parallel=true"},
      {"runtime.ranks=2", "parallel.pp=2", "train.micro_batch=1"},
  };
  for (size_t i = 0; i < layouts.size(); ++i) {
    SCOPED_TRACE("layout " + std::to_string(i));
    const std::string name = "packed" + std::to_string(i);
    testing::expect_same_losses(rows, train_documents(name, true, layouts[i]));
  }
  // (Parameters are not compared after the steps: in this tiny run even gradient accumulation,
  // the same function, moves Adam's state by more than 1e-5. tests/model/packing_test.cpp
  // compares the gradients themselves.)
}

// Megatron's rules, from the input tokens: positions restart and a new document begins after
// each end-of-document input; eod_mask_loss leaves out targets whose input is one.
TEST_F(PackedDocuments, DocumentOptionsFollowMegatronsRules) {
  const std::string prefix = root_ + "/data/short_train";
  TokenBatch plain, reset, positions_only;
  for (TokenBatch* b : {&plain, &reset, &positions_only}) b->resize(6, kSeq);
  PretrainingSource(prefix, kSeq, 5).fill(40, plain);
  EXPECT_TRUE(plain.positions.empty() && plain.documents.empty());
  for (float w : plain.loss_weights) EXPECT_EQ(w, 1.0f);
  PretrainingSource(prefix, kSeq, 5, {true, true, true, kEod}).fill(40, reset);
  PretrainingSource(prefix, kSeq, 5, {true, false, false, kEod}).fill(40, positions_only);
  EXPECT_EQ(reset.inputs, plain.inputs);
  EXPECT_EQ(positions_only.positions, reset.positions);
  EXPECT_TRUE(positions_only.documents.empty());
  int boundaries = 0;
  for (int b = 0; b < reset.batch; ++b) {
    int32_t position = 0, document = 0;
    for (int t = 0; t < kSeq; ++t) {
      const size_t i = static_cast<size_t>(b) * kSeq + t;
      if (t > 0 && reset.inputs[i - 1] == kEod) {
        position = 0;
        ++document;
        ++boundaries;
      }
      EXPECT_EQ(reset.positions[i], position) << "row " << b << " token " << t;
      EXPECT_EQ(reset.documents[i], document) << "row " << b << " token " << t;
      EXPECT_EQ(reset.loss_weights[i], reset.inputs[i] == kEod ? 0.0f : 1.0f);
      ++position;
    }
  }
  EXPECT_GT(boundaries, 6);
}

TEST_F(PackedDocuments, EachOptionChangesTraining) {
  // Learned positions: RoPE's scores depend only on offsets, so restarting positions changes them
  // only across documents, which a model this small barely sees.
  const std::vector<double> plain = pretrain_short("plain", {"model.positions=learned"});
  ASSERT_EQ(plain.size(), 4u);
  for (const std::string option : {"data.reset_attention_mask", "data.reset_position_ids", "data.eod_mask_loss"}) {
    SCOPED_TRACE(option);
    const std::vector<double> losses = pretrain_short(option.substr(5), {option + "=true", "model.positions=learned"});
    double difference = 0.0;
    for (size_t s = 0; s < plain.size(); ++s) difference = std::max(difference, std::fabs(losses[s] - plain[s]));
    EXPECT_GT(difference, 1e-3);
  }
}

TEST_F(PackedDocuments, LayoutsWithResetDocumentsTrainAsOneRank) {
  const std::vector<std::string> options = {"data.reset_attention_mask=true", "data.reset_position_ids=true",
                                            "data.eod_mask_loss=true", "model.positions=learned"};
  const std::vector<double> one = pretrain_short("reset-one", options);
  const std::vector<std::vector<std::string>> layouts = {
      {"runtime.ranks=2", "parallel.tp=2", "parallel.sequence_parallel=true"},
      {"runtime.ranks=2", "parallel.pp=2", "train.micro_batch=2"},
      {"runtime.ranks=2", "parallel.zero=3", "train.micro_batch=2", "model.recompute=true"},
      {"runtime.ranks=2", "parallel.cp=2", "parallel.cp_comm=p2p"},
      {"runtime.ranks=4", "parallel.cp=4", "parallel.cp_comm=p2p"},
      {"runtime.ranks=2", "parallel.cp=2", "parallel.cp_comm=a2a"},
  };
  for (size_t i = 0; i < layouts.size(); ++i) {
    SCOPED_TRACE("layout " + std::to_string(i));
    std::vector<std::string> overrides = options;
    overrides.insert(overrides.end(), layouts[i].begin(), layouts[i].end());
    testing::expect_same_losses(one, pretrain_short("reset-layout" + std::to_string(i), overrides));
  }
}

}  // namespace
}  // namespace loom::train
