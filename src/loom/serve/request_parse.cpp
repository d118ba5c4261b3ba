#include "loom/serve/request_parse.h"

#include <cmath>
#include <limits>

#include "loom/serve/api_error.h"
#include "loom/serve/chat_template.h"

namespace loom::serve {

namespace {
using nlohmann::json;

bool present(const json& body, const char* key) { return body.contains(key) && !body[key].is_null(); }

double number(const json& body, const char* key, double lo, double hi, double fallback) {
  if (!present(body, key)) return fallback;
  const json& v = body[key];
  if (!v.is_number()) throw bad_field(key, "must be a number");
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < lo || x > hi)
    throw bad_field(key, "must be in [" + json(lo).dump() + ", " + json(hi).dump() + "], got " + v.dump());
  return x;
}

int64_t integer(const json& body, const char* key, int64_t lo, int64_t hi, int64_t fallback) {
  if (!present(body, key)) return fallback;
  const json& v = body[key];
  if (!v.is_number_integer()) throw bad_field(key, "must be an integer, got " + v.dump());
  const int64_t x = v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi) ? hi + 1 : v.get<int64_t>();
  if (x < lo || x > hi) throw bad_field(key, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + v.dump());
  return x;
}

bool boolean(const json& body, const char* key, bool fallback) {
  if (!present(body, key)) return fallback;
  if (!body[key].is_boolean()) throw bad_field(key, "must be true or false, got " + body[key].dump());
  return body[key].get<bool>();
}

std::vector<int32_t> token_list(const json& v, const std::string& where, const ModelInfo& model) {
  std::vector<int32_t> ids;
  for (const json& t : v) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= model.vocab)
      throw bad_field(where, "token ids must be integers in [0, " + std::to_string(model.vocab) + "), got " + t.dump());
    ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  return ids;
}

std::vector<std::vector<int32_t>> prompts_of(const json& body, const ModelInfo& model) {
  if (!present(body, "prompt")) throw bad_field("prompt", "is required");
  const json& p = body["prompt"];
  auto encode = [&](const json& text) { return model.tokenizer->encode(text.get<std::string>()); };
  if (p.is_string()) return {encode(p)};
  if (!p.is_array() || p.empty()) throw bad_field("prompt", "must be a string, an array of strings, or token ids");
  if (p[0].is_number()) return {token_list(p, "prompt", model)};
  std::vector<std::vector<int32_t>> prompts;
  for (const json& item : p) {
    if (item.is_string()) prompts.push_back(encode(item));
    else if (item.is_array()) prompts.push_back(token_list(item, "prompt", model));
    else throw bad_field("prompt", "array items must be strings or arrays of token ids");
  }
  return prompts;
}

std::vector<std::string> stop_strings(const json& body) {
  if (!present(body, "stop")) return {};
  const json& v = body["stop"];
  if (v.is_string()) return {v.get<std::string>()};
  if (!v.is_array()) throw bad_field("stop", "must be a string or an array of strings");
  std::vector<std::string> stops;
  for (const json& s : v) {
    if (!s.is_string() || s.get<std::string>().empty()) throw bad_field("stop", "items must be non-empty strings");
    stops.push_back(s.get<std::string>());
  }
  return stops;
}

