#pragma once
// Mixed precision in the GEMMs of the linear layers (precision.recipe), emulated exactly on the
// CPU: each GEMM operand is copied and quantized to the recipe's format and back
// ("quantize-dequantize", src/loom/precision/), the product runs in fp32 as a tensor core
// accumulates, and the result is rounded to the recipe's activation dtype; the weight gradient
// alone is added unrounded into its fp32 main gradient (Megatron's gradient-accumulation fusion:
// on a GPU the wgrad GEMM adds its accumulator into main_grad). Master weights, optimizer states
// and the main gradients stay fp32.
//
// A linear layer out[n, OC] = in[n, IC] . W[OC, IC]^T has three GEMMs, each reducing over a
// different dimension, which matters for block-scaled formats (blocks run along the reduction):
//   forward  out  = in . W^T      reduces over IC: in and W blocked along their rows
//   dgrad    din  = dout . W      reduces over OC: dout along its rows, W down its columns
//   wgrad    dW   = dout^T . in   reduces over n:  dout and in down their columns
//
// Recipes (operand formats; GEMM outputs):
//   fp32           nothing (no LinearPrecision object exists: zero overhead)
//   bf16 / fp16    operands rounded to the format; outputs rounded to it (fp16 without
//                  saturation, so an overflow stays visible to the loss scaler)
//   fp8_delayed    per-tensor scale from an amax history (TE DelayedScaling); E4M3 for inputs and
//                  weights, E5M2 for output gradients; outputs in bf16
//   fp8_current    per-tensor scale from the tensor's own amax (TE Float8CurrentScaling); formats
//                  and outputs as fp8_delayed
//   fp8_blockwise  1x128 blocks for inputs and output gradients (along the GEMM's reduction
//                  dimension), 128x128 tiles for weights; E4M3 everywhere (DeepSeek-V3, TE
//                  Float8BlockScaling); outputs in bf16
//   mxfp8          OCP MX v1.0: blocks of 32 along the reduction dimension with E8M0 scales;
//                  E4M3 everywhere (TE MXFP8BlockScaling); outputs in bf16
// An FP8 operand holding Inf or NaN is passed on unquantized (a saturating cast would hide the
// overflow from the non-finite check of the gradients).
//
// Under tensor parallelism (parallel_linear.h) an operand may be this rank's piece of a larger
// tensor. fp8_current then takes the max of the pieces' amaxes over the tensor-parallel group,
// and a GEMM whose reduction dimension is split leaves its fp32 partial product unrounded for
// the caller to sum and round once, so every rank computes what one rank would.
//
// On a GPU (set_device(Device::cuda(i)); docs/cuda.md) the same GEMMs run in the recipe's real
// formats on tensor cores through the device entry kernels::precision_linear_gemm: bf16 / fp16
// operands, FP8 with per-tensor scales (E4M3, E5M2 for output gradients) or cuBLASLt's 1x128 /
// 128x128 block scales, MXFP8 emulated (decoded to bf16: Hopper has no MX tensor cores), fp32
// accumulation, the result rounded to the activation dtype. Nothing is read back per GEMM: an
// operand's amax is reduced on the device (kernels::amax_into), fp8_current's scale is computed
// there from it (the tensor-parallel max an all-reduce of one device float), and fp8_delayed's
// amaxes accumulate in a device array of the PrecisionContext, read once per optimizer step
// (pending_amaxes); its scales stay the host's, from the histories. Inside a training step's
// scope each weight is cast once per form and reused (weight_cast_cache.h). An operand holding Inf/NaN
// cannot be passed on unquantized without a read: its FP8 cast writes such elements as NaN, so
// every output they reach is NaN where the CPU's is Inf or NaN (docs/precision.md).
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loom/core/device.h"
#include "loom/kernels/precision_gemm.h"
#include "loom/kernels/types.h"
#include "loom/model/amax_slots.h"
#include "loom/model/buffers.h"
#include "loom/model/optimizer_weight_casts.h"
#include "loom/model/weight_cast_cache.h"
#include "loom/precision/fp8_scaling.h"
#include "loom/config/run_config.h"

namespace loom::comm {
class Communicator;
}

