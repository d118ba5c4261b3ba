#pragma once
// Head sharding over a context-parallel group: this rank's tokens with every head <-> every token
// of 1/cp of the heads, by one all-to-all each way (ContextAttention::rows_to_heads and
// heads_to_rows; Ulysses attention's qkv and outputs, a Mamba-2 mixer's projections and gated
// outputs). Owns the send and receive buffers, reused call after call.
#include <cstdint>
#include <vector>

#include "loom/comm/communicator.h"
#include "loom/core/device.h"
#include "loom/model/buffers.h"
#include "loom/model/context_attention.h"

namespace loom::parallel {

class HeadExchange {
 public:
  HeadExchange(comm::Communicator& cp, Device device);
  void to_heads(float* whole, const float* rows, int64_t batch, int64_t seq, int64_t row_width,
                const std::vector<model::HeadColumns>& segments);
  void to_rows(float* rows, const float* whole, int64_t batch, int64_t seq, int64_t row_width,
               const std::vector<model::HeadColumns>& segments, bool accumulate);

 private:
  // One exchange's send and receive blocks: cp blocks of `rows` x `width` columns each (part j of
  // every segment for rank j), in send_ and recv_.
  struct Blocks {
    int64_t width;
    float *send, *recv;
  };
  Blocks blocks(int64_t rows, const std::vector<model::HeadColumns>& segments);

  comm::Communicator* cp_;
  Device device_;
  model::Buffer send_, recv_;
};

}  // namespace loom::parallel
