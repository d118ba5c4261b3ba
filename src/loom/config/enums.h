#pragma once
// The config keys whose values form a closed set of names, as enums. Each enum has one table of
// its names, indexed by the value (`names(E{})`, found by argument-dependent lookup); the config
// parses a name into its value once, when it is read, and writes the same name back.
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "loom/core/error.h"

namespace loom::config {

// runtime.backend: how ranks start and talk (comm/launch.h).
enum class Backend : uint8_t { Threads, Mpi, Auto };
constexpr std::array<std::string_view, 3> names(Backend) { return {"threads", "mpi", "auto"}; }

// runtime.device: where each rank's model trains: the host, or its GPU (docs/cuda.md).
enum class RuntimeDevice : uint8_t { Cpu, Cuda };
constexpr std::array<std::string_view, 2> names(RuntimeDevice) { return {"cpu", "cuda"}; }
// runtime.device_comm: how a GPU run's collectives on device memory travel.
enum class DeviceComm : uint8_t { Host, Nccl };
constexpr std::array<std::string_view, 2> names(DeviceComm) { return {"host", "nccl"}; }

// precision.recipe: what the GEMMs of linear layers compute in (model/linear_precision.h).
enum class PrecisionRecipe : uint8_t { Fp32, Bf16, Fp16, Fp8Delayed, Fp8Current, Fp8Blockwise, Mxfp8 };
constexpr std::array<std::string_view, 7> names(PrecisionRecipe) {
  return {"fp32", "bf16", "fp16", "fp8_delayed", "fp8_current", "fp8_blockwise", "mxfp8"};
}

// precision.attention: what attention's products take (kernels::AttentionOperands): auto (bf16
// under the bf16, FP8 and MX recipes, fp32 under fp32 and fp16), fp32 or bf16.
enum class AttentionPrecision : uint8_t { Auto, Fp32, Bf16 };
constexpr std::array<std::string_view, 3> names(AttentionPrecision) { return {"auto", "fp32", "bf16"}; }

// precision.grad_reduce: the dtype of the data-parallel gradient reduction.
enum class GradReduce : uint8_t { Fp32, Bf16 };
constexpr std::array<std::string_view, 2> names(GradReduce) { return {"fp32", "bf16"}; }

// parallel.outer: none, or DiLoCo's outer optimizer across sites (parallel/data/diloco.h).
enum class OuterOptimizer : uint8_t { None, Diloco };
constexpr std::array<std::string_view, 2> names(OuterOptimizer) { return {"none", "diloco"}; }

// precision.param_dtype: the model's parameters hold the fp32 master weights, or them rounded to
// the recipe's compute dtype.
enum class ParamDtype : uint8_t { Fp32, Compute };
constexpr std::array<std::string_view, 2> names(ParamDtype) { return {"fp32", "compute"}; }

// parallel.pipeline_schedule (parallel/pipeline/pipeline_schedule.h).
enum class PipelineScheduleKind : uint8_t { GPipe, OneFOneB, Interleaved };
constexpr std::array<std::string_view, 3> names(PipelineScheduleKind) { return {"gpipe", "1f1b", "interleaved"}; }

// parallel.cp_comm: how attention spans a context-parallel group (parallel/context/): key/value
// blocks passed around a ring (p2p), or all-to-all from sequence- to head-sharded (a2a, Ulysses).
enum class ContextComm : uint8_t { P2p, A2a };
constexpr std::array<std::string_view, 2> names(ContextComm) { return {"p2p", "a2a"}; }

// model.norm: RMSNorm or LayerNorm.
enum class Norm : uint8_t { Rms, Layer };
constexpr std::array<std::string_view, 2> names(Norm) { return {"rms", "layer"}; }

// model.activation of the MLP.
enum class Activation : uint8_t { Swiglu, Gelu, Relu2 };
constexpr std::array<std::string_view, 3> names(Activation) { return {"swiglu", "gelu", "relu2"}; }

// model.positions: rotary embeddings, a learned position table, or none (attention sees no
// positions; Nemotron-H's attention layers, whose Mamba layers carry the order).
enum class Positions : uint8_t { Rope, Learned, None };
constexpr std::array<std::string_view, 3> names(Positions) { return {"rope", "learned", "none"}; }

// model.rope_scaling: plain RoPE, Llama 3.1's frequency rescaling, or YaRN (docs/interop.md).
enum class RopeScaling : uint8_t { None, Llama3, Yarn };
constexpr std::array<std::string_view, 3> names(RopeScaling) { return {"none", "llama3", "yarn"}; }

// model.block_configs[i].attention: the layer has an attention sub-block, or skips it.
enum class BlockAttention : uint8_t { Normal, Skip };
constexpr std::array<std::string_view, 2> names(BlockAttention) { return {"normal", "skip"}; }

// model.block_configs[i].ffn: the layer's feed-forward sub-block is the model's default (a
// mixture of experts when model.moe_experts > 0, else dense), dense, or a mixture of experts.
enum class BlockFfn : uint8_t { Default, Dense, Moe };
constexpr std::array<std::string_view, 3> names(BlockFfn) { return {"default", "dense", "moe"}; }

// model.moe_router: softmax over the top-k logits (Megatron's default), softmax over every
// expert then top-k, or sigmoid scores (selection may add the expert bias; weights normalised
// over the top-k).
enum class MoeRouter : uint8_t { TopkSoftmax, SoftmaxTopk, Sigmoid };
constexpr std::array<std::string_view, 3> names(MoeRouter) { return {"topk_softmax", "softmax_topk", "sigmoid"}; }

// model.moe_aux_loss: the token set the load-balancing loss is defined over.
enum class MoeAuxLoss : uint8_t { MicroBatch, Sequence, Global };
constexpr std::array<std::string_view, 3> names(MoeAuxLoss) { return {"micro_batch", "sequence", "global"}; }

// model.moe_drop_policy: which tokens an expert over capacity keeps (highest weight, or first).
enum class MoeDropPolicy : uint8_t { Probs, Position };
constexpr std::array<std::string_view, 2> names(MoeDropPolicy) { return {"probs", "position"}; }

// optim.schedule: the learning rate's shape after warm-up (Megatron's --lr-decay-style).
enum class LrSchedule : uint8_t { Cosine, Constant, Linear, InverseSquareRoot, Wsd };
constexpr std::array<std::string_view, 5> names(LrSchedule) {
  return {"cosine", "constant", "linear", "inverse_square_root", "wsd"};
}

// optim.wsd_decay_style: the shape of a warmup-stable-decay schedule's final annealing
// (Megatron's --lr-wsd-decay-style).
enum class WsdDecay : uint8_t { Exponential, Linear, Cosine, MinusSqrt };
constexpr std::array<std::string_view, 4> names(WsdDecay) { return {"exponential", "linear", "cosine", "minus_sqrt"}; }

// sft.bad_lines: a chat data line that is not a conversation stops the run, or is skipped.
enum class BadLines : uint8_t { Fail, Skip };
constexpr std::array<std::string_view, 2> names(BadLines) { return {"fail", "skip"}; }

// sft.split_turns: when a conversation becomes one example per trained message (its history
// rendered as the prompt the model is given for it): never, only where the template rewrites
// earlier turns (Qwen 3 drops earlier answers' thinking), or always.
enum class SplitTurns : uint8_t { Never, Unstable, Always };
constexpr std::array<std::string_view, 3> names(SplitTurns) { return {"never", "unstable", "always"}; }

// sft.overlong: a conversation longer than data.seq_len is cut to it, or left out.
enum class Overlong : uint8_t { Truncate, Drop };
constexpr std::array<std::string_view, 2> names(Overlong) { return {"truncate", "drop"}; }

template <class E>
concept NamedEnum = std::is_enum_v<E> && requires { names(E{}); };

// Every value of E, in declaration order.
template <NamedEnum E>
constexpr auto all_values() {
  std::array<E, names(E{}).size()> values{};
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<E>(i);
  return values;
}

template <NamedEnum E>
constexpr std::string_view name_of(E value) {
  return names(E{})[static_cast<size_t>(value)];
}

template <NamedEnum E>
std::string to_string(E value) {
  return std::string(name_of(value));
}

template <NamedEnum E>
std::ostream& operator<<(std::ostream& out, E value) {
  return out << name_of(value);
}

// The value named `text`, or nothing.
template <NamedEnum E>
constexpr std::optional<E> from_name(std::string_view text) {
  const auto all = names(E{});
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i] == text) return static_cast<E>(i);
  }
  return std::nullopt;
}

// Why `text` is none of `names`: "must be one of a, b, c", plus "; did you mean 'b'?" when it
// is plausibly a typo of one of them (the message of every closed-set config key).
std::string one_of_message(std::string_view text, std::span<const std::string_view> names);

// "<key> = 'text' is invalid: <one_of_message>".
std::string unknown_name_message(const std::string& key, std::string_view text,
                                 std::span<const std::string_view> names);

// The value named `text`; anything else is an Error naming `key`, the valid names and the
// closest one.
template <NamedEnum E>
E parse_name(std::string_view text, const std::string& key) {
  if (auto value = from_name<E>(text)) return *value;
  throw Error(unknown_name_message(key, text, names(E{})));
}

}  // namespace loom::config
