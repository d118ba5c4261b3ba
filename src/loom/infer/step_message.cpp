#include "loom/infer/step_message.h"

#include <cstring>
#include <type_traits>
#include <vector>

#include "loom/core/error.h"

namespace loom::infer {

namespace {

constexpr int32_t kVersion = 3;

class Writer {
 public:
  template <typename T>
  void value(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    bytes_.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  template <typename T>
  void list(const std::vector<T>& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    value<int64_t>(static_cast<int64_t>(v.size()));
    bytes_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }
  void text(const std::string& s) {
    value<int64_t>(static_cast<int64_t>(s.size()));
    bytes_.append(s);
  }
  std::string take() { return std::move(bytes_); }

 private:
  std::string bytes_;
};

class Reader {
 public:
  explicit Reader(const std::string& bytes) : bytes_(bytes) {}
  template <typename T>
  T value(const char* field) {
    T v;
    std::memcpy(&v, take(sizeof(T), field), sizeof(T));
    return v;
  }
  template <typename T>
  std::vector<T> list(const char* field) {
    const int64_t n = count(field, sizeof(T));
    std::vector<T> v(static_cast<size_t>(n));
    if (n > 0) std::memcpy(v.data(), take(static_cast<size_t>(n) * sizeof(T), field), static_cast<size_t>(n) * sizeof(T));
    return v;
  }
  std::string text(const char* field) {
    const int64_t n = count(field, 1);
    return std::string(take(static_cast<size_t>(n), field), static_cast<size_t>(n));
  }
  void finish() const {
    LOOM_CHECK(at_ == bytes_.size(), "serving step message: " + std::to_string(bytes_.size() - at_) +
                                         " bytes left over after its last field (a message of another loom version?)");
  }

