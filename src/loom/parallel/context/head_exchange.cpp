#include "loom/parallel/context/head_exchange.h"

#include "loom/parallel/context/communication.h"
#include "loom/parallel/context/ulysses_layout.h"

namespace loom::parallel {

HeadExchange::HeadExchange(comm::Communicator& cp, Device device)
    : cp_(&cp), device_(device), send_(device), recv_(device) {}

HeadExchange::Blocks HeadExchange::blocks(int64_t rows, const std::vector<model::HeadColumns>& segments) {
  const int cp = cp_->size();
  const int64_t block = head_block_width(segments, cp);
  return {block, model::sized(send_, cp * rows * block), model::sized(recv_, cp * rows * block)};
}

void HeadExchange::to_heads(float* whole, const float* rows, int64_t batch, int64_t seq, int64_t row_width,
                            const std::vector<model::HeadColumns>& segments) {
  const int64_t n = batch * seq;
  const Blocks b = blocks(n, segments);
  split_heads(device_, b.send, rows, n, row_width, segments, cp_->size());
  exchange_all_to_all(*cp_, b.send, b.recv, n * b.width);
  blocks_to_sequence(device_, whole, b.recv, batch, seq, b.width, cp_->size());
}

void HeadExchange::to_rows(float* rows, const float* whole, int64_t batch, int64_t seq, int64_t row_width,
                           const std::vector<model::HeadColumns>& segments, bool accumulate) {
  const int64_t n = batch * seq;
  const Blocks b = blocks(n, segments);
  sequence_to_blocks(device_, b.send, whole, batch, seq, b.width, cp_->size());
  exchange_all_to_all(*cp_, b.send, b.recv, n * b.width);
  merge_heads(device_, rows, b.recv, n, row_width, segments, cp_->size(), accumulate);
}

}  // namespace loom::parallel
