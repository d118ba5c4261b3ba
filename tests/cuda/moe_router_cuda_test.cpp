// The MoE router's forward and backward on the GPU (kernels::moe_router_forward /
// moe_router_backward) against the CPU's (kernels/cpu/moe_router.h), per METHOD: fresh random
// inputs, the outputs poisoned first (written whole), every element checked, for each router kind
// over widths that fill a block unevenly: the selections exactly, the rest within 1e-5 of the CPU
// (expf against the CPU's exp; each sum in double in another order).
// Without a usable GPU the tests skip, saying why.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "loom/core/error.h"
#include "loom/kernels/cpu/moe_router.h"
#include "loom/kernels/cuda/moe_router.h"
#include "cuda_test_util.h"

namespace loom::kernels::cuda {
namespace {

using testing::DeviceArray;
using testing::DeviceFloats;
using testing::random_values;
using testing::relative_error;

using CudaMoeRouter = testing::GpuTest<>;

struct RouterCase {
  RouterKind kind;
  int experts, top_k;
  int64_t tokens, group_tokens;
};

// Each router over widths that fill a block unevenly, groups of tokens, and past 65536 tokens
// (the grid's stride).
std::vector<RouterCase> router_cases() {
  return {{RouterKind::TopkSoftmax, 8, 2, 300, 100},
          {RouterKind::SoftmaxTopk, 160, 6, 257, 257},
          {RouterKind::Sigmoid, 512, 22, 200, 50},
          {RouterKind::TopkSoftmax, 512, 22, 129, 129},
          {RouterKind::Sigmoid, 8, 2, 70001, 70001}};
}

// The case's shape, its weights scaled by 2.5.
RouterShape shape_of(const RouterCase& c) { return {c.kind, c.experts, c.top_k, 2.5f, c.tokens}; }

std::string kind_name(RouterKind kind) {
  return kind == RouterKind::TopkSoftmax ? "topk_softmax" : kind == RouterKind::SoftmaxTopk ? "softmax_topk" : "sigmoid";
}

TEST_F(CudaMoeRouter, BackwardEqualsTheCpuForEveryRouter) {
  uint32_t seed = seed_;
  for (const RouterCase& c : router_cases()) {
    const int E = c.experts, k = c.top_k;
    const int64_t T = c.tokens, groups = T / c.group_tokens, R = T * k;
    const std::string name = kind_name(c.kind) + " " + std::to_string(k) + " of " + std::to_string(E) + " over " +
                             std::to_string(T);
    std::mt19937 rng(++seed);
    const std::vector<float> logits = random_values(++seed, T * E, 3.0f);
    // k distinct experts per token, their weights, and a dispatched row per selection (every
    // ninth dropped) with the loss's gradient of each row.
    std::vector<int32_t> expert(static_cast<size_t>(R)), selection_row(static_cast<size_t>(R));
    std::vector<int32_t> all(static_cast<size_t>(E));
    std::iota(all.begin(), all.end(), 0);
    for (int64_t t = 0; t < T; ++t) {
      std::shuffle(all.begin(), all.end(), rng);
      std::copy(all.begin(), all.begin() + k, expert.begin() + t * k);
    }
    std::vector<float> weight = random_values(++seed, R, 1.0f);
    for (float& w : weight) w = std::fabs(w) + 0.05f;
    for (int64_t s = 0; s < R; ++s) selection_row[static_cast<size_t>(s)] = s % 9 == 4 ? -1 : static_cast<int32_t>(s);
    std::vector<double> row_grad(static_cast<size_t>(R));
    for (double& g : row_grad) g = std::uniform_real_distribution<double>(-1.0, 1.0)(rng);
    std::vector<float> aux_f = random_values(++seed, groups * E, 4.0f);
    for (float& f : aux_f) f = std::round(std::fabs(f));
    std::vector<double> aux_factor(static_cast<size_t>(groups));
    for (double& f : aux_factor) f = std::uniform_real_distribution<double>(1e-3, 1e-2)(rng);

    RouterBackward cpu_r;
    static_cast<RouterShape&>(cpu_r) = shape_of(c);
    cpu_r.group_tokens = c.group_tokens;
    cpu_r.z_loss_coeff = 1e-3;
    cpu_r.aux_scale = 0.5f;
    cpu_r.first = T / 5;  // the losses' rows: this rank's share under sequence parallelism
    cpu_r.end = T - T / 7;
    RouterBackward gpu_r = cpu_r;
    cpu_r.logits = logits.data();
    cpu_r.expert = expert.data();
    cpu_r.weight = weight.data();
    cpu_r.selection_row = selection_row.data();
    cpu_r.row_grad = row_grad.data();
    cpu_r.aux_f = aux_f.data();
    cpu_r.aux_factor = aux_factor.data();
    std::vector<float> want(static_cast<size_t>(T * E));
    cpu::moe_router_backward(want.data(), cpu_r);

    DeviceFloats d_logits(allocator_, logits), d_weight(allocator_, weight), d_aux_f(allocator_, aux_f);
    DeviceArray<int32_t> d_expert(allocator_, expert), d_selection(allocator_, selection_row);
    DeviceArray<double> d_row_grad(allocator_, row_grad), d_aux_factor(allocator_, aux_factor);
    gpu_r.logits = d_logits.ptr;
    gpu_r.expert = d_expert.ptr;
    gpu_r.weight = d_weight.ptr;
    gpu_r.selection_row = d_selection.ptr;
    gpu_r.row_grad = d_row_grad.ptr;
    gpu_r.aux_f = d_aux_f.ptr;
    gpu_r.aux_factor = d_aux_factor.ptr;
    DeviceFloats got(allocator_, std::vector<float>(want.size(), NAN));
    moe_router_backward(got.ptr, gpu_r);
    EXPECT_LE(relative_error(got.host(), want), 1e-5) << name;
    // Without the losses (no balancing loss, no z-loss): the weights' gradient alone.
    RouterBackward plain_cpu = cpu_r, plain_gpu = gpu_r;
    plain_cpu.aux_f = plain_gpu.aux_f = nullptr;
    plain_cpu.z_loss_coeff = plain_gpu.z_loss_coeff = 0.0;
    cpu::moe_router_backward(want.data(), plain_cpu);
    DeviceFloats plain(allocator_, std::vector<float>(want.size(), NAN));
    moe_router_backward(plain.ptr, plain_gpu);
    EXPECT_LE(relative_error(plain.host(), want), 1e-5) << name << " without losses";
  }
}

// Logits on a grid of distinct values (spacing 6 / E, shuffled per token), so no two experts' scores
// are near enough for expf against the CPU's exp to swap them: the selections must be the CPU's
// exactly, the weights, log-sum-exps and the groups' score sums within rounding.
TEST_F(CudaMoeRouter, ForwardSelectsAsTheCpuForEveryRouter) {
  uint32_t seed = seed_;
  for (const RouterCase& c : router_cases()) {
    for (const bool with_bias : {false, true}) {
      if (with_bias && c.kind != RouterKind::TopkSoftmax) continue;  // selected on logits + bias: still apart
      const int E = c.experts, k = c.top_k;
      const int64_t T = c.tokens, groups = T / c.group_tokens;
      const std::string name = kind_name(c.kind) + " " + std::to_string(k) + " of " + std::to_string(E) +
                               " over " + std::to_string(T) + (with_bias ? " with a bias" : "");
      std::mt19937 rng(++seed);
      std::vector<float> logits(static_cast<size_t>(T * E));
      std::vector<int> order(static_cast<size_t>(E));
      std::iota(order.begin(), order.end(), 0);
      for (int64_t t = 0; t < T; ++t) {
        std::shuffle(order.begin(), order.end(), rng);
        for (int e = 0; e < E; ++e) logits[static_cast<size_t>(t * E + e)] = (order[e] - E / 2) * 6.0f / E;
      }
      std::vector<float> bias(static_cast<size_t>(E));
      for (int e = 0; e < E; ++e) bias[static_cast<size_t>(e)] = 0.5f * 6.0f / E * static_cast<float>(e % 2) / 2.0f;
      RouterForward cpu_r;
      static_cast<RouterShape&>(cpu_r) = shape_of(c);
      cpu_r.group_tokens = c.group_tokens;
      RouterForward gpu_r = cpu_r;
      std::vector<int32_t> want_expert(static_cast<size_t>(T * k));
      std::vector<float> want_weight(want_expert.size());
      std::vector<double> want_lse(static_cast<size_t>(T)), want_probs(static_cast<size_t>(groups * E));
      cpu_r.logits = logits.data();
      cpu_r.bias = with_bias ? bias.data() : nullptr;
      cpu_r.expert = want_expert.data();
      cpu_r.weight = want_weight.data();
      cpu_r.lse = want_lse.data();
      cpu_r.prob_sums = want_probs.data();
      cpu::moe_router_forward(cpu_r);

      DeviceFloats d_logits(allocator_, logits), d_bias(allocator_, bias);
      DeviceFloats weight(allocator_, std::vector<float>(want_weight.size(), NAN));
      DeviceArray<int32_t> expert(allocator_, std::vector<int32_t>(want_expert.size(), -7));
      DeviceArray<double> lse(allocator_, std::vector<double>(want_lse.size(), NAN)),
          probs(allocator_, std::vector<double>(want_probs.size(), NAN));
      gpu_r.logits = d_logits.ptr;
      gpu_r.bias = with_bias ? d_bias.ptr : nullptr;
      gpu_r.expert = expert.ptr;
      gpu_r.weight = weight.ptr;
      gpu_r.lse = lse.ptr;
      gpu_r.prob_sums = probs.ptr;
      moe_router_forward(gpu_r);
      EXPECT_EQ(expert.host(), want_expert) << name;
      EXPECT_LE(relative_error(weight.host(), want_weight), 1e-6) << name;
      EXPECT_LE(relative_error(lse.host(), want_lse), 1e-6) << name;
      EXPECT_LE(relative_error(probs.host(), want_probs), 1e-6) << name;
    }
  }
}

// A gated shared expert's gate from its logits (exp in double: within 1e-7 of the CPU's), and its
// logits' gradient (two float products, no sum: the CPU's bits), past one grid's rows.
TEST_F(CudaMoeRouter, SharedExpertGateEqualsTheCpu) {
  const int64_t n = 70001;
  std::mt19937 rng(seed_);
  std::vector<double> logits(static_cast<size_t>(n)), dots(static_cast<size_t>(n));
  for (double& v : logits) v = std::uniform_real_distribution<double>(-8.0, 8.0)(rng);
  for (double& v : dots) v = std::uniform_real_distribution<double>(-2.0, 2.0)(rng);
  std::vector<float> want_gate(static_cast<size_t>(n)), want_grad(static_cast<size_t>(n));
  cpu::sigmoid_gate(want_gate.data(), logits.data(), n);
  cpu::sigmoid_gate_backward(want_grad.data(), dots.data(), want_gate.data(), n);
  DeviceArray<double> d_logits(allocator_, logits), d_dots(allocator_, dots);
  DeviceFloats gate(allocator_, std::vector<float>(want_gate.size(), NAN)), gate_in(allocator_, want_gate);
  DeviceFloats grad(allocator_, std::vector<float>(want_grad.size(), NAN));
  sigmoid_gate(gate.ptr, d_logits.ptr, n);
  sigmoid_gate_backward(grad.ptr, d_dots.ptr, gate_in.ptr, n);
  EXPECT_LE(relative_error(gate.host(), want_gate), 1e-7);
  EXPECT_EQ(grad.host(), want_grad);
}

TEST_F(CudaMoeRouter, TooManyExpertsForABlockIsAClearError) {
  RouterBackward r;
  r.experts = 6000;
  r.top_k = 2;
  r.tokens = 1;
  try {
    moe_router_backward(nullptr, r);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.moe_experts 6000"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace loom::kernels::cuda
