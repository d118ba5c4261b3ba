#include "loom/ckpt/checkpoint.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <thread>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "loom/core/atomic_file.h"
#include "loom/core/error.h"

namespace loom::ckpt {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Shards start at multiples of this, so a later reader may map or DMA them aligned.
constexpr uint64_t kShardAlignment = 64;
constexpr size_t kReadChunk = size_t{4} << 20;

std::string errno_text(int err) { return std::strerror(err); }

// Takes the errno value as an argument so that it is read before the message is built.
[[noreturn]] void throw_errno(const std::string& what, int err) { throw Error(what + ": " + errno_text(err)); }

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  Fd& operator=(Fd&&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  // Closes now, reporting the error that a deferred write may surface only here.
  int close() {
    int rc = ::close(fd_);
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

// Sequential writer of one new file; every error names the file and the OS reason.
class FileWriter {
 public:
  explicit FileWriter(std::string path)
      : path_(std::move(path)), fd_(::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644)) {
    if (fd_.get() < 0) throw_errno("cannot create '" + path_ + "'", errno);
  }

  void write(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    while (n > 0) {
      ssize_t w = ::write(fd_.get(), p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        throw_errno("cannot write '" + path_ + "' at byte " + std::to_string(written_), errno);
      }
      p += w;
      n -= static_cast<size_t>(w);
      written_ += static_cast<uint64_t>(w);
    }
  }

  void pad_to(uint64_t alignment) {
    static const unsigned char zeros[kShardAlignment] = {};
    uint64_t rem = written_ % alignment;
    if (rem != 0) write(zeros, static_cast<size_t>(alignment - rem));
  }

  void finish() {
    if (::fsync(fd_.get()) != 0) throw_errno("cannot flush '" + path_ + "' to disk", errno);
    if (fd_.close() != 0) throw_errno("cannot close '" + path_ + "'", errno);
  }

  uint64_t written() const { return written_; }

 private:
  std::string path_;
  Fd fd_;
  uint64_t written_ = 0;
};

// The manifest a save of `refs` will write, with offsets laid out and checksums still zero,
// plus the source bytes of each shard in manifest order. Throws naming the tensor on bad refs.
Manifest plan_manifest(int64_t step, const std::vector<TensorRef>& refs, const json& state,
                       const std::string& config_yaml, std::vector<const void*>* shard_data, int rank = 0,
                       ManifestScope scope = ManifestScope::Complete) {
  const std::string where = "checkpoint of step " + std::to_string(step);
  LOOM_CHECK(step >= 0, where + ": the step must be 0 or more");
  LOOM_CHECK(state.is_object() || state.is_null(),
        where + ": the trainer state must be a JSON object (it is " + std::string(state.type_name()) + ")");
  Manifest m;
  m.step = step;
  m.state = state.is_null() ? json::object() : state;
  m.config_yaml = config_yaml;

  struct Piece {
    const TensorRef* ref;
    Slice slice;
  };
  std::map<std::string, std::vector<Piece>> by_name;
  for (const TensorRef& r : refs) {
    try {
      check_tensor_name(r.name);
    } catch (const Error& e) {
      throw Error(where + ": " + e.what());
    }
    std::string what = where + ": tensor '" + r.name + "'";
    for (int64_t d : r.global_shape) {
      LOOM_CHECK(d >= 0, what + " has a negative dimension in shape " + shape_string(r.global_shape));
    }
    Slice slice = r.slice.empty() ? full_slice(r.global_shape) : r.slice;
    check_slice(slice, r.global_shape, what);
    LOOM_CHECK(r.data != nullptr || slice_numel(slice) == 0, what + " has no data (null pointer)");
    auto& pieces = by_name[r.name];
    if (!pieces.empty()) {
      const TensorRef* first = pieces.front().ref;
      LOOM_CHECK(first->global_shape == r.global_shape && first->dtype == r.dtype,
            what + " is given twice with different shapes or dtypes (" + shape_string(first->global_shape) + " " +
                dtype_name(first->dtype) + " and " + shape_string(r.global_shape) + " " + dtype_name(r.dtype) + ")");
    }
    pieces.push_back({&r, std::move(slice)});
  }

  FileRecord file{rank_file_name(rank), rank, 0};
  uint64_t offset = 0;
  for (auto& [name, pieces] : by_name) {
    // A fixed shard order makes the data file independent of the order refs came in.
    std::sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) { return a.slice < b.slice; });
    TensorRecord t{name, pieces.front().ref->global_shape, pieces.front().ref->dtype, {}};
    for (const Piece& p : pieces) {
      offset = (offset + kShardAlignment - 1) / kShardAlignment * kShardAlignment;
      uint64_t bytes = static_cast<uint64_t>(slice_numel(p.slice)) * dtype_size(t.dtype);
      t.shards.push_back({file.name, offset, bytes, p.slice, 0});
      shard_data->push_back(p.ref->data);
      offset += bytes;
    }
    m.tensors.push_back(std::move(t));
  }
  file.bytes = offset;
  m.files.push_back(file);
  validate_manifest(m, where, scope);
  return m;
}

