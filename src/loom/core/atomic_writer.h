#pragma once
// A file written in pieces, crash-safely: bytes go to a temporary file next to the target, and
// only `commit()` (fsync, rename over the target, fsync the directory) makes them visible. A
// writer destroyed without commit removes its temporary file, so a failed or interrupted write
// leaves the previous target untouched. For files too large to build in memory first (for one
// string in memory, write_file_atomic in atomic_file.h does the same).
#include <cstddef>
#include <string>

namespace loom {

class AtomicFileWriter {
 public:
  // Creates the temporary file; throws loom::Error naming it when it cannot.
  explicit AtomicFileWriter(std::string path);
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
  int fd_ = -1;
  size_t written_ = 0;
};

}  // namespace loom
