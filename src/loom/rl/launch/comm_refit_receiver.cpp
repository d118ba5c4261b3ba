#include "loom/rl/launch/comm_refit_receiver.h"

#include <unistd.h>

#include <filesystem>
#include <ostream>

#include "loom/ckpt/checkpoint.h"
#include "loom/ckpt/checkpoint_root.h"
#include "loom/comm/role_world.h"
#include "loom/core/error.h"
#include "loom/rl/http_json.h"
#include "loom/rl/refit_communication.h"

namespace loom::rl {

namespace {
std::string memory_root() {
  const std::string base = std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : std::filesystem::temp_directory_path().string();
  return base + "/loom-refit-" + std::to_string(::getpid());
}

int64_t version_step(const std::string& version) {
  LOOM_CHECK(version.rfind("step-", 0) == 0, "refit: the learner sent weight version '" + version + "', not step-N");
  return std::stoll(version.substr(5));
}
}  // namespace

CommRefitReceiver::CommRefitReceiver(const config::RunConfig& config, std::function<std::string()> server_url, std::ostream& log)
    : config_(config), server_url_(std::move(server_url)), log_(log), root_(memory_root()) {
  group_ = comm::shared_communicator("refit", refit_comm_options(config));
  LOOM_CHECK(group_->size() > config.grpo.generation_workers,
             "grpo.refit = 'comm': the refit group has " + std::to_string(group_->size()) + " processes, not the learner's and " +
                 std::to_string(config.grpo.generation_workers) + " generation worker(s)");
  thread_ = std::thread([this] { run(); });
}

CommRefitReceiver::~CommRefitReceiver() {
  if (done_) {
    thread_.join();
  } else {
    // Still waiting in the refit group (the process is failing): it cannot be interrupted; the
    // process ends with it, so the thread keeps the group.
    (void)group_.release();
    thread_.detach();
  }
  std::error_code ignored;
  std::filesystem::remove_all(root_, ignored);
}

std::string CommRefitReceiver::error() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_;
}

void CommRefitReceiver::run() {
  const int learners = group_->size() - config_.grpo.generation_workers;
  const int64_t bucket_bytes = int64_t{config_.grpo.refit_bucket_mb} << 20;
  try {
    for (int64_t step = 0; step < config_.train.steps;) {
      const ReceivedParameters received = receive_parameters(*group_, learners, bucket_bytes);
      step = version_step(received.version);
      ckpt::save_checkpoint(root_, step, received.refs(), nlohmann::json::object(), "", 1);
      const std::string path = root_ + "/" + ckpt::step_dir_name(step);
      const std::string url = server_url_();
      try {
        post_ok(url, "/load_weights", {{"path", path}, {"version", received.version}}, config_.grpo.generation_timeout_s);
        log_ << "loom grpo: refit over the communication layer: " << received.names.size() << " tensors from " << learners
             << " learner rank(s), loaded by " << url << " as " << received.version << std::endl;
      } catch (const HttpFailure& e) {
        // A server that died: restarted, it gets the learner's checkpoint from the controller.
        log_ << "loom grpo: refit to " << received.version << ": the server " << url << " did not load it: " << e.what() << std::endl;
      }
    }
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(mutex_);
    error_ = std::string("refit over the communication layer: ") + e.what();
  }
  done_ = true;
}

}  // namespace loom::rl