// Moves the finished temporary directory to `final_dir`. A directory of the same step that is
// already there is swapped out atomically, so `final_dir` always names a complete checkpoint.
void publish(const std::string& temp_dir, const std::string& final_dir, const std::string& aside_dir) {
  if (::rename(temp_dir.c_str(), final_dir.c_str()) == 0) return;
  int err = errno;
  if (err != EEXIST && err != ENOTEMPTY) {
    throw Error("cannot rename '" + temp_dir + "' to '" + final_dir + "': " + errno_text(err));
  }
  if (::renameat2(AT_FDCWD, temp_dir.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
    // temp_dir now holds the replaced checkpoint; the caller deletes it.
    return;
  }
  // Filesystems without RENAME_EXCHANGE: move the old one aside first. A crash between the two
  // renames leaves the old checkpoint under `aside_dir` and load falls back to an earlier step.
  if (::rename(final_dir.c_str(), aside_dir.c_str()) != 0) {
    throw_errno("cannot move the existing '" + final_dir + "' aside to replace it", errno);
  }
  if (::rename(temp_dir.c_str(), final_dir.c_str()) != 0) {
    err = errno;
    ::rename(aside_dir.c_str(), final_dir.c_str());  // put the old one back
    throw Error("cannot rename '" + temp_dir + "' to '" + final_dir + "': " + errno_text(err));
  }
}

// Creates `root` (syncing its parent when new) and returns the step directory's name.
std::string prepare_root(const std::string& root, int64_t step) {
  std::error_code ec;
  if (fs::create_directories(root, ec)) {
    fs::path dir = fs::absolute(root).lexically_normal();
    if (dir.filename().empty()) dir = dir.parent_path();  // "root/"
    fsync_directory(dir.parent_path().string());          // so the new root itself survives a crash
  }
  LOOM_CHECK(!ec, "cannot create checkpoint directory '" + root + "': " + ec.message());
  return step_dir_name(step);
}

// Writes the data file m.files[0] into `dir`, filling in the shards' checksums.
void write_data_file(const std::string& dir, Manifest& m, const std::vector<const void*>& shard_data) {
  FileWriter data((fs::path(dir) / m.files[0].name).string());
  size_t k = 0;
  for (TensorRecord& t : m.tensors) {
    for (ShardRecord& s : t.shards) {
      const void* bytes = shard_data[k++];
      data.pad_to(kShardAlignment);
      s.xxh3 = XXH3_64bits(s.bytes == 0 ? "" : bytes, static_cast<size_t>(s.bytes));
      if (s.bytes > 0) data.write(bytes, static_cast<size_t>(s.bytes));
    }
  }
  LOOM_CHECK(data.written() == m.files[0].bytes, "internal error: '" + m.files[0].name + "' laid out as " +
                                                std::to_string(m.files[0].bytes) + " bytes, written as " +
                                                std::to_string(data.written()));
  data.finish();
}

// Writes the complete manifest into the temporary directory, moves it to its step directory,
// then points `latest` at it and applies retention. Removes the temporary directory on failure.
void publish_checkpoint(const std::string& root, const std::string& temp_dir, const std::string& aside_dir,
                        const Manifest& m, int keep, const SaveObserver& observer) {
  const std::string name = step_dir_name(m.step);
  const std::string final_dir = (fs::path(root) / name).string();
  std::error_code ec;
  try {
    FileWriter manifest((fs::path(temp_dir) / kManifestFile).string());
    std::string text = serialize_manifest(m);
    manifest.write(text.data(), text.size());
    manifest.finish();
    fsync_directory(temp_dir);
    if (observer) observer(SaveStage::ManifestWritten, temp_dir);

    publish(temp_dir, final_dir, aside_dir);
    fsync_directory(root);
    if (observer) observer(SaveStage::Published, final_dir);
  } catch (...) {
    fs::remove_all(temp_dir, ec);
    throw;
  }
  fs::remove_all(temp_dir, ec);  // the replaced checkpoint of the same step, if any
  fs::remove_all(aside_dir, ec);

  write_latest(root, name);
  if (observer) observer(SaveStage::LatestUpdated, final_dir);
  apply_retention(root, m.step, keep);
}

void write_checkpoint(const std::string& root, int64_t step, const std::vector<TensorRef>& refs,
                      const json& state, const std::string& config_yaml, int keep, const SaveObserver& observer) {
  std::vector<const void*> shard_data;
  Manifest m = plan_manifest(step, refs, state, config_yaml, &shard_data);
  const std::string name = prepare_root(root, step);
  const std::string pid = std::to_string(::getpid());
  const std::string temp_dir = (fs::path(root) / (std::string(kTempPrefix) + name + "-" + pid)).string();
  const std::string aside_dir = (fs::path(root) / (std::string(kTempPrefix) + "old-" + name + "-" + pid)).string();

  std::error_code ec;
  fs::remove_all(temp_dir, ec);  // left by an earlier failed attempt of this process
  if (::mkdir(temp_dir.c_str(), 0755) != 0) throw_errno("cannot create '" + temp_dir + "'", errno);
  try {
    write_data_file(temp_dir, m, shard_data);
    if (observer) observer(SaveStage::DataWritten, temp_dir);
  } catch (...) {
    fs::remove_all(temp_dir, ec);
    throw;
  }
  publish_checkpoint(root, temp_dir, aside_dir, m, keep, observer);
}

std::string rank_part_name(int rank) {
  std::string name = rank_file_name(rank);
  return name.substr(0, name.rfind('.')) + ".json";
}

// Rank 0 of a save by several ranks: waits for every other rank's part and merges the parts
// into one manifest (shards of each tensor in slice order, so the result does not depend on which
// rank wrote what first).
Manifest merge_rank_parts(const std::string& temp_dir, Manifest own, const SaveRank& who) {
  const auto deadline = std::chrono::steady_clock::now() + who.timeout;
  std::map<std::string, TensorRecord> tensors;
  auto add = [&](Manifest& part) {
    for (TensorRecord& t : part.tensors) {
      auto [it, fresh] = tensors.try_emplace(t.name, t);
      if (!fresh) it->second.shards.insert(it->second.shards.end(), t.shards.begin(), t.shards.end());
    }
  };
  Manifest merged;
  merged.step = own.step;
  merged.state = own.state;
  merged.config_yaml = own.config_yaml;
  merged.files = own.files;
  add(own);
  std::error_code ec;
  for (int r = 1; r < who.ranks; ++r) {
    const std::string path = (fs::path(temp_dir) / rank_part_name(r)).string();
    while (!fs::exists(path, ec)) {
      LOOM_CHECK(std::chrono::steady_clock::now() < deadline,
            "checkpoint of step " + std::to_string(own.step) + ": rank " + std::to_string(r) + " of " +
                std::to_string(who.ranks) + " did not write its shards within " +
                std::to_string(who.timeout.count()) + " ms; the save is abandoned and earlier checkpoints are intact");
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::ifstream in(path, std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    Manifest part = parse_manifest(text, path, ManifestScope::RankPart);
    LOOM_CHECK(part.step == own.step && part.files.size() == 1 && part.files[0].rank == r,
          "'" + path + "' is not rank " + std::to_string(r) + "'s part of the checkpoint of step " +
              std::to_string(own.step));
    merged.files.push_back(part.files[0]);
    add(part);
    fs::remove(path, ec);
  }
  for (auto& [name, t] : tensors) {
    std::sort(t.shards.begin(), t.shards.end(),
              [](const ShardRecord& a, const ShardRecord& b) { return a.slice < b.slice; });
    merged.tensors.push_back(std::move(t));
  }
  validate_manifest(merged, "checkpoint of step " + std::to_string(own.step));
  return merged;
}

void pread_exact(int fd, void* out, size_t n, uint64_t offset, const std::string& path) {
  auto* p = static_cast<unsigned char*>(out);
  while (n > 0) {
    ssize_t r = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      throw_errno("cannot read '" + path + "' at byte " + std::to_string(offset), errno);
    }
    if (r == 0) throw Error("'" + path + "' ends at byte " + std::to_string(offset) + " (truncated?)");
    p += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
}

Fd open_for_reading(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) throw_errno("cannot open '" + path + "'", errno);
  return fd;
}

std::string shard_text(const TensorRecord& t, const ShardRecord& s) {
  return "tensor '" + t.name + "' shard " + slice_string(s.slice) + " (bytes " + std::to_string(s.offset) + " to " +
         std::to_string(s.offset + s.bytes) + ")";
}

void check_checksum(uint64_t computed, const TensorRecord& t, const ShardRecord& s, const std::string& path) {
  if (computed != s.xxh3) {
    throw Error("'" + path + "' is corrupt: " + shard_text(t, s) + " hashes to " + hex64(computed) +
                ", the manifest records " + hex64(s.xxh3));
  }
}

}  // namespace

CheckpointSnapshot snapshot_checkpoint(int64_t step, const std::vector<TensorRef>& tensors, const json& state,
                                       const std::string& config_yaml, ManifestScope scope, std::vector<std::byte> arena) {
  std::vector<const void*> unused;
  Manifest m = plan_manifest(step, tensors, state, config_yaml, &unused, 0, scope);
  CheckpointSnapshot snap;
  snap.step = step;
  snap.state = m.state;
  snap.config_yaml = config_yaml;
  constexpr size_t kAlign = 16;
  auto bytes_of = [](const TensorRef& r) {
    return static_cast<size_t>(slice_numel(r.slice.empty() ? full_slice(r.global_shape) : r.slice)) *
           dtype_size(r.dtype);
  };
  size_t total = 0;
  for (const TensorRef& r : tensors) total += (bytes_of(r) + kAlign - 1) / kAlign * kAlign;
  snap.arena = std::move(arena);
  snap.arena.resize(total);  // no work when a reused arena has the size already
  snap.tensors.reserve(tensors.size());
  size_t offset = 0;
  for (const TensorRef& r : tensors) {
    TensorRef copy = r;
    const size_t bytes = bytes_of(r);
    if (bytes > 0) {
      std::memcpy(snap.arena.data() + offset, r.data, bytes);
      copy.data = snap.arena.data() + offset;
    }
    offset += (bytes + kAlign - 1) / kAlign * kAlign;
    snap.tensors.push_back(std::move(copy));
  }
  return snap;
}

void write_snapshot(const std::string& root, const CheckpointSnapshot& snapshot, int keep,
                    const SaveObserver& observer) {
  write_checkpoint(root, snapshot.step, snapshot.tensors, snapshot.state, snapshot.config_yaml, keep, observer);
}

void write_snapshot(const std::string& root, const CheckpointSnapshot& snapshot, int keep, const SaveRank& who,
                    const SaveObserver& observer) {
  if (who.ranks == 1) return write_snapshot(root, snapshot, keep, observer);
  LOOM_CHECK(who.rank >= 0 && who.rank < who.ranks, "checkpoint save: rank " + std::to_string(who.rank) +
                                                   " is not one of the " + std::to_string(who.ranks) + " writers");
  std::vector<const void*> shard_data;
  Manifest m = plan_manifest(snapshot.step, snapshot.tensors, snapshot.state, snapshot.config_yaml, &shard_data,
                             who.rank, ManifestScope::RankPart);
  const std::string name = prepare_root(root, snapshot.step);
  const std::string token = std::to_string(who.token);
  const std::string temp_dir = (fs::path(root) / (std::string(kTempPrefix) + name + "-" + token)).string();
  const std::string aside_dir = (fs::path(root) / (std::string(kTempPrefix) + "old-" + name + "-" + token)).string();
  std::error_code ec;
  fs::create_directories(temp_dir, ec);
  LOOM_CHECK(!ec, "cannot create '" + temp_dir + "': " + ec.message());
  try {
    write_data_file(temp_dir, m, shard_data);
    if (observer) observer(SaveStage::DataWritten, temp_dir);
    if (who.rank != 0) {
      // This rank's part of the manifest, renamed into place only once complete.
      write_file_atomic((fs::path(temp_dir) / rank_part_name(who.rank)).string(), serialize_manifest(m));
      return;
    }
    m = merge_rank_parts(temp_dir, std::move(m), who);
  } catch (...) {
    if (who.rank == 0) fs::remove_all(temp_dir, ec);
    throw;
  }
  publish_checkpoint(root, temp_dir, aside_dir, m, keep, observer);
}

void save_checkpoint(const std::string& root, int64_t step, const std::vector<TensorRef>& tensors, const json& state,
                     const std::string& config_yaml, int keep, const SaveObserver& observer) {
  write_checkpoint(root, step, tensors, state, config_yaml, keep, observer);
}

LoadedCheckpoint::LoadedCheckpoint(std::string path, Manifest manifest)
    : path_(std::move(path)), manifest_(std::move(manifest)) {
  for (size_t i = 0; i < manifest_.tensors.size(); ++i) index_.emplace(manifest_.tensors[i].name, i);
}

std::string LoadedCheckpoint::file_path(const std::string& file) const { return (fs::path(path_) / file).string(); }

bool LoadedCheckpoint::has(const std::string& name) const { return index_.count(name) != 0; }

const TensorRecord& LoadedCheckpoint::record(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) {
    std::string some;
    size_t n = 0;
    for (const auto& [k, v] : index_) {
      if (n++ == 3) break;
      some += (some.empty() ? "" : ", ") + k;
    }
    throw Error("checkpoint '" + path_ + "' has no tensor '" + name + "' (it holds " +
                std::to_string(index_.size()) + " tensors" + (some.empty() ? "" : ": " + some + ", ...") +
                "; checkpoint from an incompatible model config?)");
  }
  return manifest_.tensors[it->second];
}

