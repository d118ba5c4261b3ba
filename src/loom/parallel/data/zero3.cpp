#include "loom/parallel/data/zero3.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "loom/kernels/ops.h"
#include "loom/parallel/data/shard_memory.h"
#include "loom/core/error.h"
#include "loom/parallel/data/communication.h"
#include "loom/parallel/data/global_norm.h"

namespace loom::parallel {

namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string mib(int64_t bytes) {
  std::ostringstream out;
  out.precision(2);
  out << std::fixed << static_cast<double>(bytes) / (1024.0 * 1024.0) << " MiB";
  return out.str();
}

}  // namespace

Zero3::Zero3(comm::Communicator& dp, float* values, float* grads, std::vector<ParamRange> params,
             const std::vector<std::vector<int>>& unit_params, std::vector<optim::Segment> segments,
             const config::OptimConfig& config, Zero3Options options)
    : dp_(dp),
      values_(values),
      grads_(grads),
      params_(std::move(params)),
      segments_(std::move(segments)),
      config_(config),
      // With the shards in host memory the update is the host's, over them where they are.
      optimizer_(optim::make_optimizer(config, options.offload_shards ? Device::cpu() : options.device)),
      options_(std::move(options)),
      rank_(dp.rank()),
      shards_device_(options_.offload_shards ? Device::cpu() : options_.device) {
  const std::string who = "Zero3 (group '" + dp.name() + "')";
  LOOM_CHECK(!options_.offload_shards || (!options_.device.is_cpu() && config.cpu_offload &&
                                          config.offload_fraction == 1.0),
             who + ": shards in host memory (parallel.offload_params) need the parameters on a GPU and all of the "
                   "optimizer's state on the host (optim.cpu_offload=true, optim.offload_fraction=1)");
  check_gradient_op(options_.reduce_op, who);
  check_gradient_wire(options_.wire, who);
  LOOM_CHECK(!options_.device_gather_copy || options_.offload_shards,
             who + ": a device copy of the gathers' shards (parallel.offload_params_device_copy) needs the shards in "
                   "host memory (parallel.offload_params)");
  LOOM_CHECK(options_.comm_buffers >= 1, who + ": comm_buffers must be >= 1");
  LOOM_CHECK(!unit_params.empty(), who + ": the model has no units");
  for (comm::Communicator* g : options_.norm_groups) LOOM_CHECK(g != nullptr, who + ": a norm group is null");

  // A parameter belongs to the section of the lowest unit reading it (the tied embedding: unit 0).
  const int U = static_cast<int>(unit_params.size());
  std::vector<int> section_of(params_.size(), -1);
  for (int u = U - 1; u >= 0; --u) {
    for (int id : unit_params[u]) {
      LOOM_CHECK(id >= 0 && id < static_cast<int>(params_.size()),
            who + ": unit " + std::to_string(u) + " lists parameter " + std::to_string(id) + " of " +
                std::to_string(params_.size()));
      section_of[id] = u;
    }
  }
  for (size_t id = 0; id < params_.size(); ++id) {
    LOOM_CHECK(section_of[id] >= 0, who + ": parameter " + std::to_string(id) + " is read by no unit");
  }
  const int ranks = dp.size();
  sections_.resize(U);
  unit_sections_.resize(U);
  pieces_.resize(U);
  int64_t state = 0, grad = 0, max_padded = 0, max_shard = 0;
  for (int s = 0; s < U; ++s) {
    Section& sec = sections_[s];
    lay_out_section(s, section_of, who);
    sec.state_offset = state;
    sec.grad_offset = grad;
    state += sec.mine.size();
    grad += sec.shard_numel;
    max_padded = std::max(max_padded, sec.shard_numel * ranks);
    max_shard = std::max(max_shard, sec.shard_numel);
  }
  for (int u = 0; u < U; ++u) {
    for (int id : unit_params[u]) unit_sections_[u].push_back(section_of[id]);
    std::sort(unit_sections_[u].begin(), unit_sections_[u].end());
    unit_sections_[u].erase(std::unique(unit_sections_[u].begin(), unit_sections_[u].end()), unit_sections_[u].end());
  }
  allocate_state(state, grad, max_padded + max_shard, max_shard);
  slot_section_.assign(options_.comm_buffers, -1);
  slot_work_.resize(options_.comm_buffers);
  acquired_.assign(2 * U, 0);
  load_from_full();
  // The gradient buffer is address space only from now on.
  for (const Section& sec : sections_) release_range(options_.device, grads_, sec.begin, sec.numel);
}

