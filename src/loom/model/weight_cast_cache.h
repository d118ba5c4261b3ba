#pragma once
// The weights' casts of a model's precision GEMMs on a device, kept for one optimizer step.
// Forward and dgrad cast each weight to the recipe's format (bf16 / fp16 copies, FP8 codes with
// their scales, MXFP8's decoded bf16; dgrad's FP8 and block-scaled forms transposed) for every
// micro-batch and again under recompute, though the weights change only at the optimizer step.
// Inside a scope that the training step opens before its first micro-batch and closes before
// its optimizer step (train/precision_step.h), the first GEMM of a weight writes its cast into
// a store here and every later GEMM of that weight and form reads it (kernels::CastStore), the
// same codes and scales: fp8_current's scale is a function of the weight's amax, fp8_delayed's of
// the history, which moves only at the step. Outside a scope (evaluation, inference, a reference
// policy's pass, a standalone layer) nothing is kept, and closing frees every store, so nothing
// that writes parameters between steps (the optimizer, a checkpoint load, a weight swap) needs
// to say so.
//
// A cast is keyed by its layer, the weight's address and the form (kernels::weight_cast_form);
// the recipe's cast, the shape and the delayed scale must match too, or it is cast again. Every
// address a layer reads a weight from holds the same values for the whole scope: parameters live
// in the model's store, ZeRO-3 gathers a unit into the same buffers with the same values each
// time, a tensor-parallel rank holds its own shards (and keeps its own cache), a pipeline stage
// its own layers. fp8_current's tensor-parallel amax all-reduce is skipped with the cast, on
// every rank of the group alike (they run the same GEMMs in the same order).
//
// A bf16 copy of the parameters that the optimizer keeps current (use_bf16_copy; at ZeRO 0 on a
// device) serves every bf16 cast of a weight inside it: no cast at all, in any step after the first.
//
// Memory: while a scope is open, one store per weight and form: 2 bytes per weight element for
// bf16 / fp16 (one form; none where the bf16 copy serves), 1 + 1 for the FP8 recipes (forward and
// transposed dgrad codes; per-tensor FP8's forward writes both from one read of the weight), 2 + 2
// for mxfp8 (plan/activation_memory.h counts it).
#include <cstdint>
#include <map>
#include <tuple>

#include "loom/core/device.h"
#include "loom/kernels/precision_gemm.h"

namespace loom::model {

class WeightCastCache {
 public:
  WeightCastCache() = default;
  ~WeightCastCache() { close(); }
  WeightCastCache(const WeightCastCache&) = delete;
  WeightCastCache& operator=(const WeightCastCache&) = delete;

  // open(): from now on casts are kept (any left from before are dropped first). close(): every
  // store freed, nothing kept until the next open().
  void open();
  void close();
  bool is_open() const { return open_; }
  // Until close(): the bf16 cast of a weight lying inside `values` (`total` fp32 elements) is the
  // matching part of `copy` (every value rounded to bf16, written by the optimizer and current:
  // parallel/data/bf16_parameter_copy.h), ready as it is: nothing cast or held for it.
  void use_bf16_copy(const float* values, int64_t total, const void* copy);
  // The copy's part for x[0..n) (a bias: its bf16 form for cuBLASLt's epilogue) where use_bf16_copy
  // gave one holding it in this scope; else null.
  const void* bf16_copy_of(const float* x, int64_t n) const;

  struct Store {
    void* data = nullptr;
    int64_t bytes = 0;
    kernels::OperandCast cast = kernels::OperandCast::None;
    int64_t rows = 0, cols = 0;
    float scale = 1.0f;
    bool ready = false;  // a GEMM wrote the cast (set by the caller once its GEMM was issued)
    bool borrowed = false;  // data lies in use_bf16_copy's copy or was lent: not the cache's to free
  };
  // The store of `layer`'s weight [rows, cols] at `weight` cast as `cast` (b of GEMM `pass`) on
  // `device`: ready, or to be written (reallocated, not ready, when what it held differs); null
  // outside a scope.
  Store* find(const void* layer, const float* weight, kernels::LinearGemm pass, const kernels::CastOperand& cast,
              int64_t rows, int64_t cols, Device device);
  // Whether find() would return a ready store for these (nothing changed, nothing counted).
  bool holds(const void* layer, const float* weight, kernels::LinearGemm pass, const kernels::CastOperand& cast,
             int64_t rows, int64_t cols, Device device) const;
  // Until close(): the store of that weight and form is `data`, which holds its cast already (the
  // optimizer's codes: model/optimizer_weight_casts.h), kept by its owner: nothing cast or held.
  void lend(const void* layer, const float* weight, kernels::LinearGemm pass, const kernels::CastOperand& cast,
            int64_t rows, int64_t cols, Device device, void* data);

  // Stores written since this cache was made (a cast made, not reused), and bytes held now.
  int64_t casts_made() const { return casts_made_; }
  int64_t bytes_held() const;

 private:
  using Key = std::tuple<const void*, const float*, int>;
  void free(Store& store);
  void free_all();  // every store, the scope and its copy left as they are
  Store& store_of(const void* layer, const float* weight, kernels::LinearGemm pass, const kernels::CastOperand& cast,
                  Device device);
  // s holds `data`, someone else's, ready.
  void borrow(Store& s, void* data, const kernels::CastOperand& cast, int64_t rows, int64_t cols);

  bool open_ = false;
  Device device_ = Device::cpu();
  std::map<Key, Store> stores_;
  int64_t casts_made_ = 0;
  const float* copy_values_ = nullptr;  // use_bf16_copy's
  int64_t copy_total_ = 0;
  const void* copy_ = nullptr;
};

}  // namespace loom::model
