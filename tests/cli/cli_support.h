#pragma once
// Runs the `loom` executable in end-to-end tests and captures its exit code and output.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "support/test_paths.h"

namespace loom::testing {

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

inline CommandResult run_loom(const std::string& args, const std::string& env = "") {
  std::string command = env + (env.empty() ? "" : " ") + loom::test_paths::binary() + " " + args + " 2>&1";
  CommandResult result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  std::array<char, 4096> buffer;
  size_t n;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) result.output.append(buffer.data(), n);
  int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

// A fresh directory under the system temp dir, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "loom-test-XXXXXX").string();
    path_ = mkdtemp(pattern.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// The last non-empty line of a command's output.
// Writes dir/corpus.txt (`paragraphs` numbered paragraphs) and prepares it as dir/data/c with
// the byte tokenizer; returns `loom data prepare`'s result.
inline CommandResult prepare_small_corpus(const std::string& dir, int paragraphs, double val_fraction) {
  std::string text;
  for (int i = 0; i < paragraphs; ++i) {
    text += "Call me Ishmael. Some years ago, never mind how long precisely, having little money " + std::to_string(i) +
            ".\n\n";
  }
  write_text(dir + "/corpus.txt", text);
  std::ostringstream fraction;
  fraction << val_fraction;
  return run_loom("data prepare " + dir + "/corpus.txt --tokenizer byte --val-fraction " + fraction.str() +
                  " --output " + dir + "/data/c");
}

inline std::string last_line(const std::string& output) {
  size_t end = output.find_last_not_of('\n');
  if (end == std::string::npos) return "";
  size_t start = output.rfind('\n', end);
  return output.substr(start == std::string::npos ? 0 : start + 1, end - (start == std::string::npos ? 0 : start + 1) + 1);
}

}  // namespace loom::testing
