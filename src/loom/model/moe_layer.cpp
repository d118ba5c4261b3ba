#include "loom/model/moe_layer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "loom/core/error.h"
#include "loom/kernels/ops.h"

namespace loom::model {

namespace {
double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

MoeLayer::MoeLayer(ParameterStore& store, const TensorParallel& tp, ExpertLayout experts, int layer,
                   const std::string& prefix, const config::ModelConfig& config, int dense_ffn, float init_std,
                   float out_std)
    : store_(&store),
      prefix_(prefix),
      tp_(&tp),
      device_(store.device()),
      moe_(config.moe),
      d_model_(config.d_model),
      width_(config.moe.latent_size > 0 ? config.moe.latent_size : config.d_model),
      router_(config.moe, store.device(), config.moe.experts, config.d_model) {
  const int E = config.moe.experts;
  LOOM_CHECK(E % experts.size == 0, "layer " + std::to_string(layer) + " (" + prefix + "): model.moe_experts " +
                                        std::to_string(E) + " cannot be split over " + std::to_string(experts.size) +
                                        " expert-parallel ranks (parallel.ep must divide it)");
  // The router and latent projections see this rank's share of the tokens only: their gradients
  // are summed over the tensor-parallel ranks.
  router_weight_ =
      store.add(prefix + ".gate.weight", {E, config.d_model}, Init::Normal, init_std, tp.replicated_partial());
  store.set_lr_scale(router_weight_, static_cast<float>(config.moe.router_lr_scale));
  if (config.moe.latent_size > 0) {
    latent_down_ = store.add(prefix + ".fc1_latent_proj.weight", {width_, config.d_model}, Init::Normal, init_std,
                             tp.replicated_partial());
    latent_up_ = store.add(prefix + ".fc2_latent_proj.weight", {config.d_model, width_}, Init::Normal, out_std,
                           tp.replicated_partial());
  }
  if (config.moe.shared_ffn_size > 0) {
    shared_.emplace(store, tp, layer, prefix + ".shared_expert", config.d_model, config.moe.shared_ffn_size,
                    config.activation, false, init_std, out_std);
    if (config.moe.shared_expert_gate) {
      shared_gate_ = store.add(prefix + ".shared_expert_gate.weight", {1, config.d_model}, Init::Normal, init_std,
                               tp.replicated());
    }
  }
  // The routed experts last: a layer's dense and expert parameters are then two contiguous runs
  // (expert parallelism reduces and shards them over different groups). Without expert
  // parallelism every tensor-parallel rank holds every expert and computes its share of the
  // tokens' gradients: summed over the group. With it the expert-data-parallel group (which
  // holds the tensor-parallel ranks) sums the copies, and every rank's experts count in the norm.
  const int local = E / experts.size;
  const int ffn = config.moe.ffn_size > 0 ? config.moe.ffn_size : dense_ffn;
  const ShardSpec placement = experts.size == 1 ? tp.replicated_partial() : ShardSpec{};
  experts_.emplace(store, placement, prefix, experts.rank * local, local, width_, ffn, config.activation, init_std,
                   out_std);
  bias_.assign(E, 0.0f);
  stats_.loads.assign(E, 0.0);
}

void MoeLayer::set_precision(PrecisionContext& context, Recipe recipe, const std::string& prefix) {
  if (shared_) shared_->set_precision(context, recipe, prefix + ".shared_expert");
  // The routed experts in the block's recipe (FP8 under the FP8 recipes, as Transformer Engine's
  // grouped GEMMs). The latent projections, which every expert's rows pass through, in its 16-bit
  // form (bf16 under the FP8 and MX recipes, as the head); the router stays fp32 (Megatron's
  // moe_router_dtype=fp32: the routing decisions are sensitive to rounding and its GEMM is small).
  experts_->set_precision(context, recipe, prefix, moe_.experts);
  const Recipe latent = sixteen_bit_recipe(recipe);
  if (latent_down_ >= 0 && latent != Recipe::Fp32) {
    latent_down_precision_ = context.make(latent, prefix + ".fc1_latent_proj");
    latent_up_precision_ = context.make(latent, prefix + ".fc2_latent_proj");
  } else {
    latent_down_precision_.reset();
    latent_up_precision_.reset();
  }
}

void MoeLayer::exchange(const float* send, float* recv, const ExchangePlan& x, int64_t width, bool to_experts) const {
  std::vector<int64_t> send_counts(x.peers), recv_counts(x.peers);
  for (int p = 0; p < x.peers; ++p) {
    send_counts[p] = (to_experts ? x.send_rows[p] : x.recv_rows[p]) * width;
    recv_counts[p] = (to_experts ? x.recv_rows[p] : x.send_rows[p]) * width;
  }
  comm_->exchange_rows(send, send_counts, recv, recv_counts);
}

// Experts' outputs of s.dispatched, in the dispatched order (s.returned).
const float* MoeLayer::run_experts(Saved& s, int64_t width) const {
  const int64_t rows = static_cast<int64_t>(s.plan.order.size());
  float* returned = sized(s.returned, rows * width, device_);
  if (comm_ == nullptr || comm_->size() == 1) {
    experts_->forward(s.experts, returned, s.dispatched.data(), s.plan.expert_rows, moe_scratch().experts);
    return returned;
  }
  const int peers = comm_->size();
  const std::vector<int64_t> send = send_counts_by_expert(s.plan, peers);
  std::vector<int64_t> recv(send.size());
  comm_->exchange_counts(send.data(), recv.data(), experts_->count());
  s.exchange = make_exchange_plan(s.plan, peers, recv);
  const ExchangePlan& x = s.exchange;
  float* received = sized(moe_scratch().received, x.received * width, device_);
  exchange(s.dispatched.data(), received, x, width, true);
  float* expert_in = sized(s.expert_in, x.received * width, device_);
  regroup_rows(device_, expert_in, received, x, width, true);
  float* expert_out = sized(moe_scratch().back, x.received * width, device_);
  experts_->forward(s.experts, expert_out, expert_in, x.expert_rows, moe_scratch().experts);
  regroup_rows(device_, received, expert_out, x, width, false);
  exchange(received, returned, x, width, false);
  return returned;
}

bool MoeLayer::share_is_own_rows() const { return tp_->single() || tp_->sequence_parallel(); }

void MoeLayer::add_share(float* target, const float* share_values, int64_t rows) const {
  const TensorParallel::RowPart mine = tp_->row_part(rows);
  const int64_t C = d_model_;
  if (share_is_own_rows()) {
    kernels::add_in_place(device_, target, share_values, mine.rows * C);
    return;
  }
  // Tensor parallel without sequence parallelism: every rank holds every row, and each row is one
  // rank's share: the shares gathered (half an all-reduce's bytes) and added.
  float* whole = sized(moe_scratch().whole, rows * C, device_);
  tp_->gather_row_parts(whole, share_values, rows, C);
  kernels::add_in_place(device_, target, whole, rows * C);
}

void MoeLayer::forward(Saved& s, float* residual, const float* normed, int64_t batch, int64_t seq,
                       ParallelScratch& scratch) const {
  const auto start = std::chrono::steady_clock::now();
  const int64_t rows = batch * seq, C = d_model_, W = width_;
  if (shared_) shared_forward(s, residual, normed, rows, scratch);
  const float* x = tp_->enter_forward(normed, rows, C, s.gathered);  // every token of the group
  router_.forward(s.routing, x, rows, seq, value(router_weight_), moe_.expert_bias ? bias_.data() : nullptr, comm_);
  DispatchPlan plan = plan_dispatch(s.routing.expert.data(), s.routing.weight.data(), rows, router_.top_k(),
                                    router_.experts(), moe_.capacity_factor, moe_.drop_policy);
  s.group_dropped = plan.dropped;
  // The routed part runs on this rank's share of the group's tokens (every tensor-parallel rank
  // routes the whole group alike, then dispatches its share).
  const TensorParallel::RowPart mine = tp_->row_part(rows);
  s.plan = mine.rows == rows ? std::move(plan) : share_of_plan(plan, mine.first, mine.rows);
  const int64_t R = static_cast<int64_t>(s.plan.order.size()), k = router_.top_k();
  const int32_t* tokens = upload(device_, s.row_token, dispatched_tokens(s.plan));  // counted from mine.first
  // Each selection's dispatched row (-1: dropped or another rank's), for the router's backward.
  selection_row_.assign(static_cast<size_t>(rows * k), -1);
  std::vector<float> row_weight(R);
  for (int64_t r = 0; r < R; ++r) {
    const int64_t selection = mine.first * k + s.plan.order[r];
    selection_row_[static_cast<size_t>(selection)] = static_cast<int32_t>(r);
    row_weight[r] = s.routing.weight[selection];
  }
  upload(device_, s.selection_row, selection_row_);
  const float* weights = upload(device_, s.row_weight, row_weight);
  const float* expert_input = x + mine.first * C;
  if (latent_down_ >= 0) {
    float* z = sized(s.latent, mine.rows * W, device_);
    stored_linear_forward(*store_, latent_down_precision_.get(), latent_down_, z, expert_input, mine.rows, C, W);
    expert_input = z;
  }
  float* dispatched = sized(s.dispatched, R * W, device_);
  kernels::gather_rows(device_, dispatched, expert_input, tokens, nullptr, R, W);
  const float* returned = run_experts(s, W);
  float* y = zeroed(s.combined, mine.rows * W, device_);
  kernels::scatter_add_rows(device_, y, returned, W, tokens, weights, R, W);  // combine, in dispatched order
  const float* out = y;
  if (latent_up_ >= 0) {
    float* full = sized(moe_scratch().out_full, mine.rows * C, device_);
    stored_linear_forward(*store_, latent_up_precision_.get(), latent_up_, full, y, mine.rows, W, C);
    out = full;
  }
  add_share(residual, out, rows);
  stats_.seconds += seconds_since(start);
}

// residual[local rows] += shared(normed), times sigmoid(normed . g) per row when gated. The
// gate sees this rank's rows only (sequence parallel); its replicated weight's gradient is then
// summed over the tensor-parallel group like a norm's.
void MoeLayer::shared_forward(Saved& s, float* residual, const float* normed, int64_t rows,
                              ParallelScratch& scratch) const {
  if (shared_gate_ < 0) {
    shared_->forward(s.shared, residual, normed, rows, scratch);
    return;
  }
  const int64_t C = d_model_, local = tp_->local_rows(rows);
  float* out = zeroed(s.shared_out, local * C, device_);
  shared_->forward(s.shared, out, normed, rows, scratch);
  // The gate where the rows are: nothing read back.
  double* logit = row_dots(normed, nullptr, value(shared_gate_), 0, local, C);
  float* gate = sized(s.gate, local, device_);
  kernels::sigmoid_gate(device_, gate, logit, local);
  kernels::scatter_add_rows(device_, residual, out, C, nullptr, gate, local, C);
}

double* MoeLayer::row_dots(const float* a, const int32_t* index, const float* b, int64_t b_stride, int64_t rows,
                           int64_t width) const {
  double* dots = sized(moe_scratch().dots, rows, device_);
  kernels::row_dots(device_, dots, a, index, b, b_stride, rows, width);
  return dots;
}

// out = gate * shared: d_shared = gate * d_out; d_logit = gate (1 - gate) (d_out . shared).
void MoeLayer::shared_backward(float* d_normed, const float* d_residual, const float* normed, const Saved& s,
                               Workspace& work, int64_t rows, ParallelScratch& scratch) const {
  if (shared_gate_ < 0) {
    shared_->backward(d_normed, d_residual, normed, s.shared, work, rows, scratch, true);
    return;
  }
  const int64_t C = d_model_, local = tp_->local_rows(rows);
  float* d_shared = sized(moe_scratch().d_shared, local * C, device_);
  kernels::gather_rows(device_, d_shared, d_residual, nullptr, s.gate.data(), local, C);
  const double* dot = row_dots(d_residual, nullptr, s.shared_out.data(), C, local, C);
  float* d_logit = sized(moe_scratch().d_gate_logit, local, device_);
  kernels::sigmoid_gate_backward(device_, d_logit, dot, s.gate.data(), local);
  // dg += sum_t d_logit[t] normed[t] (rows in order into row 0); d_normed[t] += d_logit[t] g. The
  // index of zeros is uploaded once, when it grows.
  DeviceBuffer<int32_t>& zeros = moe_scratch().zeros;
  if (zeros.device() != device_ || zeros.size() < local) upload(device_, zeros, std::vector<int32_t>(local, 0));
  const int32_t* row_zero = zeros.data();
  kernels::scatter_add_rows(device_, store_->grad(shared_gate_), normed, C, row_zero, d_logit, local, C);
  kernels::scatter_add_rows(device_, d_normed, value(shared_gate_), 0, nullptr, d_logit, local, C);
  shared_->backward(d_normed, d_shared, normed, s.shared, work, rows, scratch, true);
}

// d_dispatched [rows, width] from d_returned (both in the dispatched order).
void MoeLayer::experts_backward(float* d_dispatched, const float* d_returned, const Saved& s, Workspace& work,
                                int64_t width) const {
  if (comm_ == nullptr || comm_->size() == 1) {
    experts_->backward(d_dispatched, d_returned, s.dispatched.data(), s.experts, work, s.plan.expert_rows,
                       moe_scratch().experts);
    return;
  }
  const ExchangePlan& x = s.exchange;
  float* received = sized(moe_scratch().received, x.received * width, device_);
  exchange(d_returned, received, x, width, true);
  float* d_out = sized(moe_scratch().back, x.received * width, device_);
  regroup_rows(device_, d_out, received, x, width, true);
  float* d_in = sized(moe_scratch().d_rows2, x.received * width, device_);
  experts_->backward(d_in, d_out, s.expert_in.data(), s.experts, work, x.expert_rows, moe_scratch().experts);
  regroup_rows(device_, received, d_in, x, width, false);
  exchange(received, d_dispatched, x, width, false);
}

void MoeLayer::backward(float* d_normed, const float* d_residual, const float* normed, const Saved& s,
                        Workspace& work, int64_t batch, int64_t seq, ParallelScratch& scratch) const {
  const auto start = std::chrono::steady_clock::now();
  const int64_t rows = batch * seq, C = d_model_, W = width_;
  if (shared_) shared_backward(d_normed, d_residual, normed, s, work, rows, scratch);
  const TensorParallel::RowPart mine = tp_->row_part(rows);
  const float* x = (tp_->sequence_parallel() ? s.gathered.data() : normed) + mine.first * C;
  // The gradient of the branch's output at this rank's share of the rows.
  const float* d_out = share_is_own_rows() ? d_residual : d_residual + mine.first * C;
  const float* d_y = d_out;
  if (latent_up_ >= 0) {
    float* dy = zeroed(moe_scratch().d_y, mine.rows * W, device_);
    stored_linear_backward(*store_, latent_up_precision_.get(), latent_up_, dy, d_out, s.combined.data(), mine.rows,
                           W, C);
    d_y = dy;
  }
  // Combine: y[t] = sum_r weight[s_r] * returned[r].
  // d_returned[r] = weight[r] * d_y[token[r]], d_weight[selection of r] = d_y[token[r]] . returned[r].
  const int64_t R = static_cast<int64_t>(s.plan.order.size());
  const int32_t* tokens = s.row_token.data();
  const double* row_grad = row_dots(d_y, tokens, s.returned.data(), W, R, W);  // each dispatched row's d_weight
  float* d_returned = sized(moe_scratch().d_rows, R * W, device_);
  kernels::gather_rows(device_, d_returned, d_y, tokens, s.row_weight.data(), R, W);
  float* d_dispatched = sized(moe_scratch().d_rows2, R * W, device_);
  if (comm_ != nullptr && comm_->size() > 1) d_dispatched = sized(moe_scratch().out_full, R * W, device_);
  experts_backward(d_dispatched, d_returned, s, work, W);
  float* d_x = zeroed(moe_scratch().d_x_full, mine.rows * C, device_);
  if (latent_down_ >= 0) {
    float* dz = zeroed(moe_scratch().d_y, mine.rows * W, device_);
    kernels::scatter_add_rows(device_, dz, d_dispatched, W, tokens, nullptr, R, W);
    stored_linear_backward(*store_, latent_down_precision_.get(), latent_down_, d_x, dz, x, mine.rows, C, W);
  } else {
    kernels::scatter_add_rows(device_, d_x, d_dispatched, W, tokens, nullptr, R, W);
  }
  // The router's gradient at this rank's share (the balancing losses' part too).
  const int E = router_.experts();
  float* d_logits = sized(moe_scratch().d_logits, rows * E, device_);
  router_.backward(d_logits, s.routing, s.selection_row.data(), row_grad, aux_scale_, mine.first,
                   mine.first + mine.rows);
  kernels::linear_backward(device_, d_x, store_->grad(router_weight_), nullptr, d_logits + mine.first * E, x,
                           value(router_weight_), mine.rows, C, E);
  add_share(d_normed, d_x, rows);  // the input's gradient, as the output forward
  record_stats(s);
  stats_.seconds += seconds_since(start);
}

void MoeLayer::record_stats(const Saved& s) const {
  for (int e = 0; e < router_.experts(); ++e) stats_.loads[e] += s.routing.counts[e];
  stats_.selections += static_cast<double>(s.routing.expert.size());
  stats_.dropped += static_cast<double>(s.group_dropped);
  stats_.aux_loss += s.routing.aux_loss;
  stats_.z_loss += s.routing.z_loss;
  stats_.micro_batches += 1;
}

void MoeLayer::update_bias(const std::vector<double>& global_loads) {
  const int E = router_.experts();
  const double mean = std::accumulate(global_loads.begin(), global_loads.end(), 0.0) / E;
  for (int e = 0; e < E; ++e) {
    const double diff = mean - global_loads[e];
    const float sign = diff > 0.0 ? 1.0f : (diff < 0.0 ? -1.0f : 0.0f);
    bias_[e] += static_cast<float>(moe_.bias_update_rate) * sign;
  }
}

}  // namespace loom::model
