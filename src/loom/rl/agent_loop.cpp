#include "loom/rl/agent_loop.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <exception>
#include <limits>
#include <optional>
#include <thread>

#include "loom/rl/http_json.h"

namespace loom::rl {

namespace {
using nlohmann::json;

// One sample's episode as it goes.
struct Episode {
  std::string session;
  json messages;
  Rollout rollout;
  std::string answer;  // the last assistant text
  int64_t version = std::numeric_limits<int64_t>::max();
  int64_t tool_calls = 0;
};

json call_environment(const AgentOptions& o, const std::string& path, const json& body) {
  try {
    return post_ok(o.environment_url, path, body, o.environment_timeout_s);
  } catch (const HttpFailure& e) {
    throw EpisodeFailure(FailedRole::Environment, std::string("environment: ") + e.what());
  }
}

json chat(const AgentOptions& o, const json& messages, int n, uint64_t seed) {
  const json request = {{"model", o.model_name}, {"messages", messages}, {"n", n}, {"max_tokens", o.max_tokens},
                        {"temperature", o.temperature}, {"top_p", o.top_p}, {"seed", seed},
                        {"logprobs", true}, {"return_token_ids", true}};
  try {
    json reply = post_ok(o.model_url, "/v1/chat/completions", request, o.generation_timeout_s);
    if (!reply.is_object() || !reply.contains("choices") || !reply["choices"].is_array() ||
        reply["choices"].size() != static_cast<size_t>(n) || !reply.contains("prompt_token_ids") ||
        !reply.contains("weight_version"))
      throw HttpFailure("the chat reply lacks choices, prompt_token_ids or weight_version");
    return reply;
  } catch (const HttpFailure& e) {
    throw EpisodeFailure(FailedRole::Generation, std::string("generation worker: ") + e.what());
  } catch (const json::exception& e) {
    throw EpisodeFailure(FailedRole::Generation, std::string("generation worker: malformed reply: ") + e.what());
  }
}

// Appends a turn: the part of the prompt beyond the episode so far (untrained), then the sampled
// tokens with their log-probabilities (trained). False when the prompt does not extend the
// episode's tokens (a template or tokenizer that rewrites earlier turns): nothing is appended.
bool append_turn(Rollout& r, const json& prompt_ids, const json& choice) {
  const auto prompt = prompt_ids.get<std::vector<int32_t>>();
  if (prompt.size() < r.tokens.size() || !std::equal(r.tokens.begin(), r.tokens.end(), prompt.begin())) return false;
  for (size_t i = r.tokens.size(); i < prompt.size(); ++i) {
    r.tokens.push_back(prompt[i]);
    r.trained.push_back(0);
    r.generation_logprobs.push_back(0.0f);
  }
  const auto sampled = choice.at("token_ids").get<std::vector<int32_t>>();
  const json& logprobs = choice.at("logprobs").at("content");
  if (logprobs.size() != sampled.size()) throw json::other_error::create(501, "token_ids and logprobs differ in length", nullptr);
  for (size_t i = 0; i < sampled.size(); ++i) {
    r.tokens.push_back(sampled[i]);
    r.trained.push_back(1);
    r.generation_logprobs.push_back(logprobs[i].at("logprob").get<float>());
  }
  r.truncated = choice.value("finish_reason", json()) == "length";
  return true;
}

std::string content_of(const json& choice) {
  const json& content = choice.at("message").at("content");
  return content.is_string() ? content.get<std::string>() : "";
}

struct ToolCall {
  std::string name;
  json arguments;
  std::string error;  // a malformed call: told to the model instead of executed
};

// The first <tool_call>{...}</tool_call> of an assistant text, if any.
std::optional<ToolCall> find_tool_call(const std::string& text) {
  const size_t open = text.find("<tool_call>");
  if (open == std::string::npos) return std::nullopt;
  const size_t start = open + 11;
  const size_t close = text.find("</tool_call>", start);
  ToolCall call;
  const json parsed = json::parse(text.substr(start, close == std::string::npos ? std::string::npos : close - start), nullptr, false);
  if (parsed.is_discarded() || !parsed.is_object() || !parsed.contains("name") || !parsed["name"].is_string()) {
    call.error = "malformed tool call: expected {\"name\": ..., \"arguments\": {...}}";
    return call;
  }
  call.name = parsed["name"].get<std::string>();
  call.arguments = parsed.value("arguments", json::object());
  return call;
}

// The tool's answer as the tool message's content; an error the environment reports (a bad
// argument, an unknown tool) is shown to the model, a failed environment ends the episode.
std::string run_tool(const AgentOptions& o, const ToolCall& call) {
  if (!call.error.empty()) return "{\"error\": \"" + call.error + "\"}";
  bool valid_name = !call.name.empty();
  for (char c : call.name) valid_name = valid_name && (std::isalnum(static_cast<unsigned char>(c)) || c == '_');
  if (!valid_name || call.name == "verify" || call.name == "seed_session")
    return json{{"error", "unknown tool '" + call.name + "'"}}.dump();
  try {
    const JsonReply reply = post_json(o.environment_url, "/" + call.name, call.arguments, o.environment_timeout_s);
    if (reply.status >= 500) throw HttpFailure("POST /" + call.name + " answered " + std::to_string(reply.status));
    if (reply.status != 200) return json{{"error", reply.error_message()}}.dump();
    return reply.body.dump();
  } catch (const HttpFailure& e) {
    throw EpisodeFailure(FailedRole::Environment, std::string("environment tool: ") + e.what());
  }
}

void take_version(Episode& e, const json& reply) {
  e.version = std::min(e.version, parse_weight_version(reply.at("weight_version").get<std::string>()));
}

// A multi-turn episode of one sample: model turns and tool calls until an answer or max_turns.
void run_episode(const AgentOptions& o, Episode& e, uint64_t seed) {
  for (int turn = 0; turn < o.max_turns; ++turn) {
    const json reply = chat(o, e.messages, 1, seed + static_cast<uint64_t>(turn));
    const json& choice = reply["choices"][0];
    try {
      if (!append_turn(e.rollout, reply["prompt_token_ids"], choice)) {
        e.rollout.truncated = true;  // the conversation no longer extends its tokens: stop here
        return;
      }
      take_version(e, reply);
      e.answer = content_of(choice);
    } catch (const json::exception& ex) {
      throw EpisodeFailure(FailedRole::Generation, std::string("generation worker: malformed choice: ") + ex.what());
    }
    const auto call = find_tool_call(e.answer);
    if (!call) return;
    if (turn + 1 == o.max_turns) {
      e.rollout.truncated = true;  // the step limit stops a tool call
      return;
    }
    e.messages.push_back({{"role", "assistant"}, {"content", e.answer}});
    e.messages.push_back({{"role", "tool"}, {"content", run_tool(o, *call)}});
    ++e.tool_calls;
  }
}

Episode seed_episode(const AgentOptions& o, int64_t prompt_index) {
  const json seeded = call_environment(o, "/seed_session", {{"index", prompt_index}});
  Episode e;
  e.session = seeded.at("session_id").get<std::string>();
  e.messages = seeded.at("messages");
  const std::string served = seeded.value("environment", "");
  // A server of another task (a launcher's processes out of order) is the run's error, not the episode's.
  LOOM_CHECK(o.environment_task.empty() || served == o.environment_task,
             "environment " + o.environment_url + " serves '" + served + "', and this episode is of environment '" +
                 o.environment_name + "' (task '" + o.environment_task + "'): grpo.environments' servers are the " +
                 "environment processes in the order of its entries");
  e.rollout.environment = o.environment_name.empty() ? served : o.environment_name;
  return e;
}
}  // namespace

int64_t parse_weight_version(const std::string& version) {
  std::string digits = version.rfind("step-", 0) == 0 ? version.substr(5) : version;
  LOOM_CHECK(!digits.empty() && digits.size() < 18 && digits.find_first_not_of("0123456789") == std::string::npos,
             "weight_version '" + version + "' is not step-N or N; the controller loads weights as step-N");
  return std::stoll(digits);
}

RolloutGroup run_group(const AgentOptions& o, int64_t prompt_index, GroupStats* stats) {
  LOOM_CHECK(o.samples >= 1 && o.max_turns >= 1, "run_group: samples and max_turns must be >= 1");
  const auto start = std::chrono::steady_clock::now();
  std::vector<Episode> episodes;
  for (int i = 0; i < o.samples; ++i) episodes.push_back(seed_episode(o, prompt_index));
  if (o.max_turns == 1) {
    const json reply = chat(o, episodes[0].messages, o.samples, o.seed);
    for (int i = 0; i < o.samples; ++i) {
      try {
        const json& choice = reply["choices"][i];
        append_turn(episodes[i].rollout, reply["prompt_token_ids"], choice);
        take_version(episodes[i], reply);
        episodes[i].answer = content_of(choice);
        if (find_tool_call(episodes[i].answer)) episodes[i].rollout.truncated = true;  // no turn left for the tool
      } catch (const json::exception& ex) {
        throw EpisodeFailure(FailedRole::Generation, std::string("generation worker: malformed choice: ") + ex.what());
      }
    }
  } else {
    // The samples run at once, so the worker batches their turns.
    std::vector<std::exception_ptr> errors(episodes.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < episodes.size(); ++i) {
      threads.emplace_back([&, i] {
        try {
          run_episode(o, episodes[i], o.seed + 1000003ULL * i);
        } catch (...) {
          errors[i] = std::current_exception();
        }
      });
    }
    for (auto& t : threads) t.join();
    for (const auto& error : errors) {
      if (error) std::rethrow_exception(error);
    }
  }
  RolloutGroup group;
  group.prompt_index = prompt_index;
  group.weight_version = std::numeric_limits<int64_t>::max();
  GroupStats local;
  for (Episode& e : episodes) {
    json messages = e.messages;
    messages.push_back({{"role", "assistant"}, {"content", e.answer}});
    const json verdict = call_environment(o, "/verify", {{"session_id", e.session}, {"response", e.answer}, {"messages", messages}});
    if (!verdict.contains("reward") || !verdict["reward"].is_number())
      throw EpisodeFailure(FailedRole::Environment, "environment: /verify answered no numeric reward");
    e.rollout.reward = verdict["reward"].get<double>();
    for (uint8_t t : e.rollout.trained) local.generated_tokens += t;
    local.tool_calls += e.tool_calls;
    group.weight_version = std::min(group.weight_version, e.version);
    group.samples.push_back(std::move(e.rollout));
  }
  if (group.weight_version == std::numeric_limits<int64_t>::max()) group.weight_version = 0;
  local.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (stats) *stats = local;
  return group;
}

}  // namespace loom::rl
