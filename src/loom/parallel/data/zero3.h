#pragma once
// ZeRO-3 (FSDP-style): the parameters themselves are sharded over the data-parallel group.
//
// Layout. The model's parameters lie back to back in one flat fp32 buffer, and each unit of the
// model (embeddings, each block, final norm + head) registered its parameters contiguously: that
// range is the unit's *section*. Each section is padded (logically) to a multiple of dp and split
// into equal shards; rank r owns shard r, clipped to the real data. A rank keeps persistently
// only its shards: the fp32 parameter shard (which is also the master copy), the two Adam
// moments and the accumulated reduced gradient.
//
// Memory. The full-size flat values and gradient buffers stay as address space only. A section's
// range is populated between its gather and its release; a release returns the whole pages
// inside the range to the kernel with madvise(MADV_DONTNEED) (private anonymous memory then
// costs no RSS and reads back as zeros) and zeroes the few elements on pages shared with a
// neighbour. So the resident parameters are the shards plus the sections of the units in flight
// (the one computing and the one being prefetched), and likewise for gradients. On a GPU a
// release decommits the range's whole granules (Allocator::decommit) and, with no demand paging
// there, a gather or backward commits its range before writing it (shard_memory.h).
//
// Schedule (hooks from the model, see model/parameter_hooks.h). The phases of a micro-batch are
// forward of units 0..U-1 then backward of units U-1..0. At the start of a phase its sections
// are awaited (gathered if not prefetched) and the next phase's gather is launched (prefetch), so
// the all-gather overlaps the current unit's compute; at its end its sections are released
// (reference counted: the head's sections live on from its forward into its backward). A unit
// that reads a parameter of another section (the head reading the tied embedding) gathers that
// section too. After a unit's backward the gradient of its own section is complete (every later
// unit to read it has run its backward): it is copied into a padded staging slot, its
// reduce-scatter launched, and the full gradient range released at once; on completion the
// received shard is added to the accumulated gradient shard, so micro-batches accumulate as in
// ZeRO-2. step() clips by the global norm over every shard and updates the owned shards only; the
// next forward gathers the new values unit by unit.
//
// Wire dtype (precision.grad_reduce): with `wire` = BF16 the section's gradient is rounded to
// bf16 as it is staged, reduce-scattered as bf16 (f32 accumulation in rank order, one rounding)
// and the received shard is widened and added to the fp32 accumulated gradient; the parameter
// gathers stay fp32 (they are the master weights).
//
// Call sequence per optimizer step (each rank, same order; install this object as the model's
// hooks around each forward_backward):
//   per micro-batch: begin_micro_batch(); model.forward_backward(...); end_micro_batch();
//   norm = step(lr, step_number);
// Stay installed as hooks between micro-batches: a forward-only pass (evaluation) then works
// while gather_full_parameters() holds the full model, and is an Error otherwise (instead of
// silently reading released, zero parameters).
// Shards in host memory (parallel.offload_params, FSDP2's CPUOffloadPolicy): with
// `offload_shards` the fp32 parameter shard and the gradient shard live in host memory the device
// moves fastest (Tensor::transfer_staging), beside the moments (optim.cpu_offload). A gather first
// copies this rank's shard of the section to the device (rounded on the host where the gather is
// in the compute dtype), and a reduce-scatter's received shard comes back to the host, where it is
// added to the gradient shard; the norm, the unscaling and the update (the host's AdamW) then run
// on the host's cores over the shards where they are. The device keeps only the units in flight
// and the communication staging: 8 bytes per owned parameter fewer than with the moments alone
// offloaded, for 4 bytes (2 in the compute dtype) over the link per owned parameter and gather and
// 4 (2 in bf16) per reduce-scatter. The arithmetic is the same, so the bits are too. With
// `device_gather_copy` (parallel.offload_params_device_copy) the shard as the gathers send it
// (gather_send_, or the fp32 shard) is uploaded once after each change (update, load) into a copy
// the device keeps, which every gather then sends from: 2 (or 4) bytes per owned parameter stay on
// the device for none of the per-gather copies.
//
// Checkpoints: gather_full_parameters() fills the whole values buffer (and
// release_full_parameters() frees it again); load_from_full() re-shards parameters that were
// written into the full buffer (initialisation, checkpoint load). Not thread-safe.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/comm/communicator.h"
#include "loom/core/tensor.h"
#include "loom/model/parameter_hooks.h"
#include "loom/optim/adamw.h"
#include "loom/optim/moment_arrays.h"
#include "loom/optim/optimizer.h"
#include "loom/parallel/data/global_norm.h"
#include "loom/parallel/data/grad_buckets.h"
#include "loom/config/run_config.h"

