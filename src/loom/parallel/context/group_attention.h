#pragma once
// What both context-parallel attentions (ring_attention.h, ulysses_attention.h) share: the cp
// group, the whole sequences' token ids gathered over it, and the head sharding a Mamba-2 mixer
// uses whatever the attention's exchange (head_exchange.h).
#include <cstdint>
#include <vector>

#include "loom/comm/communicator.h"
#include "loom/core/device.h"
#include "loom/model/context_attention.h"
#include "loom/parallel/context/head_exchange.h"

namespace loom::parallel {

class GroupAttention : public model::ContextAttention {
 public:
  int size() const override { return cp_->size(); }
  int rank() const override { return cp_->rank(); }
  void gather_sequences(int32_t* whole, const int32_t* local, int64_t batch, int64_t seq) override;
  void rows_to_heads(float* whole, const float* rows, int64_t batch, int64_t seq, int64_t row_width,
                     const std::vector<model::HeadColumns>& segments) override;
  void heads_to_rows(float* rows, const float* whole, int64_t batch, int64_t seq, int64_t row_width,
                     const std::vector<model::HeadColumns>& segments, bool accumulate) override;

 protected:
  GroupAttention(comm::Communicator& cp, Device device) : cp_(&cp), device_(device), heads_(cp, device) {}

  comm::Communicator* cp_;
  Device device_;
  HeadExchange heads_;
};

}  // namespace loom::parallel
