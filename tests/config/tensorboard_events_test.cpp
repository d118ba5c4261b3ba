// The event file's bytes, against encodings worked out by hand from the protobuf wire format and
// TFRecord's framing. tests/scripts/tensorboard_reference.sh reads a training run's event files
// back with Google's protobuf runtime and crcmod's CRC-32C.
#include "loom/config/tensorboard_events.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "loom/config/metrics.h"
#include "loom/core/atomic_file.h"
#include "loom/core/crc32c.h"

namespace loom::config {
namespace {

namespace fs = std::filesystem;

// An Event's field 1 (wall_time): the tag 0x09 (field 1, fixed64) and the double's 8 bytes.
std::string wall_time_field(double value) {
  std::string bytes(1 + sizeof value, '\x09');
  std::memcpy(bytes.data() + 1, &value, sizeof value);
  return bytes;
}

TEST(TensorBoardEvents, SessionStartIsWallTimeStepAndStatusStart) {
  // 0x10: field 2 (step), varint; 0x3A: field 7 (session_log),
  // length-delimited, 2 bytes: 0x08 0x01 (status = START).
  EXPECT_EQ(tensorboard::session_start_event(1.5, 5), wall_time_field(1.5) + "\x10\x05\x3A\x02\x08\x01");
  // A step of 300 is the varint 0xAC 0x02; step 0 is left out (proto3's default).
  EXPECT_EQ(tensorboard::session_start_event(0.0, 300), wall_time_field(0.0) + "\x10\xAC\x02\x3A\x02\x08\x01");
  EXPECT_EQ(tensorboard::session_start_event(2.0, 0), wall_time_field(2.0) + "\x3A\x02\x08\x01");
  // 0x1A: field 3 (file_version), 13 bytes.
  EXPECT_EQ(tensorboard::file_version_event(2.0), wall_time_field(2.0) + "\x1A\x0D" + "brain.Event:2");
}

TEST(TensorBoardEvents, ScalarsAreSummaryValuesOfTagAndFloat) {
  const float value = 0.25f;
  std::string value_bytes(4, '\0');
  std::memcpy(value_bytes.data(), &value, 4);
  // Summary (0x2A: field 5) holding one Value (0x0A: field 1) of tag (0x0A, "lr") and simple_value
  // (0x15: field 2, fixed32).
  const std::string entry = std::string("\x0A\x02lr\x15", 5) + value_bytes;
  const std::string summary = std::string{'\x0A', static_cast<char>(entry.size())} + entry;
  const std::string step_and_summary_head{'\x10', '\x07', '\x2A', static_cast<char>(summary.size())};
  EXPECT_EQ(tensorboard::scalars_event(1.0, 7, {{"lr", value}}),
            wall_time_field(1.0) + step_and_summary_head + summary);
}

TEST(TensorBoardEvents, RecordsAreFramedWithMaskedChecksums) {
  const std::string data = "abc";
  const std::string record = tensorboard::framed_record(data);
  ASSERT_EQ(record.size(), 8u + 4u + 3u + 4u);
  const std::string length = record.substr(0, 8);
  EXPECT_EQ(length, std::string("\x03\0\0\0\0\0\0\0", 8));
  uint32_t length_crc = 0, data_crc = 0;
  std::memcpy(&length_crc, record.data() + 8, 4);
  std::memcpy(&data_crc, record.data() + 15, 4);
  EXPECT_EQ(length_crc, masked_crc32c(length));
  EXPECT_EQ(record.substr(12, 3), data);
  EXPECT_EQ(data_crc, masked_crc32c(data));
}

// The data of each framed record of `file`, their checksums checked.
std::vector<std::string> records_of(const std::string& file) {
  std::vector<std::string> records;
  size_t at = 0;
  while (at < file.size()) {
    uint64_t length = 0;
    std::memcpy(&length, file.data() + at, 8);
    const std::string data = file.substr(at + 12, length);
    EXPECT_EQ(file.substr(at, 12 + length + 4), tensorboard::framed_record(data));
    records.push_back(data);
    at += 12 + length + 4;
  }
  return records;
}

double wall_time_of(const std::string& event) {
  double wall_time = 0;
  std::memcpy(&wall_time, event.data() + 1, 8);  // after the tag 0x09
  return wall_time;
}

class TensorBoardWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("loom_tensorboard_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(TensorBoardWriterTest, WritesNumbersOfRecordsWithAStepNestedOnesByPath) {
  TensorBoardWriter writer(dir_.string(), 3);
  const fs::path file = writer.path();
  EXPECT_EQ(file.parent_path(), dir_ / "tensorboard");
  EXPECT_EQ(file.filename().string().rfind("events.out.tfevents.", 0), 0u) << file;
  const std::string head = read_file(file.string());
  const std::vector<std::string> events = records_of(head);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0], tensorboard::file_version_event(wall_time_of(events[0])));
  EXPECT_EQ(events[1], tensorboard::session_start_event(wall_time_of(events[1]), 3));
  writer.write({{"loss", 2.0}});  // no step: nothing
  EXPECT_EQ(read_file(file.string()), head);
  writer.write({{"step", 4}, {"loss", 2.0}, {"name", "text"}, {"validation", {{"reward_mean", 0.5}}}});
  const std::string all = read_file(file.string());
  EXPECT_EQ(records_of(all).size(), 3u);
  EXPECT_NE(all.find("validation/reward_mean"), std::string::npos);
  EXPECT_NE(all.find("loss"), std::string::npos);
  EXPECT_EQ(all.find("name"), std::string::npos);  // text is not a scalar
}

TEST_F(TensorBoardWriterTest, MetricsWriterWritesEventsWhenAsked) {
  {
    MetricsWriter plain(dir_.string(), 0);
    plain.write({{"step", 1}, {"loss", 1.0}});
  }
  EXPECT_FALSE(fs::exists(dir_ / "tensorboard"));
  MetricsWriter both(dir_.string(), 0, true);
  both.write({{"step", 1}, {"loss", 1.0}});
  int files = 0;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir_ / "tensorboard")) {
    files += 1;
    EXPECT_NE(read_file(entry.path().string()).find("loss"), std::string::npos);
  }
  EXPECT_EQ(files, 1);
}

}  // namespace
}  // namespace loom::config
