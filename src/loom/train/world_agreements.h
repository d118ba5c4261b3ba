#pragma once
// The trainer's own collectives: what every rank must agree on for a step to be one step of one
// model (docs/collectives.md). Each is one small collective per step or per save.
#include <cstdint>
#include <vector>

#include "loom/comm/communicator.h"

namespace loom::train {

// The global number of trained tokens of a step: each data-parallel rank counts its share of the
// global batch, the counts are summed exactly over `dp` by one small all-reduce, so every
// rank scales its gradients by the same 1/count without reading the other ranks' data.
// Under context parallelism each rank counts the targets of its share of the sequences, and the
// counts are summed over data x context parallel (`dp` is then the dp_cp group).
int64_t agree_token_count(comm::Communicator& dp, int64_t local_tokens);

// Evaluation under context parallelism: the loss sum and token count of the shares of `group`'s
// ranks, summed (one all-reduce).
void sum_loss_and_tokens(comm::Communicator& group, double& loss_sum, int64_t& tokens);

// A stop request that is no signal: train.exit_duration_mins has passed on the rank.
constexpr int kStopForDuration = -1;

struct LossAndStop {
  double loss_sum = 0.0;  // the step's summed token loss over the whole global batch
  // SIGTERM if any rank got one, else SIGINT if any did, else kStopForDuration if any rank's time
  // ran out, else 0.
  int stop_signal = 0;
  std::vector<double> extra;  // `extra_sums`, summed like the loss
};
// Sums the loss of the ranks that `contribute` (one per replica: the last pipeline stage's first
// tensor-parallel rank) and agrees on the stop requests (`stop_signal`: the signal this rank was
// asked to stop by, kStopForDuration, or 0 if none), in one all-reduce over `world`, so every rank stops after the
// same step and reports the same signal. `extra_sums` (multi-token prediction's losses and
// token counts) travel in the same all-reduce, summed over the contributing ranks.
LossAndStop agree_loss_and_stop(comm::Communicator& world, bool contribute, double local_loss_sum, int stop_signal,
                                const std::vector<double>& extra_sums = {});

// Statistics of a step summed (`sums`) and maximised (`maxima`) over the ranks that `contribute`
// (one per replica, as agree_loss_and_stop), for every rank: one all-gather of doubles over
// `world`, combined in rank order (a minimum travels as its negation).
void agree_sums_and_maxima(comm::Communicator& world, bool contribute, std::vector<double>& sums,
                           std::vector<double>& maxima);

// Mixed precision's step decision: whether any rank of `world` found Inf/NaN in its gradients
// (every rank then skips or steps together), and this step's FP8 amaxes (`amaxes`, replaced by
// their maximum) over the ranks holding the same layers, `same_layers` (null: the world, and both
// travel in one all-reduce max).
bool agree_non_finite_and_amaxes(comm::Communicator& world, comm::Communicator* same_layers, bool local_found,
                                 std::vector<float>& amaxes);

// The token that names a save (rank 0's process id): every rank's part of the checkpoint carries
// it, so rank 0 never merges a part left by another attempt.
int64_t agree_save_token(comm::Communicator& world, int64_t token_on_rank0);

// Nobody returns (and, with MPI, finalises) before every rank's files are complete.
void wait_for_every_rank(comm::Communicator& world);

}  // namespace loom::train
