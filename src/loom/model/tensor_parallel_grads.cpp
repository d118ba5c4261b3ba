#include "loom/model/tensor_parallel_grads.h"

#include <algorithm>

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
  int64_t at = 0;
  for (int id : synced_[unit]) at += store_->list()[id].numel;
  float* stash = sized(stash_, at);
  for (int id : synced_[unit]) {
    const Parameter& p = store_->list()[id];
    float* g = store_->grad(id);
    std::copy(g, g + p.numel, stash);
    std::fill(g, g + p.numel, 0.0f);
    stash += p.numel;
  }
}

void TensorParallelGrads::finish_unit(int unit) {
  if (synced_[unit].empty()) return;
  // Each holder writes its gradient at its slice of the global tensor (zeros elsewhere); the sum
  // over the group then holds, at every slice, the sum over that slice's holders.
  float* global = zeroed(global_, global_numel_[unit]);
  int64_t base = 0;
  for (int id : synced_[unit]) {
    const Parameter& p = store_->list()[id];
    const float* g = store_->grad(id);
    for (int64_t i = 0; i < p.numel; ++i) global[base + global_index(p.shard, p.shape, i)] = g[i];
    base += shape_numel(p.global_shape());
  }
  tp_->all_reduce(global, global_numel_[unit]);
  base = 0;
  const float* stash = stash_.data();
  for (int id : synced_[unit]) {
    const Parameter& p = store_->list()[id];
    float* g = store_->grad(id);
    for (int64_t i = 0; i < p.numel; ++i) g[i] = global[base + global_index(p.shard, p.shape, i)] + stash[i];
    base += shape_numel(p.global_shape());
    stash += p.numel;
  }
}

}  // namespace loom::model
