#include "loom/comm/threads/collectives.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>

#include "loom/comm/reduce.h"
#include "loom/core/error.h"

namespace loom::comm::threads {

namespace {

const std::byte* at(const void* base, int64_t elements, size_t element) {
  return static_cast<const std::byte*>(base) + elements * static_cast<int64_t>(element);
}
std::byte* at(void* base, int64_t elements, size_t element) {
  return static_cast<std::byte*>(base) + elements * static_cast<int64_t>(element);
}

void copy(void* dst, const void* src, int64_t bytes) {
  if (bytes > 0 && dst != src) std::memmove(dst, src, static_cast<size_t>(bytes));
}

std::string list(std::span<const int64_t> values) {
  std::string text = "[";
  for (size_t i = 0; i < values.size(); ++i) text += (i ? ", " : "") + std::to_string(values[i]);
  return text + "]";
}

Post make_post(const std::string& kind, const std::string& arguments) {
  Post post;
  post.kind = kind;
  post.signature = kind + "(" + arguments + ")";
  return post;
}

// Where other ranks find this rank's input of `bytes`: a copy in the slot when small (the
// operation then needs no closing barrier), else the buffer itself. Alone in its group, the
// rank's buffer is read by nobody else.
void offer(Post& post, const void* data, int64_t bytes, int group_size) {
  if (group_size == 1) {
    post.src = data;
  } else if (bytes <= kStageBytes) {
    if (bytes > 0) {
      post.staged.reset(new std::byte[static_cast<size_t>(bytes)]);
      std::memcpy(post.staged.get(), data, static_cast<size_t>(bytes));
      post.src = post.staged.get();
    }
  } else {
    post.src = data;
    post.direct = true;
  }
}

bool any_direct(const Slot& slot) {
  return std::any_of(slot.posts.begin(), slot.posts.end(), [](const Post& p) { return p.direct; });
}

// Every rank must have posted the same signature; else a message grouping the ranks by view.
std::string same_signature(const Group& group, const Slot& slot) {
  std::vector<std::pair<std::string, std::vector<int>>> views;
  for (int q = 0; q < group.size(); ++q) {
    const std::string& signature = slot.posts[q].signature;
    auto it = std::find_if(views.begin(), views.end(), [&](const auto& v) { return v.first == signature; });
    if (it == views.end()) {
      views.push_back({signature, {q}});
    } else {
      it->second.push_back(q);
    }
  }
  if (views.size() == 1) return "";
  std::string text = "the ranks disagree on this collective: ";
  for (size_t i = 0; i < views.size(); ++i) {
    text += (i ? "; " : "") + views[i].first + " on " + group.describe_ranks(views[i].second);
  }
  return text + ". Every rank of the group must issue the same collectives in the same order, with the same "
                "counts, dtypes, ops and roots";
}

Finalize same(const Group& group) {
  return [&group](Slot& slot) { return same_signature(group, slot); };
}

// Runs the part of an operation after arrival. On failure the slot breaks (the others stop at
// their next barrier) and this rank returns only once nobody touches its buffers any more.
template <class Body>
void in_slot(const Call& call, Slot& slot, const std::string& kind, Body&& body) {
  const std::string where = call.group.where(call.rank, call.seq, kind);
  try {
    body();
  } catch (const SlotBroken& e) {
    call.group.leave(call.seq, slot, e.what());
    throw Error(where + "stopped because another rank failed: " + e.what());
  } catch (const std::exception& e) {
    const std::string message = where + e.what();
    call.group.leave(call.seq, slot, message);
    throw Error(message);
  }
  call.group.leave(call.seq, slot, "");
}

std::string dtype_arg(DType dtype) { return "dtype=" + dtype_name(dtype); }

}  // namespace

void all_reduce(const Call& call, void* data, int64_t count, DType dtype, ReduceOp op) {
  Group& g = call.group;
  const int n = g.size(), r = call.rank;
  const size_t element = dtype_size(dtype);
  const int64_t bytes = count * static_cast<int64_t>(element);
  const bool small = bytes <= kStageBytes;
  Post post = make_post("all_reduce", "count=" + std::to_string(count) + ", " + dtype_arg(dtype) +
                                          ", op=" + reduce_op_name(op));
  if (small) {
    offer(post, data, bytes, n);
  } else {
    post.src = data;
    post.direct = n > 1;
  }
  Slot& slot = g.arrive(r, call.seq, std::move(post), same(g));
  in_slot(call, slot, "all_reduce", [&] {
    if (n == 1 || count == 0) return;  // one rank: its data is already the sum, max and mean
    std::vector<const void*> srcs(n);
    if (small) {
      // Latency-optimal: one rendezvous, then every rank reduces everything from the staged copies.
      for (int q = 0; q < n; ++q) {
        g.link(q, r, bytes);
        srcs[q] = slot.posts[q].src;
      }
      reduce_n(data, srcs.data(), n, count, dtype, op);
      return;
    }
    // Bandwidth-optimal: rank r reduces its 1/n slice of a chunk from every buffer into its own,
    // then copies the other slices of the previous chunk from their owners' buffers. Chunks keep
    // the slices just written in cache for the ranks that read them one step later, and one
    // barrier per step separates the phases (in step k nobody writes what another reads: rank
    // q writes only slice q of chunk k and slices != q of chunk k-1). The last barrier is the
    // closing one. With a link model one chunk, so each transfer is reported once per op.
    const int64_t chunk =
        g.world().link_model() ? count : std::max<int64_t>(n * (kSliceBytes / static_cast<int64_t>(element)), n);
    const int64_t chunks = (count + chunk - 1) / chunk;
    auto slice = [&](int64_t c, int q) {
      const int64_t begin = c * chunk, length = std::min(chunk, count - begin);
      return std::pair<int64_t, int64_t>{begin + length * q / n, begin + length * (q + 1) / n};
    };
    for (int64_t step = 0; step <= chunks; ++step) {
      if (step < chunks) {
        const auto [begin, end] = slice(step, r);
        if (end > begin) {
          for (int q = 0; q < n; ++q) {
            g.link(q, r, (end - begin) * static_cast<int64_t>(element));
            srcs[q] = at(slot.posts[q].src, begin, element);
          }
          reduce_n(at(data, begin, element), srcs.data(), n, end - begin, dtype, op);
        }
      }
      if (step > 0) {
        for (int i = 1; i < n; ++i) {
          const int q = (r + i) % n;  // start at a different owner on every rank
          const auto [begin, end] = slice(step - 1, q);
          if (end > begin) {
            const int64_t length = (end - begin) * static_cast<int64_t>(element);
            g.link(q, r, length);
            copy(at(data, begin, element), at(slot.posts[q].src, begin, element), length);
          }
        }
      }
      g.barrier(slot);
    }
  });
}

void reduce_scatter(const Call& call, const void* send, void* recv, int64_t recv_count, DType dtype, ReduceOp op) {
  Group& g = call.group;
  const int n = g.size(), r = call.rank;
  const size_t element = dtype_size(dtype);
  const int64_t block = recv_count * static_cast<int64_t>(element);
  Post post = make_post("reduce_scatter", "recv_count=" + std::to_string(recv_count) + ", " + dtype_arg(dtype) +
                                              ", op=" + reduce_op_name(op));
  offer(post, send, block * n, n);
  Slot& slot = g.arrive(r, call.seq, std::move(post), same(g));
  in_slot(call, slot, "reduce_scatter", [&] {
    if (recv_count > 0) {
      std::vector<const void*> srcs(n);
      for (int q = 0; q < n; ++q) {
        g.link(q, r, block);
        srcs[q] = at(slot.posts[q].src, r * recv_count, element);
      }
      reduce_n(recv, srcs.data(), n, recv_count, dtype, op);
    }
    if (any_direct(slot)) g.barrier(slot);
  });
}

void all_gather(const Call& call, const void* send, void* recv, int64_t send_count, DType dtype) {
  Group& g = call.group;
  const int n = g.size(), r = call.rank;
  const size_t element = dtype_size(dtype);
  const int64_t bytes = send_count * static_cast<int64_t>(element);
  Post post = make_post("all_gather", "send_count=" + std::to_string(send_count) + ", " + dtype_arg(dtype));
  offer(post, send, bytes, n);
  Slot& slot = g.arrive(r, call.seq, std::move(post), same(g));
  in_slot(call, slot, "all_gather", [&] {
    if (bytes > 0) {
      for (int i = 0; i < n; ++i) {
        const int q = (r + i) % n;
        std::byte* dst = at(recv, q * send_count, element);
        if (q == r) {
          copy(dst, send, bytes);  // nothing when sending from its own block of recv (in place)
        } else {
          g.link(q, r, bytes);
          copy(dst, slot.posts[q].src, bytes);
        }
      }
    }
    if (any_direct(slot)) g.barrier(slot);
  });
}

void all_gather_v(const Call& call, const void* send, void* recv, std::span<const int64_t> counts, DType dtype) {
  Group& g = call.group;
  const int n = g.size(), r = call.rank;
  const size_t element = dtype_size(dtype);
  Post post = make_post("all_gather_v", "counts=" + list(counts) + ", " + dtype_arg(dtype));
  offer(post, send, counts[r] * static_cast<int64_t>(element), n);
  Slot& slot = g.arrive(r, call.seq, std::move(post), same(g));
  in_slot(call, slot, "all_gather_v", [&] {
    std::vector<int64_t> offsets(n + 1, 0);
    std::partial_sum(counts.begin(), counts.end(), offsets.begin() + 1);
    for (int i = 0; i < n; ++i) {
      const int q = (r + i) % n;
      const int64_t bytes = counts[q] * static_cast<int64_t>(element);
      std::byte* dst = at(recv, offsets[q], element);
      if (q == r) {
        copy(dst, send, bytes);
      } else if (bytes > 0) {
        g.link(q, r, bytes);
        copy(dst, slot.posts[q].src, bytes);
      }
    }
    if (any_direct(slot)) g.barrier(slot);
  });
}

void broadcast(const Call& call, void* data, int64_t count, DType dtype, int root) {
  Group& g = call.group;
  const int n = g.size(), r = call.rank;
  const int64_t bytes = count * static_cast<int64_t>(dtype_size(dtype));
  Post post = make_post("broadcast",
                        "count=" + std::to_string(count) + ", " + dtype_arg(dtype) + ", root=" + std::to_string(root));
  if (r == root) offer(post, data, bytes, n);
  Slot& slot = g.arrive(r, call.seq, std::move(post), same(g));
  in_slot(call, slot, "broadcast", [&] {
    if (r != root && bytes > 0) {
      g.link(root, r, bytes);
      copy(data, slot.posts[root].src, bytes);
    }
    if (any_direct(slot)) g.barrier(slot);
  });
}

void reduce(const Call& call, const void* send, void* recv, int64_t count, DType dtype, ReduceOp op, int root) {
  Group& g = call.group;
  const int n = g.size(), r = call.rank;
  const size_t element = dtype_size(dtype);
  const int64_t bytes = count * static_cast<int64_t>(element);
  const bool small = bytes <= kStageBytes;
  Post post = make_post("reduce", "count=" + std::to_string(count) + ", " + dtype_arg(dtype) +
                                      ", op=" + reduce_op_name(op) + ", root=" + std::to_string(root));
  if (small) {
    offer(post, send, bytes, n);
  } else {
    post.src = send;
    post.direct = n > 1;
  }
  if (r == root) post.dst = recv;
  Slot& slot = g.arrive(r, call.seq, std::move(post), same(g));
  in_slot(call, slot, "reduce", [&] {
    if (count == 0) return;
    std::vector<const void*> srcs(n);
    if (small) {  // the root alone reduces the staged copies
      if (r != root) return;
      for (int q = 0; q < n; ++q) {
        g.link(q, root, bytes);
        srcs[q] = slot.posts[q].src;
      }
      reduce_n(recv, srcs.data(), n, count, dtype, op);
      return;
    }
    // Every rank reduces its 1/n slice and writes it into the root's result, so the work is
    // spread like the first phase of the large all-reduce. Rank r alone touches slice r of the
    // root's buffers, so the root's recv may be its send.
    const int64_t begin = count * r / n, end = count * (r + 1) / n;
    if (end > begin) {
      for (int q = 0; q < n; ++q) {
        g.link(q, r, (end - begin) * static_cast<int64_t>(element));
        srcs[q] = at(slot.posts[q].src, begin, element);
      }
      g.link(r, root, (end - begin) * static_cast<int64_t>(element));
      reduce_n(at(slot.posts[root].dst, begin, element), srcs.data(), n, end - begin, dtype, op);
    }
    g.barrier(slot);
  });
}

void all_to_all(const Call& call, const void* send, void* recv, int64_t count, DType dtype) {
  Group& g = call.group;
  const int n = g.size(), r = call.rank;
  const size_t element = dtype_size(dtype);
  const int64_t block = count * static_cast<int64_t>(element);
  Post post = make_post("all_to_all", "count=" + std::to_string(count) + ", " + dtype_arg(dtype));
  offer(post, send, block * n, n);
  Slot& slot = g.arrive(r, call.seq, std::move(post), same(g));
  in_slot(call, slot, "all_to_all", [&] {
    if (block > 0) {
      for (int i = 0; i < n; ++i) {
        const int q = (r + i) % n;
        std::byte* dst = at(recv, q * count, element);
        if (q == r) {
          copy(dst, at(send, r * count, element), block);
        } else {
          g.link(q, r, block);
          copy(dst, at(slot.posts[q].src, r * count, element), block);
        }
      }
    }
    if (any_direct(slot)) g.barrier(slot);
  });
}

void all_to_all_v(const Call& call, const void* send, std::span<const int64_t> send_counts, void* recv,
                  std::span<const int64_t> recv_counts, DType dtype) {
  Group& g = call.group;
  const int n = g.size(), r = call.rank;
  const size_t element = dtype_size(dtype);
  Post post = make_post("all_to_all_v", dtype_arg(dtype));
  post.send_counts.assign(send_counts.begin(), send_counts.end());
  post.recv_counts.assign(recv_counts.begin(), recv_counts.end());
  const int64_t total = std::accumulate(send_counts.begin(), send_counts.end(), int64_t{0});
  offer(post, send, total * static_cast<int64_t>(element), n);
  // What rank q sends to rank p must be what p expects from q.
  Finalize check_counts = [&g, n](Slot& slot) -> std::string {
    if (std::string error = same_signature(g, slot); !error.empty()) return error;
    std::string error;
    int shown = 0;
    for (int p = 0; p < n; ++p) {
      for (int q = 0; q < n; ++q) {
        const int64_t sent = slot.posts[q].send_counts[p], expected = slot.posts[p].recv_counts[q];
        if (sent != expected && shown++ < 8) {
          error += (error.empty() ? "" : "; ") + g.describe_ranks({p}) + " expects " + std::to_string(expected) +
                   " elements from group rank " + std::to_string(q) + ", which sends it " + std::to_string(sent);
        }
      }
    }
    if (error.empty()) return "";
    return "all_to_all_v counts disagree: " + error +
           ". recv_counts[q] on rank p must equal send_counts[p] on rank q";
  };
  Slot& slot = g.arrive(r, call.seq, std::move(post), check_counts);
  in_slot(call, slot, "all_to_all_v", [&] {
    std::vector<int64_t> recv_offsets(n + 1, 0);
    std::partial_sum(recv_counts.begin(), recv_counts.end(), recv_offsets.begin() + 1);
    for (int i = 0; i < n; ++i) {
      const int q = (r + i) % n;
      const std::vector<int64_t>& theirs = slot.posts[q].send_counts;
      const int64_t offset = std::accumulate(theirs.begin(), theirs.begin() + r, int64_t{0});
      const int64_t bytes = recv_counts[q] * static_cast<int64_t>(element);
      std::byte* dst = at(recv, recv_offsets[q], element);
      if (q == r) {
        copy(dst, at(send, offset, element), bytes);
      } else if (bytes > 0) {
        g.link(q, r, bytes);
        copy(dst, at(slot.posts[q].src, offset, element), bytes);
      }
    }
    if (any_direct(slot)) g.barrier(slot);
  });
}

void barrier(const Call& call) {
  Slot& slot = call.group.arrive(call.rank, call.seq, make_post("barrier", ""), same(call.group));
  in_slot(call, slot, "barrier", [] {});
}

SplitResult split(const Call& call, int color, int key, const std::string& name) {
  Group& g = call.group;
  Post post = make_post("split", "");
  post.color = color;
  post.key = key;
  post.name = name;
  // The last rank to arrive builds every new group, so each is created exactly once.
  Finalize build = [&g](Slot& slot) -> std::string {
    if (std::string error = same_signature(g, slot); !error.empty()) return error;
    std::map<int, std::vector<int>> members;  // color -> parent ranks, ascending
    for (int q = 0; q < g.size(); ++q) {
      if (slot.posts[q].color >= 0) members[slot.posts[q].color].push_back(q);
    }
    for (auto& [color, ranks] : members) {
      std::stable_sort(ranks.begin(), ranks.end(),
                       [&](int a, int b) { return slot.posts[a].key < slot.posts[b].key; });
      std::map<std::string, std::vector<int>> names;
      for (int q : ranks) names[slot.posts[q].name].push_back(q);
      if (names.size() > 1) {
        std::string text = "split: the ranks of color " + std::to_string(color) + " name their new group differently:";
        for (const auto& [text_name, holders] : names) text += " '" + text_name + "' on " + g.describe_ranks(holders) + ";";
        return text + " ranks that form one group must pass the same name";
      }
      std::vector<int> world;
      for (int q : ranks) world.push_back(g.world_ranks()[q]);
      auto group = Group::create(g.world_ptr(), slot.posts[ranks.front()].name, std::move(world));
      for (size_t i = 0; i < ranks.size(); ++i) slot.split[ranks[i]] = {group, static_cast<int>(i)};
    }
    return "";
  };
  Slot& slot = g.arrive(call.rank, call.seq, std::move(post), build);
  SplitResult result = slot.split[call.rank];
  in_slot(call, slot, "split", [] {});
  return result;
}

}  // namespace loom::comm::threads
