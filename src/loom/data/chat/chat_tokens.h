#pragma once
// A conversation as tokens with, per token, whether it is trained on (its loss weight).
//
// Attribution of rendered text to messages: the template renders every prefix of the
// conversation (messages [0, i) for i = 0..n); each must be a prefix of the next (prefix
// stability, checked: a template that rewrites earlier turns cannot be attributed, and its
// conversation is reported or made one example per trained message by tokenize_turns). A
// template that appends the same text to every rendering whatever add_generation_prompt says
// (Llama 3.0's appends the assistant's header) is attributed with that text taken off each
// rendering (it is what the template renders for no messages). Message i owns the text between
// prefix i and prefix i + 1; of an assistant message, only the part after the generation prompt
// (render of [0, i) with the assistant's header) is trained, so the header is context, the answer
// and its end-of-turn are targets. The text is tokenized piece by piece at these boundaries, so no
// token straddles two messages and the prompt is tokenized exactly as generation will tokenize it.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "loom/data/chat/chat_format.h"
#include "loom/data/chat/conversation.h"
#include "loom/data/tokenizer.h"

namespace loom::data {

struct MaskOptions {
  std::vector<std::string> roles = {"assistant"};  // whose messages are trained on
  bool last_turn_only = false;                     // only the last message of those roles
};

struct TokenizedConversation {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> trained;  // per token: 1 = a target the loss counts
  int64_t trained_tokens() const;
};

// Renders and tokenizes `conversation`; returns what is wrong (a template that is not prefix
// stable), or fills `out`.
std::optional<std::string> tokenize_conversation(const Conversation& conversation, const ChatFormat& chat_template,
                                                 const Tokenizer& tokenizer, const MaskOptions& options,
                                                 TokenizedConversation& out);

// One example per trained message k: the conversation before it rendered as the prompt the model
// is given for it (add_generation_prompt for an assistant's message), untrained, then message k as
// the template renders it after that prompt, trained. Each example's history is what inference
// shows: a template that rewrites earlier turns once later ones follow (Qwen 3 drops earlier
// answers' thinking blocks) is trained on the text it renders at every turn. Returns what is
// wrong (message k's rendering does not continue its prompt), or fills `out`.
std::optional<std::string> tokenize_turns(const Conversation& conversation, const ChatFormat& chat_template,
                                          const Tokenizer& tokenizer, const MaskOptions& options,
                                          std::vector<TokenizedConversation>& out);

}  // namespace loom::data
