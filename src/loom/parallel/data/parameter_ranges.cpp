#include "loom/parallel/data/parameter_ranges.h"

namespace loom::parallel {

std::vector<optim::Segment> optimizer_segments(const model::ParameterStore& params) {
  std::vector<optim::Segment> segments;
  for (const model::Parameter& p : params.list()) segments.push_back({p.offset, p.numel, p.weight_decay, p.lr_scale});
  return segments;
}

}  // namespace loom::parallel
