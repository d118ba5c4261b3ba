#include "loom/model/mamba2_mixer.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "loom/config/hybrid_config.h"
#include "loom/core/error.h"
#include "loom/kernels/ops.h"

namespace loom::model {

Mamba2Mixer::Mamba2Mixer(ParameterStore& store, const TensorParallel& tp, int layer, const std::string& prefix,
                         const config::ModelConfig& config, float init_std, float out_std)
    : store_(&store), device_(store.device()), eps_(static_cast<float>(config.norm_eps)) {
  const config::MambaConfig& m = config.mamba;
  const int64_t heads = config::mamba_heads(config), ranks = tp.size(), d = config.d_model;
  LOOM_CHECK(heads % ranks == 0 && m.groups % ranks == 0,
             "layer " + std::to_string(layer) + " (" + prefix + "): " + std::to_string(heads) + " Mamba heads in " +
                 std::to_string(m.groups) + " groups cannot be split over " + std::to_string(ranks) +
                 " tensor-parallel ranks (parallel.tp must divide model.mamba.groups and the heads)");
  heads_ = heads / ranks;
  groups_ = m.groups / ranks;
  head_dim_ = m.head_dim;
  state_ = m.state_size;
  kernel_ = m.conv_kernel;
  chunk_ = m.chunk_size;
  inner_ = heads_ * head_dim_;
  const int64_t r = tp.rank(), gn = groups_ * state_;
  // This rank's [start, start + length) of a per-head or per-group tensor's first dimension.
  auto rows = [&](int64_t global, int64_t local, std::vector<int64_t> rest) {
    Shape shape{global};
    shape.insert(shape.end(), rest.begin(), rest.end());
    return tp.split(shape, 0, r * local, local);
  };
  // in_proj: z, x, B, C, dt back to back, so this rank's [z; x; B; C; dt] is one GEMM.
  const int in_weight = store.add(prefix + ".in_proj_z.weight", {inner_, d}, Init::Normal, init_std,
                                  rows(heads * head_dim_, inner_, {d}));
  store.add(prefix + ".in_proj_x.weight", {inner_, d}, Init::Normal, init_std, rows(heads * head_dim_, inner_, {d}));
  store.add(prefix + ".in_proj_B.weight", {gn, d}, Init::Normal, init_std, rows(m.groups * state_, gn, {d}));
  store.add(prefix + ".in_proj_C.weight", {gn, d}, Init::Normal, init_std, rows(m.groups * state_, gn, {d}));
  store.add(prefix + ".in_proj_dt.weight", {heads_, d}, Init::Normal, init_std, rows(heads, heads_, {d}));
  // conv1d over x, B, C: weights back to back, then biases.
  const float conv_std = 1.0f / std::sqrt(static_cast<float>(kernel_));
  conv_weight_ = store.add(prefix + ".conv1d_x.weight", {inner_, kernel_}, Init::Normal, conv_std,
                           rows(heads * head_dim_, inner_, {kernel_}));
  store.add(prefix + ".conv1d_B.weight", {gn, kernel_}, Init::Normal, conv_std, rows(m.groups * state_, gn, {kernel_}));
  store.add(prefix + ".conv1d_C.weight", {gn, kernel_}, Init::Normal, conv_std, rows(m.groups * state_, gn, {kernel_}));
  conv_bias_ = store.add(prefix + ".conv1d_x.bias", {inner_}, Init::Zeros, 0.0f, rows(heads * head_dim_, inner_, {}));
  store.add(prefix + ".conv1d_B.bias", {gn}, Init::Zeros, 0.0f, rows(m.groups * state_, gn, {}));
  store.add(prefix + ".conv1d_C.bias", {gn}, Init::Zeros, 0.0f, rows(m.groups * state_, gn, {}));
  dt_bias_ = store.add(prefix + ".dt_bias", {heads_}, Init::MambaDtBias, 0.0f, rows(heads, heads_, {}));
  a_log_ = store.add(prefix + ".A_log", {heads_}, Init::MambaALog, 0.0f, rows(heads, heads_, {}));
  d_ = store.add(prefix + ".D", {heads_}, Init::Ones, 0.0f, rows(heads, heads_, {}));
  norm_ = store.add(prefix + ".norm.weight", {inner_}, Init::Ones, 0.0f, rows(heads * head_dim_, inner_, {}));
  const int out_weight = store.add(prefix + ".out_proj.weight", {d, inner_}, Init::Normal, out_std,
                                   tp.split({d, heads * head_dim_}, 1, r * inner_, inner_));
  in_.emplace(store, tp, in_weight, -1, d, proj_width());
  out_.emplace(store, tp, out_weight, -1, inner_, d);
}

void Mamba2Mixer::set_precision(PrecisionContext& context, Recipe recipe, const std::string& prefix) {
  in_->set_precision(context.make(recipe, prefix + ".in_proj"));
  out_->set_precision(context.make(recipe, prefix + ".out_proj"));
}

kernels::SsdShape Mamba2Mixer::scan_shape(const Heads& h, int64_t batch, int64_t seq) const {
  return {batch, seq, h.heads, head_dim_, h.groups, state_, chunk_, h.conv_channels(), h.proj_width(),
          h.conv_channels(), h.inner};
}

kernels::ConvShape Mamba2Mixer::conv_shape(const Heads& h, int64_t batch, int64_t seq) const {
  return {batch, seq, h.conv_channels(), kernel_, h.proj_width(), h.conv_channels()};
}

Mamba2Mixer::Heads Mamba2Mixer::context_heads() const {
  const int64_t cp = context_->size(), rank = context_->rank();
  const int64_t heads = heads_ / cp, groups = groups_ / cp;
  return {heads, groups, heads * head_dim_, groups * state_, rank * heads, rank * groups};
}

std::vector<HeadColumns> Mamba2Mixer::proj_segments() const {
  const int64_t gn = groups_ * state_;
  return {{0, inner_}, {inner_, inner_}, {2 * inner_, gn}, {2 * inner_ + gn, gn}, {2 * inner_ + 2 * gn, heads_}};
}

Mamba2Mixer::HeadParams Mamba2Mixer::head_params(const Heads& h, bool backward) const {
  ParameterStore& p = *store_;
  const int64_t head = h.first_head, channel = h.first_head * head_dim_;
  // `tensor(id)`: a parameter's values or gradients; the heads' parts of the per-head ones.
  const auto of = [&](auto tensor) -> HeadTensors {
    return {tensor(conv_weight_), tensor(conv_bias_), tensor(dt_bias_) + head,
            tensor(a_log_) + head, tensor(d_) + head, tensor(norm_) + channel};
  };
  HeadParams params{};
  params.value = of([&](int id) { return p.value(id); });
  if (backward) params.grad = of([&](int id) { return p.grad(id); });
  if (h.heads == heads_) return params;
  const int64_t k = kernel_;
  float* weight = sized(conv_slice_, h.conv_channels() * (k + 1), device_);
  float* bias = weight + h.conv_channels() * k;
  for (const ConvRows& part : conv_slice_rows(h)) {
    copy_on_device(device_, weight + part.slice * k, p.value(conv_weight_) + part.full * k, part.count * k);
    copy_on_device(device_, bias + part.slice, p.value(conv_bias_) + part.full, part.count);
  }
  params.value.conv_weight = weight;
  params.value.conv_bias = bias;
  if (backward) {
    params.grad.conv_weight = zeroed(conv_slice_grad_, h.conv_channels() * (k + 1), device_);
    params.grad.conv_bias = params.grad.conv_weight + h.conv_channels() * k;
  }
  return params;
}

std::array<Mamba2Mixer::ConvRows, 3> Mamba2Mixer::conv_slice_rows(const Heads& h) const {
  const int64_t gn = groups_ * state_, group_rows = h.first_group * state_;
  return {{{h.first_head * head_dim_, 0, h.inner},
           {inner_ + group_rows, h.inner, h.gn},
           {inner_ + gn + group_rows, h.inner + h.gn, h.gn}}};
}

void Mamba2Mixer::add_conv_slice_grads(const Heads& h) const {
  ParameterStore& p = *store_;
  const int64_t k = kernel_;
  const float* weight = conv_slice_grad_.data();
  const float* bias = weight + h.conv_channels() * k;
  for (const ConvRows& part : conv_slice_rows(h)) {
    kernels::add_rows(device_, p.grad(conv_weight_) + part.full * k, k, weight + part.slice * k, k, part.count, k);
    kernels::add_rows(device_, p.grad(conv_bias_) + part.full, 1, bias + part.slice, 1, part.count, 1);
  }
}

void Mamba2Mixer::scan_forward(const Heads& h, Saved& saved, float* gated, int64_t batch, int64_t seq,
                               const int32_t* documents) const {
  const int64_t rows = batch * seq;
  const HeadTensors w = head_params(h, false).value;
  const float* proj = saved.proj.data();
  float* conv = sized(saved.conv, rows * h.conv_channels(), device_);
  float* y = sized(saved.y, rows * h.inner, device_);
  float* rstd = sized(saved.rstd, rows * h.groups, device_);
  kernels::causal_conv_silu_forward(device_, conv, proj + h.inner, w.conv_weight, w.conv_bias,
                                    conv_shape(h, batch, seq), documents);
  kernels::ssd_scan_forward(device_, y, conv, proj + h.inner + h.conv_channels(), w.dt_bias, w.a_log, conv + h.inner,
                            conv + h.inner + h.gn, w.d, scan_shape(h, batch, seq), documents);
  kernels::gated_rmsnorm_forward(device_, gated, rstd, y, proj, h.proj_width(), w.norm, rows, h.inner,
                                 h.inner / h.groups, eps_);
}

void Mamba2Mixer::scan_backward(const Heads& h, float* d_proj, const float* d_gated, const Saved& saved,
                                Workspace& work, int64_t batch, int64_t seq, const int32_t* documents) const {
  const int64_t rows = batch * seq;
  const HeadParams params = head_params(h, true);
  const HeadTensors &w = params.value, &g = params.grad;
  const float* proj = saved.proj.data();
  const float* conv = saved.conv.data();
  float* d_y = zeroed(work.d_mixer_scan, rows * h.inner, device_);
  kernels::gated_rmsnorm_backward(device_, d_y, d_proj, g.norm, d_gated, saved.y.data(), proj, h.proj_width(),
                                  w.norm, saved.rstd.data(), rows, h.inner, h.inner / h.groups);
  float* d_conv = zeroed(work.d_mixer_conv, rows * h.conv_channels(), device_);
  const float* dt = proj + h.inner + h.conv_channels();
  kernels::ssd_scan_backward(device_, d_conv, d_proj + h.inner + h.conv_channels(), g.dt_bias, g.a_log,
                             d_conv + h.inner, d_conv + h.inner + h.gn, g.d, d_y, conv, dt, w.dt_bias, w.a_log,
                             conv + h.inner, conv + h.inner + h.gn, w.d, scan_shape(h, batch, seq), documents);
  kernels::causal_conv_silu_backward(device_, d_proj + h.inner, g.conv_weight, g.conv_bias, d_conv,
                                     proj + h.inner, w.conv_weight, w.conv_bias, conv_shape(h, batch, seq), documents);
  if (h.heads != heads_) add_conv_slice_grads(h);
}

void Mamba2Mixer::forward(Saved& saved, float* residual, const float* normed, int64_t batch, int64_t seq,
                          const Packing& packing, ParallelScratch& scratch, const float* residual_in) const {
  const int64_t rows = batch * seq;
  float* gated = sized(saved.gated, rows * inner_, device_);
  if (context_ == nullptr) {
    in_->forward(sized(saved.proj, rows * proj_width(), device_), normed, rows, scratch);
    scan_forward(all_heads(), saved, gated, batch, seq, packing.documents);
  } else {
    // Whole sequences of this rank's 1/cp of the heads between two all-to-alls.
    const Heads h = context_heads();
    const int64_t whole_seq = seq * context_->size(), whole_rows = batch * whole_seq;
    float* local_proj = sized(scratch.mixer_proj, rows * proj_width(), device_);
    in_->forward(local_proj, normed, rows, scratch);
    context_->rows_to_heads(sized(saved.proj, whole_rows * h.proj_width(), device_), local_proj, batch, seq,
                            proj_width(), proj_segments());
    const int32_t* documents = nullptr;
    if (packing.documents != nullptr) {
      saved.documents.resize(static_cast<size_t>(whole_rows));
      context_->gather_sequences(saved.documents.data(), packing.documents, batch, seq);
      documents = staged_documents_.stage(device_, saved.documents.data(), whole_rows);
    }
    float* whole_gated = sized(scratch.mixer_gated, whole_rows * h.inner, device_);
    scan_forward(h, saved, whole_gated, batch, whole_seq, documents);
    context_->heads_to_rows(gated, whole_gated, batch, seq, inner_, {{0, inner_}}, false);
  }
  out_->forward(residual, gated, rows, scratch, {}, residual_in);
}

void Mamba2Mixer::backward(float* d_normed, const float* d_residual, const float* normed, const Saved& saved,
                           Workspace& work, int64_t batch, int64_t seq, const Packing& packing,
                           ParallelScratch& scratch) const {
  const int64_t rows = batch * seq;
  float* d_gated = sized(work.d_mixer_gated, rows * inner_, device_);
  out_->backward(d_gated, d_residual, saved.gated.data(), rows, scratch, false);
  float* d_proj = zeroed(work.d_mixer_proj, rows * proj_width(), device_);
  if (context_ == nullptr) {
    scan_backward(all_heads(), d_proj, d_gated, saved, work, batch, seq, packing.documents);
  } else {
    const Heads h = context_heads();
    const int64_t whole_seq = seq * context_->size(), whole_rows = batch * whole_seq;
    float* whole_d_gated = sized(scratch.mixer_gated, whole_rows * h.inner, device_);
    context_->rows_to_heads(whole_d_gated, d_gated, batch, seq, inner_, {{0, inner_}});
    const int32_t* documents =
        packing.documents != nullptr ? staged_documents_.stage(device_, saved.documents.data(), whole_rows) : nullptr;
    float* whole_d_proj = zeroed(scratch.mixer_proj, whole_rows * h.proj_width(), device_);
    scan_backward(h, whole_d_proj, whole_d_gated, saved, work, batch, whole_seq, documents);
    context_->heads_to_rows(d_proj, whole_d_proj, batch, seq, proj_width(), proj_segments(), false);
  }
  in_->backward(d_normed, d_proj, normed, rows, scratch, false);
}

void Mamba2Mixer::decode(float* residual, const float* normed, int64_t rows, MambaCache& cache, Saved& scratch,
                         ParallelScratch& tp_scratch) const {
  if (cache.state.size() == 0) {
    zeroed(cache.window, window_width(), device_);
    zeroed(cache.state, state_width(), device_);
  }
  const StepRun run{0, rows, cache.window.data(), cache.state.data(), nullptr, {}};
  step_rows(residual, normed, rows, {&run, 1}, scratch, tp_scratch);
}

void Mamba2Mixer::forward_paged(float* residual, const float* normed, const PagedBatch& batch,
                                const PagedRows& on_device, PagedLayerCache& cache, Saved& scratch,
                                ParallelScratch& tp_scratch) const {
  const int64_t rows = batch.rows(), slots = static_cast<int64_t>(cache.windows.size()) / std::max<int64_t>(window_width(), 1);
  LOOM_CHECK(on_device.state_slots != nullptr, "a paged step of a hybrid model without its rows' Mamba state slots");
  std::vector<int64_t> slot_of(static_cast<size_t>(rows));
  for (int64_t t = 0; t < rows; ++t) {
    const int64_t entry = batch.sequences[t];
    LOOM_CHECK(entry >= 0 && entry < static_cast<int64_t>(batch.state_slots.size()),
               "a paged step's row " + std::to_string(t) + " names no Mamba state slot");
    const int64_t slot = batch.state_slots[entry];
    LOOM_CHECK(slot >= 0 && slot < slots, "Mamba state slot " + std::to_string(slot) + " is outside the pool of " +
                                              std::to_string(slots));
    slot_of[static_cast<size_t>(t)] = slot;
    if (batch.positions[t] == 0) {  // a sequence's first position starts from a zero state
      allocator(device_).zero(cache.windows.data() + slot * window_width(),
                              static_cast<size_t>(window_width()) * sizeof(float));
      allocator(device_).zero(cache.states.data() + slot * state_width(),
                              static_cast<size_t>(state_width()) * sizeof(float));
    }
  }
  LOOM_CHECK(batch.snapshot_slots.empty() || static_cast<int64_t>(batch.snapshot_slots.size()) == rows,
             "a paged step's snapshot slots are not one per row");
  for (int32_t to : batch.snapshot_slots) {
    LOOM_CHECK(to < slots, "Mamba snapshot slot " + std::to_string(to) + " is outside the pool of " +
                               std::to_string(slots));
  }
  const RunOrder order = run_order(batch, slot_of);
  const bool permuted = !order.group_ends.empty();
  const int32_t* slots_in_order = on_device.state_slots;  // each row's slot, in the runs' order
  if (permuted) {
    scratch.run_slots.resize(static_cast<size_t>(rows));
    for (int64_t i = 0; i < rows; ++i) {
      scratch.run_slots[static_cast<size_t>(i)] = static_cast<int32_t>(slot_of[order.to_batch[i]]);
    }
    slots_in_order = scratch.staged_run_slots.stage(device_, scratch.run_slots.data(), rows);
  }
  std::vector<StepRun> runs = plain_runs(order, slot_of, slots, slots_in_order, cache);
  // Verification rows: the j-th of every sequence together, then each state copied to its snapshot.
  for (size_t g = 0, first = static_cast<size_t>(order.plain); g < order.group_ends.size(); ++g) {
    const auto end = static_cast<size_t>(order.group_ends[g]);
    StepRun run{static_cast<int64_t>(first), static_cast<int64_t>(end - first), cache.windows.data(),
                cache.states.data(), slots_in_order + first, {}};
    for (size_t i = first; i < end; ++i) {
      const int64_t row = order.to_batch[i], to = batch.snapshot_slots[static_cast<size_t>(row)];
      if (to >= 0) run.snapshots.emplace_back(slot_of[static_cast<size_t>(row)], to);
    }
    runs.push_back(std::move(run));
    first = end;
  }
  const int32_t* to_batch = nullptr;
  const int32_t* to_runs = nullptr;
  if (permuted) {
    scratch.run_inverse.resize(static_cast<size_t>(rows));
    for (int64_t i = 0; i < rows; ++i) {
      scratch.run_inverse[static_cast<size_t>(order.to_batch[i])] = static_cast<int32_t>(i);
    }
    to_batch = scratch.staged_to_batch.stage(device_, order.to_batch.data(), rows);
    to_runs = scratch.staged_to_runs.stage(device_, scratch.run_inverse.data(), rows);
  }
  step_rows(residual, normed, rows, runs, scratch, tp_scratch, to_batch, to_runs);
}

Mamba2Mixer::RunOrder Mamba2Mixer::run_order(const PagedBatch& batch, const std::vector<int64_t>& slot_of) {
  const int64_t rows = batch.rows();
  RunOrder order;
  std::vector<std::pair<int64_t, int64_t>> verifying;  // first row and rows of each verifying sequence
  std::vector<char> verified(static_cast<size_t>(rows), 0);
  for (int64_t t = 0, end = 0; t < rows && !batch.snapshot_slots.empty(); t = end) {
    bool snapshots = false;
    for (end = t; end < rows && slot_of[static_cast<size_t>(end)] == slot_of[static_cast<size_t>(t)]; ++end) {
      snapshots = snapshots || batch.snapshot_slots[static_cast<size_t>(end)] >= 0;
    }
    if (!snapshots) continue;
    verifying.emplace_back(t, end - t);
    std::fill(verified.begin() + t, verified.begin() + end, 1);
  }
  for (int64_t t = 0; t < rows; ++t) {
    if (!verified[static_cast<size_t>(t)]) order.to_batch.push_back(static_cast<int32_t>(t));
  }
  order.plain = static_cast<int64_t>(order.to_batch.size());
  for (int64_t j = 0;; ++j) {
    const size_t before = order.to_batch.size();
    for (const auto& [first, count] : verifying) {
      if (j < count) order.to_batch.push_back(static_cast<int32_t>(first + j));
    }
    if (order.to_batch.size() == before) break;
    order.group_ends.push_back(static_cast<int64_t>(order.to_batch.size()));
  }
  return order;
}

// Adjacent rows on one slot are one sequence's next tokens (a prompt's chunk): one run from the
// slot. Rows of one token each go together while their slots differ (decoding sequences): one
// run over the pool, the kernels reading each row's slot. A sequence's rows keep their order.
std::vector<Mamba2Mixer::StepRun> Mamba2Mixer::plain_runs(const RunOrder& order, const std::vector<int64_t>& slot_of,
                                                           int64_t slots, const int32_t* slots_in_order,
                                                           PagedLayerCache& cache) const {
  std::vector<StepRun> runs;
  std::vector<char> in_group(static_cast<size_t>(slots), 0);  // the slots of the open group of one-token rows
  std::vector<int64_t> group_slots;
  auto close_group = [&] {
    for (int64_t g : group_slots) in_group[static_cast<size_t>(g)] = 0;
    group_slots.clear();
  };
  auto slot_at = [&](int64_t i) { return slot_of[static_cast<size_t>(order.to_batch[static_cast<size_t>(i)])]; };
  for (int64_t t = 0, end = 0; t < order.plain; t = end) {
    const int64_t slot = slot_at(t);
    for (end = t + 1; end < order.plain && slot_at(end) == slot;) ++end;
    if (end - t > 1) {
      close_group();
      runs.push_back({t, end - t, cache.windows.data() + slot * window_width(),
                      cache.states.data() + slot * state_width(), nullptr, {}});
      continue;
    }
    const bool joins = !runs.empty() && runs.back().slots != nullptr && runs.back().first + runs.back().count == t &&
                       !in_group[static_cast<size_t>(slot)];
    if (!joins) {
      close_group();
      runs.push_back({t, 0, cache.windows.data(), cache.states.data(), slots_in_order + t, {}});
    }
    ++runs.back().count;
    in_group[static_cast<size_t>(slot)] = 1;
    group_slots.push_back(slot);
  }
  return runs;
}

void Mamba2Mixer::step_rows(float* residual, const float* normed, int64_t rows, std::span<const StepRun> runs,
                            Saved& scratch, ParallelScratch& tp_scratch, const int32_t* to_batch,
                            const int32_t* to_runs) const {
  const int64_t gn = groups_ * state_;
  const ParameterStore& p = *store_;
  float* proj = sized(scratch.proj, rows * proj_width(), device_);
  float* conv = sized(scratch.conv, rows * conv_channels(), device_);
  float* y = sized(scratch.y, rows * inner_, device_);
  float* gated = sized(scratch.gated, rows * inner_, device_);
  float* rstd = sized(scratch.rstd, rows * groups_, device_);
  in_->forward(proj, normed, rows, tp_scratch);
  // The runs' rows in their own order: in_proj's output gathered into it, their output back.
  float* run_proj = proj;
  float* run_y = y;
  if (to_batch != nullptr) {
    run_proj = sized(scratch.run_proj, rows * proj_width(), device_);
    run_y = sized(scratch.run_y, rows * inner_, device_);
    kernels::gather_rows(device_, run_proj, proj, to_batch, nullptr, rows, proj_width());
  }
  for (const StepRun& run : runs) {
    // A chunk: batch 1 of run.count tokens; decoding rows: run.count sequences of one token.
    const int64_t batch = run.slots ? run.count : 1, seq = run.slots ? 1 : run.count;
    float* pt = run_proj + run.first * proj_width();
    float* ct = conv + run.first * conv_channels();
    kernels::causal_conv_silu_step(device_, ct, run.window, run.slots, pt + inner_, p.value(conv_weight_),
                                   p.value(conv_bias_), conv_shape(all_heads(), batch, seq));
    kernels::ssd_scan_step(device_, run_y + run.first * inner_, run.state, run.slots, ct,
                           pt + inner_ + conv_channels(), p.value(dt_bias_), p.value(a_log_), ct + inner_,
                           ct + inner_ + gn, p.value(d_), scan_shape(all_heads(), batch, seq));
    for (const auto& [from, to] : run.snapshots) {  // a verification row's state kept (pool slots)
      copy_on_device(device_, run.window + to * window_width(), run.window + from * window_width(), window_width());
      copy_on_device(device_, run.state + to * state_width(), run.state + from * state_width(), state_width());
    }
  }
  if (to_runs != nullptr) kernels::gather_rows(device_, y, run_y, to_runs, nullptr, rows, inner_);
  kernels::gated_rmsnorm_forward(device_, gated, rstd, y, proj, proj_width(), p.value(norm_), rows, inner_,
                                 inner_ / groups_, eps_);
  out_->forward(residual, gated, rows, tp_scratch);
}

}  // namespace loom::model
