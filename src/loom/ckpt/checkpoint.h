#pragma once
// Saving and loading checkpoints.
//
// A checkpoint is `<root>/step-NNNNNNNN/` holding `manifest.json` (see manifest.h) and one data
// file per writing rank (`rank-00000.bin`); `<root>/latest` names the newest complete one.
// Tensors are global: each is stored as shards that carry their global slice, so a checkpoint
// written by any layout can be read into any other. Every rank writes only the shards it owns
// (SaveRank); rank 0 merges their parts into the manifest and publishes.
//
// Saving is two steps so that the second can run on a background thread: `snapshot_checkpoint`
// copies the tensors to host buffers, `write_snapshot` writes them crash-safely (a temporary
// directory, fsync'd, renamed into place, then `latest` replaced atomically). A save that fails
// midway leaves every earlier checkpoint and `latest` as they were. `save_checkpoint` does both
// without the copy.
//
// Loading verifies every shard checksum. Loading a root falls back from a corrupt newest
// checkpoint to the previous good one, with a warning on stderr.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loom/ckpt/checkpoint_root.h"
#include "loom/ckpt/manifest.h"
#include "loom/ckpt/slice.h"
#include "loom/ckpt/tensor_names.h"
#include "loom/core/dtype.h"
#include "loom/core/tensor.h"

namespace loom::ckpt {

// One shard of a global tensor to save: `data` (host memory) holds the row-major elements of
// `slice`. An empty slice means the whole tensor. Several refs with one name (and the same
// shape and dtype) are several shards of that tensor; together a save's refs must cover every
// tensor exactly.
struct TensorRef {
  std::string name;  // global name; `optim.<slot>.<param>` for optimizer state
  Shape global_shape;
  DType dtype = DType::F32;
  const void* data = nullptr;
  Slice slice;
};

// What one save writes, with the tensor bytes copied into a buffer it owns. Move-only: `tensors`
// point into `arena`.
struct CheckpointSnapshot {
  int64_t step = 0;
  std::vector<TensorRef> tensors;
  nlohmann::json state = nlohmann::json::object();
  std::string config_yaml;
  std::vector<std::byte> arena;  // every tensor's bytes, back to back (16-byte aligned offsets)

  CheckpointSnapshot() = default;
  CheckpointSnapshot(CheckpointSnapshot&&) = default;
  CheckpointSnapshot& operator=(CheckpointSnapshot&&) = default;
  CheckpointSnapshot(const CheckpointSnapshot&) = delete;
  CheckpointSnapshot& operator=(const CheckpointSnapshot&) = delete;
};

// Checks the refs (names, shapes, slices, full coverage unless `scope` is one rank's part;
// errors name the tensor) and copies them. `state` is the trainer's JSON object (step, data
// position, RNG, loss scaler, ...).
// `arena`: a previous snapshot's, to reuse: a save of the same tensors then copies at memory speed
// instead of first faulting in fresh pages (AsyncCheckpointWriter::take_arena).
CheckpointSnapshot snapshot_checkpoint(int64_t step, const std::vector<TensorRef>& tensors,
                                       const nlohmann::json& state, const std::string& config_yaml,
                                       ManifestScope scope = ManifestScope::Complete,
                                       std::vector<std::byte> arena = {});

// Points at which a save reports progress; the directory is the temporary one until Published.
enum class SaveStage {
  DataWritten,      // data file written and fsync'd
  ManifestWritten,  // manifest written, directory fsync'd; nothing visible yet
  Published,        // renamed to step-NNNNNNNN; `latest` still names the previous one
  LatestUpdated,    // `latest` names it; retention comes next
};
// An observer may throw to abort the save at that point (tests use it to inject failures).
using SaveObserver = std::function<void(SaveStage stage, const std::string& dir)>;

// Writes `snapshot` to `<root>/step-NNNNNNNN` (creating root; replacing an existing directory of
// the same step safely), points `latest` at it, then keeps the newest `keep` checkpoints at or
// below this step (keep <= 0: all; see apply_retention). Throws loom::Error naming the file on
// any write failure, after removing its temporary directory.
void write_snapshot(const std::string& root, const CheckpointSnapshot& snapshot, int keep,
                    const SaveObserver& observer = {});

// One of several ranks saving one checkpoint together, each the shards it owns (its snapshot's
// refs need not cover any tensor whole; together they must cover every tensor exactly).
struct SaveRank {
  int rank = 0, ranks = 1;
  // Names the shared temporary directory `.tmp-step-NNNNNNNN-<token>`: the same on every rank of
  // the save (rank 0's process id, so retention can tell a dead save's leftovers).
  int64_t token = 0;
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};  // rank 0's wait for the others
};
// Every rank writes its data file rank-NNNNN.bin and then its part of the manifest
// (rank-NNNNN.json) into the temporary directory, which must be on a filesystem all ranks share.
// Rank 0 waits for every part, merges them into manifest.json (checking that the shards tile
// every tensor), and publishes the checkpoint as write_snapshot does. A rank that never writes its
// part makes rank 0 give up after `timeout` with an Error naming it; nothing is published.
void write_snapshot(const std::string& root, const CheckpointSnapshot& snapshot, int keep, const SaveRank& who,
                    const SaveObserver& observer = {});

