#pragma once
// TensorBoardWriter: a TensorBoard event file (run_dir/tensorboard/events.out.tfevents.<time>.
// <host>.<pid>.loom) with a scalar for every number of every metrics record, at the record's
// `step` (nested objects' numbers tagged "parent/child"). The file is TFRecord framing (length,
// masked CRC-32C of the length, data, masked CRC-32C of the data) around protobuf-encoded Event
// messages: a file_version "brain.Event:2" first, then a SessionLog START at the step this run
// starts from (TensorBoard drops the scalars an earlier run logged at that step and later: a
// resumed run's redone steps, or a fresh run's whole predecessor), then one Event per record.
#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace loom::config {

class TensorBoardWriter {
 public:
  // Creates run_dir/tensorboard and a new event file in it. `resume_from_step`: the first step
  // this run writes (0 for a fresh run).
  TensorBoardWriter(const std::string& run_dir, int64_t resume_from_step);

  // One Event at `record`'s integer "step" holding its numbers as scalars; records without a
  // step are skipped. Flushed at once.
  void write(const nlohmann::json& record);

  const std::string& path() const { return path_; }

 private:
  void write_event(const std::string& event);

  std::string path_;
  std::ofstream out_;
};

// The Event messages' encodings, for the writer and its tests.
namespace tensorboard {
std::string file_version_event(double wall_time);
std::string session_start_event(double wall_time, int64_t step);
// `scalars`: (tag, value) pairs.
std::string scalars_event(double wall_time, int64_t step, const std::vector<std::pair<std::string, float>>& scalars);
// TFRecord framing of one record.
std::string framed_record(const std::string& data);
}  // namespace tensorboard

}  // namespace loom::config
