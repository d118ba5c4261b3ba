#pragma once
// The model side of the engine: the model's ranks (one, or tp ranks as threads of this process,
// or tp MPI processes, each holding its shard of the weights and of every KV block) running each
// engine step's batched forward together. The engine (one thread) calls in; with tp rank threads
// every call is handed to all of them and returns when all have finished it; with MPI processes
// rank 0 (the engine's) first announces it to the others (a StepMessage, step_message.h), which
// run it in follow().
//
// On a GPU (`device` cuda) each rank's weights, KV blocks and Mamba state pool are device memory
// (the block manager's bookkeeping stays the engine's, on the host): a step's metadata is staged
// to the device by the model, block and slot copies are device copies, the tensor-parallel
// collectives stage device buffers through the host (comm/device_staging.h), and the step's
// logits come back to the host for sampling. The cpu runs the same code with host copies.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "loom/ckpt/checkpoint.h"
#include "loom/comm/communicator.h"
#include "loom/config/run_config.h"
#include "loom/infer/step_message.h"
#include "loom/model/transformer.h"

namespace loom::infer {

// How each rank is built: where it runs, in which formats, with how much cache.
struct RankSetup {
  // Per rank: a hybrid model's pool of `state_slots` Mamba state slots first, the rest whole KV
  // blocks of `block_size` positions (at least one; an Error when the pool leaves no room for one).
  int64_t kv_cache_bytes = 64ll << 20;
  int64_t kv_cache_blocks = 0;  // > 0: this many KV blocks (and the state pool beside them) instead
  int64_t block_size = 16;
  int64_t state_slots = 0;
  config::RuntimeDevice device = config::RuntimeDevice::Cpu;  // rank r on GPU r modulo the GPUs
  // The linear layers' GEMMs (fp32, bf16 or fp16; inference_device.h): on a GPU each weight's cast
  // is made once after every load and kept.
  config::PrecisionRecipe recipe = config::PrecisionRecipe::Fp32;
  kernels::KvCacheDtype kv_dtype = kernels::KvCacheDtype::Fp32;  // the KV pools' elements
  // Speculative decoding: the multi-token prediction depths that draft (0: none), whose keys and
  // values are in every block and whose kept states and Mamba snapshots are in every slot.
  int draft_depths = 0;
};

class ModelRunner {
 public:
  // Builds the ranks as `setup` says and loads `checkpoint` into them.
  ModelRunner(const config::ModelConfig& model, int tp, const ckpt::LoadedCheckpoint& checkpoint,
              const RankSetup& setup);
  // The same with the tp ranks as the processes of `world` (an MPI job, world.size() ranks): this
  // process builds and loads its own rank. Rank 0 is the engine's; every other rank calls follow().
  ModelRunner(const config::ModelConfig& model, comm::Communicator& world, const ckpt::LoadedCheckpoint& checkpoint,
              const RankSetup& setup);
  // Rank 0 of MPI ranks tells the others to return from follow().
  ~ModelRunner();
  ModelRunner(const ModelRunner&) = delete;
  ModelRunner& operator=(const ModelRunner&) = delete;

  int64_t blocks() const { return blocks_; }
  // Mamba state slots and the bytes their pool takes per rank (0 without Mamba-2 layers).
  int64_t state_slots() const { return state_slots_; }
  int64_t state_pool_bytes() const { return state_pool_bytes_; }
  int tp() const { return tp_; }
  // Logits [batch.logit_rows, vocab] of one batched step, on the host (valid until the next call).
  const float* forward(const model::PagedBatch& batch);
  // Copies block `from`'s keys and values into block `to` (a sample's own copy of a shared partial block).
  void copy_block(int32_t from, int32_t to);
  // Copies state slot `from` into `to`: a sample continuing from its prompt's final Mamba state
  // (and its drafting depths' kept states), or a Mamba snapshot (from) restored after verification.
  void copy_state_slot(int32_t from, int32_t to);
  // One drafting depth's logits [draft.rows.logit_rows, vocab] (speculative decoding, after the
  // step's forward and the previous depth's draft), on the host (valid until the next call).
  const float* draft(const model::DraftBatch& draft);
  int draft_depths() const { return setup_.draft_depths; }
  // New weights, every rank its slice (the model's config must match).
  void load(const ckpt::LoadedCheckpoint& checkpoint);
  // ckpt::parameter_digest of the weights the ranks hold together (each parameter once).
  std::string parameter_digest();
  // MPI ranks, rank 0 while idle: at most once a second, a message with nothing to run, so that
  // the followers' wait for the next step never times out and a follower gone is noticed.
  void keep_alive();
  // MPI ranks other than 0: runs every operation rank 0 announces until it says Stop.
  void follow();

 private:
  struct Rank {
    // `group`: the tensor-parallel ranks (null: one rank); on a GPU, wrapped to stage device buffers.
    Rank(const config::ModelConfig& config, comm::Communicator* group, Device device, config::PrecisionRecipe recipe);
    std::unique_ptr<comm::Communicator> staged;  // before model: the model's group may be this
    model::Transformer model;
    model::PagedKVCache cache;
    model::PagedScratch scratch;
    std::vector<float> host_logits;  // a GPU's logits, brought back for sampling
  };
  using Job = std::function<void(Rank&)>;
  void run(const Job& job);  // on every rank, returns when all are done
  void rank_loop(Rank& rank);
  // This process's rank of `group` (null: the only rank) on its device, weights loaded, cache made.
  std::unique_ptr<Rank> make_rank(const config::ModelConfig& model, comm::Communicator* group,
                                  const ckpt::LoadedCheckpoint& checkpoint);
  // The cache's sizes (the same on every rank) as the engine sees them.
  void take_sizes(const Rank& rank);
  // Loads `checkpoint` into the rank's weights; their kept casts (a GPU's, under bf16 or fp16) are
  // dropped first and made again by the next forward.
  static void load_weights(Rank& rank, const ckpt::LoadedCheckpoint& checkpoint);
  // Every operation: announced to MPI followers (rank 0), then run on every rank.
  void execute(const StepMessage& message, const ckpt::LoadedCheckpoint* checkpoint = nullptr);
  void apply(Rank& rank, const StepMessage& message, const ckpt::LoadedCheckpoint* checkpoint);
  // Rank 0's logits of `rows` rows where the engine reads them (a GPU's copied to the host).
  void take_logits(Rank& rank, const float* logits, size_t rows);

  int tp_;
  RankSetup setup_;
  int64_t blocks_ = 0, state_slots_ = 0, state_pool_bytes_ = 0;
  const float* logits_ = nullptr;
  std::unique_ptr<Rank> single_;  // tp = 1, or this process's rank of MPI ranks: runs inline
  comm::Communicator* world_ = nullptr;  // MPI ranks
  std::chrono::steady_clock::time_point last_message_;
  // tp > 1: the rank threads and the job they share.
  std::thread launcher_;
  std::mutex mutex_;
  std::condition_variable changed_;
  Job job_;
  uint64_t generation_ = 0;
  int finished_ = 0, ready_ = 0;
  bool stopping_ = false;
  std::exception_ptr failure_;
};

}  // namespace loom::infer
