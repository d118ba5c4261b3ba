#pragma once
// The training benchmarks' command line: CONFIG.yaml [section.key=value ...] [--FLAG N ...]. Each
// name in `flags` is an integer option (its value there is the default); every other argument is
// a config override. Returns the loaded config with its threads applied and its model resolved
// (the tokenizer's vocabulary); throws loom::Error on a bad config.
#include <cblas.h>
#include <omp.h>

#include <map>
#include <string>
#include <vector>

#include "loom/config/run_config.h"
#include "loom/data/tokenizer.h"
#include "loom/train/model_setup.h"

namespace loom::bench {

inline config::RunConfig load_bench_config(int argc, char** argv, std::map<std::string, int>& flags) {
  std::vector<std::string> overrides;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto flag = arg.rfind("--", 0) == 0 ? flags.find(arg.substr(2)) : flags.end();
    if (flag != flags.end() && i + 1 < argc) {
      flag->second = std::stoi(argv[++i]);
    } else {
      overrides.push_back(arg);
    }
  }
  config::RunConfig config = config::load_config(argv[1], overrides);
  if (config.train.threads > 0) {
    omp_set_num_threads(config.train.threads);
    openblas_set_num_threads(config.train.threads);
  }
  auto tokenizer = data::make_tokenizer(config.data.tokenizer);
  config.model = train::resolve_model_config(config.model, *tokenizer);
  return config;
}

}  // namespace loom::bench
