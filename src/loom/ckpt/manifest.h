#pragma once
// The checkpoint manifest (`manifest.json`): which global tensors a checkpoint holds and where
// every shard of them lies. The format is the same for one writing rank and for many: each rank
// writes `rank-NNNNN.bin` with the shards it owns and the manifest lists them all.
//
//   {
//     "format": "loom-checkpoint", "version": 1, "step": 60,
//     "files": [{"name": "rank-00000.bin", "rank": 0, "bytes": 4096}],
//     "tensors": [{"name": "model.norm.weight", "dtype": "f32", "shape": [256],
//                  "shards": [{"file": "rank-00000.bin", "offset": 0, "bytes": 1024,
//                              "slice": [[0, 256]], "xxh3": "9f0c...16 hex digits"}]}],
//     "state": {...trainer state...}, "config_yaml": "...",
//     "manifest_xxh3": "XXH3-64 of this object without this key, dumped compactly"
//   }
//
// Shard bytes are the row-major elements of the shard's slice, little-endian. The shards of a
// tensor tile it exactly: no gaps, no overlap.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "loom/ckpt/slice.h"
#include "loom/core/dtype.h"
#include "loom/core/tensor.h"

namespace loom::ckpt {

inline constexpr int kFormatVersion = 1;
inline constexpr std::string_view kFormatName = "loom-checkpoint";
inline constexpr std::string_view kManifestFile = "manifest.json";

struct ShardRecord {
  std::string file;     // data file in the checkpoint directory
  uint64_t offset = 0;  // byte offset in that file
  uint64_t bytes = 0;   // slice_numel(slice) * dtype_size
  Slice slice;          // the global region this shard covers
  uint64_t xxh3 = 0;    // XXH3-64 of the shard's bytes
};

struct TensorRecord {
  std::string name;  // global name
  Shape shape;       // global shape
  DType dtype = DType::F32;
  std::vector<ShardRecord> shards;
};

struct FileRecord {
  std::string name;  // rank-NNNNN.bin
  int rank = 0;      // the rank that wrote it
  uint64_t bytes = 0;
};

struct Manifest {
  int version = kFormatVersion;
  int64_t step = 0;
  std::vector<FileRecord> files;
  std::vector<TensorRecord> tensors;  // sorted by name
  nlohmann::json state = nlohmann::json::object();
  std::string config_yaml;
};

// Name of the data file a rank writes: rank-00000.bin.
std::string rank_file_name(int rank);

// What a manifest describes: a whole checkpoint, or the part one rank wrote of a checkpoint
// saved by several (`rank-NNNNN.json`, merged into the manifest when every rank has written).
enum class ManifestScope : uint8_t { Complete, RankPart };

// Throws loom::Error naming `where` and the tensor/file when the manifest is inconsistent:
// duplicate names, a shard outside its tensor or its file, a wrong byte count, shards that
// overlap or (Complete only) leave part of a tensor uncovered, a file that is not listed.
void validate_manifest(const Manifest& manifest, const std::string& where,
                       ManifestScope scope = ManifestScope::Complete);

// The manifest as JSON text, with its own checksum.
std::string serialize_manifest(const Manifest& manifest);
// Parses and validates manifest text; errors name `path` and what is wrong (bad JSON, missing
// or mistyped key, checksum mismatch, a version newer than this build reads).
Manifest parse_manifest(std::string_view text, const std::string& path, ManifestScope scope = ManifestScope::Complete);

std::string hex64(uint64_t value);

// Typed reads of a manifest's JSON keys (its "state" object's too): a missing key or a value of
// another type is an Error naming `where` and the key.
const nlohmann::json& member(const nlohmann::json& j, const char* key, const std::string& where);
std::string get_string(const nlohmann::json& j, const char* key, const std::string& where);
int64_t get_int(const nlohmann::json& j, const char* key, const std::string& where);
uint64_t get_uint(const nlohmann::json& j, const char* key, const std::string& where);  // >= 0
const nlohmann::json& get_array(const nlohmann::json& j, const char* key, const std::string& where);

}  // namespace loom::ckpt
