#pragma once
// Crash-safe file writes: bytes go to a temporary file next to the target, and only commit
// (fsync, rename over the target, fsync the directory) makes them visible. A reader sees the old
// file or the new one, never a torn one. Every failure, fsync's included, is a loom::Error naming
// the path and the OS reason.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace loom {

// Synced: the file and its directory entry are on disk when commit returns (survives a crash).
// Unsynced: the rename is atomic but nothing is flushed; for files rewritten every few seconds
// whose loss in a crash does not matter (heartbeats).
enum class Durability : uint8_t { Synced, Unsynced };

// A file written in pieces. A writer destroyed without commit removes its temporary file, so a
// failed or interrupted write leaves the previous target untouched.
class AtomicFileWriter {
 public:
  // Creates the temporary file; throws naming it and the target when it cannot.
  explicit AtomicFileWriter(std::string path, Durability durability = Durability::Synced);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  // Appends bytes; throws naming the file on a write error (disk full, ...).
  void write(const void* data, size_t bytes);
  // Flushes, renames over the target and syncs the directory; after it the writer is done.
  void commit();

  const std::string& path() const { return path_; }
  size_t bytes_written() const { return written_; }

 private:
  void discard() noexcept;

  std::string path_;
  std::string temp_;
  Durability durability_;
  int fd_ = -1;
  size_t written_ = 0;
};

// The whole file at once: an AtomicFileWriter written and committed.
void write_file_atomic(const std::string& path, std::string_view bytes, Durability durability = Durability::Synced);
// fsync a directory so a rename or a creation inside it survives a crash; throws naming the
// directory when it cannot be opened or synced.
void fsync_directory(const std::string& dir);
// Creates `dir` and its missing parents; throws loom::Error naming the directory, the OS reason and
// `what` it is for (a config key, say) when it cannot.
void make_directories(const std::string& dir, const std::string& what);
// Reads a whole file; throws loom::Error naming the file when it cannot.
std::string read_file(const std::string& path);

}  // namespace loom
