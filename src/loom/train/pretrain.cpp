#include "loom/train/pretrain.h"

#include <optional>

#include "loom/core/error.h"
#include "loom/train/batch_source.h"
#include "loom/train/run_ranks.h"

namespace loom::train {

TrainSummary pretrain(const config::RunConfig& config, std::ostream& out) {
  return run_on_ranks(config, out, [&](comm::Communicator& world) {
    LOOM_CHECK(!config.data.train_prefix.empty(),
               "data.train_prefix is empty: give the prefix of a dataset made by `loom data prepare`");
    const PretrainingSource train(config.data.train_prefix, config.data.seq_len, config.train.seed);
    std::optional<PretrainingSource> validation;
    if (!config.data.val_prefix.empty()) validation.emplace(config.data.val_prefix, config.data.seq_len, config.train.seed);
    return train_rank(config, world, train, validation ? &*validation : nullptr, out);
  });
}

}  // namespace loom::train
