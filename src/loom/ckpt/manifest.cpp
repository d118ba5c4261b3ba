#include "loom/ckpt/manifest.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <map>

#include "loom/ckpt/tensor_names.h"
#include "loom/core/error.h"

namespace loom::ckpt {

using nlohmann::json;

namespace {

constexpr const char* kChecksumKey = "manifest_xxh3";

uint64_t parse_hex64(const std::string& text, const std::string& what) {
  LOOM_CHECK(text.size() == 16 && text.find_first_not_of("0123456789abcdef") == std::string::npos,
        what + ": '" + text + "' is not a checksum (valid: 16 lowercase hex digits)");
  return std::stoull(text, nullptr, 16);
}

}  // namespace

const json& member(const json& j, const char* key, const std::string& where) {
  LOOM_CHECK(j.is_object(), where + ": expected a JSON object");
  auto it = j.find(key);
  LOOM_CHECK(it != j.end(), where + ": missing key '" + key + "'");
  return *it;
}

std::string get_string(const json& j, const char* key, const std::string& where) {
  const json& v = member(j, key, where);
  LOOM_CHECK(v.is_string(), where + ": '" + key + "' must be a string");
  return v.get<std::string>();
}

int64_t get_int(const json& j, const char* key, const std::string& where) {
  const json& v = member(j, key, where);
  LOOM_CHECK(v.is_number_integer(), where + ": '" + key + "' must be an integer");
  return v.get<int64_t>();
}

uint64_t get_uint(const json& j, const char* key, const std::string& where) {
  const json& v = member(j, key, where);
  LOOM_CHECK(v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0),
        where + ": '" + key + "' must be a non-negative integer");
  return v.get<uint64_t>();
}

const json& get_array(const json& j, const char* key, const std::string& where) {
  const json& v = member(j, key, where);
  LOOM_CHECK(v.is_array(), where + ": '" + key + "' must be an array");
  return v;
}

