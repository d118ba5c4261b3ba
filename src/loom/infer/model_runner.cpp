#include "loom/infer/model_runner.h"

#include <algorithm>
#include <cstddef>
#include <mutex>
#include <vector>

#include "loom/comm/device_staging.h"
#include "loom/comm/launch.h"
#include "loom/ckpt/digest.h"
#include "loom/core/error.h"
#include "loom/infer/communication.h"
#include "loom/infer/inference_device.h"
#include "loom/train/model_setup.h"
#include "loom/train/sharded_training_state.h"

namespace loom::infer {

namespace {
// Whole KV blocks in what the Mamba state pool leaves of the budget.
int64_t blocks_for(const model::Transformer& model, const RankSetup& setup) {
  if (setup.kv_cache_blocks > 0) return setup.kv_cache_blocks;
  const int64_t bytes = setup.kv_cache_bytes, state_slots = setup.state_slots;
  const int64_t per_block =
      std::max<int64_t>(model.paged_block_bytes(setup.block_size, setup.kv_dtype, setup.draft_depths), 1);
  const int64_t slot_bytes = model.paged_state_slot_bytes(setup.draft_depths);
  const int64_t pool = state_slots * slot_bytes;
  LOOM_CHECK(pool == 0 || pool + per_block <= bytes,
             "the KV cache budget (" + std::to_string(bytes >> 20) + " MiB per rank, --kv-cache-mb) is smaller than the " +
                 "state pool of this model (Mamba states and drafting depths' states: " + std::to_string(state_slots) +
                 " slots, one per running sequence (--max-running), of " + std::to_string(slot_bytes) + " bytes = " +
                 std::to_string(pool) + " bytes) plus one KV block: raise --kv-cache-mb or lower --max-running");
  return std::max<int64_t>((bytes - pool) / per_block, 1);
}
// Row `from` of a [rows, width] buffer copied into row `to`, where the buffer lives.
void copy_row(model::Buffer& buffer, int64_t width, int32_t from, int32_t to) {
  copy_on_device(buffer.device(), buffer.data() + to * width, buffer.data() + from * width, width);
}
// Block `from` of each attention layer's pools copied into block `to` (their elements' bytes).
void copy_cache_block(model::PagedKVCache& cache, int32_t from, int32_t to) {
  for (auto* layers : {&cache.layers, &cache.draft_layers}) {
    for (model::PagedLayerCache& layer : *layers) {
      const int64_t bytes = cache.block_size * layer.kv_width * kernels::kv_cache_element_bytes(layer.kv_dtype);
      if (bytes == 0) continue;
      for (model::Buffer* pool : {&layer.keys, &layer.values}) {
        auto* base = reinterpret_cast<std::byte*>(pool->data());
        copy_on_device(pool->device(), base + to * bytes, base + from * bytes, bytes);
      }
    }
  }
}
// The Mamba states of slot `from` (a sample's, or a verification row's snapshot) into `to`, and
// the drafting depths' kept states where both are samples' slots.
void copy_slot(model::PagedKVCache& cache, int32_t from, int32_t to) {
  for (model::PagedLayerCache& layer : cache.layers) {
    if (layer.state_width == 0) continue;
    copy_row(layer.windows, layer.window_width, from, to);
    copy_row(layer.states, layer.state_width, from, to);
  }
  if (cache.draft_depths > 1 && from < cache.state_slots && to < cache.state_slots) {
    copy_row(cache.kept_hidden, static_cast<int64_t>(cache.kept_hidden.size()) / cache.state_slots, from, to);
  }
}
// Copies of the parameter shards this rank stores (not those another rank holds too).
std::vector<ShardValues> own_shards(const model::Transformer& model) {
  const model::ParameterStore& params = model.params();
  std::vector<ShardValues> shards;
  for (size_t id = 0; id < params.list().size(); ++id) {
    const model::Parameter& p = params.list()[id];
    if (!p.shard.counts_in_norm) continue;  // a copy another rank holds too
    std::vector<float> values(static_cast<size_t>(p.numel));
    copy_to_host(params.device(), values.data(), params.value(static_cast<int>(id)), p.numel);
    shards.push_back({static_cast<int32_t>(id), train::parameter_slice(p), std::move(values)});
  }
  return shards;
}
StepMessage message_of(StepKind kind, int32_t from = 0, int32_t to = 0) {
  StepMessage message;
  message.kind = kind;
  message.from = from;
  message.to = to;
  return message;
}
}  // namespace

ModelRunner::Rank::Rank(const config::ModelConfig& config, comm::Communicator* group, Device device,
                        config::PrecisionRecipe recipe)
    : staged(group != nullptr && device.is_cuda() ? comm::stage_device_buffers(*group, device) : nullptr),
      model(config, model::TensorParallel(staged ? staged.get() : group, false), inference_policy(recipe), {}, {},
            device) {}

void ModelRunner::load_weights(Rank& rank, const ckpt::LoadedCheckpoint& checkpoint) {
  // Casts kept from the next forward on: the weights change only at the next load. Reopened on
  // every path, so a load that fails (the engine keeps serving) leaves no cast of the old weights.
  struct Reopen {
    model::Transformer& model;
    ~Reopen() { keep_weight_casts(model); }
  } reopen{rank.model};
  rank.model.precision().weight_casts().close();
  train::load_parameters(checkpoint, rank.model);
}

namespace {
// One token at position 0 of a sequence whose table names block 0 (and state slot 0): a forward
// that makes at startup what the first request would (a GPU's weight casts, GEMM plans, scratch),
// so a device short of memory fails here. What it writes is overwritten before anything reads it:
// a sequence writes each position's keys before attending to it, and starts its state slot from
// zero at position 0.
void warm_up(model::Transformer& model, model::PagedKVCache& cache, model::PagedScratch& scratch) {
  model::PagedBatch batch;
  batch.tokens = {0};
  batch.positions = {0};
  batch.sequences = {0};
  batch.block_tables = {0};
  batch.table_width = 1;
  if (cache.state_slots > 0) batch.state_slots = {0};
  batch.logit_rows = {0};
  model.forward_paged(batch, cache, scratch);
}
}  // namespace

std::unique_ptr<ModelRunner::Rank> ModelRunner::make_rank(const config::ModelConfig& model, comm::Communicator* group,
                                                         const ckpt::LoadedCheckpoint& checkpoint) {
  const Device device = inference_device(setup_.device, group != nullptr ? group->rank() : 0);
  auto rank = std::make_unique<Rank>(model, group, device, setup_.recipe);
  load_weights(*rank, checkpoint);
  const int64_t blocks = blocks_for(rank->model, setup_);
  rank->cache = rank->model.make_paged_cache(blocks, setup_.block_size, setup_.state_slots, setup_.kv_dtype,
                                             setup_.draft_depths);
  warm_up(rank->model, rank->cache, rank->scratch);
  return rank;
}

void ModelRunner::take_sizes(const Rank& rank) {
  blocks_ = rank.cache.blocks;
  state_slots_ = rank.cache.state_slots;
  state_pool_bytes_ = state_slots_ * rank.model.paged_state_slot_bytes(setup_.draft_depths);
}

ModelRunner::ModelRunner(const config::ModelConfig& model, comm::Communicator& world,
                         const ckpt::LoadedCheckpoint& checkpoint, const RankSetup& setup)
    : tp_(world.size()), setup_(setup), world_(&world), last_message_(std::chrono::steady_clock::now()) {
  single_ = make_rank(model, &world, checkpoint);
  take_sizes(*single_);
}

ModelRunner::ModelRunner(const config::ModelConfig& model, int tp, const ckpt::LoadedCheckpoint& checkpoint,
                         const RankSetup& setup)
    : tp_(tp), setup_(setup) {
  LOOM_CHECK(tp >= 1, "tensor-parallel ranks must be >= 1, got " + std::to_string(tp));
  if (tp == 1) {
    single_ = make_rank(model, nullptr, checkpoint);
    take_sizes(*single_);
    return;
  }
  launcher_ = std::thread([this, model, tp, &checkpoint] {
    comm::LaunchOptions options;
    options.backend = "threads";
    options.ranks = tp;
    try {
      comm::launch(options, [&](comm::Communicator& world) {
        std::exception_ptr error;
        std::unique_ptr<Rank> rank;
        try {
          rank = make_rank(model, &world, checkpoint);
        } catch (...) {
          error = std::current_exception();
        }
        {
          std::lock_guard lock(mutex_);
          if (error && !failure_) failure_ = error;
          if (rank && world.rank() == 0) take_sizes(*rank);
          ++ready_;
        }
        changed_.notify_all();
        if (rank) rank_loop(*rank);
      });
    } catch (...) {
      std::lock_guard lock(mutex_);
      if (!failure_) failure_ = std::current_exception();
    }
  });
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return ready_ == tp_; });
  if (failure_) {
    stopping_ = true;
    ++generation_;
    changed_.notify_all();
    lock.unlock();
    launcher_.join();
    std::rethrow_exception(failure_);
  }
}

