#include "loom/parallel/context/ring_attention.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "loom/kernels/ops.h"
#include "loom/parallel/context/communication.h"

namespace loom::parallel {

namespace {

constexpr int kBlockTag = 0, kGradTag = 1;

// Queries are fused qkv rows; keys and values a block of [k | v] rows; outputs att rows.
kernels::FlashAttentionShape ring_shape(const kernels::AttentionShape& s) {
  const int64_t kv2 = 2 * s.kv_heads * s.head_dim;
  return {s.batch, s.seq, s.seq, s.heads, s.kv_heads, s.head_dim, s.qkv_width(), kv2, kv2, s.heads * s.head_dim,
          s.operands};
}

}  // namespace

RingAttention::RingAttention(comm::Communicator& cp, Device device)
    : GroupAttention(cp, device),
      blocks_{model::Buffer(device), model::Buffer(device)},
      grads_{model::Buffer(device), model::Buffer(device)},
      part_out_(device),
      part_lse_(device),
      device_documents_(device) {}

void RingAttention::plan_positions(const kernels::AttentionShape& local) {
  if (planned_batch_ == local.batch && planned_seq_ == local.seq) return;
  positions_.assign(size(), std::vector<int32_t>(local.batch * local.seq));
  for (int r = 0; r < size(); ++r) {
    for (int64_t b = 0; b < local.batch; ++b) {
      for (int64_t t = 0; t < local.seq; ++t) {
        positions_[r][b * local.seq + t] = static_cast<int32_t>(model::context_position(size(), r, local.seq, t));
      }
    }
  }
  if (device_.is_cuda()) {
    device_positions_.clear();
    for (const std::vector<int32_t>& p : positions_) {
      device_positions_.emplace_back(device_, static_cast<int64_t>(p.size()));
      copy_from_host(device_, device_positions_.back().data(), p.data(), static_cast<int64_t>(p.size()));
    }
  }
  planned_batch_ = local.batch;
  planned_seq_ = local.seq;
}

void RingAttention::place_documents(const std::vector<int32_t>& documents) {
  documents_ = documents.data();
  if (device_.is_cpu() || documents.empty()) return;
  device_documents_.resize(static_cast<int64_t>(documents.size()));
  copy_from_host(device_, device_documents_.data(), documents.data(), static_cast<int64_t>(documents.size()));
  documents_ = device_documents_.data();
}

float* RingAttention::own_block(const float* qkv, const kernels::AttentionShape& local) {
  const int64_t rows = local.batch * local.seq, W = local.qkv_width(), q = local.heads * local.head_dim;
  const int64_t kv2 = 2 * local.kv_heads * local.head_dim;
  float* block = model::sized(blocks_[0], rows * kv2);
  copy_rows(device_, block, kv2, qkv + q, W, rows, kv2);
  return block;
}

kernels::AttentionVisibility RingAttention::visibility(int owner, const model::Packing& packing, int64_t tokens) const {
  const int32_t* owner_documents = packing.documents != nullptr ? documents_ + owner * tokens : nullptr;
  const std::vector<int32_t>& mine = positions_[rank()];
  const std::vector<int32_t>& theirs = positions_[owner];
  if (device_.is_cpu()) return {mine.data(), theirs.data(), packing.documents, owner_documents};
  return {device_positions_[rank()].data(), device_positions_[owner].data(), packing.documents, owner_documents};
}

void RingAttention::forward(float* att, model::ContextSaved& saved, const float* qkv,
                            const kernels::AttentionShape& local, const model::Packing& packing) {
  plan_positions(local);
  if (packing.documents != nullptr) {
    saved.documents.resize(static_cast<size_t>(size() * local.batch * local.seq));
    gather_documents(*cp_, packing.documents, saved.documents.data(), local.batch * local.seq);
    place_documents(saved.documents);
  }
  const int cp = size(), me = rank();
  const kernels::FlashAttentionShape shape = ring_shape(local);
  const int64_t rows = local.batch * local.seq, kv = local.kv_heads * local.head_dim;
  const int64_t lse_count = local.batch * local.heads * local.seq;
  float* current = own_block(qkv, local);
  float* next = model::sized(blocks_[1], rows * 2 * kv);
  float* lse = model::sized(saved.lse, lse_count, device_);
  float* part_out = model::sized(part_out_, rows * shape.out_stride);
  float* part_lse = model::sized(part_lse_, lse_count);
  for (int step = 0; step < cp; ++step) {
    const int owner = (me - step + cp) % cp;  // whose block this rank holds now
    std::optional<RingHop> hop;
    if (step + 1 < cp) hop.emplace(*cp_, current, next, rows * 2 * kv, kBlockTag);  // overlaps the compute
    const kernels::AttentionVisibility visible = visibility(owner, packing, rows);
    if (step == 0) {  // the own block: every query sees at least itself
      kernels::flash_attention_forward(device_, att, lse, qkv, current, current + kv, shape, visible);
    } else {
      kernels::flash_attention_forward(device_, part_out, part_lse, qkv, current, current + kv, shape, visible);
      kernels::merge_attention_partials(device_, att, lse, part_out, part_lse, shape);
    }
    if (hop) {
      hop->wait();
      std::swap(current, next);
    }
  }
}

void RingAttention::backward(float* d_qkv, const float* d_att, const float* qkv, const float* att,
                             const model::ContextSaved& saved, const kernels::AttentionShape& local,
                             const model::Packing& packing) {
  plan_positions(local);
  if (packing.documents != nullptr) place_documents(saved.documents);
  const int cp = size(), me = rank();
  const kernels::FlashAttentionShape shape = ring_shape(local);
  const int64_t rows = local.batch * local.seq, kv = local.kv_heads * local.head_dim, kv2 = 2 * kv;
  const int64_t W = local.qkv_width(), q = local.heads * local.head_dim;
  float* current = own_block(qkv, local);
  float* next = model::sized(blocks_[1], rows * kv2);
  float* grad = model::zeroed(grads_[0], rows * kv2);  // the gradient of the block held, so far
  float* grad_next = model::sized(grads_[1], rows * kv2);
  for (int step = 0; step < cp; ++step) {
    const int owner = (me - step + cp) % cp;
    std::optional<RingHop> hop;
    if (step + 1 < cp) hop.emplace(*cp_, current, next, rows * kv2, kBlockTag);
    const kernels::AttentionVisibility visible = visibility(owner, packing, rows);
    // With the final output and LSE, each block's probabilities are its exact share.
    kernels::flash_attention_backward(device_, d_qkv, grad, grad + kv, d_att, att, saved.lse.data(), qkv, current,
                                      current + kv, shape, visible);
    // The block's gradient goes where the block goes; after the last step, back to its owner.
    RingHop grad_hop(*cp_, grad, grad_next, rows * kv2, kGradTag);
    if (hop) {
      hop->wait();
      std::swap(current, next);
    }
    grad_hop.wait();
    std::swap(grad, grad_next);
  }
  // `grad` now holds every rank's contribution to this rank's own keys and values.
  kernels::add_rows(device_, d_qkv + q, W, grad, kv2, rows, kv2);
}

}  // namespace loom::parallel
