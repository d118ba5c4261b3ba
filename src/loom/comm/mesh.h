#pragma once
// The device mesh: world = pp x dp x ep-carved x cp x tp in Megatron-Core's rank order
// "tp-cp-ep-dp-pp" (tp varies fastest, pp slowest). It gives every rank its coordinates and the
// process groups Megatron-Core users know. Expert parallelism is carved out of dp x cp as
// Megatron's expert rank generator does (order "tp-ep-dp-pp" over the same ranks, with
// expert-dp = dp * cp / ep).
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
  MeshShape shape;  // dp resolved
  // Group kind ("tp", "cp", "dp", "pp", "dp_cp", "ep", "expert_dp", "embedding") -> the groups,
  // each a list of world ranks in group-rank order.
  std::map<std::string, std::vector<std::vector<int>>> groups;
};

// Throws loom::Error naming the sizes when world_size is not divisible as asked.
MeshLayout make_mesh_layout(int world_size, MeshShape shape);
// Human-readable table of every group (what `loom mesh` prints).
std::string describe_mesh(const MeshLayout& layout);

class Mesh {
 public:
  // Collective over `world`: builds this rank's communicator for every group kind.
  Mesh(Communicator& world, MeshShape shape);

  const MeshLayout& layout() const { return layout_; }
  int tp_rank() const;
  int cp_rank() const;
  int dp_rank() const;
  int pp_rank() const;
  int ep_rank() const;

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
  Communicator& group(const std::string& kind);

 private:
  Communicator* world_;
  MeshLayout layout_;
  std::map<std::string, std::unique_ptr<Communicator>> groups_;
};

}  // namespace loom::comm
