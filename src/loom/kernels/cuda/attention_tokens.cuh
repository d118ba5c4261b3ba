#pragma once
// Which keys a query sees, on the device: each side's per-token positions and documents
// (kernels/types.h, AttentionVisibility) and the bounds of a staged block of them, so the
// attention kernels skip tiles no query of a block sees. Device code only.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

namespace loom::kernels::cuda {

// One side's (queries' or keys') per-token metadata, as kernels/types.h defines it.
struct Tokens {
  const int32_t* pos;
  const int32_t* doc;
  int64_t len;
  __device__ int32_t position(int64_t b, int64_t i) const { return pos ? pos[b * len + i] : static_cast<int32_t>(i); }
  __device__ int32_t document(int64_t b, int64_t i) const { return doc ? doc[b * len + i] : 0; }
};

// Bounds of the positions and documents of n staged tokens.
struct Range {
  int32_t pos_lo, pos_hi, doc_lo, doc_hi;
};
__device__ inline Range range_of(const int32_t* pos, const int32_t* doc, int n) {
  Range r{INT32_MAX, INT32_MIN, INT32_MAX, INT32_MIN};
  for (int t = 0; t < n; ++t) {
    r.pos_lo = min(r.pos_lo, pos[t]);
    r.pos_hi = max(r.pos_hi, pos[t]);
    r.doc_lo = min(r.doc_lo, doc[t]);
    r.doc_hi = max(r.doc_hi, doc[t]);
  }
  return r;
}
// No key of the block is visible to any query of the block.
__device__ inline bool hidden(const Range& q, const Range& k) {
  return k.pos_lo > q.pos_hi || k.doc_hi < q.doc_lo || k.doc_lo > q.doc_hi;
}

// Every key of the block is visible to every query of the block: one document, keys no later.
__device__ inline bool all_visible(const Range& q, const Range& k) {
  return q.doc_lo == q.doc_hi && k.doc_lo == k.doc_hi && q.doc_lo == k.doc_lo && k.pos_hi <= q.pos_lo;
}

}  // namespace loom::kernels::cuda
