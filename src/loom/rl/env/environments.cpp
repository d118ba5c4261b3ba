// The shipped environments: arithmetic and countdown from the synthetic task generators
// (data/tasks/), and calculator, a multi-turn arithmetic task with a calculator tool.
#include <cctype>

#include "loom/core/error.h"
#include "loom/data/tasks/countdown.h"
#include "loom/data/tasks/task.h"
#include "loom/rl/env/environment.h"
#include "loom/serve/api_error.h"

namespace loom::rl {

namespace {
using nlohmann::json;

std::string trimmed(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  return std::string(text);
}

json user_prompt(const std::string& text) { return json::array({{{"role", "user"}, {"content", text}}}); }

// Exact match: 1 when the reply is exactly the answer, else 0.
class ArithmeticEnvironment : public Environment {
 public:
  explicit ArithmeticEnvironment(const EnvironmentOptions& o) : options_(o) {}
  std::string name() const override { return "arithmetic"; }
  Episode episode(int64_t index) const override {
    const data::SynthTask t = data::make_task("arithmetic", options_.seed, index, {options_.digits, options_.numbers});
    return {user_prompt(t.prompt), t.task};
  }
  Reward verify(const json& task, const std::string& answer, const json&) const override {
    const bool correct = data::verify_response(task, answer);
    return {correct ? 1.0 : 0.0, {{"correct", correct ? 1 : 0}}};
  }

 protected:
  EnvironmentOptions options_;
};

// TinyZero's reward: 1 for a correct equation (each given number at most once, exact value),
// 0.1 for a well-formed expression that is wrong, 0 for anything else.
class CountdownEnvironment : public Environment {
 public:
  explicit CountdownEnvironment(const EnvironmentOptions& o) : options_(o) {}
  std::string name() const override { return "countdown"; }
  Episode episode(int64_t index) const override {
    const data::SynthTask t = data::make_task("countdown", options_.seed, index, {options_.digits, options_.numbers});
    return {user_prompt(t.prompt), t.task};
  }
  Reward verify(const json& task, const std::string& answer, const json&) const override {
    const std::string reply = trimmed(answer);
    const bool correct = data::verify_response(task, reply);
    const size_t equals = reply.rfind('=');
    const bool well_formed = data::evaluate_expression(std::string_view(reply).substr(0, equals)).has_value();
    const double reward = correct ? 1.0 : well_formed ? 0.1 : 0.0;
    return {reward, {{"correct", correct ? 1 : 0}, {"well_formed", well_formed || correct ? 1 : 0}}};
  }

 private:
  EnvironmentOptions options_;
};

// Arithmetic with a tool: the model may write <tool_call>{"name": "calculator", "arguments":
// {"expression": "..."}}</tool_call>, gets the value back as a tool message, then answers.
class CalculatorEnvironment : public ArithmeticEnvironment {
 public:
  using ArithmeticEnvironment::ArithmeticEnvironment;
  std::string name() const override { return "calculator"; }
  Episode episode(int64_t index) const override {
    Episode e = ArithmeticEnvironment::episode(index);
    const std::string system =
        "You can use a calculator: write <tool_call>{\"name\": \"calculator\", \"arguments\": {\"expression\": "
        "\"12 * 34\"}}</tool_call> and its result comes back. Reply with the final number only.";
    e.messages.insert(e.messages.begin(), json{{"role", "system"}, {"content", system}});
    return e;
  }
  Reward verify(const json& task, const std::string& answer, const json& messages) const override {
    Reward r = ArithmeticEnvironment::verify(task, answer, messages);
    int64_t calls = 0;
    if (messages.is_array()) {
      for (const json& m : messages) calls += m.is_object() && m.value("role", "") == "tool" ? 1 : 0;
    }
    r.components["tool_calls"] = calls;
    return r;
  }
  json tools() const override {
    return json::array({{{"type", "function"},
                         {"function",
                          {{"name", "calculator"},
                           {"description", "evaluates an integer expression: + - * / (exact division) and parentheses"},
                           {"parameters",
                            {{"type", "object"},
                             {"properties", {{"expression", {{"type", "string"}}}}},
                             {"required", {"expression"}}}}}}}});
  }
  json call_tool(const std::string& name, const json& arguments) const override {
    if (name != "calculator") return Environment::call_tool(name, arguments);
    if (!arguments.is_object() || !arguments.contains("expression") || !arguments["expression"].is_string())
      throw serve::bad_field("expression", "a string holding the expression to evaluate is required");
    const std::string expression = arguments["expression"].get<std::string>();
    if (expression.size() > 1000) throw serve::bad_field("expression", "longer than 1000 characters");
    const auto value = data::evaluate_expression(expression);
    // A wrong expression is the model's mistake, not a bad request: it gets the error as the result.
    if (!value) return {{"result", nullptr}, {"error", "cannot evaluate '" + expression + "'"}};
    return {{"result", value->value}};
  }
};

}  // namespace

json Environment::call_tool(const std::string& name, const json&) const {
  throw serve::ApiError(404, "environment '" + this->name() + "' has no tool '" + name + "'", "tool");
}

std::vector<std::string> environment_kinds() { return {"arithmetic", "countdown", "calculator"}; }

std::unique_ptr<Environment> make_environment(const EnvironmentOptions& options) {
  LOOM_CHECK(options.digits >= 1 && options.digits <= 9, "environment digits must be in [1, 9], got " + std::to_string(options.digits));
  if (options.task == "arithmetic") return std::make_unique<ArithmeticEnvironment>(options);
  if (options.task == "countdown") return std::make_unique<CountdownEnvironment>(options);
  if (options.task == "calculator") return std::make_unique<CalculatorEnvironment>(options);
  throw Error("environment task '" + options.task + "' is unknown; valid: arithmetic, countdown, calculator");
}

}  // namespace loom::rl
