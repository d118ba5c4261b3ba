#include "loom/infer/generate.h"

#include <algorithm>
#include <ostream>

#include "loom/ckpt/checkpoint.h"
#include "loom/core/error.h"
#include "loom/core/philox.h"
#include "loom/data/tokenizer.h"
#include "loom/train/model_setup.h"

namespace loom::infer {

std::string generate_text(const std::string& checkpoint_path, const GenerateOptions& options) {
  ckpt::LoadedCheckpoint checkpoint = ckpt::load_checkpoint(checkpoint_path);
  config::RunConfig config = config::parse_config(checkpoint.config_yaml(), checkpoint.path() + "/manifest.json", {});
  auto tokenizer = data::make_tokenizer(config.data.tokenizer);
  // A checkpoint's model is fixed: say so rather than suggest changing model.vocab_size.
  LOOM_CHECK(config.model.vocab_size == 0 || config.model.vocab_size >= tokenizer->vocab_size(),
             checkpoint.path() + ": the model's vocabulary (" + std::to_string(config.model.vocab_size) +
                 " ids) is smaller than tokenizer '" + config.data.tokenizer + "' needs (" +
                 std::to_string(tokenizer->vocab_size()) +
                 "); this checkpoint cannot generate with that tokenizer (was data.tokenizer changed after training?)");
  config.model = train::resolve_model_config(config.model, *tokenizer);
  model::Transformer model(config.model);
  train::load_parameters(checkpoint, model);

  std::vector<int32_t> tokens = tokenizer->encode(options.prompt);
  if (tokens.empty()) tokens.push_back(tokenizer->eot_token());  // condition on "start of a document"
  const int64_t room = config.model.max_seq_len - static_cast<int64_t>(tokens.size());
  LOOM_CHECK(room > 0, "the prompt is " + std::to_string(tokens.size()) + " tokens; the model's context is " +
                      std::to_string(config.model.max_seq_len));
  const int64_t budget = std::min<int64_t>(options.max_tokens, room);
  if (budget < options.max_tokens && options.notices != nullptr) {
    *options.notices << "loom generate: note: generating " << budget << " tokens, not " << options.max_tokens
                     << ": the prompt is " << tokens.size() << " tokens and the model's context (model.max_seq_len) is "
                     << config.model.max_seq_len << std::endl;
  }
  // Padded vocabularies: ids at or above the tokenizer's are never sampled (their logits are
  // left out, which is masking them to -inf).
  const int64_t sampled_vocab = std::min<int64_t>(config.model.vocab_size, tokenizer->vocab_size());

  model::DecodeState state;
  const float* logits = model.decode(state, tokens.data(), static_cast<int64_t>(tokens.size()));
  const uint64_t key = philox_key(options.seed, "generate");
  std::vector<int32_t> generated;
  for (int64_t i = 0; i < budget; ++i) {
    int32_t next = model::sample_token(logits, sampled_vocab, options.sampling, key, static_cast<uint64_t>(i));
    if (options.stop_at_eot && next == tokenizer->eot_token()) break;
    generated.push_back(next);
    if (i + 1 < budget) logits = model.decode(state, &next, 1);
  }
  return options.prompt + tokenizer->decode(generated);
}

}  // namespace loom::infer
