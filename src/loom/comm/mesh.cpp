#include "loom/comm/mesh.h"

#include <algorithm>
#include <sstream>

#include "loom/core/error.h"

namespace loom::comm {

namespace {

struct Axis {
  std::string name;
  int size;
};

// The two factorisations of the world, fastest axis first. Megatron-Core's order is
// "tp-cp-ep-dp-pp"; the dense generator has ep = 1 and the expert one cp = 1 and tp = expert tp
// = 1, and a size-1 axis changes no rank's index, so each reduces to the four axes below.
std::vector<Axis> dense_axes(const MeshLayout& layout) {
  const MeshShape& s = layout.shape;
  return {{"tp", s.tp}, {"cp", s.cp}, {"dp", s.dp}, {"pp", s.pp}};
}

std::vector<Axis> expert_axes(const MeshLayout& layout) {
  const MeshShape& s = layout.shape;
  return {{"tp", 1}, {"ep", s.ep}, {"dp", layout.expert_dp}, {"pp", s.pp}};
}

std::string axis_names(const std::vector<Axis>& axes) {
  std::string out;
  for (const Axis& a : axes) out += (out.empty() ? "" : ", ") + a.name;
  return out;
}

std::vector<std::string> split_axes(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, '-')) out.push_back(item);
  return out;
}

// The groups over the axes with mask[d] set: rank = sum over axes of index[d] * stride[d] with
// stride the running product of the sizes (the first axis fastest). Inside a group the masked
// axes count in mixed radix, the first fastest; groups are numbered the same way over the
// unmasked axes. This is what Megatron's generate_masked_orthogonal_rank_groups computes.
std::vector<std::vector<int>> orthogonal_groups(const std::vector<Axis>& axes, const std::vector<bool>& mask) {
  std::vector<int> stride(axes.size());
  int world = 1;
  for (size_t d = 0; d < axes.size(); ++d) {
    stride[d] = world;
    world *= axes[d].size;
  }
  std::vector<size_t> in_group, across;
  int group_size = 1;
  for (size_t d = 0; d < axes.size(); ++d) {
    if (mask[d]) {
      in_group.push_back(d);
      group_size *= axes[d].size;
    } else {
      across.push_back(d);
    }
  }
  // Offset of the rank whose mixed-radix index over `dims` is `index`.
  auto offset = [&](int index, const std::vector<size_t>& dims) {
    int rank = 0;
    for (size_t d : dims) {
      rank += (index % axes[d].size) * stride[d];
      index /= axes[d].size;
    }
    return rank;
  };
  std::vector<std::vector<int>> groups(world / group_size);
  for (int g = 0; g < static_cast<int>(groups.size()); ++g) {
    const int base = offset(g, across);
    groups[g].reserve(group_size);
    for (int k = 0; k < group_size; ++k) groups[g].push_back(base + offset(k, in_group));
  }
  return groups;
}

std::vector<std::vector<int>> groups_over(const std::vector<Axis>& axes, const std::string& names, bool expert) {
  std::vector<bool> mask(axes.size(), false);
  for (const std::string& name : split_axes(names)) {
    auto it = std::find_if(axes.begin(), axes.end(), [&](const Axis& a) { return a.name == name; });
    LOOM_CHECK(it != axes.end(), "mesh: unknown " + std::string(expert ? "expert " : "") + "axis '" + name + "' in '" +
                                names + "'; valid axes: " + axis_names(axes) + " (joined with '-', e.g. 'dp-cp')");
    LOOM_CHECK(!mask[it - axes.begin()], "mesh: axis '" + name + "' is named twice in '" + names + "'");
    mask[it - axes.begin()] = true;
  }
  return orthogonal_groups(axes, mask);
}

std::string shape_text(const MeshLayout& l) {
  const MeshShape& s = l.shape;
  return "tp " + std::to_string(s.tp) + " x cp " + std::to_string(s.cp) + " x dp " + std::to_string(s.dp) + " x pp " +
         std::to_string(s.pp);
}

}  // namespace

