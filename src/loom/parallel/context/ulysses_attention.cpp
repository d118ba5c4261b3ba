#include "loom/parallel/context/ulysses_attention.h"

#include <string>
#include <vector>

#include "loom/core/error.h"
#include "loom/kernels/ops.h"
#include "loom/parallel/context/communication.h"
#include "loom/parallel/context/ulysses_layout.h"

namespace loom::parallel {

namespace {

// Fused qkv rows: q heads, then k heads, then v heads; attention outputs: the q heads' values.
std::vector<HeadColumns> head_segments(const kernels::AttentionShape& s, bool fused_qkv) {
  const int64_t q = s.heads * s.head_dim, kv = s.kv_heads * s.head_dim;
  if (!fused_qkv) return {{0, q}};
  return {{0, q}, {q, kv}, {q + kv, kv}};
}

}  // namespace

UlyssesAttention::UlyssesAttention(comm::Communicator& cp, Device device)
    : GroupAttention(cp, device),
      whole_grad_(device),
      whole_d_qkv_(device),
      device_documents_(device) {}

kernels::AttentionShape UlyssesAttention::head_shape(const kernels::AttentionShape& local) const {
  const int cp = size();
  LOOM_CHECK(local.heads % cp == 0 && local.kv_heads % cp == 0,
             "parallel.cp_comm = a2a splits heads over the " + std::to_string(cp) + " context-parallel ranks, but a layer has " +
                 std::to_string(local.heads) + " heads and " + std::to_string(local.kv_heads) +
                 " kv heads per tensor-parallel rank (both must be multiples of parallel.cp; or use parallel.cp_comm = p2p)");
  return {local.batch, local.seq * cp, local.heads / cp, local.kv_heads / cp, local.head_dim, local.operands};
}

void UlyssesAttention::to_heads(float* whole, const float* rows, const kernels::AttentionShape& local, bool fused_qkv) {
  const int64_t width = fused_qkv ? local.qkv_width() : local.heads * local.head_dim;
  heads_.to_heads(whole, rows, local.batch, local.seq, width, head_segments(local, fused_qkv));
}

void UlyssesAttention::to_tokens(float* rows, const float* whole, const kernels::AttentionShape& local, bool fused_qkv,
                                 bool accumulate) {
  const int64_t width = fused_qkv ? local.qkv_width() : local.heads * local.head_dim;
  heads_.to_rows(rows, whole, local.batch, local.seq, width, head_segments(local, fused_qkv), accumulate);
}

namespace {

// The tiled kernel's view of fused qkv rows of `s` (q, k, v column ranges of one row) and of its
// output rows; plain causal attention over whole sequences.
kernels::FlashAttentionShape flash_shape(const kernels::AttentionShape& s) {
  const int64_t W = s.qkv_width();
  return {s.batch, s.seq, s.seq, s.heads, s.kv_heads, s.head_dim, W, W, W, s.heads * s.head_dim, s.operands};
}

// Packed documents: every token's document id over the whole sequence, in its natural order.
kernels::AttentionVisibility whole_documents(comm::Communicator& cp, const model::Packing& packing,
                                             const kernels::AttentionShape& local, std::vector<int32_t>& documents) {
  if (packing.documents == nullptr) return {};
  documents.resize(static_cast<size_t>(cp.size() * local.batch * local.seq));
  gather_sequences(cp, packing.documents, documents.data(), local.batch, local.seq);
  return {nullptr, nullptr, documents.data(), documents.data()};
}

}  // namespace

kernels::AttentionVisibility UlyssesAttention::placed(kernels::AttentionVisibility visible,
                                                      const std::vector<int32_t>& documents) {
  if (device_.is_cpu() || visible.q_doc == nullptr) return visible;
  device_documents_.resize(static_cast<int64_t>(documents.size()));
  copy_from_host(device_, device_documents_.data(), documents.data(), static_cast<int64_t>(documents.size()));
  visible.q_doc = visible.k_doc = device_documents_.data();
  return visible;
}

void UlyssesAttention::forward(float* att, model::ContextSaved& saved, const float* qkv,
                               const kernels::AttentionShape& local, const model::Packing& packing) {
  const kernels::AttentionShape heads = head_shape(local);
  const kernels::AttentionVisibility visible =
      placed(whole_documents(*cp_, packing, local, saved.documents), saved.documents);
  const int64_t rows = heads.batch * heads.seq, k_off = heads.heads * heads.head_dim;
  const int64_t v_off = k_off + heads.kv_heads * heads.head_dim;
  float* gathered = model::sized(saved.gathered, rows * heads.qkv_width(), device_);
  to_heads(gathered, qkv, local, true);
  float* out = model::sized(saved.out, rows * heads.heads * heads.head_dim, device_);
  float* lse = model::sized(saved.lse, heads.batch * heads.heads * heads.seq, device_);
  kernels::flash_attention_forward(device_, out, lse, gathered, gathered + k_off, gathered + v_off, flash_shape(heads),
                                   visible);
  to_tokens(att, out, local, false, false);
}

void UlyssesAttention::backward(float* d_qkv, const float* d_att, const float*, const float*,
                                const model::ContextSaved& saved, const kernels::AttentionShape& local,
                                const model::Packing& packing) {
  // The documents as forward gathered them (the sequence's natural order).
  kernels::AttentionVisibility visible;
  if (packing.documents != nullptr) {
    visible = placed({nullptr, nullptr, saved.documents.data(), saved.documents.data()}, saved.documents);
  }
  const kernels::AttentionShape heads = head_shape(local);
  const int64_t rows = heads.batch * heads.seq, k_off = heads.heads * heads.head_dim;
  const int64_t v_off = k_off + heads.kv_heads * heads.head_dim;
  float* d_out = model::sized(whole_grad_, rows * heads.heads * heads.head_dim);
  to_heads(d_out, d_att, local, false);
  float* d_gathered = model::zeroed(whole_d_qkv_, rows * heads.qkv_width());
  const float* g = saved.gathered.data();
  kernels::flash_attention_backward(device_, d_gathered, d_gathered + k_off, d_gathered + v_off, d_out,
                                    saved.out.data(), saved.lse.data(), g, g + k_off, g + v_off, flash_shape(heads),
                                    visible);
  to_tokens(d_qkv, d_gathered, local, true, true);
}

}  // namespace loom::parallel