namespace {

json to_json(const Manifest& m) {
  json files = json::array();
  for (const FileRecord& f : m.files) files.push_back({{"name", f.name}, {"rank", f.rank}, {"bytes", f.bytes}});
  json tensors = json::array();
  for (const TensorRecord& t : m.tensors) {
    json shards = json::array();
    for (const ShardRecord& s : t.shards) {
      json slice = json::array();
      for (const auto& [start, length] : s.slice) slice.push_back({start, length});
      shards.push_back({{"file", s.file},
                        {"offset", s.offset},
                        {"bytes", s.bytes},
                        {"slice", std::move(slice)},
                        {"xxh3", hex64(s.xxh3)}});
    }
    tensors.push_back(
        {{"name", t.name}, {"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"shards", std::move(shards)}});
  }
  return {{"format", kFormatName},   {"version", m.version}, {"step", m.step},
          {"files", std::move(files)}, {"tensors", std::move(tensors)}, {"state", m.state},
          {"config_yaml", m.config_yaml}};
}

Manifest from_json(const json& j, const std::string& where) {
  Manifest m;
  LOOM_CHECK(get_string(j, "format", where) == kFormatName,
        where + ": 'format' is not '" + std::string(kFormatName) + "'");
  int64_t version = get_int(j, "version", where);
  LOOM_CHECK(version >= 1 && version <= kFormatVersion,
        where + ": format version " + std::to_string(version) + " (this build reads versions 1 to " +
            std::to_string(kFormatVersion) + "; a newer loom wrote it?)");
  m.version = static_cast<int>(version);
  m.step = get_int(j, "step", where);
  for (const json& f : get_array(j, "files", where)) {
    FileRecord r;
    r.name = get_string(f, "name", where + " files[]");
    r.rank = static_cast<int>(get_int(f, "rank", where + " file '" + r.name + "'"));
    r.bytes = get_uint(f, "bytes", where + " file '" + r.name + "'");
    m.files.push_back(std::move(r));
  }
  for (const json& t : get_array(j, "tensors", where)) {
    TensorRecord r;
    r.name = get_string(t, "name", where + " tensors[]");
    std::string what = where + " tensor '" + r.name + "'";
    try {
      r.dtype = parse_dtype(get_string(t, "dtype", what));
    } catch (const Error& e) {
      throw Error(what + ": " + e.what());
    }
    for (const json& d : get_array(t, "shape", what)) {
      LOOM_CHECK(d.is_number_integer(), what + ": 'shape' must hold integers");
      r.shape.push_back(d.get<int64_t>());
    }
    for (const json& s : get_array(t, "shards", what)) {
      ShardRecord sr;
      sr.file = get_string(s, "file", what + " shard");
      sr.offset = get_uint(s, "offset", what + " shard");
      sr.bytes = get_uint(s, "bytes", what + " shard");
      sr.xxh3 = parse_hex64(get_string(s, "xxh3", what + " shard"), what + " shard 'xxh3'");
      for (const json& p : get_array(s, "slice", what + " shard")) {
        LOOM_CHECK(p.is_array() && p.size() == 2 && p[0].is_number_integer() && p[1].is_number_integer(),
              what + ": a shard 'slice' entry must be [start, length]");
        sr.slice.emplace_back(p[0].get<int64_t>(), p[1].get<int64_t>());
      }
      r.shards.push_back(std::move(sr));
    }
    m.tensors.push_back(std::move(r));
  }
  m.state = member(j, "state", where);
  LOOM_CHECK(m.state.is_object(), where + ": 'state' must be a JSON object");
  m.config_yaml = get_string(j, "config_yaml", where);
  return m;
}

}  // namespace

std::string hex64(uint64_t value) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(value));
  return buf;
}

std::string rank_file_name(int rank) {
  LOOM_CHECK(rank >= 0 && rank <= 99999, "rank " + std::to_string(rank) + " out of range (valid: 0 to 99999)");
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank-%05d.bin", rank);
  return buf;
}

void validate_manifest(const Manifest& m, const std::string& where, ManifestScope scope) {
  std::map<std::string, uint64_t> file_bytes;
  for (const FileRecord& f : m.files) {
    LOOM_CHECK(f.name.find('/') == std::string::npos && !f.name.empty() && f.name[0] != '.',
          where + ": data file name '" + f.name + "' must be a plain name inside the checkpoint directory");
    LOOM_CHECK(file_bytes.emplace(f.name, f.bytes).second, where + ": data file '" + f.name + "' is listed twice");
  }
  std::string previous;
  for (const TensorRecord& t : m.tensors) {
    std::string what = where + ": tensor '" + t.name + "'";
    try {
      check_tensor_name(t.name);
    } catch (const Error& e) {
      throw Error(where + ": " + e.what());
    }
    LOOM_CHECK(previous.empty() || previous < t.name,
          what + " is listed twice or out of order (tensors are sorted by name)");
    previous = t.name;
    for (int64_t d : t.shape) LOOM_CHECK(d >= 0, what + " has a negative dimension in shape " + shape_string(t.shape));
    int64_t covered = 0;
    for (size_t i = 0; i < t.shards.size(); ++i) {
      const ShardRecord& s = t.shards[i];
      check_slice(s.slice, t.shape, what + " shard " + std::to_string(i));
      uint64_t expect = static_cast<uint64_t>(slice_numel(s.slice)) * dtype_size(t.dtype);
      LOOM_CHECK(s.bytes == expect, what + " shard " + std::to_string(i) + " holds " + std::to_string(s.bytes) +
                                   " bytes, its slice " + slice_string(s.slice) + " of " + dtype_name(t.dtype) +
                                   " needs " + std::to_string(expect));
      auto f = file_bytes.find(s.file);
      LOOM_CHECK(f != file_bytes.end(), what + " shard " + std::to_string(i) + " names data file '" + s.file +
                                       "', which the manifest does not list");
      LOOM_CHECK(s.offset <= f->second && s.bytes <= f->second - s.offset,
            what + " shard " + std::to_string(i) + " (bytes " + std::to_string(s.offset) + " to " +
                std::to_string(s.offset + s.bytes) + ") lies beyond the end of '" + s.file + "' (" +
                std::to_string(f->second) + " bytes)");
      for (size_t k = 0; k < i; ++k) {
        if (slices_overlap(s.slice, t.shards[k].slice)) {
          throw Error(what + ": shards " + std::to_string(k) + " " + slice_string(t.shards[k].slice) + " and " +
                      std::to_string(i) + " " + slice_string(s.slice) + " overlap");
        }
      }
      covered += slice_numel(s.slice);
    }
    // Disjoint shards inside the tensor cover it exactly when their sizes add up.
    LOOM_CHECK(scope == ManifestScope::RankPart || covered == shape_numel(t.shape), what + ": its shards cover " + std::to_string(covered) + " of " +
                                               std::to_string(shape_numel(t.shape)) + " elements of shape " +
                                               shape_string(t.shape));
  }
  LOOM_CHECK(m.state.is_object(), where + ": 'state' must be a JSON object");
}

std::string serialize_manifest(const Manifest& manifest) {
  try {
    json j = to_json(manifest);
    std::string body = j.dump();
    j[kChecksumKey] = hex64(XXH3_64bits(body.data(), body.size()));
    // One top-level key per line and one file or tensor record per line: readable with grep and
    // diff, and far shorter than fully indented JSON for models with thousands of tensors.
    std::string text = "{";
    bool first = true;
    for (const auto& [key, value] : j.items()) {
      text.append(first ? "\n " : ",\n ").append(json(key).dump()).append(": ");
      first = false;
      if (value.is_array() && !value.empty()) {
        text += "[";
        for (size_t i = 0; i < value.size(); ++i) text.append(i ? ",\n  " : "\n  ").append(value[i].dump());
        text += "\n ]";
      } else {
        text += value.dump();
      }
    }
    return text + "\n}\n";
  } catch (const json::exception& e) {
    // e.g. invalid UTF-8 in the config text or the state
    throw Error("cannot write the checkpoint manifest of step " + std::to_string(manifest.step) + ": " + e.what());
  }
}

Manifest parse_manifest(std::string_view text, const std::string& path, ManifestScope scope) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw Error("'" + path + "' is not valid JSON (" + e.what() + ")");
  }
  std::string stored = get_string(j, kChecksumKey, "'" + path + "'");
  j.erase(kChecksumKey);
  std::string body = j.dump();
  uint64_t computed = XXH3_64bits(body.data(), body.size());
  LOOM_CHECK(parse_hex64(stored, "'" + path + "' " + kChecksumKey) == computed,
        "'" + path + "' is corrupt: its checksum is " + stored + " but its contents hash to " + hex64(computed));
  Manifest m = from_json(j, "'" + path + "'");
  validate_manifest(m, "'" + path + "'", scope);
  return m;
}

}  // namespace loom::ckpt
