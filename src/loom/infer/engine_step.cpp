// Engine::step: which rows go into this step's forward, and what follows from its logits.
#include <algorithm>

#include "loom/core/error.h"
#include "loom/core/philox.h"
#include "loom/core/trace.h"
#include "loom/infer/engine.h"
#include "loom/infer/speculative.h"

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
    if (s.computed + taken[i] == static_cast<int64_t>(s.tokens.size() + s.drafts.size())) sampled.push_back(&s);
  }
  trace::Range sampling_range("engine sampling");
  after_forward(logits, sampled, taken, stepped);
  sampling_range.end();
  if (options_.speculative_tokens > 0) {
    trace::Range drafting_range("engine drafting");
    draft_step();
  }
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
  // Decoding samples first (one row each, and one per draft to verify), so prompts never delay
  // them; then prompt chunks. A sample whose drafts do not all fit waits for a later step with
  // them: cutting its drafts would make its seeded tokens depend on what else is in the batch.
  // The first always fits (step_drafters drafts no more than max_batch_tokens - 1).
  for (auto& r : running_) {
    for (auto& s : r->samples) {
      const int64_t prompt = static_cast<int64_t>(r->stream->prompt().size());
      const int64_t rows = 1 + static_cast<int64_t>(s->drafts.size());
      if (s->finished || s->computed < prompt || rows > budget) continue;
      take(*s, rows);
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
  set_block_tables(batch, stepped);
  for (size_t i = 0; i < stepped.size(); ++i) {
    Sample& s = *stepped[i];
    batch.state_slots.push_back(s.slot);
    if (i >= decoding) batch.prompt_entries.push_back(static_cast<int32_t>(i));
    s.step_row = batch.rows();
    s.step_position = s.computed;
    const auto known = static_cast<int64_t>(s.tokens.size());
    for (int64_t p = s.computed; p < s.computed + taken[i]; ++p) {
      batch.tokens.push_back(p < known ? s.tokens[p] : s.drafts[static_cast<size_t>(p - known)]);
      batch.positions.push_back(static_cast<int32_t>(p));
      batch.sequences.push_back(static_cast<int32_t>(i));
    }
    // The last known token's logits, and with drafts each draft's (its verification).
    const int64_t end = s.computed + taken[i];
    if (end == known + static_cast<int64_t>(s.drafts.size())) {
      for (int64_t p = known - 1; p < end; ++p) batch.logit_rows.push_back(batch.rows() - (end - p));
    }
    add_snapshots(batch, s, taken[i]);
  }
  return true;
}

void Engine::set_block_tables(model::PagedBatch& batch, const std::vector<Sample*>& samples) {
  size_t width = 1;
  for (const Sample* s : samples) width = std::max(width, s->table.size());
  batch.table_width = static_cast<int64_t>(width);
  batch.block_tables.assign(samples.size() * width, 0);
  for (size_t i = 0; i < samples.size(); ++i) {
    std::copy(samples[i]->table.begin(), samples[i]->table.end(), batch.block_tables.begin() + i * width);
  }
}

// A hybrid model's verification rows: the Mamba state after each draft's row is kept, so that the
// state after the last row kept can be restored (the last row's stays in the sample's slot).
void Engine::add_snapshots(model::PagedBatch& batch, const Sample& s, int64_t rows) {
  if (!has_mamba_ || options_.speculative_tokens == 0) return;
  batch.snapshot_slots.resize(static_cast<size_t>(batch.rows()), -1);
  for (size_t j = 0; j < s.drafts.size(); ++j) {
    batch.snapshot_slots[static_cast<size_t>(batch.rows() - rows) + j] = snapshot_slot(s.slot, static_cast<int>(j));
  }
}

void Engine::after_forward(const float* logits, const std::vector<Sample*>& sampled, const std::vector<int64_t>& taken,
                           const std::vector<Sample*>& stepped) {
  for (size_t i = 0; i < stepped.size(); ++i) {
    stepped[i]->computed += taken[i];
    if (options_.prefix_caching) publish_prefix(*stepped[i]);
  }
  const int64_t V = model_.vocab_size;
  int64_t logit_row = 0;
  for (Sample* sample : sampled) {
    Sample& s = *sample;
    Request& r = *s.request;
    const float* row = logits + logit_row * V;
    logit_row += 1 + static_cast<int64_t>(s.drafts.size());
    if (!s.drafts.empty()) {
      verify_drafts(s, row);
      continue;
    }
    if (s.index == 0 && r.samples.size() < static_cast<size_t>(r.options.n)) {
      fork(s);
      for (size_t k = 1; k < r.samples.size(); ++k) sample_next(*r.samples[k], row);
    }
    sample_next(s, row);
  }
}

void Engine::verify_drafts(Sample& s, const float* logits) {
  Request& r = *s.request;
  const RequestOptions& o = r.options;
  const int64_t V = model_.vocab_size, drafted = static_cast<int64_t>(s.drafts.size());
  const int64_t last = static_cast<int64_t>(s.tokens.size()) - 1;  // the position verification starts at
  std::vector<int32_t> drafts = std::move(s.drafts);
  std::vector<model::TokenDistribution> from = std::move(s.draft_distributions);
  s.drafts.clear();
  s.draft_distributions.clear();
  int64_t kept = 0;
  int32_t next = -1;  // the token in place of the first draft refused
  while (kept < drafted && !s.finished) {
    const float* row = logits + kept * V;
    const model::TokenDistribution target =
        model::token_distribution(drawn_from(s, row), sampled_vocab_, o.sampling);
    const uint64_t counter = draw_counter(s);
    if (!accept_draft(target, from[kept], drafts[kept], philox_uniform(r.key, counter, kAcceptStream))) {
      next = residual_token(target, from[kept], philox_uniform(r.key, counter));
      break;
    }
    emit_token(s, drafts[kept], row);
    ++kept;
  }
  metrics_.count_drafts(drafted, kept);
  if (s.finished) return;
  // The positions verified: the last known token's and the kept drafts'; the rows after them
  // are overwritten before anything reads them (a Mamba layer's state is restored here).
  s.computed = last + kept + 1;
  if (kept < drafted && has_mamba_) runner_->copy_state_slot(snapshot_slot(s.slot, static_cast<int>(kept)), s.slot);
  const float* row = logits + kept * V;
  if (next < 0) {  // every draft kept: the token after them from the last row
    sample_next(s, row);
  } else {
    emit_token(s, next, row);
  }
}

void Engine::fork(Sample& parent) {
  Request& r = *parent.request;
  const int64_t bs = options_.block_size;
  // Full blocks are shared; the partial last one, which each sample goes on writing, is copied,
  // and so is every block holding the last `speculative_tokens` prompt positions, where each
  // sample's drafting depths write rows that read its own first token.
  const auto first_own = static_cast<size_t>(std::max<int64_t>(parent.computed - options_.speculative_tokens, 0) / bs);
  for (int index = 1; index < r.options.n; ++index) {
    auto child = std::make_unique<Sample>();
    child->request = &r;
    child->index = index;
    child->tokens = parent.tokens;
    child->computed = parent.computed;
    child->text = std::make_unique<TextOutput>(*tokenizer_, r.options.stop);
    child->table = parent.table;
    child->depth_done = parent.depth_done;
    child->kept_half = parent.kept_half;
    child->step_row = parent.step_row;
    child->step_position = parent.step_position;
    child->counts = parent.counts;
    for (size_t b = 0; b < parent.table.size(); ++b) {
      if (b < first_own) {
        blocks_.share(parent.table[b]);
      } else {
        child->table[b] = blocks_.allocate();
        runner_->copy_block(parent.table[b], child->table[b]);
      }
    }
    // Mamba layers: the prompt's final state, from which each sample goes on on its own.
    child->slot = take_slot();
    if (child->slot >= 0) runner_->copy_state_slot(parent.slot, child->slot);
    r.samples.push_back(std::move(child));
  }
}

void Engine::sample_next(Sample& s, const float* logits) {
  Request& r = *s.request;
  const float* row = drawn_from(s, logits);
  emit_token(s, model::sample_token(row, sampled_vocab_, r.options.sampling, r.key, draw_counter(s)), logits);
}

const float* Engine::drawn_from(const Sample& s, const float* logits) {
  return penalized_row(logits, model_.vocab_size, s.request->options.penalties, s.counts, penalized_);
}

void Engine::emit_token(Sample& s, int32_t token, const float* logits) {
  Request& r = *s.request;
  const RequestOptions& o = r.options;
  SampleEvent event;
  event.index = s.index;
  event.tokens.push_back(token);
  event.logprobs.push_back(token_logprobs(logits, model_.vocab_size, token, o.top_logprobs));
  s.tokens.push_back(token);
  if (o.penalties.active()) s.counts.add_output(token);
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