// The shard state (`state` owned elements, `grad` padded gradient elements) on the device, or in
// host memory the device moves fastest (offload_shards), and the reduce-scatter slots of `slot`
// elements (a padded section to send, then the received shard of at most `max_shard`).
void Zero3::allocate_state(int64_t state, int64_t grad, int64_t slot, int64_t max_shard) {
  const Device device = options_.device;
  auto shard_array = [&](int64_t n, DType dtype) {
    return options_.offload_shards ? Tensor::transfer_staging({n}, dtype, device) : Tensor({n}, dtype, device);
  };
  shard_ = shard_array(state, DType::F32);
  moments_ = optim::MomentArrays(state, optim::offloaded_elements(config_, !device.is_cpu(), state), device);
  grad_shards_ = shard_array(grad, DType::F32);
  shard_elements_ = options_.offload_shards ? 0 : state;
  device_grad_shard_elements_ = options_.offload_shards ? 0 : grad;
  slot_elements_ = slot;
  staging_ = Tensor({options_.comm_buffers * slot_elements_}, options_.wire, device);
  if (options_.offload_shards) received_host_ = Tensor::transfer_staging({max_shard}, options_.wire, device);
  LOOM_CHECK(options_.param_gather == DType::F32 || options_.param_gather == DType::BF16 ||
            options_.param_gather == DType::F16,
        "Zero3: parameters are gathered in f32, bf16 or f16 (precision.param_dtype=fp32 or compute)");
  if (options_.param_gather != DType::F32) gather_send_ = shard_array(state, options_.param_gather);
  if (options_.device_gather_copy) device_send_ = Tensor({state}, options_.param_gather, device);
}

// Section s: the contiguous flat range of the parameters in it, split into dp shards, and the
// pieces of this rank's shard by weight-decay segment.
void Zero3::lay_out_section(int s, const std::vector<int>& section_of, const std::string& who) {
  const int ranks = dp_.size();
  Section& sec = sections_[s];
    std::vector<int> ids;
    for (size_t id = 0; id < params_.size(); ++id) {
      if (section_of[id] == s) ids.push_back(static_cast<int>(id));
    }
    std::sort(ids.begin(), ids.end(), [&](int a, int b) { return params_[a].offset < params_[b].offset; });
    if (!ids.empty()) {
      sec.begin = params_[ids.front()].offset;
      int64_t end = sec.begin;
      for (int id : ids) {
        LOOM_CHECK(params_[id].offset == end, who + ": the parameters of unit " + std::to_string(s) +
                                             " are not one contiguous range of the flat buffer (parameter " +
                                             std::to_string(id) + ")");
        end += params_[id].numel;
      }
      sec.numel = end - sec.begin;
    }
    sec.shard_numel = (sec.numel + ranks - 1) / ranks;
    for (int r = 0; r < ranks; ++r) {
      const int64_t b = std::min(sec.numel, r * sec.shard_numel), e = std::min(sec.numel, (r + 1) * sec.shard_numel);
      sec.counts.push_back(e - b);
      if (r == rank_) sec.mine = {sec.begin + b, sec.begin + e};
    }
    for (const optim::Segment& seg : segments_) {
      const int64_t b = std::max(sec.mine.begin, seg.offset), e = std::min(sec.mine.end, seg.offset + seg.numel);
      if (e > b) pieces_[s].push_back({b - sec.mine.begin, e - b, seg.weight_decay, seg.lr_scale});
    }
    std::sort(pieces_[s].begin(), pieces_[s].end(), [](const Piece& x, const Piece& y) { return x.local < y.local; });
}

Zero3::~Zero3() { wait_all_quietly(); }

void Zero3::wait_all_quietly() {
  auto quietly = [](comm::WorkHandle& w) {
    if (!w) return;
    try {
      w->wait();
    } catch (...) {
      // Destruction during unwinding: the original error is what matters.
    }
    w.reset();
  };
  for (Section& sec : sections_) quietly(sec.gather);
  for (comm::WorkHandle& w : slot_work_) quietly(w);
}


void Zero3::note_residency() {
  const int64_t params = resident_parameter_elements(), grads = resident_gradient_elements();
  peak_parameters_ = std::max(peak_parameters_, params);
  peak_gradients_ = std::max(peak_gradients_, grads);
  peak_resident_ = std::max(peak_resident_, params + grads);
}