ModelRunner::~ModelRunner() {
  if (world_ != nullptr && world_->rank() == 0) {
    try {
      execute(message_of(StepKind::Stop));
    } catch (const std::exception&) {
      // A follower already gone: the job is failing anyway (the launcher reports it).
    }
  }
  if (!launcher_.joinable()) return;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    ++generation_;
  }
  changed_.notify_all();
  launcher_.join();
}

void ModelRunner::rank_loop(Rank& rank) {
  uint64_t seen = 0;
  for (;;) {
    Job job;
    {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] { return generation_ != seen; });
      seen = generation_;
      if (stopping_) return;
      job = job_;
    }
    std::exception_ptr error;
    try {
      job(rank);
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard lock(mutex_);
      if (error && !failure_) failure_ = error;
      ++finished_;
    }
    changed_.notify_all();
  }
}

void ModelRunner::run(const Job& job) {
  if (single_) return job(*single_);
  std::unique_lock lock(mutex_);
  job_ = job;
  finished_ = 0;
  failure_ = nullptr;
  ++generation_;
  changed_.notify_all();
  changed_.wait(lock, [&] { return finished_ == tp_; });
  if (failure_) std::rethrow_exception(failure_);
}

void ModelRunner::execute(const StepMessage& message, const ckpt::LoadedCheckpoint* checkpoint) {
  if (world_ != nullptr) {
    exchange_step(*world_, &message);
    last_message_ = std::chrono::steady_clock::now();
  }
  run([&](Rank& rank) { apply(rank, message, checkpoint); });
}

