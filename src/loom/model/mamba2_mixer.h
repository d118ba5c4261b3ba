#pragma once
// Mamba-2 mixer (the SSD formulation, as Nemotron-H's NemotronHMamba2Mixer):
//   [z | x B C | dt] = in_proj(h)
//   x B C = silu(causal depthwise conv(x B C))           (conv_kernel taps)
//   y     = scan(x, softplus(dt + dt_bias), A = -exp(A_log), B, C) + D x   (chunked, per head)
//   out   = out_proj(gated_rmsnorm(y, z))               (norm(y * silu(z)) per group of heads)
// B and C are shared by the heads of a group. Tensor parallelism splits heads and groups: the
// in_proj pieces are column-parallel (each rank's rows are its z, x, B, C, dt), conv, scan and
// norm are per channel / head / group, out_proj is row-parallel (Megatron's Mamba layer).
// Packed documents restart the scan's state and the convolution's window.
#include <optional>
#include <span>
#include <string>

#include "loom/config/run_config.h"
#include "loom/kernels/types.h"
#include "loom/model/buffers.h"
#include "loom/model/packing.h"
#include "loom/model/paged.h"
#include "loom/model/parallel_linear.h"
#include "loom/model/parameters.h"
#include "loom/model/tensor_parallel.h"

namespace loom::model {

class Mamba2Mixer {
 public:
  struct Saved {
    Buffer proj, conv, y, gated, rstd;
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

 private:
  int64_t proj_width() const { return 2 * inner_ + 2 * groups_ * state_ + heads_; }
  int64_t conv_channels() const { return inner_ + 2 * groups_ * state_; }
  kernels::SsdShape scan_shape(int64_t batch, int64_t seq) const;
  kernels::ConvShape conv_shape(int64_t batch, int64_t seq) const;
  // Rows [first, first + count) advanced by one call of each step kernel: one sequence's next
  // `count` tokens from its window and state, or (slots) the next token of `count` sequences whose
  // windows and states are the pool's slots slots[0 .. count) (no slot twice).
  struct StepRun {
    int64_t first = 0, count = 0;
    float* window = nullptr;  // the sequence's; with slots, the pool's
    float* state = nullptr;
    const int32_t* slots = nullptr;  // where the kernels read them (device memory on a GPU)
  };
  // in_proj over the rows, the runs' convolutions and scans in order, gated norm and out_proj.
  void step_rows(float* residual, const float* normed, int64_t rows, std::span<const StepRun> runs, Saved& scratch,
                 ParallelScratch& tp_scratch) const;

  ParameterStore* store_;
  Device device_;
  int64_t heads_, head_dim_, groups_, state_, kernel_, chunk_, inner_;  // this rank's heads / groups
  float eps_;
  int conv_weight_ = -1, conv_bias_ = -1, dt_bias_ = -1, a_log_ = -1, d_ = -1, norm_ = -1;
  std::optional<ColumnParallelLinear> in_;
  std::optional<RowParallelLinear> out_;
};

}  // namespace loom::model
