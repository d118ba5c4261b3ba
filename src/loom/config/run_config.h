#pragma once
// RunConfig: every setting of a run, parsed from YAML plus `section.key=value` overrides and
// validated (unknown keys, wrong types and out-of-range values are errors) before any work starts.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "loom/config/enums.h"
#include "loom/config/grpo_config.h"
#include "loom/core/tokenizer_names.h"

namespace loom::config {

// One layer's overrides of the model defaults (Nemotron Super `block_configs`).
struct BlockConfig {
  BlockAttention attention = BlockAttention::Normal;  // normal | skip (the layer has no attention sub-block)
  int kv_heads = 0;                  // 0 = model.kv_heads
  int ffn_size = -1;                 // -1 = model.ffn_size; 0 = the layer has no MLP sub-block
  BlockFfn ffn = BlockFfn::Default;  // default | dense | moe
};

// Mixture of experts (Megatron-Core's MoE; model.moe_* keys). Layers with a feed-forward
// sub-block are MoE layers when experts > 0, unless block_configs says `ffn: dense`.
struct MoeConfig {
  int experts = 0;                  // routed experts per MoE layer; 0 = no MoE layers
  int top_k = 2;                    // experts per token
  int ffn_size = 0;                 // each expert's ffn size; 0 = model.ffn_size
  int shared_ffn_size = 0;          // the shared expert's ffn size (sees every token); 0 = none
  bool shared_expert_gate = false;  // the shared expert's output times sigmoid(x . g), g [1, d_model] (Qwen2-MoE)
  int latent_size = 0;              // experts work in this size (hidden -> latent -> hidden); 0 = d_model
  MoeRouter router = MoeRouter::TopkSoftmax;  // topk_softmax | softmax_topk | sigmoid
  double topk_scaling = 1.0;        // the combine weights times this
  bool expert_bias = false;         // aux-loss-free balancing: a per-expert bias added for selection only
  double bias_update_rate = 1e-3;   // bias += rate * sign(mean load - load), once per global batch
  double router_lr_scale = 1.0;     // the router weight's learning rate, times optim.lr's schedule
  MoeAuxLoss aux_loss = MoeAuxLoss::MicroBatch;  // micro_batch | sequence | global
  double aux_loss_coeff = 0.0;      // load-balancing loss weight; 0 = none
  double z_loss_coeff = 0.0;        // router z-loss weight; 0 = none
  double capacity_factor = 0.0;     // tokens an expert takes per routing group, x mean; 0 = dropless
  MoeDropPolicy drop_policy = MoeDropPolicy::Probs;  // probs | position
};

// Mamba-2 mixers of a hybrid model (`model.mamba.*`, Nemotron-H's mamba_* / ssm_state_size /
// n_groups / conv_kernel / chunk_size / expand).
struct MambaConfig {
  int state_size = 16;   // N: state per head channel (ssm_state_size)
  int heads = 0;         // 0 = expand * d_model / head_dim
  int head_dim = 16;     // P
  int groups = 1;        // B and C are shared by heads / groups heads (n_groups)
  int conv_kernel = 4;   // taps of the causal depthwise convolution (d_conv)
  int chunk_size = 64;   // tokens per block of the chunked scan
  int expand = 2;        // inner width = expand * d_model when heads = 0
};

struct ModelConfig {
  int vocab_size = 256;       // 0 = take it from the tokenizer
  int d_model = 256;
  int layers = 4;
  int heads = 4;
  int kv_heads = 0;           // 0 = heads (multi-head attention)
  int ffn_size = 1024;
  Norm norm = Norm::Rms;                          // rms | layer
  Activation activation = Activation::Swiglu;     // swiglu | gelu
  Positions positions = Positions::Rope;          // rope | learned | none (attention without positions, as Nemotron-H's)
  bool tied_embeddings = true;
  bool bias = false;                  // biases in linear layers (GPT-2)
  int max_seq_len = 256;
  double rope_theta = 10000.0;
  // Longer contexts than training saw: rescaled RoPE frequencies (Hugging Face's rope_scaling).
  RopeScaling rope_scaling = RopeScaling::None;  // none | llama3 | yarn
  double rope_scaling_factor = 1.0;        // context extension factor (llama3, yarn)
  double rope_low_freq_factor = 1.0;       // llama3
  double rope_high_freq_factor = 4.0;      // llama3
  int rope_original_max_positions = 8192;  // the context the model was pre-trained with (llama3, yarn)
  double rope_beta_fast = 32.0;            // yarn
  double rope_beta_slow = 1.0;             // yarn
  bool qkv_bias = false;              // biases in the q/k/v projections only (Qwen 2)
  double norm_eps = 1e-5;
  double init_std = 0.02;
  bool recompute = false;             // activation checkpointing per block
  std::vector<BlockConfig> block_configs;  // empty, or one entry per layer
  // Nemotron-H's hybrid_override_pattern, one character per layer: M Mamba-2, * attention,
  // - MLP, E MoE; empty = every layer attention + MLP.
  std::string layer_pattern;
  MambaConfig mamba;
  MoeConfig moe;
  // Multi-token prediction (DeepSeek-V3, Nemotron 3): extra modules on top of the model, depth k
  // predicting the token 1 + k positions ahead; their mean loss times mtp_loss_weight joins the
  // training loss. 0 = none.
  int mtp_depths = 0;
  double mtp_loss_weight = 0.3;
  // One depth's weights applied at every depth (Megatron-Core's mtp_use_repeated_layer, as
  // Nemotron 3 Super trains them): the checkpoint holds mtp.layers.0 alone.
  bool mtp_use_repeated_layer = false;
};

// One dataset of a weighted blend (data.train_blend, data.val_blend).
struct BlendEntry {
  std::string prefix;   // indexed dataset prefix (path without .bin/.idx)
  double weight = 1.0;  // its share of the samples, relative to the other entries' weights
};

// data.split (Megatron's --split "969,30,1"): each training dataset's sequences cut, in order,
// into train, validation and test parts in proportion to up to three shares (data/dataset_split.h).
// Empty: no split (the training datasets are trained on whole).
struct DataSplit {
  std::vector<double> shares;
  bool on() const { return !shares.empty(); }
  bool operator==(const DataSplit&) const = default;
};

struct DataConfig {
  std::string tokenizer = kDefaultTokenizer;  // one of loom::known_tokenizers() or hf:<dir> (core/tokenizer_names.h)
  std::string train_prefix;        // indexed dataset prefix (path without .bin/.idx)
  std::string val_prefix;          // empty = no validation
  // Weighted blends of datasets in place of train_prefix / val_prefix (Megatron's
  // --data-path w1 p1 w2 p2 ...; data/blend_index.h): each sample comes from one dataset, each
  // dataset's share of any stretch of samples following its weight.
  std::vector<BlendEntry> train_blend, val_blend;
  // The test set (Megatron's --test-data-path): evaluated once, after the last step. Empty = none.
  std::string test_prefix;
  std::vector<BlendEntry> test_blend;
  DataSplit split;  // validation and test parts of the training datasets, in place of the four above
  int seq_len = 128;
  // Megatron's document options for samples that span documents (docs/packing.md): positions
  // restart at 0 after each document end, no attention across one, no loss on targets predicted
  // from an end-of-document token.
  bool reset_position_ids = false;
  bool reset_attention_mask = false;
  bool eod_mask_loss = false;
};

struct OptimConfig {
  double lr = 3e-4;
  double min_lr = 3e-5;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  int warmup_steps = 0;
  LrSchedule schedule = LrSchedule::Cosine;  // cosine | linear | wsd | inverse_square_root | constant
  int decay_steps = 0;              // the decay reaches min_lr at this step, and stays; 0 = train.steps
  int wsd_decay_steps = 0;          // wsd: the annealing's steps, ending at the decay's end
  // A run measured in samples (train.samples) counts its schedule in samples consumed (Megatron's
  // --lr-warmup-samples, --lr-decay-samples, --lr-wsd-decay-samples) in place of the three above.
  int64_t warmup_samples = 0;
  int64_t decay_samples = 0;        // 0 = train.samples
  int64_t wsd_decay_samples = 0;
  WsdDecay wsd_decay_style = WsdDecay::Exponential;  // wsd: exponential | linear | cosine | minus_sqrt
  double clip_grad = 1.0;           // 0 = no clipping
  // The optimizer's moments in host memory and its update on the host's cores, for a run on a GPU
  // (Megatron-Core's --optimizer-cpu-offload, DeepSpeed's ZeRO-Offload): 8 bytes per owned
  // parameter off the device, the gradients and values copied down and the values back each step.
  bool cpu_offload = false;
  // With cpu_offload: the share of each rank's optimizer state in host memory, its first elements
  // (Megatron-Core's --optimizer-offload-fraction); the rest stays on the device and is updated there.
  double offload_fraction = 1.0;
};

// train.rampup_batch_size (Megatron's --rampup-batch-size START INCREMENT SAMPLES): the global
// batch starts at `start` sequences and grows by `increment` in equal shares of the first `samples`
// samples consumed, reaching train.global_batch (train/batch_schedule.h). Off when start = 0.
struct BatchRampup {
  int64_t start = 0, increment = 0, samples = 0;
  bool on() const { return start > 0; }
  bool operator==(const BatchRampup&) const = default;
};

struct TrainConfig {
  int steps = 100;        // 0: as many as train.samples takes
  // The run's length in samples (Megatron's --train-samples) in place of train.steps; the
  // learning-rate schedule then counts samples (optim.*_samples). 0 = train.steps.
  int64_t samples = 0;
  int global_batch = 8;   // sequences per optimizer step (after the ramp-up, when there is one)
  int micro_batch = 8;    // sequences per forward/backward
  BatchRampup rampup_batch_size;
  int eval_interval = 0;  // 0 = no evaluation
  int eval_batches = 4;
  uint64_t seed = 1234;
  bool resume = false;
  int threads = 0;        // 0 = OpenMP default
  int exit_interval = 0;  // stop (with a checkpoint) after this many steps of this run; 0 = never
  // Stop (with a checkpoint, exit status 0) after the first step that starts this many minutes
  // after the ranks started (Megatron's --exit-duration-in-mins: inside a batch job's time limit);
  // 0 = never.
  double exit_duration_mins = 0.0;
  // A checkpoint (root or step directory) whose parameters a fresh run starts from (fine-tuning):
  // weights only, a fresh optimizer and step 0. Ignored when train.resume finds a checkpoint.
  std::string init_from;
  // Evaluate without training (Megatron's --skip-train): the model as train.resume or
  // train.init_from loads it, on the validation and test sets once; nothing is written.
  bool skip_train = false;