const std::vector<std::string>& mesh_group_kinds() {
  static const std::vector<std::string> kinds = {"tp", "cp", "dp", "pp", "dp_cp", "ep", "expert_dp", "embedding"};
  return kinds;
}

MeshLayout make_mesh_layout(int world_size, MeshShape shape) {
  const std::string sizes = "world " + std::to_string(world_size) + ", tp " + std::to_string(shape.tp) + ", cp " +
                            std::to_string(shape.cp) + ", ep " + std::to_string(shape.ep) + ", dp " +
                            std::to_string(shape.dp) + ", pp " + std::to_string(shape.pp);
  LOOM_CHECK(world_size >= 1, "mesh: world size must be >= 1 (" + sizes + ")");
  LOOM_CHECK(shape.tp >= 1 && shape.cp >= 1 && shape.ep >= 1 && shape.pp >= 1 && shape.dp >= 0,
        "mesh: tp, cp, ep and pp must be >= 1 and dp >= 0 (0 = the rest of the world); got " + sizes);
  const int model = shape.tp * shape.cp * shape.pp;
  LOOM_CHECK(world_size % model == 0, "mesh: world size " + std::to_string(world_size) +
                                     " is not divisible by tp * cp * pp = " + std::to_string(shape.tp) + " * " +
                                     std::to_string(shape.cp) + " * " + std::to_string(shape.pp) + " = " +
                                     std::to_string(model) + " (" + sizes + ")");
  const int dp = world_size / model;
  LOOM_CHECK(shape.dp == 0 || shape.dp == dp,
        "mesh: tp * cp * dp * pp = " + std::to_string(shape.tp) + " * " + std::to_string(shape.cp) + " * " +
            std::to_string(shape.dp) + " * " + std::to_string(shape.pp) + " = " +
            std::to_string(static_cast<long long>(model) * shape.dp) + " but the world has " +
            std::to_string(world_size) + " ranks; use dp " + std::to_string(dp) + " or 0 (auto)");
  shape.dp = dp;
  const int stage = shape.tp * shape.cp * dp;
  LOOM_CHECK(stage % shape.ep == 0, "mesh: ep " + std::to_string(shape.ep) + " does not divide tp * cp * dp = " +
                                        std::to_string(shape.tp) + " * " + std::to_string(shape.cp) + " * " +
                                        std::to_string(dp) + " = " + std::to_string(stage) +
                                        " (expert parallelism is carved out of a stage's ranks; " + sizes + ")");

  MeshLayout layout;
  layout.world_size = world_size;
  layout.shape = shape;
  layout.expert_dp = stage / shape.ep;
  const auto dense = dense_axes(layout);
  const auto expert = expert_axes(layout);
  layout.groups["tp"] = groups_over(dense, "tp", false);
  layout.groups["cp"] = groups_over(dense, "cp", false);
  layout.groups["dp"] = groups_over(dense, "dp", false);
  layout.groups["pp"] = groups_over(dense, "pp", false);
  layout.groups["dp_cp"] = groups_over(dense, "dp-cp", false);
  layout.groups["ep"] = groups_over(expert, "ep", true);
  layout.groups["expert_dp"] = groups_over(expert, "dp", true);
  // Word embeddings live on the first and last stage of each pipeline (both tied copies must
  // agree); with one stage that stage alone.
  for (const auto& pipeline : layout.groups["pp"]) {
    if (pipeline.size() == 1)
      layout.groups["embedding"].push_back({pipeline.front()});
    else
      layout.groups["embedding"].push_back({pipeline.front(), pipeline.back()});
  }
  return layout;
}

std::vector<std::vector<int>> mesh_rank_groups(const MeshLayout& layout, const std::string& axes, bool expert) {
  return groups_over(expert ? expert_axes(layout) : dense_axes(layout), axes, expert);
}