namespace loom::parallel {

struct Zero3Options {
  // Sum when the loss is normalised over the global batch (loom's trainers); Avg otherwise.
  comm::ReduceOp reduce_op = comm::ReduceOp::Sum;
  // Dtype the gradients travel in: F32, or BF16 (precision.grad_reduce=bf16; see above).
  DType wire = DType::F32;
  // Dtype the parameters are gathered in: F32, or the compute dtype (BF16/F16;
  // precision.param_dtype=compute): the model then computes with the fp32 shards (the master
  // weights) rounded to it, for half the gather bytes.
  DType param_gather = DType::F32;
  bool prefetch = true;  // gather the next phase's sections while the current one computes
  // Staging slots for reduce-scatters in flight (a launch beyond that waits for the oldest).
  int comm_buffers = 2;
  // Further groups the squared gradient norm is summed over (as for DistributedOptimizer).
  std::vector<comm::Communicator*> norm_groups;
  // Flat ranges this rank leaves out of its share of the norm (sorted): another rank counts them.
  std::vector<FlatRange> norm_excluded;
  // Where the values and gradient buffers live: the shard state is allocated there too (but see
  // offload_shards), and a released range is decommitted there (shard_memory.h).
  Device device = Device::cpu();
  // The parameter and gradient shards in host memory while the buffers are on a GPU (above);
  // needs the optimizer's state there too (optim.cpu_offload with all of it offloaded).
  bool offload_shards = false;
  // With offload_shards: the shard in the gathers' dtype kept on the device between updates
  // (above), each gather sending from it instead of from a copy made for it.
  bool device_gather_copy = false;
};

// Bytes this rank holds: persistent shard state, and the measured residency of the full-size
// buffers (counted in elements populated between gather and release, times 4).
struct Zero3Memory {
  int64_t parameter_shard = 0;   // fp32 parameter shard (also the master weights) on the device
  int64_t moments = 0;           // exp_avg + exp_avg_sq on the device
  int64_t gradient_shard = 0;    // accumulated reduced gradients (padded shards) on the device
  // ... and in host memory: the moments (optim.cpu_offload), the shards (offload_shards)
  int64_t host_parameter_shard = 0, host_moments = 0, host_gradient_shard = 0;
  int64_t comm_buffers = 0;      // reduce-scatter staging (in the wire dtype)
  int64_t gather_copy = 0;       // the shard in the gathers' dtype on the device (device_gather_copy)
  int64_t full_parameters = 0;   // the unsharded model, for comparison
  int64_t peak_parameters = 0;   // max over time of shard + gathered sections
  int64_t peak_gradients = 0;    // max over time of gradient shard + resident gradient sections
  int64_t peak_resident = 0;     // max over time of parameters + gradients resident together
};

class Zero3 : public model::ParameterHooks {
 public:
  // `values`/`grads`: the full flat buffers with `params` laid out in them (registration order,
  // contiguous); `values` must hold the same full parameters on every rank now (they are
  // sharded and released here). `unit_params[u]`: the parameter ids unit u reads; a parameter
  // belongs to the section of the lowest unit that reads it, and each section must be one
  // contiguous range. `segments`: weight decay by flat range, as for optim::AdamW.
  Zero3(comm::Communicator& dp, float* values, float* grads, std::vector<ParamRange> params,
        const std::vector<std::vector<int>>& unit_params, std::vector<optim::Segment> segments,
        const config::OptimConfig& config, Zero3Options options = {});
  ~Zero3() override;
  Zero3(const Zero3&) = delete;
  Zero3& operator=(const Zero3&) = delete;

