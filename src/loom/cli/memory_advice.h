#pragma once
// What a training run that ran out of memory can change: added to the allocator's error (an
// OutOfMemory: the host's or a device's), so the user sees the command that shows what the
// layout needs and the keys that make it need less.
#include <functional>
#include <string>
#include <vector>

namespace loom::cli {

// The advice for a run of CONFIG with OVERRIDES, beginning with a line break.
std::string training_memory_advice(const std::string& config, const std::vector<std::string>& overrides);

// run(), with an OutOfMemory or std::bad_alloc it throws rethrown as a loom::Error saying what ran
// out, followed by that advice.
int with_training_memory_advice(const std::string& config, const std::vector<std::string>& overrides,
                                const std::function<int()>& run);

}  // namespace loom::cli
