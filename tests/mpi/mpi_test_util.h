#pragma once
// Shared pieces of the multi-process tests: the world communicator, a fixture that makes every
// rank report the same pass/fail, seeded data every rank can regenerate for every other rank,
// and serial reference results to compare the collectives with.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "loom/comm/communicator.h"
#include "loom/comm/reduce.h"
#include "loom/core/dtype.h"
#include "loom/core/error.h"

namespace loom::mpi_test {

// The world of this process (set by mpi_test_main.cpp around RUN_ALL_TESTS).
comm::Communicator& world();
void set_world(comm::Communicator* world);

// Every test derives from this: after each test, the ranks compare their outcomes, so a failure
// on any rank fails the test on all (and the exit status agrees).
class MpiTest : public ::testing::Test {
 protected:
  comm::Communicator& world() { return mpi_test::world(); }
  void TearDown() override {
    const int32_t failed = HasFailure() ? 1 : 0;
    std::vector<int32_t> flags(static_cast<size_t>(world().size()), 0);
    world().all_gather(&failed, flags.data(), 1, DType::I32);
    if (failed) return;
    for (size_t r = 0; r < flags.size(); ++r) {
      if (flags[r] != 0) ADD_FAILURE() << "rank " << r << " failed this test (see its output)";
    }
  }
};

// A value in [-1, 1) determined by (seed, rank, index) only, rounded to `dtype`'s precision so
// that it is exactly what the rank holds.
inline float sample(uint64_t seed, int rank, int64_t index, DType dtype) {
  uint64_t z = seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(rank) * 0xbf58476d1ce4e5b9ull +
               static_cast<uint64_t>(index) * 0x94d049bb133111ebull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  const float value = static_cast<float>(static_cast<double>(z >> 40) / static_cast<double>(1ull << 24)) * 2.0f - 1.0f;
  if (dtype == DType::F32) return value;
  uint16_t bits = 0;
  comm::from_f32(&bits, &value, 1, dtype);
  float back = 0;
  comm::to_f32(&back, &bits, 1, dtype);
  return back;
}

// `count` elements of dtype holding sample(seed, rank, first .. first + count).
inline std::vector<std::byte> make_data(uint64_t seed, int rank, int64_t first, int64_t count, DType dtype) {
  std::vector<float> values(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) values[static_cast<size_t>(i)] = sample(seed, rank, first + i, dtype);
  std::vector<std::byte> data(static_cast<size_t>(count) * dtype_size(dtype));
  comm::from_f32(data.data(), values.data(), count, dtype);
  return data;
}

inline std::vector<float> as_f32(const void* data, int64_t count, DType dtype) {
  std::vector<float> values(static_cast<size_t>(count));
  comm::to_f32(values.data(), data, count, dtype);
  return values;
}

// The serial reference of reducing element `index` over `ranks` (world ranks r -> sample of
// rank r): accumulated in double, then Avg-divided and rounded once to the dtype.
struct Reference {
  float value;
  double magnitude;  // sum of |inputs|, which bounds the f32 reassociation error
};
inline Reference reference(uint64_t seed, const std::vector<int>& ranks, int64_t index, DType dtype, comm::ReduceOp op) {
  double acc = op == comm::ReduceOp::Max ? -INFINITY : 0.0;
  double magnitude = 0;
  for (int r : ranks) {
    const double x = sample(seed, r, index, dtype);
    magnitude += std::fabs(x);
    acc = op == comm::ReduceOp::Max ? std::max(acc, x) : acc + x;
  }
  if (op == comm::ReduceOp::Avg) {
    acc /= static_cast<double>(ranks.size());
    magnitude /= static_cast<double>(ranks.size());
  }
  float rounded = static_cast<float>(acc);
  if (dtype != DType::F32) {
    uint16_t bits = 0;
    comm::from_f32(&bits, &rounded, 1, dtype);
    comm::to_f32(&rounded, &bits, 1, dtype);
  }
  return {rounded, magnitude};
}

// Whether `got` matches the reference: Max exactly; sums within f32 reassociation plus one
// unit in the last place of the dtype (both sides round once, from slightly different f32 sums).
inline bool close_to(float got, const Reference& ref, DType dtype, comm::ReduceOp op, int ranks) {
  if (op == comm::ReduceOp::Max) return got == ref.value;
  const double ulp = dtype == DType::F32 ? 0x1p-23 : dtype == DType::BF16 ? 0x1p-7 : 0x1p-10;
  const double tolerance = ulp * std::fabs(ref.value) + 4.0 * ranks * 0x1p-24 * ref.magnitude + 1e-30;
  return std::fabs(static_cast<double>(got) - ref.value) <= tolerance;
}

inline std::vector<int> all_ranks(int size) {
  std::vector<int> ranks(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) ranks[static_cast<size_t>(r)] = r;
  return ranks;
}

// Compares `got` (count elements of dtype) with the reduction of sample(seed, ranks, first + i);
// reports the first few mismatches.
inline ::testing::AssertionResult matches_reduction(const void* got, int64_t count, DType dtype, comm::ReduceOp op,
                                                    uint64_t seed, const std::vector<int>& ranks, int64_t first) {
  const std::vector<float> values = as_f32(got, count, dtype);
  int bad = 0;
  std::string report;
  for (int64_t i = 0; i < count; ++i) {
    const Reference ref = reference(seed, ranks, first + i, dtype, op);
    if (!close_to(values[static_cast<size_t>(i)], ref, dtype, op, static_cast<int>(ranks.size()))) {
      if (++bad <= 3) {
        report += " [" + std::to_string(i) + "] got " + std::to_string(values[static_cast<size_t>(i)]) + " want " +
                  std::to_string(ref.value) + ";";
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << count << " elements differ (" << dtype_name(dtype) << ", "
                                       << comm::reduce_op_name(op) << "):" << report;
}

// Compares `got` with the exact samples of `rank` at indices first .. first + count.
inline ::testing::AssertionResult matches_samples(const void* got, int64_t count, DType dtype, uint64_t seed, int rank,
                                                  int64_t first) {
  const std::vector<std::byte> want = make_data(seed, rank, first, count, dtype);
  if (count == 0 || std::memcmp(got, want.data(), want.size()) == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << count << " elements of rank " << rank << "'s data (from " << first
                                       << ") differ";
}

inline std::vector<DType> float_dtypes() { return {DType::F32, DType::BF16, DType::F16}; }
inline std::vector<comm::ReduceOp> reduce_ops() {
  return {comm::ReduceOp::Sum, comm::ReduceOp::Avg, comm::ReduceOp::Max};
}

// 0, 1, a prime, and a prime above one MiB of f32.
inline std::vector<int64_t> awkward_sizes() { return {0, 1, 7919, 1048583}; }

}  // namespace loom::mpi_test
