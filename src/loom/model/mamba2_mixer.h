#pragma once
// Mamba-2 mixer (the SSD formulation, as Nemotron-H's NemotronHMamba2Mixer):
//   [z | x B C | dt] = in_proj(h)
//   x B C = silu(causal depthwise conv(x B C))           (conv_kernel taps)
//   y     = scan(x, softplus(dt + dt_bias), A = -exp(A_log), B, C) + D x   (chunked, per head)
//   out   = out_proj(gated_rmsnorm(y, z))               (norm(y * silu(z)) per group of heads)
// B and C are shared by the heads of a group. Tensor parallelism splits heads and groups: the
// in_proj pieces are column-parallel (each rank's rows are its z, x, B, C, dt), conv, scan and
// norm are per channel / head / group, out_proj is row-parallel (Megatron's Mamba layer).
// Packed documents restart the scan's state and the convolution's window. Context parallelism
// shards heads instead of tokens: one all-to-all after in_proj gives each cp rank whole sequences
// of 1/cp of this rank's heads and groups, which it convolves, scans and norms; another brings the
// gated outputs back to the rank's tokens for out_proj (as Megatron-Core's Mamba layer does).
#include <array>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "loom/config/run_config.h"
#include "loom/kernels/types.h"
#include "loom/model/buffers.h"
#include "loom/model/context_attention.h"
#include "loom/model/packing.h"
#include "loom/model/paged.h"
#include "loom/model/parallel_linear.h"
#include "loom/model/parameters.h"
#include "loom/model/tensor_parallel.h"

namespace loom::model {

class Mamba2Mixer {
 public:
  struct Saved {
    Buffer proj, conv, y, gated, rstd;  // context parallelism: all but gated of whole sequences
    std::vector<int32_t> documents;      // context parallelism: the whole sequences' document ids
    // A paged step's runs in another order (speculative decoding's verification rows): in_proj's
    // output and the scan's in that order, each row's slot, and the orders where kernels read them.
    Buffer run_proj, run_y;
    std::vector<int32_t> run_slots, run_inverse;
    StagedTokens staged_run_slots, staged_to_batch, staged_to_runs;
  };
  // Throws naming the layer when heads or groups cannot be split over the tensor-parallel group.
  Mamba2Mixer(ParameterStore& store, const TensorParallel& tp, int layer, const std::string& prefix,
              const config::ModelConfig& config, float init_std, float out_std);
  // residual[local rows] += mixer(normed), rows = batch * seq tokens; `residual_in` (null:
  // residual): residual = residual_in + mixer(normed) instead (RowParallelLinear::forward's).
  void forward(Saved& saved, float* residual, const float* normed, int64_t batch, int64_t seq,
               const Packing& packing, ParallelScratch& scratch, const float* residual_in = nullptr) const;
  // d_normed = d/d(normed) (written whole) given d_residual; parameter gradients into the store.
  void backward(float* d_normed, const float* d_residual, const float* normed, const Saved& saved,
                Workspace& work, int64_t batch, int64_t seq, const Packing& packing,
                ParallelScratch& scratch) const;
  // `rows` new tokens of one sequence, step by step from `cache` (zeroed by the first call).
  void decode(float* residual, const float* normed, int64_t rows, MambaCache& cache, Saved& scratch,
              ParallelScratch& tp_scratch) const;
  // A paged batch step (paged.h): each row steps the recurrence from its sequence's state slot
  // in `cache` (any tp: this rank's heads): a sequence's adjacent rows (a prompt's chunk) as one
  // run, the decoding rows of different sequences together (their slots as on_device.state_slots).
  void forward_paged(float* residual, const float* normed, const PagedBatch& batch, const PagedRows& on_device,
                     PagedLayerCache& cache, Saved& scratch, ParallelScratch& tp_scratch) const;
  // Floats of one sequence's convolution window and scan state on this rank.
  int64_t window_width() const { return conv_channels() * (kernel_ - 1); }
  int64_t state_width() const { return heads_ * head_dim_ * state_; }
  void set_precision(PrecisionContext& context, Recipe recipe, const std::string& prefix);
  // Context parallelism's group (context_attention.h); null: none. Its size must divide this
  // rank's heads and groups (config::check_hybrid_layout).
  void set_context(ContextAttention* context) { context_ = context; }

