#pragma once
// Activation and scratch buffers: grown on first use for a (batch, seq) and then reused.
#include <algorithm>
#include <cstdint>
#include <vector>

namespace loom::model {

using Buffer = std::vector<float>;

inline float* sized(Buffer& buffer, int64_t n) {
  if (static_cast<int64_t>(buffer.size()) < n) buffer.resize(n);
  return buffer.data();
}
inline float* zeroed(Buffer& buffer, int64_t n) {
  float* p = sized(buffer, n);
  std::fill(p, p + n, 0.0f);
  return p;
}
inline void release(Buffer& buffer) { Buffer().swap(buffer); }

// Gradient scratch shared by all blocks (only one block runs backward at a time).
struct Workspace {
  Buffer d_normed, d_att, d_qkv, d_hidden, d_act;
};

}  // namespace loom::model
