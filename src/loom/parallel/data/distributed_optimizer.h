#pragma once
// The distributed optimizer (ZeRO stages 1 and 2) over the data-parallel group.
//
// Every bucket (grad_buckets.h, padded for dp ranks) is reduce-scattered as soon as its last
// gradient is final, so rank r receives the reduced gradient of its shard of the bucket while
// backward goes on. The fp32 master weights and the two Adam moments exist only for this rank's
// shards. A step computes the global gradient norm (sum of squares of the owned shards, summed
// over dp and any further groups), updates the owned shards with AdamW (clipping fused) and
// all-gathers the updated shards back into the full parameter buffer. The result equals the
// unsharded optim::AdamW step on the reduced gradients up to rounding of the norm's summation.
//
// Memory per rank (fp32 parameters and gradients today): the full parameters and gradient
// buffer of the model, plus master + moments + reduced gradient for ~1/dp of the elements, plus
// `comm_buffers` staging buffers of one padded bucket each (the flat buffers have no room for a
// bucket's padding, so a bucket is copied into a staging buffer for its reduce-scatter).
//
// Wire dtype (precision.grad_reduce): with `wire` = BF16 a bucket is rounded to bf16 as it is
// staged, reduce-scattered as bf16 (the backends accumulate in f32 in rank order and round once,
// as GradReducer's all-reduce does at ZeRO 0) and the received shard is widened into the fp32
// reduced gradient; half the bytes on the wire and in the staging buffers. Rounds of ZeRO-2 add
// their widened shards in fp32. The optimizer state and its arithmetic stay fp32.
//
// ZeRO-1 vs ZeRO-2 (the optimizer's own state is the same; what differs is the contract on the
// trainer's full gradient buffer):
// - zero=1: one reduction round per optimizer step, after the last micro-batch; gradients of
//   the micro-batches accumulate in the full gradient buffer, which lives through the step.
// - zero=2: the reduced gradient is kept only for the owned shards (shards().grad). A bucket's
//   gradients are copied out when it launches, so the trainer may zero or reuse a bucket's part
//   of the full buffer once it has launched (buckets 0..launched_buckets()-1), and all of it
//   after finish_grads(). Several rounds per step are allowed (e.g. one per micro-batch: backward,
//   mark, finish_grads, zero the full buffer), their reduced shards accumulating; then the full
//   gradient buffer need only hold one micro-batch, or can be freed between backward passes.
//
// Call sequence per optimizer step (each rank, same order):
//   backward ... mark_ready(p) for each parameter as its gradient becomes final
//   finish_grads()                 // launches the rest, waits; shards hold reduced gradients
//   [zero=2: zero/reuse the full gradient buffer here; more rounds may follow]
//   norm = step(lr, step_number)   // clip + AdamW on owned shards + all-gather of parameters
//   [zero=1: zero the full gradient buffer]
//
// With overlap_param_gather the all-gathers are left in flight when step() returns: issued in
// forward order (the last bucket, which holds the first-registered parameters, first) on a
// group split from the data-parallel one, so that no other collective of that group queues
// behind them; wait_for_parameters(range) before reading or writing a range of the parameters
// (the model's hooks do it unit by unit, so each unit's forward waits for its own buckets only).
// Not thread-safe: call from the thread that runs backward.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/comm/communicator.h"
#include "loom/core/tensor.h"
#include "loom/optim/adamw.h"
#include "loom/optim/moment_arrays.h"
#include "loom/optim/optimizer.h"
#include "loom/parallel/data/global_norm.h"
#include "loom/parallel/data/grad_buckets.h"
#include "loom/config/run_config.h"

