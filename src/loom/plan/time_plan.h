#pragma once
// Step time of a layout on given hardware, before it runs:
//
//   compute      each pipeline stage's training FLOPs per micro-batch (model/flops.h, per layer
//                kind; recompute adds a forward of the blocks) / tp over the device's achieved
//                GEMM rate, but what every tensor-parallel rank computes whole (MoE layers'
//                routers, latent projections and routed experts; eh_proj) not divided, plus the
//                elementwise kernels' passes over the activations (norms, softmax, activation
//                functions, residual adds) at the device's activation rate
//   tensor par.  per micro-batch the fp32 collectives each layer kind makes (parallel_comm.h): one
//                all-reduce of the stream (or all-gathers and a reduce-scatter under sequence
//                parallelism) forward and one backward per region between column- and
//                row-parallel linears (attention, MLP, Mamba-2 mixer, shared expert), the routed
//                experts' gather and reduce-scatter under sequence parallelism, the embedding's,
//                the head's and the multi-token prediction depths', and the gradient sums
//   pipeline     the schedule simulated (parallel/pipeline/pipeline_simulation.h) with these
//                stage costs and each boundary's send/recv: the makespan holds the bubble
//   data par.    the gradient all-reduce (ZeRO 1-2: reduce-scatter; ZeRO-3: two parameter
//                all-gathers per micro-batch and a reduce-scatter), partly hidden behind
//                backward (hardware comm_overlap); at ZeRO 1-2 the parameter all-gather after the
//                update, waited for whole, or with parallel.overlap_param_gather what outlasts the
//                first micro-batch's forward (at least one bucket's share)
//   optimizer    AdamW's pass over this rank's parameters and state, and the gradients zeroed,
//                at the memory bandwidth
//   casts        the precision recipe's copies and casts of every linear's GEMM operands and
//                outputs (linear_precision.h) at the hardware's cast rates
//   memory       memory handed back to the system between uses (ZeRO-2's gradients, ZeRO-3's
//                parameters and gradients, compact parameters) faulting in again
//   shared host  (hardware shared: true) ranks beyond its cores take turns: a stage computes at
//                the rate of one rank alone, and the step is at least all ranks' work over the
//                cores (a rank idle in the bubble leaves its core to the others)
//
// Collectives cost as rings over the group's link class: 2(n-1)/n x bytes / bandwidth plus
// 2(n-1) latencies for an all-reduce, half that for a reduce-scatter or all-gather.
#include "loom/config/run_config.h"
#include "loom/plan/hardware.h"
#include "loom/plan/memory_plan.h"

namespace loom::plan {

struct TimeBreakdown {
  double compute = 0.0;      // the slowest stage's passes over every micro-batch, GEMMs and memory-bound
  double casts = 0.0;        // the precision recipe's casts of GEMM operands and outputs (in its critical path)
  double memory = 0.0;       // memory handed back between uses faulting in again (ZeRO-2/3, compact parameters)
  double bubble = 0.0;       // pipeline idle time of that stage
  double core_wait = 0.0;    // shared host: ranks waiting for one of its cores
  double tp_comm = 0.0;      // tensor-parallel collectives the step waits for (not hidden behind GEMMs)
  double tp_comm_hidden = 0.0;  // and those run beside the GEMMs (parallel.overlap_tp_comm); not in step
  double cp_comm = 0.0;      // context-parallel attention's exchanges not hidden behind its compute
  double ep_comm = 0.0;      // expert parallelism's token exchanges
  double pp_comm = 0.0;      // pipeline sends and receives
  double dp_comm = 0.0;      // exposed data-parallel communication
  // ZeRO-3's shards to the device for each gather and back after each reduce-scatter, over the
  // host link (parallel.offload_params), with the host memory adding the received gradients
  double host_link = 0.0;
  double optimizer = 0.0;
  double overhead = 0.0;
  double step = 0.0;
};

// Seconds per optimizer step; `memory` is plan_memory's result for the same config.
TimeBreakdown plan_time(const config::RunConfig& config, const MemoryPlan& memory, const Hardware& hardware);

// The link class of a group of `size` ranks `stride` apart (Megatron's rank order).
comm::LinkClass group_link(const Hardware& hardware, int size, int stride, int world);
// Ring collective times in seconds.
double all_reduce_seconds(double bytes, int ranks, const Link& link);
double all_gather_seconds(double bytes, int ranks, const Link& link);  // also reduce-scatter; bytes = full size

}  // namespace loom::plan