namespace loom::model {

// precision.recipe's enum (config/enums.h), parsed when the config is read.
using Recipe = config::PrecisionRecipe;

// "fp32" | "bf16" | "fp16" | "fp8_delayed" | "fp8_current" | "fp8_blockwise" | "mxfp8" (the
// config's table of names)
Recipe parse_recipe(const std::string& name);
std::string recipe_name(Recipe recipe);
bool is_fp8(Recipe recipe);  // the four FP8 / MXFP8 recipes
// The recipe's 16-bit form: bf16 for the FP8 and MX recipes, the others themselves (fp32 stays fp32).
Recipe sixteen_bit_recipe(Recipe recipe);
// Elements per scaling block along a GEMM operand's dimension: 128 for fp8_blockwise (1x128
// blocks, 128x128 weight tiles), 32 for mxfp8; 0 for recipes whose scale is per tensor or none.
int64_t scaling_block(Recipe recipe);

enum class GemmPass : uint8_t { Forward, DataGrad, WeightGrad };
enum class Operand : uint8_t { Input = 0, Weight = 1, OutputGrad = 2 };

// What a GEMM leaves in its output. Rounded: the recipe's activation dtype. Partial: the fp32
// product, for a GEMM whose reduction dimension is split over tensor-parallel ranks; the caller
// sums the partial products over the ranks and rounds the sum once (round_output), as one
// rank's GEMM rounds its whole sum.
enum class GemmOutput : uint8_t { Rounded, Partial };

// The recipe of every linear GEMM of a model, from the run's `precision` section.
struct PrecisionPolicy {
  Recipe recipe = Recipe::Fp32;
  int amax_history = 16;          // fp8_delayed: window of amaxes per tensor
  int margin = 0;                 // fp8 per-tensor: scale = fp8_max / amax / 2^margin
  bool edge_layers_bf16 = true;   // FP8 recipes: first and last block's linears in bf16
  config::AttentionPrecision attention = config::AttentionPrecision::Auto;
  bool forward_fast_accumulation = true;  // per-tensor FP8 on a GPU: LinearPrecision::set_forward_fast_accumulation
  bool gelu_epilogue = true;              // precision.gelu_epilogue: Mlp::fuses_gelu

