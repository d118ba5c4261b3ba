#include "loom/model/multi_token_prediction.h"

#include <algorithm>

#include "loom/kernels/ops.h"
#include "loom/kernels/types.h"

namespace loom::model {

namespace {
std::string depth_prefix(int depth) { return "mtp.layers." + std::to_string(depth - 1); }

// A replicated weight whose gradient every rank computes whole (from all rows).
ShardSpec identical_copies(const TensorParallel& tp) {
  ShardSpec spec = tp.replicated();
  spec.grad_sync = TpGradSync::None;
  return spec;
}
}  // namespace

LayerSpec mtp_block_spec(const config::ModelConfig& config) {
  LayerSpec spec;
  spec.has_attention = true;
  spec.kv_heads = config.kv_heads == 0 ? config.heads : config.kv_heads;
  spec.ffn_size = config.ffn_size;
  spec.moe = config.moe.experts > 0;
  return spec;
}

int64_t MtpDepth::Saved::bytes() const {
  auto b = [](const Buffer& x) { return static_cast<int64_t>(x.size() * sizeof(float)); };
  auto n = [&](const Norm::Saved& x) { return b(x.out) + b(x.mean) + b(x.rstd); };
  return n(enorm) + n(hnorm) + n(final_norm) + b(embedded) + b(combined) + b(combined_all) + b(block_in) +
         b(block_out) + b(head_input) + b(logits) +
         static_cast<int64_t>((tokens.size() + targets.size()) * sizeof(int32_t));
}

MtpDepth::MtpDepth(ParameterStore& store, const TensorParallel& tp, int depth, const config::ModelConfig& config,
                   const kernels::RopeTable* rope, ExpertLayout experts)
    : tp_(&tp), store_(&store), d_model_(config.d_model),
      enorm_(store, depth_prefix(depth) + ".enorm", config.d_model, config.norm == config::Norm::Layer,
             static_cast<float>(config.norm_eps), tp.replicated()),
      hnorm_(store, depth_prefix(depth) + ".hnorm", config.d_model, config.norm == config::Norm::Layer,
             static_cast<float>(config.norm_eps), tp.replicated()),
      eh_proj_(store.add(depth_prefix(depth) + ".eh_proj.weight", {config.d_model, 2 * config.d_model}, Init::Normal,
                         static_cast<float>(config.init_std), identical_copies(tp))),
      block_(store, tp, config.layers + depth - 1, config, mtp_block_spec(config), rope, experts,
             depth_prefix(depth)),
      final_norm_(store, depth_prefix(depth) + ".final_layernorm", config.d_model, config.norm == config::Norm::Layer,
                  static_cast<float>(config.norm_eps), tp.replicated()) {}

void MtpDepth::shift(Saved& saved, int depth, const int32_t* inputs, const int32_t* targets, int64_t batch,
                     int64_t seq, const int32_t* documents) {
  const int64_t rows = batch * seq, k = depth;
  saved.tokens.assign(rows, 0);
  saved.targets.assign(rows, kernels::kIgnoreIndex);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t + k < seq; ++t) {
      const int64_t here = b * seq + t, ahead = here + k;
      saved.tokens[here] = inputs[ahead];
      if (documents == nullptr || documents[here] == documents[ahead]) saved.targets[here] = targets[ahead];
    }
  }
}

const float* MtpDepth::combine(Saved& saved, const float* h_prev, int64_t rows) const {
  const int64_t C = d_model_;
  const Device device = store_->device();
  enorm_.forward(saved.enorm, saved.embedded.data(), rows);
  hnorm_.forward(saved.hnorm, h_prev, rows);
  float* combined = sized(saved.combined, rows * 2 * C, device);
  copy_rows(device, combined, 2 * C, saved.enorm.out.data(), C, rows, C);
  copy_rows(device, combined + C, 2 * C, saved.hnorm.out.data(), C, rows, C);
  return combined;
}

