#pragma once
// The reshuffles of Ulysses attention around its all-to-alls, as plain copies (no
// communication): a rank's rows of a sequence (its 2 load-balanced chunks) with every head, to
// blocks by destination rank holding that rank's heads, and the whole sequence in natural order
// from the blocks received; and the way back. The float buffers live on `device`: each reshuffle
// is a few strided block copies there (copy_rows, copy_on_device; add_rows to accumulate), one per
// rank and head segment or per contiguous run of tokens, never a copy per row.
#include <cstdint>
#include <vector>

#include "loom/core/device.h"
#include "loom/model/context_attention.h"

namespace loom::parallel {

using model::HeadColumns;

// The columns rank j's block takes from a row of `row_width`: part j of every segment, in order.
int64_t head_block_width(const std::vector<HeadColumns>& segments, int cp);

// send[j] = part j of the segments of every row of `rows` x `row_width` `src`, [rows, block width].
void split_heads(Device device, float* send, const float* src, int64_t rows, int64_t row_width,
                 const std::vector<HeadColumns>& segments, int cp);
// The inverse: dst's segment parts from block j of `recv`, added into dst when `accumulate`.
void merge_heads(Device device, float* dst, const float* recv, int64_t rows, int64_t row_width,
                 const std::vector<HeadColumns>& segments, int cp, bool accumulate);

// recv holds cp blocks [batch, local_seq, width], block i rank i's tokens (its load-balanced
// chunks); dst = [batch, cp * local_seq, width] in natural order.
void blocks_to_sequence(Device device, float* dst, const float* recv, int64_t batch, int64_t local_seq, int64_t width,
                        int cp);
// The same for per-token ids (packed documents' ids, width 1), on the host.
void blocks_to_sequence(int32_t* dst, const int32_t* recv, int64_t batch, int64_t local_seq, int cp);
// The inverse: block i of send = rank i's tokens of src [batch, cp * local_seq, width].
void sequence_to_blocks(Device device, float* send, const float* src, int64_t batch, int64_t local_seq, int64_t width,
                        int cp);

}  // namespace loom::parallel
