#include "loom/infer/penalties.h"

#include <algorithm>

namespace loom::infer {

PenaltyCounts::PenaltyCounts(const Penalties& penalties, const std::vector<int32_t>& ids) {
  if (penalties.repetition == 1.0) return;
  prompt = ids;
  std::sort(prompt.begin(), prompt.end());
  prompt.erase(std::unique(prompt.begin(), prompt.end()), prompt.end());
}

void apply_penalties(const float* logits, int64_t vocab, const Penalties& penalties, const PenaltyCounts& counts,
                     float* out) {
  if (out != logits) std::copy(logits, logits + vocab, out);
  auto repeat = [&](int32_t id) {
    if (id < 0 || id >= vocab) return;
    const double r = penalties.repetition, v = out[id];
    out[id] = static_cast<float>(v > 0.0 ? v / r : v * r);
  };
  if (penalties.repetition != 1.0) {
    for (const int32_t id : counts.prompt) repeat(id);
    for (const auto& [id, count] : counts.output) {
      if (!std::binary_search(counts.prompt.begin(), counts.prompt.end(), id)) repeat(id);
    }
  }
  for (const auto& [id, count] : counts.output) {
    if (id < 0 || id >= vocab || count <= 0) continue;
    out[id] = static_cast<float>(out[id] - penalties.frequency * count - penalties.presence);
  }
}

const float* penalized_row(const float* logits, int64_t vocab, const Penalties& penalties, const PenaltyCounts& counts,
                           std::vector<float>& scratch) {
  if (!penalties.active()) return logits;
  scratch.resize(static_cast<size_t>(vocab));
  apply_penalties(logits, vocab, penalties, counts, scratch.data());
  return scratch.data();
}

}  // namespace loom::infer
