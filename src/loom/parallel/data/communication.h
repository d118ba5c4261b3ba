#pragma once
// Every collective the data-parallel code issues, by purpose. The gradient reducers, the ZeRO
// stages, the global norm and the tied-embedding sum call these and no Communicator method
// directly, so what travels over which group is readable in one place.
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "loom/comm/communicator.h"

namespace loom::parallel {

// DDP: starts the all-reduce of one bucket of gradients (in place, `wire` dtype).
comm::WorkHandle start_gradient_all_reduce(comm::Communicator& group, void* bucket, int64_t count, DType wire,
                                           comm::ReduceOp op);
// ZeRO: starts the reduce-scatter of a padded bucket or section; `recv` gets this rank's
// `shard_count` reduced elements.
comm::WorkHandle start_gradient_reduce_scatter(comm::Communicator& group, const void* send, void* recv,
                                               int64_t shard_count, DType wire, comm::ReduceOp op);
// ZeRO: starts the all-gather of every rank's shard (`counts[r]` elements from rank r, back to
// back in `recv`): updated parameters, parameters around a unit, or moments for a checkpoint.
comm::WorkHandle start_shard_all_gather(comm::Communicator& group, const void* send, void* recv,
                                        std::span<const int64_t> counts, DType dtype);
// Hierarchical data parallelism: starts the all-reduce of a reduced shard over the cross-site
// group (in place, summed; `dtype` f32 or bf16).
comm::WorkHandle start_cross_site_all_reduce(comm::Communicator& across, void* shard, int64_t count, DType dtype);
// Hierarchical data parallelism: the in-site and cross-site groups are made from the
// data-parallel group with split (collective over `group`).
std::unique_ptr<comm::Communicator> split_group(comm::Communicator& group, int color, int key, const std::string& name);
// DiLoCo: averages a parameter delta over the cross-site group, blocking (f32).
void average_over_sites(comm::Communicator& across, float* delta, int64_t count);
// The global norm: a rank's share of a sum of squares summed over `group`. The shares travel as
// their fp64 bits (an all-gather) and every rank adds them in rank order, so all ranks get the
// same sum, within fp64 rounding of one rank's: an f32 sum's rounding (~1e-7 relative) would move
// the clip factor, and with it every weight of a layout a hair away from one rank's. A group of
// one rank returns `value` as it is.
double sum_over_group(comm::Communicator& group, double value);
// Pipeline stages with tied embeddings: sums the two copies' gradients over the embedding group
// (first and last stage), blocking.
void sum_tied_gradient(comm::Communicator& group, float* grad, int64_t numel);

}  // namespace loom::parallel
