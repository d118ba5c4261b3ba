#include "loom/rl/refit_communication.h"

#include <algorithm>
#include <cstring>
#include <map>

#include <nlohmann/json.hpp>

#include "loom/ckpt/slice.h"
#include "loom/comm/gather_text.h"
#include "loom/core/error.h"
#include "loom/rl/communication.h"

namespace loom::rl {

namespace {
using nlohmann::json;

constexpr int kTag = 7301;  // the refit's messages

int64_t shard_bytes(const ckpt::TensorRef& r) {
  return ckpt::slice_numel(r.slice.empty() ? ckpt::full_slice(r.global_shape) : r.slice) * static_cast<int64_t>(dtype_size(r.dtype));
}

json describe(const std::vector<ckpt::TensorRef>& shards) {
  json out = json::array();
  for (const ckpt::TensorRef& r : shards) {
    out.push_back({{"name", r.name}, {"shape", r.global_shape}, {"dtype", dtype_name(r.dtype)},
                   {"slice", r.slice.empty() ? ckpt::full_slice(r.global_shape) : r.slice}});
  }
  return out;
}

// Rank 0: every learner rank's shards, each at its offset in that rank's stream.
json make_plan(const std::vector<std::string>& descriptions, int learners, const std::string& version, int64_t bucket_bytes) {
  json streams = json::array();
  for (int r = 0; r < learners; ++r) {
    json shards = json::parse(descriptions.at(static_cast<size_t>(r)));
    int64_t offset = 0;
    for (json& s : shards) {
      const int64_t bytes = ckpt::slice_numel(s["slice"].get<ckpt::Slice>()) *
                            static_cast<int64_t>(dtype_size(parse_dtype(s["dtype"].get<std::string>())));
      s["offset"] = offset;
      offset += bytes;
    }
    streams.push_back({{"shards", shards}, {"bytes", offset}});
  }
  return {{"version", version}, {"bucket_words", std::max<int64_t>(1, bucket_bytes / 4)}, {"streams", streams}};
}

int64_t words_of(int64_t bytes) { return (bytes + 3) / 4; }

// The plan on every member of `group`.
json agree_plan(comm::Communicator& group, int learners, const std::string& description, const std::string& version,
                int64_t bucket_bytes) {
  const std::vector<std::string> all = comm::gather_text(description, group, 0);
  const std::string plan = group.rank() == 0 ? make_plan(all, learners, version, bucket_bytes).dump() : std::string();
  return json::parse(broadcast_text(plan, group, 0));
}
}  // namespace

comm::CommOptions refit_comm_options(const config::RunConfig& config) {
  comm::CommOptions options;
  const double seconds = config.grpo.step_timeout_s + 2.0 * config.grpo.generation_timeout_s;
  options.timeout = std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
  return options;
}

void send_parameters(comm::Communicator& group, int learners, const std::vector<ckpt::TensorRef>& shards,
                     const std::string& version, int64_t bucket_bytes) {
  LOOM_CHECK(group.rank() < learners, "send_parameters: group rank " + std::to_string(group.rank()) + " is not a learner rank");
  const json plan = agree_plan(group, learners, describe(shards).dump(), version, bucket_bytes);
  const json& mine = plan["streams"][static_cast<size_t>(group.rank())];
  std::vector<int32_t> stream(static_cast<size_t>(words_of(mine["bytes"].get<int64_t>())), 0);
  auto* bytes = reinterpret_cast<std::byte*>(stream.data());
  for (size_t i = 0; i < shards.size(); ++i)
    std::memcpy(bytes + mine["shards"][i]["offset"].get<int64_t>(), shards[i].data, static_cast<size_t>(shard_bytes(shards[i])));
  const int64_t bucket = plan["bucket_words"].get<int64_t>();
  for (int worker = learners; worker < group.size(); ++worker) {
    for (int64_t at = 0; at < static_cast<int64_t>(stream.size()); at += bucket)
      group.send(stream.data() + at, std::min(bucket, static_cast<int64_t>(stream.size()) - at), DType::I32, worker, kTag);
  }
}

std::vector<ckpt::TensorRef> ReceivedParameters::refs() const {
  std::vector<ckpt::TensorRef> out;
  for (size_t i = 0; i < names.size(); ++i) out.push_back({names[i], shapes[i], dtypes[i], data[i].data(), ckpt::full_slice(shapes[i])});
  return out;
}

ReceivedParameters receive_parameters(comm::Communicator& group, int learners, int64_t bucket_bytes) {
  LOOM_CHECK(group.rank() >= learners, "receive_parameters: group rank " + std::to_string(group.rank()) + " is a learner rank");
  const json plan = agree_plan(group, learners, "[]", "", bucket_bytes);
  ReceivedParameters out;
  out.version = plan["version"].get<std::string>();
  std::map<std::string, size_t> index;  // tensor name -> position in out
  std::vector<int64_t> filled;
  const int64_t bucket = plan["bucket_words"].get<int64_t>();
  for (int r = 0; r < learners; ++r) {
    const json& stream_plan = plan["streams"][static_cast<size_t>(r)];
    std::vector<int32_t> stream(static_cast<size_t>(words_of(stream_plan["bytes"].get<int64_t>())), 0);
    for (int64_t at = 0; at < static_cast<int64_t>(stream.size()); at += bucket)
      group.recv(stream.data() + at, std::min(bucket, static_cast<int64_t>(stream.size()) - at), DType::I32, r, kTag);
    const auto* bytes = reinterpret_cast<const std::byte*>(stream.data());
    for (const json& s : stream_plan["shards"]) {
      const std::string name = s["name"].get<std::string>();
      const Shape shape = s["shape"].get<Shape>();
      const DType dtype = parse_dtype(s["dtype"].get<std::string>());
      auto [it, fresh] = index.emplace(name, out.names.size());
      if (fresh) {
        out.names.push_back(name);
        out.shapes.push_back(shape);
        out.dtypes.push_back(dtype);
        out.data.emplace_back(static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype));
        filled.push_back(0);
      }
      const size_t t = it->second;
      LOOM_CHECK(out.shapes[t] == shape && out.dtypes[t] == dtype,
                 "refit: learner rank " + std::to_string(r) + " sends tensor '" + name + "' with another shape or dtype than another rank");
      const ckpt::Slice slice = s["slice"].get<ckpt::Slice>();
      ckpt::check_slice(slice, shape, "refit tensor '" + name + "'");
      ckpt::copy_region(bytes + s["offset"].get<int64_t>(), slice, out.data[t].data(), ckpt::full_slice(shape), slice, dtype_size(dtype));
      filled[t] += ckpt::slice_numel(slice);
    }
  }
  for (size_t t = 0; t < out.names.size(); ++t)
    LOOM_CHECK(filled[t] == shape_numel(out.shapes[t]), "refit: the learner ranks' shards of '" + out.names[t] + "' cover " +
                                                            std::to_string(filled[t]) + " of its " +
                                                            std::to_string(shape_numel(out.shapes[t])) + " elements");
  return out;
}

}  // namespace loom::rl