void sampling_fields(const json& body, const ModelInfo& model, ParsedRequest& r) {
  infer::RequestOptions& o = r.options;
  o.sampling.temperature = number(body, "temperature", 0.0, 100.0, 1.0);
  o.sampling.top_p = number(body, "top_p", 0.0, 1.0, 1.0);
  if (o.sampling.top_p == 0.0) throw bad_field("top_p", "must be in (0, 1], got 0");
  o.sampling.min_p = number(body, "min_p", 0.0, 1.0, 0.0);
  const int64_t top_k = integer(body, "top_k", -1, std::numeric_limits<int32_t>::max(), 0);
  o.sampling.top_k = top_k < 0 ? 0 : static_cast<int>(top_k);
  o.n = static_cast<int>(integer(body, "n", 1, 128, 1));
  if (present(body, "seed")) o.seed = static_cast<uint64_t>(integer(body, "seed", std::numeric_limits<int64_t>::min(),
                                                                      std::numeric_limits<int64_t>::max(), 0));
  o.stop = stop_strings(body);
  if (present(body, "stop_token_ids")) {
    if (!body["stop_token_ids"].is_array()) throw bad_field("stop_token_ids", "must be an array of token ids");
    o.stop_token_ids = token_list(body["stop_token_ids"], "stop_token_ids", model);
  }
  o.ignore_eos = boolean(body, "ignore_eos", false);
  o.penalties.presence = number(body, "presence_penalty", -2.0, 2.0, 0.0);
  o.penalties.frequency = number(body, "frequency_penalty", -2.0, 2.0, 0.0);
  o.penalties.repetition = number(body, "repetition_penalty", 0.0, 100.0, 1.0);
  if (o.penalties.repetition == 0.0) throw bad_field("repetition_penalty", "must be in (0, 100], got 0");
  if (present(body, "best_of") && integer(body, "best_of", 1, 128, 1) != o.n)
    throw bad_field("best_of", "is not supported (only equal to n)");
  r.stream = boolean(body, "stream", false);
  if (present(body, "stream_options")) {
    const json& so = body["stream_options"];
    if (!so.is_object()) throw bad_field("stream_options", "must be an object");
    if (!r.stream) throw bad_field("stream_options", "is only allowed with stream: true");
    r.include_usage = boolean(so, "include_usage", false);
  }
  r.return_token_ids = boolean(body, "return_token_ids", false);
  r.tokens_as_ids = boolean(body, "return_tokens_as_token_ids", false);
}
}  // namespace

json parse_body(const std::string& text) {
  json body;
  try {
    body = json::parse(text);
  } catch (const json::parse_error& e) {
    throw ApiError(400, std::string("the request body is not valid JSON: ") + e.what(), "", "invalid_request_error",
                   "invalid_json");
  }
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object", "", "invalid_request_error", "invalid_json");
  return body;
}

ParsedRequest parse_request(const json& body, bool chat, const ModelInfo& model) {
  ParsedRequest r;
  r.chat = chat;
  if (present(body, "model")) {
    if (!body["model"].is_string()) throw bad_field("model", "must be a string");
    if (body["model"].get<std::string>() != model.name)
      throw ApiError(400, "model: '" + body["model"].get<std::string>() + "' is not served here (this server serves '" +
                              model.name + "')", "model", "invalid_request_error", "model_not_found");
  }
  sampling_fields(body, model, r);
  int64_t max_tokens = -1;
  if (chat) {
    if (!present(body, "messages")) throw bad_field("messages", "is required");
    r.prompts = {model.tokenizer->encode(render_chat(body["messages"]))};
    r.options.stop.push_back(chat_end_of_turn());
    r.logprobs = boolean(body, "logprobs", false);
    r.options.top_logprobs = static_cast<int>(integer(body, "top_logprobs", 0, 20, 0));
    if (r.options.top_logprobs > 0 && !r.logprobs) throw bad_field("top_logprobs", "needs logprobs: true");
    max_tokens = integer(body, "max_completion_tokens", 1, model.context, -1);
    if (max_tokens < 0) max_tokens = integer(body, "max_tokens", 1, model.context, -1);
  } else {
    r.prompts = prompts_of(body, model);
    r.logprobs = present(body, "logprobs");
    r.options.top_logprobs = static_cast<int>(integer(body, "logprobs", 0, 20, 0));
    r.echo = boolean(body, "echo", false);
    max_tokens = integer(body, "max_tokens", 1, model.context, 16);
  }
  for (const auto& p : r.prompts) {
    if (p.empty()) throw bad_field(chat ? "messages" : "prompt", "is empty (no tokens)");
    if (static_cast<int64_t>(p.size()) >= model.context)
      throw bad_field(chat ? "messages" : "prompt", "is " + std::to_string(p.size()) +
                          " tokens; the model's context is " + std::to_string(model.context) + " tokens");
  }
  // Without max_tokens a chat turn may use the rest of the context.
  if (max_tokens < 0) max_tokens = model.context - static_cast<int64_t>(r.prompts[0].size());
  for (const auto& p : r.prompts) {
    if (static_cast<int64_t>(p.size()) + max_tokens > model.context)
      throw bad_field("max_tokens", "the prompt (" + std::to_string(p.size()) + " tokens) plus max_tokens (" +
                                        std::to_string(max_tokens) + ") exceeds the model's context of " +
                                        std::to_string(model.context) + " tokens");
  }
  r.options.max_tokens = max_tokens;
  return r;
}

}  // namespace loom::serve
