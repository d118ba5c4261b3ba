#pragma once
// Gradient buckets for data parallelism, and DDP's overlapped gradient reduction.
//
// Parameters live back to back in one flat buffer in registration order (embedding first, lm
// head last); backward produces their gradients in roughly the reverse order. Buckets pack the
// parameters in that reverse order, so the first bucket fills first and its reduction can start
// while backward is still computing the rest. A parameter is never split, so a bucket is one
// contiguous range of the flat buffer.
//
// For ZeRO every bucket is padded (logically: nothing is allocated for the padding in the flat
// buffers) to a multiple of the number of shard ranks and split into equal shards; rank r owns
// shard r, clipped to the bucket's real data (a shard may be short or empty).
#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

#include "loom/comm/communicator.h"
#include "loom/core/tensor.h"

namespace loom::parallel {

struct SiteReduction;  // sync_setup.h

// One parameter's place in the flat buffer.
struct ParamRange {
  int64_t offset = 0, numel = 0;
};

// A half-open range [begin, end) of flat-buffer elements.
struct FlatRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  bool empty() const { return end <= begin; }
};

struct Bucket {
  int64_t offset = 0;        // flat index of the bucket's first element
  int64_t numel = 0;         // real elements: [offset, offset + numel)
  int64_t padded_numel = 0;  // numel rounded up to a multiple of the shard ranks
  int64_t shard_numel = 0;   // padded_numel / shard ranks: what a reduce-scatter delivers per rank
  std::vector<int> params;   // parameter indices in packing order (reverse registration order)
  std::vector<FlatRange> shards;  // per rank: its shard in flat indices, clipped to the real data
};

struct BucketLayout {
  int shard_ranks = 1;
  std::vector<Bucket> buckets;      // in launch order (bucket 0 holds the last-registered parameters)
  std::vector<int> bucket_of;       // parameter index -> bucket index
  std::vector<ParamRange> params;   // the parameters the layout was made from, registration order

  int64_t numel() const;             // real elements over all buckets
  int64_t padded_numel() const;      // with the padding
  int64_t owned_numel(int rank) const;  // real elements of `rank`'s shards
};

// Packs `params` (registration order, back to back in the flat buffer) in reverse order into
// buckets of at least `bucket_bytes` of fp32 gradient each (the last bucket may be smaller; a
// parameter larger than that gets a bucket of its own), padded for `shard_ranks` (1 for plain
// DDP). Throws loom::Error when the parameters are not contiguous or the sizes are not positive.
BucketLayout make_buckets(const std::vector<ParamRange>& params, int64_t bucket_bytes, int shard_ranks);

// A piece of one parameter: elements [begin, end) of parameter `param` (indices within it).
struct ParamSlice {
  int param = 0;
  int64_t begin = 0, end = 0;
};

// The parameters a flat range covers, in flat order, each with the element range inside it
// (checkpoints store optimizer shards by global parameter slice). `params` as for make_buckets.
std::vector<ParamSlice> param_slices(const std::vector<ParamRange>& params, FlatRange range);

// How much of the gradient communication hid behind backward. `window_s` runs from the first
// bucket's launch to the end of finish(); `blocked_s` is the part of it the caller spent waiting
// for communication (in finish(), or for a communication buffer to come free). What is not
// blocked overlapped computation.
struct OverlapStats {
  double blocked_s = 0.0;
  double window_s = 0.0;
  int64_t rounds = 0;
  // 1 - blocked / window, in [0, 1]; 1 when nothing was waited for.
  double hidden_fraction() const;
  void add(const OverlapStats& other);
};

// Which buckets may start: a bucket is ready when all its parameters are, and buckets start
// strictly in bucket order, so every rank issues the same collectives in the same order even if
// a later bucket's gradients happen to be complete first. Shared by DDP and the ZeRO optimizer.
class BucketSchedule {
 public:
  explicit BucketSchedule(const BucketLayout& layout, std::string owner);

