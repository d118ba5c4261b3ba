#include "loom/core/atomic_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "loom/core/atomic_file.h"
#include "loom/core/error.h"

namespace loom {

namespace {
std::string errno_text() { return std::strerror(errno); }
}  // namespace

AtomicFileWriter::AtomicFileWriter(std::string path) : path_(std::move(path)) {
  const std::filesystem::path target(path_);
  const std::filesystem::path dir = target.has_parent_path() ? target.parent_path() : ".";
  // Hidden and unique per process, so a concurrent writer of the same target cannot collide.
  std::string temp_name = ".";
  temp_name.append(target.filename().string()).append(".tmp-").append(std::to_string(::getpid()));
  temp_ = (dir / temp_name).string();
  fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error("cannot create '" + temp_ + "' (to write '" + path_ + "'): " + errno_text());
}

AtomicFileWriter::~AtomicFileWriter() { discard(); }

void AtomicFileWriter::discard() noexcept {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
    ::unlink(temp_.c_str());
  }
}

void AtomicFileWriter::write(const void* data, size_t bytes) {
  LOOM_CHECK(fd_ >= 0, "write to '" + path_ + "' after it was committed or failed");
  const char* p = static_cast<const char*>(data);
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::write(fd_, p + done, bytes - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const std::string why = errno_text();
      discard();
      throw Error("cannot write '" + temp_ + "' (to write '" + path_ + "'): " + why);
    }
    done += static_cast<size_t>(n);
  }
  written_ += bytes;
}

void AtomicFileWriter::commit() {
  LOOM_CHECK(fd_ >= 0, "commit of '" + path_ + "' after it was committed or failed");
  if (::fsync(fd_) != 0) {
    const std::string why = errno_text();
    discard();
    throw Error("cannot flush '" + temp_ + "' (to write '" + path_ + "'): " + why);
  }
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0 || ::rename(temp_.c_str(), path_.c_str()) != 0) {
    const std::string why = errno_text();
    ::unlink(temp_.c_str());
    throw Error("cannot move '" + temp_ + "' into place as '" + path_ + "': " + why);
  }
  const std::filesystem::path target(path_);
  fsync_directory(target.has_parent_path() ? target.parent_path().string() : ".");
}

}  // namespace loom