  static PrecisionPolicy from_config(const config::PrecisionConfig& config);
  // The recipe of block `layer` of `layers` (FP8 recipes keep the edge blocks in bf16 if asked).
  Recipe block_recipe(int layer, int layers) const;
  // The output head: the recipe's 16-bit dtype; FP8 recipes keep it in bf16 (as TransformerEngine).
  Recipe head_recipe() const;
  // What training's attention products take: `attention`, where auto is bf16 under the bf16, FP8
  // and MX recipes (what tensor cores take; TransformerEngine's attention under them) and fp32
  // under fp32 and fp16 (no fp16 attention kernel; bf16 would round more than the recipe asks).
  kernels::AttentionOperands attention_operands() const;
};

// The cast of operand `op` on a device under `recipe` (the formats and scales prepare() emulates on
// the CPU): delayed_scale is fp8_delayed's current scale; fp8_current's scale comes from the
// device amax the caller sets (`amax`, with `margin`). `data` is left null for the caller.
kernels::CastOperand device_cast(Recipe recipe, Operand op, float delayed_scale, int margin);
// cuBLASLt's FP8 products need every GEMM dimension a multiple of 16 (per-tensor recipes) or of
// 128 (fp8_blockwise, whose block scales loom asks whole): that multiple, 1 for recipes taking any
// size (bf16, fp16 and the emulated mxfp8). check_device_shape: an Error naming the GEMM (`name`,
// where known), the recipe, the sizes and the rule where a GEMM breaks it.
int64_t device_gemm_multiple(Recipe recipe);
void check_device_shape(Recipe recipe, int64_t n, int64_t in_features, int64_t out_features,
                        const std::string& name = "");

// Scratch for the quantized operand copies and GEMM outputs, shared by the layers of a model
// (one GEMM runs at a time).
struct PrecisionScratch {
  Buffer operand[3];  // by Operand
  Buffer out;         // a GEMM's output before rounding and accumulation
  Buffer transposed;  // blockwise column blocks
  AmaxSlots amaxes;   // on a device: the floats fp8_current's operand amaxes are taken into
  // on a device: a layer's 16-bit output gradient or per-tensor FP8 transposed codes, cast by its
  // dgrad (or its producer: produced_codes), read by its wgrad
  Buffer dout_cast;
  Buffer bias;        // a bias rounded to the activation dtype (LinearPrecision::rounded_bias)
  Buffer produced_codes;  // on a device: an operand's FP8 codes written by its producer (produced_codes)
  WeightCastCache weight_casts;  // on a device: the weights' casts, kept inside a training step's scope
  // on a device: per-tensor FP8 weights' amaxes and codes, written by the optimizer's pass
  OptimizerWeightCasts optimizer_casts;
};

class GemmGroup;  // gemm_group.h

// Tensors a layer's GEMMs take or leave on a GPU in a form other than fp32, kept by the model
// (device memory; null: the fp32 argument is used, nothing is kept).
//
// In bf16, under the bf16 recipe, where the model keeps them bf16 (2-byte elements): the
// forward's input (`in`) and output (`out`, rounded after the bias); the backward's output
// gradient (`dout`: both GEMMs; no bias gradient, which sums the fp32 one), input gradient (`din`:
// dgrad's output, written whole) and input (`in`: wgrad's). The outputs (`out`, `din`) also under
// the FP8 and MX recipes, whose GEMMs round their outputs to bf16 too (gives_bf16_outputs). A bf16
// tensor holds exactly what the fp32 path casts or rounds to bf16, so the products are the same
// (Transformer::bf16_logits, Mlp::bf16_interior, Mlp::bf16_hidden); what goes is the casts, the
// widening passes and half of the bytes. The input (`in`) also under per-tensor FP8 with its kept
// codes (below), cast to FP8 from its bf16 values: a tensor bf16-valued anyway (attention's output).
//
// The input's FP8 codes for the weight gradient, under fp8_delayed and fp8_current
// (keeps_input_codes), kept_input_bytes() long, which the caller keeps from a micro-batch's
// forward to its backward beside the input: the forward casts the input once into both of its
// orientations, writing the transposed codes and their scale into `keep_input_codes`
// (kernels::PrecisionGemm::input_codes), and the backward's wgrad multiplies `kept_input_codes`
// (the same memory): no second amax and cast of the input, whose fp32 values backward then does
// not read (`in` may be null: a sequence-parallel layer does not gather it again). The same tensor
// under the same scale gives the same codes, so the products are unchanged.
//
// An operand's FP8 codes written by the kernel that produces it, under fp8_delayed and fp8_current
// (keeps_input_codes): the input's (`in_codes`, forward) or the output gradient's (`dout_codes`,
// backward), where LinearPrecision::produced_codes gave them (an MLP's activation and its gradient:
// kernels::activation_forward_codes / activation_backward_codes). The GEMMs multiply them with no
// cast of their own; the weight gradient reads the transposed codes the same producer wrote (the
// input's into the kept codes, the output gradient's into the layer's store).
//
// The amaxes a producing kernel took, under fp8_delayed and fp8_current (keeps_input_codes): the
// input's (`in_amax`, forward) or the output gradient's (`dout_amax`, backward), each where
// LinearPrecision::produced_amax gave for that operand (an Error otherwise). The cast then reads
// its operand once, with no amax pass before it: the max of the same values is the same amax.
struct DeviceTensors {
  const void* in = nullptr;
  void* out = nullptr;
  const void* dout = nullptr;
  void* din = nullptr;
  void* keep_input_codes = nullptr;          // forward
  const void* kept_input_codes = nullptr;    // backward
  const float* in_amax = nullptr;            // forward
  const float* dout_amax = nullptr;          // backward
  const void* in_codes = nullptr;            // forward
  const void* dout_codes = nullptr;          // backward
  // GELU in the GEMM's epilogue (bf16 only; kernels::PrecisionGemm::pre_gelu16): the forward's
  // `out` is GELU of the output and `pre_gelu` the output itself; the backward's `din` is dgrad's
  // output times GELU's derivative at `gelu_input` (that forward's pre_gelu), its column sums
  // added into `gelu_bias_grad` when set.
  void* pre_gelu = nullptr;                  // forward
  const void* gelu_input = nullptr;          // backward
  float* gelu_bias_grad = nullptr;           // backward
  // On a device: where this call's groupable GEMMs go, to run with the group's others (an MoE
  // layer's experts: gemm_group.h); null: every GEMM runs now.
  GemmGroup* group = nullptr;
  bool any_bf16() const {
    return in != nullptr || out != nullptr || dout != nullptr || din != nullptr || pre_gelu != nullptr ||
           gelu_input != nullptr;
  }
  bool any() const {
    return any_bf16() || keep_input_codes != nullptr || kept_input_codes != nullptr || in_amax != nullptr ||
           dout_amax != nullptr || in_codes != nullptr || dout_codes != nullptr || gelu_bias_grad != nullptr;
  }
};

class LinearPrecision {
 public:
  // recipe != Fp32. history / margin: fp8_delayed (margin also fp8_current).
  explicit LinearPrecision(Recipe recipe, int amax_history = 16, int margin = 0,
                           std::shared_ptr<PrecisionScratch> scratch = nullptr);

