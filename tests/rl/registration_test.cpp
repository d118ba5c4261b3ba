// How roles started by a launcher find each other (rl/launch/registration.h): a registration
// round-trips; a second process taking a live process's index is refused naming both, a file of a
// process that is gone (on this host) is replaced; roles.json counts for a role only when it lists
// that role's own process; restart requests are taken once.
#include <unistd.h>

#include <filesystem>

#include <gtest/gtest.h>

#include "loom/core/atomic_file.h"
#include "loom/core/error.h"
#include "loom/rl/launch/registration.h"

namespace loom::rl {
namespace {

std::string fresh_dir(const std::string& tag) {
  const std::string dir = (std::filesystem::temp_directory_path() / ("loom-registration-" + tag + "-" + std::to_string(::getpid()))).string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

Registration worker(int64_t pid) {
  Registration r;
  r.role = "generation";
  r.index = 0;
  r.host = this_host();
  r.pid = pid;
  r.url = "http://" + r.host + ":4242";
  r.server_pid = pid + 1;
  return r;
}

TEST(Registration, RoundTripsAndRefusesADuplicateIndex) {
  const std::string dir = fresh_dir("dup");
  EXPECT_FALSE(read_registration(dir, "generation", 0));
  const Registration mine = worker(::getpid());
  write_registration(dir, mine, true);
  const auto read = read_registration(dir, "generation", 0);
  ASSERT_TRUE(read);
  EXPECT_TRUE(read->same_start(mine));
  EXPECT_EQ(read->server_pid, mine.server_pid);
  // Another process (the parent, alive) claiming the same index.
  try {
    write_registration(dir, worker(::getppid()), true);
    FAIL() << "a duplicate index was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("generation 0 is registered twice: by process " + std::to_string(::getpid())), std::string::npos)
        << e.what();
  }
  // A restart of the same process re-registers.
  Registration again = mine;
  again.starts = 2;
  write_registration(dir, again, false);
  EXPECT_EQ(read_registration(dir, "generation", 0)->starts, 2);
  std::filesystem::remove_all(dir);
}

TEST(Registration, AFileOfAProcessThatIsGoneIsReplaced) {
  const std::string dir = fresh_dir("stale");
  write_registration(dir, worker(999999999), false);  // no such pid
  write_registration(dir, worker(::getpid()), true);
  EXPECT_EQ(read_registration(dir, "generation", 0)->pid, ::getpid());
  std::filesystem::remove_all(dir);
}

TEST(Registration, RolesFileCountsOnlyWhenItListsThisProcess) {
  const std::string dir = fresh_dir("view");
  const Registration mine = worker(::getpid());
  EXPECT_FALSE(read_controller_view(dir, mine).lists_me);
  nlohmann::json roles = {{"controller", "http://c:1"}, {"finished", true}, {"registered", {worker(::getppid()).to_json()}}};
  write_file_atomic(dir + "/roles.json", roles.dump());
  const ControllerView stale = read_controller_view(dir, mine);  // an earlier run's file
  EXPECT_FALSE(stale.lists_me);
  EXPECT_FALSE(stale.finished);
  roles["registered"].push_back(mine.to_json());
  write_file_atomic(dir + "/roles.json", roles.dump());
  const ControllerView view = read_controller_view(dir, mine);
  EXPECT_TRUE(view.lists_me);
  EXPECT_TRUE(view.finished);
  EXPECT_EQ(view.controller, "http://c:1");
  std::filesystem::remove_all(dir);
}

TEST(Registration, RestartRequestsAreTakenOnce) {
  const std::string dir = fresh_dir("restart");
  EXPECT_FALSE(take_restart_request(dir, "environment", 1));
  request_restart(dir, "environment", 1, {"http://h:5", "does not answer /health"});
  const auto request = take_restart_request(dir, "environment", 1);
  ASSERT_TRUE(request);
  EXPECT_EQ(request->url, "http://h:5");
  EXPECT_EQ(request->why, "does not answer /health");
  EXPECT_FALSE(take_restart_request(dir, "environment", 1));
  std::filesystem::remove_all(dir);
}

TEST(Registration, AMalformedFileIsNamed) {
  const std::string dir = fresh_dir("bad");
  std::filesystem::create_directories(dir + "/roles");
  write_file_atomic(dir + "/roles/learner-0.json", "{\"role\": 3}");
  try {
    read_registration(dir, "learner", 0);
    FAIL() << "a malformed registration was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("learner-0.json' is not an object with role, index, host and pid"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace loom::rl
