// loom plan memory CONFIG [overrides] [--ranks N] [--json] [--activation-bytes 4|2] [--attention-probs]
//                  [--kv-cache B,S]
// loom plan time   CONFIG [overrides] --hardware FILE [--ranks N] [--json]
// loom plan search CONFIG [overrides] --hardware FILE --devices N [--top K] [--json]
// Memory per rank and step time of a layout before it runs (src/loom/plan/, docs/plan.md).
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>

#include "loom/cli/command.h"
#include "loom/data/tokenizer.h"
#include "loom/config/progress.h"
#include "loom/plan/report.h"
#include "loom/train/batch_schedule.h"
#include "loom/train/layout_check.h"
#include "loom/train/model_setup.h"

namespace loom::cli {

namespace {

struct PlanArgs {
  std::string config, hardware;
  std::vector<std::string> overrides;
  int ranks = 0, devices = 0, top = 5;
  bool json = false;
  int64_t activation_bytes = 4;
  bool attention_probs = false;
  std::vector<int64_t> kv_cache;
};

// The config with the model's vocabulary resolved, as the trainer resolves it.
config::RunConfig load_run(const PlanArgs& args) {
  config::RunConfig run = config::load_config(args.config, args.overrides);
  if (run.model.vocab_size == 0) {
    run.model = train::resolve_model_config(run.model, *data::make_tokenizer(run.data.tokenizer));
  }
  return run;
}

// From the flags (plan memory) or the hardware file (plan time, plan search).
plan::MemoryOptions memory_options(const PlanArgs& args, const plan::Hardware* hardware = nullptr) {
  plan::MemoryOptions options;
  options.activation_bytes = hardware ? hardware->activation_bytes : args.activation_bytes;
  options.attention_probs = hardware ? !hardware->fused_attention : args.attention_probs;
  if (args.kv_cache.size() == 2) {
    options.kv_batch = args.kv_cache[0];
    options.kv_seq = args.kv_cache[1];
  }
  return options;
}

plan::MemoryPlan memory_of(const PlanArgs& args, const config::RunConfig& run, const plan::Hardware* hardware) {
  const int world = args.ranks > 0 ? args.ranks : run.runtime.ranks;
  return plan::plan_memory(run, train::check_layout(run, world), memory_options(args, hardware));
}

// The run's time: each global batch it trains on (a ramp-up's, then train.global_batch) planned
// as a run of that batch, times its steps; `full_step` is train.global_batch's, planned already.
// Text for the table view; `json` gets the same.
std::string run_time(const PlanArgs& args, const config::RunConfig& run, const plan::Hardware& hardware,
                     double full_step, nlohmann::json& json) {
  double seconds = 0.0;
  std::ostringstream parts;
  json = {{"steps", train::training_steps(run.train)}, {"by_batch", nlohmann::json::array()}};
  for (const train::BatchSteps& group : train::steps_by_batch(run.train)) {
    double step = full_step;
    if (group.batch != run.train.global_batch) {
      config::RunConfig at_batch = run;
      at_batch.train.global_batch = static_cast<int>(group.batch);
      at_batch.train.rampup_batch_size = {};
      step = plan::plan_time(at_batch, memory_of(args, at_batch, &hardware), hardware).step;
    }
    seconds += step * static_cast<double>(group.steps);
    parts << (json["by_batch"].empty() ? "" : " + ") << group.steps << " steps of " << group.batch << " sequences x "
          << std::fixed << std::setprecision(2) << step * 1e3 << " ms";
    json["by_batch"].push_back({{"batch", group.batch}, {"steps", group.steps}, {"step_s", step}});
  }
  json["seconds"] = seconds;
  char short_run[32];
  std::snprintf(short_run, sizeof short_run, "%.3g s", seconds);
  const std::string total = seconds < 60.0 ? short_run : config::ProgressBar::format_duration(seconds);
  return "run of " + train::run_length_key(run.train) + ": " + parts.str() + " = " + total + "\n";
}

CLI::App* add_common(CLI::App* plan, const std::string& name, const std::string& help, PlanArgs& args) {
  CLI::App* cmd = plan->add_subcommand(name, help);
  cmd->add_option("config", args.config, "YAML recipe")->required();
  cmd->add_option("overrides", args.overrides, "section.key=value overrides, as loom train takes them");
  cmd->add_flag("--json", args.json, "print JSON instead of tables");
  return cmd;
}

}  // namespace

void register_plan_layouts(CLI::App& plan, std::vector<Command>& commands) {
  auto args = std::make_shared<PlanArgs>();
  CLI::App* memory = add_common(&plan, "memory", "memory per rank of a config's layout, by category", *args);
  memory->add_option("--ranks", args->ranks, "world size (default: runtime.ranks)")->check(positive());
  memory->add_option("--activation-bytes", args->activation_bytes,
                     "bytes per activation element: 4 (the CPU backend's fp32) or 2 (bf16 activations)")
      ->check(CLI::IsMember({4, 2}))
      ->capture_default_str();
  memory->add_flag("--attention-probs", args->attention_probs,
                   "plan an attention kernel that keeps its probabilities (b x heads x s^2; loom's tiled kernel "
                   "keeps one log-sum-exp per query and head)");
  memory->add_option("--kv-cache", args->kv_cache, "serving: KV cache for BATCH,SEQ (bf16)")
      ->delimiter(',')
      ->expected(2)
      ->check(CLI::PositiveNumber);
  commands.push_back({memory, [args] {
                        const plan::MemoryPlan plan = memory_of(*args, load_run(*args), nullptr);
                        if (args->json) {
                          std::cout << plan::memory_json(plan).dump(2) << "\n";
                        } else {
                          std::cout << plan::memory_table(plan);
                        }
                        return 0;
                      }});
  CLI::App* time = add_common(&plan, "time", "step time of a config's layout on the hardware of a file", *args);
  time->add_option("--hardware", args->hardware, "hardware file (configs/hardware/*.yaml)")->required();
  time->add_option("--ranks", args->ranks, "world size (default: runtime.ranks)")->check(positive());
  commands.push_back({time, [args] {
                        const plan::Hardware hardware = plan::load_hardware(args->hardware);
                        const config::RunConfig run = load_run(*args);
                        const plan::MemoryPlan memory = memory_of(*args, run, &hardware);
                        const plan::TimeBreakdown time = plan::plan_time(run, memory, hardware);
                        nlohmann::json run_json;
                        const std::string run_line = run_time(*args, run, hardware, time.step, run_json);
                        if (args->json) {
                          std::cout << nlohmann::json{{"memory", plan::memory_json(memory)},
                                                      {"time", plan::time_json(time)},
                                                      {"run", run_json}}.dump(2)
                                    << "\n";
                        } else {
                          std::cout << plan::memory_table(memory) << "step time on " << hardware.name << ":\n"
                                    << plan::time_table(time) << run_line;
                        }
                        return 0;
                      }});
  CLI::App* search = add_common(&plan, "search", "rank the layouts of a config on N devices by step time", *args);
  search->add_option("--hardware", args->hardware, "hardware file (configs/hardware/*.yaml)")->required();
  search->add_option("--devices", args->devices, "ranks to lay the run out on")->required()->check(positive());
  search->add_option("--top", args->top, "layouts to print")->check(positive())->capture_default_str();
  commands.push_back({search, [args] {
                        const plan::Hardware hardware = plan::load_hardware(args->hardware);
                        const plan::SearchResult result = plan::search_layouts(
                            load_run(*args), hardware, args->devices,
                            [](const config::RunConfig& c, int devices) { return train::check_layout(c, devices); },
                            memory_options(*args, &hardware));
                        if (args->json) {
                          std::cout << plan::search_json(result, args->top).dump(2) << "\n";
                        } else {
                          std::cout << plan::search_table(result, args->top);
                        }
                        return result.ranked.empty() ? 1 : 0;
                      }});
}

}  // namespace loom::cli
