#include "loom/ops/fault_injection.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <thread>

#include "loom/ckpt/checkpoint.h"
#include "loom/core/error.h"
#include "loom/ops/heartbeat.h"

namespace loom::ops {

namespace {

void say(const std::string& text) {
  // One write, flushed: the process may die next, and other ranks' lines must not split it.
  std::cerr << ("loom: fault injection: " + text + "\n") << std::flush;
}

// SplitMix64: a well-mixed 64-bit value from a counter.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::string seconds_text(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", s);
  return text;
}

}  // namespace

FaultInjector::FaultInjector(const config::FaultConfig& config, int world_rank, int world_size)
    : config_(config), rank_(world_rank) {
  auto check_rank = [&](int rank, int step, const char* rank_key, const char* step_key) {
    if (step <= 0) return;
    LOOM_CHECK(rank >= 0 && rank < world_size, std::string("fault.") + rank_key + " is " + std::to_string(rank) +
                                              " but fault." + step_key + " is set: give a rank of the " +
                                              std::to_string(world_size) + "-rank world (0.." +
                                              std::to_string(world_size - 1) + ")");
  };
  check_rank(config.kill_rank, config.kill_step, "kill_rank", "kill_step");
  check_rank(config.stall_rank, config.stall_step, "stall_rank", "stall_step");
  const char* restart = std::getenv(kRestartCountEnv);
  attempt_ = restart == nullptr ? 0 : std::atoi(restart);
  const bool first_attempt = attempt_ == 0;
  if (attempt_ < config.random_kills) {
    const uint64_t draw = mix(mix(static_cast<uint64_t>(config.seed)) ^ static_cast<uint64_t>(attempt_));
    random_kill_rank_ = static_cast<int>(draw % static_cast<uint64_t>(world_size));
    random_kill_offset_ = 1 + static_cast<int>((draw >> 32) % static_cast<uint64_t>(config.random_kill_window));
  }
  const bool any = config.kill_step > 0 || config.stall_step > 0 || config.corrupt_step > 0;
  armed_ = any && (first_attempt || config.repeat);
  if (any && !armed_ && world_rank == 0) {
    say(std::string("faults are configured but off on restart ") + restart + " (fault.repeat=true fires them again)");
  }
}

void FaultInjector::kill_self(int64_t step, const std::string& why) const {
  say("rank " + std::to_string(rank_) + " (pid " + std::to_string(::getpid()) + ") kills its process at step " +
      std::to_string(step) + " (" + why + ")");
  ::kill(::getpid(), SIGKILL);
  std::_Exit(137);  // not reached
}

void FaultInjector::at_step_start(int64_t step) const {
  if (first_step_ < 0) first_step_ = step;
  if (random_kill_rank_ == rank_ && step == first_step_ + random_kill_offset_) {
    kill_self(step, "fault.random_kills: attempt " + std::to_string(attempt_) + " of " +
                        std::to_string(config_.random_kills));
  }
  if (!armed_) return;
  if (config_.kill_step > 0 && step == config_.kill_step && rank_ == config_.kill_rank) {
    kill_self(step, "fault.kill_rank/kill_step");
  }
  if (config_.stall_step > 0 && step == config_.stall_step && rank_ == config_.stall_rank) {
    say("rank " + std::to_string(rank_) + " stalls at step " + std::to_string(step) +
        (config_.stall_s > 0.0 ? " for " + seconds_text(config_.stall_s) + " s" : " forever") +
        " (fault.stall_rank/stall_step/stall_s)");
    if (config_.stall_s > 0.0) {
      std::this_thread::sleep_for(std::chrono::duration<double>(config_.stall_s));
    } else {
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    }
  }
}

void FaultInjector::after_checkpoint(int64_t step, const std::string& root,
                                     const std::function<void()>& wait_for_save) const {
  if (!armed_ || config_.corrupt_step <= 0 || step != config_.corrupt_step) return;
  if (wait_for_save) wait_for_save();
  const std::string dir = (std::filesystem::path(root) / ckpt::step_dir_name(step)).string();
  say("corrupted checkpoint " + dir + ": " + corrupt_checkpoint_shard(dir) + " (fault.corrupt_step)");
}

std::string corrupt_checkpoint_shard(const std::string& step_dir) {
  const ckpt::LoadedCheckpoint checkpoint = ckpt::open_checkpoint_dir(step_dir);
  for (const ckpt::TensorRecord& tensor : checkpoint.manifest().tensors) {
    for (const ckpt::ShardRecord& shard : tensor.shards) {
      if (shard.bytes == 0) continue;
      const std::string path = (std::filesystem::path(step_dir) / shard.file).string();
      const uint64_t offset = shard.offset + shard.bytes / 2;
      const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
      LOOM_CHECK(fd >= 0, "fault injection: cannot open '" + path + "': " + std::strerror(errno));
      unsigned char byte = 0;
      bool ok = ::pread(fd, &byte, 1, static_cast<off_t>(offset)) == 1;
      byte ^= 0xFF;
      ok = ok && ::pwrite(fd, &byte, 1, static_cast<off_t>(offset)) == 1 && ::fsync(fd) == 0;
      ::close(fd);
      LOOM_CHECK(ok, "fault injection: cannot flip byte " + std::to_string(offset) + " of '" + path + "'");
      return shard.file + " byte " + std::to_string(offset) + " (tensor " + tensor.name + ")";
    }
  }
  throw Error("fault injection: checkpoint '" + step_dir + "' has no shard to corrupt");
}

}  // namespace loom::ops
