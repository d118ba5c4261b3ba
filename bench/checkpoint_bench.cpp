// Asynchronous checkpoint saving against synchronous: how long the training thread is blocked by
// a save (the copy of its shards to host memory and starting the writer) against the whole
// synchronous save (copy, checksums, write, fsync, rename), and how much slower training steps
// run while the background writer works (it shares the cores and the memory bus).
//   usage: loom_bench_checkpoint [state_mib=512] [repeats=3] [dir=/tmp]
// A "training step" here is a fixed single-precision GEMM, so its time is the measure of
// interference.
#include <cblas.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "loom/ckpt/async_writer.h"
#include "loom/ckpt/checkpoint.h"

namespace {

using namespace loom;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// One "training step": C = A B for 768 x 768 matrices, three times.
double train_step(std::vector<float>& a, std::vector<float>& b, std::vector<float>& c) {
  const Clock::time_point start = Clock::now();
  for (int i = 0; i < 3; ++i) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 768, 768, 768, 1.0f, a.data(), 768, b.data(), 768, 0.0f,
                c.data(), 768);
  }
  return seconds_since(start);
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t state_mib = argc > 1 ? std::atoll(argv[1]) : 512;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 3;
  const std::string dir = (std::filesystem::path(argc > 3 ? argv[3] : "/tmp") / "loom-checkpoint-bench").string();
  std::filesystem::remove_all(dir);
  // The state as 64 tensors, as a model's parameters and moments would be.
  const int64_t per_tensor = state_mib * 1024 * 1024 / 4 / 64;
  std::vector<std::vector<float>> tensors(64, std::vector<float>(per_tensor));
  for (size_t t = 0; t < tensors.size(); ++t) {
    for (int64_t i = 0; i < per_tensor; ++i) tensors[t][i] = static_cast<float>((i * 31 + t) % 1000) * 1e-3f;
  }
  std::vector<ckpt::TensorRef> refs;
  for (size_t t = 0; t < tensors.size(); ++t) {
    refs.push_back({"model.layers." + std::to_string(t) + ".weight", {per_tensor}, DType::F32, tensors[t].data(), {}});
  }
  std::vector<float> a(768 * 768, 0.5f), b(768 * 768, 0.25f), c(768 * 768);
  for (int i = 0; i < 3; ++i) train_step(a, b, c);  // warm-up

  // The writer lives across saves, as in training: from the second save on, its snapshot memory
  // is reused (the first save pays for faulting it in).
  ckpt::AsyncCheckpointWriter writer;
  writer.save(dir, ckpt::snapshot_checkpoint(1000, refs, {}, ""), 2);
  double sync_total = 0, blocked_total = 0, quiet_step = 0, busy_step = 0;
  int quiet_steps = 0, busy_steps = 0;
  for (int r = 0; r < repeats; ++r) {
    for (int i = 0; i < 5; ++i, ++quiet_steps) quiet_step += train_step(a, b, c);
    Clock::time_point start = Clock::now();
    ckpt::write_snapshot(dir, ckpt::snapshot_checkpoint(2 * r + 1, refs, {}, ""), 2);
    sync_total += seconds_since(start);

    start = Clock::now();
    writer.save(dir, ckpt::snapshot_checkpoint(2 * r + 2, refs, {}, "", ckpt::ManifestScope::Complete, writer.take_arena()),
                2);
    blocked_total += seconds_since(start);
    while (writer.busy()) {
      busy_step += train_step(a, b, c);
      ++busy_steps;
    }
    writer.wait();
  }
  std::filesystem::remove_all(dir);
  const double sync = sync_total / repeats, blocked = blocked_total / repeats;
  std::printf("state %lld MiB in 64 tensors, %d saves each way, checkpoint directory under %s\n",
              static_cast<long long>(state_mib), repeats, dir.c_str());
  std::printf("synchronous save:                 %8.1f ms\n", sync * 1e3);
  std::printf("asynchronous save, step blocked:  %8.1f ms (%.1f%% of the synchronous save)\n", blocked * 1e3,
              100.0 * blocked / sync);
  std::printf("training step alone:              %8.2f ms (%d steps)\n", 1e3 * quiet_step / quiet_steps, quiet_steps);
  if (busy_steps > 0) {
    std::printf("training step while writing:      %8.2f ms (%d steps, %.2fx)\n", 1e3 * busy_step / busy_steps,
                busy_steps, (busy_step / busy_steps) / (quiet_step / quiet_steps));
  }
  return 0;
}