  void before_forward(int unit) override;
  void after_forward(int unit) override;
  void before_backward(int unit) override;
  void after_backward(int unit) override;

  // Around each micro-batch's forward/backward. end waits for the reduce-scatters and leaves
  // nothing gathered.
  void begin_micro_batch();
  void end_micro_batch();
  // Global norm, clipping (config.clip_grad), AdamW on the owned shards; returns the norm
  // before clipping. Needs at least one micro-batch since the last step.
  double step(double lr, int64_t step);
  // step() in two halves (as DistributedOptimizer's): this rank's reduced shards for
  // global_norm, and the update with the clip factor that norm gives.
  NormShare norm_share();
  void update(const optim::StepParams& step);
  // This rank's reduced gradient shards (padding included, zero) after end_micro_batch(): what
  // step() reads, for mixed precision's unscale / non-finite check; on shards_device().
  float* reduced_gradients() { return grad_shards_.data<float>(); }
  int64_t reduced_gradients_numel() const { return grad_shards_.numel(); }
  // Where the shard state (parameter and gradient shards) is: the host with offload_shards.
  Device shards_device() const { return shards_device_; }
  // Instead of step(): drops the gradients of this step, updating nothing.
  void skip_step() {
    grad_shards_.zero();
    rounds_ = 0;
  }

  // Collective: the whole values buffer holds the current parameters until release.
  void gather_full_parameters();
  void release_full_parameters();
  bool full_parameters() const { return full_; }
  // The values buffer holds full parameters (every rank the same): take this rank's shards from
  // it and release it.
  void load_from_full();
  // Collective: Adam moments as full flat buffers laid out like the parameters (each section's
  // moments in one memory: not with a part of them offloaded, optim.offload_fraction < 1).
  void gather_moments(float* exp_avg, float* exp_avg_sq);
  // This rank's shards: flat [begin, end) with its fp32 parameters (the master weights) and
  // moments, for checkpoints that store each rank's own part; a shard whose moments are partly
  // in host memory (optim.offload_fraction) comes as two.
  struct OwnedShard {
    int64_t begin = 0, end = 0;
    const float* value = nullptr;
    const float* exp_avg = nullptr;
    const float* exp_avg_sq = nullptr;
    bool moments_on_host = false;  // in host memory while the parameters are on a device (optim.cpu_offload)
    Device moments_device;         // where exp_avg and exp_avg_sq are
    bool value_on_host = false;    // the value too (offload_shards)
  };
  std::vector<OwnedShard> shards() const;
  // Takes this rank's shards of full flat moment buffers.
  void load_moments(const float* exp_avg, const float* exp_avg_sq);

  int sections() const { return static_cast<int>(sections_.size()); }
  FlatRange section_range(int s) const { return {sections_[s].begin, sections_[s].begin + sections_[s].numel}; }
  FlatRange owned(int s) const { return sections_[s].mine; }
  Zero3Memory memory() const;
  // Elements of parameters / gradients populated right now (shards included).
  int64_t resident_parameter_elements() const { return shard_elements_ + gathered_elements_; }
  int64_t resident_gradient_elements() const { return device_grad_shard_elements_ + grad_resident_elements_; }
  // Fraction of the gather/reduce-scatter time hidden behind compute, over all micro-batches, as
  // the host sees it: the time it spent blocked. On nccl a gather's wait is the compute stream's
  // (Work::wait_in_stream), so there it counts the reduce-scatters alone; what the GPU waits for a
  // gather shows in a profile, not here.
  double hidden_fraction() const;

