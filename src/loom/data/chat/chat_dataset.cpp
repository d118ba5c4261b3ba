#include "loom/data/chat/chat_dataset.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loom/core/error.h"
#include "loom/data/chat/packing.h"

namespace loom::data {

namespace {

void place(const TokenizedConversation& doc, int32_t document, int64_t slot, ChatRows& rows) {
  const int64_t n = static_cast<int64_t>(doc.tokens.size());
  for (int64_t k = 0; k < n; ++k) {
    const size_t at = static_cast<size_t>(slot + k);
    rows.inputs[at] = doc.tokens[k];
    const bool has_target = k + 1 < n;
    rows.targets[at] = has_target ? doc.tokens[k + 1] : 0;
    rows.loss_weights[at] = has_target && doc.trained[k + 1] ? 1.0f : 0.0f;
    rows.documents[at] = document;
    rows.positions[at] = static_cast<int32_t>(k);
  }
}

}  // namespace

ChatRows make_rows(const std::vector<TokenizedConversation>& documents, int seq_len, bool packing, int32_t pad_token) {
  std::vector<int64_t> lengths;
  for (const TokenizedConversation& doc : documents) lengths.push_back(static_cast<int64_t>(doc.tokens.size()));
  const std::vector<std::vector<int64_t>> layout =
      packing ? pack_first_fit_decreasing(lengths, seq_len) : one_per_row(lengths, seq_len);
  ChatRows rows;
  rows.seq_len = seq_len;
  rows.rows = static_cast<int64_t>(layout.size());
  rows.packed = packing;
  const size_t slots = static_cast<size_t>(rows.rows) * static_cast<size_t>(seq_len);
  rows.inputs.assign(slots, pad_token);
  rows.targets.assign(slots, 0);
  rows.loss_weights.assign(slots, 0.0f);
  rows.documents.assign(slots, 0);
  rows.positions.assign(slots, 0);
  for (int64_t r = 0; r < rows.rows; ++r) {
    int64_t slot = r * seq_len;
    int32_t document = 0;
    for (int64_t doc : layout[r]) {
      place(documents[doc], document++, slot, rows);
      slot += lengths[doc];
    }
    for (int32_t position = 0; slot < (r + 1) * seq_len; ++slot) {  // padding: a document of its own
      rows.documents[slot] = document;
      rows.positions[slot] = position++;
    }
  }
  rows.conversations = static_cast<int64_t>(documents.size());
  for (const TokenizedConversation& doc : documents) rows.tokens += static_cast<int64_t>(doc.tokens.size());
  for (float w : rows.loss_weights) rows.trained_tokens += w != 0.0f;
  rows.efficiency = packing_efficiency(layout, lengths, seq_len);
  return rows;
}

namespace {

// A conversation as one example, or one per trained message (options.split: `split` says which);
// what is wrong, or none.
std::optional<std::string> tokenize_examples(const Conversation& conversation, const ChatFormat& chat_template,
                                             const Tokenizer& tokenizer, const ChatDatasetOptions& options,
                                             std::vector<TokenizedConversation>& docs, bool& split) {
  split = false;
  if (options.split != TurnSplit::Always) {
    docs.resize(1);
    std::optional<std::string> whole =
        tokenize_conversation(conversation, chat_template, tokenizer, options.mask, docs[0]);
    if (!whole) return whole;
    if (options.split == TurnSplit::Never) {
      return *whole + "; sft.split_turns=unstable trains such a conversation as one example per trained message";
    }
  }
  split = true;
  return tokenize_turns(conversation, chat_template, tokenizer, options.mask, docs);
}

}  // namespace

ChatDataset build_chat_dataset(const ChatDatasetOptions& options, const Tokenizer& tokenizer) {
  LOOM_CHECK(!options.paths.empty(), "sft.train_files is empty: give one or more JSONL files of conversations");
  ChatDataset dataset;
  const std::vector<Conversation> conversations =
      load_conversations(options.paths, options.skip_bad_lines, dataset.load);
  const std::unique_ptr<ChatFormat> chat_template = make_chat_format(options.chat_template, tokenizer);
  std::vector<TokenizedConversation> train, validation;
  for (size_t i = 0; i < conversations.size(); ++i) {
    const Conversation& conversation = conversations[i];
    const std::string where = conversation.file + ":" + std::to_string(conversation.line);
    std::vector<TokenizedConversation> docs;
    bool split_turns = false;
    if (auto bad = tokenize_examples(conversation, *chat_template, tokenizer, options, docs, split_turns)) {
      LOOM_CHECK(options.skip_bad_lines, where + ": " + *bad + " (set sft.bad_lines=skip to skip such lines)");
      dataset.load.problems.push_back(where + ": " + *bad);
      continue;
    }
    if (split_turns) {
      ++dataset.split_conversations;
      dataset.split_examples += static_cast<int64_t>(docs.size());
    }
    // A conversation's examples stay together: all trained, or all held out.
    std::vector<TokenizedConversation>& destination =
        in_validation(options.seed, static_cast<int64_t>(i), options.val_fraction) ? validation : train;
    int64_t kept = 0, overlong = 0;
    for (TokenizedConversation& doc : docs) {
      if (doc.tokens.size() > static_cast<size_t>(options.seq_len)) {
        if (options.drop_overlong) {
          ++dataset.dropped_overlong;
          ++overlong;
          continue;
        }
        ++dataset.truncated;
        doc.tokens.resize(options.seq_len);
        doc.trained.resize(options.seq_len);
      }
      // The first token is never a target: an example needs a trained token after it.
      if (std::count(doc.trained.begin() + 1, doc.trained.end(), uint8_t{1}) == 0) continue;
      ++kept;
      destination.push_back(std::move(doc));
    }
    if (kept == 0 && overlong == 0) {
      ++dataset.dropped_untrained;
      if (dataset.untrained_examples.size() < 3) dataset.untrained_examples.push_back(where);
    }
  }
  dataset.train = make_rows(train, options.seq_len, options.packing, tokenizer.eot_token());
  dataset.validation = make_rows(validation, options.seq_len, options.packing, tokenizer.eot_token());
  return dataset;
}

}  // namespace loom::data
