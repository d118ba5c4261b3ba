#include "loom/parallel/context/group_attention.h"

#include "loom/parallel/context/communication.h"

namespace loom::parallel {

void GroupAttention::gather_sequences(int32_t* whole, const int32_t* local, int64_t batch, int64_t seq) {
  parallel::gather_sequences(*cp_, local, whole, batch, seq);
}

void GroupAttention::rows_to_heads(float* whole, const float* rows, int64_t batch, int64_t seq, int64_t row_width,
                                   const std::vector<model::HeadColumns>& segments) {
  heads_.to_heads(whole, rows, batch, seq, row_width, segments);
}

void GroupAttention::heads_to_rows(float* rows, const float* whole, int64_t batch, int64_t seq, int64_t row_width,
                                   const std::vector<model::HeadColumns>& segments, bool accumulate) {
  heads_.to_rows(rows, whole, batch, seq, row_width, segments, accumulate);
}

}  // namespace loom::parallel
