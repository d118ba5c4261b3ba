#include "loom/ckpt/checkpoint_root.h"

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "loom/ckpt/manifest.h"
#include "loom/core/atomic_file.h"
#include "loom/core/error.h"

namespace loom::ckpt {

namespace fs = std::filesystem;

namespace {

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// The pid a `.tmp-...-<pid>` directory name ends in, or nullopt.
std::optional<long> temp_dir_pid(std::string_view name) {
  size_t dash = name.rfind('-');
  if (dash == std::string_view::npos || !all_digits(name.substr(dash + 1)) || name.size() - dash > 10) {
    return std::nullopt;
  }
  return std::stol(std::string(name.substr(dash + 1)));
}

bool process_alive(long pid) { return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH; }

void remove_reporting(const fs::path& path, const char* why) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) std::cerr << "loom: warning: cannot delete " << why << " '" << path.string() << "': " << ec.message() << "\n";
}

}  // namespace

std::string step_dir_name(int64_t step) {
  LOOM_CHECK(step >= 0, "checkpoint step " + std::to_string(step) + " is negative (valid: 0 or more)");
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}

std::optional<int64_t> parse_step_dir_name(std::string_view name) {
  constexpr std::string_view prefix = "step-";
  if (!name.starts_with(prefix)) return std::nullopt;
  std::string_view digits = name.substr(prefix.size());
  if (digits.size() < 8 || digits.size() > 18 || !all_digits(digits)) return std::nullopt;
  return std::stoll(std::string(digits));
}

bool is_checkpoint_dir(const std::string& path) {
  std::error_code ec;
  if (fs::exists(fs::path(path) / kManifestFile, ec)) return true;
  fs::path p = fs::path(path).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // "dir/" names dir
  return parse_step_dir_name(p.filename().string()).has_value();
}

std::vector<CheckpointEntry> list_checkpoints(const std::string& root) {
  std::vector<CheckpointEntry> out;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) {
    auto step = parse_step_dir_name(e.path().filename().string());
    std::error_code ec2;
    if (!step || !e.is_directory(ec2)) continue;
    out.push_back({*step, e.path().string(), fs::exists(e.path() / kManifestFile, ec2)});
  }
  LOOM_CHECK(!ec, "cannot list checkpoint directory '" + root + "': " + ec.message());
  std::sort(out.begin(), out.end(), [](const CheckpointEntry& a, const CheckpointEntry& b) { return a.step < b.step; });
  return out;
}

std::optional<std::string> read_latest(const std::string& root) {
  fs::path p = fs::path(root) / kLatestFile;
  std::error_code ec;
  if (!fs::exists(p, ec)) return std::nullopt;
  std::string text = read_file(p.string());
  size_t b = text.find_first_not_of(" \t\r\n"), e = text.find_last_not_of(" \t\r\n");
  if (b == std::string::npos) return std::string();
  return text.substr(b, e - b + 1);
}

void write_latest(const std::string& root, const std::string& dir_name) {
  write_file_atomic((fs::path(root) / kLatestFile).string(), dir_name + "\n");
}

std::string resolve_checkpoint(const std::string& path_or_root) {
  std::error_code ec;
  LOOM_CHECK(fs::exists(path_or_root, ec), "checkpoint path '" + path_or_root + "' does not exist");
  if (is_checkpoint_dir(path_or_root)) return path_or_root;
  if (auto latest = read_latest(path_or_root)) {
    if (!parse_step_dir_name(*latest)) {
      // Built by appending: gcc 12 warns falsely (-Wrestrict) on "'" + temporary.
      std::string message = "'";
      message.append((fs::path(path_or_root) / kLatestFile).string()).append("' holds '").append(*latest);
      throw Error(message.append("' (valid: the name of a step directory such as step-00000060)"));
    }
    return (fs::path(path_or_root) / *latest).string();
  }
  auto all = list_checkpoints(path_or_root);
  LOOM_CHECK(!all.empty(), "'" + path_or_root +
                          "' is neither a checkpoint (no manifest.json) nor a checkpoint root (no 'latest' file, "
                          "no step-NNNNNNNN directories)");
  return all.back().path;
}

void apply_retention(const std::string& root, int64_t saved_step, int keep) {
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) {
    std::string name = e.path().filename().string();
    if (!name.starts_with(kTempPrefix)) continue;
    auto pid = temp_dir_pid(name);
    if (!pid || process_alive(*pid)) continue;
    // `.tmp-old-step-X-<pid>` is a checkpoint moved aside to be replaced; it is the only copy of
    // that step when the save died before moving the new one in.
    constexpr std::string_view old_prefix = "old-";
    std::string_view rest = std::string_view(name).substr(kTempPrefix.size());
    if (rest.starts_with(old_prefix)) {
      std::string step_name(rest.substr(old_prefix.size(), rest.rfind('-') - old_prefix.size()));
      if (!fs::exists(fs::path(root) / step_name, ec)) continue;
    }
    remove_reporting(e.path(), "the leftover of an interrupted save");
  }
  if (keep <= 0) return;
  std::vector<CheckpointEntry> all;
  try {
    all = list_checkpoints(root);
  } catch (const Error& err) {
    std::cerr << "loom: warning: checkpoint retention skipped: " << err.what() << "\n";
    return;
  }
  int kept = 0;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (it->step > saved_step || !it->has_manifest) continue;
    if (kept < keep) {
      ++kept;
    } else {
      remove_reporting(it->path, "old checkpoint");
    }
  }
}

}  // namespace loom::ckpt
