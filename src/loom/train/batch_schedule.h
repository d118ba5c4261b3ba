#pragma once
// How many sequences each step trains on and how long the run is, in steps and in samples.
// With train.rampup_batch_size = [start, increment, samples] (Megatron's --rampup-batch-size) the
// step that starts after c samples consumed trains on
//   start + floor(c n / samples) x increment   while c <= samples, n = (global_batch - start) / increment,
//   train.global_batch                           after,
// computed in exact integers (Megatron divides in floating point, which at an exact stage
// boundary can land one increment lower). Every function here is O(n): the ramp is walked a
// stage at a time, never a step at a time.
#include <cstdint>
#include <string>
#include <vector>

#include "loom/config/run_config.h"

namespace loom::train {

// The global batch of the step that starts after `consumed` samples.
int64_t global_batch_at(const config::TrainConfig& train, int64_t consumed);

// The steps the run takes: train.steps, or for train.samples as Megatron counts them: steps
// while their start is within the ramp-up's samples and train.samples, then the whole global
// batches left of train.samples (a partial last batch is dropped).
int64_t training_steps(const config::TrainConfig& train);

// Samples consumed after the run's first `steps` steps.
int64_t samples_after_steps(const config::TrainConfig& train, int64_t steps);

// The steps that train on less than train.global_batch (0 without a ramp-up).
int64_t rampup_steps(const config::TrainConfig& train);

// The run's steps grouped by their global batch, in the order they run: one entry without a
// ramp-up, one per batch size the ramp-up's steps train on otherwise.
struct BatchSteps {
  int64_t batch = 0, steps = 0;
};
std::vector<BatchSteps> steps_by_batch(const config::TrainConfig& train);

// The key that sets the run's length, for messages: "train.steps = 300", or
// "train.samples = 1000 (125 steps)".
std::string run_length_key(const config::TrainConfig& train);

// The batch ramp-up, for the run's description: "" without one, else one line like
// "batch: ramps up from 16 to 64 sequences by 16 over the first 1000 samples (steps 1-26)\n".
std::string describe_batches(const config::TrainConfig& train);

}  // namespace loom::train
