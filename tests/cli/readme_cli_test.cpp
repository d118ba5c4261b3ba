// Every `build/loom ...` command line in README.md's fenced sh blocks runs as written, in the
// order the README gives them, and exits 0.
//
// They run with a shell, in a scratch directory holding what they need: `build/loom` (a link to
// the binary under test), `.cache/data/corpus` (a small generated corpus of 200 documents instead of
// the shipped one) and `configs/` (copies of the repository's configs). Three things are rewritten,
// only so that the test takes seconds rather than hours on 2 cores: the `steps:` line of the
// copied configs/tiny.yaml becomes 2, every copied config's `eval_batches:` becomes 1 (the
// validation at the first and last step was most of a one-step run), and a `train.steps=N`
// argument in a command becomes `train.steps=1` (so that the README's resume still has a step
// to continue with). Nothing else
// of a command or a config changes: a command that fails here fails for a reader too. A server
// (`build/loom serve ...`, `build/loom env serve ...`) runs until it says it is listening, then gets SIGTERM and must shut
// down cleanly (exit 0).
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "cli_support.h"
#include "support/test_paths.h"

namespace loom::testing {
namespace {

namespace fs = std::filesystem;

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The lines starting with "build/loom " inside ```sh ... ``` blocks of `markdown`.
std::vector<std::string> readme_commands(const std::string& markdown) {
  std::vector<std::string> commands;
  std::istringstream in(markdown);
  std::string line;
  bool in_sh = false;
  while (std::getline(in, line)) {
    if (line.starts_with("```")) {
      in_sh = !in_sh && line == "```sh";
      continue;
    }
    if (in_sh && line.starts_with("build/loom ")) commands.push_back(line);
  }
  return commands;
}

// A server command as a script: started in the background, stopped with SIGTERM once it says it
// is listening (within 60 s), its exit status the script's.
std::string as_server_script(const std::string& command) {
  // The previous server's log goes first: the background shell truncates it only when it starts,
  // and a stale 'listening on' would have the new server stopped before it handles SIGTERM.
  return "rm -f server.log\n(\n" + command + "\n) > server.log 2>&1 &\npid=$!\ni=0\n"  // own lines: a trailing # comment
         "while ! grep -qs 'listening on' server.log; do\n"
         "  kill -0 $pid 2>/dev/null || { cat server.log; wait $pid; exit $?; }\n"
         "  i=$((i + 1)); [ $i -le 600 ] || { cat server.log; kill -KILL $pid; exit 98; }\n"
         "  sleep 0.1\ndone\nkill -TERM $pid\nwait $pid\nstatus=$?\ncat server.log\nexit $status";
}

// Runs `command` with /bin/sh in `dir`; stdout and stderr together.
CommandResult run_shell(const std::string& dir, const std::string& command) {
  const std::string script = dir + "/command.sh";
  write_text(script, "cd '" + dir + "' || exit 99\nexec < /dev/null\n" + command + "\n");  // mpirun reads stdin
  FILE* pipe = popen(("/bin/sh '" + script + "' 2>&1").c_str(), "r");
  CommandResult result;
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) result.output.append(buffer, n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

// A corpus directory of `documents` files of varied English-like text, a few KB each.
void write_corpus(const fs::path& dir, int documents) {
  fs::create_directories(dir);
  const char* words[] = {"whale", "ship", "sea", "captain", "the", "of", "and", "a", "union", "state",
                         "congress", "people", "harpoon", "deck", "nation", "law", "wind", "to", "in", "is"};
  uint32_t seed = 12345;
  for (int d = 0; d < documents; ++d) {
    std::string text;
    while (text.size() < 2000) {
      seed = seed * 1664525u + 1013904223u;
      text += words[(seed >> 16) % 20];
      text += (seed >> 8) % 9 == 0 ? ".\n" : " ";
    }
    write_text((dir / ("doc-" + std::to_string(d) + ".txt")).string(), text);
  }
}

TEST(ReadmeCli, EveryBuildLoomCommandRunsAsWritten) {
  const fs::path source(loom::test_paths::source_dir());
  const std::vector<std::string> commands = readme_commands(read_text(source / "README.md"));
  ASSERT_GE(commands.size(), 10u) << "README.md's sh blocks should hold the build/loom examples";

  TempDir dir;
  const fs::path root(dir.path());
  fs::create_directories(root / "build");
  fs::create_symlink(loom::test_paths::binary(), root / "build/loom");
  write_corpus(root / ".cache/data/corpus", 200);
  fs::create_directories(root / "configs");
  for (const fs::directory_entry& entry : fs::directory_iterator(source / "configs")) {
    if (!entry.is_regular_file()) continue;  // configs/hardware/: not run configs
    std::string text = read_text(entry.path());
    if (entry.path().filename() == "tiny.yaml") {
      const std::string before = text;
      text = std::regex_replace(text, std::regex("\n  steps: [0-9]+"), "\n  steps: 2");
      ASSERT_NE(text, before) << "configs/tiny.yaml has no train steps line to shorten";
    }
    text = std::regex_replace(text, std::regex("\n  eval_batches: [0-9]+"), "\n  eval_batches: 1");
    write_text((root / "configs" / entry.path().filename()).string(), text);
  }

  const std::regex steps_argument("train\\.steps=[0-9]+");
  for (const std::string& written : commands) {
    const std::string command = std::regex_replace(written, steps_argument, "train.steps=1");
    const bool server = command.starts_with("build/loom serve ") || command.starts_with("build/loom env serve ");
    CommandResult r = run_shell(dir.path(), server ? as_server_script(command) : command);
    EXPECT_EQ(r.exit_code, 0) << "README command failed: " << written << "\n" << r.output;
  }
}

}  // namespace
}  // namespace loom::testing