  Recipe recipe() const { return recipe_; }
  // The GEMM's name (model.layers.3.mlp.up_proj: PrecisionContext::make), for errors.
  void set_name(std::string name) { name_ = std::move(name); }
  // Per-tensor FP8 on a GPU: the forward product without the periodic promotion of its partial sums
  // (kernels::PrecisionGemm::fast_accumulation; Transformer Engine's default for forward GEMMs,
  // its gradients' products keeping the promotion). The CPU's sums are fp32 throughout either way.
  void set_forward_fast_accumulation(bool fast) { forward_fast_accumulation_ = fast; }
  // Where the layer's tensors live: the CPU emulates the recipe, a GPU runs its real formats.
  void set_device(Device device);
  Device device() const { return device_; }

  // Tensor parallelism: `sharded[op]` says this rank holds only a piece of operand op's global
  // tensor. fp8_current then scales such an operand by the max of the pieces' amaxes over
  // `group` (one all-reduce per prepare, so every rank of the group must prepare it in the same
  // order, as the parallel layers do). Block-scaled recipes need no reduction: their blocks stay
  // whole when the split falls on block boundaries, which the parallel layers check.
  void set_sharded_operands(comm::Communicator* group, std::array<bool, 3> sharded);

  // What GEMM `pass` reads for `op` = x [rows, cols] row-major: a quantize-dequantized copy in
  // the scratch (valid until the next prepare of the same operand). fp8_delayed records the
  // tensor's amax for the next scale update (pending_amax).
  const float* prepare(Operand op, GemmPass pass, const float* x, int64_t rows, int64_t cols);
  // Rounds a GEMM output to the recipe's activation dtype in place (bf16; fp16 for fp16).
  void round_output(float* data, int64_t n) const;
  // The bias as the recipe adds it to an output it rounds: rounded to the activation dtype first,
  // the 16-bit bias a bf16 / fp16 model holds (as Megatron, Transformer Engine and llm.c add it), so
  // the output is round(product + round(bias)); a copy in the shared scratch, valid until the next
  // call; null for null. forward() does this itself; a tensor-parallel sum of partial products adds
  // it after the sum (TensorParallel::exit_forward).
  const float* rounded_bias(const float* bias, int64_t n) const;

  // The same contracts as kernels::linear_forward / linear_backward, computed in the recipe.
  // The bias is added rounded (rounded_bias) and its gradient stays fp32; the output is rounded after
  // the bias is added.
  // `output` / `din_output` Partial: the forward output / input gradient stays fp32 (GemmOutput).
  // `accumulate_din` false: din is written whole instead of added into; `accumulate_dweight` false:
  // dweight likewise (a gradient zero_grads() left stale: ParameterStore::take_written_whole).
  // `tensors`: tensors given in bf16 instead of fp32 (takes_bf16_tensors only) or wanted in bf16
  // (gives_bf16_outputs only), and the input's kept FP8 codes (keeps_input_codes only): DeviceTensors.
  // `addend` (accumulate only; any device): out = addend + the output, the add reading addend
  // instead of out (a residual stream's input; kernels::PrecisionGemm::addend).
  void forward(float* out, const float* in, const float* weight, const float* bias, int64_t n, int64_t in_features,
               int64_t out_features, bool accumulate = false, GemmOutput output = GemmOutput::Rounded,
               const DeviceTensors& tensors = {}, const float* addend = nullptr);
  // `after_dgrad` (when given): called once, between dgrad and wgrad, when din is written (or queued
  // on the device), for the caller to start what needs din or is needed by wgrad only (a
  // column-parallel layer's collectives); also when there is nothing to compute.
  void backward(float* din, float* dweight, float* dbias, const float* dout, const float* in, const float* weight,
                int64_t n, int64_t in_features, int64_t out_features, GemmOutput din_output = GemmOutput::Rounded,
                bool accumulate_din = true, const DeviceTensors& tensors = {}, bool accumulate_dweight = true,
                const std::function<void()>& after_dgrad = {});

