// The messages rank 0 of a served model sends its MPI follower ranks: every field survives the
// round trip, and a truncated, padded or foreign message is an Error naming what is wrong.
#include <gtest/gtest.h>

#include <string>

#include "loom/core/error.h"
#include "loom/infer/step_message.h"

namespace loom::infer {
namespace {

StepMessage forward_step() {
  StepMessage m;
  m.kind = StepKind::Forward;
  m.batch.tokens = {5, 6, 7, 9};
  m.batch.positions = {0, 1, 2, 17};
  m.batch.sequences = {0, 0, 0, 1};
  m.batch.table_width = 5;
  m.batch.block_tables = {1, 0, 0, 0, 0, 2, 3, 4, 8, 9};
  m.batch.state_slots = {3, -1};
  m.batch.logit_rows = {2, 3};
  m.batch.prompt_entries = {1};
  m.batch.snapshot_slots = {-1, -1, -1, 12};
  return m;
}

void expect_error_containing(const std::string& bytes, const std::string& part) {
  try {
    decode_step(bytes);
    ADD_FAILURE() << "no error, expected one naming '" << part << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(StepMessage, ForwardRoundTrips) {
  const StepMessage m = forward_step();
  const StepMessage back = decode_step(encode_step(m));
  EXPECT_EQ(back.kind, StepKind::Forward);
  EXPECT_EQ(back.batch.tokens, m.batch.tokens);
  EXPECT_EQ(back.batch.positions, m.batch.positions);
  EXPECT_EQ(back.batch.sequences, m.batch.sequences);
  EXPECT_EQ(back.batch.table_width, 5);
  EXPECT_EQ(back.batch.block_tables, m.batch.block_tables);
  EXPECT_EQ(back.batch.state_slots, m.batch.state_slots);
  EXPECT_EQ(back.batch.logit_rows, m.batch.logit_rows);
  EXPECT_EQ(back.batch.prompt_entries, m.batch.prompt_entries);
  EXPECT_EQ(back.batch.snapshot_slots, m.batch.snapshot_slots);
}

TEST(StepMessage, DraftRoundTrips) {
  StepMessage m;
  m.kind = StepKind::Draft;
  m.draft.depth = 2;
  m.draft.rows = forward_step().batch;
  m.draft.hidden_rows = {4, 5, -3, 0};
  m.draft.retain_rows = {3};
  m.draft.retain_states = {7};
  const StepMessage back = decode_step(encode_step(m));
  EXPECT_EQ(back.kind, StepKind::Draft);
  EXPECT_EQ(back.draft.depth, 2);
  EXPECT_EQ(back.draft.rows.tokens, m.draft.rows.tokens);
  EXPECT_EQ(back.draft.rows.block_tables, m.draft.rows.block_tables);
  EXPECT_EQ(back.draft.rows.logit_rows, m.draft.rows.logit_rows);
  EXPECT_EQ(back.draft.hidden_rows, m.draft.hidden_rows);
  EXPECT_EQ(back.draft.retain_rows, m.draft.retain_rows);
  EXPECT_EQ(back.draft.retain_states, m.draft.retain_states);
  EXPECT_THROW(decode_step(encode_step(m).substr(0, encode_step(m).size() - 2)), Error);
}

TEST(StepMessage, OtherKindsRoundTrip) {
  StepMessage copy;
  copy.kind = StepKind::CopyStateSlot;
  copy.from = 7;
  copy.to = 2;
  const StepMessage c = decode_step(encode_step(copy));
  EXPECT_EQ(c.kind, StepKind::CopyStateSlot);
  EXPECT_EQ(c.from, 7);
  EXPECT_EQ(c.to, 2);
  StepMessage load;
  load.kind = StepKind::LoadWeights;
  load.path = "/runs/a b/checkpoints/step-00000030";
  EXPECT_EQ(decode_step(encode_step(load)).path, load.path);
  for (StepKind kind : {StepKind::Digest, StepKind::KeepAlive, StepKind::Stop}) {
    StepMessage m;
    m.kind = kind;
    EXPECT_EQ(decode_step(encode_step(m)).kind, kind) << step_kind_name(kind);
  }
}

TEST(StepMessage, BadBytesAreErrors) {
  const std::string bytes = encode_step(forward_step());
  for (size_t cut : {size_t{0}, size_t{3}, size_t{8}, bytes.size() - 1}) {
    EXPECT_THROW(decode_step(bytes.substr(0, cut)), Error) << "cut at " << cut;
  }
  expect_error_containing(bytes.substr(0, 3), "truncated in field 'version'");
  expect_error_containing(bytes.substr(0, bytes.size() - 4), "field 'snapshot_slots' claims 4 elements");
  expect_error_containing(bytes + "x", "left over");
  std::string other_version = bytes;
  other_version[0] = 9;
  expect_error_containing(other_version, "version 9");
  std::string unknown_kind = bytes;
  unknown_kind[4] = 42;
  expect_error_containing(unknown_kind, "unknown kind 42");
  std::string huge = bytes;
  huge[8 + 7] = 0x7f;  // the token count's high byte
  expect_error_containing(huge, "field 'tokens' claims");
}

TEST(StepMessage, ShardsRoundTrip) {
  const std::vector<ShardValues> shards = {{3, {{0, 2}, {4, 4}}, {1.5f, -2.0f, 0.25f, 8.0f, 1e-8f, 3.0f, 4.0f, 5.0f}},
                                           {0, {{16, 16}}, {}}};
  const std::vector<ShardValues> back = decode_shards(encode_shards(shards));
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].parameter, 3);
  EXPECT_EQ(back[0].slice, shards[0].slice);
  EXPECT_EQ(back[0].values, shards[0].values);
  EXPECT_EQ(back[1].slice, shards[1].slice);
  EXPECT_TRUE(back[1].values.empty());
  EXPECT_THROW(decode_shards(encode_shards(shards).substr(0, 20)), Error);
}

}  // namespace
}  // namespace loom::infer