namespace loom::parallel {

struct DistributedOptimizerOptions {
  int zero = 1;  // 1 or 2 (ZeRO-3 shards the parameters themselves: FSDP, elsewhere)
  // Sum when the loss is normalised over the global batch (loom's trainers); Avg otherwise.
  comm::ReduceOp reduce_op = comm::ReduceOp::Sum;
  // Dtype the gradients travel in: F32, or BF16 (precision.grad_reduce=bf16; see above).
  DType wire = DType::F32;
  // The dtype the updated parameters are all-gathered in: F32, or the compute dtype (BF16, F16;
  // precision.param_dtype=compute), which halves the bytes and leaves every rank's parameter
  // buffer holding the master weights rounded to it (the master weights stay fp32).
  DType param_gather = DType::F32;
  // With param_gather != F32: leave the gathered parameters in gathered_parameters() (a
  // CompactParameters store) instead of widening them into the full parameter buffer.
  bool keep_gathered = false;
  // Leave the parameter all-gathers in flight when the update returns (see above).
  bool overlap_param_gather = false;
  // Staging buffers for reduce-scatters in flight; a launch beyond that many waits for the
  // oldest to finish (bounded memory; with many buckets 2 keeps the network busy).
  int comm_buffers = 2;
  // Further groups the squared gradient norm is summed over (e.g. tp and pp, whose ranks hold
  // different parameters; the caller must count a replicated parameter on one rank only).
  std::vector<comm::Communicator*> norm_groups;
  // Flat ranges this rank leaves out of its share of the norm (sorted): another rank counts them.
  std::vector<FlatRange> norm_excluded;
  // Where the parameter and gradient buffers live: the shard state (master weights, moments,
  // reduced gradients, staging) is allocated there too and never read by the host.
  Device device = Device::cpu();
  // More than one site (the group is then the ranks of this site): each reduced shard is also
  // all-reduced across sites by the site's CrossSiteWorker before it counts as reduced, and the
  // bytes of this rank's in-site collectives are counted there.
  SiteReduction* site = nullptr;
};

// One shard this rank owns: flat [begin, end) of the full buffers, and its optimizer state.
// Checkpoints store these by global parameter slice (param_slices(layout().params, {begin, end})).
// A shard whose moments are partly in host memory (optim.offload_fraction) comes as two, each
// with its moments in one memory.
struct OwnedShard {
  int bucket = 0;
  int64_t begin = 0, end = 0;
  float* master = nullptr;      // fp32 master weights, end - begin elements
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  float* grad = nullptr;        // the reduced gradient after finish_grads()
  bool moments_on_host = false; // in host memory while the parameters are on a device (optim.cpu_offload)
  Device moments_device;        // where exp_avg and exp_avg_sq are
};

// Elements this rank allocated, by purpose (for the start-up memory report).
struct ShardAllocation {
  int64_t master = 0;        // fp32 master weights
  int64_t moments = 0;       // exp_avg + exp_avg_sq on the device
  int64_t host_moments = 0;  // ... and in host memory (optim.cpu_offload)
  int64_t grad_shards = 0;   // reduced gradients of the owned shards (with each bucket's padding)
  // Reduce-scatter staging, in fp32-sized elements (bytes / 4) so that a bf16 wire, which
  // stages half the bytes, is reported as such by callers that multiply by 4.
  int64_t comm_buffers = 0;
};

class DistributedOptimizer {
 public:
  // `segments`: weight decay by flat range, as for optim::AdamW (elements outside every segment
  // are not updated). `params`/`grads`: the full flat buffers, layout.params laid out in them;
  // every rank must hold the same parameters now (master weights are copied from them).
  // layout.shard_ranks must equal dp.size().
  DistributedOptimizer(comm::Communicator& dp, BucketLayout layout, std::vector<optim::Segment> segments,
                       const config::OptimConfig& config, float* params, float* grads,
                       DistributedOptimizerOptions options = {});
  ~DistributedOptimizer();
  DistributedOptimizer(const DistributedOptimizer&) = delete;
  DistributedOptimizer& operator=(const DistributedOptimizer&) = delete;

  // param_gather != F32: every parameter in that dtype, as the last step's gather left it.
  std::byte* gathered_parameters() { return gathered_.data<std::byte>(); }

  // The gradient of `param` in the full buffer is final for this round.
  void mark_ready(int param);
  // Launches the buckets not yet launched, waits for all reduce-scatters, ends the round.
  void finish_grads();
  // Global norm, clipping (config.clip_grad), AdamW on the owned shards, all-gather into the
  // parameter buffer. `step` is 1-based. Returns the global gradient norm before clipping.
  // Needs at least one finished round since the last step.
  double step(double lr, int64_t step);
  // step() in two halves, for callers that take the norm over several groups: this rank's
  // reduced shards (for global_norm), and the update with the clip factor that norm gives plus
  // the all-gather of the updated parameters.
  NormShare norm_share();
  void update(const optim::StepParams& step);
  // Instead of step() (mixed precision found Inf/NaN): drops this round's gradients, updating
  // nothing; the next round's reduce-scatters overwrite the shards.
  void skip_step() { rounds_ = 0; }

