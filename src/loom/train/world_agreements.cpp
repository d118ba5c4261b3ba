#include "loom/train/world_agreements.h"

#include <algorithm>
#include <csignal>
#include <cstring>
#include <string>
#include <vector>

#include "loom/core/error.h"

namespace loom::train {

int64_t agree_token_count(comm::Communicator& dp, int64_t local_tokens) {
  if (dp.size() == 1) return local_tokens;
  // Summed exactly by an f32 all-reduce: the count travels as base-256 digits, and a digit's sum
  // over up to 65536 ranks stays below 2^24, where every integer is an f32.
  constexpr int kDigits = 6, kBits = 8;
  LOOM_CHECK(local_tokens >= 0 && local_tokens < (int64_t{1} << (kDigits * kBits)),
             "token count " + std::to_string(local_tokens) + " of one rank's batch is out of range");
  LOOM_CHECK(dp.size() <= 65536, "the token count is agreed over at most 65536 data-parallel ranks, not " +
                                     std::to_string(dp.size()));
  float digits[kDigits];
  for (int i = 0; i < kDigits; ++i) digits[i] = static_cast<float>((local_tokens >> (i * kBits)) & 0xff);
  dp.all_reduce(digits, kDigits, DType::F32, comm::ReduceOp::Sum);
  int64_t total = 0;
  for (int i = 0; i < kDigits; ++i) total += static_cast<int64_t>(digits[i]) << (i * kBits);
  return total;
}

LossAndStop agree_loss_and_stop(comm::Communicator& world, bool contribute, double local_loss_sum, int stop_signal,
                                const std::vector<double>& extra_sums) {
  if (world.size() == 1) return {local_loss_sum, stop_signal, extra_sums};
  // Counts of ranks asked to stop by SIGTERM, by SIGINT and by their time (small integers: exact
  // in f32).
  const bool by_time = stop_signal == kStopForDuration;
  std::vector<float> shared = {contribute ? static_cast<float>(local_loss_sum) : 0.0f,
                               stop_signal == SIGTERM ? 1.0f : 0.0f,
                               stop_signal != 0 && stop_signal != SIGTERM && !by_time ? 1.0f : 0.0f,
                               by_time ? 1.0f : 0.0f};
  constexpr size_t kSums = 4;  // extra_sums follow
  for (double x : extra_sums) shared.push_back(contribute ? static_cast<float>(x) : 0.0f);
  world.all_reduce(shared.data(), static_cast<int64_t>(shared.size()), DType::F32, comm::ReduceOp::Sum);
  const int agreed = shared[1] > 0.0f ? SIGTERM : shared[2] > 0.0f ? SIGINT : shared[3] > 0.0f ? kStopForDuration : 0;
  return {shared[0], agreed, std::vector<double>(shared.begin() + kSums, shared.end())};
}

void sum_loss_and_tokens(comm::Communicator& group, double& loss_sum, int64_t& tokens) {
  // Gathered as 8-byte words (the double's bits as they are) and summed in rank order.
  int64_t mine[2] = {0, tokens};
  std::memcpy(&mine[0], &loss_sum, sizeof(double));
  std::vector<int64_t> all(2 * static_cast<size_t>(group.size()));
  group.all_gather(mine, all.data(), 2, DType::I64);
  loss_sum = 0.0;
  tokens = 0;
  for (int r = 0; r < group.size(); ++r) {
    double loss = 0.0;
    std::memcpy(&loss, &all[2 * static_cast<size_t>(r)], sizeof(double));
    loss_sum += loss;
    tokens += all[2 * static_cast<size_t>(r) + 1];
  }
}

void agree_sums_and_maxima(comm::Communicator& world, bool contribute, std::vector<double>& sums,
                           std::vector<double>& maxima) {
  if (world.size() == 1 && contribute) return;
  // One flag word, then the sums and maxima as 8-byte words (each double's bits as they are).
  const size_t n = 1 + sums.size() + maxima.size();
  std::vector<double> mine(n, 0.0);
  mine[0] = contribute ? 1.0 : 0.0;
  std::copy(sums.begin(), sums.end(), mine.begin() + 1);
  std::copy(maxima.begin(), maxima.end(), mine.begin() + 1 + static_cast<std::ptrdiff_t>(sums.size()));
  std::vector<double> all(n * static_cast<size_t>(world.size()));
  world.all_gather(mine.data(), all.data(), static_cast<int64_t>(n), DType::I64);
  std::fill(sums.begin(), sums.end(), 0.0);
  bool first = true;
  for (int r = 0; r < world.size(); ++r) {
    const double* theirs = all.data() + n * static_cast<size_t>(r);
    if (theirs[0] == 0.0) continue;
    for (size_t i = 0; i < sums.size(); ++i) sums[i] += theirs[1 + i];
    for (size_t i = 0; i < maxima.size(); ++i) {
      const double v = theirs[1 + sums.size() + i];
      maxima[i] = first ? v : std::max(maxima[i], v);
    }
    first = false;
  }
}

bool agree_non_finite_and_amaxes(comm::Communicator& world, comm::Communicator* same_layers, bool local_found,
                                 std::vector<float>& amaxes) {
  std::vector<float> agreed = {local_found ? 1.0f : 0.0f};
  if (same_layers == nullptr) agreed.insert(agreed.end(), amaxes.begin(), amaxes.end());
  if (world.size() > 1) {
    world.all_reduce(agreed.data(), static_cast<int64_t>(agreed.size()), DType::F32, comm::ReduceOp::Max);
  }
  if (same_layers == nullptr) {
    amaxes.assign(agreed.begin() + 1, agreed.end());
  } else if (!amaxes.empty() && same_layers->size() > 1) {
    same_layers->all_reduce(amaxes.data(), static_cast<int64_t>(amaxes.size()), DType::F32, comm::ReduceOp::Max);
  }
  return agreed[0] != 0.0f;
}

int64_t agree_save_token(comm::Communicator& world, int64_t token_on_rank0) {
  int64_t token = world.rank() == 0 ? token_on_rank0 : 0;
  if (world.size() > 1) world.broadcast(&token, 1, DType::I64, 0);
  return token;
}

void wait_for_every_rank(comm::Communicator& world) { world.barrier(); }

}  // namespace loom::train
