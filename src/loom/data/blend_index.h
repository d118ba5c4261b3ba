#pragma once
// Which dataset of a weighted blend each global sample reads, and which of that dataset's own
// samples: the Sainte-Laguë (Webster) apportionment, one sample at a time. Sample g goes to the
// dataset i with the largest W_i / (2 c_i + 1), c_i being the samples it got among [0, g), the
// lowest i on a tie. So every dataset's count stays within about one sample of its share
// W_i / sum(W) of any prefix of the run, whatever the weights, and its samples are its own
// indices 0, 1, 2, ... in order (each dataset shuffles them itself, epoch by epoch).
//
// The picks are the pairs (i, k) ordered by the quotient W_i / (2k + 1), highest first, so where
// pair (i, k) falls is a sum over the datasets, and the counts before any sample g follow by
// binary search, in O(datasets^2 log g): a resumed run, or a rank starting at sample 10^9, lands
// there directly. The weights become integers in the same ratios (exactly, for weights of up to
// 12 decimals) and every comparison is of exact integer products, so the order is the same on
// every machine.
#include <cstdint>
#include <vector>

namespace loom::data {

class BlendIndex {
 public:
  // Throws loom::Error unless there is at least one weight and every weight is finite and > 0.
  explicit BlendIndex(const std::vector<double>& weights);

  struct Pick {
    int dataset = 0;
    int64_t sample = 0;  // the dataset's own sample index: how many of its samples came before
  };

  int datasets() const { return static_cast<int>(weights_.size()); }
  // Samples each dataset got among global samples [0, g).
  std::vector<int64_t> counts_before(int64_t g) const;
  // Global samples first, first + 1, ..., first + n - 1.
  std::vector<Pick> picks(int64_t first, int64_t n) const;
  // The dataset the next sample goes to after `counts`.
  int next(const std::vector<int64_t>& counts) const;

 private:
  // The global index of dataset i's sample k.
  unsigned __int128 position(int dataset, int64_t k) const;

  std::vector<uint64_t> weights_;
};

}  // namespace loom::data
