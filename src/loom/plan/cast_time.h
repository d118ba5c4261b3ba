#pragma once
// The time the precision recipes' casts of GEMM operands take (loom plan time): each linear's
// inputs, weights and output gradients copied and cast, its outputs rounded, as the CPU's
// emulation does them or as a GPU does (runtime.device: cuda), which hands many of them over in
// bf16 or as FP8 codes its producers write, and casts each weight once per optimizer step.
#include "loom/config/run_config.h"
#include "loom/model/linear_precision.h"
#include "loom/plan/block_linears.h"
#include "loom/plan/hardware.h"
#include "loom/plan/memory_plan.h"

namespace loom::plan {

// Where a run casts its GEMM operands: the CPU's emulation, or a GPU (runtime.device: cuda),
// whose weight cast cache casts each weight once per optimizer step and form
// (model/weight_cast_cache.h) for the step's `micro_batches`.
struct CastPath {
  bool device = false;
  double micro_batches = 1.0;
  bool bf16_logits = false;  // the head's logits kept bf16 (activation_memory.h: bf16_logits_on_device)
  // Attention::bf16_tensors in the bf16 and per-tensor FP8 blocks: bf16 attention operands, no
  // context parallelism
  bool bf16_attention = false;
  // Attention::bf16_gradients, with those: the q/k/v gradient bf16 (but under RoPE with a bias)
  bool bf16_qkv_gradient = false;
  // Mlp::fp8_codes_from_activation under per-tensor FP8 (no biases), and whether the MLP is SwiGLU
  bool mlp_codes = false;
  bool swiglu = false;
  // Norm::forward_codes under per-tensor FP8 (no sequence parallelism): the norms write the q/k/v
  // and up projections' codes, fp8_current's amax taken by their statistics pass
  bool normed_codes = false;
  // The optimizer's bf16 copy of the parameters (parallel::keeps_bf16_parameter_copy): no bf16
  // weight is cast at all
  bool bf16_weight_copy = false;
  // The optimizer's pass writes the per-tensor FP8 weights' amaxes, and fp8_delayed's codes
  // (parallel::keeps_fp8_weight_casts): fp8_current's weights are cast with no amax pass, and
  // fp8_delayed's not at all, the update writing their two 1-byte codes instead
  bool fp8_weights_from_optimizer = false;
  // One tensor-parallel rank: the q/k/v and up projections leave their input gradients (the norms'
  // output gradients) bf16 (ColumnParallelLinear::gives_bf16_input_grad)
  bool bf16_normed_grad = false;
  // No sequence parallelism: the norm backwards take the residual stream's gradient's amax for
  // the output projections that cast it next (RowParallelLinear::takes_output_grad_amax)
  bool residual_grad_amax = false;
};

// The tensors a block's linear hands over in bf16 (or as codes) on a GPU, whose casts and
// widenings are not made (LinearPrecision's DeviceTensors).
struct Bf16Ends {
  bool output = false;       // the forward's output left bf16: no widening
  bool output_grad = false;  // the output gradient given bf16: no cast
  bool input = false;        // the input given bf16: no cast for the forward, wgrad or a recompute
  bool input_grad = false;   // the input gradient left bf16: no widening
  bool input_bf16 = false;   // per-tensor FP8's input read from bf16: its amax and cast read 2 bytes, not 4
  // Per-tensor FP8's input / output gradient whose producer took its amax (DeviceTensors' in_amax,
  // dout_amax): its cast reads it once, with no amax pass.
  bool input_amax = false;
  bool output_grad_amax = false;
  // Per-tensor FP8's output gradient whose producer writes its codes itself (the MLP's activation:
  // Mlp::fp8_codes_from_activation), in bytes per element beyond the activation's own backward
  // (counted among the elementwise work): a second read of what it reads (SwiGLU: 3 bytes per
  // hidden element, GELU and squared ReLU 4) and the codes' two writes, less the fp32 gradient's
  // write (4); its input's codes cost a cast whose amax was given (for SwiGLU: a second read of the
  // hidden, 4 bytes, and the two writes; GELU's and squared ReLU's move 4 of those 6), the fp32
  // activation no longer being kept (activation_memory.h) nor read. Under fp8_delayed the codes'
  // pass takes the amax itself and the activation's amax-only pass before it goes: its read is
  // taken off (output_grad_produced less the read; input_pass_saved for the down projection).
  bool output_grad_produced = false;
  double output_grad_produced_bytes = 0.0;
  double input_pass_saved = 0.0;  // bytes per input element
  // The output gradient (the residual stream's) given bf16 by the norm backward that wrote it
  // (model::ResidualGradForReader): of its 16-bit cast (4 bytes read, 2 written) only the norm's 2-byte
  // write is left.
  bool output_grad_from_norm = false;
};

// The GPU path's bf16 hand-overs for this config (a CPU run: none).
CastPath cast_path(const config::RunConfig& config, double micro_batches, int tp);
// What a block's linear of `role` under recipe `r` hands over in bf16 on a GPU.
Bf16Ends device_bf16_ends(const CastPath& path, model::Recipe r, LinearRole role);

// Casts of every linear of this rank's layers and head, per micro-batch (seconds), over `tokens`
// rows of a micro-batch at tensor-parallel size `tp`, a step of `micro_batches`.
double cast_seconds(const config::RunConfig& config, const StageMemory& stage, double tokens, double micro_batches,
                    int tp, const Hardware& hw);

}  // namespace loom::plan
