#include "loom/parallel/data/fp8_weight_pieces.h"

#include <cstddef>

namespace loom::parallel {

bool keeps_fp8_weight_casts(const config::RunConfig& config) {
  const config::PrecisionRecipe recipe = config.precision.recipe;
  return config.precision.fp8_weights_from_optimizer && config.runtime.device == config::RuntimeDevice::Cuda &&
         config.parallel.zero == 0 && !config.optim.cpu_offload &&  // an offloaded optimizer writes no codes
         config.precision.param_dtype == config::ParamDtype::Fp32 &&
         (recipe == config::PrecisionRecipe::Fp8Delayed || recipe == config::PrecisionRecipe::Fp8Current);
}

namespace {

// Whether `next` continues `piece` in every array it updates, with the same hyper-parameters.
bool continues(const optim::ShardPiece& piece, const optim::ShardPiece& next) {
  const auto after = [&](const auto* p, const auto* q) { return p != nullptr && q == p + piece.numel; };
  const bool copies = piece.param_bf16 == nullptr
                          ? next.param_bf16 == nullptr
                          : after(static_cast<const uint16_t*>(piece.param_bf16),
                                  static_cast<const uint16_t*>(next.param_bf16));
  return after(piece.param, next.param) && after(piece.grad, next.grad) &&
         after(piece.state[0], next.state[0]) && after(piece.state[1], next.state[1]) && copies &&
         piece.weight_decay == next.weight_decay && piece.lr_scale == next.lr_scale;
}

}  // namespace

std::vector<model::OptimizerWeightCasts::Entry*> give_fp8_weights(
    std::vector<optim::ShardPiece>& pieces, const std::vector<model::OptimizerWeightCasts::Entry*>& targets) {
  std::vector<model::OptimizerWeightCasts::Entry*> given;
  for (model::OptimizerWeightCasts::Entry* e : targets) {
    size_t first = 0;
    while (first < pieces.size() && pieces[first].param != e->weight) ++first;
    if (first == pieces.size()) continue;
    // The weight's pieces: one parameter, or several laid out one after the other (a fused GEMM's
    // q, k and v, or gate and up), updated as one.
    size_t end = first + 1;
    int64_t numel = pieces[first].numel;
    while (numel < e->rows * e->cols && end < pieces.size() && continues(pieces[end - 1], pieces[end])) {
      numel += pieces[end].numel;
      ++end;
    }
    if (numel != e->rows * e->cols || pieces[first].fp8.amax != nullptr) continue;
    pieces[first].numel = numel;
    const auto at = [&](size_t i) { return pieces.begin() + static_cast<std::ptrdiff_t>(i); };
    pieces.erase(at(first + 1), at(end));
    pieces[first].fp8 = {e->amax, e->codes ? e->forward.data() : nullptr, e->codes ? e->transposed.data() : nullptr,
                         e->rows, e->cols, e->scale};
    given.push_back(e);
  }
  return given;
}

}  // namespace loom::parallel
