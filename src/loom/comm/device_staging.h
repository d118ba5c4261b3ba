#pragma once
// Collectives over device memory for the backends that move host bytes (threads, mpi): a
// Communicator that wraps another and stages every buffer that lives on `device` through host
// memory. At issue a device input is copied to a host buffer (after the device's earlier work),
// the wrapped backend runs on host buffers, and when the operation completes (wait(), or a
// test() that finds it done) the host result is copied back into the device buffer. Host
// buffers pass through untouched, so one communicator serves a rank's device tensors and its
// host scalars (losses, token counts, agreements) alike.
//
// This is what lets several ranks share one GPU through the threads backend (NCCL refuses two
// ranks on one device) and lets MPI carry device tensors without a CUDA-aware MPI: correct, with
// two host copies per operation. NCCL (comm/nccl) is the fast path on GPUs.
//
// Which buffers are device memory: `Allocator::holds` of the device's allocator. Groups made by
// split() stage the same way.
//
// With a device backend (runtime.device_comm = nccl): an operation whose buffers are all device
// memory runs on that backend's group instead, unstaged; the rest (host scalars, mixed buffers)
// still go through the host backend. The ranks of one operation must pass the same kinds of
// buffers (as SPMD code does), or they would wait on different backends.
#include <functional>
#include <memory>

#include "loom/comm/communicator.h"
#include "loom/core/device.h"

namespace loom::comm {

// Wraps `inner` (not owned: it must outlive the result) for buffers on `device` (a cuda device).
std::unique_ptr<Communicator> stage_device_buffers(Communicator& inner, Device device);

// Makes a device backend's group of the same ranks as `bootstrap` (collective over it), this rank
// driving `device`. The binary registers NCCL's (src/main.cpp); tests may register another.
using DeviceCommunicatorFactory =
    std::function<std::unique_ptr<Communicator>(Communicator& bootstrap, Device device, const CommOptions& options)>;
void set_device_communicator_factory(DeviceCommunicatorFactory factory);

// stage_device_buffers, with device-only operations on a group made by the registered factory
// (an Error naming runtime.device_comm when the build has none). Collective over `inner`.
std::unique_ptr<Communicator> route_device_buffers(Communicator& inner, Device device, const CommOptions& options);

}  // namespace loom::comm
