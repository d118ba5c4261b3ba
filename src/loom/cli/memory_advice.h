#pragma once
// What a command that ran out of memory can change: added to the allocator's error (an
// OutOfMemory: the host's or a device's), so the user sees what to run or set instead.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace loom::cli {

// For a training run of CONFIG with OVERRIDES (loom train, sft, a GRPO learner): the command that
// shows what the layout needs and the keys that make it need less. Begins with a line break.
std::string training_memory_advice(const std::string& config, const std::vector<std::string>& overrides);

// For loom serve: the options that make the KV cache, a rank's weights or a step's rows take less.
// Begins with a line break.
std::string serving_memory_advice(int64_t kv_cache_mb, int64_t max_batch_tokens);

// run(), with an OutOfMemory or std::bad_alloc it throws rethrown as a loom::Error saying what ran
// out, followed by `advice`.
int with_memory_advice(const std::string& advice, const std::function<int()>& run);

}  // namespace loom::cli
