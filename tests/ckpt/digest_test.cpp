#include "loom/ckpt/digest.h"

#include <gtest/gtest.h>

#include "ckpt_test_util.h"
#include "loom/core/error.h"

namespace loom::ckpt {
namespace {

using nlohmann::json;
using test::HostTensor;
using test::TempDir;

std::vector<HostTensor> parameters() {
  return {HostTensor("model.embed_tokens.weight", {11, 4}, DType::F32, 1),
          HostTensor("model.norm.weight", {4}, DType::BF16, 2), HostTensor("lm_head.weight", {11, 4}, DType::F32, 3)};
}

TEST(ParameterDigest, IgnoresTensorOrderOptimizerStateAndSharding) {
  TempDir a, b, c;
  auto params = parameters();
  HostTensor m1("optim.exp_avg.model.norm.weight", {4}, DType::F32, 10);
  HostTensor m2("optim.exp_avg.model.norm.weight", {4}, DType::F32, 20);
  auto refs = test::refs_of(params);
  refs.push_back(m1.ref());
  save_checkpoint(a.str(), 5, refs, {{"step", 5}}, "a: 1\n", 0);

  std::vector<TensorRef> reordered = {m2.ref()};
  for (auto it = params.rbegin(); it != params.rend(); ++it) reordered.push_back(it->ref());
  save_checkpoint(b.str(), 9, reordered, {{"step", 9}}, "b: 2\n", 0);

  // The embedding split by rows into two shards, as two tensor-parallel ranks would hold it.
  const HostTensor& emb = params[0];
  std::vector<TensorRef> sharded = {params[1].ref(), params[2].ref()};
  sharded.push_back({emb.name, emb.shape, emb.dtype, emb.bytes.data(), {{0, 6}, {0, 4}}});
  sharded.push_back({emb.name, emb.shape, emb.dtype, emb.bytes.data() + 6 * 4 * 4, {{6, 5}, {0, 4}}});
  save_checkpoint(c.str(), 5, sharded, json::object(), "", 0);

  std::string digest = parameter_digest(a.str());
  EXPECT_EQ(digest.size(), 32u);
  EXPECT_EQ(digest, parameter_digest(b.str()));
  EXPECT_EQ(digest, parameter_digest(c.str()));
  EXPECT_EQ(digest, parameter_digest(a / "step-00000005"));
  EXPECT_EQ(digest, parameter_digest(load_checkpoint(a.str())));
}

TEST(ParameterDigest, ChangesWithAnyParameterByteNameOrShape) {
  TempDir base_dir, byte_dir, name_dir, shape_dir;
  auto params = parameters();
  save_checkpoint(base_dir.str(), 1, test::refs_of(params), json::object(), "", 0);
  std::string base = parameter_digest(base_dir.str());

  auto changed = parameters();
  changed[1].bytes[3] ^= std::byte{1};
  save_checkpoint(byte_dir.str(), 1, test::refs_of(changed), json::object(), "", 0);
  EXPECT_NE(base, parameter_digest(byte_dir.str()));

  auto renamed = parameters();
  renamed[2].name = "model.lm_head.weight";
  save_checkpoint(name_dir.str(), 1, test::refs_of(renamed), json::object(), "", 0);
  EXPECT_NE(base, parameter_digest(name_dir.str()));

  auto reshaped = parameters();
  reshaped[0].shape = {4, 11};  // same bytes, other shape
  save_checkpoint(shape_dir.str(), 1, test::refs_of(reshaped), json::object(), "", 0);
  EXPECT_NE(base, parameter_digest(shape_dir.str()));
}

// The digest of shards held in memory (a serving engine's ranks) equals the checkpoint's; a
// changed byte changes it; shards that leave a gap or overlap are errors naming the tensor.
TEST(ParameterDigest, OfShardsInMemoryEqualsTheCheckpoints) {
  TempDir dir;
  auto params = parameters();
  HostTensor moment("optim.exp_avg.model.norm.weight", {4}, DType::F32, 10);
  auto refs = test::refs_of(params);
  refs.push_back(moment.ref());
  save_checkpoint(dir.str(), 1, refs, json::object(), "", 0);
  const HostTensor& emb = params[0];
  auto shard = [&](int64_t first, int64_t rows) {
    return TensorRef{emb.name, emb.shape, emb.dtype, emb.bytes.data() + first * 4 * 4, {{first, rows}, {0, 4}}};
  };
  std::vector<TensorRef> held = {params[1].ref(), moment.ref(), shard(6, 5), params[2].ref(), shard(0, 6)};
  EXPECT_EQ(parameter_digest(held), parameter_digest(dir.str()));

  auto changed = parameters();
  changed[2].bytes[7] ^= std::byte{1};
  EXPECT_NE(parameter_digest(test::refs_of(changed)), parameter_digest(dir.str()));

  auto error_of = [](const std::vector<TensorRef>& shards) -> std::string {
    try {
      parameter_digest(shards);
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  const std::string gap = error_of({params[1].ref(), params[2].ref(), shard(0, 6)});
  EXPECT_NE(gap.find("model.embed_tokens.weight cover 24 of its 44 elements"), std::string::npos) << gap;
  const std::string overlap = error_of({params[1].ref(), params[2].ref(), shard(0, 6), shard(5, 6)});
  EXPECT_NE(overlap.find("two shards of model.embed_tokens.weight overlap"), std::string::npos) << overlap;
}

}  // namespace
}  // namespace loom::ckpt