std::vector<std::string> LoadedCheckpoint::names() const {
  std::vector<std::string> out;
  for (const TensorRecord& t : manifest_.tensors) out.push_back(t.name);
  return out;
}

std::vector<std::string> LoadedCheckpoint::parameter_names() const {
  std::vector<std::string> out;
  for (const TensorRecord& t : manifest_.tensors) {
    if (is_model_parameter(t.name)) out.push_back(t.name);
  }
  return out;
}

void LoadedCheckpoint::read(const std::string& name, void* out, DType expect_dtype, const Shape& expect_shape) const {
  const TensorRecord& t = record(name);
  LOOM_CHECK(t.shape == expect_shape, "tensor '" + name + "' in checkpoint '" + path_ + "' has shape " +
                                     shape_string(t.shape) + ", the model expects " + shape_string(expect_shape) +
                                     " (checkpoint from an incompatible model config?)");
  LOOM_CHECK(t.dtype == expect_dtype, "tensor '" + name + "' in checkpoint '" + path_ + "' is " + dtype_name(t.dtype) +
                                     ", the caller expects " + dtype_name(expect_dtype));
  // A shard covering the whole tensor goes straight into `out`.
  if (t.shards.size() == 1 && t.shards[0].slice == full_slice(t.shape)) {
    const ShardRecord& s = t.shards[0];
    std::string path = file_path(s.file);
    Fd fd = open_for_reading(path);
    pread_exact(fd.get(), out, static_cast<size_t>(s.bytes), s.offset, path);
    check_checksum(XXH3_64bits(s.bytes == 0 ? "" : out, static_cast<size_t>(s.bytes)), t, s, path);
    return;
  }
  read_slice(name, full_slice(t.shape), out, expect_dtype);
}

