// Per-rank model-state memory of the GPT-2 124M config with bf16 parameters
// (precision.param_dtype=compute) for dp 2 and 4 at each ZeRO stage: what loom allocates
// (DataParallelStep::memory_bytes, as printed at start-up) against the formula
// (parallel/memory_accounting.h: 18 bytes per parameter unsharded, 6 + 12/d with ZeRO-1).
//   usage: loom_bench_memory [config=configs/gpt2-124m.yaml]
#include <cstdio>
#include <mutex>

#include "loom/comm/launch.h"
#include "loom/data/tokenizer.h"
#include "loom/parallel/data/memory_accounting.h"
#include "loom/parallel/data/data_parallel_step.h"
#include "loom/train/model_setup.h"

int main(int argc, char** argv) {
  using namespace loom;
  const std::string path = argc > 1 ? argv[1] : "configs/gpt2-124m.yaml";
  config::RunConfig config = config::load_config(path, {"precision.recipe=bf16", "precision.param_dtype=compute"});
  config.model = train::resolve_model_config(config.model, *data::make_tokenizer(config.data.tokenizer));
  auto mib = [](int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); };
  std::printf("%s, bf16 parameters (precision.param_dtype=compute), bucket_mb %.0f\n", path.c_str(),
              config.parallel.bucket_mb);
  std::printf("| dp | zero | params | grads | master | moments | total w/o comm | formula | comm buffers |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (int dp : {2, 4}) {
    for (int zero : {0, 1, 2, 3}) {
      config::RunConfig run = config;
      run.parallel.zero = zero;
      comm::LaunchOptions options;
      options.backend = "threads";
      options.ranks = dp;
      parallel::MemoryBytes bytes{};
      int64_t n = 0;
      std::mutex mutex;
      comm::launch(options, [&](comm::Communicator& world) {
        model::Transformer model(run.model, {}, model::PrecisionPolicy::from_config(run.precision));
        parallel::DataParallelStep step(world, model, run);
        if (world.rank() != 0) return;
        std::lock_guard<std::mutex> lock(mutex);
        bytes = step.memory_bytes();
        n = model.params().total();
      });
      const parallel::MemoryBytes formula = parallel::memory_per_rank({n, dp, zero, 2, 4, 0});
      std::printf("| %d | %d | %.0f | %.0f | %.0f | %.0f | %.0f MiB | %.0f MiB | %.0f |\n", dp, zero, mib(bytes.parameters),
                  mib(bytes.gradients), mib(bytes.master_weights), mib(bytes.optimizer_moments),
                  mib(bytes.total() - bytes.communication_buffers), mib(formula.total()), mib(bytes.communication_buffers));
    }
  }
  return 0;
}
