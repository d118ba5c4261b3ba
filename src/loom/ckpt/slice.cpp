#include "loom/ckpt/slice.h"

#include <cstring>

#include "loom/core/error.h"

namespace loom::ckpt {

Slice full_slice(const Shape& shape) {
  Slice slice;
  slice.reserve(shape.size());
  for (int64_t d : shape) slice.emplace_back(0, d);
  return slice;
}

Shape slice_shape(const Slice& slice) {
  Shape shape;
  shape.reserve(slice.size());
  for (const auto& [start, length] : slice) shape.push_back(length);
  return shape;
}

int64_t slice_numel(const Slice& slice) { return shape_numel(slice_shape(slice)); }

std::string slice_string(const Slice& slice) {
  std::string s = "[";
  for (size_t i = 0; i < slice.size(); ++i) {
    s += (i ? ", " : "") + std::to_string(slice[i].first) + ":" +
         std::to_string(slice[i].first + slice[i].second);
  }
  return s + "]";
}

void check_slice(const Slice& slice, const Shape& shape, const std::string& what) {
  LOOM_CHECK(slice.size() == shape.size(), what + ": slice " + slice_string(slice) + " has " +
                                          std::to_string(slice.size()) + " dims, the tensor shape " +
                                          shape_string(shape) + " has " + std::to_string(shape.size()));
  for (size_t i = 0; i < slice.size(); ++i) {
    const auto& [start, length] = slice[i];
    LOOM_CHECK(start >= 0 && length >= 0 && shape[i] >= 0 && start <= shape[i] && length <= shape[i] - start,
          what + ": slice " + slice_string(slice) + " does not lie inside shape " + shape_string(shape) +
              " (dim " + std::to_string(i) + ")");
  }
}

bool intersect_slices(const Slice& a, const Slice& b, Slice* out) {
  if (a.size() != b.size()) return false;
  Slice r(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    int64_t lo = std::max(a[i].first, b[i].first);
    int64_t hi = std::min(a[i].first + a[i].second, b[i].first + b[i].second);
    if (hi <= lo) return false;
    r[i] = {lo, hi - lo};
  }
  if (out != nullptr) *out = std::move(r);
  return true;
}

bool slices_overlap(const Slice& a, const Slice& b) { return intersect_slices(a, b, nullptr); }

void copy_region(const void* src, const Slice& src_slice, void* dst, const Slice& dst_slice,
                 const Slice& region, size_t element_size) {
  const size_t n = region.size();
  if (slice_numel(region) == 0) return;
  if (n == 0) {  // a scalar: one element
    std::memcpy(dst, src, element_size);
    return;
  }
  // Row-major element strides of both buffers, and where the region starts in each.
  std::vector<int64_t> src_stride(n), dst_stride(n);
  int64_t ss = 1, ds = 1;
  for (size_t i = n; i-- > 0;) {
    src_stride[i] = ss;
    dst_stride[i] = ds;
    ss *= src_slice[i].second;
    ds *= dst_slice[i].second;
  }
  int64_t src_base = 0, dst_base = 0;
  for (size_t i = 0; i < n; ++i) {
    src_base += (region[i].first - src_slice[i].first) * src_stride[i];
    dst_base += (region[i].first - dst_slice[i].first) * dst_stride[i];
  }
  const auto* s = static_cast<const unsigned char*>(src);
  auto* d = static_cast<unsigned char*>(dst);
  const size_t run = static_cast<size_t>(region[n - 1].second) * element_size;
  // Odometer over the outer n-1 dims; the innermost dim is one contiguous run in both buffers.
  std::vector<int64_t> index(n, 0);
  while (true) {
    int64_t so = src_base, dof = dst_base;
    for (size_t i = 0; i + 1 < n; ++i) {
      so += index[i] * src_stride[i];
      dof += index[i] * dst_stride[i];
    }
    std::memcpy(d + static_cast<size_t>(dof) * element_size, s + static_cast<size_t>(so) * element_size, run);
    size_t dim = n - 1;
    while (dim-- > 0) {
      if (++index[dim] < region[dim].second) break;
      index[dim] = 0;
    }
    if (dim == static_cast<size_t>(-1)) return;
  }
}

namespace {

// Appends the rectangles covering row-major elements [begin, end) of the sub-tensor spanned by
// dims [dim, ndim) of `shape`, with the outer dims fixed by `prefix`.
void flat_range_rec(const Shape& shape, size_t dim, Slice& prefix, int64_t begin, int64_t end,
                    std::vector<Slice>& out) {
  if (begin >= end) return;
  auto emit = [&](int64_t row_start, int64_t rows) {
    Slice s = prefix;
    s.emplace_back(row_start, rows);
    for (size_t i = dim + 1; i < shape.size(); ++i) s.emplace_back(0, shape[i]);
    out.push_back(std::move(s));
  };
  if (dim == shape.size()) {  // a single element
    out.push_back(prefix);
    return;
  }
  int64_t inner = 1;
  for (size_t i = dim + 1; i < shape.size(); ++i) inner *= shape[i];
  auto into_row = [&](int64_t row, int64_t b, int64_t e) {
    prefix.emplace_back(row, 1);
    flat_range_rec(shape, dim + 1, prefix, b, e, out);
    prefix.pop_back();
  };
  int64_t first_row = begin / inner, last_row = (end - 1) / inner;
  if (first_row == last_row && (begin % inner != 0 || end % inner != 0)) {
    into_row(first_row, begin - first_row * inner, end - first_row * inner);
    return;
  }
  int64_t full_begin = first_row, full_end = end / inner;
  if (begin % inner != 0) {
    into_row(first_row, begin % inner, inner);
    full_begin = first_row + 1;
  }
  if (full_end > full_begin) emit(full_begin, full_end - full_begin);
  if (end % inner != 0) into_row(full_end, 0, end % inner);
}

}  // namespace

std::vector<Slice> flat_range_slices(const Shape& shape, int64_t begin, int64_t count) {
  int64_t numel = shape_numel(shape);
  LOOM_CHECK(begin >= 0 && count >= 0 && begin <= numel && count <= numel - begin,
        "flat range [" + std::to_string(begin) + ", " + std::to_string(begin + count) +
            ") does not lie inside a tensor of shape " + shape_string(shape) + " (" + std::to_string(numel) +
            " elements)");
  std::vector<Slice> out;
  Slice prefix;
  flat_range_rec(shape, 0, prefix, begin, begin + count, out);
  return out;
}

}  // namespace loom::ckpt
