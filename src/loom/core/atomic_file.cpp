#include "loom/core/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "loom/core/error.h"

namespace loom {

namespace {
std::string errno_text() { return std::strerror(errno); }
}  // namespace

void fsync_directory(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) throw Error("cannot open directory '" + dir + "' to sync it: " + errno_text());
  ::fsync(fd);
  ::close(fd);
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
  std::filesystem::path target(path);
  std::filesystem::path dir = target.has_parent_path() ? target.parent_path() : ".";
  std::string temp_name = ".";
  temp_name.append(target.filename().string()).append(".tmp-").append(std::to_string(::getpid()));
  std::string temp = (dir / temp_name).string();
  int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw Error("cannot create '" + temp + "': " + errno_text());
  size_t written = 0;
  while (written < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      std::string why = errno_text();
      ::close(fd);
      ::unlink(temp.c_str());
      throw Error("cannot write '" + temp + "': " + why);
    }
    written += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    std::string why = errno_text();
    ::unlink(temp.c_str());
    throw Error("cannot flush '" + temp + "': " + why);
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    std::string why = errno_text();
    ::unlink(temp.c_str());
    throw Error("cannot rename '" + temp + "' to '" + path + "': " + why);
  }
  fsync_directory(dir.string());
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read '" + path + "': " + errno_text());
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

}  // namespace loom
