#include "loom/model/attention.h"

#include <algorithm>

#include "loom/core/error.h"
#include "loom/kernels/ops.h"

namespace loom::model {

Attention::Attention(ParameterStore& store, const TensorParallel& tp, int layer, const std::string& prefix, int d_model,
                     int heads, int kv_heads, bool qkv_bias, bool out_bias, const kernels::RopeTable* rope, float init_std, float out_std)
    : store_(&store), tp_(&tp), d_model_(d_model), head_dim_(d_model / heads), rope_(rope) {
  const int ranks = tp.size(), rank = tp.rank(), hd = head_dim_;
  const std::string where = "layer " + std::to_string(layer) + " (" + prefix + ")";
  LOOM_CHECK(heads % ranks == 0, where + ": " + std::to_string(heads) + " attention heads cannot be split over " +
                                std::to_string(ranks) + " tensor-parallel ranks (parallel.tp must divide heads)");
  LOOM_CHECK(kv_heads % ranks == 0 || ranks % kv_heads == 0,
        where + ": " + std::to_string(kv_heads) + " kv heads and parallel.tp = " + std::to_string(ranks) +
            ": one must divide the other (kv heads split over ranks, or each replicated on tp / kv_heads ranks)");
  heads_ = heads / ranks;
  // kv heads: split when there are enough, else the one this rank's query heads read, replicated.
  const int replicas = kv_heads >= ranks ? 1 : ranks / kv_heads;
  kv_heads_ = kv_heads >= ranks ? kv_heads / ranks : 1;
  const int first_kv = kv_heads >= ranks ? rank * kv_heads_ : rank / replicas;
  kv_replicas_ = replicas;
  kv_heads_total_ = kv_heads;
  first_kv_ = first_kv;
  auto kv_spec = [&](Shape global, int dim) {
    ShardSpec spec = tp.split(std::move(global), dim, static_cast<int64_t>(first_kv) * hd,
                              static_cast<int64_t>(kv_heads_) * hd);
    if (replicas > 1) {
      spec.grad_sync = TpGradSync::SumOverHolders;  // each holder saw only its query heads
      spec.counts_in_norm = rank % replicas == 0;
    }
    return spec;
  };
  const int64_t q_start = static_cast<int64_t>(rank) * heads_ * hd, q_len = static_cast<int64_t>(heads_) * hd;
  const int64_t kv_len = static_cast<int64_t>(kv_heads_) * hd;
  // Registered back to back so [q; k; v] is one [(heads + 2 kv_heads) * head_dim, d_model] matrix.
  qkv_weight_ = store.add(prefix + ".q_proj.weight", {q_len, d_model}, Init::Normal, init_std,
                          tp.split({static_cast<int64_t>(heads) * hd, d_model}, 0, q_start, q_len));
  store.add(prefix + ".k_proj.weight", {kv_len, d_model}, Init::Normal, init_std,
            kv_spec({static_cast<int64_t>(kv_heads) * hd, d_model}, 0));
  store.add(prefix + ".v_proj.weight", {kv_len, d_model}, Init::Normal, init_std,
            kv_spec({static_cast<int64_t>(kv_heads) * hd, d_model}, 0));
  if (qkv_bias) {
    qkv_bias_ = store.add(prefix + ".q_proj.bias", {q_len}, Init::Zeros, 0.0f,
                          tp.split({static_cast<int64_t>(heads) * hd}, 0, q_start, q_len));
    store.add(prefix + ".k_proj.bias", {kv_len}, Init::Zeros, 0.0f, kv_spec({static_cast<int64_t>(kv_heads) * hd}, 0));
    store.add(prefix + ".v_proj.bias", {kv_len}, Init::Zeros, 0.0f, kv_spec({static_cast<int64_t>(kv_heads) * hd}, 0));
  }
  out_weight_ = store.add(prefix + ".o_proj.weight", {d_model, q_len}, Init::Normal, out_std,
                          tp.split({d_model, static_cast<int64_t>(heads) * hd}, 1, q_start, q_len));
  if (out_bias) out_bias_ = store.add(prefix + ".o_proj.bias", {d_model}, Init::Zeros, 0.0f, tp.replicated());
  qkv_.emplace(store, tp, qkv_weight_, qkv_bias_, d_model, qkv_width());
  out_.emplace(store, tp, out_weight_, out_bias_, q_len, d_model);
}

void Attention::set_precision(PrecisionContext& context, Recipe recipe, const std::string& prefix) {
  qkv_->set_precision(context.make(recipe, prefix + ".qkv_proj"));
  out_->set_precision(context.make(recipe, prefix + ".o_proj"));
}

kernels::FlashAttentionShape Attention::flash_shape(int64_t batch, int64_t seq) const {
  const int64_t W = qkv_width();
  return {batch, seq, seq, heads_, kv_heads_, head_dim_, W, W, W, static_cast<int64_t>(heads_) * head_dim_, operands_};
}

namespace {
// Causality by the index in the row; documents as packed.
kernels::AttentionVisibility visibility(const Packing& packing) {
  return {nullptr, nullptr, packing.documents, packing.documents};
}
}  // namespace

bool Attention::bf16_tensors() const {
  const LinearPrecision *qkv = qkv_->precision(), *out = out_->precision();
  return context_ == nullptr && operands_ == kernels::AttentionOperands::Bf16 && qkv != nullptr && out != nullptr &&
         qkv->gives_bf16_outputs() && out->accepts_bf16_input() && out->gives_bf16_outputs();
}

bool Attention::bf16_gradients() const {
  return bf16_tensors() && qkv_->takes_bf16_input() && (rope_ == nullptr || !qkv_->has_bias()) &&
         !sums_replicated_kv_grads();
}

bool Attention::sums_replicated_kv_grads() const { return kv_replicas_ > 1 && qkv_->precision() != nullptr; }

void Attention::sum_replicated_kv_grads(float* d_qkv, int64_t rows, ParallelScratch& scratch) const {
  const Device device = store_->device();
  const int64_t W = qkv_width(), q_width = static_cast<int64_t>(heads_) * head_dim_;
  const int64_t kv_width = 2 * static_cast<int64_t>(kv_heads_) * head_dim_;  // this rank's [k v] columns
  const int64_t all_kv = static_cast<int64_t>(kv_heads_total_) * 2 * head_dim_;
  // Each rank's partial [k v] gradient at its kv head's place in [rows, every kv head's k v] (zeros
  // elsewhere): the sum over the group holds each kv head's sum over its holders, in fp32.
  float* sum = zeroed(scratch.replicated_kv, rows * all_kv, device);
  float* slot = sum + static_cast<int64_t>(first_kv_) * kv_width;
  copy_rows(device, slot, all_kv, d_qkv + q_width, W, rows, kv_width);
  tp_->all_reduce(sum, rows * all_kv);
  // The first holder takes the whole gradient, the others zeros: each kv head enters the q/k/v
  // projection's backward once over the group, as on one rank.
  if (tp_->rank() % kv_replicas_ != 0) zero_on_device(device, sum, rows * all_kv);
  copy_rows(device, d_qkv + q_width, W, slot, all_kv, rows, kv_width);
}

void Attention::forward(Saved& saved, float* residual, const NormedRows& normed, int64_t batch, int64_t seq,
                        const Packing& packing, ParallelScratch& scratch, const float* residual_in,
                        void* out16) const {
  LOOM_CHECK(out16 == nullptr || gives_bf16_output(),
             "Attention::forward: a bf16 output is for bf16 tensors under the bf16 recipe on one rank");
  const int64_t rows = batch * seq, W = qkv_width(), att_width = heads_ * head_dim_;
  const int64_t k_off = att_width, v_off = att_width + static_cast<int64_t>(kv_heads_) * head_dim_;
  if (bf16_tensors()) {
    auto* qkv16 = static_cast<uint16_t*>(sized_16bit(saved.qkv, rows * W, store_->device()));
    DeviceTensors tensors = normed.forward_tensors(qkv_->keep_input_codes(saved.qkv_codes, rows));
    tensors.out = qkv16;
    qkv_->forward(nullptr, normed.fp32, rows, scratch, tensors);
    rotate(qkv16, batch, seq, Rotation::ForwardBf16, packing.positions);
    void* att16 = sized_16bit(saved.att, rows * att_width, store_->device());
    float* lse = sized(saved.lse, batch * heads_ * seq, store_->device());
    kernels::flash_attention_forward_bf16_tensors(store_->device(), att16, lse, qkv16, qkv16 + k_off, qkv16 + v_off,
                                                  flash_shape(batch, seq), visibility(packing));
    out_->forward(residual, nullptr, rows, scratch,
                  DeviceTensors{
                      .in = att16, .out = out16, .keep_input_codes = out_->keep_input_codes(saved.out_codes, rows)},
                  out16 != nullptr ? nullptr : residual_in);
    return;
  }
  float* qkv = sized(saved.qkv, rows * W, store_->device());
  qkv_->forward(qkv, normed.fp32, rows, scratch,
                normed.forward_tensors(qkv_->keep_input_codes(saved.qkv_codes, rows)));
  rotate(qkv, batch, seq, Rotation::Forward, packing.positions);
  float* att = sized(saved.att, rows * att_width, store_->device());
  if (context_ != nullptr) {
    context_->forward(att, saved.context, qkv, {batch, seq, heads_, kv_heads_, head_dim_, operands_}, packing);
  } else {
    float* lse = sized(saved.lse, batch * heads_ * seq, store_->device());
    kernels::flash_attention_forward(store_->device(), att, lse, qkv, qkv + k_off, qkv + v_off, flash_shape(batch, seq),
                                     visibility(packing));
  }
  out_->forward(residual, att, rows, scratch,
                DeviceTensors{.keep_input_codes = out_->keep_input_codes(saved.out_codes, rows)}, residual_in);
}

void Attention::backward(float* d_normed, const float* d_residual, const NormedRows& normed, const Saved& saved,
                         Workspace& work, int64_t batch, int64_t seq, const Packing& packing,
                         ParallelScratch& scratch, void* d_normed16, const void* d_residual16,
                         const float* d_residual_amax) const {
  LOOM_CHECK(d_residual16 == nullptr || takes_bf16_residual_grad(),
             "Attention::backward: a bf16 residual gradient is for bf16 tensors' output projection");
  LOOM_CHECK(d_residual_amax == nullptr || takes_residual_grad_amax(),
             "Attention::backward: a residual gradient's amax taken by its producer is for fp8_current's output "
             "projection");
  const int64_t rows = batch * seq, W = qkv_width(), att_width = heads_ * head_dim_;
  const int64_t k_off = att_width, v_off = att_width + static_cast<int64_t>(kv_heads_) * head_dim_;
  // Under the bf16 recipe the q/k/v gradient is written whole in bf16, with the bf16 tensors (per-tensor
  // FP8) whole in fp32, RoPE undone by the same entry: neither needs zeroing.
  float* d_qkv = bf16_gradients()  ? nullptr
                 : bf16_tensors() ? sized(work.d_qkv, rows * W, store_->device())
                                  : zeroed(work.d_qkv, rows * W, store_->device());
  float* d_qkv_amax = nullptr;
  if (bf16_tensors()) {
    void* d_att16 = sized_16bit(work.d_att, rows * att_width, store_->device());
    out_->backward(nullptr, d_residual, nullptr, rows, scratch, false,
                   DeviceTensors{.in = saved.att.data(),
                                 .dout = d_residual16,
                                 .din = d_att16,
                                 .kept_input_codes = out_->kept_input_codes(saved.out_codes),
                                 .dout_amax = d_residual_amax});
    const auto* qkv16 = reinterpret_cast<const uint16_t*>(saved.qkv.data());
    if (d_qkv == nullptr) {
      // RoPE undone on the q and k gradients before they are rounded, or the bias's gradient (which
      // the projection leaves to the caller of a bf16 output gradient) summed from the fp32 values,
      // by the same entry.
      auto* d_qkv16 = static_cast<uint16_t*>(sized_16bit(work.d_qkv, rows * W, store_->device()));
      float* dbias = qkv_->bias_grad();
      const kernels::QkvRotation rotation{rope_, seq, packing.positions};
      kernels::flash_attention_backward_bf16_gradients(
          store_->device(), d_qkv16, d_qkv16 + k_off, d_qkv16 + v_off, dbias,
          dbias != nullptr ? dbias + k_off : nullptr, dbias != nullptr ? dbias + v_off : nullptr, d_att16,
          saved.att.data(), saved.lse.data(), qkv16, qkv16 + k_off, qkv16 + v_off, flash_shape(batch, seq),
          visibility(packing), rotation);
      qkv_->backward(d_normed, nullptr, normed.fp32, rows, scratch, false,
                     DeviceTensors{.in = normed.bf16, .dout = d_qkv16, .din = d_normed16});
      return;
    }
    // fp8_current: the q/k/v gradient's amax taken as it is written, for the projection's cast
    // (not of replicated kv heads' partial gradients: the cast takes the sum's).
    d_qkv_amax = qkv_->takes_output_grad_amax() && !sums_replicated_kv_grads() ? qkv_->output_grad_amax() : nullptr;
    kernels::flash_attention_backward_fp32_gradients(
        store_->device(), d_qkv, d_qkv + k_off, d_qkv + v_off, d_att16, saved.att.data(), saved.lse.data(), qkv16,
        qkv16 + k_off, qkv16 + v_off, flash_shape(batch, seq), visibility(packing),
        kernels::QkvRotation{rope_, seq, packing.positions}, d_qkv_amax);
  } else {
    const float* qkv = saved.qkv.data();
    float* d_att = sized(work.d_att, rows * att_width, store_->device());
    out_->backward(d_att, d_residual, saved.att.data(), rows, scratch, false,
                   DeviceTensors{.kept_input_codes = out_->kept_input_codes(saved.out_codes),
                                 .dout_amax = d_residual_amax});
    if (context_ != nullptr) {
      context_->backward(d_qkv, d_att, qkv, saved.att.data(), saved.context,
                         {batch, seq, heads_, kv_heads_, head_dim_, operands_}, packing);
    } else {
      kernels::flash_attention_backward(store_->device(), d_qkv, d_qkv + k_off, d_qkv + v_off, d_att,
                                        saved.att.data(), saved.lse.data(), qkv, qkv + k_off, qkv + v_off,
                                        flash_shape(batch, seq), visibility(packing));
    }
    rotate(d_qkv, batch, seq, Rotation::Backward, packing.positions);
  }
  if (sums_replicated_kv_grads()) sum_replicated_kv_grads(d_qkv, rows, scratch);
  qkv_->backward(d_normed, d_qkv, normed.fp32, rows, scratch, false,
                 DeviceTensors{.in = normed.bf16,
                               .din = d_normed16,
                               .kept_input_codes = qkv_->kept_input_codes(saved.qkv_codes),
                               .dout_amax = d_qkv_amax});
}

void Attention::rotate(void* qkv, int64_t batch, int64_t seq, Rotation how, const int32_t* positions) const {
  if (rope_ == nullptr) return;
  const Device device = store_->device();
  const int64_t W = qkv_width(), heads = heads_ + kv_heads_;
  // Rows [first, first + rows) of qkv.
  auto apply = [&](int64_t first, int64_t rows, int64_t period, int64_t start, const int32_t* at) {
    switch (how) {
      case Rotation::Forward:
        return kernels::rope_forward(device, static_cast<float*>(qkv) + first * W, rows, W, 0, heads, period, start,
                                     *rope_, at);
      case Rotation::Backward:
        return kernels::rope_backward(device, static_cast<float*>(qkv) + first * W, rows, W, 0, heads, period, start,
                                      *rope_, at);
      case Rotation::ForwardBf16:
        return kernels::rope_forward_bf16(device, static_cast<uint16_t*>(qkv) + first * W, rows, W, 0, heads, period,
                                          start, *rope_, at);
    }
  };
  // Packed positions travel with the tokens (cut to this rank's chunks with them).
  if (context_ == nullptr || positions != nullptr) return apply(0, batch * seq, seq, 0, positions);
  // Each half of a rank's sequence is one contiguous chunk of the global sequence.
  const int64_t chunk = seq / 2;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t half = 0; half < 2; ++half) {
      const int64_t first = half * chunk;
      apply(b * seq + first, chunk, chunk,
            context_position(context_->size(), context_->rank(), seq, first), nullptr);
    }
  }
}

