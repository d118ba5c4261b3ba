#pragma once
// A mixture-of-experts feed-forward sub-block (Megatron-Core's MoE layer), used in place of the
// MLP on the layers block_configs picks:
//   router (fp32, on the full hidden state) -> top-k experts and weights per token
//   [latent MoE: z = x W_down_latent^T, experts work in the latent size; both latent projections
//    in the recipe's 16-bit form (set_precision)]
//   dispatch: rows permuted by expert; with expert parallelism the rows of each rank's experts
//   travel there by all-to-all (counts first), are regrouped by expert, run through the local
//   experts' grouped GEMM, regrouped and sent back; combine: out[token] += weight * expert row
//   [latent MoE: out = y W_up_latent^T]
//   + a shared expert (an MLP on every token, tensor-parallel like the dense MLP), optionally
//     scaled per token by sigmoid(x . g) with g [1, d_model] (Qwen2-MoE's shared_expert_gate).
// The tensors live on the model's device: the routing decisions (top-k, capacity, losses, the
// dispatch plan, the gates' sigmoids) are made on the host from small downloads (logits, row
// dot products) and their index and weight arrays uploaded for the row gathers and scatter-adds
// of kernels/ops.h; the same code runs on the CPU, where the copies are plain copies.
// The routing group is every token of this rank's micro-batch (gathered from the sequence-
// parallel ranks first): capacity and the balancing losses are defined over it, so the result
// does not depend on the expert-parallel size. Every tensor-parallel rank routes the whole group
// alike (the router's GEMM is small), then dispatches, combines and differentiates only its share
// of the tokens (its own rows under sequence parallelism, a balanced part of the rows without):
// the experts run each token once, and expert parallelism can span the tensor-parallel ranks
// (Megatron-Core's expert tensor parallelism 1, MoE parallel folding; comm/mesh.h).
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loom/model/expert_comm.h"
#include "loom/model/expert_mlp.h"
#include "loom/model/mlp.h"
#include "loom/model/moe_dispatch.h"
#include "loom/model/moe_router.h"

namespace loom::model {

// What a layer's routing did over the micro-batches since the last reset (reported per step).
struct MoeStepStats {
  std::vector<double> loads;  // [E] selections per expert, before drops
  double selections = 0.0, dropped = 0.0, aux_loss = 0.0, z_loss = 0.0;
  int micro_batches = 0;
  double seconds = 0.0;  // this rank's wall time in the layer's forward and backward (recompute included)
};

// Buffers a MoE layer needs only within one forward or backward call: one set serves every MoE
// layer of a model (one layer runs at a time), as the blocks share their Workspace; a layer
// without a shared set (set_scratch) uses its own.
struct MoeScratch {
  Buffer received, back;  // expert parallelism: rows exchanged with the experts' ranks, and their results
  Buffer out_full;        // latent MoE: the up-projected output (backward: the dispatched rows' gradient)
  Buffer whole;           // tensor parallel without sequence parallelism: every rank's share, gathered
  Buffer d_y, d_rows, d_rows2, d_x_full, d_logits, d_shared, d_gate_logit;
  DeviceBuffer<double> dots;
  DeviceBuffer<int32_t> zeros;
  ExpertScratch experts;  // the routed experts' padded rows (under the FP8 recipes)
};

class MoeLayer {
 public:
  struct Saved {
    Buffer gathered;  // sequence parallel: the group's full input rows
    Routing routing;
    DispatchPlan plan;  // this rank's share of the group's tokens
    int64_t group_dropped = 0;  // selections the group's plan dropped
    ExchangePlan exchange;
    DeviceBuffer<int32_t> row_token;  // the token of each dispatched row, counted from the share's first
    DeviceBuffer<int32_t> selection_row;  // the dispatched row of each selection (-1: dropped)
    Buffer row_weight;                // and its combine weight
    Buffer latent, dispatched, expert_in, returned, combined;
    ExpertMlp::Saved experts;
    Mlp::Saved shared;
    Buffer shared_out;               // gated shared expert: its output [local rows, d_model] before the gate
    Buffer gate;                     // and sigmoid(x . g) per local row
  };
  MoeLayer(ParameterStore& store, const TensorParallel& tp, ExpertLayout experts, int layer,
           const std::string& prefix, const config::ModelConfig& config, int dense_ffn, float init_std,
           float out_std);

