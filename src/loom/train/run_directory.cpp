#include "loom/train/run_directory.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "loom/core/error.h"
#include "loom/model/parameter_shapes.h"
#include "loom/train/model_setup.h"

namespace loom::train {

namespace fs = std::filesystem;

namespace {

std::string mib(int64_t bytes) {
  std::ostringstream out;
  out.precision(1);
  out << std::fixed << static_cast<double>(bytes) / (1024.0 * 1024.0) << " MiB";
  return out.str();
}

// What of an earlier run lies in the directories: "" when nothing.
std::string earlier_run(const std::string& run_dir, const std::string& root) {
  std::string found;
  std::error_code ec;
  int steps = 0;
  if (fs::is_directory(root, ec)) {
    for (const fs::directory_entry& entry : fs::directory_iterator(root, ec)) {
      const std::string name = entry.path().filename().string();
      steps += name.rfind("step-", 0) == 0 || name == "latest";
    }
  }
  if (steps > 0) found = "checkpoints in " + root;
  const fs::path metrics = fs::path(run_dir) / "metrics.jsonl";
  if (fs::is_regular_file(metrics, ec) && fs::file_size(metrics, ec) > 0) {
    found += (found.empty() ? "" : " and ") + ("metrics in " + metrics.string());
  }
  return found;
}

}  // namespace

int64_t checkpoint_bytes(const config::ModelConfig& model) {
  int64_t elements = 0;
  for (const model::ParameterShape& p : model::model_parameter_shapes(model)) elements += shape_numel(p.shape);
  return elements * 3 * static_cast<int64_t>(sizeof(float)) + (1 << 20);
}

RunDirectory::RunDirectory(const config::RunConfig& config)
    : run_dir_(config.run.dir), checkpoint_root_(checkpoint_root(config)) {
  std::error_code ec;
  fs::create_directories(run_dir_, ec);
  LOOM_CHECK(!ec && fs::is_directory(run_dir_), "run.dir '" + run_dir_ + "' cannot be created (" +
                                                    (ec ? ec.message() : "a file is in the way") +
                                                    "): choose a directory you can write");
  lock();
  refuse_takeover(config);
  check_checkpoint_directory();
}

RunDirectory::~RunDirectory() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the lock
}

void RunDirectory::lock() {
  const std::string path = (fs::path(run_dir_) / "loom.lock").string();
  lock_fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  LOOM_CHECK(lock_fd_ >= 0, "cannot open the run's lock file " + path + ": " + std::strerror(errno));
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    std::ifstream in(path);
    std::string holder;
    std::getline(in, holder);
    ::close(lock_fd_);
    lock_fd_ = -1;
    throw Error("run.dir '" + run_dir_ + "' is in use by another loom run (" +
                (holder.empty() ? "lock " + path : holder) +
                "); wait for it to finish, or train into another run.dir");
  }
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const std::string holder = "pid " + std::to_string(::getpid()) + " on " + host + "\n";
  if (::ftruncate(lock_fd_, 0) == 0) {
    [[maybe_unused]] const ssize_t written = ::write(lock_fd_, holder.data(), holder.size());
  }
}

void RunDirectory::refuse_takeover(const config::RunConfig& config) {
  if (config.train.resume || config.train.skip_train) return;  // continues the run, or writes nothing
  const std::string found = earlier_run(run_dir_, checkpoint_root_);
  if (found.empty()) return;
  LOOM_CHECK(config.run.overwrite, "run.dir '" + run_dir_ + "' holds another run (" + found +
                                       "): continue it with train.resume=true, train into another run.dir, or set "
                                       "run.overwrite=true to delete it and start over");
  std::error_code ec;
  if (fs::is_directory(checkpoint_root_, ec)) {
    for (const fs::directory_entry& entry : fs::directory_iterator(checkpoint_root_, ec)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("step-", 0) == 0 || name == "latest") fs::remove_all(entry.path(), ec);
      LOOM_CHECK(!ec, "run.overwrite: cannot remove " + entry.path().string() + ": " + ec.message());
    }
  }
  fs::remove(fs::path(run_dir_) / "metrics.jsonl", ec);
  const fs::path events = fs::path(run_dir_) / "tensorboard";  // log.tensorboard's event files
  if (fs::is_directory(events, ec)) {
    for (const fs::directory_entry& entry : fs::directory_iterator(events, ec)) {
      if (entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0) fs::remove(entry.path(), ec);
    }
  }
}

void RunDirectory::check_checkpoint_directory() {
  std::error_code ec;
  fs::create_directories(checkpoint_root_, ec);
  LOOM_CHECK(!ec && fs::is_directory(checkpoint_root_),
             "checkpoint directory '" + checkpoint_root_ + "' cannot be created (" +
                 (ec ? ec.message() : "a file is in the way") +
                 "); set checkpoint.dir (or run.dir) to a directory you can write");
  const std::string probe = (fs::path(checkpoint_root_) / (".write-test-" + std::to_string(::getpid()))).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int error = errno;
  if (fd >= 0) {
    ::close(fd);
    ::unlink(probe.c_str());
  }
  LOOM_CHECK(fd >= 0, "checkpoint directory '" + checkpoint_root_ + "' is not writable (" + std::strerror(error) +
                          "); set checkpoint.dir (or run.dir) to a directory you can write");
}

void RunDirectory::check_free_space(int64_t bytes) const {
  struct statvfs fs_info {};
  if (::statvfs(checkpoint_root_.c_str(), &fs_info) != 0) return;  // unknown: the save will tell
  const int64_t free_bytes = static_cast<int64_t>(fs_info.f_bavail) * static_cast<int64_t>(fs_info.f_frsize);
  LOOM_CHECK(free_bytes >= bytes, "checkpoint directory '" + checkpoint_root_ + "' has " + mib(free_bytes) +
                                      " free, but one checkpoint needs about " + mib(bytes) +
                                      " (fp32 parameters and Adam moments); free space or set checkpoint.dir");
}

}  // namespace loom::train