void Attention::decode(float* residual, const float* normed, int64_t rows, int64_t past, KVCache& cache,
                       Saved& scratch, ParallelScratch& tp_scratch, int64_t max_positions) const {
  LOOM_CHECK(tp_->single(), "generation runs on one rank (parallel.tp = 1)");
  const Device device = store_->device();
  const int64_t W = qkv_width(), kv_width = kv_heads_ * head_dim_, att_width = heads_ * head_dim_;
  float* qkv = sized(scratch.qkv, rows * W, device);
  qkv_->forward(qkv, normed, rows, tp_scratch);
  if (rope_ != nullptr)
    kernels::rope_forward(store_->device(), qkv, rows, W, 0, heads_ + kv_heads_, rows, past, *rope_);
  float* keys = sized(cache.keys, max_positions * kv_width, device);
  float* values = sized(cache.values, max_positions * kv_width, device);
  copy_rows(device, keys + past * kv_width, kv_width, qkv + att_width, W, rows, kv_width);
  copy_rows(device, values + past * kv_width, kv_width, qkv + att_width + kv_width, W, rows, kv_width);
  float* att = sized(scratch.att, rows * att_width, device);
  kernels::attention_decode(store_->device(), att, qkv, W, keys, values, past, rows, heads_, kv_heads_, head_dim_);
  out_->forward(residual, att, rows, tp_scratch);
}