  // Whether forward / backward take DeviceTensors' bf16 tensors: the bf16 recipe on a GPU.
  bool takes_bf16_tensors() const { return device_.is_cuda() && recipe_ == Recipe::Bf16; }
  // Whether they accept the input in bf16 (DeviceTensors::in), for an input bf16-valued anyway:
  // under the bf16 recipe, and under per-tensor FP8 keeping its codes (keeps_input_codes: the
  // forward casts them from the bf16 values, wgrad multiplies them), on a GPU.
  bool accepts_bf16_input() const { return takes_bf16_tensors() || keeps_input_codes(); }
  // Whether they leave their outputs in bf16 (DeviceTensors' out, din): on a GPU every recipe whose
  // GEMMs round their outputs to bf16 (all but fp16).
  bool gives_bf16_outputs() const { return device_.is_cuda() && rounding() == kernels::OutputRounding::Bf16; }
  // Whether they take DeviceTensors' input codes: per-tensor FP8 (fp8_delayed, fp8_current) on a GPU.
  bool keeps_input_codes() const {
    return device_.is_cuda() && (recipe_ == Recipe::Fp8Delayed || recipe_ == Recipe::Fp8Current);
  }
  // The bytes of the input codes of a layer with `rows` tokens of `in_features` (0 when not kept).
  int64_t kept_input_bytes(int64_t rows, int64_t in_features) const {
    return keeps_input_codes() ? kernels::kept_operand_bytes(kernels::OperandCast::Fp8Tensor, rows, in_features) : 0;
  }
  // fp8_delayed on a GPU: each cast takes its operand's amax (for the history) from the read that
  // casts it (CastOperand::amax_out), its scale being known before; so no amax pass reads an
  // operand first, and a producer writing codes (produced_codes) takes none before them either.
  bool amax_taken_by_cast() const { return device_.is_cuda() && recipe_ == Recipe::Fp8Delayed; }
  // fp8_current on a GPU: an operand's amax is needed before its cast, so the kernel producing the
  // operand takes it where it can (produced_amax), rather than a pass over the operand of its own.
  bool amax_taken_by_producer() const { return device_.is_cuda() && recipe_ == Recipe::Fp8Current; }
  // Under per-tensor FP8 on a GPU (keeps_input_codes): the device float into which the kernel
  // producing operand `op` (Input or OutputGrad) takes its amax (kernels::amax_into's contract),
  // made ready for it (fp8_current's a zeroed float of its own, from the model's AmaxSlots;
  // fp8_delayed's is the operand's pending amax, which accumulates), to be handed back as
  // DeviceTensors' in_amax / dout_amax; null otherwise.
  float* produced_amax(Operand op);
  // Under per-tensor FP8 on a GPU (keeps_input_codes): where the kernel producing operand `op`
  // (Input or OutputGrad, [rows, cols]) writes its FP8 codes itself, under fp8_current after taking
  // its amax into produced_amax(op) (then reduced over the tensor-parallel group here when the
  // operand is split): `cast`, its format and scale (fp8_delayed's from the history, the amax
  // taken by the codes' own pass: amax_out; fp8_current's from that amax on the device); `codes`
  // for this layer's GEMM (handed back as DeviceTensors'
  // in_codes / dout_codes); `transposed` for its weight gradient (Input: `keep_input_codes`, the
  // memory the caller keeps to the backward; OutputGrad: the model's shared store, so no other
  // layer's backward may run between this call and this layer's). Each
  // kept_operand_bytes(Fp8Tensor, rows, cols) long.
  struct ProducedCodes {
    kernels::CastOperand cast;
    void* codes = nullptr;
    void* transposed = nullptr;
  };
  ProducedCodes produced_codes(Operand op, int64_t rows, int64_t cols, void* keep_input_codes = nullptr);

