#pragma once
// Completes the gradients of parameters that several tensor-parallel ranks hold (TpGradSync::
// SumOverHolders): norms under sequence parallelism see only their rank's rows, a replicated kv
// head only its rank's query heads. After each unit's backward their contributions of this
// micro-batch are summed over the holders; what earlier micro-batches accumulated is set aside
// first, so it is not summed again. Gradients move by strided copies on the model's device (a
// shard's contiguous runs in the global tensor, shard_runs) and are added with kernels::add_in_place.
#include <vector>

#include "loom/model/buffers.h"
#include "loom/model/parameters.h"
#include "loom/model/tensor_parallel.h"

namespace loom::model {

class TensorParallelGrads {
 public:
  TensorParallelGrads(ParameterStore& store, const TensorParallel& tp, const std::vector<std::vector<int>>& unit_params);
  // Before the unit's backward: set aside the accumulated gradients of its synced parameters.
  void begin_unit(int unit);
  // After it: sum this micro-batch's gradients over the holders, then add back what was set aside.
  void finish_unit(int unit);

 private:
  ParameterStore* store_;
  const TensorParallel* tp_;
  std::vector<std::vector<int>> synced_;  // per unit
  std::vector<int64_t> global_numel_;     // per unit: the synced parameters' global elements
  Buffer stash_, global_;
};

}  // namespace loom::model
