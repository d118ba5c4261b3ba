// loom mesh [--world N] [--tp N] [--cp N] [--ep N] [--dp N] [--pp N]
//           [--ranks-per-node N [--nodes-per-site N]]
// Prints which world ranks form each process group (pure: no ranks are started), and with a
// topology the widest link each group kind spans.
#include <iostream>
#include <memory>

#include "loom/cli/command.h"
#include "loom/comm/mesh.h"
#include "loom/comm/topology.h"

namespace loom::cli {

void register_mesh(CLI::App& app, std::vector<Command>& commands) {
  struct Args {
    int world = 0;
    comm::MeshShape shape;
    int ranks_per_node = 0, nodes_per_site = 0;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("mesh", "print the process groups of a device mesh (Megatron-Core rank order)");
  cmd->add_option("--world", args->world, "world size (default: tp * cp * dp * pp, dp default 1)")
      ->check(non_negative());
  cmd->add_option("--tp", args->shape.tp, "tensor parallel size")->check(positive());
  cmd->add_option("--cp", args->shape.cp, "context parallel size")->check(positive());
  cmd->add_option("--ep", args->shape.ep, "expert parallel size (carved out of tp x cp x dp, tp ranks first)")
      ->check(positive());
  cmd->add_option("--dp", args->shape.dp, "data parallel size (0 = the rest of the world)")
      ->check(non_negative());
  cmd->add_option("--pp", args->shape.pp, "pipeline parallel size")->check(positive());
  cmd->add_option("--ranks-per-node", args->ranks_per_node, "show the topology: ranks per node (contiguous blocks)")
      ->check(non_negative());
  cmd->add_option("--nodes-per-site", args->nodes_per_site, "nodes per site (0 = one site)")
      ->check(non_negative());
  commands.push_back({cmd, [args] {
                        const comm::MeshShape& s = args->shape;
                        const int world = args->world > 0 ? args->world : s.tp * s.cp * s.pp * std::max(s.dp, 1);
                        comm::MeshLayout layout = comm::make_mesh_layout(world, s);
                        std::cout << comm::describe_mesh(layout);
                        if (args->ranks_per_node > 0 || args->nodes_per_site > 0) {
                          comm::Topology topology =
                              comm::topology_from_blocks(world, args->ranks_per_node, args->nodes_per_site);
                          std::cout << comm::describe_topology(topology) << "widest link per group kind:";
                          for (const std::string& kind : comm::mesh_group_kinds()) {
                            std::cout << (kind == "tp" ? " " : ", ") << kind << " "
                                      << comm::link_class_name(comm::widest_link(topology, layout.groups.at(kind)));
                          }
                          std::cout << "\n";
                        }
                        return 0;
                      }});
}

}  // namespace loom::cli
