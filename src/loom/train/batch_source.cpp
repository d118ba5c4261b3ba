#include "loom/train/batch_source.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <utility>

#include "loom/core/error.h"
#include "loom/data/tokenizer.h"
#include "loom/kernels/types.h"

namespace loom::train {

void TokenBatch::resize(int batch_size, int seq_len) {
  batch = batch_size;
  seq = seq_len;
  const size_t n = static_cast<size_t>(batch_size) * static_cast<size_t>(seq_len);
  inputs.resize(n);
  targets.resize(n);
  loss_weights.resize(n);
  positions.clear();  // plain rows until a source packs documents
  documents.clear();
  advantages.clear();  // no per-target data until a source gives it
  generation_logprobs.clear();
  sample_targets.clear();
}

int64_t TokenBatch::mask_and_count(const BatchSource& source, int64_t first_sample) {
  int64_t counted = 0;
  for (size_t i = 0; i < targets.size(); ++i) {
    const float w = loss_weights[i];
    LOOM_CHECK(w == 0.0f || w == 1.0f, source.describe() + ": sample " + std::to_string(first_sample + static_cast<int64_t>(i) / seq) +
                                           " position " + std::to_string(static_cast<int64_t>(i) % seq) +
                                           " has loss weight " + std::to_string(w) + " (valid: 0 or 1)");
    if (w == 0.0f) targets[i] = kernels::kIgnoreIndex;
    counted += targets[i] != kernels::kIgnoreIndex;
  }
  return counted;
}

std::string format_epochs(int64_t samples, int64_t per_epoch) {
  char text[64];
  std::snprintf(text, sizeof text, "%.3g epoch%s", static_cast<double>(samples) / static_cast<double>(per_epoch),
                samples == per_epoch ? "" : "s");
  return text;
}

namespace {

// Row by row, chunks `rank` and 2 cp - 1 - rank of each row of `seq` values, in place.
template <typename T>
void keep_chunks(std::vector<T>& values, int rows, int seq, int cp, int rank) {
  const int chunk = seq / (2 * cp), local = 2 * chunk;
  for (int r = 0; r < rows; ++r) {
    const T* row = values.data() + static_cast<size_t>(r) * seq;
    T* out = values.data() + static_cast<size_t>(r) * local;  // never ahead of what it reads
    const int late = 2 * cp - 1 - rank;
    std::copy(row + rank * chunk, row + (rank + 1) * chunk, out);
    std::copy(row + late * chunk, row + (late + 1) * chunk, out + chunk);
  }
  values.resize(static_cast<size_t>(rows) * local);
}

}  // namespace

int64_t TokenBatch::keep_context_share(int cp, int rank) {
  LOOM_CHECK(seq % (2 * cp) == 0, "a sample of " + std::to_string(seq) + " tokens cannot be cut into 2 x parallel.cp = " +
                                      std::to_string(2 * cp) + " equal chunks");
  if (cp > 1) {
    keep_chunks(inputs, batch, seq, cp, rank);
    keep_chunks(targets, batch, seq, cp, rank);
    keep_chunks(loss_weights, batch, seq, cp, rank);
    if (!positions.empty()) keep_chunks(positions, batch, seq, cp, rank);
    if (!documents.empty()) keep_chunks(documents, batch, seq, cp, rank);
    if (!advantages.empty()) keep_chunks(advantages, batch, seq, cp, rank);
    if (!generation_logprobs.empty()) keep_chunks(generation_logprobs, batch, seq, cp, rank);
    if (!sample_targets.empty()) keep_chunks(sample_targets, batch, seq, cp, rank);
    seq /= cp;
  }
  return std::count_if(targets.begin(), targets.end(), [](int32_t t) { return t != kernels::kIgnoreIndex; });
}

DocumentOptions DocumentOptions::from_config(const config::DataConfig& data) {
  DocumentOptions options{data.reset_position_ids, data.reset_attention_mask, data.eod_mask_loss};
  if (options.eod_mask_loss) options.eod = data::make_tokenizer(data.tokenizer)->eot_token();
  return options;
}

namespace {

// The samples of `prefix`'s part: its sequences by data.split when it splits, else all.
data::SequenceLoader open_part(const std::string& prefix, int seq_len, uint64_t seed, const DatasetPart& part) {
  data::IndexedDataset dataset = data::IndexedDataset::open(prefix);
  if (!part.split()) return data::SequenceLoader(std::move(dataset), seq_len, seed, std::nullopt);
  const std::string split = "data.split = " + data::split_text(part.shares);
  const data::SequenceRange range = data::split_range(part.shares, part.part, dataset.num_sequences());
  try {
    return data::SequenceLoader(std::move(dataset), seq_len, seed, range);
  } catch (const Error& e) {
    throw Error(split + " gives the " + data::split_part_name(part.part) + " part sequences [" +
                std::to_string(range.begin) + ", " + std::to_string(range.end) + "): " + e.what() +
                "; give that part a larger share (or 0 for none)");
  }
}

std::string part_name(const std::string& prefix, const data::SequenceLoader& loader, const DatasetPart& part) {
  if (!part.split()) return prefix;
  const data::SequenceRange range = loader.range();
  return prefix + " (" + data::split_part_name(part.part) + " part of data.split = " + data::split_text(part.shares) +
         ": sequences [" + std::to_string(range.begin) + ", " + std::to_string(range.end) + "))";
}

}  // namespace

PretrainingSource::PretrainingSource(const std::string& prefix, int seq_len, uint64_t seed, DocumentOptions documents,
                                     const DatasetPart& part)
    : loader_(open_part(prefix, seq_len, seed, part)), options_(documents) {
  name_ = part_name(prefix, loader_, part);
  LOOM_CHECK(!options_.eod_mask_loss || options_.eod >= 0,
             "data.eod_mask_loss needs the tokenizer's end-of-document id (data.tokenizer)");
}

void PretrainingSource::fill_rows(int64_t first, int row, int rows, TokenBatch& batch) const {
  LOOM_CHECK(batch.seq == loader_.seq_len(), "batch of " + std::to_string(batch.seq) + " tokens per sample from " +
                                                 name_ +
                                                 ", which was opened for " + std::to_string(loader_.seq_len()));
  const size_t seq = static_cast<size_t>(batch.seq), begin = static_cast<size_t>(row) * seq,
               end = begin + static_cast<size_t>(rows) * seq;
  loader_.fill_batch(first, rows, batch.inputs.data() + begin, batch.targets.data() + begin);
  std::fill(batch.loss_weights.begin() + static_cast<std::ptrdiff_t>(begin),
            batch.loss_weights.begin() + static_cast<std::ptrdiff_t>(end), 1.0f);
  // As Megatron: no loss where the input is the end-of-document token (its target is the next
  // document's first token, which nothing in the row can predict).
  if (options_.eod_mask_loss) {
    for (size_t i = begin; i < end; ++i) {
      if (batch.inputs[i] == options_.eod) batch.loss_weights[i] = 0.0f;
    }
  }
  if (options_.reset_position_ids || options_.reset_attention_mask) fill_documents(first, begin, end, batch);
}

std::string PretrainingSource::describe_reading(int64_t first, int64_t samples) const {
  return name_ + ": " + std::to_string(samples_per_epoch()) + " samples of " + std::to_string(loader_.seq_len() + 1) +
         " tokens per epoch; samples [" + std::to_string(first) + ", " + std::to_string(first + samples) + ") read " +
         format_epochs(samples, samples_per_epoch());
}

void PretrainingSource::fill_documents(int64_t first, size_t begin, size_t end, TokenBatch& batch) const {
  const size_t n = batch.inputs.size();
  batch.documents.resize(n);
  loader_.fill_documents(first, static_cast<int>((end - begin) / static_cast<size_t>(batch.seq)),
                         batch.documents.data() + begin);
  if (options_.reset_position_ids) {
    batch.positions.resize(n);
    for (size_t i = begin; i < end; ++i) {
      const bool starts = i % static_cast<size_t>(batch.seq) == 0 || batch.documents[i] != batch.documents[i - 1];
      batch.positions[i] = starts ? 0 : batch.positions[i - 1] + 1;
    }
  }
  if (!options_.reset_attention_mask) batch.documents.clear();  // positions only: attention spans documents
}

}  // namespace loom::train
