// Layout op definitions: flip, repeat, diagonal, as_strided. Every output is a new contiguous
// tensor of the input's dtype (every Kiln dtype; kernels copy elements). Rules in layout.h.
#include "ir/ops/layout.h"

#include <string>

#include "ir/op_registry.h"

namespace kiln {
namespace {

namespace sr = shape_rules;
using Types = Result<std::vector<TensorType>>;

Error invalid(std::string msg) { return Error(ErrorCode::InvalidArgument, std::move(msg)); }

Types from_view(DType dtype, Result<sr::StridedView> v) {
  if (!v.ok()) return v.error();
  return std::vector<TensorType>{{dtype, std::move(v->sizes)}};
}

AttrSpec required(const char* name, AttrKind kind) { return {name, kind, {}, true, false}; }

}  // namespace

Result<sr::StridedView> flip_view(const std::vector<int64_t>& sizes, const std::vector<int64_t>& dims) {
  const auto rank = static_cast<int64_t>(sizes.size());
  auto mask = sr::reduction_mask(dims.empty() ? std::optional<std::vector<int64_t>>(std::vector<int64_t>{})
                                              : std::optional<std::vector<int64_t>>(dims),
                                 rank, "dims");
  if (!mask.ok()) return mask.error();
  sr::StridedView v{sizes, sr::contiguous_strides(sizes), 0};
  if (dims.empty()) return v;  // flip with no dims is a copy
  for (int64_t d = 0; d < rank; ++d) {
    const auto k = static_cast<size_t>(d);
    if (!(*mask)[k] || sizes[k] == 0) continue;
    v.offset += (sizes[k] - 1) * v.strides[k];
    v.strides[k] = -v.strides[k];
  }
  return v;
}

Result<sr::StridedView> diagonal_view(const std::vector<int64_t>& sizes, int64_t offset, int64_t dim1, int64_t dim2) {
  const auto rank = static_cast<int64_t>(sizes.size());
  if (rank < 2) return invalid("self: diagonal needs a tensor of rank >= 2, got rank " + std::to_string(rank));
  auto d1 = wrap_dim(dim1, rank);
  if (!d1.ok()) return invalid("dim1: " + d1.error().message());
  auto d2 = wrap_dim(dim2, rank);
  if (!d2.ok()) return invalid("dim2: " + d2.error().message());
  if (*d1 == *d2) return invalid("dim1 and dim2 cannot be identical (both " + std::to_string(*d1) + ")");
  const std::vector<int64_t> strides = sr::contiguous_strides(sizes);
  const int64_t s1 = sizes[static_cast<size_t>(*d1)], s2 = sizes[static_cast<size_t>(*d2)];
  int64_t len = 0, start = 0;
  // The start is only computed for a non-empty diagonal (|offset| < the dim's size), where the
  // product stays within the tensor; an offset beyond it (up to +-2^63) gives len 0, no overflow.
  if (offset >= 0) {
    len = std::max<int64_t>(0, std::min(s1, s2 - offset));
    if (len > 0) start = offset * strides[static_cast<size_t>(*d2)];
  } else {
    len = std::max<int64_t>(0, std::min(s1 + offset, s2));
    if (len > 0) start = -offset * strides[static_cast<size_t>(*d1)];
  }
  sr::StridedView v;
  for (int64_t d = 0; d < rank; ++d) {
    if (d == *d1 || d == *d2) continue;
    v.sizes.push_back(sizes[static_cast<size_t>(d)]);
    v.strides.push_back(strides[static_cast<size_t>(d)]);
  }
  v.sizes.push_back(len);
  v.strides.push_back(strides[static_cast<size_t>(*d1)] + strides[static_cast<size_t>(*d2)]);
  v.offset = len == 0 ? 0 : start;
  return v;
}

Result<sr::StridedView> as_strided_view(int64_t numel, const std::vector<int64_t>& size,
                                        const std::vector<int64_t>& stride, std::optional<int64_t> storage_offset) {
  if (size.size() != stride.size()) {
    return invalid("stride: has " + std::to_string(stride.size()) + " entries but size has " +
                   std::to_string(size.size()));
  }
  auto n = sr::checked_numel(size);
  if (!n.ok()) return invalid("size: " + n.error().message());
  const int64_t off = storage_offset.value_or(0);
  if (off < 0) return invalid("storage_offset: must be >= 0, got " + std::to_string(off));
  int64_t last = off;  // the largest element index the view names
  for (size_t d = 0; d < size.size(); ++d) {
    if (stride[d] < 0) return invalid("stride: negative strides are not supported, got " + sizes_to_string(stride));
  }
  if (*n > 0) {
    for (size_t d = 0; d < size.size(); ++d) {
      if (stride[d] != 0 && size[d] - 1 > ((int64_t{1} << 62) - last) / stride[d]) {
        return invalid("the view " + sizes_to_string(size) + " with strides " + sizes_to_string(stride) + " is too large");
      }
      last += (size[d] - 1) * stride[d];
    }
    if (last >= numel) {
      return invalid("the view (size " + sizes_to_string(size) + ", stride " + sizes_to_string(stride) +
                     ", storage_offset " + std::to_string(off) + ") reaches element " + std::to_string(last) +
                     ", outside the input's " + std::to_string(numel) + " elements");
    }
  }
  return sr::StridedView{size, stride, *n > 0 ? off : 0};
}

Result<std::vector<int64_t>> repeat_sizes(const std::vector<int64_t>& sizes, const std::vector<int64_t>& repeats) {
  if (repeats.size() < sizes.size()) {
    return invalid("repeats: number of repeat dims (" + std::to_string(repeats.size()) +
                   ") can not be smaller than the number of dims of the tensor (" + std::to_string(sizes.size()) + ")");
  }
  const size_t pad = repeats.size() - sizes.size();
  std::vector<int64_t> out(repeats.size());
  for (size_t i = 0; i < repeats.size(); ++i) {
    if (repeats[i] < 0) return invalid("repeats: must be >= 0, got " + sizes_to_string(repeats));
    out[i] = repeats[i] * (i < pad ? 1 : sizes[i - pad]);
  }
  auto n = sr::checked_numel(out);
  if (!n.ok()) return invalid("repeats: " + n.error().message());
  return out;
}

void register_layout_ops(OpRegistry& r) {
  r.add({"aten.flip", {{"self"}}, {required("dims", AttrKind::Ints)}, 1,
         [](InputTypes in, const Attributes& a) { return from_view(in[0]->dtype, flip_view(in[0]->sizes, a.get_ints("dims"))); },
         "self reversed along each of dims (torch.flip)"});
  r.add({"aten.repeat", {{"self"}}, {required("repeats", AttrKind::Ints)}, 1,
         [](InputTypes in, const Attributes& a) -> Types {
           auto s = repeat_sizes(in[0]->sizes, a.get_ints("repeats"));
           if (!s.ok()) return s.error();
           return std::vector<TensorType>{{in[0]->dtype, *s}};
         },
         "self tiled repeats[i] times along dim i (leading dims added) (torch.Tensor.repeat)"});
  r.add({"aten.diagonal", {{"self"}},
         {{"offset", AttrKind::Int, int64_t{0}}, {"dim1", AttrKind::Int, int64_t{0}}, {"dim2", AttrKind::Int, int64_t{1}}},
         1,
         [](InputTypes in, const Attributes& a) {
           return from_view(in[0]->dtype, diagonal_view(in[0]->sizes, a.get_int("offset"), a.get_int("dim1"),
                                                        a.get_int("dim2")));
         },
         "a copy of the diagonal of dims dim1, dim2 (shifted by offset), appended as the last dim (torch.diagonal)"});
  r.add({"aten.as_strided", {{"self"}},
         {required("size", AttrKind::Ints), required("stride", AttrKind::Ints),
          {"storage_offset", AttrKind::Int, {}, false, true}},
         1,
         [](InputTypes in, const Attributes& a) {
           std::optional<int64_t> off;
           if (!a.is_none("storage_offset")) off = a.get_int("storage_offset");
           return from_view(in[0]->dtype, as_strided_view(in[0]->numel(), a.get_ints("size"), a.get_ints("stride"), off));
         },
         "a copy of the view element i = self.flatten()[storage_offset + sum i_d * stride[d]]; views reaching "
         "outside self's elements are InvalidArgument (torch.as_strided on a contiguous input)"});
}

}  // namespace kiln