void ModelRunner::apply(Rank& rank, const StepMessage& message, const ckpt::LoadedCheckpoint* checkpoint) {
  switch (message.kind) {
    case StepKind::Forward:
      return take_logits(rank, rank.model.forward_paged(message.batch, rank.cache, rank.scratch),
                         message.batch.logit_rows.size());
    case StepKind::Draft:
      return take_logits(rank, rank.model.draft_paged(message.draft, rank.cache, rank.scratch),
                         message.draft.rows.logit_rows.size());
    case StepKind::CopyBlock: return copy_cache_block(rank.cache, message.from, message.to);
    case StepKind::CopyStateSlot: return copy_slot(rank.cache, message.from, message.to);
    case StepKind::LoadWeights:
      // A follower reads the checkpoint rank 0 checked (the same path, seen from its machine).
      if (checkpoint == nullptr) return load_weights(rank, ckpt::load_checkpoint(message.path));
      return load_weights(rank, *checkpoint);
    case StepKind::Digest:
      if (world_ != nullptr && world_->rank() != 0) gather_shards(encode_shards(own_shards(rank.model)), *world_);
      return;
    case StepKind::KeepAlive:
    case StepKind::Stop: return;
  }
}

void ModelRunner::take_logits(Rank& rank, const float* logits, size_t rows) {
  if (rank.model.tensor_parallel().rank() != 0) return;
  const Device device = rank.model.params().device();
  if (device.is_cpu()) {
    logits_ = logits;
    return;
  }
  const int64_t n = static_cast<int64_t>(rows) * rank.model.config().vocab_size;
  rank.host_logits.resize(static_cast<size_t>(n));
  copy_to_host(device, rank.host_logits.data(), logits, n);
  logits_ = rank.host_logits.data();
}

