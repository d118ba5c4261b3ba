#pragma once
// The compute streams: each GPU has one CUDA stream per compute queue of the calling thread
// (core/compute_queue.h), so the ranks of a threads world that share a GPU queue their kernels side
// by side while each rank's work keeps its one order. Every entry, device copy, zeroing and
// transfer runs on compute_stream(its device); the NCCL backend's communication stream waits for
// it through an event.
//
// The streams are made on first use and kept for the process. They are blocking streams (not
// cudaStreamNonBlocking): work anyone issues on the legacy default stream (a synchronous
// cudaMemcpy, a library left on stream 0) stays ordered with every compute stream, as when all
// work went there; two compute streams do not wait for each other. There are kComputeStreams per
// GPU: queue 0 (the process's) has stream slot 0, queues 1, 2, ... share the others in turn
// (ranks 15 apart on one GPU share a stream, which orders their work but stays correct).
//
// Device memory freed on one stream goes back to that stream's free lists (caching_allocator.h:
// the device allocator's, the entries' scratch), so another stream never takes it while work
// queued before the free may still touch it; cuBLASLt's workspace is one per stream.
#include <cuda_runtime.h>

namespace loom::kernels::cuda {

constexpr int kComputeStreams = 16;

// The calling thread's stream slot (0 .. kComputeStreams - 1) on every GPU.
int compute_stream_slot();

// The calling thread's compute stream on GPU `device` (made there on first use).
cudaStream_t compute_stream(int device);

// That stream if it was made (work may be queued on it), else nullptr: waiting for a queue's work
// touches no GPU it never used (making a stream there would start that GPU's context).
cudaStream_t made_compute_stream(int device);

// Waits for the work of every compute stream made on `device`, whichever thread queued it (before
// memory that any of them may still touch is freed to the device or replaced); not for the
// communication streams, whose buffers are freed only after their work's wait() or
// wait_in_stream() (then a compute stream waits for the communication, so this covers it too).
void synchronize_compute_streams(int device);

}  // namespace loom::kernels::cuda