void Zero3::acquire_section(int s) {
  Section& sec = sections_[s];
  if (sec.refs++ > 0 || sec.gathered) return;
  sec.gathered = true;
  if (sec.numel == 0) return;
  gathered_elements_ += sec.numel;
  note_residency();
  commit_range(options_.device, values_, sec.begin, sec.numel);  // the gather writes it
  const void* send = gather_source(sec);
  if (options_.param_gather == DType::F32) {
    sec.gather = start_shard_all_gather(dp_, send, values_ + sec.begin, sec.counts, DType::F32);
    return;
  }
  // The shard travels rounded to the compute dtype and lands in a staging area of that dtype,
  // widened into the values when the gather is waited for (finish_gather).
  sec.gathered_bits = Tensor({sec.numel}, options_.param_gather, options_.device);
  sec.gather = start_shard_all_gather(dp_, send, sec.gathered_bits.raw(), sec.counts, options_.param_gather);
}

// This rank's shard of the section as the gather sends it, on the device: the fp32 shard itself,
// or its rounding to the compute dtype (param_gather; made once per update,
// prepare_gather_sources), where the shard state is; with the shards in host memory, the device's
// copy of it (device_gather_copy) or else a copy made for this gather (sec.sent, kept until the
// gather is done).
const void* Zero3::gather_source(Section& sec) {
  const int64_t n = sec.mine.size();
  const size_t element = dtype_size(options_.param_gather);
  if (options_.device_gather_copy) return device_send_.data<std::byte>() + sec.state_offset * element;
  const void* send = options_.param_gather == DType::F32
                         ? static_cast<const void*>(shard_.data<float>() + sec.state_offset)
                         : gather_send_.data<std::byte>() + sec.state_offset * element;
  if (!options_.offload_shards) return send;
  // Queued without a wait (the shard is transfer staging, which the host rewrites only in the
  // update, after a fence): the gather follows it in the device's order.
  sec.sent = Tensor({n}, options_.param_gather, options_.device);
  allocator(options_.device).from_host_async(sec.sent.raw(), send, static_cast<size_t>(n) * element);
  return sec.sent.raw();
}

void Zero3::finish_gather(Section& sec) {
  if (!sec.gather) return;
  sec.gather->wait_in_stream();  // the section's kernels read it next (nccl: the host runs on)
  sec.gather.reset();
  sec.sent = Tensor();  // freed in the compute stream's order, after the gather
  if (sec.gathered_bits.empty()) return;
  kernels::widen_floats(options_.device, values_ + sec.begin, sec.gathered_bits.raw(), sec.numel, options_.param_gather,
                        false);
  sec.gathered_bits = Tensor();
}

void Zero3::release_section(int s) {
  Section& sec = sections_[s];
  LOOM_CHECK(sec.refs > 0, "Zero3: section " + std::to_string(s) + " released more often than gathered");
  if (--sec.refs > 0) return;
  if (sec.gather) {  // prefetched but never used (e.g. a forward without backward)
    sec.gather->wait();
    sec.gather.reset();
    sec.gathered_bits = Tensor();
    sec.sent = Tensor();
  }
  sec.gathered = false;
  if (sec.numel == 0) return;
  release_range(options_.device, values_, sec.begin, sec.numel);
  gathered_elements_ -= sec.numel;
}

void Zero3::acquire(int phase) {
  if (acquired_[phase]) return;
  acquired_[phase] = 1;
  for (int s : unit_sections_[phase_unit(phase)]) acquire_section(s);
}

void Zero3::wait_gathers(int phase) {
  for (int s : unit_sections_[phase_unit(phase)]) {
    Section& sec = sections_[s];
    if (!sec.gather) continue;
    const Clock::time_point t0 = Clock::now();
    finish_gather(sec);
    blocked_s_ += seconds(Clock::now() - t0);
  }
}

void Zero3::begin_phase(int phase) {
  if (!in_micro_batch_) {
    // A forward outside training (evaluation) reads the full buffer, which must then be full.
    LOOM_CHECK(full_ && phase < units(), "Zero3: the model ran unit " + std::to_string(phase_unit(phase)) +
                                        (phase < units() ? "'s forward" : "'s backward") +
                                        " outside a micro-batch while its parameters are sharded; call "
                                        "gather_full_parameters() on every rank before a forward-only pass (e.g. "
                                        "evaluation), or begin_micro_batch() before training");
    return;
  }
  acquire(phase);
  // The next phase's gather goes out before this one's wait, so it overlaps this unit's compute.
  if (options_.prefetch && phase + 1 < 2 * units()) acquire(phase + 1);
  wait_gathers(phase);
}

