// ParameterStore's registry (an index by name): ids in registration order, found by name, a
// repeated name refused naming it and leaving the store as it was, and a model of many experts
// (tens of thousands of parameters) registered and found.
#include <gtest/gtest.h>

#include <string>

#include "loom/core/error.h"
#include "loom/model/parameters.h"

namespace loom::model {
namespace {

TEST(ParameterStore, FindsEachParameterByNameAndRefusesARepeatedOne) {
  ParameterStore store(Device::cpu(), ParameterStore::Allocation::ShapesOnly);
  const int a = store.add("model.layers.0.weight", {4, 3}, Init::Normal, 0.02f);
  const int b = store.add("model.layers.0.bias", {4}, Init::Zeros, 0.0f);
  EXPECT_EQ(a, 0);
  EXPECT_EQ(b, 1);
  EXPECT_EQ(store.find("model.layers.0.weight"), a);
  EXPECT_EQ(store.find("model.layers.0.bias"), b);
  EXPECT_EQ(store.find("model.layers.1.weight"), -1);
  try {
    store.add("model.layers.0.weight", {2}, Init::Zeros, 0.0f);
    FAIL() << "a repeated name was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("duplicate parameter name 'model.layers.0.weight'"), std::string::npos) << e.what();
  }
  // The refused name left the store as it was.
  EXPECT_EQ(store.list().size(), 2u);
  EXPECT_EQ(store.total(), 16);
  EXPECT_EQ(store.find("model.layers.0.weight"), a);
}

TEST(ParameterStore, ManyParametersRegisterAndAreFoundByName) {
  ParameterStore store(Device::cpu(), ParameterStore::Allocation::ShapesOnly);
  constexpr int kExperts = 40 * 512;  // a Nemotron 3 Super's routed experts, two tensors each
  for (int e = 0; e < kExperts; ++e) {
    store.add("experts." + std::to_string(e) + ".up", {8, 4}, Init::Normal, 0.02f);
    store.add("experts." + std::to_string(e) + ".down", {4, 8}, Init::Normal, 0.02f);
  }
  for (int e = 0; e < kExperts; e += 997) EXPECT_EQ(store.find("experts." + std::to_string(e) + ".down"), 2 * e + 1);
  EXPECT_EQ(store.total(), int64_t{kExperts} * 64);
}

}  // namespace
}  // namespace loom::model
