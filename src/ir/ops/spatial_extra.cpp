// Spatial op definitions beyond conv/pool2d/upsample: reflection and replication padding (1-3-D),
// 3-D pooling (avg_pool3d, max_pool3d_with_indices, _adaptive_avg_pool3d), grid_sampler_2d,
// col2im, _cdist_forward and _pdist_forward. Argument names, defaults and checks are ATen's
// (aten/src/ATen/native/native_functions.yaml; Padding.h, Pool.h, GridSampler.cpp, Col2Im.cpp,
// Distance.cpp).
#include "ir/ops/spatial_extra.h"

#include <cmath>
#include <string>

#include "ir/op_registry.h"
#include "ir/ops/pool.h"
#include "ir/ops/spatial.h"

namespace kiln {
namespace {

using Types = std::vector<TensorType>;

Error invalid(std::string msg) { return Error(ErrorCode::InvalidArgument, std::move(msg)); }

Error require_f32(const TensorType& t, const char* what) {
  if (t.dtype != DType::Float32) {
    return Error(ErrorCode::NotSupported,
                 std::string(what) + ": dtype " + dtype_name(t.dtype) + " is not supported (float32 only)");
  }
  return {};
}

/// An input of rank n + 1 (no batch) or n + 2 (batch first) whose dims, but the batch dim, are all
/// non-zero (PyTorch padding::check_valid_input and the pool shape checks).
Error check_spatial_input(const TensorType& self, int n, const char* layout) {
  const int64_t r = self.dim();
  if (r != n + 1 && r != n + 2) {
    return invalid(std::string("expected a ") + std::to_string(n + 1) + "-D or " + std::to_string(n + 2) +
                   "-D (batch mode) input " + layout + ", got size " + sizes_to_string(self.sizes));
  }
  for (int64_t i = r == n + 2 ? 1 : 0; i < r; ++i) {
    if (self.sizes[i] == 0) {
      return invalid("expected non-zero sizes for every dim but the batch dim, got input of size " +
                     sizes_to_string(self.sizes));
    }
  }
  return {};
}

Result<std::vector<int64_t>> int_list(const Attributes& attrs, const char* name, size_t n, int64_t min_value) {
  std::vector<int64_t> v = attrs.get_ints(name);
  if (v.size() != n) {
    return invalid(std::string(name) + " must have " + std::to_string(n) + " values, got " + name + "=" +
                   attr_to_string(AttrValue{v}));
  }
  for (int64_t x : v) {
    if (x < min_value || x > kMaxSpatialParam) {
      return invalid(std::string(name) + " values must be in [" + std::to_string(min_value) + ", 2^31), got " +
                     name + "=" + attr_to_string(AttrValue{v}));
    }
  }
  return v;
}

/// InvalidArgument unless the product of `sizes` is at most kMaxSpatialSize elements (sizes made
/// from several inputs or attributes, e.g. P * R distances, must not overflow planning).
Error check_total(const std::vector<int64_t>& sizes, const char* what) {
  __int128 total = 1;
  for (int64_t v : sizes) {
    total *= v;
    if (total > kMaxSpatialSize) return invalid(std::string(what) + " " + sizes_to_string(sizes) + " is too large");
    if (total == 0) break;
  }
  return {};
}

// ---- padding

Result<Types> infer_pad(const TensorType& self, const Attributes& attrs, int n, bool reflect) {
  auto g = pad_geometry(self, attrs, n, reflect);
  if (!g.ok()) return g.error();
  return Types{{self.dtype, g->out_sizes}};
}

// ---- 3-D pooling

Result<Types> infer_avg_pool3d(InputTypes in, const Attributes& attrs) {
  auto g = pool3d_geometry(*in[0], attrs, false);
  if (!g.ok()) return g.error();
  // ATen pool3d_shape_check(check_input_size=true) for avg_pool3d: the unpadded input must hold
  // one window
  if (g->in[0] < g->kernel[0] || g->in[1] < g->kernel[1] || g->in[2] < g->kernel[2]) {
    return invalid("input image (T: " + std::to_string(g->in[0]) + " H: " + std::to_string(g->in[1]) + " W: " +
                   std::to_string(g->in[2]) + ") smaller than kernel_size " + attr_to_string(AttrValue{attrs.get_ints("kernel_size")}));
  }
  if (!attrs.is_none("divisor_override") && attrs.get_int("divisor_override") == 0) {
    return invalid("divisor_override must be non-zero");
  }
  return Types{{DType::Float32, g->out_sizes}};
}

// Values plus int64 indices (id * H * W + ih * W + iw within each volume).
Result<Types> infer_max_pool3d_with_indices(InputTypes in, const Attributes& attrs) {
  auto g = pool3d_geometry(*in[0], attrs, true);
  if (!g.ok()) return g.error();
  return Types{{DType::Float32, g->out_sizes}, {DType::Int64, g->out_sizes}};
}

// aten._adaptive_avg_pool3d: self (C, D, H, W) / (N, C, D, H, W) float32 with non-zero non-batch
// dims; output_size: 3 values >= 0 (AdaptiveAveragePooling3d.cpp).
Result<Types> infer_adaptive_avg_pool3d(InputTypes in, const Attributes& attrs) {
  const TensorType& self = *in[0];
  KILN_RETURN_IF_ERROR(require_f32(self, "self"));
  KILN_RETURN_IF_ERROR(check_spatial_input(self, 3, "(C, D, H, W)"));
  auto os = int_list(attrs, "output_size", 3, 0);
  if (!os.ok()) return os.error();
  std::vector<int64_t> out = self.sizes;
  const int64_t r = self.dim();
  for (int i = 0; i < 3; ++i) out[r - 3 + i] = (*os)[i];
  KILN_RETURN_IF_ERROR(check_total(out, "output size"));
  return Types{{DType::Float32, std::move(out)}};
}

// aten.adaptive_max_pool2d / 3d: self (C, spatial...) / (N, C, spatial...) float32 with non-zero
// non-batch dims; output_size: n values >= 0. Two outputs: values and int64 indices flattened within
// each plane / volume (AdaptiveMaxPooling2d.cpp / 3d.cpp).
Result<Types> infer_adaptive_max_pool(const TensorType& self, const Attributes& attrs, int n) {
  KILN_RETURN_IF_ERROR(require_f32(self, "self"));
  KILN_RETURN_IF_ERROR(check_spatial_input(self, n, n == 2 ? "(C, H, W)" : "(C, D, H, W)"));
  auto os = int_list(attrs, "output_size", static_cast<size_t>(n), 0);
  if (!os.ok()) return os.error();
  std::vector<int64_t> out = self.sizes;
  const int64_t r = self.dim();
  for (int i = 0; i < n; ++i) out[r - n + i] = (*os)[i];
  KILN_RETURN_IF_ERROR(check_total(out, "output size"));
  return Types{{DType::Float32, out}, {DType::Int64, out}};
}

// ---- grid_sampler_2d / grid_sampler_3d

// aten.grid_sampler_{2,3}d with `nd` spatial dims: input (N, C, [D,] H, W) float32 with non-zero
// spatial dims; grid (N, [Do,] Ho, Wo, nd) float32, same N; interpolation_mode 0 bilinear
// (trilinear) / 1 nearest / 2 bicubic (2-D only); padding_mode 0 zeros / 1 border / 2 reflection
// (GridSampler.cpp check_grid_sampler_common / _2d / _3d). Output (N, C, [Do,] Ho, Wo).
Result<Types> infer_grid_sampler(InputTypes in, const Attributes& attrs, int nd) {
  const TensorType& x = *in[0];
  const TensorType& grid = *in[1];
  KILN_RETURN_IF_ERROR(require_f32(x, "input"));
  KILN_RETURN_IF_ERROR(require_f32(grid, "grid"));
  const int64_t rank = nd + 2;
  if (x.dim() != rank) {
    return invalid(std::string("input must be ") + (nd == 2 ? "4-D (N, C, H, W)" : "5-D (N, C, D, H, W)") +
                   ", got size " + sizes_to_string(x.sizes));
  }
  if (grid.dim() != rank || grid.sizes[static_cast<size_t>(nd + 1)] != nd) {
    return invalid(std::string("grid must be ") + (nd == 2 ? "4-D (N, H_out, W_out, 2)" : "5-D (N, D_out, H_out, W_out, 3)") +
                   ", got size " + sizes_to_string(grid.sizes));
  }
  if (grid.sizes[0] != x.sizes[0]) {
    return invalid("grid and input must have the same batch size, got input " + sizes_to_string(x.sizes) +
                   " and grid " + sizes_to_string(grid.sizes));
  }
  for (int64_t d = 2; d < rank; ++d) {
    if (x.sizes[static_cast<size_t>(d)] == 0) {
      return invalid("input must have non-empty spatial dims, got size " + sizes_to_string(x.sizes));
    }
  }
  const int64_t interp = attrs.get_int("interpolation_mode");
  const int64_t pad = attrs.get_int("padding_mode");
  if (nd == 3 && interp == 2) {
    // F.grid_sample refuses bicubic for 5-D input; the bare ATen op accepts it without a
    // documented formula, so Kiln declines it.
    return Error(ErrorCode::NotSupported, "interpolation_mode 2 (bicubic) is not supported for 5-D input");
  }
  if (interp < 0 || interp > 2) {
    return invalid(std::string("interpolation_mode must be 0 (bilinear), 1 (nearest)") +
                   (nd == 2 ? " or 2 (bicubic)" : "") + ", got " + std::to_string(interp));
  }
  if (pad < 0 || pad > 2) {
    return invalid("padding_mode must be 0 (zeros), 1 (border) or 2 (reflection), got " + std::to_string(pad));
  }
  std::vector<int64_t> out = {x.sizes[0], x.sizes[1]};
  for (int64_t d = 1; d <= nd; ++d) out.push_back(grid.sizes[static_cast<size_t>(d)]);
  KILN_RETURN_IF_ERROR(check_total(out, "output size"));
  return Types{{DType::Float32, out}};
}

// ---- col2im

// self (N, C * kh * kw, L) or (C * kh * kw, L) float32, non-zero but for the batch; L =
// blocks_h * blocks_w. Output (N, C, output_size[0], output_size[1]) (Col2Im.cpp col2im_shape_check).
Result<Types> infer_col2im(InputTypes in, const Attributes& attrs) {
  const TensorType& x = *in[0];
  KILN_RETURN_IF_ERROR(require_f32(x, "self"));
  auto os = int_list(attrs, "output_size", 2, 1);
  if (!os.ok()) return os.error();
  auto k = int_list(attrs, "kernel_size", 2, 1);
  if (!k.ok()) return k.error();
  auto d = int_list(attrs, "dilation", 2, 1);
  if (!d.ok()) return d.error();
  auto p = int_list(attrs, "padding", 2, 0);
  if (!p.ok()) return p.error();
  auto s = int_list(attrs, "stride", 2, 1);
  if (!s.ok()) return s.error();
  KILN_RETURN_IF_ERROR(check_spatial_input(x, 1, "(C * kernel_h * kernel_w, L)"));
  const int64_t r = x.dim();
  const __int128 kk = static_cast<__int128>((*k)[0]) * (*k)[1];
  if (x.sizes[r - 2] % kk != 0) {
    return invalid("expected size of input's dim " + std::to_string(r - 2) + " (" + std::to_string(x.sizes[r - 2]) +
                   ") to be divisible by the product of kernel_size " + attr_to_string(AttrValue{*k}));
  }
  auto bh = col2im_blocks("height", (*os)[0], (*k)[0], (*d)[0], (*p)[0], (*s)[0]);
  if (!bh.ok()) return bh.error();
  auto bw = col2im_blocks("width", (*os)[1], (*k)[1], (*d)[1], (*p)[1], (*s)[1]);
  if (!bw.ok()) return bw.error();
  if (static_cast<__int128>(*bh) * *bw != x.sizes[r - 1]) {
    return invalid("given output_size " + attr_to_string(AttrValue{*os}) + ", kernel_size, dilation, padding and "
                   "stride, expected size of input's last dim to be " +
                   std::to_string(static_cast<long long>(static_cast<__int128>(*bh) * *bw)) + ", got " +
                   std::to_string(x.sizes[r - 1]));
  }
  const int64_t c = static_cast<int64_t>(x.sizes[r - 2] / kk);
  std::vector<int64_t> out;
  if (r == 3) out.push_back(x.sizes[0]);
  out.insert(out.end(), {c, (*os)[0], (*os)[1]});
  int64_t total = 1;
  for (int64_t v : out) {
    if (v != 0 && total > kMaxSpatialSize / v) return invalid("output_size is too large");
    total *= v;
  }
  return Types{{DType::Float32, std::move(out)}};
}

// self (N, C, H, W) or (C, H, W), any dtype, non-zero but for the batch -> (N, C * kh * kw, L),
// L = blocks_h * blocks_w (Im2Col.cpp im2col_shape_check). Data movement: padding reads 0.
Result<Types> infer_im2col(InputTypes in, const Attributes& attrs) {
  const TensorType& x = *in[0];
  auto k = int_list(attrs, "kernel_size", 2, 1);
  if (!k.ok()) return k.error();
  auto d = int_list(attrs, "dilation", 2, 1);
  if (!d.ok()) return d.error();
  auto p = int_list(attrs, "padding", 2, 0);
  if (!p.ok()) return p.error();
  auto s = int_list(attrs, "stride", 2, 1);
  if (!s.ok()) return s.error();
  KILN_RETURN_IF_ERROR(check_spatial_input(x, 2, "(C, H, W)"));
  const int64_t r = x.dim();
  auto bh = col2im_blocks("height", x.sizes[r - 2], (*k)[0], (*d)[0], (*p)[0], (*s)[0]);
  if (!bh.ok()) return bh.error();
  auto bw = col2im_blocks("width", x.sizes[r - 1], (*k)[1], (*d)[1], (*p)[1], (*s)[1]);
  if (!bw.ok()) return bw.error();
  const __int128 rows = static_cast<__int128>(x.sizes[r - 3]) * (*k)[0] * (*k)[1];
  const __int128 cols = static_cast<__int128>(*bh) * *bw;
  const __int128 batch = r == 4 ? x.sizes[0] : 1;
  if (rows * cols * (batch == 0 ? 1 : batch) > kMaxSpatialSize) return invalid("im2col output is too large");
  std::vector<int64_t> out;
  if (r == 4) out.push_back(x.sizes[0]);
  out.insert(out.end(), {static_cast<int64_t>(rows), static_cast<int64_t>(cols)});
  return Types{{x.dtype, std::move(out)}};
}

// ---- distances

Error check_p(const Attributes& attrs) {
  const double p = attrs.get_float("p");
  if (!(p >= 0.0)) return invalid("p must be a non-negative value (or inf), got p=" + attr_to_string(AttrValue{p}));
  return {};
}

// x1 (..., P, M), x2 (..., R, M) float32, rank >= 2, same M; the leading dims broadcast.
// Output (broadcast(...), P, R). compute_mode: None, 0, 1 or 2 (Distance.cpp cdist_impl).
Result<Types> infer_cdist(InputTypes in, const Attributes& attrs) {
  const TensorType& a = *in[0];
  const TensorType& b = *in[1];
  KILN_RETURN_IF_ERROR(require_f32(a, "x1"));
  KILN_RETURN_IF_ERROR(require_f32(b, "x2"));
  if (a.dim() < 2) return invalid("x1 must have at least 2 dims, got size " + sizes_to_string(a.sizes));
  if (b.dim() < 2) return invalid("x2 must have at least 2 dims, got size " + sizes_to_string(b.sizes));
  if (a.sizes.back() != b.sizes.back()) {
    return invalid("x1 and x2 must have the same number of columns, got x1 " + sizes_to_string(a.sizes) + " and x2 " +
                   sizes_to_string(b.sizes));
  }
  KILN_RETURN_IF_ERROR(check_p(attrs));
  if (!attrs.is_none("compute_mode")) {
    const int64_t m = attrs.get_int("compute_mode");
    if (m < 0 || m > 2) return invalid("compute_mode must be None, 0, 1 or 2, got " + std::to_string(m));
  }
  const std::vector<int64_t> ba(a.sizes.begin(), a.sizes.end() - 2), bb(b.sizes.begin(), b.sizes.end() - 2);
  auto batch = broadcast_shapes(ba, bb);
  if (!batch.ok()) return Error(batch.error().code(), "batch dims of x1 and x2: " + batch.error().message());
  std::vector<int64_t> out = *batch;
  out.push_back(a.sizes[a.dim() - 2]);
  out.push_back(b.sizes[b.dim() - 2]);
  KILN_RETURN_IF_ERROR(check_total(out, "output size"));
  return Types{{DType::Float32, std::move(out)}};
}

// self (N, M) float32 -> (N * (N - 1) / 2,) (Distance.cpp pdist).
Result<Types> infer_pdist(InputTypes in, const Attributes& attrs) {
  const TensorType& x = *in[0];
  KILN_RETURN_IF_ERROR(require_f32(x, "self"));
  if (x.dim() != 2) return invalid("self must be 2-D (N, M), got size " + sizes_to_string(x.sizes));
  KILN_RETURN_IF_ERROR(check_p(attrs));
  const __int128 n = x.sizes[0];
  const __int128 pairs = n <= 1 ? 0 : n * (n - 1) / 2;
  if (pairs > kMaxSpatialSize) return invalid("output size (" + std::to_string(x.sizes[0]) + " rows) is too large");
  return Types{{DType::Float32, {static_cast<int64_t>(pairs)}}};
}

}  // namespace

Result<PadGeometry> pad_geometry(const TensorType& self, const Attributes& attrs, int n, bool reflect) {
  const char* layouts[] = {"", "(C, W)", "(C, H, W)", "(C, D, H, W)"};
  KILN_RETURN_IF_ERROR(check_spatial_input(self, n, layouts[n]));
  const std::vector<int64_t> padding = attrs.get_ints("padding");
  if (padding.size() != static_cast<size_t>(2 * n)) {
    return invalid("padding must have " + std::to_string(2 * n) + " values, got padding=" +
                   attr_to_string(AttrValue{padding}));
  }
  for (int64_t v : padding) {
    if (v < -kMaxSpatialParam || v > kMaxSpatialParam) {
      return invalid("padding out of range, got padding=" + attr_to_string(AttrValue{padding}));
    }
  }
  PadGeometry g;
  g.n = n;
  const int64_t r = self.dim();
  g.planes = 1;
  for (int64_t i = 0; i < r - n; ++i) g.planes *= self.sizes[i];
  g.out_sizes = self.sizes;
  const char* names[] = {"D", "H", "W"};
  for (int i = 0; i < n; ++i) {  // i: spatial dim, outermost first
    const int64_t size = self.sizes[r - n + i];
    const int j = n - 1 - i;  // padding pair of this dim
    const int64_t lo = padding[2 * j], hi = padding[2 * j + 1];
    const char* name = names[3 - n + i];
    if (reflect && (lo >= size || hi >= size)) {
      return invalid(std::string("padding size should be less than the corresponding input dimension, got padding (") +
                     std::to_string(lo) + ", " + std::to_string(hi) + ") for " + name + " = " + std::to_string(size) +
                     " (padding=" + attr_to_string(AttrValue{padding}) + ")");
    }
    const int64_t out = size + lo + hi;
    if (out < 1) {
      return invalid(std::string("input (") + name + ": " + std::to_string(size) + ") is too small for padding=" +
                     attr_to_string(AttrValue{padding}) + "; calculated output " + name + ": " + std::to_string(out));
    }
    g.in.push_back(size);
    g.out.push_back(out);
    g.before.push_back(lo);
    g.out_sizes[r - n + i] = out;
  }
  int64_t total = 1;
  for (int64_t v : g.out_sizes) {
    if (v != 0 && total > kMaxSpatialSize / v) return invalid("padded output is too large");
    total *= v;
  }
  return g;
}

Result<Pool3dGeometry> pool3d_geometry(const TensorType& self, const Attributes& attrs, bool with_dilation) {
  KILN_RETURN_IF_ERROR(require_f32(self, "self"));
  KILN_RETURN_IF_ERROR(check_spatial_input(self, 3, "(C, D, H, W)"));
  auto kernel = spatial_param(attrs, "kernel_size", 3, 1);
  if (!kernel.ok()) return kernel.error();
  std::vector<int64_t> stride = *kernel;  // stride [] means stride = kernel_size
  if (!attrs.get_ints("stride").empty()) {
    auto s = spatial_param(attrs, "stride", 3, 1);
    if (!s.ok()) return s.error();
    stride = *s;
  }
  auto padding = spatial_param(attrs, "padding", 3, 0);
  if (!padding.ok()) return padding.error();
  std::vector<int64_t> dilation = {1, 1, 1};
  if (with_dilation) {
    auto d = spatial_param(attrs, "dilation", 3, 1);
    if (!d.ok()) return d.error();
    dilation = *d;
  }
  const bool ceil_mode = attrs.get_bool("ceil_mode");
  Pool3dGeometry g;
  const int64_t r = self.dim();
  g.planes = r == 5 ? self.sizes[0] * self.sizes[1] : self.sizes[0];
  g.out_sizes = self.sizes;
  const char* names[] = {"depth", "height", "width"};
  for (int i = 0; i < 3; ++i) {
    g.in[i] = self.sizes[r - 3 + i];
    g.kernel[i] = (*kernel)[i];
    g.stride[i] = stride[i];
    g.pad[i] = (*padding)[i];
    g.dilation[i] = dilation[i];
    auto o = pooling_output_shape(names[i], g.in[i], g.kernel[i], g.pad[i], g.stride[i], g.dilation[i], ceil_mode);
    if (!o.ok()) return o.error();
    g.out[i] = *o;
    g.out_sizes[r - 3 + i] = *o;
  }
  int64_t total = 1;
  for (int64_t v : g.out_sizes) {
    if (v != 0 && total > kMaxSpatialSize / v) return invalid("calculated output size is too large");
    total *= v;
  }
  return g;
}

Result<int64_t> col2im_blocks(const char* dim, int64_t size, int64_t kernel, int64_t dilation, int64_t pad,
                              int64_t stride) {
  const __int128 span = static_cast<__int128>(dilation) * (kernel - 1) + 1;
  const __int128 num = static_cast<__int128>(size) + 2 * static_cast<__int128>(pad) - span;
  const __int128 blocks = num < 0 ? 0 : num / stride + 1;
  if (blocks < 1) {
    return invalid(std::string("given output_size, kernel_size, dilation and padding, the calculated number of ") +
                   "sliding blocks along " + dim + " is < 1 (output " + dim + " " + std::to_string(size) +
                   ", kernel " + std::to_string(kernel) + ", dilation " + std::to_string(dilation) + ", padding " +
                   std::to_string(pad) + ", stride " + std::to_string(stride) + ")");
  }
  return static_cast<int64_t>(blocks);
}

void register_spatial_extra_ops(OpRegistry& r) {
  const AttrValue none{};
  const std::vector<AttrSpec> pad_attrs = {{"padding", AttrKind::Ints, none, true}};
  struct PadOp {
    const char* name;
    int n;
    bool reflect;
  };
  for (const PadOp& op : {PadOp{"aten.reflection_pad1d", 1, true}, PadOp{"aten.reflection_pad2d", 2, true},
                          PadOp{"aten.reflection_pad3d", 3, true}, PadOp{"aten.replication_pad1d", 1, false},
                          PadOp{"aten.replication_pad2d", 2, false}, PadOp{"aten.replication_pad3d", 3, false}}) {
    const int n = op.n;
    const bool reflect = op.reflect;
    r.add({op.name,
           {{"self"}},
           pad_attrs,
           1,
           [n, reflect](InputTypes in, const Attributes& attrs) { return infer_pad(*in[0], attrs, n, reflect); },
           reflect ? "reflection padding of the last dims, any dtype: src = |v| then 2(size-1) - v past the end, "
                     "v = dst - pad_before; negative pads crop (torch.ops.aten.reflection_padNd; Padding.h checks)"
                   : "replication (edge) padding of the last dims, any dtype: src = clamp(dst - pad_before, 0, size-1); "
                     "negative pads crop (torch.ops.aten.replication_padNd)"});
  }
  r.add({"aten.avg_pool3d",
         {{"self"}},
         {{"kernel_size", AttrKind::Ints, {}, true},
          {"stride", AttrKind::Ints, std::vector<int64_t>{}},
          {"padding", AttrKind::Ints, std::vector<int64_t>{0}},
          {"ceil_mode", AttrKind::Bool, false},
          {"count_include_pad", AttrKind::Bool, true},
          {"divisor_override", AttrKind::Int, {}, false, true}},
         1, infer_avg_pool3d,
         "3-D average pooling over (C,D,H,W)/(N,C,D,H,W) (torch.ops.aten.avg_pool3d; AvgPoolKernel.cpp divisor rules)"});
  r.add({"aten.max_pool3d_with_indices",
         {{"self"}},
         {{"kernel_size", AttrKind::Ints, {}, true},
          {"stride", AttrKind::Ints, std::vector<int64_t>{}},
          {"padding", AttrKind::Ints, std::vector<int64_t>{0}},
          {"dilation", AttrKind::Ints, std::vector<int64_t>{1}},
          {"ceil_mode", AttrKind::Bool, false}},
         2, infer_max_pool3d_with_indices,
         "3-D max pooling, NaN propagating, plus int64 indices flattened within each (D, H, W) volume "
         "(torch.ops.aten.max_pool3d_with_indices; MaxPoolKernel.cpp tie/NaN rules)"});
  r.add({"aten._adaptive_avg_pool3d",
         {{"self"}},
         {{"output_size", AttrKind::Ints, none, true}},
         1, infer_adaptive_avg_pool3d,
         "adaptive 3-D average pooling: window [floor(i*in/out), ceil((i+1)*in/out)) per dim "
         "(torch.ops.aten._adaptive_avg_pool3d)"});
  for (int n : {2, 3}) {
    r.add({n == 2 ? "aten.adaptive_max_pool2d" : "aten.adaptive_max_pool3d",
           {{"self"}},
           {{"output_size", AttrKind::Ints, none, true}},
           2,
           [n](InputTypes in, const Attributes& attrs) { return infer_adaptive_max_pool(*in[0], attrs, n); },
           "adaptive max pooling over windows [floor(i*in/out), ceil((i+1)*in/out)) per dim, NaN propagating, plus "
           "int64 indices flattened within each plane/volume (torch.ops.aten.adaptive_max_pool2d/3d)"});
  }
  r.add({"aten.grid_sampler_2d",
         {{"input"}, {"grid"}},
         {{"interpolation_mode", AttrKind::Int, none, true},
          {"padding_mode", AttrKind::Int, none, true},
          {"align_corners", AttrKind::Bool, none, true}},
         1, [](InputTypes in, const Attributes& a) { return infer_grid_sampler(in, a, 2); },
         "samples (N,C,H,W) at grid (N,Ho,Wo,2) coordinates in [-1, 1]; bilinear/nearest/bicubic, zeros/border/"
         "reflection padding (torch.ops.aten.grid_sampler_2d; ATen GridSampler.h formulas)"});
  r.add({"aten.grid_sampler_3d",
         {{"input"}, {"grid"}},
         {{"interpolation_mode", AttrKind::Int, none, true},
          {"padding_mode", AttrKind::Int, none, true},
          {"align_corners", AttrKind::Bool, none, true}},
         1, [](InputTypes in, const Attributes& a) { return infer_grid_sampler(in, a, 3); },
         "samples (N,C,D,H,W) at grid (N,Do,Ho,Wo,3) coordinates (x, y, z) in [-1, 1]; trilinear/nearest, zeros/"
         "border/reflection padding (torch.ops.aten.grid_sampler_3d; ATen GridSampler.h formulas)"});
  r.add({"aten.col2im",
         {{"self"}},
         {{"output_size", AttrKind::Ints, none, true},
          {"kernel_size", AttrKind::Ints, none, true},
          {"dilation", AttrKind::Ints, none, true},
          {"padding", AttrKind::Ints, none, true},
          {"stride", AttrKind::Ints, none, true}},
         1, infer_col2im,
         "sums sliding-block columns (N, C*kh*kw, L) back into images (N, C, H, W) (torch.ops.aten.col2im, F.fold)"});
  r.add({"aten.im2col",
         {{"self"}},
         {{"kernel_size", AttrKind::Ints, none, true},
          {"dilation", AttrKind::Ints, none, true},
          {"padding", AttrKind::Ints, none, true},
          {"stride", AttrKind::Ints, none, true}},
         1, infer_im2col,
         "extracts sliding blocks of (N, C, H, W) into columns (N, C*kh*kw, L), zeros where padded, any dtype "
         "(torch.ops.aten.im2col, F.unfold)"});
  r.add({"aten._cdist_forward",
         {{"x1"}, {"x2"}},
         {{"p", AttrKind::Float, none, true}, {"compute_mode", AttrKind::Int, none, false, true}},
         1, infer_cdist,
         "p-norm distances between the rows of x1 (...,P,M) and x2 (...,R,M), computed directly from the "
         "differences (torch.ops.aten._cdist_forward)"});
  r.add({"aten._pdist_forward",
         {{"self"}},
         {{"p", AttrKind::Float, 2.0}},
         1, infer_pdist,
         "p-norm distances between the row pairs i < j of (N, M), row-major pair order (torch.ops.aten._pdist_forward)"});
}

}  // namespace kiln
