#pragma once
// Shared by the SFT tests: small conversation files written into a test's scratch directory.
#include <fstream>
#include <string>

namespace loom::train::testing {

// `count` conversations: a question and an answer, distinct per file (`tag`) and index.
inline void write_conversations(const std::string& path, const std::string& tag, int count) {
  std::ofstream out(path);
  for (int i = 0; i < count; ++i) {
    out << R"({"messages": [{"role": "user", "content": ")" << tag << " question " << i * 7
        << R"("}, {"role": "assistant", "content": ")" << tag << " answer " << i * 11 << "\"}]}\n";
  }
}

}  // namespace loom::train::testing
