#pragma once
// Shared by the SFT tests: small conversation files written into a test's scratch directory, and
// a small model's SFT run on them.
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loom/config/run_config.h"
#include "loom/train/sft.h"

namespace loom::train::testing {

// `count` conversations: a question and an answer, distinct per file (`tag`) and index.
inline void write_conversations(const std::string& path, const std::string& tag, int count) {
  std::ofstream out(path);
  for (int i = 0; i < count; ++i) {
    out << R"({"messages": [{"role": "user", "content": ")" << tag << " question " << i * 7
        << R"("}, {"role": "assistant", "content": ")" << tag << " answer " << i * 11 << "\"}]}\n";
  }
}

// A 2-layer byte model's 4-step SFT run into root/name with the `sft` section (a YAML flow
// mapping) and `overrides`: global batch 8 of micro-batches of 2, evaluated every 2 steps.
inline config::RunConfig sft_test_config(const std::string& root, const std::string& name, const std::string& sft,
                                         const std::vector<std::string>& overrides) {
  const std::string yaml =
      "run: {dir: " + root + "/" + name + "}\n" +
      "model: {vocab_size: 0, d_model: 32, layers: 2, heads: 4, kv_heads: 2, ffn_size: 48, max_seq_len: 128}\n"
      "data: {tokenizer: byte, seq_len: 128}\n"
      "sft: " + sft + "\n"
      "optim: {lr: 1.0e-3, warmup_steps: 1, clip_grad: 1.0}\n"
      "train: {steps: 4, global_batch: 8, micro_batch: 2, threads: 1, eval_interval: 2, eval_batches: 2}\n"
      "log: {progress: false, interval: 100}\n";
  return config::parse_config(yaml, name, overrides);
}

// Runs `config` with loom sft and returns its metrics.jsonl records; the console into *console.
inline std::vector<nlohmann::json> sft_run(const config::RunConfig& config, std::string* console = nullptr) {
  std::ostringstream out;
  train::sft(config, out);
  if (console != nullptr) *console = out.str();
  std::vector<nlohmann::json> records;
  std::ifstream metrics(config.run.dir + "/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) records.push_back(nlohmann::json::parse(line));
  return records;
}

}  // namespace loom::train::testing
