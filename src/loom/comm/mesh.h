#pragma once
// The device mesh: world = pp x dp x cp x tp in Megatron-Core's rank order "tp-cp-ep-dp-pp"
// (tp varies fastest, pp slowest; ep is 1 for the dense groups). It gives every rank its
// coordinates and the process groups Megatron-Core users know. Expert parallelism is carved out
// of a stage's tp x cp x dp ranks as Megatron's expert rank generator does with
// expert_tensor_parallel_size 1 (MoE parallel folding): a second factorisation of the same ranks
// in the order "tp-ep-dp-pp" with expert tp = 1, ep dividing tp * cp * dp, and expert-dp =
// tp * cp * dp / ep. ep therefore takes the tensor-parallel ranks first: tp 8 with ep 8 puts a
// node's eight GPUs' experts on its fast links. Both factorisations share the pp groups, so a
// pipeline stage holds the same layers in both.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "loom/comm/communicator.h"

namespace loom::comm {

struct MeshShape {
  int tp = 1, cp = 1, ep = 1, dp = 0, pp = 1;  // dp 0 = auto: world / (tp * cp * pp)
};

// Pure description of a mesh for a world size: no communication. Used by Mesh and `loom mesh`.
struct MeshLayout {
  int world_size = 0;
  MeshShape shape;    // dp resolved
  int expert_dp = 0;  // tp * cp * dp / ep
  // Group kind ("tp", "cp", "dp", "pp", "dp_cp", "ep", "expert_dp", "embedding") -> the groups,
  // each a list of world ranks in group-rank order.
  std::map<std::string, std::vector<std::vector<int>>> groups;
};

// The group kinds of a layout in the order describe_mesh prints them.
const std::vector<std::string>& mesh_group_kinds();

// Throws loom::Error naming the sizes when world_size is not divisible as asked.
MeshLayout make_mesh_layout(int world_size, MeshShape shape);
// Human-readable table of every group (what `loom mesh` prints).
std::string describe_mesh(const MeshLayout& layout);

// Megatron-Core's RankGenerator::get_ranks: the groups spanning the axes named in `axes`
// ("tp", "dp-cp", "tp-pp", ...; any order, the mesh order decides the rank order inside a
// group). Dense axes: tp, cp, dp, pp. With expert = true the expert factorisation: tp (size 1),
// ep, dp (expert-dp), pp. Groups are listed by the mixed-radix index of the remaining axes.
std::vector<std::vector<int>> mesh_rank_groups(const MeshLayout& layout, const std::string& axes, bool expert = false);

// One world rank's position on every axis of both factorisations.
struct MeshCoord {
  int tp = 0, cp = 0, dp = 0, pp = 0;  // dense
  int ep = 0, expert_dp = 0;           // expert (expert tp = 1, pp shared)
};
MeshCoord mesh_coord(const MeshLayout& layout, int world_rank);

class Mesh {
 public:
  // Collective over `world`: builds this rank's communicator for every group kind, each with
  // world.split(color = index of the group, key = position in it, name "<kind>-<index>").
  Mesh(Communicator& world, MeshShape shape);

  const MeshLayout& layout() const { return layout_; }
  const MeshCoord& coord() const { return coord_; }
  int tp_rank() const { return coord_.tp; }
  int cp_rank() const { return coord_.cp; }
  int dp_rank() const { return coord_.dp; }
  int pp_rank() const { return coord_.pp; }
  int ep_rank() const { return coord_.ep; }
  int expert_dp_rank() const { return coord_.expert_dp; }

  Communicator& world() { return *world_; }
  Communicator& tp() { return group("tp"); }
  Communicator& cp() { return group("cp"); }
  Communicator& dp() { return group("dp"); }
  Communicator& pp() { return group("pp"); }
  Communicator& dp_cp() { return group("dp_cp"); }
  Communicator& ep() { return group("ep"); }
  Communicator& expert_dp() { return group("expert_dp"); }
  // First and last pipeline stage (tied embeddings); null on middle stages.
  Communicator* embedding();
  // This rank's group of `kind`; throws naming the kinds built when there is none.
  Communicator& group(const std::string& kind);

  // Collective over the world: builds (once) and returns the group over `axes` (see
  // mesh_rank_groups), stored under the kind `axes` with '-' written as '_' ("tp_pp").
  Communicator& add_group(const std::string& axes, bool expert = false);

 private:
  void build(const std::string& kind, const std::vector<std::vector<int>>& groups);

  Communicator* world_;
  MeshLayout layout_;
  MeshCoord coord_;
  std::map<std::string, std::unique_ptr<Communicator>> groups_;
};

}  // namespace loom::comm
