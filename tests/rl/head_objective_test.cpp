// The model head's per-token objective (model/token_objective.h, the GRPO learner's): its
// parameter gradients match finite differences of the objective; the objective -logp gives
// cross-entropy's loss and gradients;
// under tensor parallelism with sequence parallelism (vocabulary-parallel head) it gives one
// rank's gradients; the multi-token prediction depths' loss beside an objective trains the
// depths alone.
#include "loom/model/token_objective.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>

#include "../gradient_check.h"
#include "loom/comm/launch.h"
#include "loom/kernels/types.h"
#include "loom/model/transformer.h"

namespace loom::model {
namespace {

config::ModelConfig small_model() {
  config::ModelConfig c;
  c.vocab_size = 37;
  c.d_model = 16;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn_size = 24;
  c.max_seq_len = 16;
  c.init_std = 0.2;
  return c;
}

// loss_r = a_r exp(logp_r) + b_r logp_r^2: smooth, with row-dependent signs.
class SmoothObjective : public TokenObjective {
 public:
  double evaluate(const int32_t* targets, const float* logp, int64_t rows, float* gradient) override {
    double sum = 0.0;
    for (int64_t r = 0; r < rows; ++r) {
      gradient[r] = 0.0f;
      if (targets[r] == kernels::kIgnoreIndex) continue;
      const double a = (r % 3) - 1.0, b = 0.1 * ((r % 5) - 2), l = logp[r];
      sum += a * std::exp(l) + b * l * l;
      gradient[r] = static_cast<float>(a * std::exp(l) + 2.0 * b * l);
    }
    return sum;
  }
};

// Cross-entropy as an objective: loss -logp, gradient -1.
class NegativeLogprob : public TokenObjective {
 public:
  double evaluate(const int32_t* targets, const float* logp, int64_t rows, float* gradient) override {
    double sum = 0.0;
    for (int64_t r = 0; r < rows; ++r) {
      gradient[r] = targets[r] == kernels::kIgnoreIndex ? 0.0f : -1.0f;
      if (targets[r] != kernels::kIgnoreIndex) sum -= logp[r];
    }
    return sum;
  }
};

// SmoothObjective asking for the multi-token prediction depths' loss beside it.
class SmoothWithDepths : public SmoothObjective {
 public:
  explicit SmoothWithDepths(double weight) : weight_(weight) {}
  double depth_loss_weight() const override { return weight_; }

