#pragma once
// The inference engine: continuous batching over a paged KV cache. Requests join a queue; every
// step admits what fits (KV blocks reserved for prompt + max_tokens), then runs ONE batched
// forward over all running samples: each decoding sample's next token, plus chunks of waiting
// prompts filling the step's token budget (chunked prefill, so a long prompt never stalls the
// decoding ones). The n samples of a prompt share its blocks (reference counted; the partial
// last block copied per sample), and full prompt blocks are cached by prefix hash for later
// prompts. A hybrid model's Mamba-2 layers keep their recurrent state in a fixed pool of
// max_running slots (counted in the cache budget): a sample holds one from admission (or its
// fork) to its end, its first position starts it from zero, and the n samples of a prompt copy
// the prompt's final state; prefix caching is off for them (a state exists only at the end of
// what was computed, not at every block boundary). New weights are loaded between steps. One
// thread drives steps (run() or step()).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "loom/comm/communicator.h"
#include "loom/data/tokenizer.h"
#include "loom/infer/block_manager.h"
#include "loom/infer/engine_metrics.h"
#include "loom/infer/inference_device.h"
#include "loom/infer/model_runner.h"
#include "loom/infer/request.h"
#include "loom/infer/sampling.h"
#include "loom/infer/text_output.h"

namespace loom::infer {

struct EngineOptions {
  int tp = 1;                           // tensor-parallel ranks (threads; with `world`, its size)
  // Tensor-parallel ranks as MPI processes: this process is rank 0 of `world` (the engine's);
  // every other rank runs follow_engine. Null: ranks as threads of this process.
  comm::Communicator* world = nullptr;
  int64_t kv_cache_bytes = 64ll << 20;  // per rank
  int64_t kv_cache_blocks = 0;          // > 0: exactly this many KV blocks per rank, whatever kv_cache_bytes says
  int64_t block_size = 16;              // positions per KV block
  int64_t max_batch_tokens = 256;       // rows of one step's forward (decode tokens + prefill chunks)
  int64_t max_running = 64;             // samples decoding at once (= Mamba state slots of a hybrid model)
  bool prefix_caching = true;           // off for hybrid models
  // Where the ranks run (weights, KV cache, forward): cpu | cuda (rank r on GPU r modulo the GPUs).
  config::RuntimeDevice device = config::RuntimeDevice::Cpu;
  // The linear layers' GEMMs: fp32 | bf16 | fp16, auto = bf16 on cuda, fp32 on cpu (inference_device.h).
  InferenceDtype dtype = InferenceDtype::Auto;
  // The KV cache's elements: fp32 | bf16, auto = bf16 under bf16 or fp16 GEMMs, else fp32.
  KvCacheSetting kv_cache_dtype = KvCacheSetting::Auto;
  // Speculative decoding with the model's multi-token prediction depths (vLLM's method "mtp"):
  // tokens each decoding sample drafts per step with depths 1 .. this, verified by the next
  // step's forward (0: off; at most model.mtp_depths). Turns prefix caching off.
  int speculative_tokens = 0;
  // Called on the engine thread with every draft's logits [vocab] (rank 0's, on the host), the
  // depth that drew it and the tokens it follows (the sample's known ones, then the drafts before
  // it): tests compare them with training's depths. Null: none.
  std::function<void(const std::vector<int32_t>& before, int depth, const float* logits)> draft_observer;
};

// What every rank is built with under `options` (auto settings resolved).
RankSetup rank_setup(const EngineOptions& options);

// The model config a checkpoint is served with (vocabulary resolved by its tokenizer), and the tokenizer.
config::ModelConfig served_model_config(const ckpt::LoadedCheckpoint& checkpoint,
                                        std::unique_ptr<data::Tokenizer>& tokenizer);

// Ranks 1.. of `world` under mpirun (EngineOptions::world on rank 0): loads this rank's shard of
// the model (the same options as rank 0's) and runs every step rank 0 announces, until the
// engine on rank 0 is destroyed. An Error on this rank ends it (and so the MPI job).
void follow_engine(const std::string& checkpoint, const EngineOptions& options, comm::Communicator& world);

class Engine {
 public:
  // Loads a checkpoint (step directory or root) with its config and tokenizer.
  Engine(const std::string& checkpoint, EngineOptions options);
  ~Engine();

