// Shape rules shared by shape/reduction inference and kernels (see shape_rules.h).
#include "ir/ops/shape_rules.h"

#include <string>

#include "ir/op_registry.h"
#include "kiln/tensor.h"

namespace kiln::shape_rules {
namespace {

constexpr int64_t kMaxNumel = int64_t{1} << 62;

Error invalid(std::string msg) { return Error(ErrorCode::InvalidArgument, std::move(msg)); }

// wrap_dim with the attribute named in the message.
Result<int64_t> wrap(int64_t dim, int64_t rank, const char* what) {
  auto d = wrap_dim(dim, rank);
  if (!d.ok()) return invalid(std::string(what) + ": " + d.error().message());
  return d;
}

}  // namespace

Result<int64_t> checked_numel(const std::vector<int64_t>& sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) {
    if (s < 0) return invalid("negative size in " + sizes_to_string(sizes));
    if (s != 0 && n > kMaxNumel / s) return invalid("size " + sizes_to_string(sizes) + " is too large");
    n *= s;
  }
  return n;
}

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> strides(sizes.size());
  int64_t s = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    strides[i] = s;
    s *= sizes[i];
  }
  return strides;
}

Result<std::vector<bool>> reduction_mask(const std::optional<std::vector<int64_t>>& dims, int64_t rank,
                                         const char* what) {
  std::vector<bool> mask(static_cast<size_t>(rank), false);
  if (!dims || dims->empty()) {
    mask.assign(static_cast<size_t>(rank), true);
    return mask;
  }
  std::vector<bool> seen(static_cast<size_t>(rank == 0 ? 1 : rank), false);
  for (int64_t d : *dims) {
    auto w = wrap(d, rank, what);
    if (!w.ok()) return w.error();
    if (seen[static_cast<size_t>(*w)]) {
      return invalid(std::string(what) + ": dim " + std::to_string(*w) + " appears multiple times in the list of dims");
    }
    seen[static_cast<size_t>(*w)] = true;
    if (rank > 0) mask[static_cast<size_t>(*w)] = true;
  }
  return mask;
}

std::vector<int64_t> reduced_sizes(const std::vector<int64_t>& sizes, const std::vector<bool>& mask, bool keepdim) {
  std::vector<int64_t> out;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (!mask[d]) {
      out.push_back(sizes[d]);
    } else if (keepdim) {
      out.push_back(1);
    }
  }
  return out;
}

Result<StridedView> permute_view(const std::vector<int64_t>& sizes, const std::vector<int64_t>& dims) {
  const auto rank = static_cast<int64_t>(sizes.size());
  if (static_cast<int64_t>(dims.size()) != rank) {
    return invalid("dims: number of dims (" + std::to_string(dims.size()) + ") does not match the input rank (" +
                   std::to_string(rank) + ")");
  }
  const std::vector<int64_t> in_strides = contiguous_strides(sizes);
  StridedView v;
  std::vector<bool> seen(sizes.size(), false);
  for (int64_t d : dims) {
    auto w = wrap(d, rank, "dims");
    if (!w.ok()) return w.error();
    const auto k = static_cast<size_t>(*w);
    if (seen[k]) return invalid("dims: dim " + std::to_string(*w) + " is repeated in " + sizes_to_string(dims));
    seen[k] = true;
    v.sizes.push_back(sizes[k]);
    v.strides.push_back(in_strides[k]);
  }
  return v;
}

Result<StridedView> transpose_view(const std::vector<int64_t>& sizes, int64_t dim0, int64_t dim1) {
  const auto rank = static_cast<int64_t>(sizes.size());
  auto d0 = wrap(dim0, rank, "dim0");
  if (!d0.ok()) return d0.error();
  auto d1 = wrap(dim1, rank, "dim1");
  if (!d1.ok()) return d1.error();
  StridedView v{sizes, contiguous_strides(sizes), 0};
  if (rank > 0) {
    std::swap(v.sizes[static_cast<size_t>(*d0)], v.sizes[static_cast<size_t>(*d1)]);
    std::swap(v.strides[static_cast<size_t>(*d0)], v.strides[static_cast<size_t>(*d1)]);
  }
  return v;
}

