#pragma once
// One `loom <verb>`: each verb registers its options on the CLI11 app and the action to run
// when it is the one parsed. Verbs live one per file (train_command.cpp, ...).
#include <CLI/CLI.hpp>

#include <functional>
#include <vector>

namespace loom::cli {

struct Command {
  CLI::App* app = nullptr;       // the (sub)command that must have been parsed
  std::function<int()> action;   // returns the exit code
};

void register_train(CLI::App& app, std::vector<Command>& commands);
void register_data(CLI::App& app, std::vector<Command>& commands);
void register_generate(CLI::App& app, std::vector<Command>& commands);
void register_ckpt(CLI::App& app, std::vector<Command>& commands);
void register_mesh(CLI::App& app, std::vector<Command>& commands);
void register_plan(CLI::App& app, std::vector<Command>& commands);
void register_bench(CLI::App& app, std::vector<Command>& commands);
void register_launch(CLI::App& app, std::vector<Command>& commands);
void register_convert(CLI::App& app, std::vector<Command>& commands);

}  // namespace loom::cli