void Zero3::end_phase(int phase) {
  if (!acquired_[phase]) return;
  acquired_[phase] = 0;
  for (int s : unit_sections_[phase_unit(phase)]) release_section(s);
}

void Zero3::before_forward(int unit) { begin_phase(unit); }

void Zero3::after_forward(int unit) { end_phase(unit); }

void Zero3::before_backward(int unit) {
  begin_phase(2 * units() - 1 - unit);  // throws outside a micro-batch: gradients are reduced per unit
  // The unit's backward adds into these gradient ranges, which read as zeros while released.
  // Writing the zeros first makes their pages come back on a write fault: a GEMM that reads them
  // first would map the shared zero page and then fault again, flushing every core's TLB, on
  // its first write.
  for (int s : unit_sections_[unit]) {
    Section& sec = sections_[s];
    if (sec.grad_resident) continue;
    commit_range(options_.device, grads_, sec.begin, sec.numel);
    zero_on_device(options_.device, grads_ + sec.begin, sec.numel);
    sec.grad_resident = true;
    grad_resident_elements_ += sec.numel;
  }
  note_residency();
}

void Zero3::after_backward(int unit) {
  end_phase(2 * units() - 1 - unit);
  // Units below this one do not read its section: its gradient is complete.
  launch_reduce_scatter(unit);
}

void Zero3::launch_reduce_scatter(int s) {
  Section& sec = sections_[s];
  if (sec.numel == 0) return;  // every rank skips it alike
  const int slot = next_slot_;
  next_slot_ = (next_slot_ + 1) % static_cast<int>(slot_section_.size());
  if (slot_section_[slot] >= 0) complete_reduce_scatter(slot);
  const size_t element = dtype_size(options_.wire);
  std::byte* send = staging_.data<std::byte>() + slot * slot_elements_ * element;
  const int64_t padded = sec.shard_numel * dp_.size();
  stage_for_reduce(options_.device, send, grads_ + sec.begin, sec.numel, padded, options_.wire);
  slot_work_[slot] = start_gradient_reduce_scatter(dp_, send, send + padded * element, sec.shard_numel, options_.wire,
                                              options_.reduce_op);
  slot_section_[slot] = s;
  // The copy is in flight; the full gradient range is free at once.
  if (sec.grad_resident) {
    sec.grad_resident = false;
    grad_resident_elements_ -= sec.numel;
  }
  release_range(options_.device, grads_, sec.begin, sec.numel);
}

void Zero3::complete_reduce_scatter(int slot) {
  const int s = slot_section_[slot];
  const Clock::time_point t0 = Clock::now();
  comm::WorkHandle work = std::move(slot_work_[slot]);
  slot_work_[slot].reset();
  slot_section_[slot] = -1;
  work->wait();
  blocked_s_ += seconds(Clock::now() - t0);
  const Section& sec = sections_[s];
  const size_t element = dtype_size(options_.wire);
  const std::byte* received =
      staging_.data<std::byte>() + (slot * slot_elements_ + sec.shard_numel * dp_.size()) * element;
  if (options_.offload_shards) {  // added to the gradient shard where it is, in host memory
    copy_to_host(options_.device, received_host_.data<std::byte>(), received, sec.shard_numel * element);
    received = received_host_.data<std::byte>();
  }
  // Micro-batches accumulate in fp32 whatever the wire.
  take_reduced(shards_device_, grad_shards_.data<float>() + sec.grad_offset, received, sec.shard_numel, options_.wire,
               true);
}

void Zero3::begin_micro_batch() {
  LOOM_CHECK(!in_micro_batch_, "Zero3: begin_micro_batch() twice without end_micro_batch()");
  if (full_) release_full_parameters();
  in_micro_batch_ = true;
  window_start_ = Clock::now();
}