void MtpDepth::forward(Saved& saved, Block::Saved& block_saved, const float* h_prev, int64_t batch, int64_t seq,
                       const Packing& packing, ParallelScratch& scratch) const {
  const int64_t C = d_model_, local = tp_->local_rows(batch * seq);
  const Device device = store_->device();
  const float* combined = combine(saved, h_prev, local);
  float* block_in = sized(saved.block_in, local * C, device);
  if (tp_->sequence_parallel()) {
    // All rows through one GEMM; this rank keeps its own.
    const int64_t rows = batch * seq, first = tp_->first_local_row(rows);
    const float* all = tp_->enter_forward(combined, rows, 2 * C, saved.combined_all);
    float* out = sized(out_all_, rows * C, device);
    kernels::linear_forward(device, out, all, store_->value(eh_proj_), nullptr, rows, 2 * C, C);
    copy_on_device(device, block_in, out + first * C, local * C);
  } else {
    kernels::linear_forward(device, block_in, combined, store_->value(eh_proj_), nullptr, local, 2 * C, C);
  }
  float* block_out = sized(saved.block_out, local * C, device);
  block_.forward(block_saved, block_in, block_out, batch, seq, packing, scratch);
  final_norm_.forward(saved.final_norm, block_out, local);
}

void MtpDepth::forward_paged(Saved& saved, const float* h_prev, const PagedBatch& batch, const PagedRows& on_device,
                             PagedLayerCache& cache, int64_t block_size, Block::Saved& block_scratch,
                             ParallelScratch& scratch) const {
  const int64_t C = d_model_, rows = batch.rows();
  const Device device = store_->device();
  float* x = sized(saved.block_in, rows * C, device);
  kernels::linear_forward(device, x, combine(saved, h_prev, rows), store_->value(eh_proj_), nullptr, rows, 2 * C, C);
  block_.forward_paged(x, batch, on_device, cache, block_size, block_scratch, scratch);
  final_norm_.forward(saved.final_norm, x, rows);
}

void MtpDepth::backward(const float* d_output, float* d_prev, float* d_embedded, const float* h_prev,
                        const Saved& saved, const Block::Saved& block_saved, Workspace& work, int64_t batch,
                        int64_t seq, const Packing& packing, ParallelScratch& scratch) const {
  const int64_t C = d_model_, local = tp_->local_rows(batch * seq);
  const Device device = store_->device();
  float* d_hidden = zeroed(d_block_, local * C, device);
  final_norm_.backward(d_hidden, d_output, saved.block_out.data(), saved.final_norm, local);
  // d_hidden becomes d(loss)/d(block_in).
  ResidualGradForReader nothing_for_reader;  // d_hidden comes from the depth's final norm alone
  block_.backward(d_hidden, nothing_for_reader, saved.block_in.data(), block_saved, work, batch, seq, packing, scratch);
  float* d_combined = zeroed(d_combined_, local * 2 * C, device);
  const float* weight = store_->value(eh_proj_);
  if (tp_->sequence_parallel()) {
    // The weight's gradient over all rows (every rank the same); the input's for this rank's.
    const float* d_all = tp_->exit_backward(d_hidden, batch * seq, C, d_out_all_);
    kernels::linear_backward(store_->device(), nullptr, store_->grad(eh_proj_), nullptr, d_all,
                             saved.combined_all.data(), weight, batch * seq, 2 * C, C);
    kernels::linear_backward(store_->device(), d_combined, nullptr, nullptr, d_hidden, saved.combined.data(), weight,
                             local, 2 * C, C);
  } else {
    kernels::linear_backward(store_->device(), d_combined, store_->grad(eh_proj_), nullptr, d_hidden,
                             saved.combined.data(), weight, local, 2 * C, C);
  }
  // The two halves of each row, each contiguous for its norm's backward.
  float* d_half = sized(d_half_, local * C, device);
  copy_rows(device, d_half, C, d_combined, 2 * C, local, C);
  allocator(device).zero(d_embedded, static_cast<size_t>(local * C) * sizeof(float));
  enorm_.backward(d_embedded, d_half, saved.embedded.data(), saved.enorm, local);
  copy_rows(device, d_half, C, d_combined + C, 2 * C, local, C);
  hnorm_.backward(d_prev, d_half, h_prev, saved.hnorm, local);
}

}  // namespace loom::model
