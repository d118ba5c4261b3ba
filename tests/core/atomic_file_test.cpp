// core/atomic_file.h: a committed write replaces the target whole, an abandoned one leaves it
// untouched and no temporary file behind, and every failure names the path and the OS reason.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <string>

#include "loom/core/atomic_file.h"
#include "loom/core/error.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

class AtomicFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("loom-atomic-file-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  int entries() const { return static_cast<int>(std::distance(fs::directory_iterator(dir_), fs::directory_iterator())); }

  fs::path dir_;
};

// Runs `f`, expecting a loom::Error whose message contains each of `parts`.
template <class F>
void expect_error_naming(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    for (const std::string& part : parts) EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST_F(AtomicFile, WriteReplacesTheTargetWhole) {
  const std::string path = (dir_ / "f.txt").string();
  write_file_atomic(path, "old");
  write_file_atomic(path, "new contents");
  EXPECT_EQ(read_file(path), "new contents");
  write_file_atomic(path, "quick", Durability::Unsynced);
  EXPECT_EQ(read_file(path), "quick");
  EXPECT_EQ(entries(), 1) << "no temporary file is left behind";
}

TEST_F(AtomicFile, AnAbandonedWriterLeavesTheTargetUntouched) {
  const std::string path = (dir_ / "f.bin").string();
  write_file_atomic(path, "before");
  {
    AtomicFileWriter out(path);
    out.write("after", 5);
    EXPECT_EQ(out.bytes_written(), 5u);
  }  // destroyed without commit
  EXPECT_EQ(read_file(path), "before");
  EXPECT_EQ(entries(), 1);
  AtomicFileWriter out(path);
  out.write("af", 2);
  out.write("ter", 3);
  out.commit();
  EXPECT_EQ(read_file(path), "after");
  EXPECT_THROW(out.write("x", 1), Error) << "a committed writer is done";
}

TEST_F(AtomicFile, WritingIntoAMissingDirectoryNamesThePathAndTheReason) {
  const std::string path = (dir_ / "missing" / "f.txt").string();
  expect_error_naming([&] { write_file_atomic(path, "x"); }, {path, "No such file or directory"});
  expect_error_naming([&] { AtomicFileWriter out(path); }, {path, "No such file or directory"});
}

TEST_F(AtomicFile, WritingUnderAFileNamesThePathAndTheReason) {
  write_file_atomic((dir_ / "plain").string(), "x");
  const std::string path = (dir_ / "plain" / "f.txt").string();
  expect_error_naming([&] { write_file_atomic(path, "x"); }, {path, "Not a directory"});
}

TEST_F(AtomicFile, SyncingAMissingDirectoryNamesItAndTheReason) {
  const std::string missing = (dir_ / "nope").string();
  expect_error_naming([&] { fsync_directory(missing); }, {"'" + missing + "'", "No such file or directory"});
  EXPECT_NO_THROW(fsync_directory(dir_.string()));
}

// make_directories creates the missing parents too, and a failure (a file in the way, as the
// directory itself or as a parent) is a loom::Error naming the directory, what it is for and why.
TEST_F(AtomicFile, MakingDirectoriesNamesWhatTheyAreForWhenItCannot) {
  const std::string nested = (dir_ / "a" / "b" / "c").string();
  make_directories(nested, "a test");
  EXPECT_TRUE(fs::is_directory(nested));
  EXPECT_NO_THROW(make_directories(nested, "a test"));  // already there
  write_file_atomic((dir_ / "plain").string(), "x");
  const std::string under_file = (dir_ / "plain" / "logs").string();
  expect_error_naming([&] { make_directories(under_file, "the logs, under run.dir"); },
                      {"'" + under_file + "'", "the logs, under run.dir", "Not a directory"});
  const std::string file = (dir_ / "plain").string();
  expect_error_naming([&] { make_directories(file, "run.dir"); }, {"'" + file + "'", "run.dir"});
}

TEST_F(AtomicFile, ReadingAMissingFileNamesIt) {
  const std::string path = (dir_ / "absent").string();
  expect_error_naming([&] { read_file(path); }, {path});
}

}  // namespace
}  // namespace loom