  // Copies the owned slices of the parameter buffer into the master weights (after parameters
  // were loaded from a checkpoint that has no optimizer state). Waits for the gathers first.
  void load_master_from_params();

  // overlap_param_gather: waits for the parameter gathers of the buckets that hold any of the flat
  // range (widening them into the parameters where param_gather != F32 and !keep_gathered); the
  // range's values are then the last update's. Without it, or with nothing in flight, no-ops.
  void wait_for_parameters(FlatRange range);
  void wait_for_parameters() { wait_for_parameters({0, INT64_MAX}); }
  // Buckets whose parameter gather is still in flight.
  int parameter_gathers_in_flight() const;
  // Seconds the caller has blocked waiting for parameter gathers, over all steps: inside step()
  // without overlap_param_gather, in wait_for_parameters() with it.
  double parameter_gather_wait_s() const { return gather_wait_s_; }

  // Buckets whose reduce-scatter has started this round; their gradients were copied out.
  int launched_buckets() const { return schedule_.launched(); }

  std::vector<OwnedShard> shards();
  const BucketLayout& layout() const { return layout_; }
  int zero() const { return options_.zero; }
  ShardAllocation allocation() const;
  const OverlapStats& last_stats() const { return last_; }
  const OverlapStats& total_stats() const { return total_; }

 private:
  struct Piece {  // part of an owned shard inside one weight-decay segment
    int64_t local = 0, numel = 0;  // into the master/moment arrays
    bool weight_decay = true;
    float lr_scale = 1.0f;
  };
  struct InFlight {
    comm::WorkHandle work;
    // The result lands in the staging tail (a later round, or a narrow wire) and is added to or
    // widened into the shard on completion.
    bool staged = false;
    bool accumulate = false;  // add to the shard (a later round) rather than overwrite it
  };

  // The gathers' dtype checked, their compact buffers (`owned`: this rank's shard elements) and
  // the group they run on under overlap_param_gather.
  void prepare_parameter_gathers(const std::string& who, int64_t owned);
  void launch(int bucket);
  void complete(int bucket);
  void wait_all_quietly();
  void check_reduced() const;
  // Seam for a bf16 compute copy: today the compute parameters are the fp32 flat buffer and the
  // master shard is gathered as it is; with bf16 weights, round the master shard into a bf16
  // send buffer here and gather that into the bf16 compute buffer (half the bytes on the wire).
  comm::WorkHandle gather_parameters(int bucket);
  // Waits for bucket's gather (timed) and widens it where the parameters are not kept gathered.
  void finish_parameter_gather(int bucket, comm::WorkHandle& work);

  comm::Communicator& dp_;
  BucketLayout layout_;
  std::vector<optim::Segment> segments_;
  config::OptimConfig config_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  float* params_;
  float* grads_;
  DistributedOptimizerOptions options_;
  int rank_;
  BucketSchedule schedule_;

  // Per bucket: where this rank's shard starts in the state arrays and in grad_shards_.
  std::vector<int64_t> state_offset_, grad_offset_;
  std::vector<std::vector<Piece>> pieces_;
  std::vector<std::vector<int64_t>> gather_counts_;  // per bucket, per rank: real shard sizes
  Tensor master_, grad_shards_;
  optim::MomentArrays moments_;    // by state element, in part on the host under optim.cpu_offload
  Tensor staging_;                 // comm_buffers slots of (dp + 1) * max shard elements, wire dtype
  bool in_place_ = false;          // ZeRO-1: reduced shards live in the full gradient buffer
  float* reduced_shard(int bucket);
  Tensor gathered_;                // param_gather != F32: the parameters as gathered, whole buffer
  Tensor gather_send_;             // ... and this rank's rounded shard, sent from here
  int64_t slot_elements_ = 0;
  std::vector<int> slot_bucket_;   // bucket using each slot, -1 when free
  std::vector<InFlight> in_flight_;
  // overlap_param_gather: the parameter gathers run here, and are in flight per bucket until waited.
  std::unique_ptr<comm::Communicator> gather_group_;
  std::vector<comm::WorkHandle> parameter_gathers_;
  double gather_wait_s_ = 0.0;

  int rounds_ = 0;  // finished rounds since the last step
  std::chrono::steady_clock::time_point window_start_;
  bool window_open_ = false;
  double blocked_s_ = 0.0;  // within the current round
  OverlapStats last_, total_;
};

}  // namespace loom::parallel