  const data::Tokenizer& tokenizer() const { return *tokenizer_; }
  const config::ModelConfig& model_config() const { return model_; }
  int64_t context() const { return model_.max_seq_len; }
  // The GEMMs' recipe the ranks run (EngineOptions::dtype resolved): fp32, bf16 or fp16; and the
  // KV cache's elements (EngineOptions::kv_cache_dtype resolved).
  config::PrecisionRecipe recipe() const { return setup_.recipe; }
  kernels::KvCacheDtype kv_cache_dtype() const { return setup_.kv_dtype; }
  // Ids the sampler draws from (a padded model vocabulary's extra ids never are).
  int64_t sampled_vocab() const { return sampled_vocab_; }
  // Where rank 0's model runs (cpu, or cuda:0).
  Device device() const { return options_.device == config::RuntimeDevice::Cuda ? Device::cuda(0) : Device::cpu(); }
  const BlockManager& blocks() const { return blocks_; }
  // State slots (0 without Mamba-2 layers or several drafting depths) and how many no sample holds
  // (read between steps).
  int64_t state_slots() const { return runner_->state_slots(); }
  int64_t free_state_slots() const { return static_cast<int64_t>(free_slots_.size()); }
  std::string weight_version() const;
  // Tokens each decoding sample drafts a step (0: no speculative decoding).
  int speculative_tokens() const { return options_.speculative_tokens; }

  // Queues a request (thread-safe). A prompt that cannot fit (context or KV cache) or bad
  // options are an Error naming the field.
  std::shared_ptr<RequestStream> submit(std::vector<int32_t> prompt, const RequestOptions& options);
  // Checks what submit would refuse, without queueing (for a server's 400 before streaming).
  void validate(const std::vector<int32_t>& prompt, const RequestOptions& options) const;

  // One scheduling step (admission, one batched forward, sampling); false when there was nothing to do.
  bool step();
  // Steps until stop(); sleeps while idle. stop(): returns after the running requests have
  // finished (drain) or at once, cancelling them.
  void run();
  void stop(bool drain);

  // Loads new weights between two steps (thread-safe; blocks until done). Queued and running
  // requests continue; cached prompt prefixes are forgotten. Returns the new weight version.
  std::string load_weights(const std::string& checkpoint, const std::string& version);
  // The digest of the weights the engine now holds (ckpt::parameter_digest over every rank's
  // shards: equal to `loom ckpt digest` of the checkpoint they came from) and their version,
  // taken between two steps (thread-safe; blocks until done).
  std::pair<std::string, std::string> weights_digest();

  EngineMetrics& metrics() { return metrics_; }
  int64_t queued() const;
  int64_t running() const;

 private:
  struct Request;
  struct Sample {
    Request* request = nullptr;
    int index = 0;
    std::vector<int32_t> tokens;  // prompt + sampled
    int64_t computed = 0;         // positions whose keys/values are in the cache
    std::vector<int32_t> table;   // block table
    int32_t slot = -1;            // Mamba state slot (hybrid models)
    int64_t generated = 0;
    std::unique_ptr<TextOutput> text;
    bool finished = false;
    std::chrono::steady_clock::time_point last_token;
    // Speculative decoding: the tokens drafted for the positions after the last, the
    // distributions they were drawn from, and per depth k the positions 0 .. depth_done[k - 1]
    // whose rows it computed from known tokens, and which of its slot's two kept states holds
    // its kept output (kept_half[k - 1], depths below the last). step_row / step_position: this
    // step's first forward row and its position (-1: not in this step's forward).
    std::vector<int32_t> drafts;
    std::vector<model::TokenDistribution> draft_distributions;
    std::vector<int64_t> depth_done;
    std::vector<int32_t> kept_half;
    int64_t step_row = -1, step_position = 0;
    PenaltyCounts counts;  // what the request's penalties read (kept only when it has some)
  };
  struct Request {
    std::shared_ptr<RequestStream> stream;
    RequestOptions options;
    uint64_t key = 0;
    int64_t reserve = 0;  // blocks one sample may need
    std::vector<std::unique_ptr<Sample>> samples;
    std::chrono::steady_clock::time_point arrival;
    bool first_token = false;
  };

