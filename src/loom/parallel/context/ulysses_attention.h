#pragma once
// Ulysses attention (parallel.cp_comm = a2a): one all-to-all turns this rank's tokens of every
// head into every token of 1/cp of the heads (and of the kv heads: grouped-query attention keeps
// each query head with its kv head), attention runs over whole sequences on those heads, and a
// second all-to-all brings the outputs back to their tokens. Backward mirrors it. The bytes each
// rank sends shrink as 1/cp; the heads (and kv heads) of a tensor-parallel rank must divide by cp.
#include <vector>

#include "loom/comm/communicator.h"
#include "loom/core/device.h"
#include "loom/model/context_attention.h"
#include "loom/parallel/context/group_attention.h"

namespace loom::parallel {

class UlyssesAttention final : public GroupAttention {
 public:
  UlyssesAttention(comm::Communicator& cp, Device device);
  void forward(float* att, model::ContextSaved& saved, const float* qkv, const kernels::AttentionShape& local,
               const model::Packing& packing) override;
  void backward(float* d_qkv, const float* d_att, const float* qkv, const float* att, const model::ContextSaved& saved,
                const kernels::AttentionShape& local, const model::Packing& packing) override;

 private:
  // The whole sequence's shape on this rank's 1/cp of the heads; throws naming the heads when
  // they do not split.
  kernels::AttentionShape head_shape(const kernels::AttentionShape& local) const;
  // Rows in `local` (width = the full rows') <-> whole sequences of this rank's heads, by one
  // all-to-all; `accumulate` adds into the local rows.
  void to_heads(float* whole, const float* rows, const kernels::AttentionShape& local, bool fused_qkv);
  void to_tokens(float* rows, const float* whole, const kernels::AttentionShape& local, bool fused_qkv, bool accumulate);

  model::Buffer whole_grad_, whole_d_qkv_;
  DeviceBuffer<int32_t> device_documents_;  // on a GPU: the whole sequence's document ids
  // `visible` with its document ids (a copy of `documents`) where the kernels read them.
  kernels::AttentionVisibility placed(kernels::AttentionVisibility visible, const std::vector<int32_t>& documents);
};

}  // namespace loom::parallel
