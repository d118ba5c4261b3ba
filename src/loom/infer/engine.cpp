#include "loom/infer/engine.h"

#include <algorithm>
#include <cmath>

#include "loom/core/error.h"
#include "loom/core/philox.h"
#include "loom/train/model_setup.h"

namespace loom::infer {

namespace {
std::string version_of(const ckpt::LoadedCheckpoint& checkpoint) { return "step-" + std::to_string(checkpoint.step()); }

// Every parameter of `model` with its global shape: new weights must fit the running model.
void check_same_model(const config::ModelConfig& model, const ckpt::LoadedCheckpoint& checkpoint) {
  for (const model::Parameter& p : model::Transformer::parameter_list(model)) {
    LOOM_CHECK(checkpoint.has(p.name), "checkpoint " + checkpoint.path() + " has no tensor '" + p.name +
                                           "' that the served model needs (a different model config)");
    LOOM_CHECK(checkpoint.shape(p.name) == p.global_shape(),
               "checkpoint " + checkpoint.path() + ": tensor '" + p.name + "' has another shape than the served model's");
  }
}

// The event that ends sample `index` of a cancelled request.
SampleEvent aborted(int index) {
  SampleEvent event;
  event.index = index;
  event.finish_reason = "abort";
  return event;
}
}  // namespace

config::ModelConfig served_model_config(const ckpt::LoadedCheckpoint& checkpoint,
                                        std::unique_ptr<data::Tokenizer>& tokenizer) {
  config::RunConfig config =
      config::parse_config(checkpoint.config_yaml(), checkpoint.path() + "/manifest.json", {});
  tokenizer = data::make_tokenizer(config.data.tokenizer);
  LOOM_CHECK(config.model.vocab_size == 0 || config.model.vocab_size >= tokenizer->vocab_size(),
             checkpoint.path() + ": the model's vocabulary is smaller than tokenizer '" + config.data.tokenizer +
                 "' needs; this checkpoint cannot serve with that tokenizer");
  return train::resolve_model_config(config.model, *tokenizer);
}

RankSetup rank_setup(const EngineOptions& options) {
  RankSetup setup;
  setup.kv_cache_bytes = options.kv_cache_bytes;
  setup.kv_cache_blocks = options.kv_cache_blocks;
  setup.block_size = options.block_size;
  setup.state_slots = options.max_running;
  setup.device = options.device;
  setup.recipe = inference_recipe(options.dtype, options.device);
  setup.kv_dtype = kv_cache_dtype(options.kv_cache_dtype, setup.recipe);
  setup.draft_depths = options.speculative_tokens;
  return setup;
}

Engine::Engine(const std::string& checkpoint_path, EngineOptions options)
    : options_(options), setup_(rank_setup(options)), blocks_(1, 1) {
  LOOM_CHECK(options.block_size >= 1, "KV block size must be >= 1, got " + std::to_string(options.block_size));
  LOOM_CHECK(options.max_batch_tokens >= 1, "max batch tokens must be >= 1");
  LOOM_CHECK(options.max_running >= 1, "max running sequences must be >= 1");
  ckpt::LoadedCheckpoint checkpoint = ckpt::load_checkpoint(checkpoint_path);
  model_ = served_model_config(checkpoint, tokenizer_);
  sampled_vocab_ = std::min<int64_t>(model_.vocab_size, tokenizer_->vocab_size());
  LOOM_CHECK(options.speculative_tokens >= 0 && options.speculative_tokens <= model_.mtp_depths &&
                 options.speculative_tokens <= EngineMetrics::kMaxDraftPositions,
             "num_speculative_tokens: " + std::to_string(options.speculative_tokens) + " drafts need as many " +
                 "multi-token prediction depths; the model of " + checkpoint_path + " has " +
                 std::to_string(model_.mtp_depths) + " (model.mtp_depths)" +
                 (model_.mtp_depths > EngineMetrics::kMaxDraftPositions
                      ? ", of which at most " + std::to_string(EngineMetrics::kMaxDraftPositions) + " draft"
                      : std::string()));
  has_mamba_ = model_.layer_pattern.find('M') != std::string::npos;
  if (options.world != nullptr) {
    LOOM_CHECK(options.world->rank() == 0, "the serving engine runs on rank 0; other ranks run follow_engine");
    LOOM_CHECK(options.tp == options.world->size(),
               "--tp " + std::to_string(options.tp) + " but the MPI job has " + std::to_string(options.world->size()) +
                   " processes (mpirun -np): under mpirun every tensor-parallel rank is one process");
    runner_ = std::make_unique<ModelRunner>(model_, *options.world, checkpoint, setup_);
  } else {
    runner_ = std::make_unique<ModelRunner>(model_, options.tp, checkpoint, setup_);
  }
  blocks_ = BlockManager(runner_->blocks(), options.block_size);
  for (int64_t slot = runner_->state_slots() - 1; slot >= 0; --slot) free_slots_.push_back(static_cast<int32_t>(slot));
  // A Mamba state exists only where a prompt's computation stopped, not at every block
  // boundary: a cached KV prefix could not be resumed from.
  if (runner_->state_slots() > 0) options_.prefix_caching = false;
  // Drafting depths' rows at the positions after a cached prefix read tokens the prefix's first
  // prompt did not have: a cached block's draft keys and values would not be this prompt's.
  if (options.speculative_tokens > 0) options_.prefix_caching = false;
  weight_version_ = version_of(checkpoint);
  metrics_.kv_blocks_total = blocks_.blocks();
  metrics_.state_slots_total = runner_->state_slots();
  metrics_.state_pool_bytes = runner_->state_pool_bytes();
}

Engine::~Engine() = default;

std::string Engine::weight_version() const {
  std::lock_guard lock(mutex_);
  return weight_version_;
}

int64_t Engine::queued() const {
  std::lock_guard lock(mutex_);
  return static_cast<int64_t>(waiting_.size());
}

int64_t Engine::running() const { return running_samples_.load(); }

void Engine::validate(const std::vector<int32_t>& prompt, const RequestOptions& o) const {
  const int64_t ctx = model_.max_seq_len;
  LOOM_CHECK(!prompt.empty(), "prompt: the prompt is empty (no tokens)");
  LOOM_CHECK(static_cast<int64_t>(prompt.size()) < ctx,
             "prompt: the prompt is " + std::to_string(prompt.size()) + " tokens; the model's context is " +
                 std::to_string(ctx) + " tokens and at least one must be left to generate");
  for (int32_t t : prompt) {
    LOOM_CHECK(t >= 0 && t < sampled_vocab_, "prompt: token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                                                 std::to_string(sampled_vocab_) + ")");
  }
  LOOM_CHECK(o.max_tokens >= 1, "max_tokens: must be >= 1, got " + std::to_string(o.max_tokens));
  LOOM_CHECK(static_cast<int64_t>(prompt.size()) + o.max_tokens <= ctx,
             "max_tokens: the prompt (" + std::to_string(prompt.size()) + " tokens) plus max_tokens (" +
                 std::to_string(o.max_tokens) + ") exceeds the model's context of " + std::to_string(ctx) + " tokens");
  LOOM_CHECK(o.n >= 1 && o.n <= options_.max_running,
             "n: must be in [1, " + std::to_string(options_.max_running) + "], got " + std::to_string(o.n));
  const model::SamplingParams& s = o.sampling;
  LOOM_CHECK(std::isfinite(s.temperature) && s.temperature >= 0.0 && s.temperature <= 100.0,
             "temperature: must be in [0, 100], got " + std::to_string(s.temperature));
  LOOM_CHECK(std::isfinite(s.top_p) && s.top_p > 0.0 && s.top_p <= 1.0,
             "top_p: must be in (0, 1], got " + std::to_string(s.top_p));
  LOOM_CHECK(std::isfinite(s.min_p) && s.min_p >= 0.0 && s.min_p <= 1.0,
             "min_p: must be in [0, 1], got " + std::to_string(s.min_p));
  LOOM_CHECK(s.top_k >= 0, "top_k: must be >= 0 (0 = all tokens), got " + std::to_string(s.top_k));
  LOOM_CHECK(o.top_logprobs >= 0 && o.top_logprobs <= 20,
             "logprobs: must be in [0, 20], got " + std::to_string(o.top_logprobs));
  const Penalties& pen = o.penalties;
  LOOM_CHECK(std::isfinite(pen.presence) && std::fabs(pen.presence) <= 2.0,
             "presence_penalty: must be in [-2, 2], got " + std::to_string(pen.presence));
  LOOM_CHECK(std::isfinite(pen.frequency) && std::fabs(pen.frequency) <= 2.0,
             "frequency_penalty: must be in [-2, 2], got " + std::to_string(pen.frequency));
  LOOM_CHECK(std::isfinite(pen.repetition) && pen.repetition > 0.0 && pen.repetition <= 100.0,
             "repetition_penalty: must be in (0, 100], got " + std::to_string(pen.repetition));
  const int64_t bs = options_.block_size;
  const int64_t need = o.n * ((static_cast<int64_t>(prompt.size()) + o.max_tokens + bs - 1) / bs);
  LOOM_CHECK(need <= blocks_.blocks(), "max_tokens: n x (prompt + max_tokens) needs " + std::to_string(need) +
                                           " KV blocks; the cache holds " + std::to_string(blocks_.blocks()));
}

std::shared_ptr<RequestStream> Engine::submit(std::vector<int32_t> prompt, const RequestOptions& options) {
  validate(prompt, options);
  auto request = std::make_unique<Request>();
  const int64_t id = next_id_++;
  request->options = options;
  request->key = philox_key(options.seed.value_or(static_cast<uint64_t>(id) * 0x9E3779B97F4A7C15ull), "serve");
  const int64_t bs = options_.block_size;
  request->reserve = (static_cast<int64_t>(prompt.size()) + options.max_tokens + bs - 1) / bs;
  request->arrival = std::chrono::steady_clock::now();
  auto first = std::make_unique<Sample>();
  first->request = request.get();
  first->tokens = prompt;
  first->text = std::make_unique<TextOutput>(*tokenizer_, options.stop);
  first->counts = PenaltyCounts(options.penalties, prompt);
  request->samples.push_back(std::move(first));
  request->stream = std::make_shared<RequestStream>(id, std::move(prompt), options.n);
  auto stream = request->stream;
  {
    std::lock_guard lock(mutex_);
    LOOM_CHECK(!stop_, "the server is shutting down");
    stream->set_weight_version(weight_version_);
    waiting_.push_back(std::move(request));
  }
  metrics_.requests++;
  wake_.notify_all();
  return stream;
}

std::string Engine::load_weights(const std::string& checkpoint, const std::string& version) {
  std::unique_lock lock(mutex_);
  pending_load_ = checkpoint;
  pending_version_ = version;
  const uint64_t ticket = ++loads_requested_;
  wake_.notify_all();
  loaded_.wait(lock, [&] { return loads_done_ >= ticket; });
  if (!load_error_.empty()) throw Error(load_error_);
  return weight_version_;
}

void Engine::apply_pending_load() {
  std::string path, version;
  {
    std::lock_guard lock(mutex_);
    if (loads_done_ == loads_requested_) return;
    path = pending_load_;
    version = pending_version_;
  }
  std::string error, new_version;
  try {
    ckpt::LoadedCheckpoint checkpoint = ckpt::load_checkpoint(path);
    check_same_model(model_, checkpoint);
    runner_->load(checkpoint);
    blocks_.clear_prefix_cache();
    new_version = version.empty() ? version_of(checkpoint) : version;
  } catch (const std::exception& e) {
    error = e.what();
  }
  {
    std::lock_guard lock(mutex_);
    load_error_ = error;
    if (error.empty()) weight_version_ = new_version;
    loads_done_ = loads_requested_;
  }
  loaded_.notify_all();
}

std::pair<std::string, std::string> Engine::weights_digest() {
  std::unique_lock lock(mutex_);
  const uint64_t ticket = ++digests_requested_;
  wake_.notify_all();
  loaded_.wait(lock, [&] { return digests_done_ >= ticket; });
  if (!digest_error_.empty()) throw Error(digest_error_);
  return {digest_, weight_version_};
}

void Engine::apply_pending_digest() {
  {
    std::lock_guard lock(mutex_);
    if (digests_done_ == digests_requested_) return;
  }
  std::string digest, error;
  try {
    digest = runner_->parameter_digest();
  } catch (const std::exception& e) {
    error = e.what();
  }
  {
    std::lock_guard lock(mutex_);
    digest_ = digest;
    digest_error_ = error;
    digests_done_ = digests_requested_;
  }
  loaded_.notify_all();
}

void Engine::run() {
  for (;;) {
    {
      std::lock_guard lock(mutex_);
      if (stop_ && (!drain_ || (waiting_.empty() && running_.empty()))) break;
    }
    if (!step()) {
      runner_->keep_alive();
      std::unique_lock lock(mutex_);
      wake_.wait_for(lock, std::chrono::milliseconds(20));
    }
  }
  // Not drained: every request still here ends with "abort".
  std::lock_guard lock(mutex_);
  for (auto& r : running_) r->stream->cancel();
  for (auto& r : waiting_) r->stream->cancel();
}

void Engine::stop(bool drain) {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
    drain_ = drain;
  }
  wake_.notify_all();
}

