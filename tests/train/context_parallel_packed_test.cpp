// Packed documents under context parallelism: a source that packs several documents per row
// (document ids, positions restarting at each boundary, boundaries inside the cp chunks) trains
// the same function at cp 2 and 4 with ring (p2p) and Ulysses (a2a) attention as on one rank, for
// 20 steps (every step's loss and the final state, fp32: relative 1e-5), with multi-token
// prediction too.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "loom/train/run_ranks.h"
#include "training_runs.h"

namespace loom::train {
namespace {

namespace fs = std::filesystem;

// Pre-training samples cut into documents of 3 to 7 tokens (lengths cycling with the sample),
// with each document's positions starting at 0.
class PackedSource final : public BatchSource {
 public:
  PackedSource(const std::string& prefix, int seq_len, uint64_t seed) : plain_(prefix, seq_len, seed) {}
  void fill(int64_t first, TokenBatch& batch) const override {
    plain_.fill(first, batch);
    batch.positions.resize(batch.inputs.size());
    batch.documents.resize(batch.inputs.size());
    for (int b = 0; b < batch.batch; ++b) {
      int document = 0, position = 0, length = 3 + static_cast<int>((first + b) % 5);
      for (int t = 0; t < batch.seq; ++t) {
        if (position == length) {
          ++document;
          position = 0;
          length = 3 + (length + 2) % 5;
        }
        batch.positions[b * batch.seq + t] = position++;
        batch.documents[b * batch.seq + t] = document;
      }
    }
  }
  std::string describe() const override { return plain_.describe(); }

 private:
  PretrainingSource plain_;
};

std::vector<double> train_packed(const std::string& root, const std::string& name,
                                 const std::vector<std::string>& overrides) {
  const std::string yaml =
      "run: {dir: " + root + "/" + name + "}\n"
      "model: {vocab_size: 0, d_model: 32, layers: 2, heads: 8, kv_heads: 4, ffn_size: 48, max_seq_len: 32}\n" +
      testing::data_section(root) +
      "optim: {lr: 1.0e-3, warmup_steps: 2, clip_grad: 1.0}\n"
      "train: {steps: 20, global_batch: 8, micro_batch: 4, threads: 1}\n"
      "log: {progress: false, interval: 100}\n";
  const config::RunConfig config = config::parse_config(yaml, name, overrides);
  std::ostringstream out;
  const PackedSource source(config.data.train_prefix, config.data.seq_len, config.train.seed);
  run_on_ranks(config, out, [&](comm::Communicator& world) { return train_rank(config, world, source, {}, out); });
  std::vector<nlohmann::json> records;
  std::ifstream metrics(root + "/" + name + "/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) records.push_back(nlohmann::json::parse(line));
  return testing::losses_of(records);
}

TEST(ContextParallelPacked, PackedDocumentsEqualOneRank) {
  const std::string root = testing::make_training_root("cp-packed");
  const std::vector<double> one = train_packed(root, "one", {});
  ASSERT_EQ(one.size(), 20u);
  for (const std::string comm : {"p2p", "a2a"}) {
    for (int cp : {2, 4}) {
      const std::string name = "cp" + std::to_string(cp) + "-" + comm;
      SCOPED_TRACE(name);
      testing::expect_same_losses(one, train_packed(root, name, {"runtime.ranks=" + std::to_string(cp),
                                                                 "parallel.cp=" + std::to_string(cp),
                                                                 "parallel.cp_comm=" + comm}));
      EXPECT_LE(testing::state_difference(root, "one", name), 1e-5);
    }
  }
  fs::remove_all(root);
}

// Multi-token prediction's look-ahead stops at document ends, which fall inside and between the
// ranks' chunks: cp 2 trains two depths on packed rows as one rank does.
TEST(ContextParallelPacked, MultiTokenPredictionOverPackedDocumentsEqualsOneRank) {
  const std::string root = testing::make_training_root("cp-packed-mtp");
  const std::vector<double> one = train_packed(root, "one", {"model.mtp_depths=2"});
  for (const std::string comm : {"p2p", "a2a"}) {
    const std::string name = "cp2-" + comm;
    SCOPED_TRACE(name);
    const std::vector<std::string> layout = {"model.mtp_depths=2", "runtime.ranks=2", "parallel.cp=2",
                                             "parallel.cp_comm=" + comm};
    testing::expect_same_losses(one, train_packed(root, name, layout));
    EXPECT_LE(testing::state_difference(root, "one", name), 1e-5);
  }
  fs::remove_all(root);
}

}  // namespace
}  // namespace loom::train
