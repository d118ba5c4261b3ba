// Mesh layouts against hand-checked Megatron-Core groups, layout errors, and the Mesh on the
// threads backend (8 ranks, 2x2x2): every group's members and a collective on each kind.
#include "loom/comm/mesh.h"

#include <gtest/gtest.h>

#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "loom/comm/launch.h"
#include "loom/core/error.h"

namespace loom::comm {
namespace {

using Groups = std::vector<std::vector<int>>;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

#define EXPECT_HAS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

// Every rank in exactly one group of a kind (embedding aside).
void expect_partition(const Groups& groups, int world) {
  std::vector<int> seen(world, 0);
  for (const auto& g : groups)
    for (int r : g) ++seen.at(r);
  for (int r = 0; r < world; ++r) EXPECT_EQ(seen[r], 1) << "rank " << r;
}

// World 16, tp 2, pp 2, dp 4 (cp 1). Worked by hand from Megatron-Core's RankGenerator with
// order "tp-cp-ep-dp-pp": rank = tp + 2 * dp + 8 * pp (cp and ep have size 1).
TEST(MeshLayout, MegatronWorld16Tp2Pp2Dp4) {
  MeshLayout l = make_mesh_layout(16, {.tp = 2, .pp = 2});
  EXPECT_EQ(l.shape.dp, 4);
  EXPECT_EQ(l.groups["tp"], (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  // dp groups: same tp and pp, dp = 0..3; listed by tp fastest, then pp.
  EXPECT_EQ(l.groups["dp"], (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  EXPECT_EQ(l.groups["pp"], (Groups{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}}));
  EXPECT_EQ(l.groups["dp_cp"], l.groups["dp"]);
  EXPECT_EQ(l.groups["cp"].size(), 16u);
  EXPECT_EQ(l.groups["cp"][5], (std::vector<int>{5}));
  EXPECT_EQ(l.groups["embedding"], l.groups["pp"]);  // two stages: first and last are the whole pipeline
  // ep 1: every expert group is a single rank and expert-dp is the stage's tp x dp ranks.
  EXPECT_EQ(l.groups["ep"].size(), 16u);
  EXPECT_EQ(l.groups["expert_dp"], (Groups{{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15}}));
}

// The same world with ep 2 and ep 8. Megatron-Core's expert generator with
// expert_tensor_parallel_size 1 (MoE parallel folding): the expert factorisation is
// ep x expert-dp x pp over the same ranks, rank = ep + ep_size * edp + 8 * pp, so ep takes the
// tensor-parallel ranks first.
TEST(MeshLayout, MegatronWorld16Tp2Pp2Dp4Ep2) {
  MeshLayout l = make_mesh_layout(16, {.tp = 2, .ep = 2, .dp = 4, .pp = 2});
  EXPECT_EQ(l.expert_dp, 4);
  EXPECT_EQ(l.groups["ep"], l.groups["tp"]);  // ep 2 folded onto the tp 2 ranks
  EXPECT_EQ(l.groups["expert_dp"], (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  // Dense groups do not change with ep, and both factorisations share the pipelines.
  EXPECT_EQ(l.groups["dp"], (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  EXPECT_EQ(mesh_rank_groups(l, "pp", true), l.groups["pp"]);
  // Expert tp is 1: its groups are single ranks, and tp-ep is ep.
  EXPECT_EQ(mesh_rank_groups(l, "tp", true).size(), 16u);
  EXPECT_EQ(mesh_rank_groups(l, "tp-ep", true), l.groups["ep"]);
  MeshCoord c = mesh_coord(l, 13);  // 13 = 1 + 2*2 + 8*1 dense; = 1 + 2*2 + 8*1 expert
  EXPECT_EQ(c.tp, 1);
  EXPECT_EQ(c.dp, 2);
  EXPECT_EQ(c.pp, 1);
  EXPECT_EQ(c.ep, 1);
  EXPECT_EQ(c.expert_dp, 2);

  // ep 8 spans a whole stage: the tp pairs and the dp replicas together.
  MeshLayout all = make_mesh_layout(16, {.tp = 2, .ep = 8, .pp = 2});
  EXPECT_EQ(all.expert_dp, 1);
  EXPECT_EQ(all.groups["ep"], (Groups{{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15}}));
  EXPECT_EQ(mesh_coord(all, 13).ep, 5);
  // ep 4 with tp 2: two tp pairs per expert group; expert-dp joins ranks four apart.
  MeshLayout four = make_mesh_layout(16, {.tp = 2, .ep = 4, .pp = 2});
  EXPECT_EQ(four.groups["ep"], (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}}));
  EXPECT_EQ(four.groups["expert_dp"], (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}));
}

// World 16 = tp 2 x cp 2 x dp 2 x pp 2: rank = tp + 2 cp + 4 dp + 8 pp. Within a dp-cp group cp
// varies fastest (the mesh order, not the order the axes are named in).
TEST(MeshLayout, MegatronContextParallel) {
  MeshLayout l = make_mesh_layout(16, {.tp = 2, .cp = 2, .ep = 2, .pp = 2});
  EXPECT_EQ(l.groups["cp"], (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(l.groups["dp"], (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}));
  EXPECT_EQ(l.groups["dp_cp"], (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  EXPECT_EQ(mesh_rank_groups(l, "cp-dp"), l.groups["dp_cp"]);
  // ep 2 carved out of tp x cp x dp = 8: expert-dp 4; the expert groups take the tp positions
  // and expert-dp the cp and dp ones.
  EXPECT_EQ(l.expert_dp, 4);
  EXPECT_EQ(l.groups["ep"], l.groups["tp"]);
  EXPECT_EQ(l.groups["expert_dp"], l.groups["dp_cp"]);
}

TEST(MeshLayout, EmbeddingIsFirstAndLastStage) {
  MeshLayout l = make_mesh_layout(8, {.tp = 2, .pp = 4});
  EXPECT_EQ(l.groups["pp"], (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(l.groups["embedding"], (Groups{{0, 6}, {1, 7}}));
  MeshLayout single = make_mesh_layout(4, {.tp = 2});
  EXPECT_EQ(single.groups["embedding"], (Groups{{0}, {1}, {2}, {3}}));
}

TEST(MeshLayout, EveryKindPartitionsTheWorld) {
  for (MeshShape shape : {MeshShape{.tp = 2, .cp = 2, .ep = 4, .pp = 3}, MeshShape{.tp = 1, .cp = 3, .ep = 2},
                          MeshShape{.tp = 4, .ep = 2, .dp = 2}}) {
    const int world = shape.tp * shape.cp * shape.pp * (shape.dp ? shape.dp : 2);
    MeshLayout l = make_mesh_layout(world, shape);
    for (const std::string& kind : mesh_group_kinds()) {
      SCOPED_TRACE(kind);
      if (kind != "embedding") expect_partition(l.groups[kind], world);
    }
    for (int r = 0; r < world; ++r) {
      MeshCoord c = mesh_coord(l, r);
      EXPECT_EQ(l.groups["tp"][r / l.shape.tp][c.tp], r);
      EXPECT_EQ(l.groups["ep"].size() * l.shape.ep, static_cast<size_t>(world));
    }
  }
}

TEST(MeshLayout, Errors) {
  std::string msg = error_of([] { make_mesh_layout(12, {.tp = 2, .pp = 8}); });
  EXPECT_HAS(msg, "world size 12 is not divisible by tp * cp * pp = 2 * 1 * 8 = 16");
  msg = error_of([] { make_mesh_layout(16, {.tp = 2, .dp = 3, .pp = 2}); });
  EXPECT_HAS(msg, "= 12 but the world has 16 ranks; use dp 4 or 0 (auto)");
  msg = error_of([] { make_mesh_layout(16, {.tp = 2, .ep = 3, .pp = 2}); });
  EXPECT_HAS(msg, "ep 3 does not divide tp * cp * dp = 2 * 1 * 4 = 8");
  EXPECT_HAS(error_of([] { make_mesh_layout(8, {.tp = 0}); }), "must be >= 1");
  MeshLayout l = make_mesh_layout(8, {.tp = 2});
  EXPECT_HAS(error_of([&] { mesh_rank_groups(l, "tp-xp"); }),
             "unknown axis 'xp' in 'tp-xp'; valid axes: tp, cp, dp, pp");
  EXPECT_HAS(error_of([&] { mesh_rank_groups(l, "cp", true); }), "valid axes: tp, ep, dp, pp");
}

TEST(MeshLayout, Describe) {
  std::string text = describe_mesh(make_mesh_layout(8, {.tp = 2, .pp = 2}));
  EXPECT_HAS(text, "mesh: world 8 = tp 2 x cp 1 x dp 2 x pp 2");
  EXPECT_HAS(text, "tp groups (4 of 2): [0 1] [2 3] [4 5] [6 7]\n");
  EXPECT_HAS(text, "dp groups (4 of 2): [0 2] [1 3] [4 6] [5 7]\n");
  EXPECT_HAS(text, "pp groups (4 of 2): [0 4] [1 5] [2 6] [3 7]\n");
  EXPECT_HAS(text, "embedding groups (4 of 2): [0 4] [1 5] [2 6] [3 7]\n");
}

// 8 ranks as threads, tp 2 x dp 2 x pp 2: every group's members come out as the layout says and
// a collective on each kind reduces over exactly those members.
TEST(Mesh, ThreadsBackend2x2x2) {
  LaunchOptions options;
  options.ranks = 8;
  options.comm.timeout = std::chrono::seconds(20);
  launch(options, [](Communicator& world) {
    Mesh mesh(world, {.tp = 2, .ep = 2, .pp = 2});
    const MeshLayout& l = mesh.layout();
    const int me = world.rank();
    EXPECT_EQ(mesh.tp_rank(), me % 2);
    EXPECT_EQ(mesh.dp_rank(), me / 2 % 2);
    EXPECT_EQ(mesh.pp_rank(), me / 4);
    EXPECT_EQ(mesh.ep_rank(), me % 2);  // ep folded onto the tp pair
    EXPECT_EQ(mesh.expert_dp_rank(), me / 2 % 2);
    for (const std::string& kind : mesh_group_kinds()) {
      Communicator& g = mesh.group(kind);
      // The group holding this rank in the layout, in group-rank order.
      std::vector<int> expected;
      for (const auto& members : l.groups.at(kind))
        if (std::find(members.begin(), members.end(), me) != members.end()) expected = members;
      EXPECT_EQ(g.world_ranks(), expected) << kind << " on rank " << me;
      EXPECT_EQ(g.size(), static_cast<int>(expected.size()));
      EXPECT_EQ(g.world_ranks()[g.rank()], me);
      // Sum of world ranks over the group: proves the collective runs over these members.
      float value = static_cast<float>(me);
      g.all_reduce(&value, 1, DType::F32, ReduceOp::Sum);
      EXPECT_EQ(value, static_cast<float>(std::accumulate(expected.begin(), expected.end(), 0))) << kind;
    }
    EXPECT_NE(mesh.embedding(), nullptr);
    // Another group on demand: tp x pp (Megatron's model-parallel group).
    Communicator& mp = mesh.add_group("tp-pp");
    EXPECT_EQ(mp.size(), 4);
    EXPECT_EQ(mp.world_ranks(),
              (std::vector<int>{me % 4 / 2 * 2, me % 4 / 2 * 2 + 1, me % 4 / 2 * 2 + 4, me % 4 / 2 * 2 + 5}));
    EXPECT_EQ(&mesh.add_group("tp-pp"), &mp);
    // Point to point inside a pp group: stage 0 sends to stage 1.
    float token = 0;
    if (mesh.pp_rank() == 0) {
      token = static_cast<float>(me) + 0.5f;
      mesh.pp().send(&token, 1, DType::F32, 1, 7);
    } else {
      mesh.pp().recv(&token, 1, DType::F32, 0, 7);
      EXPECT_EQ(token, static_cast<float>(me - 4) + 0.5f);
    }
  });
}

TEST(Mesh, MiddleStagesHaveNoEmbeddingGroup) {
  LaunchOptions options;
  options.ranks = 4;
  options.comm.timeout = std::chrono::seconds(20);
  launch(options, [](Communicator& world) {
    Mesh mesh(world, {.pp = 4});
    const bool end_stage = world.rank() == 0 || world.rank() == 3;
    ASSERT_EQ(mesh.embedding() != nullptr, end_stage);
    if (end_stage)
      EXPECT_EQ(mesh.embedding()->world_ranks(), (std::vector<int>{0, 3}));
    else
      EXPECT_HAS(error_of([&] { mesh.group("embedding"); }), "middle pipeline stage");
  });
}

}  // namespace
}  // namespace loom::comm
