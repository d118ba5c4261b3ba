#include "loom/parallel/context/head_exchange.h"

#include "loom/parallel/context/communication.h"
#include "loom/parallel/context/ulysses_layout.h"

namespace loom::parallel {

HeadExchange::HeadExchange(comm::Communicator& cp, Device device)
    : cp_(&cp), device_(device), send_(device), recv_(device) {}

void HeadExchange::to_heads(float* whole, const float* rows, int64_t batch, int64_t seq, int64_t row_width,
                            const std::vector<model::HeadColumns>& segments) {
  const int cp = cp_->size();
  const int64_t n = batch * seq, block = head_block_width(segments, cp);
  float* send = model::sized(send_, cp * n * block);
  float* recv = model::sized(recv_, cp * n * block);
  split_heads(device_, send, rows, n, row_width, segments, cp);
  exchange_all_to_all(*cp_, send, recv, n * block);
  blocks_to_sequence(device_, whole, recv, batch, seq, block, cp);
}

void HeadExchange::to_rows(float* rows, const float* whole, int64_t batch, int64_t seq, int64_t row_width,
                           const std::vector<model::HeadColumns>& segments, bool accumulate) {
  const int cp = cp_->size();
  const int64_t n = batch * seq, block = head_block_width(segments, cp);
  float* send = model::sized(send_, cp * n * block);
  float* recv = model::sized(recv_, cp * n * block);
  sequence_to_blocks(device_, send, whole, batch, seq, block, cp);
  exchange_all_to_all(*cp_, send, recv, n * block);
  merge_heads(device_, rows, recv, n, row_width, segments, cp, accumulate);
}

}  // namespace loom::parallel
