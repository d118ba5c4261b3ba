#include "loom/parallel/context/ulysses_layout.h"

#include <algorithm>
#include <functional>

#include "loom/kernels/ops.h"
#include "loom/model/context_attention.h"

namespace loom::parallel {

int64_t head_block_width(const std::vector<HeadColumns>& segments, int cp) {
  int64_t width = 0;
  for (const HeadColumns& s : segments) width += s.width / cp;
  return width;
}

void split_heads(Device device, float* send, const float* src, int64_t rows, int64_t row_width,
                 const std::vector<HeadColumns>& segments, int cp) {
  const int64_t block = head_block_width(segments, cp);
  for (int j = 0; j < cp; ++j) {
    int64_t column = 0;  // where the segment's part starts in a block row
    for (const HeadColumns& s : segments) {
      const int64_t part = s.width / cp;
      copy_rows(device, send + j * rows * block + column, block, src + s.first + j * part, row_width, rows, part);
      column += part;
    }
  }
}

void merge_heads(Device device, float* dst, const float* recv, int64_t rows, int64_t row_width,
                 const std::vector<HeadColumns>& segments, int cp, bool accumulate) {
  const int64_t block = head_block_width(segments, cp);
  for (int j = 0; j < cp; ++j) {
    int64_t column = 0;
    for (const HeadColumns& s : segments) {
      const int64_t part = s.width / cp;
      float* to = dst + s.first + j * part;
      const float* from = recv + j * rows * block + column;
      if (accumulate) {
        kernels::add_rows(device, to, row_width, from, block, rows, part);
      } else {
        copy_rows(device, to, row_width, from, block, rows, part);
      }
      column += part;
    }
  }
}

namespace {

// Calls copy(block token, sequence token, count) for every run of consecutive tokens of rank i's
// block (batch row b) that lands consecutively in the whole sequence: the load-balanced chunks.
void for_each_run(int64_t batch, int64_t local_seq, int cp,
                  const std::function<void(int64_t block_token, int64_t sequence_token, int64_t count)>& copy) {
  const int64_t seq = cp * local_seq;
  for (int i = 0; i < cp; ++i) {
    for (int64_t b = 0; b < batch; ++b) {
      int64_t t = 0;
      while (t < local_seq) {
        const int64_t at = model::context_position(cp, i, local_seq, t);
        int64_t count = 1;
        while (t + count < local_seq && model::context_position(cp, i, local_seq, t + count) == at + count) ++count;
        copy((i * batch + b) * local_seq + t, b * seq + at, count);
        t += count;
      }
    }
  }
}

}  // namespace

void blocks_to_sequence(Device device, float* dst, const float* recv, int64_t batch, int64_t local_seq, int64_t width,
                        int cp) {
  for_each_run(batch, local_seq, cp, [&](int64_t from, int64_t to, int64_t count) {
    copy_on_device(device, dst + to * width, recv + from * width, count * width);
  });
}

void blocks_to_sequence(int32_t* dst, const int32_t* recv, int64_t batch, int64_t local_seq, int cp) {
  for_each_run(batch, local_seq, cp, [&](int64_t from, int64_t to, int64_t count) {
    std::copy(recv + from, recv + from + count, dst + to);
  });
}

void sequence_to_blocks(Device device, float* send, const float* src, int64_t batch, int64_t local_seq, int64_t width,
                        int cp) {
  for_each_run(batch, local_seq, cp, [&](int64_t to, int64_t from, int64_t count) {
    copy_on_device(device, send + to * width, src + from * width, count * width);
  });
}

}  // namespace loom::parallel