Result<StridedView> expand_view(const std::vector<int64_t>& sizes, const std::vector<int64_t>& size) {
  const size_t rank = sizes.size();
  const size_t n = size.size();
  if (n < rank) {
    return invalid("size: the number of sizes provided (" + std::to_string(n) +
                   ") must be greater or equal to the number of dimensions in the tensor (" + std::to_string(rank) + ")");
  }
  const std::vector<int64_t> in_strides = contiguous_strides(sizes);
  StridedView v;
  v.sizes.resize(n);
  v.strides.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const int64_t want = size[i];
    if (i < n - rank) {  // new leading dim
      if (want < 0) {
        return invalid("size: the expanded size " + std::to_string(want) +
                       " isn't allowed in a leading, non-existing dimension " + std::to_string(i));
      }
      v.sizes[i] = want;
      continue;
    }
    const size_t k = i - (n - rank);
    if (want == -1) {
      v.sizes[i] = sizes[k];
    } else if (want < 0) {
      return invalid("size: invalid expanded size " + std::to_string(want) + " at dimension " + std::to_string(i));
    } else if (sizes[k] == want) {
      v.sizes[i] = want;
    } else if (sizes[k] == 1) {
      v.sizes[i] = want;
      continue;  // broadcast: stride 0
    } else {
      return invalid("size: the expanded size " + std::to_string(want) + " must match the existing size " +
                     std::to_string(sizes[k]) + " at non-singleton dimension " + std::to_string(i) + " (input " +
                     sizes_to_string(sizes) + ", size " + sizes_to_string(size) + ")");
    }
    v.strides[i] = in_strides[k];
  }
  auto numel = checked_numel(v.sizes);
  if (!numel.ok()) return invalid("size: " + numel.error().message());
  return v;
}

Result<StridedView> slice_view(const std::vector<int64_t>& sizes, int64_t dim, std::optional<int64_t> start,
                               std::optional<int64_t> end, int64_t step) {
  const auto rank = static_cast<int64_t>(sizes.size());
  if (rank == 0) return invalid("slice cannot be applied to a 0-dim tensor");
  auto d = wrap(dim, rank, "dim");
  if (!d.ok()) return d.error();
  if (step <= 0) return invalid("step: slice step must be positive, got " + std::to_string(step));
  const auto k = static_cast<size_t>(*d);
  const int64_t n = sizes[k];
  int64_t s = start.value_or(0);
  int64_t e = end.value_or(INT64_MAX);
  if (s < 0) s += n;  // n >= 0 and s < 0: no overflow
  if (e < 0) e += n;
  if (s < 0) {
    s = 0;
  } else if (s >= n) {
    s = n;
  }
  if (e < s) {
    e = s;
  } else if (e >= n) {
    e = n;
  }
  const int64_t len = e == s ? 0 : (e - s - 1) / step + 1;  // no overflow for huge steps
  StridedView v{sizes, contiguous_strides(sizes), 0};
  v.offset = len == 0 ? 0 : s * v.strides[k];
  v.sizes[k] = len;
  if (len > 1) v.strides[k] *= step;  // len >= 2 only when step < n: cannot overflow
  return v;
}

Result<StridedView> select_view(const std::vector<int64_t>& sizes, int64_t dim, int64_t index) {
  const auto rank = static_cast<int64_t>(sizes.size());
  if (rank == 0) return invalid("select cannot be applied to a 0-dim tensor");
  auto d = wrap(dim, rank, "dim");
  if (!d.ok()) return d.error();
  const auto k = static_cast<size_t>(*d);
  const int64_t n = sizes[k];
  if (index < -n || index >= n) {
    return invalid("index: " + std::to_string(index) + " out of range for dimension " + std::to_string(*d) +
                   " of size " + std::to_string(n));
  }
  const int64_t i = index < 0 ? index + n : index;
  StridedView v{sizes, contiguous_strides(sizes), 0};
  v.offset = i * v.strides[k];
  v.sizes.erase(v.sizes.begin() + *d);
  v.strides.erase(v.strides.begin() + *d);
  return v;
}

