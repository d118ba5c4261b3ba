#include "loom/data/chat/conversation.h"

#include <fstream>

#include "loom/core/error.h"
#include "loom/core/philox.h"

namespace loom::data {

namespace {

using nlohmann::json;

const std::vector<std::string>& known_roles() {
  static const std::vector<std::string> roles = {"system", "user", "assistant", "tool"};
  return roles;
}

// A string field, or nothing when absent or null; a field of another type is a problem.
std::optional<std::string> string_field(const json& object, const std::string& key, const std::string& where,
                                        std::string& value) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) return where + "." + key + " must be a string, not " + it->type_name();
  value = it->get<std::string>();
  return std::nullopt;
}

std::optional<std::string> parse_message(const json& item, const std::string& where, ChatMessage& message) {
  if (!item.is_object()) return where + " must be an object with \"role\" and \"content\", not " + std::string(item.type_name());
  if (!item.contains("role")) return where + " has no \"role\"";
  if (auto bad = string_field(item, "role", where, message.role)) return bad;
  bool known = false;
  for (const std::string& role : known_roles()) known = known || role == message.role;
  if (!known) return where + ".role = \"" + message.role + "\" is not one of system, user, assistant, tool";
  const auto content = item.find("content");
  if (content != item.end() && content->is_array()) {
    // Content parts: the text parts, concatenated (images and audio are not trained on).
    for (const json& part : *content) {
      if (part.is_object() && part.contains("type") && part["type"] == "text" && part.contains("text") &&
          part["text"].is_string())
        message.content += part["text"].get<std::string>();
      else return where + ".content holds a part that is not {\"type\": \"text\", \"text\": ...}";
    }
  } else if (auto bad = string_field(item, "content", where, message.content)) {
    return bad;
  }
  if (auto bad = string_field(item, "tool_call_id", where, message.tool_call_id)) return bad;
  if (auto bad = string_field(item, "name", where, message.name)) return bad;
  if (item.contains("tool_calls") && !item["tool_calls"].is_null()) {
    if (!item["tool_calls"].is_array()) return where + ".tool_calls must be a list";
    if (message.role != "assistant") return where + ".tool_calls is only valid on an assistant message";
    for (const json& call : item["tool_calls"]) {
      if (!call.is_object() || !call.contains("function") || !call["function"].is_object() ||
          !call["function"].contains("name") || !call["function"]["name"].is_string())
        return where + ".tool_calls holds a call without function.name";
    }
    message.tool_calls = item["tool_calls"];
  }
  if (content == item.end() && message.tool_calls.empty()) return where + " has no \"content\"";
  return std::nullopt;
}

std::optional<std::string> parse_messages_form(const json& object, Conversation& out) {
  const json& messages = object["messages"];
  if (!messages.is_array()) return std::string("\"messages\" must be a list");
  if (messages.empty()) return std::string("\"messages\" is empty");
  for (size_t i = 0; i < messages.size(); ++i) {
    ChatMessage message;
    if (auto bad = parse_message(messages[i], "messages[" + std::to_string(i) + "]", message)) return bad;
    out.messages.push_back(std::move(message));
  }
  if (object.contains("tools") && !object["tools"].is_null()) {
    if (!object["tools"].is_array()) return std::string("\"tools\" must be a list");
    out.tools = object["tools"];
  }
  return std::nullopt;
}

std::optional<std::string> parse_prompt_response_form(const json& object, Conversation& out) {
  ChatMessage system, user, assistant;
  system.role = "system";
  user.role = "user";
  assistant.role = "assistant";
  if (auto bad = string_field(object, "system", "", system.content)) return bad.value().substr(1);
  if (!object["input"].is_string()) return std::string("\"input\" must be a string");
  if (!object.contains("output")) return std::string("has \"input\" but no \"output\"");
  if (!object["output"].is_string()) return std::string("\"output\" must be a string");
  user.content = object["input"].get<std::string>();
  assistant.content = object["output"].get<std::string>();
  if (!system.content.empty()) out.messages.push_back(std::move(system));
  out.messages.push_back(std::move(user));
  out.messages.push_back(std::move(assistant));
  return std::nullopt;
}

}  // namespace

std::optional<std::string> parse_conversation(const std::string& line, Conversation& out) {
  json object;
  try {
    object = json::parse(line);
  } catch (const json::parse_error& e) {
    std::string what = e.what();
    const size_t colon = what.find("syntax error");
    return "not valid JSON (" + (colon == std::string::npos ? what : what.substr(colon)) + ")";
  }
  if (!object.is_object()) return "a line must be a JSON object, not " + std::string(object.type_name());
  if (object.contains("messages")) return parse_messages_form(object, out);
  if (object.contains("input")) return parse_prompt_response_form(object, out);
  return std::string("has neither \"messages\" (OpenAI chat form) nor \"input\"/\"output\" (prompt/response form)");
}

std::vector<Conversation> load_conversations(const std::vector<std::string>& paths, bool skip_bad_lines,
                                             ChatLoadReport& report) {
  std::vector<Conversation> conversations;
  for (const std::string& path : paths) {
    std::ifstream in(path, std::ios::binary);
    LOOM_CHECK(in.good(), "chat data file '" + path + "' cannot be read (does it exist?)");
    std::string line;
    int64_t number = 0;
    while (std::getline(in, line)) {
      ++number;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.find_first_not_of(" \t") == std::string::npos) continue;
      ++report.lines;
      Conversation conversation;
      conversation.file = path;
      conversation.line = number;
      if (auto bad = parse_conversation(line, conversation)) {
        const std::string problem = path + ":" + std::to_string(number) + ": " + *bad;
        LOOM_CHECK(skip_bad_lines, problem + " (set sft.bad_lines=skip to skip such lines)");
        report.problems.push_back(problem);
        continue;
      }
      conversations.push_back(std::move(conversation));
      ++report.conversations;
    }
  }
  return conversations;
}

bool in_validation(uint64_t seed, int64_t index, double val_fraction) {
  return philox_uniform(philox_key(seed, "sft.split"), static_cast<uint64_t>(index)) < val_fraction;
}

}  // namespace loom::data
