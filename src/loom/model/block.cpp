#include "loom/model/block.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "loom/core/error.h"

namespace loom::model {

Block::Block(ParameterStore& store, const TensorParallel& tp, int layer, const config::ModelConfig& config,
             const LayerSpec& spec, const kernels::RopeTable* rope, ExpertLayout experts,
             const std::string& name)
    : tp_(&tp), d_model_(config.d_model), device_(store.device()) {
  const std::string prefix = prefix_ = name.empty() ? "model.layers." + std::to_string(layer) : name;
  const bool layer_norm = config.norm == config::Norm::Layer;
  const float eps = static_cast<float>(config.norm_eps);
  const float std = static_cast<float>(config.init_std);
  // Residual-branch outputs start smaller so the stream's variance does not grow with depth (GPT-2).
  const float out_std = std / std::sqrt(2.0f * static_cast<float>(config.layers));
  if (spec.has_attention) {
    norm1_.emplace(store, prefix + ".input_layernorm", config.d_model, layer_norm, eps, tp.replicated());
    attention_.emplace(store, tp, layer, prefix + ".self_attn", config.d_model, config.heads, spec.kv_heads,
                       config.bias || config.qkv_bias, config.bias, rope, std, out_std);
  }
  if (spec.has_mamba) {
    norm1_.emplace(store, prefix + ".input_layernorm", config.d_model, layer_norm, eps, tp.replicated());
    mamba_.emplace(store, tp, layer, prefix + ".mixer", config, std, out_std);
  }
  if (spec.has_mlp()) {
    norm2_.emplace(store, prefix + ".post_attention_layernorm", config.d_model, layer_norm, eps, tp.replicated());
  }
  if (spec.moe) {
    moe_.emplace(store, tp, experts, layer, prefix + ".mlp", config, spec.ffn_size, std, out_std);
  } else if (spec.has_mlp()) {
    mlp_.emplace(store, tp, layer, prefix + ".mlp", config.d_model, spec.ffn_size, config.activation, config.bias,
                 std, out_std);
  }
}

void Block::set_precision(PrecisionContext& context, Recipe recipe) {
  if (attention_) attention_->set_precision(context, recipe, prefix_ + ".self_attn");
  if (mlp_) mlp_->set_precision(context, recipe, prefix_ + ".mlp");
  if (mamba_) mamba_->set_precision(context, recipe, prefix_ + ".mixer");
  if (moe_) moe_->set_precision(context, recipe, prefix_ + ".mlp");
}

namespace {
// Whether the norm before a sub-block (Attention or Mlp) writes bf16 rows for it (normed_input):
// the norm that can also add a product into the stream as it reads it (Norm::forward_added).
template <typename SubBlock>
bool norm_writes_bf16(const SubBlock& sub) {
  return sub.takes_bf16_input() && !sub.takes_input_codes();
}

// The norm before a sub-block (Attention or Mlp) in the form its first projection takes: FP8
// codes the norm writes itself where it takes them (the statistics, under fp8_current the
// outputs' amax, then the codes, the transposed ones kept by the sub-block for its weight
// gradient), else bf16 or fp32 rows.
template <typename SubBlock>
NormedRows normed_input(const Norm& norm, Norm::Saved& saved, const float* x, int64_t rows, const SubBlock& sub,
                        typename SubBlock::Saved& sub_saved) {
  if (!sub.takes_input_codes()) {
    norm.forward(saved, x, rows, sub.takes_bf16_input());
    return Norm::output(saved);
  }
  norm.statistics(saved, x, rows, sub.input_amax());
  const LinearPrecision::ProducedCodes codes = sub.input_codes(sub_saved, rows);
  norm.forward_codes(saved, x, rows, codes.cast, codes.codes, codes.transposed);
  return NormedRows::in_codes(codes.codes);
}
}  // namespace

bool Block::leaves_product() const { return attention_ && mlp_ && mlp_->gives_bf16_output(); }

bool Block::adds_product_in() const { return attention_ && norm_writes_bf16(*attention_); }

void Block::forward(Saved& saved, const float* x_in, float* x_out, int64_t batch, int64_t seq,
                    const Packing& packing, ParallelScratch& scratch, const ResidualLink& link) const {
  // Norms and residual adds run on this rank's rows; the sub-blocks see all rows inside.
  const int64_t rows = batch * seq, local = tp_->local_rows(rows), n = local * d_model_;
  LOOM_CHECK(link.residual == nullptr || (adds_product_in() && link.sum == x_in),
             "Block::forward: a residual add left by the block before is for a first norm writing bf16, into x_in");
  LOOM_CHECK(!link.leave_product || leaves_product(), "Block::forward: no product to leave for the next block");
  // Each residual add writes the stream's next tensor from its input (residual_in), so no copy
  // of the input comes first where the projection's own add can read it.
  const float* mid = x_in;
  // Where the MLP's norm writes bf16 for it, attention's product is left in bf16 and that norm adds
  // it into the stream as it reads it (Norm::forward_added: the same values, one read fewer).
  const bool add_in_norm2 = attention_ && mlp_ && attention_->gives_bf16_output() && norm_writes_bf16(*mlp_);
  if (attention_) {
    if (link.residual != nullptr) norm1_->forward_added(saved.norm1, link.sum, link.residual, link.product16, local);
    const NormedRows normed = link.residual != nullptr
                                  ? Norm::output(saved.norm1)
                                  : normed_input(*norm1_, saved.norm1, x_in, local, *attention_, saved.attention);
    float* m = sized(saved.mid, n, device_);
    if (add_in_norm2) {
      void* product16 = sized_16bit(scratch.product16, n, device_);
      attention_->forward(saved.attention, nullptr, normed, batch, seq, packing, scratch, nullptr, product16);
      norm2_->forward_added(saved.norm2, m, x_in, product16, local);
      // The MLP's product: into x_out, or left in bf16 for the next block's first norm to add.
      void* left = link.leave_product ? product16 : nullptr;
      mlp_->forward(saved.mlp, left != nullptr ? nullptr : x_out, Norm::output(saved.norm2), rows, scratch, m, left);
      return;
    }
    attention_->forward(saved.attention, m, normed, batch, seq, packing, scratch, x_in);
    mid = m;
  }
  if (mamba_) {
    norm1_->forward(saved.norm1, x_in, local);
    float* m = sized(saved.mid, n, device_);
    mamba_->forward(saved.mamba, m, saved.norm1.out.data(), batch, seq, packing, scratch, x_in);
    mid = m;
  }
  if (mlp_) {
    void* left = link.leave_product ? sized_16bit(scratch.product16, n, device_) : nullptr;
    mlp_->forward(saved.mlp, left != nullptr ? nullptr : x_out,
                  normed_input(*norm2_, saved.norm2, mid, local, *mlp_, saved.mlp), rows, scratch, mid, left);
    return;
  }
  copy_on_device(device_, x_out, mid, n);
  if (moe_) {
    norm2_->forward(saved.norm2, mid, local);
    moe_->forward(saved.moe, x_out, saved.norm2.out.data(), batch, seq, scratch);
  }
}

bool Block::takes_bf16_residual_grad() const {
  if (mlp_ || moe_) return mlp_ && mlp_->takes_bf16_residual_grad();
  return attention_ && attention_->takes_bf16_residual_grad();
}

bool Block::takes_residual_grad_amax() const {
  if (mlp_ || moe_) return mlp_ && mlp_->takes_residual_grad_amax();
  return attention_ && attention_->takes_residual_grad_amax();
}

float* Block::residual_grad_amax() const {
  return mlp_ ? mlp_->residual_grad_amax() : attention_->residual_grad_amax();
}

bool ResidualGradForReader::reader_takes_bf16() const {
  return reader != nullptr && reader->takes_bf16_residual_grad();
}

float* ResidualGradForReader::reader_amax() const {
  return reader != nullptr && reader->takes_residual_grad_amax() ? reader->residual_grad_amax() : nullptr;
}

void Block::backward(float* d_x, ResidualGradForReader& for_reader, const float* x_in, const Saved& saved,
                     Workspace& work, int64_t batch, int64_t seq, const Packing& packing,
                     ParallelScratch& scratch) const {
  const int64_t rows = batch * seq, local = tp_->local_rows(rows), n = local * d_model_;
  // d_x in bf16, or its amax, for a reader that takes it, where current; a norm updating d_x
  // writes them for the next reader (this block's attention, or for_reader.reader, asked for its
  // amax slot just before the norm runs), which leaves them current, or else stale.
  auto d_x16_for = [&](bool takes) -> const void* {
    return takes && for_reader.current ? work.d_residual16.data() : nullptr;
  };
  auto d_x16_by_norm = [&](bool wanted) -> void* {
    for_reader.current = wanted;
    return wanted ? sized_16bit(work.d_residual16, n, device_) : nullptr;
  };
  auto amax_for = [&](bool takes) { return takes ? for_reader.amax : nullptr; };
  auto amax_by_norm = [&](float* slot) {
    for_reader.amax = slot;
    return slot;
  };
  const bool attention_takes = attention_ && attention_->takes_bf16_residual_grad();
  const bool attention_takes_amax = attention_ && attention_->takes_residual_grad_amax();
  // Each sub-block writes d_normed whole, in bf16 where its first projection's dgrad rounds it to
  // bf16 anyway (gives_bf16_input_grad: half the bytes, the same values); the MoE layer's experts
  // add into a zeroed one.
  if (mlp_ || moe_) {
    const float* mid = attention_ || mamba_ ? saved.mid.data() : x_in;
    // norm2's gradient is read next by attention's output projection, or by the block before.
    const bool next_takes = attention_ ? attention_takes : !mamba_ && for_reader.reader_takes_bf16();
    auto norm2_amax = [&]() -> float* {
      if (attention_) return attention_takes_amax ? attention_->residual_grad_amax() : nullptr;
      return mamba_ ? nullptr : for_reader.reader_amax();
    };
    const bool mlp_takes_amax = mlp_ && mlp_->takes_residual_grad_amax();
    if (mlp_ && mlp_->gives_bf16_input_grad()) {
      void* d_normed16 = sized_16bit(work.d_normed, n, device_);
      mlp_->backward(nullptr, d_x, Norm::output(saved.norm2), saved.mlp, work, rows, scratch, false, d_normed16,
                     d_x16_for(mlp_->takes_bf16_residual_grad()), amax_for(mlp_takes_amax));
      norm2_->backward_bf16(d_x, d_normed16, mid, saved.norm2, local, d_x16_by_norm(next_takes),
                            amax_by_norm(norm2_amax()));
    } else if (mlp_) {
      float* d_normed = sized(work.d_normed, n, device_);
      mlp_->backward(d_normed, d_x, Norm::output(saved.norm2), saved.mlp, work, rows, scratch, false, nullptr,
                     d_x16_for(mlp_->takes_bf16_residual_grad()), amax_for(mlp_takes_amax));
      norm2_->backward(d_x, d_normed, mid, saved.norm2, local, d_x16_by_norm(next_takes), amax_by_norm(norm2_amax()));
    } else {
      float* d_normed = zeroed(work.d_normed, n, device_);
      moe_->backward(d_normed, d_x, saved.norm2.out.data(), saved.moe, work, batch, seq, scratch);
      norm2_->backward(d_x, d_normed, mid, saved.norm2, local, d_x16_by_norm(next_takes), amax_by_norm(norm2_amax()));
    }
  }
  if (attention_ && attention_->gives_bf16_input_grad()) {
    void* d_normed16 = sized_16bit(work.d_normed, n, device_);
    attention_->backward(nullptr, d_x, Norm::output(saved.norm1), saved.attention, work, batch, seq, packing, scratch,
                         d_normed16, d_x16_for(attention_takes), amax_for(attention_takes_amax));
    norm1_->backward_bf16(d_x, d_normed16, x_in, saved.norm1, local, d_x16_by_norm(for_reader.reader_takes_bf16()),
                          amax_by_norm(for_reader.reader_amax()));
  } else if (attention_) {
    float* d_normed = sized(work.d_normed, n, device_);
    attention_->backward(d_normed, d_x, Norm::output(saved.norm1), saved.attention, work, batch, seq, packing,
                         scratch, nullptr, d_x16_for(attention_takes), amax_for(attention_takes_amax));
    norm1_->backward(d_x, d_normed, x_in, saved.norm1, local, d_x16_by_norm(for_reader.reader_takes_bf16()),
                     amax_by_norm(for_reader.reader_amax()));
  }
  if (mamba_) {
    float* d_normed = sized(work.d_normed, n, device_);  // written whole by the mixer's backward
    mamba_->backward(d_normed, d_x, saved.norm1.out.data(), saved.mamba, work, batch, seq, packing, scratch);
    norm1_->backward(d_x, d_normed, x_in, saved.norm1, local, d_x16_by_norm(for_reader.reader_takes_bf16()),
                     amax_by_norm(for_reader.reader_amax()));
  }
}

void Block::decode(float* x, int64_t rows, int64_t past, KVCache& cache, Saved& scratch, ParallelScratch& tp_scratch,
                   int64_t max_positions) const {
  if (attention_) {
    norm1_->forward(scratch.norm1, x, rows);
    attention_->decode(x, scratch.norm1.out.data(), rows, past, cache, scratch.attention, tp_scratch, max_positions);
  }
  if (mamba_) {
    if (past == 0) cache.mamba = MambaCache{};  // a new sequence starts from a zero state
    norm1_->forward(scratch.norm1, x, rows);
    mamba_->decode(x, scratch.norm1.out.data(), rows, cache.mamba, scratch.mamba, tp_scratch);
  }
  if (mlp_) {
    norm2_->forward(scratch.norm2, x, rows);
    mlp_->forward(scratch.mlp, x, scratch.norm2.out.data(), rows, tp_scratch);
  } else if (moe_) {
    norm2_->forward(scratch.norm2, x, rows);
    moe_->forward(scratch.moe, x, scratch.norm2.out.data(), 1, rows, tp_scratch);
  }
}

void Block::forward_paged(float* x, const PagedBatch& batch, const PagedRows& on_device, PagedLayerCache& cache,
                          int64_t block_size, Saved& scratch, ParallelScratch& tp_scratch) const {
  const int64_t rows = batch.rows();
  if (attention_) {
    norm1_->forward(scratch.norm1, x, rows);
    attention_->forward_paged(x, scratch.norm1.out.data(), batch, on_device, cache, block_size, scratch.attention,
                              tp_scratch);
  }
  if (mamba_) {
    norm1_->forward(scratch.norm1, x, rows);
    mamba_->forward_paged(x, scratch.norm1.out.data(), batch, on_device, cache, scratch.mamba, tp_scratch);
  }
  if (mlp_) {
    norm2_->forward(scratch.norm2, x, rows);
    mlp_->forward(scratch.mlp, x, scratch.norm2.out.data(), rows, tp_scratch);
  } else if (moe_) {  // every row routed on its own token: a batch computes what each row alone does
    norm2_->forward(scratch.norm2, x, rows);
    moe_->forward(scratch.moe, x, scratch.norm2.out.data(), 1, rows, tp_scratch);
  }
}

}  // namespace loom::model