Result<std::vector<int64_t>> view_sizes(int64_t numel, const std::vector<int64_t>& size) {
  int64_t infer_at = -1;
  int64_t known = 1;
  for (size_t i = 0; i < size.size(); ++i) {
    if (size[i] == -1) {
      if (infer_at >= 0) return invalid("size: only one dimension can be inferred (-1), got " + sizes_to_string(size));
      infer_at = static_cast<int64_t>(i);
    } else if (size[i] < 0) {
      return invalid("size: invalid shape dimension " + std::to_string(size[i]) + " in " + sizes_to_string(size));
    } else {
      if (size[i] != 0 && known > kMaxNumel / size[i]) return invalid("size " + sizes_to_string(size) + " is too large");
      known *= size[i];
    }
  }
  std::vector<int64_t> out = size;
  if (infer_at < 0) {
    if (known != numel) {
      return invalid("shape " + sizes_to_string(size) + " is invalid for input of size " + std::to_string(numel) +
                     " (numel mismatch: " + std::to_string(known) + " elements)");
    }
    return out;
  }
  if (known == 0) {
    if (numel == 0) {
      return invalid("cannot reshape a tensor of 0 elements into shape " + sizes_to_string(size) +
                     " because the unspecified dimension size -1 can be any value and is ambiguous");
    }
    return invalid("shape " + sizes_to_string(size) + " is invalid for input of size " + std::to_string(numel) +
                   " (numel mismatch)");
  }
  if (numel % known != 0) {
    return invalid("shape " + sizes_to_string(size) + " is invalid for input of size " + std::to_string(numel) +
                   " (numel mismatch: not divisible by " + std::to_string(known) + ")");
  }
  out[static_cast<size_t>(infer_at)] = numel / known;
  return out;
}

Result<std::vector<int64_t>> squeeze_sizes(const std::vector<int64_t>& sizes,
                                           const std::optional<std::vector<int64_t>>& dims) {
  const auto rank = static_cast<int64_t>(sizes.size());
  std::vector<bool> drop(sizes.size(), false);
  if (!dims) {
    for (size_t d = 0; d < sizes.size(); ++d) drop[d] = sizes[d] == 1;
  } else {
    std::vector<bool> seen(static_cast<size_t>(rank == 0 ? 1 : rank), false);
    for (int64_t d : *dims) {
      auto w = wrap(d, rank, "dim");
      if (!w.ok()) return w.error();
      const auto k = static_cast<size_t>(*w);
      if (seen[k]) return invalid("dim: dim " + std::to_string(*w) + " appears multiple times in the list of dims");
      seen[k] = true;
      if (rank > 0 && sizes[k] == 1) drop[k] = true;
    }
  }
  std::vector<int64_t> out;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (!drop[d]) out.push_back(sizes[d]);
  }
  return out;
}

Result<std::vector<int64_t>> unsqueeze_sizes(const std::vector<int64_t>& sizes, int64_t dim) {
  auto w = wrap(dim, static_cast<int64_t>(sizes.size()) + 1, "dim");
  if (!w.ok()) return w.error();
  std::vector<int64_t> out = sizes;
  out.insert(out.begin() + *w, 1);
  return out;
}

Result<PadPlan> constant_pad_plan(const std::vector<int64_t>& sizes, const std::vector<int64_t>& pad) {
  const size_t rank = sizes.size();
  if (pad.size() % 2 != 0) return invalid("pad: length must be even (pairs of before/after), got " + std::to_string(pad.size()));
  if (pad.size() / 2 > rank) {
    return invalid("pad: length " + std::to_string(pad.size()) + " is too large for an input of rank " +
                   std::to_string(rank) + " (at most " + std::to_string(2 * rank) + ")");
  }
  PadPlan p{std::vector<int64_t>(rank, 0), sizes};
  for (size_t i = 0; i < pad.size() / 2; ++i) {
    const size_t d = rank - 1 - i;
    const int64_t before = pad[2 * i];
    const int64_t after = pad[2 * i + 1];
    // torch narrows by each negative pad first (aten/src/ATen/native/PadNd.cpp), so the crops
    // together may not exceed the size, even where positive padding on the other side would.
    const int64_t size = sizes[d];
    if (before < -size || after < -size ||
        (before < 0 ? -before : 0) + (after < 0 ? -after : 0) > size) {
      return invalid("pad: the negative padding (" + std::to_string(before) + ", " + std::to_string(after) +
                     ") of dim " + std::to_string(d) + " would crop more than its size " + std::to_string(size));
    }
    int64_t n = 0;
    if (__builtin_add_overflow(size, before, &n) || __builtin_add_overflow(n, after, &n) || n > kMaxNumel) {
      return invalid("pad: padding (" + std::to_string(before) + ", " + std::to_string(after) + ") of dim " +
                     std::to_string(d) + " is too large");
    }
    p.before[d] = before;
    p.out_sizes[d] = n;
  }
  auto numel = checked_numel(p.out_sizes);
  if (!numel.ok()) return invalid("pad: " + numel.error().message());
  return p;
}

}  // namespace kiln::shape_rules
