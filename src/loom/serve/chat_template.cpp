#include "loom/serve/chat_template.h"

#include "loom/serve/api_error.h"

namespace loom::serve {

namespace {
std::string content_text(const nlohmann::json& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (content.is_null()) return "";
  if (!content.is_array()) throw bad_field(where, "must be a string or an array of text parts");
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const nlohmann::json& part = content[i];
    const std::string at = where + "[" + std::to_string(i) + "]";
    if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") ||
        !part["text"].is_string())
      throw bad_field(at, "only {\"type\": \"text\", \"text\": ...} parts are supported");
    text += part["text"].get<std::string>();
  }
  return text;
}
}  // namespace

std::string render_chat(const nlohmann::json& messages) {
  if (!messages.is_array() || messages.empty()) throw bad_field("messages", "must be a non-empty array of messages");
  std::string prompt;
  for (size_t i = 0; i < messages.size(); ++i) {
    const nlohmann::json& m = messages[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) throw bad_field(at, "must be an object with role and content");
    if (!m.contains("role") || !m["role"].is_string()) throw bad_field(at + ".role", "must be a string");
    const std::string role = m["role"].get<std::string>();
    if (role != "system" && role != "user" && role != "assistant" && role != "developer" && role != "tool")
      throw bad_field(at + ".role", "'" + role + "' is not one of system, developer, user, assistant, tool");
    if (!m.contains("content")) throw bad_field(at + ".content", "is missing");
    prompt += "<|im_start|>" + role + "\n" + content_text(m["content"], at + ".content") + "<|im_end|>\n";
  }
  return prompt + "<|im_start|>assistant\n";
}

}  // namespace loom::serve
