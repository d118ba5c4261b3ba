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

// Columns of a row that hold heads: `width` columns from `first`, cut into cp equal parts (rank j
// takes part j). Fused qkv rows have three (q, k, v heads); a Mamba-2 mixer's projections five
// (z, x, B, C, dt).
struct HeadColumns {
  int64_t first, width;
};

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
  // Head sharding (a Mamba-2 mixer's, whatever cp_comm; Ulysses attention's own): one all-to-all
  // turns this rank's `rows` [batch * seq, row_width] (its tokens, every head) into `whole`
  // [batch, size() * seq, block] (every token in natural order, part rank() of each segment's
  // columns: block = the sum of the segments' widths / size()). Collective.
  virtual void rows_to_heads(float* whole, const float* rows, int64_t batch, int64_t seq, int64_t row_width,
                             const std::vector<HeadColumns>& segments) = 0;
  // The inverse: `whole`'s parts back to their tokens' rows, added into `rows` when `accumulate`.
  virtual void heads_to_rows(float* rows, const float* whole, int64_t batch, int64_t seq, int64_t row_width,
                             const std::vector<HeadColumns>& segments, bool accumulate) = 0;
};

}  // namespace loom::model