  // The threads one rank runs on: train.threads (0: every processor) shared out over the ranks of
  // one process (the threads backend's; one under MPI), at least one. The trainer and the planner
  // both take it from here.
  int threads_per_rank(int processors, int ranks_in_process) const {
    const int total = threads > 0 ? threads : processors;
    return std::max(1, total / std::max(1, ranks_in_process));
  }
};

// Supervised fine-tuning on chat data (`loom sft`, docs/sft.md).
struct SftConfig {
  std::vector<std::string> train_files;  // JSONL conversations (OpenAI messages or {input, output})
  // One weight per train_files entry: each entry its own dataset, sampled by its share of the
  // weights (NeMo's concat_sampling_probabilities; train/blended_source.h). Empty: the entries'
  // conversations pooled into one dataset.
  std::vector<double> train_weights;
  std::string chat_template = "chatml";  // chatml | tokenizer | tokenizer:NAME (data/chat/chat_format.h)
  std::vector<std::string> train_roles = {"assistant"};  // whose messages are trained on
  bool last_turn_only = false;           // only the last message of those roles
  bool packing = true;                   // first-fit-decreasing packing; false: one conversation per row
  double val_fraction = 0.05;            // share of conversations held out for validation
  // Validation and test conversations of their own (NeMo's validation_ds and test_ds): val_files
  // replace the held-out share (sft.val_fraction must then be 0); test_files are evaluated once,
  // after the last step.
  std::vector<std::string> val_files;
  std::vector<std::string> test_files;
  BadLines bad_lines = BadLines::Fail;   // fail | skip: a line that is not a conversation
  Overlong overlong = Overlong::Truncate;  // truncate | drop: a conversation longer than data.seq_len
  // never | unstable | always: a conversation as one example per trained message, each with its
  // history as the template renders it for generation; `unstable`: only where the template
  // rewrites earlier turns when later ones follow (docs/sft.md).
  SplitTurns split_turns = SplitTurns::Unstable;
};

struct CheckpointConfig {
  std::string dir;       // empty = run.dir/checkpoints
  int interval = 0;      // 0 = only at the end
  int keep = 3;          // retain the newest K
  bool async = false;
  // false: no checkpoint when the last step is done (benchmarks, throwaway runs); interval
  // checkpoints and the one after a stop request are still written.
  bool at_end = true;
};

struct RunSection {
  std::string dir = "runs/default";
  std::string name = "loom";
  // A fresh run (train.resume=false) into a run directory that holds another run's checkpoints
  // or metrics is refused unless this is set; then those are removed first.
  bool overwrite = false;
};

// The most ranks the threads backend starts in one process.
inline constexpr int kMaxThreadRanks = 1024;

struct LogConfig {
  int interval = 1;        // console line every N steps
  bool progress = true;    // progress bar (off when not a terminal)
  // TensorBoard scalars of every metrics.jsonl number in run.dir/tensorboard (Megatron's
  // --tensorboard-dir; config/tensorboard_events.h).
  bool tensorboard = false;
};

// Steps traced for profiling (docs/operations.md, "Profiling a run"): each chosen rank writes the
// named ranges of steps first_step..last_step (core/trace.h) to run.dir/profile/rank-<r>.json, a
// Chrome trace, and a traced cuda rank brackets them with cudaProfilerStart/Stop for Nsight Systems.
struct ProfileConfig {
  int first_step = 0;           // 0: none
  int last_step = 0;            // 0: first_step alone
  std::vector<int> ranks = {0}; // which ranks trace; [] = every rank
  bool synchronize = true;      // cuda: wait for the GPU at each range's ends, so ranges time its work
};

// How ranks are started and talk (see comm/launch.h).
struct RuntimeConfig {
  Backend backend = Backend::Threads;  // threads | mpi | auto
  RuntimeDevice device = RuntimeDevice::Cpu;  // cpu | cuda (rank r on GPU r modulo the GPUs)
  // cuda: host (device buffers staged through the backend's host memory) | nccl (device buffers
  // over NCCL, one process per GPU; host buffers still over the backend)
  DeviceComm device_comm = DeviceComm::Host;
  int ranks = 1;                    // threads backend: ranks as threads of this process
  double timeout_s = 300.0;         // every blocking communication wait
};

// Which ranks share a node and which nodes share a site (data center), and each link class's
// latency and bandwidth for the threads backend's simulation (see comm/topology.h and
// comm/simulated_links.h). Bandwidths are per rank, in gigabits per second; 0 = unlimited.
struct TopologyConfig {
  int ranks_per_node = 0;                 // 0 = from the ranks' hostnames (threads backend: one node)
  int nodes_per_site = 0;                 // 0 = one site
  double node_latency_us = 1.0;           // same node (NVLink class)
  double node_bandwidth_gbps = 3600.0;
  double site_latency_us = 5.0;           // same site, across nodes (InfiniBand class)
  double site_bandwidth_gbps = 400.0;
  double cross_site_latency_us = 10500.0; // half of a 21 ms round trip between data centers
  double cross_site_bandwidth_gbps = 100.0;
  bool simulate = false;                  // threads backend: delay transfers and count bytes per class
};

// A count that may be `auto` (written as 0): e.g. `parallel.dp: auto` = the rest of the world.
struct AutoCount {
  int value = 0;
  bool is_auto() const { return value == 0; }
  operator int() const { return value; }
};

// Parallel layout (see comm/mesh.h).
struct ParallelConfig {
  AutoCount dp;             // data-parallel ranks; auto = world / (tp * cp * pp)
  int tp = 1;               // tensor-parallel ranks (Megatron column/row split)
  int cp = 1;               // context-parallel ranks: each holds 2 of the sequence's 2 * cp chunks
  ContextComm cp_comm = ContextComm::P2p;  // p2p (ring attention) | a2a (Ulysses all-to-all)
  int ep = 1;               // expert-parallel ranks, carved out of tp x cp x dp (experts split over them)
  bool sequence_parallel = false;  // split norms/residuals along the sequence over the tp group
  int zero = 0;             // distributed optimizer stage: 0 (DDP), 1, 2, 3
  // ZeRO-3 on a GPU: each rank's parameter and gradient shards in host memory (FSDP2's
  // CPUOffloadPolicy, NeMo RL's dtensor_cfg.cpu_offload, DeepSpeed's offload_param), copied to the
  // device around each unit's gather and back after its reduce-scatter; needs optim.cpu_offload.
  bool offload_params = false;
  // With offload_params: a copy of the rank's parameter shard in the dtype its gathers send (the
  // compute dtype under precision.param_dtype=compute, else fp32) stays on the device from one
  // update to the next, uploaded once per step instead of once per gather (2 or 4 bytes per owned
  // parameter of device memory for 2 gathers' link bytes per micro-batch).
  bool offload_params_device_copy = false;
  // ZeRO 1-2: the update's all-gathers of the parameters are left in flight (in forward order, on
  // a group of their own) and each unit's forward waits for its own buckets only, so the gathers
  // overlap the next forward (Megatron-Core's --overlap-param-gather).
  bool overlap_param_gather = false;
  // tp > 1: a column-parallel layer's backward runs its collectives beside its GEMMs (the gather
  // of its input for wgrad beside dgrad under sequence parallelism, its input gradient's sum beside
  // wgrad), as Megatron-Core does; the same bits either way (model/tensor_parallel.h).
  bool overlap_tp_comm = true;
  double bucket_mb = 16.0;  // gradient bucket size for overlapped reduction
  int pp = 1;               // pipeline stages
  PipelineScheduleKind pipeline_schedule = PipelineScheduleKind::OneFOneB;  // gpipe | 1f1b | interleaved
  int virtual_stages = 1;   // model chunks per pipeline rank (interleaved)
  std::string pipeline_partition = "even";  // even | balanced | layer counts per virtual stage "3,5,..."
  // Sites (data centers) the data-parallel group spans: each site's ranks are a contiguous block
  // of dp ranks. > 1: gradients are reduce-scattered inside a site, all-reduced across sites and
  // gathered inside the site again; ZeRO 1-2 shard the optimizer inside a site (see
  // docs/parallelism.md). 1: one site (the flat path). 0 (auto): from topology.nodes_per_site
  // and topology.ranks_per_node when both are set, else one site.
  int dp_sites = 0;
  GradReduce cross_site_reduce = GradReduce::Fp32;  // fp32 | bf16: dtype of the cross-site hop
  // diloco: each site trains on its own (data parallelism inside the site) and every
  // outer_steps steps the sites average their parameter deltas, applied by an outer Nesterov
  // optimizer (outer_lr, outer_momentum); outer_fragments > 1 streams: fragment f of the
  // parameters syncs at steps f * outer_steps / outer_fragments (mod outer_steps).
  OuterOptimizer outer = OuterOptimizer::None;
  int outer_steps = 50;
  double outer_lr = 0.7;
  double outer_momentum = 0.9;
  int outer_fragments = 1;
};

// Numeric formats of a run (see docs/precision.md). Master weights and optimizer state are
// always fp32; `recipe` picks what the GEMMs of linear layers compute in.
struct PrecisionConfig {
  PrecisionRecipe recipe = PrecisionRecipe::Fp32;  // fp32 | bf16 | fp16 | fp8_delayed | fp8_current | fp8_blockwise | mxfp8
  GradReduce grad_reduce = GradReduce::Fp32;  // fp32 | bf16: dtype of data-parallel gradient reduction
  // fp32 | compute: the model's parameters hold the fp32 master weights, or the master weights
  // rounded to the compute dtype (bf16; fp16 for fp16), all-gathered in it by ZeRO 1-2.
  ParamDtype param_dtype = ParamDtype::Fp32;
  double loss_scale_initial = 65536.0;  // fp16: dynamic loss scale to start from
  int loss_scale_growth_interval = 1000;  // fp16: clean steps before the scale doubles
  double loss_scale_min = 1.0;          // fp16: the scale never drops below this
  int fp8_amax_history = 16;            // fp8_delayed: steps of amax history per tensor
  int fp8_margin = 0;                   // fp8: scale = fp8_max / amax / 2^margin
  bool fp8_edge_layers_bf16 = true;     // fp8 recipes: first and last block's linears in bf16
  // fp8_delayed / fp8_current on a GPU: forward products with cuBLASLt's fast accumulation (TE's default)
  bool fp8_forward_fast_accumulation = true;
  // A GELU MLP's bf16 products on a GPU apply GELU (forward) and its derivative (the down
  // projection's dgrad) in cuBLASLt's epilogues; false: in passes of their own, as before.
  bool gelu_epilogue = true;
  // fp8_delayed / fp8_current on a GPU at ZeRO 0: the optimizer's pass writes the FP8 weights' amaxes
  // (and fp8_delayed's codes) for the next step's forwards (model/optimizer_weight_casts.h)
  bool fp8_weights_from_optimizer = true;
  // auto | fp32 | bf16: attention's q, k, v and output (auto: bf16 unless the recipe is fp32 or fp16)
  AttentionPrecision attention = AttentionPrecision::Auto;
};

// Faults injected on purpose, for tests and demonstrations of recovery (see docs/operations.md).
struct FaultConfig {
  int kill_rank = -1;       // this rank exits abruptly ...
  int kill_step = 0;        // ... when it reaches this step (0 = never)
  int stall_rank = -1;      // this rank stops making progress ...
  int stall_step = 0;       // ... at this step (0 = never) ...
  double stall_s = 0.0;     // ... for this long (0 = forever)
  int corrupt_step = 0;     // after saving this step's checkpoint, damage one of its shards (0 = never)
  bool repeat = false;      // fire on restarts too (LOOM_RESTART_COUNT > 0), not only on the first attempt
  int random_kills = 0;     // attempts 0..N-1 each kill a random rank at a random step ...
  int random_kill_window = 3;  // ... 1..window steps after the step the attempt started at
  int seed = 1;             // of the random ranks and steps
};

struct RunConfig {
  RunSection run;
  RuntimeConfig runtime;
  ParallelConfig parallel;
  PrecisionConfig precision;
  TopologyConfig topology;
  ModelConfig model;
  DataConfig data;
  OptimConfig optim;
  TrainConfig train;
  CheckpointConfig checkpoint;
  SftConfig sft;
  GrpoConfig grpo;
  LogConfig log;
  ProfileConfig profile;
  FaultConfig fault;
};

// Loads `path` (YAML) and applies `overrides` ("section.key=value", "++section.key=value").
// Throws loom::Error naming the file, the key and what would be valid.
RunConfig load_config(const std::string& path, const std::vector<std::string>& overrides);

// Parses YAML text (for tests and for configs stored in checkpoints).
RunConfig parse_config(const std::string& yaml_text, const std::string& source_name,
                       const std::vector<std::string>& overrides);

// Range and consistency checks (also run by load_config / parse_config).
void validate_config(const RunConfig& config);

// Serialises back to YAML (stored in checkpoints; parse_config(to_yaml(c)) == c).
std::string to_yaml(const RunConfig& config);

}  // namespace loom::config
