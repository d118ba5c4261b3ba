#pragma once
// DiLoCo's outer optimizer (parallel.outer=diloco): each site trains on its own for
// parallel.outer_steps (H) steps (data parallelism inside the site), then the sites average what
// they moved, delta = anchor - parameters, over the cross-site group and apply it to the anchor
// (the parameters at the last sync, the same on every site) with SGD with Nesterov momentum:
//   m = mu m + delta_avg;  anchor -= outer_lr (delta_avg + mu m);  parameters = anchor.
// With outer_lr 1 and mu 0 that is plain parameter averaging. Streaming (outer_fragments F > 1):
// the flat parameter buffer is cut into F even fragments, fragment f syncing at the steps t with
// t mod H = f H / F, so each sync sends 1/F of the model and the syncs are spread over the H
// steps. The inner optimizer (AdamW) and its moments stay per site.
//
// Cross-site traffic: one all-reduce of a fragment per sync per rank (every rank of a site holds
// the whole model), 2 (S - 1) / S of its bytes, against data parallelism's every step.
//
// The anchor, momentum and delta live with the parameters (on their device); the update runs
// through the device-neutral entries (kernels/ops.h), so a GPU computes the CPU's bits.
#include <cstdint>

#include "loom/comm/communicator.h"
#include "loom/core/tensor.h"

namespace loom::parallel {

struct DilocoOptions {
  int outer_steps = 50;
  double outer_lr = 0.7;
  double outer_momentum = 0.9;
  int fragments = 1;
};

class DilocoOuter {
 public:
  // `params`: the model's flat parameter buffer (`total` elements on `device`), the same on every
  // rank now.
  DilocoOuter(comm::Communicator& across, float* params, int64_t total, Device device, DilocoOptions options);

  // After inner step `step` (1-based): syncs the fragments due. Collective over `across`.
  // Returns whether the parameters changed (the inner optimizer must then reload its master
  // weights from them).
  bool after_step(int64_t step);
  // Whether after_step(step) syncs a fragment (reads and replaces parameters).
  bool syncs_at(int64_t step) const;
  // The anchor becomes the parameters and the momentum zero (a start without outer state).
  void reset();

  // On the parameters' device.
  Device device() const { return device_; }
  float* anchor() { return anchor_.data<float>(); }
  float* momentum() { return momentum_.data<float>(); }
  const float* anchor() const { return anchor_.data<float>(); }
  const float* momentum() const { return momentum_.data<float>(); }
  // Bytes this rank sent across sites, in total.
  int64_t cross_site_bytes() const { return bytes_; }

 private:
  void sync(int64_t begin, int64_t end);

  comm::Communicator& across_;
  float* params_;
  int64_t total_;
  Device device_;
  DilocoOptions options_;
  Tensor anchor_, momentum_, delta_;  // delta_: the largest fragment
  int64_t bytes_ = 0;
};

}  // namespace loom::parallel
