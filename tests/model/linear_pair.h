#pragma once
// The pair of linear layers the parallel-linear tests run (Megatron's MLP shape, f ... g):
// y = x A^T + a with A: [out, in], then z = y B^T + b with B: [in, out]. Registered, allocated and
// initialised (seed 7, zero gradients) whole for the reference, or as one tensor-parallel rank's
// shards: A and a split by rows (column-parallel), B by columns (row-parallel), b replicated.
#include <cstdint>

#include "loom/model/parameters.h"
#include "loom/model/tensor_parallel.h"

namespace loom::model::testing {

struct LinearPairIds {
  int A, a, B, b;
};

inline LinearPairIds add_linear_pair(ParameterStore& store, int64_t in, int64_t out, float std) {
  const LinearPairIds ids{store.add("a.weight", {out, in}, Init::Normal, std), store.add("a.bias", {out}, Init::Normal, std),
                          store.add("b.weight", {in, out}, Init::Normal, std), store.add("b.bias", {in}, Init::Normal, std)};
  store.allocate();
  store.initialize(7);
  store.zero_grads();
  return ids;
}

// This rank's features [start, start + part) of the `out` ones.
inline LinearPairIds add_sharded_linear_pair(ParameterStore& store, const TensorParallel& tp, int64_t in, int64_t out,
                                             int64_t start, int64_t part, float std) {
  const LinearPairIds ids{
      store.add("a.weight", {part, in}, Init::Normal, std, tp.split({out, in}, 0, start, part)),
      store.add("a.bias", {part}, Init::Normal, std, tp.split({out}, 0, start, part)),
      store.add("b.weight", {in, part}, Init::Normal, std, tp.split({in, out}, 1, start, part)),
      store.add("b.bias", {in}, Init::Normal, std, tp.replicated())};
  store.allocate();
  store.initialize(7);
  store.zero_grads();
  return ids;
}

}  // namespace loom::model::testing
