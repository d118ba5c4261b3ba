#include "loom/core/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "loom/core/error.h"

namespace loom {

namespace {

std::string errno_text(int err) { return std::strerror(err); }

std::string parent_dir(const std::string& path) {
  const std::filesystem::path target(path);
  return target.has_parent_path() ? target.parent_path().string() : ".";
}

// Hidden and unique per process and writer, so concurrent writers of one target cannot collide.
std::string temp_name_for(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  const std::filesystem::path target(path);
  std::string name = ".";  // built by append: gcc 12 misreports -Wrestrict on "." + string
  name.append(target.filename().string()).append(".tmp-").append(std::to_string(::getpid()));
  name.append("-").append(std::to_string(counter.fetch_add(1)));
  return (std::filesystem::path(parent_dir(path)) / name).string();
}

}  // namespace

void fsync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw Error("cannot open directory '" + dir + "' to sync it: " + errno_text(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw Error("cannot sync directory '" + dir + "': " + errno_text(err));
}

void make_directories(const std::string& dir, const std::string& what) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir, ec)) {
    throw Error("cannot create directory '" + dir + "' (" + what + "): " +
                (ec ? ec.message() : std::string("a file is in the way")));
  }
}

AtomicFileWriter::AtomicFileWriter(std::string path, Durability durability)
    : path_(std::move(path)), temp_(temp_name_for(path_)), durability_(durability) {
  fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error("cannot create '" + temp_ + "' (to write '" + path_ + "'): " + errno_text(errno));
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
      const std::string why = errno_text(errno);
      discard();
      throw Error("cannot write '" + temp_ + "' (to write '" + path_ + "'): " + why);
    }
    done += static_cast<size_t>(n);
  }
  written_ += bytes;
}

void AtomicFileWriter::commit() {
  LOOM_CHECK(fd_ >= 0, "commit of '" + path_ + "' after it was committed or failed");
  if (durability_ == Durability::Synced && ::fsync(fd_) != 0) {
    const std::string why = errno_text(errno);
    discard();
    throw Error("cannot flush '" + temp_ + "' (to write '" + path_ + "'): " + why);
  }
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0 || ::rename(temp_.c_str(), path_.c_str()) != 0) {
    const std::string why = errno_text(errno);
    ::unlink(temp_.c_str());
    throw Error("cannot move '" + temp_ + "' into place as '" + path_ + "': " + why);
  }
  if (durability_ == Durability::Synced) fsync_directory(parent_dir(path_));
}

void write_file_atomic(const std::string& path, std::string_view bytes, Durability durability) {
  AtomicFileWriter out(path, durability);
  out.write(bytes.data(), bytes.size());
  out.commit();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read '" + path + "': " + errno_text(errno));
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

}  // namespace loom