void LoadedCheckpoint::read_slice(const std::string& name, const Slice& slice, void* out, DType expect_dtype) const {
  const TensorRecord& t = record(name);
  check_slice(slice, t.shape, "reading tensor '" + name + "' from checkpoint '" + path_ + "'");
  LOOM_CHECK(t.dtype == expect_dtype, "tensor '" + name + "' in checkpoint '" + path_ + "' is " + dtype_name(t.dtype) +
                                     ", the caller expects " + dtype_name(expect_dtype));
  std::vector<std::byte> buffer;
  for (const ShardRecord& s : t.shards) {
    Slice region;
    if (!intersect_slices(s.slice, slice, &region)) continue;
    std::string path = file_path(s.file);
    Fd fd = open_for_reading(path);
    buffer.resize(static_cast<size_t>(s.bytes));
    pread_exact(fd.get(), buffer.data(), buffer.size(), s.offset, path);
    check_checksum(XXH3_64bits(buffer.data(), buffer.size()), t, s, path);
    copy_region(buffer.data(), s.slice, out, slice, region, dtype_size(t.dtype));
  }
}

void LoadedCheckpoint::verify() const {
  for (const FileRecord& f : manifest_.files) {
    std::string path = file_path(f.name);
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) throw_errno("'" + path + "' is missing", errno);
    LOOM_CHECK(static_cast<uint64_t>(st.st_size) == f.bytes,
          "'" + path + "' is " + std::to_string(st.st_size) + " bytes, the manifest expects " +
              std::to_string(f.bytes) + (static_cast<uint64_t>(st.st_size) < f.bytes ? " (truncated)" : ""));
  }
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(), &XXH3_freeState);
  LOOM_CHECK(state != nullptr, "out of memory verifying checkpoint '" + path_ + "'");
  std::vector<unsigned char> chunk;
  for (const FileRecord& f : manifest_.files) {
    std::string path = file_path(f.name);
    Fd fd = open_for_reading(path);
    for (const TensorRecord& t : manifest_.tensors) {
      for (const ShardRecord& s : t.shards) {
        if (s.file != f.name) continue;
        XXH3_64bits_reset(state.get());
        for (uint64_t done = 0; done < s.bytes;) {
          size_t n = static_cast<size_t>(std::min<uint64_t>(kReadChunk, s.bytes - done));
          chunk.resize(std::max(chunk.size(), n));
          pread_exact(fd.get(), chunk.data(), n, s.offset + done, path);
          XXH3_64bits_update(state.get(), chunk.data(), n);
          done += n;
        }
        check_checksum(XXH3_64bits_digest(state.get()), t, s, path);
      }
    }
  }
}

