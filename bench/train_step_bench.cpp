// End-to-end training step benchmark: builds the model of a config, trains on random tokens
// (data loading is not what is measured) and prints tokens/s and achieved GFLOP/s per step.
//   loom_bench_train CONFIG.yaml [section.key=value ...] [--steps N] [--warmup W]
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "bench_config.h"
#include "loom/core/blas_cpu.h"
#include "loom/core/error.h"
#include "loom/core/philox.h"
#include "loom/data/tokenizer.h"
#include "loom/optim/adamw.h"
#include "loom/optim/schedule.h"
#include "loom/parallel/data/parameter_ranges.h"
#include "loom/train/model_setup.h"
#include "loom/config/run_config.h"

int main(int argc, char** argv) {
  loom::ensure_openblas_coretype(argv);
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CONFIG.yaml [section.key=value ...] [--steps N] [--warmup W]\n", argv[0]);
    return 2;
  }
  try {
    std::map<std::string, int> flags = {{"steps", 5}, {"warmup", 2}};
    const loom::config::RunConfig config = loom::bench::load_bench_config(argc, argv, flags);
    const int steps = flags["steps"], warmup = flags["warmup"];
    loom::model::Transformer model(config.model);
    model.initialize(config.train.seed);
    loom::optim::AdamW optimizer(config.optim, model.params().total(),
                                 loom::parallel::optimizer_segments(model.params()));
    const int micro = config.train.micro_batch, seq = config.data.seq_len;
    const int micro_batches = config.train.global_batch / micro;
    std::vector<int32_t> tokens(static_cast<size_t>(micro) * (seq + 1));
    const uint64_t key = loom::philox_key(config.train.seed, "bench.tokens");
    std::vector<double> times;
    double fwd_bwd_total = 0.0, optim_total = 0.0;
    for (int step = 1; step <= warmup + steps; ++step) {
      auto start = std::chrono::steady_clock::now();
      model.params().zero_grads();
      const float scale = 1.0f / static_cast<float>(config.train.global_batch * seq);
      for (int m = 0; m < micro_batches; ++m) {
        std::vector<int32_t> inputs, targets;
        for (int b = 0; b < micro; ++b) {
          for (int t = 0; t < seq; ++t) {
            uint64_t index = (static_cast<uint64_t>(step) * 1000003 + m * micro + b) * (seq + 1) + t;
            inputs.push_back(static_cast<int32_t>(loom::philox4x32(key, index)[0] % config.model.vocab_size));
            targets.push_back(static_cast<int32_t>(loom::philox4x32(key, index + 1)[0] % config.model.vocab_size));
          }
        }
        model.forward_backward(inputs.data(), targets.data(), micro, seq, scale);
      }
      auto middle = std::chrono::steady_clock::now();
      optimizer.step(model.params().values(), model.params().grads(),
                     loom::optim::learning_rate(config.optim, step, config.train.steps), step);
      auto end = std::chrono::steady_clock::now();
      if (step > warmup) {
        times.push_back(std::chrono::duration<double>(end - start).count());
        fwd_bwd_total += std::chrono::duration<double>(middle - start).count();
        optim_total += std::chrono::duration<double>(end - middle).count();
      }
    }
    std::sort(times.begin(), times.end());
    const double median = times[times.size() / 2];
    const double tokens_per_step = static_cast<double>(config.train.global_batch) * seq;
    const double flops = model.training_flops_per_token(seq) * tokens_per_step;
    std::printf("loom params=%lld tokens_per_step=%.0f threads=%d median_step_ms=%.1f tokens_per_s=%.1f "
                "gflops_per_s=%.1f forward_backward_share=%.2f optimizer_share=%.2f\n",
                static_cast<long long>(model.params().total()), tokens_per_step, omp_get_max_threads(),
                median * 1e3, tokens_per_step / median, flops / median / 1e9,
                fwd_bwd_total / (fwd_bwd_total + optim_total), optim_total / (fwd_bwd_total + optim_total));
  } catch (const loom::Error& e) {
    std::fprintf(stderr, "loom_bench_train: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