  // fp8_delayed: one DelayedScaling per operand. scale() is what prepare uses now (1 for the
  // other recipes); pending_amax() the largest amax seen since the last commit (Inf if any was
  // non-finite, 0 if none; on a device a read back, the trainer reads all layers' at once through
  // PrecisionContext). commit_amaxes updates each operand's history with amaxes[op] (the trainer
  // passes the max over all ranks) and clears the pending ones.
  bool delayed() const { return recipe_ == Recipe::Fp8Delayed; }
  float scale(Operand op) const;
  float pending_amax(Operand op) const;
  void commit_amaxes(const float* amaxes);
  // commit_amaxes without clearing the pending amaxes (PrecisionContext clears all layers' at once).
  void record_amaxes(const float* amaxes);
  void clear_pending();
  // On a device: where the 3 pending amaxes accumulate (device memory, by Operand), a slice of the
  // context's array; a layer made alone keeps its own.
  void set_pending_slots(float* slots) { device_pending_ = slots; }
  const precision::DelayedScaling& delayed_scaling(Operand op) const { return scaling_[static_cast<int>(op)]; }
  void restore_delayed(Operand op, const precision::DelayedScalingState& state);

 private:
  precision::Fp8Format format(Operand op) const;
  void quantize_fp8(Operand op, GemmPass pass, float* buf, int64_t rows, int64_t cols, float tensor_amax);
  float* output_scratch(int64_t n);
  kernels::OutputRounding rounding() const;
  // An Error unless `tensors` holds only what this layer takes (takes_bf16_tensors, keeps_input_codes).
  void check_device_tensors(const DeviceTensors& tensors) const;
  // The GPU path of forward / backward (linear_precision_device.cpp).
  void device_forward(float* out, const float* in, const float* weight, const float* bias, int64_t n,
                      int64_t in_features, int64_t out_features, bool accumulate, GemmOutput output,
                      const DeviceTensors& tensors, const float* addend);
  void device_backward(float* din, float* dweight, float* dbias, const float* dout, const float* in,
                       const float* weight, int64_t n, int64_t in_features, int64_t out_features,
                       GemmOutput din_output, bool accumulate_din, const DeviceTensors& tensors,
                       bool accumulate_dweight, const std::function<void()>& after_dgrad);
  // Operand `op` (n elements on the device: x, or x16 in bf16) cast as the recipe says;
  // fp8_delayed records its amax (taken by the GEMM's cast: amax_out). `given_amax`: the operand's
  // amax already in amax_slot(op), taken by its producer (DeviceTensors' in_amax / dout_amax): no
  // amax pass. `weight_amax`: fp8_current's weight amax as the optimizer's pass took it (its
  // OptimizerWeightCasts entry): no amax pass either.
  kernels::CastOperand device_operand(Operand op, const float* x, int64_t n, const void* x16 = nullptr,
                                      const float* given_amax = nullptr, float* weight_amax = nullptr);
  // A per-tensor FP8 forward's weight inside a step's scope: its entry among what the optimizer
  // writes, asked for the next update, and returned where the last one wrote it; else null.
  OptimizerWeightCasts::Entry* optimizer_written(kernels::LinearGemm pass, const float* weight, int64_t rows,
                                                 int64_t cols);
  // Per-tensor FP8 on a device: where operand op's amax is taken (fp8_current's float last handed
  // out for it: fresh_amax_slot; fp8_delayed's pending one); null under other recipes.
  float* amax_slot(Operand op);
  // fp8_current: a zeroed float of its own for operand op's next amax (AmaxSlots), amax_slot(op)
  // from now on.
  float* fresh_amax_slot(Operand op);
  // The weight cast cache's stores a GEMM writes (null: none), ready once it ran: its own form's,
  // and under per-tensor FP8 a forward's also dgrad's (PrecisionGemm::b_store_transposed).
  struct WrittenStores {
    WeightCastCache::Store* own = nullptr;
    WeightCastCache::Store* transposed = nullptr;
  };
  // g.b = the weight [out_features, in_features] for g.pass (forward or dgrad): its cast from the
  // weight cast cache when an earlier GEMM of the scope made it (no cast, no amax), else cast now
  // (into the cache's store inside a scope; a per-tensor FP8 forward into dgrad's too, from the
  // same read). Returns the stores to mark ready once g ran. `cast_apart` (a GEMM handed a group):
  // a bf16 weight not yet cast is cast into its store first, by a pass of its own, and read from
  // it, so the GEMM stays groupable.
  WrittenStores device_weight(kernels::PrecisionGemm& g, const float* weight, bool cast_apart = false);
  // Runs g, marking `stores` ready; or, when it writes no store and is groupable, adds it to
  // `group` (when given) to run with the group's others.
  void run_device_gemm(const kernels::PrecisionGemm& g, WrittenStores stores, GemmGroup* group = nullptr);
  // fp8_delayed on a device: the 3 pending amaxes in device memory.
  float* device_pending();
  // The amax of operand `op`'s global tensor from this rank's piece's `local` amax.
  float global_amax(Operand op, float local) const;
  // Whether operand op's amax is the max over the tensor-parallel group (fp8_current's pieces).
  bool reduces_over_tensor_parallel(Operand op) const;

