#pragma once
// The order in which a bias gradient's column sums add the rows, the same on every device so a
// GPU's sums equal the CPU's bit for bit. The rows are cut into chunks of column_sum_chunk(rows)
// rows, each summed in row order starting from zero; the chunks into groups of
// kColumnSumChunksPerGroup, each group's chunk sums added in order starting from zero; and the
// groups' sums are added in order into the running sum. One sum per column in row order would
// leave a GPU a thread per column walking every row (a GPT-2 step's 16384 rows, on a handful of
// its SMs); the chunks give it columns x chunks threads, the groups columns x groups threads,
// and no thread adds more than 64 (or, past 65536 rows, column_sum_chunk) values.
#include <algorithm>
#include <cstdint>

namespace loom::kernels {

inline constexpr int64_t kColumnSumChunks = 1024;
inline constexpr int64_t kColumnSumChunksPerGroup = 32;

// Rows per chunk: a multiple of 64, at most kColumnSumChunks chunks.
constexpr int64_t column_sum_chunk(int64_t rows) {
  const int64_t unit = 64, units = (rows + unit * kColumnSumChunks - 1) / (unit * kColumnSumChunks);
  return unit * std::max<int64_t>(1, units);
}

}  // namespace loom::kernels
