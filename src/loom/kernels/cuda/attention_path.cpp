// Which kernels attention with bf16 operands runs on (attention_bf16.h): cuDNN's fused flash
// attention or loom's own, by LOOM_ATTENTION and by what cuDNN serves.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "loom/core/error.h"
#include "loom/kernels/cuda/attention_bf16.h"
#include "loom/kernels/cuda/cudnn_attention.h"
#include "loom/kernels/cuda/cudnn_library.h"
#include "loom/kernels/cuda/say_once.h"

namespace loom::kernels::cuda {

namespace {

enum class Choice { Auto, Cudnn, Loom };

Choice choice() {
  const char* value = std::getenv("LOOM_ATTENTION");
  const std::string v = value != nullptr ? value : "";
  if (v.empty() || v == "auto") return Choice::Auto;
  if (v == "cudnn") return Choice::Cudnn;
  if (v == "loom") return Choice::Loom;
  throw Error("LOOM_ATTENTION=" + v + ": expected auto, cudnn or loom");
}

}  // namespace

std::string attention_fallback_reason(const FlashAttentionShape& s, const AttentionVisibility& vis, bool backward,
                                      std::initializer_list<const void*> tensors) {
  const Choice c = choice();
  if (c == Choice::Loom) return "LOOM_ATTENTION=loom";
  std::string why = cudnn_attention_refusal(s, vis, tensors);
  if (why.empty()) why = cudnn_attention_prepare(s, backward);
  LOOM_CHECK(why.empty() || c != Choice::Cudnn, "LOOM_ATTENTION=cudnn but cuDNN cannot serve this attention (batch " +
                                                    std::to_string(s.batch) + ", q_len " + std::to_string(s.q_len) +
                                                    ", head_dim " + std::to_string(s.head_dim) + "): " + why);
  if (why.empty()) {
    say_once("attention on cuDNN " + std::to_string(cudnn_status().version) + " (fused flash attention)");
  } else {
    say_once(std::string("attention ") + (backward ? "backward" : "forward") + " on loom's kernels: " + why);
  }
  return why;
}

std::string cudnn_gradient_views_refusal(const FlashAttentionShape& s, const void* dq16, const void* dk16,
                                         const void* dv16) {
  std::string why;
  for (const void* p : {dq16, dk16, dv16})
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) why = "a gradient view is not 16-byte aligned";
  if (why.empty()) why = cudnn_attention_prepare(s, true, CudnnGradientStrides{s.q_stride, s.k_stride, s.v_stride});
  if (!why.empty()) say_once("attention backward's gradients through a packed copy: " + why);
  return why;
}

}  // namespace loom::kernels::cuda
