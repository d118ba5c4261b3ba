#include "loom/model/shard_spec.h"

namespace loom::model {

int64_t global_index(const ShardSpec& spec, const Shape& local_shape, int64_t local_index) {
  if (!spec.is_split()) return local_index;
  // local = [outer, mid, inner] around the split dimension; the global tensor has the same
  // outer and inner extents and a longer mid, of which this shard holds [start, start + mid).
  int64_t inner = 1;
  for (size_t d = spec.split_dim + 1; d < local_shape.size(); ++d) inner *= local_shape[d];
  const int64_t mid = local_shape[spec.split_dim];
  const int64_t global_mid = spec.global_shape[spec.split_dim];
  const int64_t outer_index = local_index / (mid * inner);
  const int64_t mid_index = (local_index / inner) % mid;
  const int64_t inner_index = local_index % inner;
  return (outer_index * global_mid + spec.start + mid_index) * inner + inner_index;
}

ShardRuns shard_runs(const ShardSpec& spec, const Shape& local_shape) {
  const int64_t numel = shape_numel(local_shape);
  if (!spec.is_split()) return {1, numel, 0, 0};
  int64_t inner = 1;  // as global_index: [outer, mid, inner] around the split dimension
  for (size_t d = spec.split_dim + 1; d < local_shape.size(); ++d) inner *= local_shape[d];
  const int64_t length = local_shape[spec.split_dim] * inner;
  return {length == 0 ? 0 : numel / length, length, spec.start * inner, spec.global_shape[spec.split_dim] * inner};
}

}  // namespace loom::model
