#include "loom/config/metrics.h"

#include <filesystem>
#include <sstream>
#include <system_error>

#include "loom/core/atomic_file.h"
#include "loom/core/error.h"

namespace loom::config {

void keep_lines_below(const std::string& path, const std::string& key, int64_t end) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return;
  std::istringstream in(read_file(path));
  std::string kept;
  std::string line;
  while (std::getline(in, line)) {
    auto object = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!object.is_object()) continue;
    auto value = object.find(key);
    if (value == object.end() || !value->is_number_integer()) continue;
    if (value->get<int64_t>() < end) kept.append(line).append("\n");
  }
  write_file_atomic(path, kept);
}

MetricsWriter::MetricsWriter(const std::string& run_dir, int64_t resume_from_step, bool tensorboard) {
  LOOM_CHECK(resume_from_step >= 0, "metrics: resume step = " + std::to_string(resume_from_step) + " must be >= 0");
  std::error_code ec;
  std::filesystem::create_directories(run_dir, ec);
  if (ec) throw Error("cannot create run directory '" + run_dir + "': " + ec.message());
  path_ = (std::filesystem::path(run_dir) / "metrics.jsonl").string();
  const bool exists = std::filesystem::exists(path_, ec);
  if (resume_from_step > 0 && exists) keep_lines_below(path_, "step", resume_from_step);
  else write_file_atomic(path_, "");
  out_.open(path_, std::ios::out | std::ios::app | std::ios::binary);
  if (!out_) throw Error("cannot open '" + path_ + "' for appending");
  if (tensorboard) tensorboard_.emplace(run_dir, resume_from_step);
}

void MetricsWriter::write(const nlohmann::json& object) {
  LOOM_CHECK(object.is_object(), "metrics: a metrics line must be a JSON object, got " + object.dump());
  std::string line;
  try {
    line = object.dump();
  } catch (const nlohmann::json::exception& e) {  // e.g. a string that is not UTF-8
    throw Error("metrics: cannot write a line to '" + path_ + "': " + e.what());
  }
  out_ << line << '\n';
  out_.flush();
  if (!out_) throw Error("cannot write to '" + path_ + "' (disk full?)");
  if (tensorboard_) tensorboard_->write(object);
}

}  // namespace loom::config
