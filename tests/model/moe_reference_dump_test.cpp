// One MoE layer's forward and backward written out for the PyTorch reference
// (tests/scripts/moe_torch_reference.sh runs this with LOOM_MOE_REFERENCE_DIR and compares):
// the input, the output gradient, every parameter, the expert bias, and what loom computes from
// them: the output, the routing, the balancing losses, the input gradient and every parameter's
// gradient. One case per router; without the variable the files go to a temporary folder.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../gradient_check.h"
#include "loom/model/moe_layer.h"

namespace loom::model {
namespace {

std::filesystem::path dump_root() {
  const char* dir = std::getenv("LOOM_MOE_REFERENCE_DIR");
  return dir != nullptr ? std::filesystem::path(dir) : std::filesystem::path(::testing::TempDir()) / "moe_reference";
}

class Dump {
 public:
  explicit Dump(const std::filesystem::path& dir) : dir_(dir) {
    std::filesystem::create_directories(dir);
    meta_.open(dir / "meta.txt");
  }
  void value(const std::string& key, double v) { meta_ << "value " << key << " " << v << "\n"; }
  template <typename T>
  void array(const std::string& name, const T* data, int64_t n) {
    std::ofstream out(dir_ / (name + ".bin"), std::ios::binary);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(n * sizeof(T)));
    meta_ << "array " << name << " " << n << "\n";
    ASSERT_TRUE(out.good()) << name;
  }

 private:
  std::filesystem::path dir_;
  std::ofstream meta_;
};

void dump_case(const std::string& name, const config::ModelConfig& config, int64_t batch, int64_t seq) {
  ParameterStore store;
  TensorParallel tp;
  MoeLayer layer(store, tp, {}, 0, "model.layers.0.mlp", config, config.ffn_size, 0.3f, 0.2f);
  store.allocate();
  store.initialize(11);
  for (int e = 0; e < config.moe.experts; ++e) layer.expert_bias()[e] = config.moe.expert_bias ? 0.03f * (e % 4) : 0.0f;
  const float aux_scale = 0.75f;
  layer.set_aux_scale(aux_scale);
  const int64_t rows = batch * seq, n = rows * config.d_model;
  const auto x = loom::testing::random_vector(n, 31), dy = loom::testing::random_vector(n, 32);
  std::vector<float> y(n, 0.0f), dx(n, 0.0f);
  MoeLayer::Saved saved;
  Workspace work;
  ParallelScratch scratch;
  layer.forward(saved, y.data(), x.data(), batch, seq, scratch);
  store.zero_grads();
  layer.backward(dx.data(), dy.data(), x.data(), saved, work, batch, seq, scratch);

  Dump d(dump_root() / name);
  d.value("router", static_cast<int>(config.moe.router));
  d.value("aux_per_sequence", config.moe.aux_loss == config::MoeAuxLoss::Sequence ? 1 : 0);
  d.value("batch", static_cast<double>(batch));
  d.value("seq", static_cast<double>(seq));
  d.value("d_model", config.d_model);
  d.value("experts", config.moe.experts);
  d.value("top_k", config.moe.top_k);
  d.value("ffn", config.moe.ffn_size);
  d.value("aux_coeff", config.moe.aux_loss_coeff);
  d.value("z_coeff", config.moe.z_loss_coeff);
  d.value("scaling", config.moe.topk_scaling);
  d.value("aux_scale", aux_scale);
  d.value("aux_loss", saved.routing.aux_loss);
  d.value("z_loss", saved.routing.z_loss);
  d.array("x", x.data(), n);
  d.array("dy", dy.data(), n);
  d.array("y", y.data(), n);
  d.array("dx", dx.data(), n);
  d.array("expert_bias", layer.expert_bias().data(), config.moe.experts);
  d.array("selected", saved.routing.expert.data(), static_cast<int64_t>(saved.routing.expert.size()));
  for (const Parameter& p : store.list()) {
    d.array("value." + p.name, store.values() + p.offset, p.numel);
    d.array("grad." + p.name, store.grads() + p.offset, p.numel);
  }
}

config::ModelConfig reference_model(config::MoeRouter router) {
  config::ModelConfig c;
  c.d_model = 16;
  c.heads = 2;
  c.ffn_size = 12;
  c.moe.experts = 8;
  c.moe.top_k = 2;
  c.moe.ffn_size = 12;
  c.moe.router = router;
  c.moe.aux_loss_coeff = 0.3;
  return c;
}

TEST(MoeReferenceDump, EveryRouterWithItsLosses) {
  auto topk = reference_model(config::MoeRouter::TopkSoftmax);
  topk.moe.z_loss_coeff = 0.05;
  dump_case("topk_softmax", topk, 2, 12);
  auto softmax = reference_model(config::MoeRouter::SoftmaxTopk);
  softmax.moe.aux_loss = config::MoeAuxLoss::Sequence;
  softmax.moe.topk_scaling = 1.5;
  dump_case("softmax_topk", softmax, 3, 8);
  auto sigmoid = reference_model(config::MoeRouter::Sigmoid);
  sigmoid.moe.expert_bias = true;
  sigmoid.moe.topk_scaling = 2.5;
  sigmoid.moe.z_loss_coeff = 0.05;
  dump_case("sigmoid", sigmoid, 2, 12);
  EXPECT_TRUE(std::filesystem::exists(dump_root() / "sigmoid" / "meta.txt"));
}

}  // namespace
}  // namespace loom::model
