#pragma once
// Serial reference of every collective, over one input vector per rank, computed in double.
// Header-only and independent of any backend, so the tests of every backend (tests/comm for
// threads, tests/mpi for MPI) check their results against the same definitions.
//
// Conventions follow communicator.h: rank r's input is in[r]; blocks are consecutive.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "loom/comm/communicator.h"

namespace loom::comm::reference {

using Buffers = std::vector<std::vector<double>>;  // one vector per rank

namespace detail {

inline void require(bool condition, const std::string& message) {
  if (!condition) throw std::invalid_argument("serial reference: " + message);
}

inline void require_equal_lengths(const Buffers& in) {
  require(!in.empty(), "no ranks");
  for (const auto& v : in) require(v.size() == in[0].size(), "ranks hold inputs of different lengths");
}

inline std::vector<double> slice(const std::vector<double>& v, int64_t begin, int64_t count) {
  require(begin >= 0 && count >= 0 && begin + count <= static_cast<int64_t>(v.size()), "block out of range");
  return {v.begin() + begin, v.begin() + begin + count};
}

}  // namespace detail

// Element-wise reduction over ranks: Sum, Avg (= Sum / ranks), Max. A NaN anywhere gives NaN.
inline std::vector<double> reduce(const Buffers& in, ReduceOp op) {
  detail::require_equal_lengths(in);
  std::vector<double> out(in[0].size());
  for (size_t i = 0; i < out.size(); ++i) {
    double acc = op == ReduceOp::Max ? -std::numeric_limits<double>::infinity() : 0.0;
    bool nan = false;
    for (const auto& v : in) {
      nan = nan || std::isnan(v[i]);
      acc = op == ReduceOp::Max ? std::max(acc, v[i]) : acc + v[i];
    }
    if (op == ReduceOp::Avg) acc /= static_cast<double>(in.size());
    out[i] = nan ? std::numeric_limits<double>::quiet_NaN() : acc;
  }
  return out;
}

// Sum over ranks of |x|, element-wise: the scale that bounds the rounding error of a reduction.
inline std::vector<double> abs_sum(const Buffers& in) {
  detail::require_equal_lengths(in);
  std::vector<double> out(in[0].size(), 0.0);
  for (const auto& v : in) {
    for (size_t i = 0; i < out.size(); ++i) out[i] += std::abs(v[i]);
  }
  return out;
}

// Every rank's result of all_reduce.
inline std::vector<double> all_reduce(const Buffers& in, ReduceOp op) { return reduce(in, op); }

// in[r] holds size * recv_count elements; rank r gets the reduction of block r.
inline Buffers reduce_scatter(const Buffers& in, int64_t recv_count, ReduceOp op) {
  detail::require_equal_lengths(in);
  const int64_t ranks = static_cast<int64_t>(in.size());
  detail::require(static_cast<int64_t>(in[0].size()) == ranks * recv_count, "reduce_scatter input is not size * recv_count");
  const std::vector<double> full = reduce(in, op);
  Buffers out;
  for (int64_t r = 0; r < ranks; ++r) out.push_back(detail::slice(full, r * recv_count, recv_count));
  return out;
}

// Every rank's result of all_gather and all_gather_v: the inputs concatenated in rank order.
inline std::vector<double> all_gather(const Buffers& in) {
  std::vector<double> out;
  for (const auto& v : in) out.insert(out.end(), v.begin(), v.end());
  return out;
}

// Every rank's result of broadcast.
inline std::vector<double> broadcast(const Buffers& in, int root) {
  detail::require(root >= 0 && root < static_cast<int>(in.size()), "root out of range");
  return in[root];
}

// in[q] holds size * count elements; rank r receives block r of every rank q, in rank order.
inline Buffers all_to_all(const Buffers& in, int64_t count) {
  detail::require_equal_lengths(in);
  const int64_t ranks = static_cast<int64_t>(in.size());
  detail::require(static_cast<int64_t>(in[0].size()) == ranks * count, "all_to_all input is not size * count");
  Buffers out(ranks);
  for (int64_t r = 0; r < ranks; ++r) {
    for (int64_t q = 0; q < ranks; ++q) {
      const auto block = detail::slice(in[q], r * count, count);
      out[r].insert(out[r].end(), block.begin(), block.end());
    }
  }
  return out;
}

// send_counts[q][r] elements of in[q] (consecutive blocks in r order) go to rank r; rank r
// receives them in q order. (Rank r's recv_counts[q] is send_counts[q][r].)
inline Buffers all_to_all_v(const Buffers& in, const std::vector<std::vector<int64_t>>& send_counts) {
  const size_t ranks = in.size();
  detail::require(send_counts.size() == ranks, "one send_counts vector per rank");
  Buffers out(ranks);
  for (size_t q = 0; q < ranks; ++q) {
    detail::require(send_counts[q].size() == ranks, "send_counts needs one entry per rank");
    const int64_t total = std::accumulate(send_counts[q].begin(), send_counts[q].end(), int64_t{0});
    detail::require(static_cast<int64_t>(in[q].size()) == total, "all_to_all_v input length is not the sum of its counts");
    int64_t offset = 0;
    for (size_t r = 0; r < ranks; ++r) {
      const auto block = detail::slice(in[q], offset, send_counts[q][r]);
      out[r].insert(out[r].end(), block.begin(), block.end());
      offset += send_counts[q][r];
    }
  }
  return out;
}

}  // namespace loom::comm::reference
