#include "loom/cli/memory_advice.h"

#include <new>

#include "loom/core/error.h"

namespace loom::cli {

std::string training_memory_advice(const std::string& config, const std::vector<std::string>& overrides) {
  std::string command = config;
  for (const std::string& o : overrides) command += " " + o;
  return "\nWhat this layout needs per rank: loom plan memory " + command +
         "\nTo need less: a smaller train.micro_batch (the global batch stays: more micro-batches a step), "
         "model.recompute=true, parallel.zero=1, 2 or 3 over data-parallel ranks, or more ranks in parallel.tp "
         "or parallel.pp (loom plan search " +
         config + " --hardware FILE --devices N lists the layouts that fit).";
}

int with_training_memory_advice(const std::string& config, const std::vector<std::string>& overrides,
                                const std::function<int()>& run) {
  try {
    return run();
  } catch (const OutOfMemory& e) {
    throw Error(std::string(e.what()) + training_memory_advice(config, overrides));
  } catch (const std::bad_alloc&) {
    throw Error("out of host memory (an allocation failed)" + training_memory_advice(config, overrides));
  }
}

}  // namespace loom::cli
