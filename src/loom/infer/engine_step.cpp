// Engine::step: which rows go into this step's forward, and what follows from its logits.
#include <algorithm>

#include "loom/core/error.h"
#include "loom/core/trace.h"
#include "loom/infer/engine.h"

namespace loom::infer {

bool Engine::step() {
  apply_pending_load();
  apply_pending_digest();
  drop_finished();
  admit();
  metrics_.kv_blocks_in_use = blocks_.used_blocks();
  metrics_.state_slots_in_use = runner_->state_slots() - static_cast<int64_t>(free_slots_.size());
  model::PagedBatch batch;
  std::vector<Sample*> stepped;
  std::vector<int64_t> taken;
  if (!build_batch(batch, stepped, taken)) return false;
  // Named for profilers (core/trace.h: NVTX's domain loom), a step with work only: its forward,
  // its sampling; fixed names, so that a profiler's statistics gather every step's.
  trace::Range range("engine step");
  trace::Range forward_range("engine forward");
  const float* logits = runner_->forward(batch);
  forward_range.end();
  metrics_.steps++;
  std::vector<Sample*> sampled;
  for (size_t i = 0; i < stepped.size(); ++i) {
    Sample& s = *stepped[i];
    if (s.computed + taken[i] == static_cast<int64_t>(s.tokens.size())) sampled.push_back(&s);
  }
  trace::Range sampling_range("engine sampling");
  after_forward(logits, sampled, taken, stepped);
  sampling_range.end();
  drop_finished();
  metrics_.kv_blocks_in_use = blocks_.used_blocks();
  metrics_.state_slots_in_use = runner_->state_slots() - static_cast<int64_t>(free_slots_.size());
  return true;
}

void Engine::ensure_blocks(Sample& sample, int64_t positions) {
  const int64_t bs = options_.block_size;
  while (static_cast<int64_t>(sample.table.size()) * bs < positions) sample.table.push_back(blocks_.allocate());
}

bool Engine::build_batch(model::PagedBatch& batch, std::vector<Sample*>& stepped, std::vector<int64_t>& taken) {
  int64_t budget = options_.max_batch_tokens;
  auto take = [&](Sample& s, int64_t rows) {
    ensure_blocks(s, s.computed + rows);
    stepped.push_back(&s);
    taken.push_back(rows);
    budget -= rows;
  };
  // Decoding samples first (one row each), so prompts never delay them; then prompt chunks.
  for (auto& r : running_) {
    for (auto& s : r->samples) {
      const int64_t prompt = static_cast<int64_t>(r->stream->prompt().size());
      if (!s->finished && s->computed >= prompt && budget > 0) take(*s, 1);
    }
  }
  const size_t decoding = stepped.size();
  for (auto& r : running_) {
    for (auto& s : r->samples) {
      const int64_t prompt = static_cast<int64_t>(r->stream->prompt().size());
      // A prompt starting now reuses the blocks of any prefix already computed (earlier chunks).
      if (options_.prefix_caching && !s->finished && s->computed == 0 && s->table.empty() && budget > 0) reuse_prefix(*s);
      const int64_t pending = static_cast<int64_t>(s->tokens.size()) - s->computed;
      if (!s->finished && s->computed < prompt && budget > 0) take(*s, std::min(pending, budget));
    }
  }
  if (stepped.empty()) return false;
  size_t width = 1;
  for (Sample* s : stepped) width = std::max(width, s->table.size());
  batch.table_width = static_cast<int64_t>(width);
  batch.block_tables.assign(stepped.size() * width, 0);
  for (size_t i = 0; i < stepped.size(); ++i) {
    Sample& s = *stepped[i];
    std::copy(s.table.begin(), s.table.end(), batch.block_tables.begin() + i * width);
    batch.state_slots.push_back(s.slot);
    if (i >= decoding) batch.prompt_entries.push_back(static_cast<int32_t>(i));
    for (int64_t p = s.computed; p < s.computed + taken[i]; ++p) {
      batch.tokens.push_back(s.tokens[p]);
      batch.positions.push_back(static_cast<int32_t>(p));
      batch.sequences.push_back(static_cast<int32_t>(i));
    }
    if (s.computed + taken[i] == static_cast<int64_t>(s.tokens.size())) batch.logit_rows.push_back(batch.rows() - 1);
  }
  return true;
}

void Engine::after_forward(const float* logits, const std::vector<Sample*>& sampled, const std::vector<int64_t>& taken,
                           const std::vector<Sample*>& stepped) {
  for (size_t i = 0; i < stepped.size(); ++i) {
    stepped[i]->computed += taken[i];
    if (options_.prefix_caching) publish_prefix(*stepped[i]);
  }
  const int64_t V = model_.vocab_size;
  for (size_t i = 0; i < sampled.size(); ++i) {
    Sample& s = *sampled[i];
    Request& r = *s.request;
    const float* row = logits + static_cast<int64_t>(i) * V;
    if (s.index == 0 && r.samples.size() < static_cast<size_t>(r.options.n)) {
      fork(s);
      for (size_t k = 1; k < r.samples.size(); ++k) sample_next(*r.samples[k], row);
    }
    sample_next(s, row);
  }
}

void Engine::fork(Sample& parent) {
  Request& r = *parent.request;
  const int64_t bs = options_.block_size;
  const bool partial = parent.computed % bs != 0;
  for (int index = 1; index < r.options.n; ++index) {
    auto child = std::make_unique<Sample>();
    child->request = &r;
    child->index = index;
    child->tokens = parent.tokens;
    child->computed = parent.computed;
    child->text = std::make_unique<TextOutput>(*tokenizer_, r.options.stop);
    child->table = parent.table;
    // Full blocks are shared; the partial last one, which each sample goes on writing, is copied.
    const size_t shared = partial ? parent.table.size() - 1 : parent.table.size();
    for (size_t b = 0; b < shared; ++b) blocks_.share(parent.table[b]);
    if (partial) {
      child->table.back() = blocks_.allocate();
      runner_->copy_block(parent.table.back(), child->table.back());
    }
    // Mamba layers: the prompt's final state, from which each sample goes on on its own.
    child->slot = take_slot();
    if (child->slot >= 0) runner_->copy_state_slot(parent.slot, child->slot);
    r.samples.push_back(std::move(child));
  }
}

void Engine::sample_next(Sample& s, const float* logits) {
  Request& r = *s.request;
  const RequestOptions& o = r.options;
  const uint64_t counter = (static_cast<uint64_t>(s.index) << 32) | static_cast<uint64_t>(s.generated);
  const int32_t token = model::sample_token(logits, sampled_vocab_, o.sampling, r.key, counter);
  SampleEvent event;
  event.index = s.index;
  event.tokens.push_back(token);
  event.logprobs.push_back(token_logprobs(logits, model_.vocab_size, token, o.top_logprobs));
  s.tokens.push_back(token);
  ++s.generated;
  metrics_.generation_tokens++;
  const auto now = std::chrono::steady_clock::now();
  if (!r.first_token) {
    r.first_token = true;
    metrics_.time_to_first_token.observe(std::chrono::duration<double>(now - r.arrival).count());
  } else if (s.generated > 1) {
    metrics_.inter_token_latency.observe(std::chrono::duration<double>(now - s.last_token).count());
  }
  s.last_token = now;
  const bool stop_token = (token == tokenizer_->eot_token() && !o.ignore_eos) ||
                          std::find(o.stop_token_ids.begin(), o.stop_token_ids.end(), token) != o.stop_token_ids.end();
  std::string reason;
  if (stop_token || s.text->add(token)) {
    reason = "stop";
  } else if (s.generated >= o.max_tokens || static_cast<int64_t>(s.tokens.size()) >= model_.max_seq_len) {
    reason = "length";
  }
  event.text = s.text->take(!reason.empty());
  event.finish_reason = reason;
  r.stream->push(std::move(event));
  if (!reason.empty()) finish(s, reason);
}

void Engine::reuse_prefix(Sample& s) {
  const int64_t bs = options_.block_size, prompt = static_cast<int64_t>(s.tokens.size());
  uint64_t hash = 0;
  // The last prompt position is always computed: its logits give the first token.
  for (int64_t b = 0; (b + 1) * bs <= prompt - 1; ++b) {
    hash = BlockManager::chain_hash(hash, std::span<const int32_t>(s.tokens.data() + b * bs, bs));
    const int32_t block = blocks_.lookup(hash);
    if (block < 0) break;
    blocks_.share(block);
    s.table.push_back(block);
    s.computed = (b + 1) * bs;
  }
  metrics_.cached_prompt_tokens += s.computed;
}

void Engine::publish_prefix(Sample& s) {
  const int64_t bs = options_.block_size;
  const int64_t prompt = static_cast<int64_t>(s.request->stream->prompt().size());
  const int64_t full = std::min(s.computed, prompt) / bs;
  uint64_t hash = 0;
  for (int64_t b = 0; b < full; ++b) {
    hash = BlockManager::chain_hash(hash, std::span<const int32_t>(s.tokens.data() + b * bs, bs));
    blocks_.publish(hash, s.table[b]);
  }
}

}  // namespace loom::infer
