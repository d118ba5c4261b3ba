#pragma once
// `loom <verb>`: the command-line entry point.
namespace loom::cli {
int run(int argc, char** argv);
}
