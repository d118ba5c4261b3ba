// The GPU paged attention against the CPU kernel (same contract, kernels/cpu/paged_attention.h):
// a batch step mixing decode rows and prefill chunks of several sequences whose blocks are
// scattered over the pool, sequence lengths that end inside blocks, awkward block sizes, GQA
// (groups of 1 to 16 heads, 3 and 5 among them), head_dim from 8 to 256 (33: odd), sequences longer than a tile of keys,
// q rows as strided views of a fused qkv: fp32 within 1e-5 relative, outputs poisoned. The cache
// write puts every row's key and value exactly where the CPU's does; attention_decode over one
// contiguous cache likewise; bf16 pools too (written rounded as the CPU's, bit for bit; attention
// within 1e-5). Rows longer than a partition of kPagedPartitionKeys keys (split attention, merged
// after; head_dim 256 among them), and GQA groups over the 8 query heads a block takes. A row's
// output is the same bits alone as in its batch, also where a batch is launched in slices. Fresh
// random inputs; skipped, saying why, without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "loom/core/dtype_convert.h"
#include "loom/kernels/cpu/attention.h"
#include "loom/kernels/cpu/paged_attention.h"
#include "loom/kernels/cuda/paged_attention.h"

namespace loom::kernels::cuda {
namespace {

using testing::DeviceArray;
using testing::DeviceFloats;
using testing::poison;
using testing::random_values;
using testing::relative_error;

struct Case {
  std::string name;
  int64_t heads, kv_heads, head_dim, block_size;
  std::vector<int64_t> lengths;  // each sequence's positions in the cache after this step
  int64_t new_rows;              // the last new_rows positions of each sequence are this step's rows
};

// A step's rows, block tables over a shuffled pool, and the fused qkv of the rows.
struct Step {
  Step(const Case& c, uint32_t seed) : shape{c.heads, c.kv_heads, c.head_dim, c.block_size, 0} {
    const int64_t sequences_count = static_cast<int64_t>(c.lengths.size());
    for (int64_t len : c.lengths) shape.table_width = std::max(shape.table_width, (len + c.block_size - 1) / c.block_size);
    blocks = sequences_count * shape.table_width + 3;  // a few blocks nobody uses
    std::vector<int32_t> pool(static_cast<size_t>(blocks));
    std::iota(pool.begin(), pool.end(), 0);
    std::shuffle(pool.begin(), pool.end(), std::mt19937(seed));
    tables.assign(static_cast<size_t>(sequences_count * shape.table_width), -1);
    size_t next = 0;
    for (int64_t s = 0; s < sequences_count; ++s) {
      for (int64_t b = 0; b * c.block_size < c.lengths[s]; ++b) tables[s * shape.table_width + b] = pool[next++];
      for (int64_t p = std::max<int64_t>(0, c.lengths[s] - c.new_rows); p < c.lengths[s]; ++p) {
        sequences.push_back(static_cast<int32_t>(s));
        positions.push_back(static_cast<int32_t>(p));
      }
    }
    rows = static_cast<int64_t>(positions.size());
    kv_width = c.kv_heads * c.head_dim;
    stride = (c.heads + 2 * c.kv_heads) * c.head_dim;
    qkv = random_values(seed + 1, rows * stride, 1.0f);
    keys = random_values(seed + 2, blocks * c.block_size * kv_width, 1.0f);
    values = random_values(seed + 3, blocks * c.block_size * kv_width, 1.0f);
  }
  PagedAttentionShape shape;
  int64_t blocks = 0, rows = 0, kv_width = 0, stride = 0;
  std::vector<int32_t> tables, sequences, positions;
  std::vector<float> qkv, keys, values;
};

class CudaPagedAttention : public testing::GpuTest<::testing::TestWithParam<Case>> {};

TEST_P(CudaPagedAttention, CacheWriteAndAttentionMatchTheCpu) {
  const Case& c = GetParam();
  Step s(c, seed_);
  const int64_t att_width = c.heads * c.head_dim;
  // CPU: this step's keys and values into the cache, then attention over it.
  std::vector<float> keys = s.keys, values = s.values, out(static_cast<size_t>(s.rows * att_width));
  cpu::paged_cache_write(keys.data(), values.data(), s.qkv.data() + att_width, s.qkv.data() + att_width + s.kv_width,
                         s.stride, s.tables.data(), s.sequences.data(), s.positions.data(), s.rows, s.shape);
  cpu::paged_attention(out.data(), s.qkv.data(), s.stride, keys.data(), values.data(), s.tables.data(),
                       s.sequences.data(), s.positions.data(), s.rows, s.shape);
  DeviceFloats d_qkv(allocator_, s.qkv), d_keys(allocator_, s.keys), d_values(allocator_, s.values),
      d_out(allocator_, poison(s.rows * att_width));
  DeviceArray<int32_t> d_tables(allocator_, s.tables), d_sequences(allocator_, s.sequences),
      d_positions(allocator_, s.positions);
  paged_cache_write(d_keys.ptr, d_values.ptr, d_qkv.ptr + att_width, d_qkv.ptr + att_width + s.kv_width, s.stride,
                    d_tables.ptr, d_sequences.ptr, d_positions.ptr, s.rows, s.shape);
  EXPECT_EQ(d_keys.host(), keys) << c.name << " (seed " << seed_ << ")";
  EXPECT_EQ(d_values.host(), values) << c.name << " (seed " << seed_ << ")";
  paged_attention(d_out.ptr, d_qkv.ptr, s.stride, d_keys.ptr, d_values.ptr, d_tables.ptr, d_sequences.ptr,
                  d_positions.ptr, s.rows, s.shape);
  EXPECT_LE(relative_error(d_out.host(), out), 1e-5) << c.name << " (seed " << seed_ << ")";
}

// bf16 pools (`--kv-cache-dtype bf16`): the cache write rounds every key and value as the CPU's
// does (bit for bit), and attention widens them as it reads (1e-5 of the CPU's).
TEST_P(CudaPagedAttention, Bf16PoolsMatchTheCpu) {
  const Case& c = GetParam();
  Step s(c, seed_);
  PagedAttentionShape shape = s.shape;
  shape.cache = KvCacheDtype::Bf16;
  const int64_t att_width = c.heads * c.head_dim;
  auto rounded = [](const std::vector<float>& x) {
    std::vector<uint16_t> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) out[i] = f32_to_bf16(x[i]);
    return out;
  };
  std::vector<uint16_t> keys = rounded(s.keys), values = rounded(s.values);
  std::vector<float> out(static_cast<size_t>(s.rows * att_width));
  DeviceArray<uint16_t> d_keys(allocator_, keys), d_values(allocator_, values);
  cpu::paged_cache_write(keys.data(), values.data(), s.qkv.data() + att_width, s.qkv.data() + att_width + s.kv_width,
                         s.stride, s.tables.data(), s.sequences.data(), s.positions.data(), s.rows, shape);
  cpu::paged_attention(out.data(), s.qkv.data(), s.stride, keys.data(), values.data(), s.tables.data(),
                       s.sequences.data(), s.positions.data(), s.rows, shape);
  DeviceFloats d_qkv(allocator_, s.qkv), d_out(allocator_, poison(s.rows * att_width));
  DeviceArray<int32_t> d_tables(allocator_, s.tables), d_sequences(allocator_, s.sequences),
      d_positions(allocator_, s.positions);
  paged_cache_write(d_keys.ptr, d_values.ptr, d_qkv.ptr + att_width, d_qkv.ptr + att_width + s.kv_width, s.stride,
                    d_tables.ptr, d_sequences.ptr, d_positions.ptr, s.rows, shape);
  EXPECT_EQ(d_keys.host(), keys) << c.name << " (seed " << seed_ << ")";
  EXPECT_EQ(d_values.host(), values) << c.name << " (seed " << seed_ << ")";
  paged_attention(d_out.ptr, d_qkv.ptr, s.stride, d_keys.ptr, d_values.ptr, d_tables.ptr, d_sequences.ptr,
                  d_positions.ptr, s.rows, shape);
  EXPECT_LE(relative_error(d_out.host(), out), 1e-5) << c.name << " (seed " << seed_ << ")";
}

// Each row of `s` attended alone (a batch of one, the tables as they are) gives the bits it gets
// inside the whole batch, as the engine's scheduling needs: a sequence's tokens must not depend
// on what else runs in its step, whatever the row's length or partitions.
void expect_rows_alone_equal_the_batch(const Step& s, CachingAllocator& allocator, const std::string& name,
                                       uint32_t seed) {
  const int64_t att_width = s.shape.heads * s.shape.head_dim;
  DeviceFloats d_qkv(allocator, s.qkv), d_keys(allocator, s.keys), d_values(allocator, s.values),
      d_batch(allocator, poison(s.rows * att_width)), d_alone(allocator, poison(s.rows * att_width));
  DeviceArray<int32_t> d_tables(allocator, s.tables), d_sequences(allocator, s.sequences),
      d_positions(allocator, s.positions);
  paged_attention(d_batch.ptr, d_qkv.ptr, s.stride, d_keys.ptr, d_values.ptr, d_tables.ptr, d_sequences.ptr,
                  d_positions.ptr, s.rows, s.shape);
  for (int64_t r = 0; r < s.rows; ++r) {
    paged_attention(d_alone.ptr + r * att_width, d_qkv.ptr + r * s.stride, s.stride, d_keys.ptr, d_values.ptr,
                    d_tables.ptr, d_sequences.ptr + r, d_positions.ptr + r, 1, s.shape);
  }
  const std::vector<float> batch = d_batch.host(), alone = d_alone.host();
  for (size_t i = 0; i < batch.size(); ++i) {
    ASSERT_TRUE(std::isfinite(batch[i])) << name << ": element " << i << " unwritten (poison), seed " << seed;
    ASSERT_EQ(std::bit_cast<uint32_t>(alone[i]), std::bit_cast<uint32_t>(batch[i]))
        << name << ": row " << static_cast<int64_t>(i) / att_width << " (position "
        << s.positions[i / static_cast<size_t>(att_width)] << "), seed " << seed;
  }
}

TEST_P(CudaPagedAttention, EachRowAloneEqualsItsRowInTheBatchBitForBit) {
  expect_rows_alone_equal_the_batch(Step(GetParam(), seed_), allocator_, GetParam().name, seed_);
}

// A prompt chunk of 520 rows at positions 7672 .. 8191 (30 to 32 partitions, 32 heads): more
// partials than one launch holds (kPagedPartialBytes), so the batch is launched in slices of
// rows; each row still equals itself alone. (Not against the CPU: its reference would take
// seconds here.)
class CudaPagedAttentionSlices : public testing::GpuTest<::testing::Test> {};
TEST_F(CudaPagedAttentionSlices, ABatchLaunchedInSlicesEqualsItsRowsAlone) {
  const Case c{"sliced_prompt_chunk", 32, 8, 64, 16, {8192}, 520};
  const Step s(c, seed_);
  const int64_t partials_bytes =
      s.rows * c.heads * (8192 / kPagedPartitionKeys) * (c.head_dim + 2) * static_cast<int64_t>(sizeof(float));
  ASSERT_GT(partials_bytes, kPagedPartialBytes) << "the case must need more than one launch";
  expect_rows_alone_equal_the_batch(s, allocator_, c.name, seed_);
}

// The same over one contiguous cache (attention_decode, `loom generate`'s): 520 new rows after
// 7672 positions, in slices, each row equal to itself as a call of one row bit for bit.
TEST_F(CudaPagedAttentionSlices, ContiguousRowsInSlicesEqualTheirRowsAlone) {
  const int64_t heads = 32, kv_heads = 8, head_dim = 64, past = 7672, rows = 520;
  const int64_t stride = (heads + 2 * kv_heads) * head_dim, att_width = heads * head_dim;
  const int64_t kv_width = kv_heads * head_dim, length = past + rows;
  DeviceFloats d_q(allocator_, random_values(seed_, rows * stride, 1.0f)),
      d_keys(allocator_, random_values(seed_ + 1, length * kv_width, 1.0f)),
      d_values(allocator_, random_values(seed_ + 2, length * kv_width, 1.0f)),
      d_batch(allocator_, poison(rows * att_width)), d_alone(allocator_, poison(rows * att_width));
  attention_decode(d_batch.ptr, d_q.ptr, stride, d_keys.ptr, d_values.ptr, past, rows, heads, kv_heads, head_dim);
  for (int64_t r = 0; r < rows; ++r) {
    attention_decode(d_alone.ptr + r * att_width, d_q.ptr + r * stride, stride, d_keys.ptr, d_values.ptr, past + r, 1,
                     heads, kv_heads, head_dim);
  }
  const std::vector<float> batch = d_batch.host(), alone = d_alone.host();
  for (size_t i = 0; i < batch.size(); ++i) {
    ASSERT_TRUE(std::isfinite(batch[i])) << "element " << i << " unwritten (poison), seed " << seed_;
    ASSERT_EQ(std::bit_cast<uint32_t>(alone[i]), std::bit_cast<uint32_t>(batch[i]))
        << "row " << static_cast<int64_t>(i) / att_width << ", seed " << seed_;
  }
}

// attention_decode (loom generate's contiguous cache): the same kernel without block tables, new
// row r attending to positions 0 .. past + r, against the CPU's attention_decode.
TEST_P(CudaPagedAttention, ContiguousDecodeMatchesTheCpu) {
  const Case& c = GetParam();
  const int64_t past = c.lengths[0] - 1, rows = std::min<int64_t>(c.new_rows, c.lengths[0]);
  const int64_t first = past + 1 - rows;  // the new rows' first position
  const int64_t kv_width = c.kv_heads * c.head_dim, stride = (c.heads + 2 * c.kv_heads) * c.head_dim;
  const std::vector<float> q = random_values(seed_, rows * stride, 1.0f),
                           keys = random_values(seed_ + 1, (past + 1) * kv_width, 1.0f),
                           values = random_values(seed_ + 2, (past + 1) * kv_width, 1.0f);
  std::vector<float> out(rows * c.heads * c.head_dim);
  cpu::attention_decode(out.data(), q.data(), stride, keys.data(), values.data(), first, rows, c.heads, c.kv_heads,
                        c.head_dim);
  DeviceFloats d_q(allocator_, q), d_keys(allocator_, keys), d_values(allocator_, values),
      d_out(allocator_, poison(rows * c.heads * c.head_dim));
  attention_decode(d_out.ptr, d_q.ptr, stride, d_keys.ptr, d_values.ptr, first, rows, c.heads, c.kv_heads, c.head_dim);
  EXPECT_LE(relative_error(d_out.host(), out), 1e-5) << c.name << " (seed " << seed_ << ")";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaPagedAttention,
    ::testing::Values(Case{"decode_gqa2", 4, 2, 16, 5, {1, 7, 23, 5}, 1},
                      Case{"prefill_chunks_gqa4", 8, 2, 64, 16, {37, 16, 3}, 13},
                      Case{"mha_odd_head_dim", 6, 6, 40, 3, {10, 4}, 10},
                      Case{"mqa_head_dim_128", 8, 1, 128, 7, {50, 1, 29}, 2},
                      Case{"long_sequence_over_tiles", 4, 2, 32, 13, {700, 130}, 3},
                      Case{"head_dim_256", 2, 1, 256, 16, {129, 8, 300}, 4},
                      Case{"tiny_head_dim_block_1", 8, 4, 8, 1, {9, 2, 17}, 9},
                      // Lengths at and around partition edges (kPagedPartitionKeys = 256): one
                      // partition, one key over, two, three and four partitions (the contiguous
                      // decode's two rows, lengths 256 and 257, straddle the edge in one call).
                      Case{"partition_edges_gqa4", 8, 2, 64, 16, {257, 256, 512, 513, 1000, 1}, 2},
                      // 16 query heads on one kv head: two blocks of 8 heads each share the keys;
                      // 12 on one: blocks of 8 and 4.
                      Case{"mqa_16_heads_split", 16, 1, 32, 8, {600, 31}, 3},
                      Case{"group_of_12_head_dim_48", 12, 1, 48, 5, {300}, 2},
                      Case{"long_head_dim_128", 8, 2, 128, 16, {2049, 64}, 1},
                      // Groups a block's heads round up (3 in a block of 4, 5 in one of 8: the
                      // rest are dummies), and one head per block past head_dim 128 (a single
                      // product per run summed over the lanes).
                      Case{"group_of_3_head_dim_96", 6, 2, 96, 16, {700, 9}, 2},
                      Case{"group_of_5", 10, 2, 64, 8, {300, 40}, 3},
                      Case{"mha_head_dim_256", 4, 4, 256, 16, {600, 3}, 2},
                      // An odd head_dim: one load per column instead of pairs.
                      Case{"odd_head_dim_33", 4, 2, 33, 7, {300, 20}, 2}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace loom::kernels::cuda
