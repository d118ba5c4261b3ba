#pragma once
// Shared by the training tests: a scratch directory with a small byte-level dataset, training a
// run from YAML into it, reading back metrics.jsonl, and comparing two runs' checkpoints.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "loom/ckpt/checkpoint.h"
#include "loom/data/prepare.h"
#include "loom/data/tokenizer.h"
#include "loom/train/pretrain.h"
#include "loom/config/run_config.h"

namespace loom::train::testing {

// Creates <tmp>/loom-<tag>-<pid> holding the dataset prefix data/c_train; returns its path. The
// first call for a tag in this process removes what a finished process with the same pid left
// there (pids are reused over a long test run); later calls keep this process's runs.
inline std::string make_training_root(const std::string& tag) {
  namespace fs = std::filesystem;
  static std::mutex mutex;
  static std::set<std::string> made;
  const std::string root = (fs::temp_directory_path() / ("loom-" + tag + "-" + std::to_string(::getpid()))).string();
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (made.insert(root).second) fs::remove_all(root);
  }
  fs::create_directories(root);
  std::string text;
  for (int i = 0; i < 300; ++i) text += "It is a truth universally acknowledged, item " + std::to_string(i * 7) + ".\n\n";
  std::ofstream(root + "/corpus.txt") << text;
  auto tokenizer = data::make_tokenizer("byte");
  data::prepare_dataset({root + "/corpus.txt"}, *tokenizer, root + "/data/c", 0.0, 1);
  return root;
}

// The data section for the dataset under `root`.
inline std::string data_section(const std::string& root) {
  return "data: {tokenizer: byte, train_prefix: " + root + "/data/c_train, seq_len: 16}\n";
}

// Trains `yaml` (with overrides) into root/name and returns metrics.jsonl's records; the
// console output goes to *console when given.
inline std::vector<nlohmann::json> train_run(const std::string& root, const std::string& name, const std::string& yaml,
                                             const std::vector<std::string>& overrides, std::string* console = nullptr) {
  config::RunConfig config =
      config::parse_config("run: {dir: " + root + "/" + name + "}\n" + yaml, name, overrides);
  std::ostringstream out;
  pretrain(config, out);
  if (console != nullptr) *console = out.str();
  std::vector<nlohmann::json> records;
  std::ifstream metrics(root + "/" + name + "/metrics.jsonl");
  std::string line;
  while (std::getline(metrics, line)) records.push_back(nlohmann::json::parse(line));
  return records;
}

// Every record's value of `key`, as T.
template <class T>
std::vector<T> column(const std::vector<nlohmann::json>& records, const std::string& key) {
  std::vector<T> values;
  for (const nlohmann::json& r : records) values.push_back(r.at(key).get<T>());
  return values;
}

inline std::vector<double> losses_of(const std::vector<nlohmann::json>& records) {
  return column<double>(records, "loss");
}

// Max over the tensors `names` of max|a - b| / max|a| between the latest checkpoints of the
// runs root/a and root/b.
inline double checkpoint_difference(const std::string& root, const std::string& a, const std::string& b,
                                    const std::function<std::vector<std::string>(const ckpt::LoadedCheckpoint&)>& names,
                                    const std::function<void(const std::string&, double)>& per_tensor = {}) {
  ckpt::LoadedCheckpoint ca = ckpt::load_checkpoint(root + "/" + a + "/checkpoints");
  ckpt::LoadedCheckpoint cb = ckpt::load_checkpoint(root + "/" + b + "/checkpoints");
  double worst = 0.0;
  for (const std::string& name : names(ca)) {
    Shape shape = ca.shape(name);
    std::vector<float> va(shape_numel(shape)), vb(va.size());
    ca.read(name, va.data(), DType::F32, shape);
    cb.read(name, vb.data(), DType::F32, shape);
    double diff = 0.0, scale = 1e-30;
    for (size_t i = 0; i < va.size(); ++i) {
      diff = std::max(diff, static_cast<double>(std::fabs(va[i] - vb[i])));
      scale = std::max(scale, static_cast<double>(std::fabs(va[i])));
    }
    if (per_tensor) per_tensor(name, diff / scale);
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

// Every step's loss of `other` within relative `tolerance` of `reference`'s steps from + 1, ...
inline void expect_same_losses(const std::vector<double>& reference, const std::vector<double>& other, size_t from = 0,
                               double tolerance = 1e-5) {
  ASSERT_EQ(reference.size(), other.size() + from);
  for (size_t i = 0; i < other.size(); ++i) {
    EXPECT_NEAR(other[i], reference[from + i], tolerance * std::fabs(reference[from + i])) << "step " << from + i + 1;
  }
}

// The largest relative difference between the final parameters and moments of runs root/a and
// root/b (which must hold the same tensors); each tensor over 1e-5 is a failure naming it.
inline double state_difference(const std::string& root, const std::string& a, const std::string& b) {
  EXPECT_EQ(ckpt::load_checkpoint(root + "/" + a + "/checkpoints").names(),
            ckpt::load_checkpoint(root + "/" + b + "/checkpoints").names());
  auto compared = [](const ckpt::LoadedCheckpoint& c) {
    // A key bias does not change the function (softmax ignores a shift shared by all keys):
    // its gradient is rounding noise, which Adam amplifies to lr-sized steps of any sign.
    std::vector<std::string> names;
    for (const std::string& name : c.names())
      if (name.find("k_proj.bias") == std::string::npos) names.push_back(name);
    return names;
  };
  return checkpoint_difference(root, a, b, compared, [](const std::string& name, double difference) {
    if (difference > 1e-5) ADD_FAILURE() << name << ": relative difference " << difference;
  });
}

}  // namespace loom::train::testing