const float* ModelRunner::draft(const model::DraftBatch& draft) {
  StepMessage message = message_of(StepKind::Draft);
  message.draft = draft;
  execute(message);
  return logits_;
}

const float* ModelRunner::forward(const model::PagedBatch& batch) {
  StepMessage message = message_of(StepKind::Forward);
  message.batch = batch;
  execute(message);
  return logits_;
}

void ModelRunner::copy_block(int32_t from, int32_t to) {
  execute(message_of(StepKind::CopyBlock, from, to));
}

void ModelRunner::copy_state_slot(int32_t from, int32_t to) {
  execute(message_of(StepKind::CopyStateSlot, from, to));
}

void ModelRunner::load(const ckpt::LoadedCheckpoint& checkpoint) {
  StepMessage message = message_of(StepKind::LoadWeights);
  message.path = checkpoint.path();
  execute(message, &checkpoint);
}

void ModelRunner::keep_alive() {
  if (world_ == nullptr || std::chrono::steady_clock::now() - last_message_ < std::chrono::seconds(1)) return;
  execute(message_of(StepKind::KeepAlive));
}

void ModelRunner::follow() {
  LOOM_CHECK(world_ != nullptr && world_->rank() != 0, "ModelRunner::follow: only MPI ranks other than 0 follow");
  for (;;) {
    const StepMessage message = exchange_step(*world_, nullptr);
    if (message.kind == StepKind::Stop) return;
    apply(*single_, message, nullptr);
  }
}

std::string ModelRunner::parameter_digest() {
  std::mutex refs_mutex;
  std::vector<ckpt::TensorRef> refs;
  auto add_refs = [&](const model::Transformer& model, const std::vector<ShardValues>& shards) {
    const model::ParameterStore& params = model.params();
    std::lock_guard lock(refs_mutex);
    for (const ShardValues& s : shards) {
      LOOM_CHECK(s.parameter >= 0 && static_cast<size_t>(s.parameter) < params.list().size(),
                 "weights digest: a rank sent a shard of parameter " + std::to_string(s.parameter) + " of " +
                     std::to_string(params.list().size()));
      const model::Parameter& p = params.list()[s.parameter];
      refs.push_back({p.name, p.global_shape(), DType::F32, s.values.data(), s.slice});
    }
  };
  std::vector<std::vector<ShardValues>> held;  // the values the refs point into
  held.reserve(static_cast<size_t>(tp_));
  if (world_ != nullptr) {
    execute(message_of(StepKind::Digest));
    held.push_back(own_shards(single_->model));
    const std::vector<std::string> others = gather_shards("", *world_);
    for (size_t r = 1; r < others.size(); ++r) held.push_back(decode_shards(others[r]));
    for (const auto& shards : held) add_refs(single_->model, shards);
    return ckpt::parameter_digest(refs);
  }
  std::mutex held_mutex;
  run([&](Rank& rank) {
    std::vector<ShardValues> shards = own_shards(rank.model);
    std::lock_guard lock(held_mutex);
    held.push_back(std::move(shards));
    add_refs(rank.model, held.back());
  });
  return ckpt::parameter_digest(refs);
}

}  // namespace loom::infer