void Zero3::end_micro_batch() {
  LOOM_CHECK(in_micro_batch_, "Zero3: end_micro_batch() without begin_micro_batch()");
  // Units whose backward did not run (none in forward_backward) are reduced too, so every rank
  // issues the same collectives and their gradients (zeros) still count.
  for (int s = 0; s < sections(); ++s) {
    if (sections_[s].grad_resident) launch_reduce_scatter(s);
  }
  for (int phase = 0; phase < 2 * units(); ++phase) end_phase(phase);
  for (size_t slot = 0; slot < slot_section_.size(); ++slot) {
    if (slot_section_[slot] >= 0) complete_reduce_scatter(static_cast<int>(slot));
  }
  window_s_ += seconds(Clock::now() - window_start_);
  in_micro_batch_ = false;
  ++rounds_;
}

double Zero3::hidden_fraction() const {
  if (window_s_ <= 0.0) return 1.0;
  return std::clamp(1.0 - blocked_s_ / window_s_, 0.0, 1.0);
}

NormShare Zero3::norm_share() {
  LOOM_CHECK(!in_micro_batch_, "Zero3: step() inside a micro-batch; call end_micro_batch() first");
  LOOM_CHECK(rounds_ > 0, "Zero3: step() needs at least one micro-batch's gradients since the last step");
  NormShare share{{}, &dp_, nullptr, shards_device_};
  const float* grads = grad_shards_.data<float>();
  for (const Section& sec : sections_) share.pieces.push_back({grads + sec.grad_offset, sec.mine});
  return share;
}

double Zero3::step(double lr, int64_t step) {
  const double norm = global_norm({norm_share()}, options_.norm_excluded, options_.norm_groups);
  update(optim::StepParams{lr, step, optim::clip_factor(config_, norm)});
  return norm;
}

void Zero3::update(const optim::StepParams& at) {
  LOOM_CHECK(!in_micro_batch_ && rounds_ > 0, "Zero3: update() needs a finished micro-batch since the last step");
  if (full_) release_full_parameters();  // the full copy would go stale
  // The host rewrites the shards in host memory next: every upload of them for a gather is done.
  if (options_.offload_shards) allocator(options_.device).fence()->wait();
  const float* grads = grad_shards_.data<float>();
  float* shard = shard_.data<float>();
  std::vector<optim::ShardPiece> pieces;
  for (size_t s = 0; s < sections_.size(); ++s) {
    const Section& sec = sections_[s];
    for (const Piece& p : pieces_[s]) {
      for (const optim::MomentArrays::Part& part : moments_.parts(sec.state_offset + p.local, p.numel)) {
        const int64_t local = part.begin - sec.state_offset;
        pieces.push_back({shard + part.begin, grads + sec.grad_offset + local, {part.exp_avg, part.exp_avg_sq},
                          part.n, p.weight_decay, p.lr_scale});
        pieces.back().state_on_host = part.on_host;
      }
    }
  }
  optimizer_->update_many(pieces, at);  // every section's pieces in as few launches as they allow
  prepare_gather_sources();
  grad_shards_.zero();
  rounds_ = 0;
}

void Zero3::prepare_gather_sources() {
  if (options_.param_gather != DType::F32) {
    kernels::narrow_floats(shards_device_, gather_send_.raw(), shard_.data<float>(), shard_.numel(),
                           options_.param_gather);
  }
  if (!options_.device_gather_copy) return;
  const Tensor& send = options_.param_gather == DType::F32 ? shard_ : gather_send_;
  copy_from_host(options_.device, device_send_.data<std::byte>(), send.data<std::byte>(),
                 static_cast<int64_t>(send.nbytes()));
}

void Zero3::gather_full_parameters() {
  LOOM_CHECK(!in_micro_batch_, "Zero3: gather_full_parameters() inside a micro-batch");
  if (full_) return;
  full_ = true;
  for (int s = 0; s < sections(); ++s) acquire_section(s);
  for (Section& sec : sections_) finish_gather(sec);
}

void Zero3::release_full_parameters() {
  if (!full_) return;
  full_ = false;
  for (int s = 0; s < sections(); ++s) release_section(s);
}

void Zero3::load_from_full() {
  LOOM_CHECK(!in_micro_batch_, "Zero3: load_from_full() inside a micro-batch");
  if (full_) {  // the buffer was filled from outside: its values are the new parameters
    full_ = false;
    for (Section& sec : sections_) {
      sec.refs = 0;
      sec.gathered = false;
    }
    gathered_elements_ = 0;
  }
  for (const Section& sec : sections_) {
    LOOM_CHECK(sec.refs == 0, "Zero3: load_from_full() while a unit's parameters are gathered");
    float* shard = shard_.data<float>() + sec.state_offset;
    if (options_.offload_shards) {
      copy_to_host(options_.device, shard, values_ + sec.mine.begin, sec.mine.size());
    } else {
      copy_on_device(options_.device, shard, values_ + sec.mine.begin, sec.mine.size());
    }
  }
  prepare_gather_sources();
  for (const Section& sec : sections_) release_range(options_.device, values_, sec.begin, sec.numel);
}

