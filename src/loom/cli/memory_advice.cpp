#include "loom/cli/memory_advice.h"

#include <new>

#include "loom/core/error.h"

namespace loom::cli {

std::string training_memory_advice(const std::string& config, const std::vector<std::string>& overrides) {
  std::string command = config;
  for (const std::string& o : overrides) command += " " + o;
  return "\nWhat this layout needs per rank: loom plan memory " + command +
         "\nTo need less: a smaller train.micro_batch (the global batch stays: more micro-batches a step), "
         "model.recompute=true, parallel.zero=1, 2 or 3 over data-parallel ranks, more ranks in parallel.tp "
         "or parallel.pp, or on a GPU optim.cpu_offload=true (the Adam moments in host memory) (loom plan search " +
         config + " --hardware FILE --devices N lists the layouts that fit).";
}

std::string serving_memory_advice(int64_t kv_cache_mb, int64_t max_batch_tokens) {
  return "\nTo need less: a smaller --kv-cache-mb (now " + std::to_string(kv_cache_mb) +
         " MiB per rank), more --tp ranks (each holds its share of the weights and of the cache), or a smaller "
         "--max-batch-tokens (now " +
         std::to_string(max_batch_tokens) + " rows a step).";
}

int with_memory_advice(const std::string& advice, const std::function<int()>& run) {
  try {
    return run();
  } catch (const OutOfMemory& e) {
    throw Error(std::string(e.what()) + advice);
  } catch (const std::bad_alloc&) {
    throw Error("out of host memory (an allocation failed)" + advice);
  }
}

}  // namespace loom::cli