 private:
  // The heads one scan runs over: all of this rank's, or a context-parallel rank's 1/cp of them
  // (from first_head, first_group), with the parameters they read and add their gradients into.
  struct Heads {
    int64_t heads, groups, inner, gn, first_head, first_group;
    int64_t proj_width() const { return 2 * inner + 2 * gn + heads; }
    int64_t conv_channels() const { return inner + 2 * gn; }
  };
  // One scan's parameters (their values, or their gradients) where the kernels read them.
  struct HeadTensors {
    float *conv_weight, *conv_bias, *dt_bias, *a_log, *d, *norm;
  };
  struct HeadParams {
    HeadTensors value, grad;  // grad: null in forward
  };
  Heads all_heads() const { return {heads_, groups_, inner_, groups_ * state_, 0, 0}; }
  Heads context_heads() const;
  // The store's parameters of `h`; a context slice's convolution weights and biases (three row
  // ranges of x, B and C) as copies in conv_slice_ and their gradients in conv_slice_grad_.
  HeadParams head_params(const Heads& h, bool backward) const;
  void add_conv_slice_grads(const Heads& h) const;
  // A context slice's convolution channels are three row ranges of the full convolution's (its x,
  // B and C channels): `count` rows at `full` there, at `slice` in the slice's copy.
  struct ConvRows {
    int64_t full, slice, count;
  };
  std::array<ConvRows, 3> conv_slice_rows(const Heads& h) const;
  kernels::SsdShape scan_shape(const Heads& h, int64_t batch, int64_t seq) const;
  kernels::ConvShape conv_shape(const Heads& h, int64_t batch, int64_t seq) const;
  // Convolution, scan and gated norm of `proj` rows ([batch * seq, h.proj_width()]), and back.
  void scan_forward(const Heads& h, Saved& saved, float* gated, int64_t batch, int64_t seq,
                    const int32_t* documents) const;
  void scan_backward(const Heads& h, float* d_proj, const float* d_gated, const Saved& saved, Workspace& work,
                     int64_t batch, int64_t seq, const int32_t* documents) const;
  // The projection's columns the cp ranks split: z, x, B, C and dt.
  std::vector<HeadColumns> proj_segments() const;
  int64_t proj_width() const { return all_heads().proj_width(); }
  int64_t conv_channels() const { return all_heads().conv_channels(); }
  // Rows [first, first + count) advanced by one call of each step kernel: one sequence's next
  // `count` tokens from its window and state, or (slots) the next token of `count` sequences whose
  // windows and states are the pool's slots slots[0 .. count) (no slot twice).
  struct StepRun {
    int64_t first = 0, count = 0;
    float* window = nullptr;  // the sequence's; with slots, the pool's
    float* state = nullptr;
    const int32_t* slots = nullptr;  // where the kernels read them (device memory on a GPU)
    // With slots: pool slots (from, to) whose window and state are copied after the run (the
    // snapshots of speculative decoding's verification rows).
    std::vector<std::pair<int64_t, int64_t>> snapshots;
  };
  // The order the runs take a paged step's rows in: to_batch[i] is the batch row at run row i.
  // Every row outside verification first, in the batch's order (plain of them); then speculative
  // decoding's verification rows (a sequence's rows with snapshot slots and the row after them),
  // the j-th of every sequence together, group j ending at group_ends[j]. Identity without those.
  struct RunOrder {
    std::vector<int32_t> to_batch;
    int64_t plain = 0;
    std::vector<int64_t> group_ends;
  };
  static RunOrder run_order(const PagedBatch& batch, const std::vector<int64_t>& slot_of);
  std::vector<StepRun> plain_runs(const RunOrder& order, const std::vector<int64_t>& slot_of, int64_t slots,
                                  const int32_t* slots_in_order, PagedLayerCache& cache) const;
  // in_proj over the rows, the runs' convolutions and scans in order, gated norm and out_proj.
  // to_batch / to_runs (device; null: the batch's order): the runs' rows in another order, and back.
  void step_rows(float* residual, const float* normed, int64_t rows, std::span<const StepRun> runs, Saved& scratch,
                 ParallelScratch& tp_scratch, const int32_t* to_batch = nullptr,
                 const int32_t* to_runs = nullptr) const;

  ParameterStore* store_;
  Device device_;
  int64_t heads_, head_dim_, groups_, state_, kernel_, chunk_, inner_;  // this rank's heads / groups
  float eps_;
  int conv_weight_ = -1, conv_bias_ = -1, dt_bias_ = -1, a_log_ = -1, d_ = -1, norm_ = -1;
  std::optional<ColumnParallelLinear> in_;
  std::optional<RowParallelLinear> out_;
  ContextAttention* context_ = nullptr;
  // Context parallelism: the conv slice's parameters and gradients, and the whole sequences'
  // document ids where the kernels read them.
  mutable Buffer conv_slice_, conv_slice_grad_;
  mutable StagedTokens staged_documents_;
};

}  // namespace loom::model