LoadedCheckpoint open_checkpoint_dir(const std::string& dir) {
  std::string manifest_path = (fs::path(dir) / kManifestFile).string();
  std::error_code ec;
  LOOM_CHECK(fs::is_directory(dir, ec), "checkpoint directory '" + dir + "' does not exist");
  LOOM_CHECK(fs::exists(manifest_path, ec), "'" + manifest_path + "' is missing (not a complete checkpoint)");
  Manifest m = parse_manifest(read_file(manifest_path), manifest_path);
  fs::path p = fs::path(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  if (auto step = parse_step_dir_name(p.filename().string())) {
    LOOM_CHECK(*step == m.step, "'" + manifest_path + "' is for step " + std::to_string(m.step) + " but its directory is " +
                               p.filename().string() + " (renamed or copied over?)");
  }
  LoadedCheckpoint c(dir, std::move(m));
  c.verify();
  return c;
}

LoadedCheckpoint load_checkpoint(const std::string& path_or_root) {
  std::error_code ec;
  LOOM_CHECK(fs::exists(path_or_root, ec), "checkpoint path '" + path_or_root + "' does not exist");
  if (is_checkpoint_dir(path_or_root)) return open_checkpoint_dir(path_or_root);

  // Candidates: the one `latest` names, then every earlier step, newest first. Directories above
  // `latest` are ignored: a save that published one but crashed before updating `latest` is
  // redone by the resumed run, and one left by a run later resumed from an earlier step is stale.
  const std::string& root = path_or_root;
  std::vector<std::string> candidates;
  std::vector<std::string> problems;
  std::optional<int64_t> below;
  std::optional<std::string> latest = read_latest(root);
  if (latest) {
    std::string latest_path = (fs::path(root) / kLatestFile).string();
    if (auto step = parse_step_dir_name(*latest)) {
      candidates.push_back((fs::path(root) / *latest).string());
      below = *step;
    } else {
      problems.push_back("'" + latest_path + "' holds '" + *latest + "', not a step directory name such as step-00000060");
      std::cerr << "loom: warning: " << problems.back() << "; trying the step directories instead\n";
    }
  }
  std::vector<CheckpointEntry> all = list_checkpoints(root);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (!below || it->step < *below) candidates.push_back(it->path);
  }
  LOOM_CHECK(!candidates.empty() || !problems.empty(),
        "no checkpoint in '" + root + "' (expected step-NNNNNNNN directories and a 'latest' file)");

  for (size_t i = 0; i < candidates.size(); ++i) {
    try {
      return open_checkpoint_dir(candidates[i]);
    } catch (const Error& e) {
      problems.push_back(e.what());
      // One write, so that the warnings of ranks loading at once (threads backend) do not interleave.
      std::cerr << ("loom: warning: checkpoint '" + candidates[i] + "' is unusable: " + e.what() +
                    (i + 1 < candidates.size() ? "; falling back to '" + candidates[i + 1] + "'" : std::string()) + "\n");
    }
  }
  std::string message = "no usable checkpoint in '" + root + "':";
  for (const std::string& p : problems) message += "\n  " + p;
  throw Error(message);
}

}  // namespace loom::ckpt
