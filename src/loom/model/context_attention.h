#pragma once
// Context parallelism as the model sees it. The ranks of a context-parallel group each hold 2 of
// a sequence's 2 x cp equal chunks: rank r chunks r and 2cp - 1 - r (Megatron's load balancing:
// under a causal mask an early chunk is cheap and a late one dear, so every rank gets one of
// each). Everything in a layer but attention works token by token on the local rows; attention
// spans the group through a ContextAttention, which parallel/context/ implements as a ring of
// key/value blocks (p2p) or an all-to-all to whole heads (a2a, Ulysses). The model learns where
// its tokens sit from context_position (RoPE, learned positions).
#include <cstdint>
#include <vector>

#include "loom/kernels/types.h"
#include "loom/model/buffers.h"
#include "loom/model/packing.h"

namespace loom::model {

// The global position of local token t (0 <= t < local_seq) on rank `rank` of a group of `size`.
inline int64_t context_position(int size, int rank, int64_t local_seq, int64_t t) {
  const int64_t chunk = local_seq / 2;
  const int64_t which = t < chunk ? rank : 2 * static_cast<int64_t>(size) - 1 - rank;
  return which * chunk + t % chunk;
}

// What a ContextAttention keeps of one layer's forward for its backward.
struct ContextSaved {
  Buffer gathered;  // a2a: the head-sharded qkv of the whole sequence; p2p: unused
  Buffer out;       // a2a: the attention output of those heads over the whole sequence
  Buffer lse;       // each query's log-sum-exp over every key it sees (a2a: of those heads)
  std::vector<int32_t> documents;  // packed documents: every rank's document ids (a2a: in sequence order)
};

class ContextAttention {
 public:
  virtual ~ContextAttention() = default;
  virtual int size() const = 0;
  virtual int rank() const = 0;
  // att [batch * seq, heads * head_dim] = causal attention of this rank's queries over the keys
  // of the whole sequence. qkv: this rank's fused rows [batch * seq, qkv_width] after RoPE;
  // `local`: this rank's token count per sequence (seq) and its tensor-parallel heads; `packing`:
  // the document ids of this rank's tokens when documents are packed (a query sees only keys of
  // its own document). Collective over the group.
  virtual void forward(float* att, ContextSaved& saved, const float* qkv, const kernels::AttentionShape& local,
                       const Packing& packing) = 0;
  // Adds d(loss)/d(qkv) of this rank's rows into d_qkv, given d(loss)/d(att). Collective.
  virtual void backward(float* d_qkv, const float* d_att, const float* qkv, const float* att, const ContextSaved& saved,
                        const kernels::AttentionShape& local, const Packing& packing) = 0;
  // Token ids (inputs, targets, document ids) of whole sequences: every rank's `local` [batch, seq]
  // (host memory) into `whole` [batch, size() * seq] in the sequences' natural order (multi-token
  // prediction looks k tokens ahead, which may sit on another rank). Collective.
  virtual void gather_sequences(int32_t* whole, const int32_t* local, int64_t batch, int64_t seq) = 0;
};

}  // namespace loom::model
