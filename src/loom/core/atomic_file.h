#pragma once
// Crash-safe file writes: write to a temporary name in the same directory, fsync, rename over
// the target, fsync the directory. A reader sees the old file or the new one, never a torn one.
#include <string>
#include <string_view>

namespace loom {

void write_file_atomic(const std::string& path, std::string_view bytes);
// fsync a directory so a rename inside it survives a crash.
void fsync_directory(const std::string& dir);
// Reads a whole file; throws loom::Error naming the file when it cannot.
std::string read_file(const std::string& path);

}  // namespace loom
