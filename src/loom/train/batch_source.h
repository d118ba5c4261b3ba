#pragma once
// Where a recipe's training batches come from. The trainer asks a BatchSource for samples by
// global sample index, so every layout reads the same global batch (data order = f(seed, index))
// and a resumed run continues it from the checkpoint's data position. Each token carries a loss
// weight: 1 = trained on, 0 = not (a prompt token in SFT, padding, a token after a document
// end). Pre-training's loader is the first source; SFT and RL add theirs.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/config/run_config.h"
#include "loom/data/sequence_loader.h"
#include "loom/model/packing.h"

namespace loom::train {

class BatchSource;

// `batch` samples of `seq` tokens, row-major [batch, seq]: the model's inputs, the targets they
// predict, and each target's loss weight. Packed documents (model/packing.h): each input token's
// position (RoPE / learned positions, restarting per document) and document id; a source leaves
// either empty for plain rows (positions 0, 1, ... and one document per row).
struct TokenBatch {
  int batch = 0, seq = 0;
  std::vector<int32_t> inputs, targets;
  std::vector<float> loss_weights;
  std::vector<int32_t> positions, documents;
  // Reinforcement learning's per-target data ([batch, seq] each; empty for pre-training and SFT):
  // the advantage of the sample a target belongs to, the generation server's log-probability of
  // the target, and how many targets of its sample are trained on (a sample's loss factors need
  // the whole sample, which context parallelism splits over ranks). Read by a StepObjective
  // (step_objective.h); split by context parallelism as the targets are.
  std::vector<float> advantages, generation_logprobs;
  std::vector<int32_t> sample_targets;

  model::Packing packing() const {
    return {positions.empty() ? nullptr : positions.data(), documents.empty() ? nullptr : documents.data()};
  }

  void resize(int batch_size, int seq_len);
  // Masks the targets whose weight is 0 (they leave the loss, its gradient and the token count)
  // and returns the number of targets that count. A weight other than 0 or 1 is an Error naming
  // `source`'s dataset, the sample and the position: the loss is a token mean over weights 0 or 1.
  int64_t mask_and_count(const BatchSource& source, int64_t first_sample);
  // Context parallelism: keeps this rank's share of every sample, chunks `rank` and 2 cp - 1 -
  // `rank` of its 2 cp equal chunks (in that order; model/context_attention.h), of the inputs,
  // targets, loss weights, positions, document ids and per-target data alike; seq becomes
  // seq / cp. Returns the targets that count in the share. Call after mask_and_count.
  int64_t keep_context_share(int cp, int rank);
  const int32_t* micro_inputs(int m, int micro) const { return inputs.data() + static_cast<size_t>(m) * micro * seq; }
  const int32_t* micro_targets(int m, int micro) const { return targets.data() + static_cast<size_t>(m) * micro * seq; }
};

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // Fills rows [0, batch.batch) of `batch` with global samples first, first + 1, ...; the same
  // global index gives the same sample on every rank.
  virtual void fill(int64_t first, TokenBatch& batch) const = 0;
  // For messages: the dataset this source reads.
  virtual std::string describe() const = 0;
  // A line for the run's start: what global samples [first, first + samples) read (datasets,
  // epochs); empty where there is nothing more to say than describe().
  virtual std::string describe_reading(int64_t /*first*/, int64_t /*samples*/) const { return ""; }
};

// "1.5 epochs": `samples` read of a dataset holding `per_epoch`.
std::string format_epochs(int64_t samples, int64_t per_epoch);

// Megatron's document options of pre-training (data.reset_position_ids, data.reset_attention_mask,
// data.eod_mask_loss), with the tokenizer's end-of-document id.
struct DocumentOptions {
  bool reset_position_ids = false, reset_attention_mask = false, eod_mask_loss = false;
  int32_t eod = -1;  // needed by eod_mask_loss
  static DocumentOptions from_config(const config::DataConfig& data);
};

// A source a weighted blend can read row by row (blended_source.h): pre-training's datasets,
// SFT's conversation files.
class BlendableSource : public BatchSource {
 public:
  void fill(int64_t first, TokenBatch& batch) const override { fill_rows(first, 0, batch.batch, batch); }
  // Rows [row, row + rows) of `batch` with this source's samples first, first + 1, ...
  virtual void fill_rows(int64_t first, int row, int rows, TokenBatch& batch) const = 0;
  // The samples of one pass over the source's data.
  virtual int64_t samples_per_epoch() const = 0;
};

// Which sequences of a dataset a source reads: all (no shares), or one part of data.split's.
struct DatasetPart {
  std::vector<double> shares;  // data.split's; empty: the whole dataset
  data::SplitPart part = data::SplitPart::Train;
  bool split() const { return !shares.empty(); }
};

// Pre-training: GPT-style samples from a Megatron indexed dataset (data/sequence_loader.h),
// every target trained on unless eod_mask_loss; documents and positions by the options.
class PretrainingSource : public BlendableSource {
 public:
  // Throws loom::Error when the dataset (or its part) cannot be read or holds fewer than
  // seq_len + 1 tokens; for a part, naming data.split.
  PretrainingSource(const std::string& prefix, int seq_len, uint64_t seed, DocumentOptions documents = {},
                    const DatasetPart& part = {});
  void fill_rows(int64_t first, int row, int rows, TokenBatch& batch) const override;
  // The prefix, and for a part of data.split, which sequences.
  std::string describe() const override { return name_; }
  std::string describe_reading(int64_t first, int64_t samples) const override;
  int64_t samples_per_epoch() const override { return loader_.num_samples(); }

 private:
  // Document ids (and positions) of the batch's values [begin, end), whole rows from sample first.
  void fill_documents(int64_t first, size_t begin, size_t end, TokenBatch& batch) const;

  std::string name_;
  data::SequenceLoader loader_;
  DocumentOptions options_;
};

}  // namespace loom::train
