#pragma once
// Which of its device's compute queues a thread's device work goes on (on a GPU, a CUDA stream
// of its own: kernels/cuda/compute_streams.h). Work on one queue runs in the order it was issued;
// work on different queues may overlap, so what one needs of another's is ordered by the host (a
// read back to the host, synchronize_devices() before a thread ends) or by the communication
// layer. An upload does not order them: a small one goes through pinned staging without waiting
// (kernels/cuda/upload_staging.h), ordered only on its own queue.
//
// Queue 0, the default, is the process's: the main thread's and that of every thread not given
// another, so one rank per process (mpirun, srun) keeps all its work in one order. The threads
// backend gives each rank thread a queue of its own (its rank + 1), so ranks sharing a GPU run
// side by side; a thread that does a rank's device work for it (the cross-site worker) takes its
// rank's queue, so the rank's work keeps one order. Two threads on one queue are correct too
// (their work is issued in one order), only not side by side.
namespace loom {

// This thread's queue.
int compute_queue();

// This thread's queue is `queue` (>= 0) until the scope ends, then what it was.
class ComputeQueueScope {
 public:
  explicit ComputeQueueScope(int queue);
  ~ComputeQueueScope();
  ComputeQueueScope(const ComputeQueueScope&) = delete;
  ComputeQueueScope& operator=(const ComputeQueueScope&) = delete;

 private:
  int previous_;
};

}  // namespace loom
