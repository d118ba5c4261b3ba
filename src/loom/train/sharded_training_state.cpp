#include "loom/train/sharded_training_state.h"

#include <algorithm>

#include "loom/ckpt/tensor_names.h"

namespace loom::train {

ckpt::Slice parameter_slice(const model::Parameter& p) {
  ckpt::Slice slice = ckpt::full_slice(p.global_shape());
  if (p.shard.is_split()) slice[p.shard.split_dim] = {p.shard.start, p.shard.length};
  return slice;
}

std::vector<ckpt::TensorRef> owned_training_state(const model::Transformer& model,
                                                  const std::vector<parallel::OwnedRange>& owned) {
  std::vector<ckpt::TensorRef> refs;
  for (const model::Parameter& p : model.params().list()) {
    if (!p.shard.counts_in_norm) continue;  // another rank stores this copy
    const std::string names[3] = {p.name, ckpt::optimizer_state_name("exp_avg", p.name),
                                  ckpt::optimizer_state_name("exp_avg_sq", p.name)};
    for (const parallel::OwnedRange& range : owned) {
      const int64_t first = std::max(range.begin, p.offset), last = std::min(range.end, p.offset + p.numel);
      if (first >= last) continue;
      int64_t at = first;  // the rectangles follow each other in flat order
      for (ckpt::Slice slice : ckpt::flat_range_slices(p.shape, first - p.offset, last - first)) {
        const int64_t numel = ckpt::slice_numel(slice);
        if (p.shard.is_split()) slice[p.shard.split_dim].first += p.shard.start;  // local -> global
        const float* sources[3] = {range.value, range.exp_avg, range.exp_avg_sq};
        for (int k = 0; k < 3; ++k) {
          if (sources[k] == nullptr) continue;  // values only (Trainer::parameter_shards)
          refs.push_back({names[k], p.global_shape(), DType::F32, sources[k] + (at - range.begin), slice});
        }
        at += numel;
      }
    }
  }
  return refs;
}

std::vector<parallel::OwnedRange> host_ranges(Device device, std::vector<parallel::OwnedRange> ranges,
                                              std::vector<float>& storage) {
  if (device.is_cpu()) return ranges;
  // The arrays to copy: those not in host memory already (the moments under optim.cpu_offload,
  // the values too under parallel.offload_params), which are written from where they are.
  auto on_device = [](parallel::OwnedRange& r) {
    std::vector<const float**> arrays;
    auto copied = [&arrays](const float** array) {
      if (*array != nullptr) arrays.push_back(array);
    };
    if (!r.values_on_host) copied(&r.value);
    if (!r.moments_on_host) {
      copied(&r.exp_avg);
      copied(&r.exp_avg_sq);
    }
    return arrays;
  };
  int64_t total = 0;
  for (parallel::OwnedRange& r : ranges) total += (r.end - r.begin) * static_cast<int64_t>(on_device(r).size());
  storage.resize(static_cast<size_t>(total));
  float* at = storage.data();
  for (parallel::OwnedRange& r : ranges) {
    const int64_t n = r.end - r.begin;
    for (const float** array : on_device(r)) {
      copy_to_host(device, at, *array, n);
      *array = at;
      at += n;
    }
  }
  return ranges;
}

}  // namespace loom::train
