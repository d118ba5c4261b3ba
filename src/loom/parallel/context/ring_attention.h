#pragma once
// Ring attention (parallel.cp_comm = p2p): each rank keeps its queries and passes its key/value
// block around the ring of the cp group; while one block is being attended to, the next one is
// already in flight (one batched send and receive: Communicator::exchange_async), and the partial outputs are merged in fp32 through
// their log-sum-exps. Backward recomputes per block with the final output and LSE; the key/value
// gradients travel with the blocks and reach their owners after a last hop. Visibility uses the
// tokens' global positions, so the load-balanced chunks need not be contiguous. Each rank sends
// 2 x (its tokens) x kv_heads x head_dim floats per hop, cp - 1 hops forward: about 2 S B kv_heads
// head_dim floats per layer whatever cp.
#include <vector>

#include "loom/comm/communicator.h"
#include "loom/core/device.h"
#include "loom/model/context_attention.h"
#include "loom/parallel/context/group_attention.h"

namespace loom::parallel {

class RingAttention final : public GroupAttention {
 public:
  RingAttention(comm::Communicator& cp, Device device);
  void forward(float* att, model::ContextSaved& saved, const float* qkv, const kernels::AttentionShape& local,
               const model::Packing& packing) override;
  void backward(float* d_qkv, const float* d_att, const float* qkv, const float* att, const model::ContextSaved& saved,
                const kernels::AttentionShape& local, const model::Packing& packing) override;

 private:
  // Global positions of every rank's tokens, [batch, seq] each (rebuilt when the shape changes).
  void plan_positions(const kernels::AttentionShape& local);
  // Which keys of `owner`'s block this rank's queries see: global positions, and with packed
  // documents the document ids (`documents`: every rank's, gathered in forward).
  kernels::AttentionVisibility visibility(int owner, const model::Packing& packing, int64_t tokens) const;
  // Every rank's document ids where the attention kernels read them (on a GPU, a device copy).
  void place_documents(const std::vector<int32_t>& documents);
  // This rank's keys and values, [rows, 2 x kv width] (k then v), copied out of the fused rows.
  float* own_block(const float* qkv, const kernels::AttentionShape& local);

  int64_t planned_batch_ = -1, planned_seq_ = -1;
  std::vector<std::vector<int32_t>> positions_;  // by rank
  std::vector<DeviceBuffer<int32_t>> device_positions_;  // on a GPU: their device copies
  const int32_t* documents_ = nullptr;  // every rank's document ids (packed documents), for the kernels
  model::Buffer blocks_[2], grads_[2], part_out_, part_lse_;
  DeviceBuffer<int32_t> device_documents_;  // on a GPU: the copy documents_ points to
};

}  // namespace loom::parallel
