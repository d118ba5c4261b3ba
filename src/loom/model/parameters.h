#pragma once
// ParameterStore: every parameter of a model with its global identity (Hugging Face name,
// global shape), laid out back to back in one flat fp32 buffer, with a gradient buffer of the
// same layout. Flat buffers make the optimizer one loop and gradient buckets (DDP/ZeRO) slices.
// Both buffers live on the store's device and are allocated through its allocator
// (core/device.h). A store made with Allocation::ShapesOnly only records the list: building a
// model on it gives every parameter's name, shape and placement and allocates nothing.
//
// Gradients written whole: a linear layer's weight gradient is one GEMM per micro-batch, which
// can write its output instead of adding into a zeroed one. For such ranges (mark_written_whole)
// zero_grads() writes nothing: their parameters become stale, reading as zero to whoever takes
// them first. The layer takes them in its backward (take_written_whole: write, not add); whatever
// is still stale when a unit's backward ends is zeroed then (settle_grads), before any reader.
// A step so skips zeroing those gradients and its first wgrad GEMMs skip reading them.
#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "loom/core/device.h"
#include "loom/core/tensor.h"
#include "loom/model/shard_spec.h"

namespace loom::model {

// MambaALog / MambaDtBias: Mamba-2's per-head A in [1, 16] (stored as log A) and dt bias
// (softplus^-1 of dt log-spaced in [0.001, 0.1]), spread deterministically over the global heads.
enum class Init : uint8_t { Normal, Ones, Zeros, MambaALog, MambaDtBias };

struct Parameter {
  std::string name;   // e.g. model.layers.3.mlp.up_proj.weight
  Shape shape;        // this rank's shape (the global shape unless tensor-parallel split)
  int64_t offset = 0; // into the flat buffers
  int64_t numel = 0;
  Init init = Init::Normal;
  float init_std = 0.0f;
  bool weight_decay = true;  // matrices decay; norms and biases do not
  float lr_scale = 1.0f;     // the optimizer's learning rate times this (the MoE router's own rate)
  ShardSpec shard;           // tensor-parallel placement (default: a full copy)
  const Shape& global_shape() const { return model::global_shape(shard, shape); }
};

class ParameterStore {
 public:
  enum class Allocation : uint8_t { Buffers, ShapesOnly };
  explicit ParameterStore(Device device = Device::cpu(), Allocation allocation = Allocation::Buffers)
      : device_(device), allocation_(allocation) {}

  // Registers a parameter (before allocate()); returns its id. Consecutive registrations are
  // adjacent in memory, which modules use to fuse q/k/v and gate/up projections into one GEMM.
  int add(const std::string& name, Shape shape, Init init, float init_std = 0.0f, ShardSpec shard = {});
  // Allocates the zeroed values and gradients (nothing for a ShapesOnly store).
  void allocate();
  // This parameter's learning rate is the schedule's times `scale` (before allocate()).
  void set_lr_scale(int id, float scale) { params_[id].lr_scale = scale; }

  // Initial values depend only on (seed, name, global element index): Philox, not a stream, so
  // a tensor-parallel shard holds exactly its slice of the unsplit model.
  void initialize(uint64_t seed);

  float* value(int id) { return values_.data() + params_.at(id).offset; }
  const float* value(int id) const { return values_.data() + params_.at(id).offset; }
  float* grad(int id) { return grads_.data() + params_.at(id).offset; }

  float* values() { return values_.data(); }
  const float* values() const { return values_.data(); }
  float* grads() { return grads_.data(); }
  // Every gradient reads as zero from now on: zeroed, or stale where written whole (above).
  void zero_grads();

  // The gradient range [offset, offset + numel), whole parameters, is written whole by the layer
  // that owns it in its first backward after zero_grads() (above).
  void mark_written_whole(int64_t offset, int64_t numel);
  // Whether the caller may write [offset, offset + numel) (whole parameters) instead of adding
  // into it: true when all of it is stale (then no longer); otherwise its stale parameters are
  // zeroed and the caller adds.
  bool take_written_whole(int64_t offset, int64_t numel);
  // Zeroes the stale gradients among `ids`: before anyone reads them.
  void settle_grads(std::span<const int> ids);
  // Whether zero_grads() left parameter `id`'s gradient unwritten, not yet taken or settled.
  bool stale(int id) const { return static_cast<size_t>(id) < stale_.size() && stale_[static_cast<size_t>(id)] != 0; }
  // Both buffers are releasable memory (core/device.h): ZeRO 2 and 3 decommit ranges of them.
  // Before the values are written whole again (a checkpoint load), they are committed.
  void commit_values() {
    if (total_ > 0) allocator(device_).commit(values_.data(), values_.bytes());
  }

  Device device() const { return device_; }
  bool shapes_only() const { return allocation_ == Allocation::ShapesOnly; }

  int64_t total() const { return total_; }
  const std::vector<Parameter>& list() const { return params_; }
  int find(const std::string& name) const;  // -1 when absent

 private:
  // The parameters whose ranges make up [offset, offset + numel) (checked to be whole ones).
  std::pair<int, int> ids_spanning(int64_t offset, int64_t numel) const;
  // Zeroes the stale parameters among `ids` (one device call): stale no longer.
  void zero_stale(std::span<const int> ids);

  std::vector<Parameter> params_;
  // params_' ids by name: a model of many experts holds tens of thousands of parameters, which
  // add()'s duplicate check and find() would otherwise compare one by one.
  std::unordered_map<std::string, int> ids_by_name_;
  int64_t total_ = 0;
  Device device_;
  Allocation allocation_;
  bool allocated_ = false;
  DeviceBuffer<float> values_, grads_;
  std::vector<uint8_t> written_whole_, stale_;  // by parameter id (empty: none written whole)
  int64_t stale_count_ = 0;
};

}  // namespace loom::model
