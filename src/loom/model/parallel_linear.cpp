#include "loom/model/parallel_linear.h"

#include "loom/kernels/cpu/linear.h"

namespace loom::model {

namespace k = loom::kernels::cpu;

namespace {
// The fp32 kernels, or the layer's precision recipe when it has one.
void linear_forward(LinearPrecision* precision, float* out, const float* in, const float* weight, const float* bias,
                    int64_t n, int64_t in_features, int64_t out_features, bool accumulate = false) {
  if (precision != nullptr) {
    precision->forward(out, in, weight, bias, n, in_features, out_features, accumulate);
  } else {
    k::linear_forward(out, in, weight, bias, n, in_features, out_features, accumulate);
  }
}
void linear_backward(LinearPrecision* precision, float* din, float* dweight, float* dbias, const float* dout,
                     const float* in, const float* weight, int64_t n, int64_t in_features, int64_t out_features) {
  if (precision != nullptr) {
    precision->backward(din, dweight, dbias, dout, in, weight, n, in_features, out_features);
  } else {
    k::linear_backward(din, dweight, dbias, dout, in, weight, n, in_features, out_features);
  }
}
}  // namespace

ColumnParallelLinear::ColumnParallelLinear(ParameterStore& store, const TensorParallel& tp, int weight, int bias,
                                           int64_t in_features, int64_t out_local)
    : store_(&store), tp_(&tp), weight_(weight), bias_(bias), in_(in_features), out_(out_local) {}

void ColumnParallelLinear::forward(float* out, const float* x, int64_t rows, ParallelScratch& scratch) const {
  const float* full = tp_->enter_forward(x, rows, in_, scratch.gathered);
  linear_forward(precision_.get(), out, full, store_->value(weight_), bias_ >= 0 ? store_->value(bias_) : nullptr,
                 rows, in_, out_);
}

void ColumnParallelLinear::backward(float* d_x, const float* d_out, const float* x, int64_t rows,
                                    ParallelScratch& scratch) const {
  // Sequence parallel: the full input is gathered again rather than kept from forward.
  const float* full = tp_->enter_forward(x, rows, in_, scratch.gathered);
  float* d_full = tp_->enter_backward_target(d_x, rows, in_, scratch.d_full);
  linear_backward(precision_.get(), d_full, store_->grad(weight_), bias_ >= 0 ? store_->grad(bias_) : nullptr, d_out,
                  full, store_->value(weight_), rows, in_, out_);
  tp_->enter_backward(d_x, d_full, rows, in_);
}

RowParallelLinear::RowParallelLinear(ParameterStore& store, const TensorParallel& tp, int weight, int bias,
                                     int64_t in_local, int64_t out_features)
    : store_(&store), tp_(&tp), weight_(weight), bias_(bias), in_(in_local), out_(out_features) {}

void RowParallelLinear::forward(float* out, const float* x, int64_t rows, ParallelScratch& scratch) const {
  const float* bias = bias_ >= 0 ? store_->value(bias_) : nullptr;
  if (tp_->single()) {  // no reduction: accumulate straight into the residual stream
    linear_forward(precision_.get(), out, x, store_->value(weight_), bias, rows, in_, out_, true);
    return;
  }
  float* partial = tp_->exit_forward_target(out, rows, out_, scratch.partial);
  linear_forward(precision_.get(), partial, x, store_->value(weight_), nullptr, rows, in_, out_, true);
  tp_->exit_forward(out, partial, bias, rows, out_);
}

void RowParallelLinear::backward(float* d_x, const float* d_out, const float* x, int64_t rows,
                                 ParallelScratch& scratch) const {
  const float* d_full = tp_->exit_backward(d_out, rows, out_, scratch.gathered);
  linear_backward(precision_.get(), d_x, store_->grad(weight_), nullptr, d_full, x, store_->value(weight_), rows, in_,
                  out_);
  // The bias was added after g, to this rank's rows: its gradient is over those rows (a partial
  // sum under sequence parallelism, completed by the model's gradient sync).
  if (bias_ >= 0) {
    k::linear_backward(nullptr, nullptr, store_->grad(bias_), d_out, nullptr, nullptr, tp_->local_rows(rows), 0,
                       out_);
  }
}

}  // namespace loom::model
