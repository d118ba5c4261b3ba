#include "loom/config/tensorboard_events.h"

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>
#include <vector>

#include "loom/core/crc32c.h"
#include "loom/core/error.h"

namespace loom::config {

namespace tensorboard {

namespace {

// Protocol-buffer wire format (the few field kinds an Event of scalars needs).
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7F) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

void put_tag(std::string& out, uint32_t field, WireType type) { put_varint(out, (uint64_t{field} << 3) | type); }

template <class T>
void put_little_endian(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));  // x86-64 and AArch64 are little-endian, as the wire format
  out.append(bytes, sizeof(T));
}

void put_bytes(std::string& out, uint32_t field, const std::string& bytes) {
  put_tag(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out += bytes;
}

// Event fields: wall_time = 1 (double), step = 2 (int64), file_version = 3 (string),
// summary = 5 (Summary), session_log = 7 (SessionLog).
std::string event_head(double wall_time, int64_t step) {
  std::string event;
  put_tag(event, 1, kFixed64);
  put_little_endian(event, wall_time);
  if (step != 0) {  // proto3 leaves a zero scalar out
    put_tag(event, 2, kVarint);
    put_varint(event, static_cast<uint64_t>(step));
  }
  return event;
}

}  // namespace

std::string file_version_event(double wall_time) {
  std::string event = event_head(wall_time, 0);
  put_bytes(event, 3, "brain.Event:2");
  return event;
}

std::string session_start_event(double wall_time, int64_t step) {
  std::string session_log;  // SessionLog: status = 1 (START = 1)
  put_tag(session_log, 1, kVarint);
  put_varint(session_log, 1);
  std::string event = event_head(wall_time, step);
  put_bytes(event, 7, session_log);
  return event;
}

std::string scalars_event(double wall_time, int64_t step, const std::vector<std::pair<std::string, float>>& scalars) {
  std::string summary;  // Summary: repeated Value value = 1; Value: tag = 1, simple_value = 2 (float)
  for (const auto& [tag, value] : scalars) {
    std::string entry;
    put_bytes(entry, 1, tag);
    put_tag(entry, 2, kFixed32);
    put_little_endian(entry, value);
    put_bytes(summary, 1, entry);
  }
  std::string event = event_head(wall_time, step);
  put_bytes(event, 5, summary);
  return event;
}

std::string framed_record(const std::string& data) {
  std::string length;
  put_little_endian(length, static_cast<uint64_t>(data.size()));
  std::string record = length;
  put_little_endian(record, masked_crc32c(length));
  record += data;
  put_little_endian(record, masked_crc32c(data));
  return record;
}

}  // namespace tensorboard

namespace {

double seconds_since_epoch() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Every number of `value` as (tag, value): `prefix` for a number, "prefix/key" inside an object.
void collect_scalars(const nlohmann::json& value, const std::string& prefix,
                     std::vector<std::pair<std::string, float>>& scalars) {
  if (value.is_number()) {
    scalars.emplace_back(prefix, value.get<float>());
  } else if (value.is_object()) {
    for (const auto& [key, item] : value.items()) collect_scalars(item, prefix + "/" + key, scalars);
  }
}

}  // namespace

TensorBoardWriter::TensorBoardWriter(const std::string& run_dir, int64_t resume_from_step) {
  const std::filesystem::path dir = std::filesystem::path(run_dir) / "tensorboard";
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error("log.tensorboard: cannot create '" + dir.string() + "': " + ec.message());
  char host[256] = "host";
  ::gethostname(host, sizeof host - 1);
  const double now = seconds_since_epoch();
  path_ = (dir / ("events.out.tfevents." + std::to_string(static_cast<int64_t>(now)) + "." + host + "." +
                  std::to_string(::getpid()) + ".loom"))
              .string();
  out_.open(path_, std::ios::out | std::ios::app | std::ios::binary);
  if (!out_) throw Error("log.tensorboard: cannot open '" + path_ + "' for writing");
  write_event(tensorboard::file_version_event(now));
  write_event(tensorboard::session_start_event(now, resume_from_step));
}

void TensorBoardWriter::write(const nlohmann::json& record) {
  const auto step = record.find("step");
  if (step == record.end() || !step->is_number_integer()) return;
  std::vector<std::pair<std::string, float>> scalars;
  for (const auto& [key, value] : record.items()) {
    if (key != "step") collect_scalars(value, key, scalars);
  }
  write_event(tensorboard::scalars_event(seconds_since_epoch(), step->get<int64_t>(), scalars));
}

void TensorBoardWriter::write_event(const std::string& event) {
  out_ << tensorboard::framed_record(event);
  out_.flush();
  if (!out_) throw Error("log.tensorboard: cannot write to '" + path_ + "' (disk full?)");
}

}  // namespace loom::config