  // residual[local rows] += moe(normed); rows = batch * seq.
  void forward(Saved& saved, float* residual, const float* normed, int64_t batch, int64_t seq,
               ParallelScratch& scratch) const;
  // d_normed[local rows] += gradient of the branch; parameter gradients into the store; the
  // micro-batch's routing statistics are added to step_stats().
  void backward(float* d_normed, const float* d_residual, const float* normed, const Saved& saved, Workspace& work,
                int64_t batch, int64_t seq, ParallelScratch& scratch) const;
  void set_precision(PrecisionContext& context, Recipe recipe, const std::string& prefix);

  void set_comm(ExpertComm* comm) { comm_ = comm; }
  void set_scratch(MoeScratch* scratch) { shared_scratch_ = scratch; }
  // The balancing losses' gradients are scaled by this (the trainer: 1 / micro-batches of the
  // global batch, times the loss scale).
  void set_aux_scale(float scale) { aux_scale_ = scale; }
  int experts() const { return router_.experts(); }
  const std::string& name() const { return prefix_; }  // model.layers.N.mlp
  bool has_expert_bias() const { return moe_.expert_bias; }
  // Aux-loss-free balancing: the per-expert selection bias, moved by update_bias once per global
  // batch from the loads of every routing rank (summed by the caller).
  std::vector<float>& expert_bias() { return bias_; }
  const std::vector<float>& expert_bias() const { return bias_; }
  void update_bias(const std::vector<double>& global_loads);
  MoeStepStats& step_stats() const { return stats_; }

 private:
  // This rank's share of a group's tokens is TensorParallel::row_part. Whether it is the rows this
  // rank holds (one rank, or sequence parallel); else every rank holds every row and the shares'
  // results are gathered over the group.
  bool share_is_own_rows() const;
  // Adds this rank's share of a group of `rows` rows (d_model wide) into `target`, which holds
  // this rank's rows: the share itself, or every row with the group's shares gathered.
  void add_share(float* target, const float* share_values, int64_t rows) const;
  const float* run_experts(Saved& s, int64_t width) const;
  void experts_backward(float* d_dispatched, const float* d_returned, const Saved& s, Workspace& work,
                        int64_t width) const;
  void exchange(const float* send, float* recv, const ExchangePlan& x, int64_t width, bool to_experts) const;
  void record_stats(const Saved& s) const;
  // out[r] = a[index[r] (null: r)] . b[r * b_stride] in double, on the device (MoeScratch::dots,
  // valid until the next call).
  double* row_dots(const float* a, const int32_t* index, const float* b, int64_t b_stride, int64_t rows,
                   int64_t width) const;
  void shared_forward(Saved& s, float* residual, const float* normed, int64_t rows, ParallelScratch& scratch) const;
  void shared_backward(float* d_normed, const float* d_residual, const float* normed, const Saved& s, Workspace& work,
                       int64_t rows, ParallelScratch& scratch) const;

  const float* value(int id) const { return store_->value(id); }
  ParameterStore* store_;
  std::string prefix_;
  const TensorParallel* tp_;
  Device device_;
  config::MoeConfig moe_;
  int d_model_, width_;  // width_: the experts' size (latent or d_model)
  MoeRouter router_;
  int router_weight_ = -1, latent_down_ = -1, latent_up_ = -1, shared_gate_ = -1;
  std::shared_ptr<LinearPrecision> latent_down_precision_, latent_up_precision_;  // null: fp32
  std::optional<ExpertMlp> experts_;
  std::optional<Mlp> shared_;
  std::vector<float> bias_;
  ExpertComm* comm_ = nullptr;
  float aux_scale_ = 1.0f;
  mutable MoeStepStats stats_;
  MoeScratch& moe_scratch() const { return shared_scratch_ != nullptr ? *shared_scratch_ : own_scratch_; }
  MoeScratch* shared_scratch_ = nullptr;
  mutable MoeScratch own_scratch_;
  mutable std::vector<int32_t> selection_row_;
};

}  // namespace loom::model
