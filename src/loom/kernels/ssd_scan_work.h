#pragma once
// The work memory of the GPU scan's loops form (kernels/cuda/ssd_scan.cu, ssd_scan_backward.cu),
// defined once for the kernels that lay it out and for the planner that counts it
// (plan/activation_memory.cpp): per (row, head) arrays of doubles walked block by block, the
// groups' block dot products, the states entering each block, and the per-head shares of dB and
// dC. Each call takes it for its length from the device's scratch (kernels/cuda/scratch.h).
#include <cstdint>

#include "loom/kernels/host_device.h"
#include "loom/kernels/types.h"

namespace loom::kernels::ssd_loops {

// The longest block: what the per-block work arrays hold.
LOOM_HOST_DEVICE inline int64_t longest_block(const SsdShape& s) {
  const int64_t L = s.chunk < s.seq ? s.chunk : s.seq;
  return L > 1 ? L : 1;
}
// Doubles of one (row, head)'s forward work: the state, the block's weights, dt, cum, coef.
LOOM_HOST_DEVICE inline int64_t forward_work(const SsdShape& s) {
  const int64_t L = longest_block(s);
  return s.head_dim * s.state + L * L + 3 * L;
}
// Doubles of one (row, head)'s backward work: the state gradient carried from block to block, the
// pair terms G, Q and R ([L, L] each), five per-token columns, dy.dS_out B ([L, head_dim]), and
// the forward's work for the states it recomputes.
LOOM_HOST_DEVICE inline int64_t head_work(const SsdShape& s) {
  const int64_t L = longest_block(s);
  return s.head_dim * s.state + 3 * L * L + 5 * L + L * s.head_dim + forward_work(s);
}
// Entering states of the blocks that do not start a document, at most this many per (row, head):
// ceil(seq / chunk), at least one.
inline int64_t state_slots(const SsdShape& s) {
  const int64_t slots = (s.seq + s.chunk - 1) / s.chunk;
  return slots > 1 ? slots : 1;
}

// The arrays' elements: each row's block boundaries (int32: batch x (seq + 1), and a count per
// row); the groups' dot products C_t . B_j over each token's block ([batch, groups, seq, L]); the
// forward work of every (row, head); the states entering every block; each (row, head)'s three
// parameter partials and backward work; the heads' shares of dB or of dC ([batch, heads, seq,
// state], each).
inline int64_t segment_ints(const SsdShape& s) { return s.batch * (s.seq + 1) + s.batch; }
inline int64_t block_dot_doubles(const SsdShape& s) { return s.batch * s.groups * s.seq * longest_block(s); }
inline int64_t forward_work_doubles(const SsdShape& s) { return s.batch * s.heads * forward_work(s); }
inline int64_t entering_state_doubles(const SsdShape& s) {
  return s.batch * s.heads * state_slots(s) * s.head_dim * s.state;
}
inline int64_t head_partial_doubles(const SsdShape& s) { return s.batch * s.heads * 3; }
inline int64_t head_work_doubles(const SsdShape& s) { return s.batch * s.heads * head_work(s); }
inline int64_t head_bc_doubles(const SsdShape& s) { return s.batch * s.heads * s.seq * s.state; }

// Bytes one backward call takes (the entering states recomputed by a forward walk without dots),
// more than a forward call's (segments, dots and forward work): what the planner counts.
inline int64_t loops_backward_bytes(const SsdShape& s) {
  return 4 * segment_ints(s) + 8 * (entering_state_doubles(s) + forward_work_doubles(s) + block_dot_doubles(s) +
                                    head_partial_doubles(s) + head_work_doubles(s) + 2 * head_bc_doubles(s));
}

}  // namespace loom::kernels::ssd_loops
