#include "loom/data/chat/chat_tokens.h"

#include <algorithm>

namespace loom::data {

namespace {

// Whether messages of `role` are trained on.
bool trains(const MaskOptions& options, const std::string& role) {
  return std::find(options.roles.begin(), options.roles.end(), role) != options.roles.end();
}

// The index of the last message whose role is trained on, or -1.
int last_trained_message(const Conversation& conversation, const MaskOptions& options) {
  int last = -1;
  for (size_t i = 0; i < conversation.messages.size(); ++i) {
    if (trains(options, conversation.messages[i].role)) last = static_cast<int>(i);
  }
  return last;
}

void append_piece(const Tokenizer& tokenizer, std::string_view text, bool trained, TokenizedConversation& out) {
  if (text.empty()) return;
  const std::vector<int32_t> ids = tokenizer.encode(text, EncodeOptions{});  // special tokens as their ids
  out.tokens.insert(out.tokens.end(), ids.begin(), ids.end());
  out.trained.insert(out.trained.end(), ids.size(), trained ? 1 : 0);
}


// Attribution with renderings that may end in a `trailing` text the template appends whatever
// add_generation_prompt says (Llama 3.0's template always ends with the assistant's header): the
// renderings less that text must be prefix stable. `trailing` empty: the plain rule.
std::optional<std::string> attribute(const Conversation& conversation, const ChatFormat& chat_template,
                                     const Tokenizer& tokenizer, const MaskOptions& options,
                                     const std::string& trailing, TokenizedConversation& out) {
  const nlohmann::json messages = messages_json(conversation.messages);
  const int last = last_trained_message(conversation, options);
  auto render = [&](size_t count, bool generation_prompt) {
    const nlohmann::json head(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(count));
    return chat_template.render(head, conversation.tools, generation_prompt);
  };
  auto prefix = [&](size_t count) -> std::optional<std::string> {
    std::string text = render(count, false);
    if (trailing.empty()) return text;
    if (!text.ends_with(trailing)) return std::nullopt;
    text.resize(text.size() - trailing.size());
    return text;
  };
  out = TokenizedConversation{};
  std::optional<std::string> previous = prefix(0);
  if (!previous) return "chat template '" + chat_template.name() + "' does not end every rendering alike";
  append_piece(tokenizer, *previous, false, out);
  for (size_t i = 0; i < conversation.messages.size(); ++i) {
    const std::optional<std::string> next = prefix(i + 1);
    if (!next || !next->starts_with(*previous))
      return "chat template '" + chat_template.name() + "' is not prefix stable at messages[" + std::to_string(i) +
             "]: rendering the conversation up to it changes the text of earlier messages";
    const std::string& role = conversation.messages[i].role;
    const bool trained = trains(options, role) && (!options.last_turn_only || static_cast<int>(i) == last);
    size_t content_start = previous->size();
    if (role == "assistant") {
      const std::string prompt = render(i, true);
      if (prompt.size() >= previous->size() && next->starts_with(prompt)) content_start = prompt.size();
    }
    const std::string_view text(*next);
    append_piece(tokenizer, text.substr(previous->size(), content_start - previous->size()), false, out);
    append_piece(tokenizer, text.substr(content_start), trained, out);
    previous = next;
  }
  return std::nullopt;
}

}  // namespace

int64_t TokenizedConversation::trained_tokens() const {
  return std::count(trained.begin(), trained.end(), uint8_t{1});
}

std::optional<std::string> tokenize_conversation(const Conversation& conversation, const ChatFormat& chat_template,
                                                 const Tokenizer& tokenizer, const MaskOptions& options,
                                                 TokenizedConversation& out) {
  std::optional<std::string> problem = attribute(conversation, chat_template, tokenizer, options, "", out);
  if (!problem) return std::nullopt;
  // A template that appends the same text to every rendering (what it renders for no messages,
  // e.g. the assistant's header) is attributed without it; the training text then ends with the
  // last message, as a template that honours add_generation_prompt renders it.
  const nlohmann::json none = nlohmann::json::array();
  const std::string trailing = chat_template.render(none, conversation.tools, false);
  if (!trailing.empty() && !attribute(conversation, chat_template, tokenizer, options, trailing, out))
    return std::nullopt;
  return problem;
}

std::optional<std::string> tokenize_turns(const Conversation& conversation, const ChatFormat& chat_template,
                                          const Tokenizer& tokenizer, const MaskOptions& options,
                                          std::vector<TokenizedConversation>& out) {
  const nlohmann::json messages = messages_json(conversation.messages);
  auto render = [&](size_t count, bool generation_prompt) {
    const nlohmann::json head(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(count));
    return chat_template.render(head, conversation.tools, generation_prompt);
  };
  // What the template appends to every rendering (Llama 3.0's assistant header) belongs to no message.
  const std::string trailing = chat_template.render(nlohmann::json::array(), conversation.tools, false);
  const int last = last_trained_message(conversation, options);
  out.clear();
  for (size_t k = 0; k < conversation.messages.size(); ++k) {
    const std::string& role = conversation.messages[k].role;
    if (!trains(options, role) || (options.last_turn_only && static_cast<int>(k) != last)) continue;
    std::string text = render(k + 1, false);
    if (!trailing.empty() && text.ends_with(trailing)) text.resize(text.size() - trailing.size());
    // An assistant's message follows the generation prompt; another role's, the history alone.
    std::string prompt = role == "assistant" ? render(k, true) : std::string();
    if (role != "assistant" || !text.starts_with(prompt)) prompt = render(k, false);
    if (!text.starts_with(prompt) || text.size() == prompt.size()) {
      return "chat template '" + chat_template.name() + "': the rendering of messages[" + std::to_string(k) +
             "] does not continue the prompt it renders for the messages before it";
    }
    TokenizedConversation& example = out.emplace_back();
    append_piece(tokenizer, prompt, false, example);
    append_piece(tokenizer, std::string_view(text).substr(prompt.size()), true, example);
  }
  return std::nullopt;
}

}  // namespace loom::data
