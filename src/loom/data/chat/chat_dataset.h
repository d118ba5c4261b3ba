#pragma once
// Chat conversations made ready to train on: read (conversation.h), split into train and
// validation, rendered and tokenized with their loss masks (chat_tokens.h), cut or dropped when
// longer than a row, and placed into rows of `seq_len` tokens (packing.h).
//
// A row holds whole documents (conversations). A document of n tokens at offset o fills slots
// [o, o + n): input o + k is token k, its target token k + 1 with that token's loss weight; the
// document's last slot has no target (weight 0). Each slot also carries its document's index in
// the row and its position in the document (restarting at 0), so attention can keep documents
// apart; slots after the last document are padding (weight 0, their own document).
#include <cstdint>
#include <string>
#include <vector>

#include "loom/data/chat/chat_tokens.h"
#include "loom/data/tokenizer.h"

namespace loom::data {

// When a conversation becomes one example per trained message (tokenize_turns): never, where the
// template is not prefix stable (it rewrites earlier turns), or always.
enum class TurnSplit { Never, WhereRewritten, Always };

struct ChatDatasetOptions {
  std::vector<std::string> paths;
  std::string chat_template = "chatml";
  MaskOptions mask;
  TurnSplit split = TurnSplit::WhereRewritten;
  int seq_len = 128;
  bool packing = true;
  double val_fraction = 0.0;
  uint64_t seed = 1234;
  bool skip_bad_lines = false;
  bool drop_overlong = false;  // else truncate to seq_len tokens
};

// Rows of seq_len slots, row-major.
struct ChatRows {
  int seq_len = 0;
  int64_t rows = 0;
  bool packed = false;  // rows may hold several documents
  std::vector<int32_t> inputs, targets, documents, positions;
  std::vector<float> loss_weights;
  int64_t conversations = 0, tokens = 0, trained_tokens = 0;
  double efficiency = 0.0;  // share of slots holding document tokens
};

struct ChatDataset {
  ChatRows train, validation;
  ChatLoadReport load;
  int64_t truncated = 0, dropped_overlong = 0, dropped_untrained = 0;
  int64_t split_conversations = 0, split_examples = 0;  // conversations made one example per trained message
  std::vector<std::string> untrained_examples;  // "file:line" of the first few without a trained token
};

ChatDataset build_chat_dataset(const ChatDatasetOptions& options, const Tokenizer& tokenizer);

// Places `documents` into rows (first-fit decreasing when `packing`, else one per row).
ChatRows make_rows(const std::vector<TokenizedConversation>& documents, int seq_len, bool packing, int32_t pad_token);

}  // namespace loom::data
