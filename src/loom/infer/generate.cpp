#include "loom/infer/generate.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <ostream>

#include "loom/ckpt/checkpoint.h"
#include "loom/core/error.h"
#include "loom/core/philox.h"
#include "loom/infer/engine.h"
#include "loom/infer/inference_device.h"
#include "loom/train/model_setup.h"

namespace loom::infer {

Generator::Generator(const std::string& checkpoint_path, config::RuntimeDevice device, InferenceDtype dtype,
                     int speculative_tokens) {
  ckpt::LoadedCheckpoint checkpoint = ckpt::load_checkpoint(checkpoint_path);
  config_ = config::parse_config(checkpoint.config_yaml(), checkpoint.path() + "/manifest.json", {});
  tokenizer_ = data::make_tokenizer(config_.data.tokenizer);
  // A checkpoint's model is fixed: say so rather than suggest changing model.vocab_size.
  LOOM_CHECK(config_.model.vocab_size == 0 || config_.model.vocab_size >= tokenizer_->vocab_size(),
             checkpoint.path() + ": the model's vocabulary (" + std::to_string(config_.model.vocab_size) +
                 " ids) is smaller than tokenizer '" + config_.data.tokenizer + "' needs (" +
                 std::to_string(tokenizer_->vocab_size()) +
                 "); this checkpoint cannot generate with that tokenizer (was data.tokenizer changed after training?)");
  config_.model = train::resolve_model_config(config_.model, *tokenizer_);
  if (speculative_tokens > 0) {
    LOOM_CHECK(speculative_tokens <= config_.model.mtp_depths,
               checkpoint.path() + ": " + std::to_string(speculative_tokens) + " draft tokens a step need as many "
               "multi-token prediction depths; the model has " + std::to_string(config_.model.mtp_depths) +
               " (model.mtp_depths)");
    // One sequence: KV blocks for the whole context and its drafts, one Mamba state slot.
    EngineOptions engine;
    engine.device = device;
    engine.dtype = dtype;
    engine.speculative_tokens = speculative_tokens;
    engine.max_running = 1;
    engine.prefix_caching = false;
    engine.kv_cache_blocks = (config_.model.max_seq_len + speculative_tokens) / engine.block_size + 2;
    engine_ = std::make_unique<Engine>(checkpoint_path, engine);
    return;
  }
  model_ = std::make_unique<model::Transformer>(config_.model, model::TensorParallel{},
                                                inference_policy(inference_recipe(dtype, device)),
                                                std::vector<model::LayerRange>{}, model::ExpertLayout{},
                                                inference_device(device, 0));
  train::load_parameters(checkpoint, *model_);
  keep_weight_casts(*model_);
}

Generator::~Generator() = default;

Generator::Drafts Generator::drafts() const {
  if (!engine_) return {};
  return {engine_->metrics().spec_draft_tokens.load(), engine_->metrics().spec_accepted_tokens.load()};
}

// Through the engine with drafts: one request, stepped until it ends.
std::string Generator::continue_with_drafts(const std::vector<int32_t>& prompt, int64_t budget,
                                            const GenerateOptions& options) {
  RequestOptions request;
  request.sampling = options.sampling;
  request.seed = options.seed;
  request.max_tokens = budget;
  request.penalties = options.penalties;
  request.ignore_eos = !options.stop_at_eot;
  if (!options.stop.empty()) request.stop = {options.stop};
  const std::shared_ptr<RequestStream> stream = engine_->submit(prompt, request);
  std::string text;
  while (!stream->done()) {
    engine_->step();
    for (const SampleEvent& event : stream->pop(std::chrono::milliseconds(0))) text += event.text;
  }
  LOOM_CHECK(stream->error().empty(), "loom generate: " + stream->error());
  if (options.notices != nullptr) {
    const Drafts d = drafts();
    *options.notices << "loom generate: speculative decoding kept " << d.kept << " of " << d.drafted
                     << " drafted tokens" << std::endl;
  }
  return text;
}

std::string Generator::continue_text(const GenerateOptions& options) {
  std::vector<int32_t> tokens = options.parse_special ? tokenizer_->encode(options.prompt, data::EncodeOptions{})
                                                      : tokenizer_->encode(options.prompt);
  if (tokens.empty()) tokens.push_back(tokenizer_->eot_token());  // condition on "start of a document"
  const int64_t room = config_.model.max_seq_len - static_cast<int64_t>(tokens.size());
  LOOM_CHECK(room > 0, "the prompt is " + std::to_string(tokens.size()) + " tokens; the model's context is " +
                      std::to_string(config_.model.max_seq_len));
  const int64_t budget = std::min<int64_t>(options.max_tokens, room);
  if (budget < options.max_tokens && options.notices != nullptr) {
    *options.notices << "loom generate: note: generating " << budget << " tokens, not " << options.max_tokens
                     << ": the prompt is " << tokens.size() << " tokens and the model's context (model.max_seq_len) is "
                     << config_.model.max_seq_len << std::endl;
  }
  if (engine_) return continue_with_drafts(tokens, budget, options);
  // Padded vocabularies: ids at or above the tokenizer's are never sampled (their logits are
  // left out, which is masking them to -inf).
  const int64_t sampled_vocab = std::min<int64_t>(config_.model.vocab_size, tokenizer_->vocab_size());

  model::DecodeState state;
  const float* logits = model_->decode(state, tokens.data(), static_cast<int64_t>(tokens.size()));
  const uint64_t key = philox_key(options.seed, "generate");
  std::vector<int32_t> generated;
  std::string text;
  PenaltyCounts counts(options.penalties, tokens);
  std::vector<float> penalized;
  for (int64_t i = 0; i < budget; ++i) {
    const float* row = penalized_row(logits, config_.model.vocab_size, options.penalties, counts, penalized);
    int32_t next = model::sample_token(row, sampled_vocab, options.sampling, key, static_cast<uint64_t>(i));
    if (options.penalties.active()) counts.add_output(next);
    if (options.stop_at_eot && next == tokenizer_->eot_token()) break;
    generated.push_back(next);
    if (!options.stop.empty()) {
      text = tokenizer_->decode(generated);
      if (text.ends_with(options.stop)) return text.substr(0, text.size() - options.stop.size());
    }
    if (i + 1 < budget) logits = model_->decode(state, &next, 1);
  }
  return tokenizer_->decode(generated);
}

std::string generate_text(const std::string& checkpoint, const GenerateOptions& options) {
  Generator generator(checkpoint, options.device, options.dtype, options.speculative_tokens);
  return options.prompt + generator.continue_text(options);
}

}  // namespace loom::infer