// snapshot_checkpoint + write_snapshot without copying the tensors.
void save_checkpoint(const std::string& root, int64_t step, const std::vector<TensorRef>& tensors,
                     const nlohmann::json& state, const std::string& config_yaml, int keep,
                     const SaveObserver& observer = {});

// A checkpoint opened for reading: its manifest, parsed and checked. Reads are const and
// thread-safe, and verify the checksum of every shard they touch.
class LoadedCheckpoint {
 public:
  const std::string& path() const { return path_; }  // the step directory
  int64_t step() const { return manifest_.step; }
  const nlohmann::json& state() const { return manifest_.state; }
  const std::string& config_yaml() const { return manifest_.config_yaml; }
  const Manifest& manifest() const { return manifest_; }

  bool has(const std::string& name) const;
  // Throw naming the tensor and the checkpoint when `name` is absent.
  const TensorRecord& record(const std::string& name) const;
  Shape shape(const std::string& name) const { return record(name).shape; }
  DType dtype(const std::string& name) const { return record(name).dtype; }
  std::vector<std::string> names() const;            // every tensor, sorted
  std::vector<std::string> parameter_names() const;  // model parameters only, sorted

  // Reads the whole global tensor into `out` (row-major, shape_numel(expect_shape) elements).
  // Throws naming the tensor when its shape or dtype differs from the expected ones, or a shard
  // is unreadable or fails its checksum.
  void read(const std::string& name, void* out, DType expect_dtype, const Shape& expect_shape) const;
  // Reads the part `slice` of the global tensor (row-major elements of the slice) into `out`,
  // whatever shards it was stored as: how a rank loads its own shard in another layout.
  void read_slice(const std::string& name, const Slice& slice, void* out, DType expect_dtype) const;

  // Checks every data file's size and every shard's checksum; throws naming the first bad file.
  void verify() const;

 private:
  friend LoadedCheckpoint open_checkpoint_dir(const std::string& dir);
  LoadedCheckpoint(std::string path, Manifest manifest);
  std::string file_path(const std::string& file) const;

  std::string path_;
  Manifest manifest_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> position in manifest_.tensors
};

// Opens one step directory and verifies it completely; throws naming the bad file.
LoadedCheckpoint open_checkpoint_dir(const std::string& dir);

// A step directory: opens and verifies it (throws if corrupt). A root: the checkpoint `latest`
// names, verified; if it is missing or corrupt, warns on stderr naming the file and the problem
// and tries the earlier ones by descending step; throws listing every problem when none is good.
LoadedCheckpoint load_checkpoint(const std::string& path_or_root);

}  // namespace loom::ckpt