void Zero3::gather_moments(float* exp_avg, float* exp_avg_sq) {
  std::vector<comm::WorkHandle> work;
  for (const Section& sec : sections_) {
    if (sec.numel == 0) continue;
    const std::vector<optim::MomentArrays::Part> parts = moments_.parts(sec.state_offset, sec.mine.size());
    LOOM_CHECK(parts.size() <= 1, "Zero3::gather_moments: a section's moments are split between host and device "
                                  "memory (optim.offload_fraction < 1)");
    const float* m = parts.empty() ? nullptr : parts[0].exp_avg;
    const float* v = parts.empty() ? nullptr : parts[0].exp_avg_sq;
    work.push_back(start_shard_all_gather(dp_, m, exp_avg + sec.begin, sec.counts, DType::F32));
    work.push_back(start_shard_all_gather(dp_, v, exp_avg_sq + sec.begin, sec.counts, DType::F32));
  }
  for (comm::WorkHandle& w : work) w->wait();
}

std::vector<Zero3::OwnedShard> Zero3::shards() const {
  std::vector<OwnedShard> out;
  for (const Section& sec : sections_) {
    if (sec.mine.empty()) continue;
    for (const optim::MomentArrays::Part& part : moments_.parts(sec.state_offset, sec.mine.size())) {
      const int64_t local = part.begin - sec.state_offset;
      out.push_back({sec.mine.begin + local, sec.mine.begin + local + part.n, shard_.data<float>() + part.begin,
                     part.exp_avg, part.exp_avg_sq, part.on_host, part.device, options_.offload_shards});
    }
  }
  return out;
}

void Zero3::load_moments(const float* exp_avg, const float* exp_avg_sq) {
  for (const Section& sec : sections_) {
    for (const optim::MomentArrays::Part& part : moments_.parts(sec.state_offset, sec.mine.size())) {
      const int64_t at = sec.mine.begin + (part.begin - sec.state_offset);
      copy_from_host(part.device, part.exp_avg, exp_avg + at, part.n);
      copy_from_host(part.device, part.exp_avg_sq, exp_avg_sq + at, part.n);
    }
  }
}

Zero3Memory Zero3::memory() const {
  Zero3Memory m;
  (options_.offload_shards ? m.host_parameter_shard : m.parameter_shard) = shard_.numel() * 4;
  (options_.offload_shards ? m.host_gradient_shard : m.gradient_shard) = grad_shards_.numel() * 4;
  m.moments = moments_.device_elements() * 8;
  m.host_moments = moments_.host_elements() * 8;
  m.comm_buffers = static_cast<int64_t>(staging_.nbytes());
  m.gather_copy = static_cast<int64_t>(device_send_.nbytes());
  for (const Section& sec : sections_) m.full_parameters += sec.numel * 4;
  m.peak_parameters = peak_parameters_ * 4;
  m.peak_gradients = peak_gradients_ * 4;
  m.peak_resident = peak_resident_ * 4;
  return m;
}

int64_t process_peak_rss_bytes() {
  struct rusage usage {};
  if (::getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

int64_t process_rss_bytes() {
  // statm: total and resident pages of the process's address space.
  std::ifstream statm("/proc/self/statm");
  int64_t total = 0, resident = 0;
  if (!(statm >> total >> resident)) return 0;
  return resident * static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
}

std::string describe_zero3_peak(const Zero3Memory& memory) {
  std::ostringstream out;
  out << "measured peak per rank (zero 3): parameters " << mib(memory.peak_parameters) << " (full model "
      << mib(memory.full_parameters) << "), gradients " << mib(memory.peak_gradients) << ", both together "
      << mib(memory.peak_resident) << "; process RSS now " << mib(process_rss_bytes()) << ", peak "
      << mib(process_peak_rss_bytes()) << " (all ranks of the process; the peak includes start-up, when the model is "
      << "initialised in full before it is sharded)";
  return out.str();
}

}  // namespace loom::parallel
