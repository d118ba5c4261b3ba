#pragma once
// The tensor-parallel group of a model and Megatron's conjugate operators around its parallel
// regions. A region starts at the input of column-parallel linears and ends at the output of
// row-parallel linears; between them each rank holds its own heads / ffn columns / vocabulary
// rows. Outside, every rank holds the full activations (tensor parallel) or its contiguous share
// of the rows (sequence parallel, rows = batch * seq flattened):
//
//   operator        forward                         backward
//   f (enter)       identity | all-gather rows      all-reduce | reduce-scatter rows
//   g (exit)        all-reduce | reduce-scatter     identity | all-gather rows
//
// With one rank every operator is free (no copies): modules write straight into their targets.
// The operators' scratch and sums live on the model's device (set_device): collectives take
// device buffers (comm/device_staging.h) and the sums run through kernels/ops.h.
//
// A column-parallel layer's backward starts its collectives and computes beside them (Megatron's
// overlap of tensor-parallel communication, parallel.overlap_tp_comm): under sequence parallelism
// the gather of its input for wgrad runs beside dgrad, and the sum of its input gradient (f
// backward) beside wgrad. Reordered only: the same collectives and products, so the same bits.
#include <cstdint>

#include "loom/comm/communicator.h"
#include "loom/model/buffers.h"
#include "loom/model/shard_spec.h"

namespace loom::model {

class LinearPrecision;

class TensorParallel {
 public:
  TensorParallel() = default;  // one rank
  // `overlap_communication`: the column-parallel backward's collectives run beside its GEMMs
  // (overlaps_communication); false waits for each where it is issued.
  TensorParallel(comm::Communicator* group, bool sequence_parallel, bool overlap_communication = true);

  int size() const { return group_ ? group_->size() : 1; }
  int rank() const { return group_ ? group_->rank() : 0; }
  bool single() const { return size() == 1; }
  bool sequence_parallel() const { return sequence_parallel_ && !single(); }
  comm::Communicator* group() const { return group_; }
  bool overlaps_communication() const { return overlap_communication_ && !single(); }
  // Seconds this rank's thread waited for the group's collectives since the last call (the
  // tensor-parallel communication its step did not hide: the trainer's tp_comm_wait_s). On a
  // device communicator that orders its waits in the stream (nccl) the host does not wait: ~0.
  double take_wait_seconds() const;
  // Where the activations the operators take live (the model's device; the cpu by default).
  void set_device(Device device) { device_ = device; }
  Device device() const { return device_; }

  // Rows this rank holds outside the parallel regions, of `rows` = batch * seq.
  int64_t local_rows(int64_t rows) const { return sequence_parallel() ? rows / size() : rows; }
  // Index of this rank's first row outside the regions.
  int64_t first_local_row(int64_t rows) const { return sequence_parallel() ? rank() * (rows / size()) : 0; }

  // f forward: the full [rows, width] input of the region from this rank's [local_rows, width];
  // `x` itself without sequence parallelism, else the rows gathered into `scratch`.
  const float* enter_forward(const float* x, int64_t rows, int64_t width, Buffer& scratch) const;
  // enter_forward on bf16 rows (2-byte elements), gathered as they are.
  const void* enter_forward_bf16(const void* x, int64_t rows, int64_t width, Buffer& scratch) const;
  // f backward: where the region's input gradient [rows, width] goes: `d_x` itself with one
  // rank, else `scratch`, zeroed when `zero` (the caller adds into it), else as it is (the caller
  // writes it whole).
  float* enter_backward_target(float* d_x, int64_t rows, int64_t width, Buffer& scratch, bool zero = true) const;
  // f backward: d_x[local rows] += sum over ranks of `target` (all-reduce / reduce-scatter), or
  // d_x[local rows] = that sum when not `accumulate`. `rounding`: `target` holds fp32 partial
  // products (GemmOutput::Partial); the sum is rounded to that recipe's output dtype before it is
  // added, as one rank's whole GEMM is.
  void enter_backward(float* d_x, float* target, int64_t rows, int64_t width, const LinearPrecision* rounding = nullptr,
                      bool accumulate = true) const;

  // A collective started for the caller to compute beside it: wait() returns its result, ready for
  // the calling thread's later work (in the stream on a device communicator), the seconds it
  // blocked added to the group's (take_wait_seconds); result() is where it lands.
  template <typename T>
  class Pending {
   public:
    Pending() = default;
    Pending(T* result, comm::WorkHandle work, double* waited)
        : result_(result), work_(std::move(work)), waited_(waited) {}
    T* wait() {
      if (work_ != nullptr) wait_for(*work_, waited_);
      work_ = nullptr;
      return result_;
    }
    T* result() const { return result_; }

