#include "loom/rl/learner_loop.h"

#include <unistd.h>

#include <memory>
#include <ostream>

#include "loom/ckpt/checkpoint_root.h"
#include "loom/rl/communication.h"
#include "loom/rl/grpo_learner.h"
#include "loom/rl/learner_client.h"
#include "loom/train/model_setup.h"
#include "loom/train/run_ranks.h"

namespace loom::rl {

namespace {
// The controller's URL: from roles.json; external: once it lists this learner's registration.
std::string controller_url(const config::RunConfig& config, const LearnerPlace& place, const Registration& me) {
  if (!place.external) return find_controller(place.grpo_dir, 600.0);
  write_registration(place.grpo_dir, me, true);
  return find_controller_listing(place.grpo_dir, me, 2.0 * config.grpo.register_timeout_s);
}
}  // namespace

void run_learner(const config::RunConfig& config, const LearnerPlace& place, std::ostream& out) {
  Registration me;
  me.role = "learner";
  me.host = this_host();
  me.pid = ::getpid();
  me.job_rank = place.job_rank;
  train::run_on_ranks(config, out, [&](comm::Communicator& world) {
    GrpoLearner learner(config, world, out);
    std::unique_ptr<LearnerClient> client;
    if (world.rank() == 0) {
      me.ranks = world.size();
      client = std::make_unique<LearnerClient>(controller_url(config, place, me), config.grpo.step_timeout_s);
      // Resumed from a checkpoint saved just before a crash, whose report never reached the
      // controller: report it now, so that the workers are refit and the steps agree.
      const int64_t resumed = learner.weight_version();
      if (resumed > 0 && client->steps_done() == resumed - 1)
        client->step_done(resumed - 1, train::checkpoint_root(config) + "/" + ckpt::step_dir_name(resumed), {{"resumed", true}});
    }
    for (int64_t step = learner.weight_version(); step < config.train.steps; ++step) {
      const std::string text = broadcast_text(world.rank() == 0 ? client->batch_text(step) : std::string(), world, 0);
      const LearnerStep result = learner.step(groups_of_batch(text, step));
      const std::string checkpoint = learner.save();
      if (world.rank() == 0) client->step_done(step, checkpoint, result.to_json());
    }
    learner.finish();
    if (world.rank() == 0 && place.external) remove_registration(place.grpo_dir, me);
    return train::TrainSummary{};
  });
}

}  // namespace loom::rl