  // Marks a parameter's gradient final and calls `launch(bucket)` for every bucket that may now
  // start, in order. Marking a parameter twice in one round is an Error (a trainer bug that
  // would otherwise reduce stale data).
  void mark_ready(int param, const std::function<void(int)>& launch);
  // Launches every bucket not yet launched (parameters never marked, e.g. unused ones), in order.
  void launch_rest(const std::function<void(int)>& launch);
  // Starts a new round: nothing ready, nothing launched.
  void rearm();

  int launched() const { return next_; }  // buckets launched this round (a prefix: 0..launched-1)

 private:
  const BucketLayout* layout_;
  std::string owner_;
  std::vector<char> param_ready_;
  std::vector<int> pending_;  // per bucket: parameters not yet marked
  int next_ = 0;              // first bucket not yet launched
};

// DDP: reduces the flat gradient buffer bucket by bucket with all_reduce over the data-parallel
// group, each bucket starting as soon as its last gradient is final. Not thread-safe: call from
// the thread that runs backward. The gradients must be SUMMED when the loss is normalised by the
// tokens of the whole global batch (loom's trainers), hence Sum by default; Avg for trainers
// whose loss is a per-rank mean.
//
// Per step: [backward of micro-batches 1..k-1 without marking] -> backward of micro-batch k,
// calling mark_ready(p) as each parameter's gradient becomes final -> finish() -> optimizer step
// on the (now identical on every rank) gradients -> zero the gradients.
class GradReducer {
 public:
  // `wire`: F32, or BF16 (precision.grad_reduce=bf16): each bucket is rounded to bf16 into a
  // staging buffer on the gradients' `device`, all-reduced in bf16 (accumulated in f32, rounded
  // once) and widened back.
  // `site` (more than one site; `layout` padded for its ranks per site):
  // each bucket is reduce-scattered inside the site, its shard all-reduced across sites and
  // gathered inside the site again by the site's CrossSiteWorker, instead of one all-reduce.
  GradReducer(comm::Communicator& dp, float* grads, BucketLayout layout, comm::ReduceOp op = comm::ReduceOp::Sum,
              DType wire = DType::F32, SiteReduction* site = nullptr, Device device = Device::cpu());
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  void mark_ready(int param);
  // Launches what is left, waits for every bucket, and re-arms for the next step.
  void finish();
  // Abandons the current round (e.g. a step skipped for an overflow): waits for what was
  // launched, so the buffer is no longer in use, then re-arms.
  void reset();

  const BucketLayout& layout() const { return layout_; }
  const OverlapStats& last_stats() const { return last_; }
  const OverlapStats& total_stats() const { return total_; }

 private:
  void launch(int bucket);
  void launch_across_sites(int bucket);
  // Where a narrow wire's reduced bucket lands, to be widened into the gradients.
  const void* reduced_staging(int bucket) const;
  void wait_all(bool rethrow);

  comm::Communicator& dp_;
  float* grads_;
  BucketLayout layout_;
  comm::ReduceOp op_;
  BucketSchedule schedule_;
  std::vector<comm::WorkHandle> work_;
  DType wire_ = DType::F32;
  Device device_;
  Tensor staging_;  // wire_ != F32 (on device_): the buckets in the wire dtype
  SiteReduction* site_ = nullptr;
  // Across sites with more than one rank per site: each bucket padded in the wire dtype (f32 as
  // two halves), at site_offset_[bucket], and its reduced shard at shard_offset_[bucket].
  Tensor site_padded_, site_shards_;
  std::vector<int64_t> site_offset_, shard_offset_;
  std::chrono::steady_clock::time_point window_start_;
  bool window_open_ = false;
  OverlapStats last_, total_;
};

// Checks that `op` is one gradients can be combined with (Sum or Avg); `who` names the caller.
void check_gradient_op(comm::ReduceOp op, const std::string& who);
// Checks that `wire` is a dtype gradients may travel in (F32, or BF16 for
// precision.grad_reduce=bf16); `who` names the caller.
void check_gradient_wire(DType wire, const std::string& who);

}  // namespace loom::parallel