  Recipe recipe_;
  std::string name_;
  Device device_ = Device::cpu();
  int margin_;
  bool forward_fast_accumulation_ = false;
  std::shared_ptr<PrecisionScratch> scratch_;
  comm::Communicator* tp_group_ = nullptr;
  std::array<bool, 3> sharded_ = {false, false, false};  // by Operand
  std::vector<precision::DelayedScaling> scaling_;  // fp8_delayed: by Operand
  float pending_[3] = {0.0f, 0.0f, 0.0f};           // on the CPU
  float* device_pending_ = nullptr;                 // on a device (set_pending_slots, or own_pending_)
  std::array<float*, 3> current_amax_ = {nullptr, nullptr, nullptr};  // fp8_current on a device: by Operand
  Buffer own_pending_;
};

// The linear layers of one model (blocks in order, then the head) and their shared scratch; the
// trainer reduces their pending amaxes over the ranks once per step and checkpoints their state.
class PrecisionContext {
 public:
  explicit PrecisionContext(PrecisionPolicy policy = {});
  const PrecisionPolicy& policy() const { return policy_; }
  // The device of every layer's tensors, made so far and from now on (the CPU by default).
  void set_device(Device device);
  // A new layer's precision, registered here under the GEMM's name (model.layers.3.mlp.up_proj);
  // nullptr for Fp32 (the layer then calls the fp32 kernels directly).
  std::shared_ptr<LinearPrecision> make(Recipe recipe, const std::string& name);
  const std::vector<std::shared_ptr<LinearPrecision>>& layers() const { return layers_; }
  // The weights' casts kept across a training step's GEMMs on a device (weight_cast_cache.h):
  // the step opens it before its first micro-batch and closes it before its optimizer step.
  WeightCastCache& weight_casts() { return scratch_->weight_casts; }
  // What the optimizer writes of the per-tensor FP8 weights for the next step (optimizer_weight_casts.h).
  OptimizerWeightCasts& optimizer_weight_casts() { return scratch_->optimizer_casts; }

  // fp8_delayed bookkeeping over all layers, 3 values per delayed layer in registration order
  // (on a device: one read of the array they accumulate in).
  bool has_delayed() const;
  std::vector<float> pending_amaxes() const;
  void commit_amaxes(const std::vector<float>& amaxes);
  void clear_pending();
  // Delayed-scaling histories for checkpoints, by GEMM name (null when no layer has any), so a
  // pipeline stage saves and restores its own layers' whatever the layout. restore() needs every
  // delayed layer of this model in the state (an Error naming the first missing one); entries of
  // layers another stage holds are left to it.
  nlohmann::json state() const;
  void restore(const nlohmann::json& state);

 private:
  PrecisionPolicy policy_;
  std::shared_ptr<PrecisionScratch> scratch_;
  std::vector<std::shared_ptr<LinearPrecision>> layers_;
  std::vector<std::string> names_;  // by layer
  Device device_ = Device::cpu();
  // On a device: the delayed layers' pending amaxes, 3 per delayed layer in registration order
  // (remade, zeroed, when a layer is made or the device changes: before any GEMM runs).
  Buffer device_pending_;
  void place_device_pending();
};

}  // namespace loom::model