  void apply_pending_load();
  void apply_pending_digest();
  void admit();
  bool build_batch(model::PagedBatch& batch, std::vector<Sample*>& rows_of, std::vector<int64_t>& taken);
  void ensure_blocks(Sample& sample, int64_t positions);
  void after_forward(const float* logits, const std::vector<Sample*>& sampled, const std::vector<int64_t>& taken,
                     const std::vector<Sample*>& stepped);
  void fork(Sample& parent);
  void sample_next(Sample& sample, const float* logits);
  // The row a sample draws from: `logits` itself, or with its request's penalties applied (into
  // penalized_); the log-probabilities it reports are of `logits`.
  const float* drawn_from(const Sample& sample, const float* logits);
  // The Philox counter of the sample's token `ahead` positions after its next one.
  static uint64_t draw_counter(const Sample& sample, int64_t ahead = 0) {
    return (static_cast<uint64_t>(sample.index) << 32) | static_cast<uint64_t>(sample.generated + ahead);
  }
  // Appends `token` (drawn from `logits`) to the sample and streams it; finishes the sample at a
  // stop or its length.
  void emit_token(Sample& sample, int32_t token, const float* logits);
  // Speculative decoding: the sample's drafts checked against the target's logits (one row per
  // draft and one after), the kept ones and the next token emitted.
  void verify_drafts(Sample& sample, const float* logits);
  // After the step's forward: each drafting depth over the rows of every sample in it (drafting.cpp).
  void draft_step();
  // A depth's rows of one sample in a drafting step: the position of the first, and its row (-1: none).
  struct DepthRows {
    int64_t first_position = 0, first_row = -1;
  };
  // A sample in the step's forward with the drafts it makes (0 while its prompt is computed), its
  // rows of the depth drafted last, and the depths that wrote their other kept state this step.
  struct Drafter {
    Sample* sample = nullptr;
    int drafts = 0;
    DepthRows rows;
    std::vector<int> kept_written;
  };
  std::vector<Drafter> step_drafters();
  // The sample's rows of draft.depth (table entry `entry`): from the first it had not computed from
  // known tokens to the last known token (decoding) or the last with known tokens (a prompt's).
  void add_depth_rows(model::DraftBatch& draft, Drafter& drafter, int32_t entry);
  // The sample's next draft drawn from a depth's logits.
  void take_draft(Sample& sample, int depth, const float* logits);
  // The block tables of `samples`, one entry each, in a batch.
  static void set_block_tables(model::PagedBatch& batch, const std::vector<Sample*>& samples);
  void publish_prefix(Sample& sample);
  void reuse_prefix(Sample& sample);
  void finish(Sample& sample, const std::string& reason);
  int32_t take_slot();
  // The Mamba state slot holding the snapshot after verification row `row` of slot `slot`'s sample.
  int32_t snapshot_slot(int32_t slot, int row) const {
    const int64_t drafts = options_.speculative_tokens;
    return static_cast<int32_t>(runner_->state_slots() + static_cast<int64_t>(slot) * drafts + row);
  }
  void add_snapshots(model::PagedBatch& batch, const Sample& sample, int64_t rows);
  void drop_finished();
  int64_t outstanding_reserve() const;

  EngineOptions options_;
  RankSetup setup_;
  config::ModelConfig model_;
  std::unique_ptr<data::Tokenizer> tokenizer_;
  int64_t sampled_vocab_ = 0;
  std::vector<float> penalized_;  // drawn_from's row
  std::unique_ptr<ModelRunner> runner_;
  BlockManager blocks_;
  std::vector<int32_t> free_slots_;  // state slots no sample holds (engine thread only)
  bool has_mamba_ = false;           // Mamba-2 layers: verification rows keep state snapshots
  EngineMetrics metrics_;

  mutable std::mutex mutex_;  // guards waiting_, pending load and digest, stop flags, weight_version_
  std::condition_variable wake_, loaded_;
  std::list<std::unique_ptr<Request>> waiting_;
  std::list<std::unique_ptr<Request>> running_;  // engine thread only
  std::string pending_load_, pending_version_, load_error_, weight_version_;
  uint64_t loads_requested_ = 0, loads_done_ = 0;
  std::string digest_, digest_error_;
  uint64_t digests_requested_ = 0, digests_done_ = 0;
  bool stop_ = false, drain_ = true;
  std::atomic<int64_t> next_id_{0}, running_samples_{0};
};

}  // namespace loom::infer