   private:
    T* result_ = nullptr;
    comm::WorkHandle work_;
    double* waited_ = nullptr;
  };
  using PendingRows = Pending<const void>;  // gathered rows
  using PendingSum = Pending<float>;        // this rank's rows of a sum
  // enter_forward's gather started (x: `dtype` F32 or BF16 elements).
  PendingRows start_enter_forward(const void* x, DType dtype, int64_t rows, int64_t width, Buffer& scratch) const;
  // enter_backward in two halves: the sum over the group of `target` started, then finished into
  // d_x as enter_backward does (after the caller computed beside it). `target` stays untouched
  // until then.
  PendingSum start_enter_backward(float* target, int64_t rows, int64_t width) const;
  void finish_enter_backward(PendingSum& pending, float* d_x, int64_t rows, int64_t width,
                             const LinearPrecision* rounding = nullptr, bool accumulate = true) const;

  // g forward: where the region's partial output [rows, width] is accumulated: `out` itself with
  // one rank (the residual stream), else `scratch`, zeroed.
  float* exit_forward_target(float* out, int64_t rows, int64_t width, Buffer& scratch) const;
  // g forward: out[local rows] += sum over ranks of `partial` (+ bias, added once, when given).
  // `rounding`: as enter_backward; the bias is added before the sum is rounded.
  void exit_forward(float* out, float* partial, const float* bias, int64_t rows, int64_t width,
                    const LinearPrecision* rounding = nullptr) const;
  // g backward: the full [rows, width] gradient of the region's output from this rank's
  // [local_rows, width]: `d_out` itself without sequence parallelism, else gathered.
  const float* exit_backward(const float* d_out, int64_t rows, int64_t width, Buffer& scratch) const;

  // Placement of a parameter every rank holds whole (norms, row-parallel biases, positions):
  // under sequence parallelism each rank's gradient covers its rows only, so they are summed.
  ShardSpec replicated() const;
  // Placement of a parameter every rank holds whole whose gradient each rank computes from its
  // own share of the rows, with or without sequence parallelism (the MoE layer's router, latent
  // projections and replicated experts: each rank routes a share of the tokens): summed.
  ShardSpec replicated_partial() const;
  // Placement of this rank's [start, start + length) of dimension `dim` of `global`.
  ShardSpec split(Shape global, int dim, int64_t start, int64_t length) const;

  // Sums `data` over the group in place (identity with one rank).
  void all_reduce(float* data, int64_t count) const;
  void all_reduce_max(float* data, int64_t count) const;
  // out [rows, width] from every rank's columns [rows, its share of width] (vocabulary-parallel
  // logits; rank r holds columns [balanced_first(width, size, r), balanced_first(.., r + 1))).
  void gather_columns(float* out, const float* local, int64_t rows, int64_t width) const;
  // This rank's part of a group of `rows` rows: [first, first + rows) with first =
  // balanced_first(rows, size, rank); under sequence parallelism its own rows.
  struct RowPart {
    int64_t first = 0, rows = 0;
  };
  RowPart row_part(int64_t rows) const;
  // out [rows, width] from every rank's row_part [its part, width]: an all-gather.
  void gather_row_parts(float* out, const float* local, int64_t rows, int64_t width) const;

 private:
  // The sum over the group of `partial` [rows, width] started: this rank's local rows of it, in
  // place (all-reduce) or in reduce_scratch_ (reduce-scatter).
  PendingSum start_reduce_rows(float* partial, int64_t rows, int64_t width) const;
  // Waits for `work` (in the stream), adding the seconds the calling thread blocked to `waited`.
  static void wait_for(comm::Work& work, double* waited);

  comm::Communicator* group_ = nullptr;
  bool sequence_parallel_ = false;
  bool overlap_communication_ = true;
  Device device_;
  mutable Buffer reduce_scratch_, gather_scratch_;
  mutable double wait_seconds_ = 0.0;
};

// The largest of every tensor-parallel rank's `value` (a NaN propagates), e.g. an FP8 amax of a
// sharded operand that a per-tensor scale needs whole.
float max_over_tensor_parallel(comm::Communicator& tp, float value);
// The same in place on one float in device memory (fp8_current's amax on a GPU: no host read
// with a device communicator).
void max_over_tensor_parallel(comm::Communicator& tp, float* value);

}  // namespace loom::model