int64_t Engine::outstanding_reserve() const {
  int64_t total = 0;
  for (const auto& r : running_) {
    for (const auto& s : r->samples) {
      if (!s->finished) total += std::max<int64_t>(0, r->reserve - static_cast<int64_t>(s->table.size()));
    }
    if (r->samples.size() < static_cast<size_t>(r->options.n)) {
      total += (r->options.n - static_cast<int64_t>(r->samples.size())) * r->reserve;
    }
  }
  return total;
}

void Engine::admit() {
  std::lock_guard lock(mutex_);
  while (!waiting_.empty()) {
    Request& r = *waiting_.front();
    if (r.stream->cancelled()) {
      for (int i = 0; i < r.options.n; ++i) r.stream->push(aborted(i));
      waiting_.pop_front();
      continue;
    }
    const int64_t need = r.options.n * r.reserve;
    if (running_samples_ + r.options.n > options_.max_running) break;
    if (need > blocks_.free_blocks() - outstanding_reserve()) break;
    running_samples_ += r.options.n;
    r.samples.front()->slot = take_slot();
    metrics_.prompt_tokens += static_cast<int64_t>(r.stream->prompt().size());
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
}

void Engine::finish(Sample& sample, const std::string& reason) {
  if (sample.finished) return;
  sample.finished = true;
  blocks_.release_all(sample.table);
  sample.table.clear();
  if (sample.slot >= 0) free_slots_.push_back(sample.slot);
  sample.slot = -1;
  running_samples_--;
  if (reason == "abort") sample.request->stream->push(aborted(sample.index));
}

// A state slot for a sample of a hybrid model (-1 otherwise). Admission keeps running samples
// within max_running, the pool's size, so one is always free.
int32_t Engine::take_slot() {
  if (runner_->state_slots() == 0) return -1;
  LOOM_CHECK(!free_slots_.empty(), "no Mamba state slot is free (more samples running than --max-running)");
  const int32_t slot = free_slots_.back();
  free_slots_.pop_back();
  return slot;
}

void Engine::drop_finished() {
  for (auto it = running_.begin(); it != running_.end();) {
    Request& r = **it;
    if (r.stream->cancelled()) {
      for (auto& s : r.samples) finish(*s, "abort");
      for (int i = static_cast<int>(r.samples.size()); i < r.options.n; ++i) {
        r.stream->push(aborted(i));
        running_samples_--;
      }
    }
    const bool all_done = std::all_of(r.samples.begin(), r.samples.end(), [](const auto& s) { return s->finished; });
    if (all_done && (r.samples.size() == static_cast<size_t>(r.options.n) || r.stream->cancelled())) {
      metrics_.requests_finished++;
      it = running_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace loom::infer