 private:
  double weight_;
};

struct Data {
  std::vector<int32_t> inputs, targets;
};
Data make_data(int rows, int vocab) {
  Data d;
  for (int i = 0; i < rows; ++i) {
    d.inputs.push_back((i * 7 + 3) % vocab);
    d.targets.push_back(i % 6 == 5 ? kernels::kIgnoreIndex : (i * 11 + 1) % vocab);
  }
  return d;
}

TEST(TokenObjective, GradientsMatchFiniteDifferences) {
  Transformer model(small_model());
  model.initialize(3);
  SmoothObjective objective;
  model.set_token_objective(&objective);
  const Data d = make_data(2 * 8, 37);
  model.params().zero_grads();
  model.forward_backward(d.inputs.data(), d.targets.data(), 2, 8, 1.0f);
  const std::vector<float> grads(model.params().grads(), model.params().grads() + model.params().total());
  auto loss = [&] { return model.forward_loss(d.inputs.data(), d.targets.data(), 2, 8); };
  testing::FdTolerance tol;
  tol.eps = 1e-2;
  tol.atol = 2e-4;
  testing::expect_gradient_matches("parameters", model.params().values(), model.params().total(), grads.data(), loss,
                                   tol);
}

TEST(TokenObjective, NegativeLogprobIsCrossEntropy) {
  Transformer model(small_model());
  model.initialize(4);
  const Data d = make_data(2 * 8, 37);
  model.params().zero_grads();
  const double ce = model.forward_backward(d.inputs.data(), d.targets.data(), 2, 8, 0.25f);
  const std::vector<float> ce_grads(model.params().grads(), model.params().grads() + model.params().total());
  NegativeLogprob objective;
  model.set_token_objective(&objective);
  model.params().zero_grads();
  const double as_objective = model.forward_backward(d.inputs.data(), d.targets.data(), 2, 8, 0.25f);
  EXPECT_NEAR(as_objective, ce, 1e-6 * ce);
  float scale = 0.0f;
  for (float g : ce_grads) scale = std::max(scale, std::fabs(g));
  for (size_t i = 0; i < ce_grads.size(); ++i) {
    ASSERT_NEAR(model.params().grads()[i], ce_grads[i], 1e-6f * scale) << "gradient " << i;
  }
}

// Under an objective whose depth_loss_weight() is w, the multi-token prediction depths'
// cross-entropy trains the depths alone: every other parameter's gradient (the trunk, the
// embedding the depths read, the shared head) is the objective's alone, bit for bit, and each
// depth parameter's is pre-training's with model.mtp_loss_weight = w (whose whole objective
// MtpGradients.* check against finite differences), as are the depths' losses. An objective
// asking for none leaves the depths' gradients zero. Untied and tied heads.
TEST(TokenObjective, ADepthLossBesideItTrainsTheDepthsAlone) {
  for (const bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied head" : "untied head");
    config::ModelConfig c = small_model();
    c.mtp_depths = 2;
    c.mtp_loss_weight = 0.6;
    c.tied_embeddings = tied;
    const Data d = make_data(2 * 8, 37);
    std::vector<double> depth_losses;
    auto gradients = [&](TokenObjective* objective) {
      Transformer model(c);
      model.initialize(7);
      model.set_token_objective(objective);
      model.params().zero_grads();
      model.forward_backward(d.inputs.data(), d.targets.data(), 2, 8, 0.5f);
      depth_losses = model.last_mtp_loss_sums();
      std::map<std::string, std::vector<float>> out;
      for (const Parameter& p : model.params().list()) {
        out[p.name].assign(model.params().grads() + p.offset, model.params().grads() + p.offset + p.numel);
      }
      return out;
    };
    const auto pretraining = gradients(nullptr);
    const std::vector<double> pretraining_losses = depth_losses;
    SmoothWithDepths with(0.6), without(0.0);
    const auto alone = gradients(&without);
    const auto beside = gradients(&with);
    EXPECT_EQ(depth_losses, pretraining_losses);
    int depth_tensors = 0;
    for (const auto& [name, g] : beside) {
      if (name.rfind("mtp.layers.", 0) != 0) {
        EXPECT_EQ(g, alone.at(name)) << name;
        continue;
      }
      ++depth_tensors;
      EXPECT_EQ(g, pretraining.at(name)) << name;
      EXPECT_TRUE(std::any_of(g.begin(), g.end(), [](float v) { return v != 0.0f; })) << name;
      const std::vector<float>& none = alone.at(name);
      EXPECT_TRUE(std::all_of(none.begin(), none.end(), [](float v) { return v == 0.0f; })) << name;
    }
    EXPECT_GE(depth_tensors, 10);
  }
}

TEST(TokenObjective, VocabularyParallelHeadEqualsOneRank) {
  const config::ModelConfig c = small_model();
  const Data d = make_data(2 * 8, 37);
  Transformer one(c);
  one.initialize(5);
  SmoothObjective objective;
  one.set_token_objective(&objective);
  one.params().zero_grads();
  const double loss = one.forward_backward(d.inputs.data(), d.targets.data(), 2, 8, 0.5f);
  comm::LaunchOptions options;
  options.backend = "threads";
  options.ranks = 2;
  options.comm.timeout = std::chrono::seconds(30);
  std::mutex mutex;
  comm::launch(options, [&](comm::Communicator& world) {
    Transformer model(c, TensorParallel(&world, true));
    model.initialize(5);  // each rank's slices of the same full initialisation
    SmoothObjective mine;
    model.set_token_objective(&mine);
    model.params().zero_grads();
    const double tp_loss = model.forward_backward(d.inputs.data(), d.targets.data(), 2, 8, 0.5f);
    std::lock_guard<std::mutex> lock(mutex);
    EXPECT_NEAR(tp_loss, loss, 1e-5 * std::fabs(loss));
    // The head's gradient: this rank's vocabulary rows of one rank's.
    int compared = 0;
    for (const Parameter& p : model.params().list()) {
      if (p.name != "model.embed_tokens.weight" && p.name != "lm_head.weight") continue;
      ++compared;
      const Parameter& full = one.params().list().at(one.params().find(p.name));
      const int64_t first = p.shard.is_split() ? p.shard.start : 0;  // vocabulary rows
      const int64_t cols = p.shape.back();
      float scale = 1e-30f, diff = 0.0f;
      for (int64_t i = 0; i < shape_numel(p.shape); ++i) {
        const float a = model.params().grads()[p.offset + i];
        const float b = one.params().grads()[full.offset + first * cols + i];
        diff = std::max(diff, std::fabs(a - b));
        scale = std::max(scale, std::fabs(b));
      }
      EXPECT_LE(diff / scale, 1e-5) << p.name;
    }
    EXPECT_GE(compared, 1);
  });
}

}  // namespace
}  // namespace loom::model
