#include "loom/cli/cli.h"

#include <iostream>

namespace loom::cli {
int run(int, char**) {
  std::cerr << "loom: no verbs yet\n";
  return 1;
}
}  // namespace loom::cli