 private:
  int64_t count(const char* field, size_t element) {
    const auto n = value<int64_t>(field);
    LOOM_CHECK(n >= 0 && static_cast<uint64_t>(n) <= (bytes_.size() - at_) / element,
               std::string("serving step message: field '") + field + "' claims " + std::to_string(n) +
                   " elements, more than the message holds");
    return n;
  }
  const char* take(size_t n, const char* field) {
    LOOM_CHECK(n <= bytes_.size() - at_, std::string("serving step message: truncated in field '") + field + "' (" +
                                             std::to_string(bytes_.size()) + " bytes in all)");
    const char* p = bytes_.data() + at_;
    at_ += n;
    return p;
  }
  const std::string& bytes_;
  size_t at_ = 0;
};

}  // namespace

std::string step_kind_name(StepKind kind) {
  switch (kind) {
    case StepKind::Forward: return "forward";
    case StepKind::CopyBlock: return "copy_block";
    case StepKind::CopyStateSlot: return "copy_state_slot";
    case StepKind::LoadWeights: return "load_weights";
    case StepKind::Digest: return "digest";
    case StepKind::KeepAlive: return "keep_alive";
    case StepKind::Stop: return "stop";
    case StepKind::Draft: return "draft";
  }
  return "kind " + std::to_string(static_cast<int32_t>(kind));
}

namespace {
void write_batch(Writer& w, const model::PagedBatch& b) {
  w.list(b.tokens);
  w.list(b.positions);
  w.list(b.sequences);
  w.value<int64_t>(b.table_width);
  w.list(b.block_tables);
  w.list(b.state_slots);
  w.list(b.logit_rows);
  w.list(b.prompt_entries);
  w.list(b.snapshot_slots);
}

model::PagedBatch read_batch(Reader& r) {
  model::PagedBatch b;
  b.tokens = r.list<int32_t>("tokens");
  b.positions = r.list<int32_t>("positions");
  b.sequences = r.list<int32_t>("sequences");
  b.table_width = r.value<int64_t>("table_width");
  b.block_tables = r.list<int32_t>("block_tables");
  b.state_slots = r.list<int32_t>("state_slots");
  b.logit_rows = r.list<int64_t>("logit_rows");
  b.prompt_entries = r.list<int32_t>("prompt_entries");
  b.snapshot_slots = r.list<int32_t>("snapshot_slots");
  LOOM_CHECK(b.positions.size() == b.tokens.size() && b.sequences.size() == b.tokens.size(),
             "serving step message: tokens, positions and sequences differ in length");
  return b;
}
}  // namespace

std::string encode_step(const StepMessage& m) {
  Writer w;
  w.value<int32_t>(kVersion);
  w.value<int32_t>(static_cast<int32_t>(m.kind));
  if (m.kind == StepKind::Forward) {
    write_batch(w, m.batch);
  } else if (m.kind == StepKind::Draft) {
    w.value<int32_t>(m.draft.depth);
    write_batch(w, m.draft.rows);
    w.list(m.draft.hidden_rows);
    w.list(m.draft.retain_rows);
    w.list(m.draft.retain_states);
  } else if (m.kind == StepKind::CopyBlock || m.kind == StepKind::CopyStateSlot) {
    w.value<int32_t>(m.from);
    w.value<int32_t>(m.to);
  } else if (m.kind == StepKind::LoadWeights) {
    w.text(m.path);
  }
  return w.take();
}

StepMessage decode_step(const std::string& bytes) {
  Reader r(bytes);
  const auto version = r.value<int32_t>("version");
  LOOM_CHECK(version == kVersion, "serving step message: version " + std::to_string(version) + ", this loom reads " +
                                      std::to_string(kVersion) + " (every rank must run the same loom binary)");
  StepMessage m;
  const auto kind = r.value<int32_t>("kind");
  LOOM_CHECK(kind >= static_cast<int32_t>(StepKind::Forward) && kind <= static_cast<int32_t>(StepKind::Draft),
             "serving step message: unknown kind " + std::to_string(kind));
  m.kind = static_cast<StepKind>(kind);
  if (m.kind == StepKind::Forward) {
    m.batch = read_batch(r);
  } else if (m.kind == StepKind::Draft) {
    m.draft.depth = r.value<int32_t>("depth");
    m.draft.rows = read_batch(r);
    m.draft.hidden_rows = r.list<int32_t>("hidden_rows");
    m.draft.retain_rows = r.list<int32_t>("retain_rows");
    m.draft.retain_states = r.list<int32_t>("retain_states");
  } else if (m.kind == StepKind::CopyBlock || m.kind == StepKind::CopyStateSlot) {
    m.from = r.value<int32_t>("from");
    m.to = r.value<int32_t>("to");
  } else if (m.kind == StepKind::LoadWeights) {
    m.path = r.text("path");
  }
  r.finish();
  return m;
}

std::string encode_shards(const std::vector<ShardValues>& shards) {
  Writer w;
  w.value<int64_t>(static_cast<int64_t>(shards.size()));
  for (const ShardValues& s : shards) {
    w.value<int32_t>(s.parameter);
    std::vector<int64_t> flat;
    for (const auto& [start, length] : s.slice) flat.insert(flat.end(), {start, length});
    w.list(flat);
    w.list(s.values);
  }
  return w.take();
}

std::vector<ShardValues> decode_shards(const std::string& bytes) {
  Reader r(bytes);
  const auto count = r.value<int64_t>("shard count");
  LOOM_CHECK(count >= 0 && static_cast<uint64_t>(count) <= bytes.size(), "serving shard message: bad shard count");
  std::vector<ShardValues> shards(static_cast<size_t>(count));
  for (ShardValues& s : shards) {
    s.parameter = r.value<int32_t>("parameter");
    const std::vector<int64_t> flat = r.list<int64_t>("slice");
    LOOM_CHECK(flat.size() % 2 == 0, "serving shard message: a slice of odd length");
    for (size_t d = 0; d < flat.size(); d += 2) s.slice.emplace_back(flat[d], flat[d + 1]);
    s.values = r.list<float>("values");
  }
  r.finish();
  return shards;
}

}  // namespace loom::infer
