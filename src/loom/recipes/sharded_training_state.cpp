#include "loom/recipes/sharded_training_state.h"

#include <nlohmann/json.hpp>

#include "loom/ckpt/tensor_names.h"
#include "loom/comm/gather_text.h"

namespace loom::recipes {

ckpt::Slice parameter_slice(const model::Parameter& p) {
  ckpt::Slice slice = ckpt::full_slice(p.global_shape());
  if (p.shard.is_split()) slice[p.shard.split_dim] = {p.shard.start, p.shard.length};
  return slice;
}

namespace {

// The three tensors of one parameter shard: values and both moments.
void add_shard(std::vector<ckpt::TensorRef>& out, const std::string& name, const Shape& global, const ckpt::Slice& slice,
               const float* value, const float* exp_avg, const float* exp_avg_sq) {
  out.push_back({name, global, DType::F32, value, slice});
  out.push_back({ckpt::optimizer_state_name("exp_avg", name), global, DType::F32, exp_avg, slice});
  out.push_back({ckpt::optimizer_state_name("exp_avg_sq", name), global, DType::F32, exp_avg_sq, slice});
}

}  // namespace

ShardedTrainingState gather_sharded_training_state(const model::Transformer& model, const float* exp_avg,
                                                   const float* exp_avg_sq) {
  ShardedTrainingState state;
  const model::ParameterStore& params = model.params();
  comm::Communicator* tp = model.tensor_parallel().group();
  if (tp == nullptr || tp->size() == 1) {
    for (const model::Parameter& p : params.list()) {
      if (!p.shard.counts_in_norm) continue;  // a copy another rank stores (tied head of a pipeline)
      add_shard(state.tensors, p.name, p.global_shape(), parameter_slice(p), params.values() + p.offset,
                exp_avg + p.offset, exp_avg_sq + p.offset);
    }
    return state;
  }
  // Every rank registers the same parameters in the same order; only their slices differ. Gather
  // each rank's [values | exp_avg | exp_avg_sq] and its (start, length, stored) per parameter.
  const int ranks = tp->size();
  const int64_t total = params.total(), count = static_cast<int64_t>(params.list().size());
  std::vector<int64_t> totals(ranks);
  tp->all_gather(&total, totals.data(), 1, DType::I64);
  std::vector<int64_t> mine;
  for (const model::Parameter& p : params.list()) {
    mine.insert(mine.end(), {p.shard.start, p.shard.length, p.shard.counts_in_norm ? 1 : 0});
  }
  std::vector<int64_t> placements(static_cast<size_t>(ranks) * mine.size());
  tp->all_gather(mine.data(), placements.data(), static_cast<int64_t>(mine.size()), DType::I64);
  std::vector<float> local(static_cast<size_t>(3 * total));
  std::copy(params.values(), params.values() + total, local.begin());
  std::copy(exp_avg, exp_avg + total, local.begin() + total);
  std::copy(exp_avg_sq, exp_avg_sq + total, local.begin() + 2 * total);
  std::vector<int64_t> counts(ranks);
  int64_t all = 0;
  for (int r = 0; r < ranks; ++r) all += counts[r] = 3 * totals[r];
  state.storage.resize(static_cast<size_t>(all));
  tp->all_gather_v(local.data(), state.storage.data(), counts, DType::F32);

  int64_t base = 0;
  for (int r = 0; r < ranks; ++r) {
    const float* values = state.storage.data() + base;
    int64_t offset = 0;  // rank r's parameters lie back to back in registration order
    for (int64_t i = 0; i < count; ++i) {
      const model::Parameter& p = params.list()[i];
      const int64_t* placement = placements.data() + (static_cast<size_t>(r) * count + i) * 3;
      ckpt::Slice slice = ckpt::full_slice(p.global_shape());
      int64_t numel = p.numel;
      if (p.shard.is_split()) {
        slice[p.shard.split_dim] = {placement[0], placement[1]};
        numel = ckpt::slice_numel(slice);
      }
      if (placement[2] != 0) {
        add_shard(state.tensors, p.name, p.global_shape(), slice, values + offset, values + totals[r] + offset,
                  values + 2 * totals[r] + offset);
      }
      offset += numel;
    }
    base += counts[r];
  }
  return state;
}

namespace {

// A stage's tensors as JSON (name, global shape, slice) and their values back to back.
std::string describe_tensors(const std::vector<ckpt::TensorRef>& tensors, std::vector<float>& values) {
  nlohmann::json list = nlohmann::json::array();
  for (const ckpt::TensorRef& t : tensors) {
    list.push_back({{"name", t.name}, {"shape", t.global_shape}, {"slice", t.slice}});
    const float* data = static_cast<const float*>(t.data);
    values.insert(values.end(), data, data + ckpt::slice_numel(t.slice));
  }
  return list.dump();
}

}  // namespace

ShardedTrainingState gather_pipeline_state(const ShardedTrainingState& stage, comm::Communicator& pp) {
  if (pp.size() == 1) {
    ShardedTrainingState copy;
    copy.tensors = stage.tensors;  // refs stay valid: the caller keeps `stage`
    return copy;
  }
  constexpr int kValuesTag = 2;  // after gather_text's tags
  std::vector<float> own;
  const std::vector<std::string> texts = comm::gather_text(describe_tensors(stage.tensors, own), pp, 0);
  if (pp.rank() != 0) {
    const int64_t count = static_cast<int64_t>(own.size());
    pp.send(&count, 1, DType::I64, 0, kValuesTag);
    pp.send(own.data(), count, DType::F32, 0, kValuesTag);
    return {};
  }
  // Pipeline rank 0: its own tensors, then each other stage's, copied into one storage.
  std::vector<std::vector<float>> values{std::move(own)};
  for (int from = 1; from < pp.size(); ++from) {
    int64_t count = 0;
    pp.recv(&count, 1, DType::I64, from, kValuesTag);
    values.emplace_back(static_cast<size_t>(count));
    pp.recv(values.back().data(), count, DType::F32, from, kValuesTag);
  }
  ShardedTrainingState all;
  size_t total = 0;
  for (const auto& v : values) total += v.size();
  all.storage.reserve(total);
  for (const auto& v : values) all.storage.insert(all.storage.end(), v.begin(), v.end());
  size_t offset = 0;
  for (const std::string& text : texts) {
    for (const nlohmann::json& t : nlohmann::json::parse(text)) {
      ckpt::TensorRef ref;
      ref.name = t.at("name").get<std::string>();
      ref.global_shape = t.at("shape").get<Shape>();
      ref.slice = t.at("slice").get<ckpt::Slice>();
      ref.data = all.storage.data() + offset;
      offset += static_cast<size_t>(ckpt::slice_numel(ref.slice));
      all.tensors.push_back(std::move(ref));
    }
  }
  return all;
}

}  // namespace loom::recipes