 private:
  struct Section {
    int64_t begin = 0, numel = 0, shard_numel = 0;  // shard_numel: padded numel / dp
    FlatRange mine;                                 // this rank's real elements
    int64_t state_offset = 0;                       // into the shard arrays
    int64_t grad_offset = 0;                        // into grad_shards_ (padded shards)
    std::vector<int64_t> counts;                    // real shard size per rank
    int refs = 0;                                   // phases holding the gathered values
    bool gathered = false;
    bool grad_resident = false;
    comm::WorkHandle gather;
    Tensor gathered_bits;  // param_gather != F32: the gather's landing area (on the device)
    Tensor sent;           // offload_shards: this rank's shard copied to the device for the gather
  };
  struct Piece {  // part of an owned shard inside one weight-decay segment
    int64_t local = 0, numel = 0;
    bool weight_decay = true;
    float lr_scale = 1.0f;
  };

  int phase_unit(int phase) const { return phase < units() ? phase : 2 * units() - 1 - phase; }
  int units() const { return static_cast<int>(unit_sections_.size()); }
  void lay_out_section(int s, const std::vector<int>& section_of, const std::string& who);
  void allocate_state(int64_t state, int64_t grad, int64_t slot, int64_t max_shard);
  void begin_phase(int phase);
  void end_phase(int phase);
  void acquire(int phase);
  void wait_gathers(int phase);
  void finish_gather(Section& sec);
  void acquire_section(int s);
  const void* gather_source(Section& sec);
  // The shards as the gathers send them, whenever they change: rounded to the compute dtype
  // (gather_send_), and uploaded into the device's copy (device_gather_copy).
  void prepare_gather_sources();
  void release_section(int s);
  void launch_reduce_scatter(int s);
  void complete_reduce_scatter(int slot);
  void note_residency();
  void wait_all_quietly();

  comm::Communicator& dp_;
  float* values_;
  float* grads_;
  std::vector<ParamRange> params_;
  std::vector<optim::Segment> segments_;
  config::OptimConfig config_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  Zero3Options options_;
  int rank_;

  std::vector<Section> sections_;
  std::vector<std::vector<int>> unit_sections_;  // sections unit u reads
  std::vector<std::vector<Piece>> pieces_;       // per section
  std::vector<char> acquired_;                   // per phase
  Device shards_device_;  // of shard_, grad_shards_ and gather_send_: options_.device, or the host
  Tensor shard_, grad_shards_;
  optim::MomentArrays moments_;  // by state element, in part on the host under optim.cpu_offload
  Tensor staging_;  // wire dtype
  Tensor gather_send_;  // param_gather != F32: this rank's shards, rounded for the gathers after each change
  Tensor device_send_;  // device_gather_copy: what the gathers send (gather_send_ or shard_), on the device
  Tensor received_host_;  // offload_shards: a reduce-scatter's received shard, back on the host
  int64_t slot_elements_ = 0;
  std::vector<int> slot_section_;  // section reduce-scattering in each slot, -1 when free
  std::vector<comm::WorkHandle> slot_work_;
  int next_slot_ = 0;
  bool in_micro_batch_ = false;
  bool full_ = false;
  int rounds_ = 0;  // micro-batches reduced since the last step

  // Elements resident on the device: its shards (none with offload_shards), the units in flight.
  int64_t shard_elements_ = 0, device_grad_shard_elements_ = 0, gathered_elements_ = 0, grad_resident_elements_ = 0;
  int64_t peak_parameters_ = 0, peak_gradients_ = 0, peak_resident_ = 0;

  double blocked_s_ = 0.0, window_s_ = 0.0;
  std::chrono::steady_clock::time_point window_start_;
};

// "measured peak per rank: parameters ..., gradients ..., both ...; process peak RSS ..." for the
// trainer's report after the first step.
std::string describe_zero3_peak(const Zero3Memory& memory);
// The process's peak resident set size (getrusage), in bytes; all ranks of the threads backend
// share one process.
int64_t process_peak_rss_bytes();
// The process's resident set size now (/proc/self/statm), in bytes; 0 where unavailable.
int64_t process_rss_bytes();

}  // namespace loom::parallel
