#include "loom/model/tensor_parallel_grads.h"

#include "loom/kernels/ops.h"

namespace loom::model {

TensorParallelGrads::TensorParallelGrads(ParameterStore& store, const TensorParallel& tp,
                                         const std::vector<std::vector<int>>& unit_params)
    : store_(&store), tp_(&tp), synced_(unit_params.size()), global_numel_(unit_params.size(), 0) {
  if (tp.single()) return;
  for (size_t u = 0; u < unit_params.size(); ++u) {
    for (int id : unit_params[u]) {
      const Parameter& p = store.list()[id];
      if (p.shard.grad_sync != TpGradSync::SumOverHolders) continue;
      synced_[u].push_back(id);
      global_numel_[u] += shape_numel(p.global_shape());
    }
  }
}

void TensorParallelGrads::begin_unit(int unit) {
  if (synced_[unit].empty()) return;
  store_->settle_grads(synced_[unit]);  // set aside as they read: a stale gradient as zero
  const Device device = store_->device();
  int64_t at = 0;
  for (int id : synced_[unit]) at += store_->list()[id].numel;
  float* stash = sized(stash_, at, device);
  for (int id : synced_[unit]) {
    const Parameter& p = store_->list()[id];
    float* g = store_->grad(id);
    copy_on_device(device, stash, g, p.numel);
    allocator(device).zero(g, static_cast<size_t>(p.numel) * sizeof(float));
    stash += p.numel;
  }
}

void TensorParallelGrads::finish_unit(int unit) {
  if (synced_[unit].empty()) return;
  const Device device = store_->device();
  // Each holder writes its gradient at its slice of the global tensor (zeros elsewhere); the sum
  // over the group then holds, at every slice, the sum over that slice's holders.
  float* global = zeroed(global_, global_numel_[unit], device);
  int64_t base = 0;
  for (int id : synced_[unit]) {
    const Parameter& p = store_->list()[id];
    const ShardRuns runs = shard_runs(p.shard, p.shape);
    copy_rows(device, global + base + runs.first, runs.global_stride, store_->grad(id), runs.length, runs.count,
              runs.length);
    base += shape_numel(p.global_shape());
  }
  tp_->all_reduce(global, global_numel_[unit]);
  // Each gradient: its slice of the sum, plus what was set aside.
  base = 0;
  const float* stash = stash_.data();
  for (int id : synced_[unit]) {
    const Parameter& p = store_->list()[id];
    const ShardRuns runs = shard_runs(p.shard, p.shape);
    float* g = store_->grad(id);
    copy_rows(device, g, runs.length, global + base + runs.first, runs.global_stride, runs.count, runs.length);
    kernels::add_in_place(device, g, stash, p.numel);
    base += shape_numel(p.global_shape());
    stash += p.numel;
  }
}

}  // namespace loom::model
