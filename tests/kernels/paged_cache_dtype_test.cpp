// The paged KV cache's bf16 pools (PagedAttentionShape::cache, `loom serve --kv-cache-dtype`) on
// the CPU: the cache write stores each key and value rounded to nearest even where the fp32 write
// stores it, and attention over bf16 pools is the fp32 kernel over their widened values, bit for
// bit (a batch step mixing decode rows and prefill chunks, GQA, scattered blocks). Prompt rows
// attended tile by tile are the same rows of one call.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "loom/core/dtype_convert.h"
#include "loom/core/error.h"
#include "loom/kernels/cpu/paged_attention.h"

namespace loom::kernels::cpu {
namespace {

std::vector<float> random_floats(uint32_t seed, int64_t n) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = normal(rng);
  return v;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& x) {
  std::vector<uint16_t> out(x.size());
  std::transform(x.begin(), x.end(), out.begin(), [](float v) { return f32_to_bf16(v); });
  return out;
}
std::vector<float> widened(const std::vector<uint16_t>& x) {
  std::vector<float> out(x.size());
  std::transform(x.begin(), x.end(), out.begin(), [](uint16_t v) { return bf16_to_f32(v); });
  return out;
}

// Three sequences of 11, 4 and 19 positions over a shuffled pool of blocks of 3; this step's rows
// are the last 4 positions of each (a prefill chunk, a whole short prompt, a chunk of a long one).
struct Step {
  Step() {
    const std::vector<int64_t> lengths = {11, 4, 19};
    shape.table_width = 7;
    blocks = 3 * shape.table_width + 2;
    std::vector<int32_t> pool(static_cast<size_t>(blocks));
    std::iota(pool.begin(), pool.end(), 0);
    std::shuffle(pool.begin(), pool.end(), std::mt19937(5));
    tables.assign(static_cast<size_t>(3 * shape.table_width), -1);
    size_t next = 0;
    for (int64_t s = 0; s < 3; ++s) {
      for (int64_t b = 0; b * shape.block_size < lengths[s]; ++b) tables[s * shape.table_width + b] = pool[next++];
      for (int64_t p = std::max<int64_t>(0, lengths[s] - 4); p < lengths[s]; ++p) {
        sequences.push_back(static_cast<int32_t>(s));
        positions.push_back(static_cast<int32_t>(p));
      }
    }
    rows = static_cast<int64_t>(positions.size());
    qkv = random_floats(1, rows * stride);
    keys = random_floats(2, blocks * shape.block_size * kv_width);
    values = random_floats(3, blocks * shape.block_size * kv_width);
  }
  PagedAttentionShape shape{8, 2, 16, 3, 0};
  int64_t blocks = 0, rows = 0, kv_width = 2 * 16, stride = (8 + 2 * 2) * 16, att_width = 8 * 16;
  std::vector<int32_t> tables, sequences, positions;
  std::vector<float> qkv, keys, values;
};

TEST(PagedCacheDtype, Bf16WritesAreTheRoundedKeysAndValuesAndAttentionIsTheFp32KernelOverThem) {
  Step s;
  // bf16 pools, and the fp32 pools holding their values.
  std::vector<uint16_t> keys16 = to_bf16(s.keys), values16 = to_bf16(s.values);
  std::vector<float> keys32 = widened(keys16), values32 = widened(values16);
  PagedAttentionShape bf16 = s.shape;
  bf16.cache = KvCacheDtype::Bf16;
  const float* k = s.qkv.data() + s.att_width;
  const float* v = k + s.kv_width;
  paged_cache_write(keys16.data(), values16.data(), k, v, s.stride, s.tables.data(), s.sequences.data(),
                    s.positions.data(), s.rows, bf16);
  paged_cache_write(keys32.data(), values32.data(), k, v, s.stride, s.tables.data(), s.sequences.data(),
                    s.positions.data(), s.rows, s.shape);
  // Every element: the bf16 pool holds the fp32 pool's value rounded (untouched ones: already bf16).
  EXPECT_EQ(keys16, to_bf16(keys32));
  EXPECT_EQ(values16, to_bf16(values32));
  EXPECT_NE(keys32, widened(keys16));  // the fp32 write kept unrounded values
  // Attention over the bf16 pools equals the fp32 kernel over the widened pools, bit for bit.
  std::vector<float> got(static_cast<size_t>(s.rows * s.att_width)), want(got.size());
  paged_attention(got.data(), s.qkv.data(), s.stride, keys16.data(), values16.data(), s.tables.data(),
                  s.sequences.data(), s.positions.data(), s.rows, bf16);
  const std::vector<float> keys_widened = widened(keys16), values_widened = widened(values16);
  paged_attention(want.data(), s.qkv.data(), s.stride, keys_widened.data(), values_widened.data(), s.tables.data(),
                  s.sequences.data(), s.positions.data(), s.rows, s.shape);
  EXPECT_EQ(got, want);
}

// The prompt rows' tile-by-tile entry (what the CPU and the tests' emulated device run where a GPU
// uses tensor cores): each tile's rows are paged_attention's over them, bit for bit, in any tile
// order; a tile of no rows, of more than kPromptTileRows, over two table entries or past the reach
// is an error naming it.
TEST(PagedPromptTiles, EachTilesRowsArePagedAttentionsAndBadTilesAreErrorsNamingThem) {
  Step s;
  std::vector<float> want(static_cast<size_t>(s.rows * s.att_width));
  paged_attention(want.data(), s.qkv.data(), s.stride, s.keys.data(), s.values.data(), s.tables.data(),
                  s.sequences.data(), s.positions.data(), s.rows, s.shape);
  // The step's rows are 4 per sequence; tiles of 3 + 1, 4 and 2 + 2 rows, the last ones first.
  const std::vector<int32_t> tiles = {10, 2, 8, 2, 4, 4, 3, 1, 0, 3};
  std::vector<float> got(want.size(), std::nanf(""));
  paged_prompt_attention(got.data(), s.qkv.data(), s.stride, s.keys.data(), s.values.data(), s.tables.data(),
                         s.sequences.data(), s.positions.data(), tiles.data(), 5, 19, s.shape);
  EXPECT_EQ(got, want);
  auto error_of = [&](std::vector<int32_t> bad, int64_t reach = 19) {
    try {
      paged_prompt_attention(got.data(), s.qkv.data(), s.stride, s.keys.data(), s.values.data(), s.tables.data(),
                             s.sequences.data(), s.positions.data(), bad.data(), 2, reach, s.shape);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error_of({0, 4, 3, 2}).find("tile 1 mixes table entries 0 and 1"), std::string::npos);
  EXPECT_NE(error_of({0, 4, 4, 0}).find("tile 1 has 0 rows from row 4 (1 to 64 rows)"), std::string::npos);
  EXPECT_NE(error_of({0, 65, 4, 4}).find("tile 0 has 65 rows"), std::string::npos);
  EXPECT_NE(error_of({0, 4, 8, 4}, 18).find("tile 1's row 11 at position 18 is past the reach 18"), std::string::npos);
}

}  // namespace
}  // namespace loom::kernels::cpu
