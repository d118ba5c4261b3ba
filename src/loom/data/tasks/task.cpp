#include "loom/data/tasks/task.h"

#include <cctype>

#include "loom/core/error.h"
#include "loom/core/philox.h"
#include "loom/data/tasks/arithmetic.h"
#include "loom/data/tasks/countdown.h"
#include "loom/data/tasks/sorting.h"

namespace loom::data {

int64_t TaskRandom::uniform(int64_t low, int64_t high) {
  const PhiloxBlock block = philox4x32(key_, static_cast<uint64_t>(index_), draw_++);
  const uint64_t bits = (static_cast<uint64_t>(block[0]) << 32) | block[1];
  return low + static_cast<int64_t>(bits % static_cast<uint64_t>(high - low + 1));
}

std::vector<std::string> task_kinds() { return {"arithmetic", "countdown", "sorting"}; }

SynthTask make_task(const std::string& kind, uint64_t seed, int64_t index, const TaskOptions& options) {
  TaskRandom random(philox_key(seed, "synth." + kind), index);
  if (kind == "arithmetic") return make_arithmetic(random, options);
  if (kind == "countdown") return make_countdown(random, options);
  if (kind == "sorting") return make_sorting(random, options);
  throw Error("task kind '" + kind + "' is unknown; valid: arithmetic, countdown, sorting");
}

bool verify_response(const nlohmann::json& task, std::string_view response) {
  while (!response.empty() && std::isspace(static_cast<unsigned char>(response.front()))) response.remove_prefix(1);
  while (!response.empty() && std::isspace(static_cast<unsigned char>(response.back()))) response.remove_suffix(1);
  LOOM_CHECK(task.is_object() && task.contains("kind") && task["kind"].is_string(),
             "a task must be an object with a \"kind\" (one of arithmetic, countdown, sorting)");
  const std::string kind = task["kind"].get<std::string>();
  try {
    if (kind == "arithmetic") return verify_arithmetic(task, response);
    if (kind == "countdown") return verify_countdown(task, response);
    if (kind == "sorting") return verify_sorting(task, response);
  } catch (const nlohmann::json::exception& e) {
    throw Error("this " + kind + " task is missing a field or has one of the wrong type: " + e.what());
  }
  throw Error("task kind '" + kind + "' is unknown; valid: arithmetic, countdown, sorting");
}

nlohmann::json task_line(const SynthTask& task) {
  return {{"messages", {{{"role", "user"}, {"content", task.prompt}}, {{"role", "assistant"}, {"content", task.answer}}}},
          {"task", task.task}};
}

}  // namespace loom::data
