#include "loom/model/tensor_parallel.h"

#include <chrono>
#include <vector>

#include "loom/core/device.h"
#include "loom/core/error.h"
#include "loom/kernels/ops.h"
#include "loom/model/linear_precision.h"

namespace loom::model {

TensorParallel::TensorParallel(comm::Communicator* group, bool sequence_parallel, bool overlap_communication)
    : group_(group), sequence_parallel_(sequence_parallel), overlap_communication_(overlap_communication) {}

const float* TensorParallel::enter_forward(const float* x, int64_t rows, int64_t width, Buffer& scratch) const {
  return static_cast<const float*>(start_enter_forward(x, DType::F32, rows, width, scratch).wait());
}

const void* TensorParallel::enter_forward_bf16(const void* x, int64_t rows, int64_t width, Buffer& scratch) const {
  return start_enter_forward(x, DType::BF16, rows, width, scratch).wait();
}

TensorParallel::PendingRows TensorParallel::start_enter_forward(const void* x, DType dtype, int64_t rows,
                                                                int64_t width, Buffer& scratch) const {
  if (!sequence_parallel()) return PendingRows(x, nullptr, nullptr);
  LOOM_CHECK(dtype == DType::F32 || dtype == DType::BF16, "TensorParallel: rows are gathered in fp32 or bf16");
  void* full = dtype == DType::F32 ? static_cast<void*>(sized(scratch, rows * width, device_))
                                   : sized_16bit(scratch, rows * width, device_);
  return PendingRows(full, group_->all_gather_async(x, full, local_rows(rows) * width, dtype), &wait_seconds_);
}

void TensorParallel::wait_for(comm::Work& work, double* waited) {
  const auto start = std::chrono::steady_clock::now();
  work.wait_in_stream();
  if (waited != nullptr) *waited += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double TensorParallel::take_wait_seconds() const {
  const double seconds = wait_seconds_;
  wait_seconds_ = 0.0;
  return seconds;
}

float* TensorParallel::enter_backward_target(float* d_x, int64_t rows, int64_t width, Buffer& scratch,
                                             bool zero) const {
  if (single()) return d_x;
  return zero ? zeroed(scratch, rows * width, device_) : sized(scratch, rows * width, device_);
}

void TensorParallel::enter_backward(float* d_x, float* target, int64_t rows, int64_t width,
                                    const LinearPrecision* rounding, bool accumulate) const {
  PendingSum pending = start_enter_backward(target, rows, width);
  finish_enter_backward(pending, d_x, rows, width, rounding, accumulate);
}

TensorParallel::PendingSum TensorParallel::start_enter_backward(float* target, int64_t rows, int64_t width) const {
  if (single()) return {};
  return start_reduce_rows(target, rows, width);
}

void TensorParallel::finish_enter_backward(PendingSum& pending, float* d_x, int64_t rows, int64_t width,
                                           const LinearPrecision* rounding, bool accumulate) const {
  if (single()) return;
  const int64_t n = local_rows(rows) * width;
  float* sum = pending.wait();
  if (rounding != nullptr) rounding->round_output(sum, n);
  if (accumulate) {
    kernels::add_in_place(device_, d_x, sum, n);
  } else {
    copy_on_device(device_, d_x, sum, n);
  }
}

float* TensorParallel::exit_forward_target(float* out, int64_t rows, int64_t width, Buffer& scratch) const {
  if (single()) return out;
  return zeroed(scratch, rows * width, device_);
}

void TensorParallel::exit_forward(float* out, float* partial, const float* bias, int64_t rows, int64_t width,
                                  const LinearPrecision* rounding) const {
  if (single()) return;  // the caller accumulated into `out` directly (with the bias)
  const int64_t local = local_rows(rows), n = local * width;
  float* sum = start_reduce_rows(partial, rows, width).wait();
  // The bias as one rank's forward adds it: rounded to the output's dtype (LinearPrecision::rounded_bias).
  if (bias != nullptr)
    kernels::add_bias(device_, sum, rounding != nullptr ? rounding->rounded_bias(bias, width) : bias, local, width);
  if (rounding != nullptr) rounding->round_output(sum, n);
  kernels::add_in_place(device_, out, sum, n);
}

TensorParallel::PendingSum TensorParallel::start_reduce_rows(float* partial, int64_t rows, int64_t width) const {
  const int64_t n = local_rows(rows) * width;
  if (!sequence_parallel()) {
    return PendingSum(partial, group_->all_reduce_async(partial, n, DType::F32, comm::ReduceOp::Sum), &wait_seconds_);
  }
  float* mine = sized(reduce_scratch_, n, device_);
  return PendingSum(mine, group_->reduce_scatter_async(partial, mine, n, DType::F32, comm::ReduceOp::Sum),
                    &wait_seconds_);
}

const float* TensorParallel::exit_backward(const float* d_out, int64_t rows, int64_t width, Buffer& scratch) const {
  return enter_forward(d_out, rows, width, scratch);  // both are "all-gather the rows, or nothing"
}

ShardSpec TensorParallel::replicated() const {
  ShardSpec spec;
  spec.grad_sync = sequence_parallel() ? TpGradSync::SumOverHolders : TpGradSync::None;
  spec.counts_in_norm = rank() == 0;
  return spec;
}

ShardSpec TensorParallel::replicated_partial() const {
  ShardSpec spec;
  spec.grad_sync = single() ? TpGradSync::None : TpGradSync::SumOverHolders;
  spec.counts_in_norm = rank() == 0;
  return spec;
}

ShardSpec TensorParallel::split(Shape global, int dim, int64_t start, int64_t length) const {
  ShardSpec spec;
  if (single()) return spec;
  spec.global_shape = std::move(global);
  spec.split_dim = dim;
  spec.start = start;
  spec.length = length;
  return spec;
}

void TensorParallel::all_reduce(float* data, int64_t count) const {
  if (!single()) wait_for(*group_->all_reduce_async(data, count, DType::F32, comm::ReduceOp::Sum), &wait_seconds_);
}

void TensorParallel::all_reduce_max(float* data, int64_t count) const {
  if (!single()) wait_for(*group_->all_reduce_async(data, count, DType::F32, comm::ReduceOp::Max), &wait_seconds_);
}

TensorParallel::RowPart TensorParallel::row_part(int64_t rows) const {
  const int64_t first = balanced_first(rows, size(), rank());
  return {first, balanced_first(rows, size(), rank() + 1) - first};
}

namespace {

// Elements of each rank's balanced part of `total` (balanced_first) times `per_unit`.
std::vector<int64_t> balanced_counts(int64_t total, int ranks, int64_t per_unit) {
  std::vector<int64_t> counts(ranks);
  for (int r = 0; r < ranks; ++r) {
    counts[r] = per_unit * (balanced_first(total, ranks, r + 1) - balanced_first(total, ranks, r));
  }
  return counts;
}

}  // namespace

void TensorParallel::gather_row_parts(float* out, const float* local, int64_t rows, int64_t width) const {
  // The parts back to back are the rows in order.
  wait_for(*group_->all_gather_v_async(local, out, balanced_counts(rows, size(), width), DType::F32), &wait_seconds_);
}

void TensorParallel::gather_columns(float* out, const float* local, int64_t rows, int64_t width) const {
  const int ranks = size();
  const std::vector<int64_t> counts = balanced_counts(width, ranks, rows);
  float* gathered = sized(gather_scratch_, rows * width, device_);
  wait_for(*group_->all_gather_v_async(local, gathered, counts, DType::F32), &wait_seconds_);
  // gathered holds each rank's [rows, its columns] back to back: interleave them into rows.
  const float* piece = gathered;
  for (int r = 0; r < ranks; ++r) {
    const int64_t first = balanced_first(width, ranks, r), cols = balanced_first(width, ranks, r + 1) - first;
    copy_rows(device_, out + first, width, piece, cols, rows, cols);
    piece += rows * cols;
  }
}

float max_over_tensor_parallel(comm::Communicator& tp, float value) {
  max_over_tensor_parallel(tp, &value);
  return value;
}

void max_over_tensor_parallel(comm::Communicator& tp, float* value) {
  if (tp.size() > 1) tp.all_reduce(value, 1, DType::F32, comm::ReduceOp::Max);
}

}  // namespace loom::model
