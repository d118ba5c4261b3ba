#pragma once
// Memory of every rank of a layout before anything is allocated, by category. The parameters
// each pipeline stage's tensor-parallel rank holds come from the model's own registration pass
// (Transformer::parameter_list on a shapes-only store), so any model size plans in milliseconds;
// model state per parameter follows parallel/data/memory_accounting.h (Megatron's 18 bytes for
// mixed-precision Adam, 6 + 12/d with the distributed optimizer); activations per micro-batch
// follow activation_memory.h, times the micro-batches the pipeline schedule holds at once.
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "loom/config/run_config.h"
#include "loom/model/parameters.h"
#include "loom/model/tensor_parallel.h"
#include "loom/model/transformer.h"
#include "loom/parallel/data/memory_accounting.h"
#include "loom/plan/layer_widths.h"
#include "loom/plan/layout.h"

namespace loom::plan {

// A stage rank's parameters (model::Transformer::parameter_list) and the layer widths read off
// them (layer_widths).
struct StageParameters {
  std::vector<model::Parameter> params;
  std::vector<LayerWidths> widths;
};
StageParameters stage_parameters(const config::ModelConfig& model, const model::TensorParallel& tp,
                                 const std::vector<model::LayerRange>& chunks, int ep);

// The stage parameters a layout search shares between the layouts it plans on one model: a model
// of many experts registers tens of thousands of parameters, and a mesh's micro-batch sizes, ZeRO
// stages and recompute settings all plan on the same ones. Serves one model (the mesh and the
// chunks are the key); keeps the last few.
class StageParameterLists {
 public:
  const StageParameters& of(const config::ModelConfig& model, const model::TensorParallel& tp,
                            const std::vector<model::LayerRange>& chunks, int ep);

 private:
  struct Kept {
    int tp = 1, ep = 1;
    bool sequence_parallel = false;
    std::vector<model::LayerRange> chunks;
    StageParameters stage;
  };
  std::deque<Kept> kept_;
};

struct MemoryOptions {
  int64_t activation_bytes = 4;  // per activation element: 4 = the CPU backend's fp32
  bool attention_probs = false;  // true: an attention kernel that keeps its probabilities (b x heads x s^2)
  int64_t kv_batch = 0;          // serving: KV cache for this many sequences ...
  int64_t kv_seq = 0;            // ... of this many positions (0 = none)
  int64_t kv_bytes = 2;          // per cached element
  StageParameterLists* parameter_lists = nullptr;  // a layout search's (null: each plan makes its own)
};

// One pipeline stage's rank (tensor-parallel rank 0, data-parallel rank 0).
struct StageMemory {
  int stage = 0;
  std::vector<model::LayerRange> chunks;
  int64_t parameter_count = 0;          // this rank's parameters (elements)
  parallel::MemoryBytes state;          // parameters, gradients, master weights, moments, comm buffers
  int64_t gather_buffers = 0;           // ZeRO-2/3 and compact parameters: full units resident in flight
  int64_t activations_per_micro_batch = 0;  // one micro-batch through all of this rank's chunks
  int in_flight = 1;                    // micro-batch chunks held at once (pipeline schedule)
  int activation_sets = 1;              // pooled sets the schedule makes (in flight + retiring)
  int64_t activations = 0;              // the sets' buffers (activation_pool.h)
  int64_t workspace = 0;
  int64_t kv_cache = 0;
  std::vector<LayerWidths> widths;      // this rank's widths by global layer (its linears' shapes)
  int64_t head_rows = 0;                // output head rows it holds (0: no head)
  // Per micro-batch, the elements of each fp32 all-reduce over the tensor-parallel group that
  // sums gradients several ranks hold (activation_memory.h: tensor_parallel_gradient_sums).
  std::vector<int64_t> tp_gradient_sums;
  int64_t total() const { return state.total() + gather_buffers + activations + workspace + kv_cache; }
};

struct MemoryPlan {
  PlannedLayout layout;
  std::vector<StageMemory> stages;
  int64_t peak() const;  // the largest rank's total
};

// config.model.vocab_size must be resolved; `shape` checked (train::check_layout).
MemoryPlan plan_memory(const config::RunConfig& config, comm::MeshShape shape, const MemoryOptions& options = {});

}  // namespace loom::plan
