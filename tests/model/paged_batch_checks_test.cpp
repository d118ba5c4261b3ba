// A paged step's block tables are checked on the host before any kernel reads through them
// (Transformer::forward_paged): a row naming a table entry that is not there, a position past its
// table's width, or a block id outside the cache is an Error naming it, where the kernels would
// read outside the pools (on a GPU an illegal address, which ends the CUDA context).
#include <gtest/gtest.h>

#include <string>

#include "loom/core/error.h"
#include "loom/model/transformer.h"

namespace loom::model {
namespace {

config::ModelConfig tiny_llama() {
  config::ModelConfig c;
  c.vocab_size = 19;
  c.d_model = 16;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn_size = 24;
  c.norm = config::Norm::Rms;
  c.activation = config::Activation::Swiglu;
  c.positions = config::Positions::Rope;
  c.tied_embeddings = false;
  c.max_seq_len = 16;
  return c;
}

// One row at position 5 (its keys in blocks 0 and 1 of 4 tokens each), one table entry 2 wide.
PagedBatch one_row(std::vector<int32_t> table, int32_t entry = 0) {
  PagedBatch b;
  b.tokens = {3};
  b.positions = {5};
  b.sequences = {entry};
  b.block_tables = std::move(table);
  b.table_width = 2;
  b.logit_rows = {0};
  return b;
}

std::string error_of(Transformer& model, const PagedBatch& batch, PagedKVCache& cache) {
  PagedScratch scratch;
  try {
    model.forward_paged(batch, cache, scratch);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(PagedBatchChecks, BadTableEntriesAndBlockIdsAreErrorsNamingThem) {
  Transformer model(tiny_llama());
  PagedKVCache cache = model.make_paged_cache(4, 4);
  EXPECT_EQ(error_of(model, one_row({2, 3}), cache), "");  // inside: runs
  EXPECT_NE(error_of(model, one_row({2, 9}), cache).find("names block 9 of a cache of 4"), std::string::npos);
  EXPECT_NE(error_of(model, one_row({-1, 3}), cache).find("names block -1"), std::string::npos);
  EXPECT_NE(error_of(model, one_row({2, 3}, 1), cache).find("row 0 names table entry 1 of 1"), std::string::npos);
  PagedBatch narrow = one_row({2});
  narrow.table_width = 1;
  EXPECT_NE(error_of(model, narrow, cache).find("needs block 1 of a table 1 wide"), std::string::npos);
}

}  // namespace
}  // namespace loom::model
