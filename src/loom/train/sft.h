#pragma once
// Supervised fine-tuning: chat conversations (sft.* keys) fed to the shared trainer, the loss
// on the trained roles' tokens only. See docs/sft.md.
#include <iosfwd>
#include <string>
#include <vector>

#include "loom/config/run_config.h"
#include "loom/data/chat/chat_dataset.h"
#include "loom/train/training_loop.h"

namespace loom::train {

// The chat dataset a config describes (read, split, tokenized, packed), as `loom sft` builds it:
// of sft.train_files, or of `paths` (one entry of a weighted blend, sft.train_weights).
data::ChatDataset build_sft_dataset(const config::RunConfig& config);
data::ChatDataset build_sft_dataset(const config::RunConfig& config, const std::vector<std::string>& paths);

// What the dataset holds: conversations, skipped lines, truncations, packing efficiency; its
// training rows under `train_label` ("sft: train: ...").
void report_sft_dataset(const data::ChatDataset& dataset, const config::RunConfig& config, std::ostream& out,
                        const std::string& train_label = "train");

// Runs `config` (validated) as `pretrain` does, on batches of sft.train_files.
TrainSummary sft(const config::RunConfig& config, std::ostream& out);

}  // namespace loom::train