MeshCoord mesh_coord(const MeshLayout& layout, int world_rank) {
  LOOM_CHECK(world_rank >= 0 && world_rank < layout.world_size, "mesh: rank " + std::to_string(world_rank) +
                                                               " is outside the world [0, " +
                                                               std::to_string(layout.world_size) + ")");
  const MeshShape& s = layout.shape;
  MeshCoord c;
  c.tp = world_rank % s.tp;
  c.cp = world_rank / s.tp % s.cp;
  c.dp = world_rank / (s.tp * s.cp) % s.dp;
  c.pp = world_rank / (s.tp * s.cp * s.dp);
  c.ep = world_rank % s.ep;
  c.expert_dp = world_rank / s.ep % layout.expert_dp;
  return c;
}

std::string describe_mesh(const MeshLayout& layout) {
  const MeshShape& s = layout.shape;
  std::ostringstream out;
  out << "mesh: world " << layout.world_size << " = " << shape_text(layout)
      << " (rank order tp-cp-dp-pp, tp fastest)\n";
  out << "experts: world " << layout.world_size << " = ep " << s.ep << " x expert_dp " << layout.expert_dp
      << " x pp " << s.pp << " (rank order ep-dp-pp, ep fastest; expert tp 1)\n";
  for (const std::string& kind : mesh_group_kinds()) {
    const auto& groups = layout.groups.at(kind);
    out << kind << " groups (" << groups.size() << " of " << groups.front().size() << "):";
    for (const auto& group : groups) {
      out << " [";
      for (size_t i = 0; i < group.size(); ++i) out << (i ? " " : "") << group[i];
      out << "]";
    }
    out << "\n";
  }
  return out.str();
}

Mesh::Mesh(Communicator& world, MeshShape shape)
    : world_(&world), layout_(make_mesh_layout(world.size(), shape)), coord_(mesh_coord(layout_, world.rank())) {
  for (const std::string& kind : mesh_group_kinds()) build(kind, layout_.groups.at(kind));
}

void Mesh::build(const std::string& kind, const std::vector<std::vector<int>>& groups) {
  // Layout ranks are ranks of the communicator the mesh was built over (normally the world).
  const int me = world_->rank();
  int color = -1, key = 0;
  for (size_t g = 0; g < groups.size() && color < 0; ++g) {
    auto it = std::find(groups[g].begin(), groups[g].end(), me);
    if (it != groups[g].end()) {
      color = static_cast<int>(g);
      key = static_cast<int>(it - groups[g].begin());
    }
  }
  // Every rank calls split, also one in no group (color -1): split is collective.
  std::unique_ptr<Communicator> comm = world_->split(color, key, kind + "-" + std::to_string(std::max(color, 0)));
  if (comm) groups_[kind] = std::move(comm);
}

Communicator* Mesh::embedding() {
  auto it = groups_.find("embedding");
  return it == groups_.end() ? nullptr : it->second.get();
}

Communicator& Mesh::group(const std::string& kind) {
  auto it = groups_.find(kind);
  if (it != groups_.end()) return *it->second;
  std::string built;
  for (const auto& [name, comm] : groups_) built += (built.empty() ? "" : ", ") + name;
  throw Error("mesh: world rank " + std::to_string(world_->rank()) + " has no '" + kind + "' group" +
              (kind == "embedding" ? " (it is a middle pipeline stage; use embedding(), which returns null)" : "") +
              "; its groups: " + built + " (Mesh::add_group builds others)");
}

Communicator& Mesh::add_group(const std::string& axes, bool expert) {
  std::string kind = axes;
  std::replace(kind.begin(), kind.end(), '-', '_');
  if (expert && kind != "ep") kind = "expert_" + kind;  // "ep" exists only in the expert factorisation
  if (groups_.find(kind) == groups_.end()) build(kind, mesh_rank_groups(layout_, axes, expert));
  return *groups_.at(kind);
}

}  // namespace loom::comm
