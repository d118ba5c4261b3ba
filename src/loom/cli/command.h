#pragma once
// One `loom <verb>`: each verb registers its options on the CLI11 app and the action to run
// when it is the one parsed. Verbs live one per file (train_command.cpp, ...).
#include <CLI/CLI.hpp>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

namespace loom::cli {

// Number checks with readable messages ("must be a positive number, got 0"), where CLI11's own
// PositiveNumber prints the range of a double. Each refuses NaN and infinities.
inline CLI::Validator number_check(const std::string& what, double low, double high, bool low_open) {
  return CLI::Validator(
      [what, low, high, low_open](std::string& text) -> std::string {
        double value = 0.0;
        size_t used = 0;
        try {
          value = std::stod(text, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        const bool ok = used == text.size() && std::isfinite(value) && (low_open ? value > low : value >= low) &&
                        value <= high;
        return ok ? std::string() : "must be " + what + ", got '" + text + "'";
      },
      what);
}
inline CLI::Validator positive() { return number_check("a positive number (> 0)", 0.0, INFINITY, true); }
inline CLI::Validator non_negative() { return number_check("a number >= 0", 0.0, INFINITY, false); }
inline CLI::Validator finite_range(double low, double high) {
  auto shown = [](double v) {
    std::string s = std::to_string(v);
    s.erase(s.find_last_not_of('0') + 1);
    if (s.back() == '.') s.pop_back();
    return s;
  };
  return number_check("a finite number in [" + shown(low) + ", " + shown(high) + "]", low, high, false);
}

struct Command {
  CLI::App* app = nullptr;       // the (sub)command that must have been parsed
  std::function<int()> action;   // returns the exit code
};

void register_train(CLI::App& app, std::vector<Command>& commands);
void register_data(CLI::App& app, std::vector<Command>& commands);
void register_generate(CLI::App& app, std::vector<Command>& commands);
void register_serve(CLI::App& app, std::vector<Command>& commands);
void register_ckpt(CLI::App& app, std::vector<Command>& commands);
void register_mesh(CLI::App& app, std::vector<Command>& commands);
void register_plan(CLI::App& app, std::vector<Command>& commands);
void register_bench(CLI::App& app, std::vector<Command>& commands);
void register_launch(CLI::App& app, std::vector<Command>& commands);
void register_convert(CLI::App& app, std::vector<Command>& commands);
void register_eval(CLI::App& app, std::vector<Command>& commands);
void register_tokenize(CLI::App& app, std::vector<Command>& commands);
void register_env(CLI::App& app, std::vector<Command>& commands);
void register_grpo(CLI::App& app, std::vector<Command>& commands);

}  // namespace loom::cli