void Attention::forward_paged(float* residual, const float* normed, const PagedBatch& batch, const PagedRows& on_device,
                              PagedLayerCache& cache, int64_t block_size, Saved& scratch,
                              ParallelScratch& tp_scratch) const {
  const int64_t rows = batch.rows(), W = qkv_width(), kv_width = local_kv_width(), att_width = heads_ * head_dim_;
  const Device device = store_->device();
  float* qkv = sized(scratch.qkv, rows * W, device);
  qkv_->forward(qkv, normed, rows, tp_scratch);
  if (rope_ != nullptr)
    kernels::rope_forward(device, qkv, rows, W, 0, heads_ + kv_heads_, rows, 0, *rope_, on_device.positions);
  const kernels::PagedAttentionShape shape{heads_, kv_heads_, head_dim_, block_size, batch.table_width, cache.kv_dtype};
  kernels::paged_cache_write(device, cache.keys.data(), cache.values.data(), qkv + att_width, qkv + att_width + kv_width,
                             W, on_device.block_tables, on_device.sequences, on_device.positions, rows, shape);
  float* att = sized(scratch.att, rows * att_width, device);
  // Prompt rows on tensor cores where the device has them for this cache (ops.h), the rest here.
  const bool tiled =
      on_device.prompt_tile_count > 0 && kernels::paged_prompt_attention_on_tensor_cores(device, shape, W);
  const int64_t exact_rows = tiled ? on_device.decoding_rows : rows;
  if (exact_rows > 0) {
    kernels::paged_attention(device, att, qkv, W, cache.keys.data(), cache.values.data(), on_device.block_tables,
                             on_device.sequences, on_device.positions, exact_rows, shape);
  }
  if (tiled) {
    kernels::paged_prompt_attention(device, att, qkv, W, cache.keys.data(), cache.values.data(),
                                    on_device.block_tables, on_device.sequences, on_device.positions,
                                    on_device.prompt_tiles, on_device.prompt_tile_count, on_device.prompt_reach,
                                    shape);
  }
  out_->forward(residual, att, rows, tp_scratch);
}

}  // namespace loom::model
