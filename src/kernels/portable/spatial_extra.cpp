// Portable kernels of the ops in src/ir/ops/spatial_extra.cpp: reflection/replication padding
// (any dtype), 3-D pooling, grid_sampler_2d, col2im, _cdist_forward, _pdist_forward (float32).
// Sums accumulate in double. Geometry comes from the same validated functions the op inference
// uses, so kernels index only inside their tensors.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <vector>

#include "ir/ops/spatial_extra.h"
#include "kernels/kernel.h"
#include "kernels/portable/util.h"

namespace kiln {
namespace {

Error with_op(const Error& e, const char* op) { return Error(e.code(), std::string(op) + ": " + e.message()); }

// ---- padding

/// Source index of output index `dst` along one padded axis; v = dst - before is the position in
/// input coordinates. Reflection: v < 0 -> -v, v >= size -> 2(size-1) - v (PyTorch ReflectionPad,
/// edge not repeated); replication: clamp(v, 0, size-1). pad_geometry guarantees the result is in
/// [0, size) for every dst < out.
int64_t pad_source(int64_t dst, int64_t before, int64_t size, bool reflect) {
  int64_t v = dst - before;
  if (reflect) {
    if (v < 0) v = -v;
    if (v >= size) v = 2 * (size - 1) - v;
    return v;
  }
  return std::min(std::max<int64_t>(v, 0), size - 1);
}

template <typename T>
void pad_copy(const T* src, T* dst, const PadGeometry& g, const std::vector<std::vector<int64_t>>& idx) {
  // idx[0..2]: source index tables for D, H, W (size-1 tables for the dims not padded).
  const int64_t od = static_cast<int64_t>(idx[0].size()), oh = static_cast<int64_t>(idx[1].size()),
                ow = static_cast<int64_t>(idx[2].size());
  const int64_t ih = g.n >= 2 ? g.in[g.n - 2] : 1, iw = g.in[g.n - 1];
  const int64_t id = g.n == 3 ? g.in[0] : 1;
  for (int64_t p = 0; p < g.planes; ++p) {
    const T* s = src + p * id * ih * iw;
    T* d = dst + p * od * oh * ow;
    for (int64_t z = 0; z < od; ++z) {
      for (int64_t y = 0; y < oh; ++y) {
        const T* row = s + (idx[0][z] * ih + idx[1][y]) * iw;
        T* out = d + (z * oh + y) * ow;
        for (int64_t x = 0; x < ow; ++x) out[x] = row[idx[2][x]];
      }
    }
  }
}

/// aten.reflection_padNd / aten.replication_padNd: out[..., dst] = in[..., pad_source(dst)] per
/// padded dim; any dtype (the bytes are copied).
template <int N, bool Reflect>
Error pad_kernel(const KernelArgs& a) {
  const char* op = Reflect ? (N == 1 ? "aten.reflection_pad1d" : N == 2 ? "aten.reflection_pad2d" : "aten.reflection_pad3d")
                           : (N == 1 ? "aten.replication_pad1d" : N == 2 ? "aten.replication_pad2d" : "aten.replication_pad3d");
  const Tensor& x = *a.inputs[0];
  Tensor& out = *a.outputs[0];
  auto geo = pad_geometry(x.type(), a.attrs, N, Reflect);
  if (!geo.ok()) return with_op(geo.error(), op);
  const PadGeometry& g = geo.value();
  if (out.dtype != x.dtype || out.sizes != g.out_sizes) {
    return Error(ErrorCode::Internal, std::string(op) + ": output type differs from the inferred one");
  }
  std::vector<std::vector<int64_t>> idx(3, std::vector<int64_t>{0});
  try {
    for (int i = 0; i < N; ++i) {
      std::vector<int64_t>& t = idx[3 - N + i];
      t.resize(static_cast<size_t>(g.out[i]));
      for (int64_t o = 0; o < g.out[i]; ++o) t[o] = pad_source(o, g.before[i], g.in[i], Reflect);
    }
  } catch (const std::bad_alloc&) {
    return Error(ErrorCode::MemoryAllocationFailed, std::string(op) + ": index tables");
  }
  switch (dtype_size(x.dtype)) {
    case 1: pad_copy(x.data_as<const uint8_t>(), out.data_as<uint8_t>(), g, idx); break;
    case 2: pad_copy(x.data_as<const uint16_t>(), out.data_as<uint16_t>(), g, idx); break;
    case 4: pad_copy(x.data_as<const uint32_t>(), out.data_as<uint32_t>(), g, idx); break;
    case 8: pad_copy(x.data_as<const uint64_t>(), out.data_as<uint64_t>(), g, idx); break;
    default: return Error(ErrorCode::NotSupported, std::string(op) + ": element size");
  }
  return {};
}

// ---- 3-D pooling

/// aten.max_pool3d_with_indices: out[p, od, oh, ow] = max over the dilated window positions inside
/// the input (start o*s - pad + k*dilation); NaN if any is NaN. indices = (id * H + ih) * W + iw of
/// the chosen element. ATen's CPU rules (MaxPoolKernel.cpp cpu_max_pool): the first maximum wins
/// (strict >), a NaN always replaces the best (so the last NaN wins), and an all -inf window keeps
/// the index of its first valid position.
Error max_pool3d_with_indices(const KernelArgs& a) {
  const char* op = "aten.max_pool3d_with_indices";
  const Tensor& x = *a.inputs[0];
  auto geo = pool3d_geometry(x.type(), a.attrs, true);
  if (!geo.ok()) return with_op(geo.error(), op);
  const Pool3dGeometry& g = geo.value();
  Tensor& idx = *a.outputs[1];
  if (idx.dtype != DType::Int64 || idx.sizes != a.outputs[0]->sizes) {
    return Error(ErrorCode::Internal, std::string(op) + ": indices output must be int64 of the output's sizes");
  }
  const int64_t ID = g.in[0], IH = g.in[1], IW = g.in[2];
  const int64_t OD = g.out[0], OH = g.out[1], OW = g.out[2];
  const float* px = x.data_as<const float>();
  float* po = a.outputs[0]->data_as<float>();
  int64_t* pi = idx.data_as<int64_t>();
  // First in-range start of a window along one dim (the kernel's valid positions are start + k*d).
  auto first = [](int64_t start, int64_t d) {
    while (start < 0) start += d;
    return start;
  };
  for (int64_t p = 0; p < g.planes; ++p) {
    const float* vol = px + p * ID * IH * IW;
    for (int64_t od = 0; od < OD; ++od) {
      const int64_t d0 = od * g.stride[0] - g.pad[0];
      for (int64_t oh = 0; oh < OH; ++oh) {
        const int64_t h0 = oh * g.stride[1] - g.pad[1];
        for (int64_t ow = 0; ow < OW; ++ow) {
          const int64_t w0 = ow * g.stride[2] - g.pad[2];
          float best = -std::numeric_limits<float>::infinity();
          int64_t best_i = (first(d0, g.dilation[0]) * IH + first(h0, g.dilation[1])) * IW + first(w0, g.dilation[2]);
          for (int64_t kd = 0; kd < g.kernel[0]; ++kd) {
            const int64_t id = d0 + kd * g.dilation[0];
            if (id < 0 || id >= ID) continue;
            for (int64_t kh = 0; kh < g.kernel[1]; ++kh) {
              const int64_t ih = h0 + kh * g.dilation[1];
              if (ih < 0 || ih >= IH) continue;
              for (int64_t kw = 0; kw < g.kernel[2]; ++kw) {
                const int64_t iw = w0 + kw * g.dilation[2];
                if (iw < 0 || iw >= IW) continue;
                const int64_t i = (id * IH + ih) * IW + iw;
                const float v = vol[i];
                if (v > best || std::isnan(v)) {
                  best = v;
                  best_i = i;
                }
              }
            }
          }
          const int64_t o = ((p * OD + od) * OH + oh) * OW + ow;
          po[o] = best;
          pi[o] = best_i;
        }
      }
    }
  }
  return {};
}

/// aten.avg_pool3d (ATen AvgPoolKernel.cpp cpu_avg_pool3d): each window is clipped to the padded
/// input (its volume is the divisor when count_include_pad), then to the input; the sum of those
/// elements is divided by divisor_override if given, else by the padded volume
/// (count_include_pad) or the number of elements summed. A window with no input element gives 0.
Error avg_pool3d(const KernelArgs& a) {
  const char* op = "aten.avg_pool3d";
  const Tensor& x = *a.inputs[0];
  auto geo = pool3d_geometry(x.type(), a.attrs, false);
  if (!geo.ok()) return with_op(geo.error(), op);
  const Pool3dGeometry& g = geo.value();
  const bool count_include_pad = a.attrs.get_bool("count_include_pad", true);
  const bool has_override = !a.attrs.is_none("divisor_override");
  const int64_t divisor_override = has_override ? a.attrs.get_int("divisor_override") : 0;
  if (has_override && divisor_override == 0) {
    return Error(ErrorCode::InvalidArgument, std::string(op) + ": divisor_override must be non-zero");
  }
  const float* px = x.data_as<const float>();
  float* po = a.outputs[0]->data_as<float>();
  const int64_t ID = g.in[0], IH = g.in[1], IW = g.in[2];
  const int64_t OD = g.out[0], OH = g.out[1], OW = g.out[2];
  // Window [lo, hi) along dim i for output index o: {clipped to input lo, hi, padded length}.
  struct Win {
    int64_t lo, hi, padded;
  };
  auto window = [&](int i, int64_t o) {
    const int64_t lo = o * g.stride[i] - g.pad[i];
    const int64_t hi = std::min(lo + g.kernel[i], g.in[i] + g.pad[i]);
    return Win{std::max<int64_t>(lo, 0), std::min(hi, g.in[i]), hi - lo};
  };
  for (int64_t p = 0; p < g.planes; ++p) {
    const float* vol = px + p * ID * IH * IW;
    for (int64_t od = 0; od < OD; ++od) {
      const Win wd = window(0, od);
      for (int64_t oh = 0; oh < OH; ++oh) {
        const Win wh = window(1, oh);
        for (int64_t ow = 0; ow < OW; ++ow) {
          const Win ww = window(2, ow);
          const int64_t o = ((p * OD + od) * OH + oh) * OW + ow;
          if (wd.lo >= wd.hi || wh.lo >= wh.hi || ww.lo >= ww.hi) {
            po[o] = 0.0f;
            continue;
          }
          double sum = 0.0;
          for (int64_t id = wd.lo; id < wd.hi; ++id) {
            for (int64_t ih = wh.lo; ih < wh.hi; ++ih) {
              for (int64_t iw = ww.lo; iw < ww.hi; ++iw) sum += vol[(id * IH + ih) * IW + iw];
            }
          }
          int64_t divisor;
          if (has_override) {
            divisor = divisor_override;
          } else if (count_include_pad) {
            divisor = wd.padded * wh.padded * ww.padded;
          } else {
            divisor = (wd.hi - wd.lo) * (wh.hi - wh.lo) * (ww.hi - ww.lo);
          }
          po[o] = static_cast<float>(sum / static_cast<double>(divisor));
        }
      }
    }
  }
  return {};
}

/// aten._adaptive_avg_pool3d (ATen AdaptiveAveragePooling3d.cpp): output index o of a dim averages
/// the input range [floor(o*in/out), ceil((o+1)*in/out)).
Error adaptive_avg_pool3d(const KernelArgs& a) {
  const Tensor& x = *a.inputs[0];
  Tensor& out = *a.outputs[0];
  const int64_t r = x.dim();
  int64_t in[3], os[3];
  for (int i = 0; i < 3; ++i) in[i] = x.sizes[r - 3 + i], os[i] = out.sizes[r - 3 + i];
  int64_t planes = 1;
  for (int64_t i = 0; i < r - 3; ++i) planes *= x.sizes[i];
  auto start = [](int64_t o, int64_t n, int64_t m) { return static_cast<int64_t>(static_cast<__int128>(o) * n / m); };
  auto end = [](int64_t o, int64_t n, int64_t m) {
    return static_cast<int64_t>(((static_cast<__int128>(o) + 1) * n + m - 1) / m);
  };
  const float* px = x.data_as<const float>();
  float* po = out.data_as<float>();
  for (int64_t p = 0; p < planes; ++p) {
    const float* vol = px + p * in[0] * in[1] * in[2];
    float* ovol = po + p * os[0] * os[1] * os[2];
    for (int64_t od = 0; od < os[0]; ++od) {
      const int64_t d0 = start(od, in[0], os[0]), d1 = end(od, in[0], os[0]);
      for (int64_t oh = 0; oh < os[1]; ++oh) {
        const int64_t h0 = start(oh, in[1], os[1]), h1 = end(oh, in[1], os[1]);
        for (int64_t ow = 0; ow < os[2]; ++ow) {
          const int64_t w0 = start(ow, in[2], os[2]), w1 = end(ow, in[2], os[2]);
          double sum = 0.0;
          for (int64_t d = d0; d < d1; ++d) {
            for (int64_t h = h0; h < h1; ++h) {
              for (int64_t w = w0; w < w1; ++w) sum += vol[(d * in[1] + h) * in[2] + w];
            }
          }
          ovol[(od * os[1] + oh) * os[2] + ow] = static_cast<float>(sum / static_cast<double>((d1 - d0) * (h1 - h0) * (w1 - w0)));
        }
      }
    }
  }
  return {};
}

/// aten.adaptive_max_pool2d / 3d (ATen AdaptiveMaxPoolKernel.cpp): output index o of a dim takes
/// the input range [floor(o*in/out), ceil((o+1)*in/out)); the max over that window, NaN if any
/// element is NaN (a NaN always replaces the best, so the last NaN's index), else the first maximum
/// (strict >); an all -inf window keeps its first element's index. Spatial dims are handled as 3
/// (a 2-D op has depth 1).
template <int N>
Error adaptive_max_pool(const KernelArgs& a) {
  const Tensor& x = *a.inputs[0];
  Tensor& out = *a.outputs[0];
  Tensor& idx = *a.outputs[1];
  if (idx.dtype != DType::Int64 || idx.sizes != out.sizes) {
    return Error(ErrorCode::Internal, "aten.adaptive_max_pool: indices output must be int64 of the output's sizes");
  }
  const int64_t r = x.dim();
  int64_t in[3] = {1, 1, 1}, os[3] = {1, 1, 1};
  for (int i = 0; i < N; ++i) in[3 - N + i] = x.sizes[r - N + i], os[3 - N + i] = out.sizes[r - N + i];
  int64_t planes = 1;
  for (int64_t i = 0; i < r - N; ++i) planes *= x.sizes[i];
  auto start = [](int64_t o, int64_t n, int64_t m) { return static_cast<int64_t>(static_cast<__int128>(o) * n / m); };
  auto end = [](int64_t o, int64_t n, int64_t m) {
    return static_cast<int64_t>(((static_cast<__int128>(o) + 1) * n + m - 1) / m);
  };
  const float* px = x.data_as<const float>();
  float* po = out.data_as<float>();
  int64_t* pi = idx.data_as<int64_t>();
  const int64_t in_vol = in[0] * in[1] * in[2], out_vol = os[0] * os[1] * os[2];
  for (int64_t p = 0; p < planes; ++p) {
    const float* vol = px + p * in_vol;
    for (int64_t od = 0; od < os[0]; ++od) {
      const int64_t d0 = start(od, in[0], os[0]), d1 = end(od, in[0], os[0]);
      for (int64_t oh = 0; oh < os[1]; ++oh) {
        const int64_t h0 = start(oh, in[1], os[1]), h1 = end(oh, in[1], os[1]);
        for (int64_t ow = 0; ow < os[2]; ++ow) {
          const int64_t w0 = start(ow, in[2], os[2]), w1 = end(ow, in[2], os[2]);
          float best = -std::numeric_limits<float>::infinity();
          int64_t best_i = (d0 * in[1] + h0) * in[2] + w0;
          for (int64_t d = d0; d < d1; ++d) {
            for (int64_t h = h0; h < h1; ++h) {
              for (int64_t w = w0; w < w1; ++w) {
                const int64_t i = (d * in[1] + h) * in[2] + w;
                if (vol[i] > best || std::isnan(vol[i])) {
                  best = vol[i];
                  best_i = i;
                }
              }
            }
          }
          const int64_t o = p * out_vol + (od * os[1] + oh) * os[2] + ow;
          po[o] = best;
          pi[o] = best_i;
        }
      }
    }
  }
  return {};
}

// ---- grid_sampler_2d

/// One axis of grid_sampler_2d (ATen GridSampler.h: grid_sampler_unnormalize, clip_coordinates,
/// reflect_coordinates, compute_coordinates), in float as ATen computes it.
struct GridAxis {
  int64_t size;
  bool align_corners;
  int64_t padding_mode;  // 0 zeros, 1 border, 2 reflection

  /// [-1, 1] -> pixel coordinate: align_corners: (c + 1) * (size - 1) / 2, else
  /// (c + 1) * size / 2 - 0.5 (the -1 and +1 edges are pixel centres, resp. image borders).
  float unnormalize(float c) const {
    if (align_corners) return (c + 1.0f) * (static_cast<float>(size - 1) / 2.0f);
    return (c + 1.0f) * (static_cast<float>(size) / 2.0f) - 0.5f;
  }
  /// Clips to [0, size - 1] with IEEE fmax/fmin, so NaN becomes 0 (as ATen's CPU and CUDA kernels).
  float clip(float v) const { return std::fmin(static_cast<float>(size - 1), std::fmax(v, 0.0f)); }
  /// Reflects v about the borders: [0, size-1] (align_corners) or [-0.5, size-0.5], period 2*span;
  /// a non-finite v stays non-finite (then clip makes it 0).
  float reflect(float v) const {
    const float lo = align_corners ? 0.0f : -0.5f;
    const float span = align_corners ? static_cast<float>(size - 1) : static_cast<float>(size);
    if (span <= 0.0f) return 0.0f;
    const float e = std::fmod(std::fabs(v - lo), 2.0f * span);
    return std::min(e, 2.0f * span - e) + lo;
  }
  /// The padding mode applied to a pixel coordinate.
  float pad(float v) const {
    if (padding_mode == 1) return clip(v);
    if (padding_mode == 2) return clip(reflect(v));
    return v;
  }
  /// The index of an integer-valued (or, after pad, truncated) coordinate, or -1 when outside.
  int64_t index(float v) const {
    if (!(v > -1.0f && v < static_cast<float>(size))) return -1;  // also NaN
    return static_cast<int64_t>(v);
  }
};

/// Cubic convolution weights of the 4 taps at offsets -1, 0, 1, 2 for fraction t, A = -0.75
/// (ATen UpSample.h get_cubic_upsample_coefficients).
void cubic_coefficients(float t, float c[4]) {
  const float A = -0.75f;
  auto conv1 = [A](float x) { return ((A + 2) * x - (A + 3)) * x * x + 1; };
  auto conv2 = [A](float x) { return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A; };
  c[0] = conv2(t + 1.0f);
  c[1] = conv1(t);
  c[2] = conv1(1.0f - t);
  c[3] = conv2(2.0f - t);
}

/// aten.grid_sampler_2d: out[n, c, h, w] samples input[n, c] at grid[n, h, w] = (x, y) in [-1, 1].
/// bilinear: the 4 neighbours of the padded source point, weights (1-fx)(1-fy), fx(1-fy), ...;
/// nearest: the pixel at nearbyint (ties to even) of the padded point; bicubic: 4x4 taps around
/// the unpadded point, each tap's coordinate padded on its own (ATen GridSampler.h). Taps outside
/// the input read 0 and still take their weight, so a NaN/inf coordinate gives NaN where its
/// weights are NaN (bilinear/bicubic with zeros padding; bicubic always), as in ATen's CPU kernel.
Error grid_sampler_2d(const KernelArgs& a) {
  const char* op = "aten.grid_sampler_2d";
  KILN_RETURN_IF_ERROR(check_f32(a, op));
  const Tensor& x = *a.inputs[0];
  const Tensor& grid = *a.inputs[1];
  Tensor& out = *a.outputs[0];
  const int64_t interp = a.attrs.get_int("interpolation_mode");
  const int64_t padding = a.attrs.get_int("padding_mode");
  const bool align = a.attrs.get_bool("align_corners");
  if (interp < 0 || interp > 2 || padding < 0 || padding > 2) {
    return Error(ErrorCode::InvalidArgument, std::string(op) + ": interpolation_mode / padding_mode out of range");
  }
  const int64_t N = x.sizes[0], C = x.sizes[1], H = x.sizes[2], W = x.sizes[3];
  const int64_t OH = grid.sizes[1], OW = grid.sizes[2];
  const GridAxis ax{W, align, padding}, ay{H, align, padding};
  const GridAxis ax_raw{W, align, 0}, ay_raw{H, align, 0};
  const float* px = x.data_as<const float>();
  const float* pg = grid.data_as<const float>();
  float* po = out.data_as<float>();
  for (int64_t n = 0; n < N; ++n) {
    const float* img = px + n * C * H * W;
    for (int64_t h = 0; h < OH; ++h) {
      for (int64_t w = 0; w < OW; ++w) {
        const float* gp = pg + ((n * OH + h) * OW + w) * 2;
        float* o = po + n * C * OH * OW + h * OW + w;  // channel stride OH * OW
        if (interp == 2) {
          const float fx = ax_raw.unnormalize(gp[0]), fy = ay_raw.unnormalize(gp[1]);
          const float x0 = std::floor(fx), y0 = std::floor(fy);
          float cx[4], cy[4];
          cubic_coefficients(fx - x0, cx);
          cubic_coefficients(fy - y0, cy);
          int64_t xi[4], yi[4];
          for (int k = 0; k < 4; ++k) {
            xi[k] = ax.index(ax.pad(x0 - 1.0f + static_cast<float>(k)));
            yi[k] = ay.index(ay.pad(y0 - 1.0f + static_cast<float>(k)));
          }
          for (int64_t c = 0; c < C; ++c) {
            const float* plane = img + c * H * W;
            float acc = 0.0f;
            for (int i = 0; i < 4; ++i) {
              float row = 0.0f;
              for (int j = 0; j < 4; ++j) {
                const float v = (yi[i] >= 0 && xi[j] >= 0) ? plane[yi[i] * W + xi[j]] : 0.0f;
                row += v * cx[j];
              }
              acc += row * cy[i];
            }
            o[c * OH * OW] = acc;
          }
          continue;
        }
        const float fx = ax.pad(ax.unnormalize(gp[0])), fy = ay.pad(ay.unnormalize(gp[1]));
        if (interp == 1) {
          const int64_t ix = ax.index(std::nearbyint(fx)), iy = ay.index(std::nearbyint(fy));
          for (int64_t c = 0; c < C; ++c) {
            o[c * OH * OW] = (ix >= 0 && iy >= 0) ? img[c * H * W + iy * W + ix] : 0.0f;
          }
          continue;
        }
        const float x0 = std::floor(fx), y0 = std::floor(fy);
        const float tx = fx - x0, ty = fy - y0;
        const float wts[4] = {(1.0f - ty) * (1.0f - tx), (1.0f - ty) * tx, ty * (1.0f - tx), ty * tx};
        const int64_t ix0 = ax.index(x0), ix1 = ax.index(x0 + 1.0f);
        const int64_t iy0 = ay.index(y0), iy1 = ay.index(y0 + 1.0f);
        const int64_t tx_i[4] = {ix0, ix1, ix0, ix1}, ty_i[4] = {iy0, iy0, iy1, iy1};
        for (int64_t c = 0; c < C; ++c) {
          const float* plane = img + c * H * W;
          float acc = 0.0f;
          for (int k = 0; k < 4; ++k) {
            const float v = (tx_i[k] >= 0 && ty_i[k] >= 0) ? plane[ty_i[k] * W + tx_i[k]] : 0.0f;
            acc += v * wts[k];
          }
          o[c * OH * OW] = acc;
        }
      }
    }
  }
  return {};
}

/// aten.grid_sampler_3d: as grid_sampler_2d with a third axis: grid[n, d, h, w] = (x, y, z);
/// trilinear: the 8 neighbours of the padded point with products of the per-axis weights, taps
/// outside read 0 and keep their weight (the same non-finite rule as grid_sampler_2d); nearest:
/// nearbyint per axis.
Error grid_sampler_3d(const KernelArgs& a) {
  const char* op = "aten.grid_sampler_3d";
  KILN_RETURN_IF_ERROR(check_f32(a, op));
  const Tensor& x = *a.inputs[0];
  const Tensor& grid = *a.inputs[1];
  Tensor& out = *a.outputs[0];
  const int64_t interp = a.attrs.get_int("interpolation_mode");
  const int64_t padding = a.attrs.get_int("padding_mode");
  const bool align = a.attrs.get_bool("align_corners");
  if (interp < 0 || interp > 1 || padding < 0 || padding > 2) {
    return Error(ErrorCode::InvalidArgument, std::string(op) + ": interpolation_mode / padding_mode out of range");
  }
  const int64_t N = x.sizes[0], C = x.sizes[1], D = x.sizes[2], H = x.sizes[3], W = x.sizes[4];
  const int64_t OD = grid.sizes[1], OH = grid.sizes[2], OW = grid.sizes[3];
  const int64_t ovol = OD * OH * OW, ivol = D * H * W;
  const GridAxis ax{W, align, padding}, ay{H, align, padding}, az{D, align, padding};
  const float* px = x.data_as<const float>();
  const float* pg = grid.data_as<const float>();
  float* po = out.data_as<float>();
  for (int64_t n = 0; n < N; ++n) {
    const float* img = px + n * C * ivol;
    for (int64_t o = 0; o < ovol; ++o) {
      const float* gp = pg + (n * ovol + o) * 3;
      float* dst = po + n * C * ovol + o;  // channel stride ovol
      const float fx = ax.pad(ax.unnormalize(gp[0])), fy = ay.pad(ay.unnormalize(gp[1])),
                  fz = az.pad(az.unnormalize(gp[2]));
      if (interp == 1) {
        const int64_t ix = ax.index(std::nearbyint(fx)), iy = ay.index(std::nearbyint(fy)),
                      iz = az.index(std::nearbyint(fz));
        for (int64_t c = 0; c < C; ++c) {
          dst[c * ovol] = (ix >= 0 && iy >= 0 && iz >= 0) ? img[c * ivol + (iz * H + iy) * W + ix] : 0.0f;
        }
        continue;
      }
      const float x0 = std::floor(fx), y0 = std::floor(fy), z0 = std::floor(fz);
      const float tx = fx - x0, ty = fy - y0, tz = fz - z0;
      const float wx[2] = {1.0f - tx, tx}, wy[2] = {1.0f - ty, ty}, wz[2] = {1.0f - tz, tz};
      const int64_t xi[2] = {ax.index(x0), ax.index(x0 + 1.0f)}, yi[2] = {ay.index(y0), ay.index(y0 + 1.0f)},
                    zi[2] = {az.index(z0), az.index(z0 + 1.0f)};
      for (int64_t c = 0; c < C; ++c) {
        const float* vol = img + c * ivol;
        float acc = 0.0f;
        for (int k = 0; k < 8; ++k) {
          const int i = k & 1, j = (k >> 1) & 1, l = k >> 2;  // x, y, z tap
          const bool inside = xi[i] >= 0 && yi[j] >= 0 && zi[l] >= 0;
          const float v = inside ? vol[(zi[l] * H + yi[j]) * W + xi[i]] : 0.0f;
          acc += v * (wz[l] * wy[j] * wx[i]);
        }
        dst[c * ovol] = acc;
      }
    }
  }
  return {};
}

// ---- col2im

/// aten.col2im (F.fold): out[n, c, h, w] = sum over the blocks (bh, bw) and kernel taps (i, j) with
/// h = bh*sh - ph + i*dh, w = bw*sw - pw + j*dw of in[n, (c*kh + i)*kw + j, bh*blocks_w + bw]
/// (PyTorch Col2Im.cpp / im2col.h col2im).
Error col2im(const KernelArgs& a) {
  const char* op = "aten.col2im";
  KILN_RETURN_IF_ERROR(check_f32(a, op));
  const Tensor& x = *a.inputs[0];
  Tensor& out = *a.outputs[0];
  const auto os = a.attrs.get_ints("output_size"), k = a.attrs.get_ints("kernel_size"),
             d = a.attrs.get_ints("dilation"), p = a.attrs.get_ints("padding"), s = a.attrs.get_ints("stride");
  auto bh = col2im_blocks("height", os[0], k[0], d[0], p[0], s[0]);
  if (!bh.ok()) return with_op(bh.error(), op);
  auto bw = col2im_blocks("width", os[1], k[1], d[1], p[1], s[1]);
  if (!bw.ok()) return with_op(bw.error(), op);
  const int64_t r = x.dim();
  const int64_t batch = r == 3 ? x.sizes[0] : 1;
  const int64_t C = out.sizes[out.dim() - 3], H = os[0], W = os[1];
  const int64_t L = x.sizes[r - 1];
  if (L != *bh * *bw || x.sizes[r - 2] != C * k[0] * k[1]) {
    return Error(ErrorCode::Internal, std::string(op) + ": input sizes differ from the inferred geometry");
  }
  std::vector<double> acc;
  try {
    acc.resize(static_cast<size_t>(C * H * W));
  } catch (const std::bad_alloc&) {
    return Error(ErrorCode::MemoryAllocationFailed, std::string(op) + ": accumulator");
  }
  const float* px = x.data_as<const float>();
  float* po = out.data_as<float>();
  for (int64_t n = 0; n < batch; ++n) {
    std::fill(acc.begin(), acc.end(), 0.0);
    const float* col = px + n * C * k[0] * k[1] * L;
    for (int64_t c = 0; c < C; ++c) {
      for (int64_t i = 0; i < k[0]; ++i) {
        for (int64_t j = 0; j < k[1]; ++j) {
          const float* row = col + ((c * k[0] + i) * k[1] + j) * L;
          for (int64_t by = 0; by < *bh; ++by) {
            const int64_t h = by * s[0] - p[0] + i * d[0];
            if (h < 0 || h >= H) continue;
            for (int64_t bx = 0; bx < *bw; ++bx) {
              const int64_t w = bx * s[1] - p[1] + j * d[1];
              if (w < 0 || w >= W) continue;
              acc[(c * H + h) * W + w] += row[by * *bw + bx];
            }
          }
        }
      }
    }
    float* o = po + n * C * H * W;
    for (int64_t i = 0; i < C * H * W; ++i) o[i] = static_cast<float>(acc[i]);
  }
  return {};
}

template <typename T>
void im2col_copy(const T* src, T* dst, int64_t batch, int64_t C, int64_t H, int64_t W, const std::vector<int64_t>& k,
                 const std::vector<int64_t>& d, const std::vector<int64_t>& p, const std::vector<int64_t>& s,
                 int64_t bh, int64_t bw) {
  const int64_t L = bh * bw;
  for (int64_t n = 0; n < batch; ++n) {
    for (int64_t c = 0; c < C; ++c) {
      const T* plane = src + (n * C + c) * H * W;
      for (int64_t i = 0; i < k[0]; ++i) {
        for (int64_t j = 0; j < k[1]; ++j) {
          T* row = dst + (n * C * k[0] * k[1] + (c * k[0] + i) * k[1] + j) * L;
          for (int64_t by = 0; by < bh; ++by) {
            const int64_t h = by * s[0] - p[0] + i * d[0];
            for (int64_t bx = 0; bx < bw; ++bx) {
              const int64_t w = bx * s[1] - p[1] + j * d[1];
              row[by * bw + bx] = (h >= 0 && h < H && w >= 0 && w < W) ? plane[h * W + w] : T{};
            }
          }
        }
      }
    }
  }
}

/// aten.im2col (F.unfold): out[n, (c*kh + i)*kw + j, by*blocks_w + bx] = in[n, c, h, w] with
/// h = by*sh - ph + i*dh, w = bx*sw - pw + j*dw, or 0 where (h, w) is padding (PyTorch im2col.h);
/// any dtype (zero bytes for padding: 0, 0.0, false).
Error im2col(const KernelArgs& a) {
  const char* op = "aten.im2col";
  const Tensor& x = *a.inputs[0];
  Tensor& out = *a.outputs[0];
  const auto k = a.attrs.get_ints("kernel_size"), d = a.attrs.get_ints("dilation"), p = a.attrs.get_ints("padding"),
             s = a.attrs.get_ints("stride");
  const int64_t r = x.dim();
  const int64_t batch = r == 4 ? x.sizes[0] : 1, C = x.sizes[r - 3], H = x.sizes[r - 2], W = x.sizes[r - 1];
  auto bh = col2im_blocks("height", H, k[0], d[0], p[0], s[0]);
  if (!bh.ok()) return with_op(bh.error(), op);
  auto bw = col2im_blocks("width", W, k[1], d[1], p[1], s[1]);
  if (!bw.ok()) return with_op(bw.error(), op);
  if (out.dtype != x.dtype || out.numel() != batch * C * k[0] * k[1] * *bh * *bw) {
    return Error(ErrorCode::Internal, std::string(op) + ": output type differs from the inferred one");
  }
  switch (dtype_size(x.dtype)) {
    case 1: im2col_copy(x.data_as<const uint8_t>(), out.data_as<uint8_t>(), batch, C, H, W, k, d, p, s, *bh, *bw); break;
    case 2: im2col_copy(x.data_as<const uint16_t>(), out.data_as<uint16_t>(), batch, C, H, W, k, d, p, s, *bh, *bw); break;
    case 4: im2col_copy(x.data_as<const uint32_t>(), out.data_as<uint32_t>(), batch, C, H, W, k, d, p, s, *bh, *bw); break;
    case 8: im2col_copy(x.data_as<const uint64_t>(), out.data_as<uint64_t>(), batch, C, H, W, k, d, p, s, *bh, *bw); break;
    default: return Error(ErrorCode::NotSupported, std::string(op) + ": element size");
  }
  return {};
}

// ---- distances

/// The p-norm of the difference of two rows of length m (PyTorch Distance.cpp): p = 0 counts the
/// non-zero differences, p = inf takes the largest |difference|, p = 1 sums them, p = 2 is
/// sqrt(sum d^2) (computed directly, not through a matrix product), else (sum |d|^p)^(1/p).
/// NaN differences propagate (for p = 0 a NaN difference counts as non-zero, as NaN != 0).
float pnorm_distance(const float* a, const float* b, int64_t m, double p) {
  if (p == 0.0) {
    double n = 0.0;
    for (int64_t i = 0; i < m; ++i) n += (a[i] - b[i]) != 0.0f ? 1.0 : 0.0;
    return static_cast<float>(n);
  }
  if (std::isinf(p)) {
    float best = 0.0f;
    for (int64_t i = 0; i < m; ++i) {
      const float v = std::fabs(a[i] - b[i]);
      if (std::isnan(v)) return v;
      best = std::max(best, v);
    }
    return best;
  }
  double sum = 0.0;
  for (int64_t i = 0; i < m; ++i) {
    const double v = std::fabs(static_cast<double>(a[i] - b[i]));
    sum += p == 1.0 ? v : p == 2.0 ? v * v : std::pow(v, p);
  }
  if (p == 1.0) return static_cast<float>(sum);
  if (p == 2.0) return static_cast<float>(std::sqrt(sum));
  return static_cast<float>(std::pow(sum, 1.0 / p));
}

/// aten._cdist_forward: out[..., i, j] = pnorm_distance(x1[..., i, :], x2[..., j, :]) with the batch
/// dims broadcast (compute_mode only selects ATen's algorithm; Kiln always uses the direct one).
Error cdist_forward(const KernelArgs& a) {
  KILN_RETURN_IF_ERROR(check_f32(a, "aten._cdist_forward"));
  const Tensor& x1 = *a.inputs[0];
  const Tensor& x2 = *a.inputs[1];
  Tensor& out = *a.outputs[0];
  const double p = a.attrs.get_float("p");
  const int64_t P = x1.sizes[x1.dim() - 2], R = x2.sizes[x2.dim() - 2], M = x1.sizes.back();
  const std::vector<int64_t> batch(out.sizes.begin(), out.sizes.end() - 2);
  std::vector<int64_t> b1(x1.sizes.begin(), x1.sizes.end() - 2), b2(x2.sizes.begin(), x2.sizes.end() - 2);
  const BroadcastIndex i1(b1, batch), i2(b2, batch);
  int64_t nb = 1;
  for (int64_t v : batch) nb *= v;
  const float* p1 = x1.data_as<const float>();
  const float* p2 = x2.data_as<const float>();
  float* po = out.data_as<float>();
  for (int64_t b = 0; b < nb; ++b) {
    const float* m1 = p1 + i1(b) * P * M;
    const float* m2 = p2 + i2(b) * R * M;
    for (int64_t i = 0; i < P; ++i) {
      for (int64_t j = 0; j < R; ++j) po[(b * P + i) * R + j] = pnorm_distance(m1 + i * M, m2 + j * M, M, p);
    }
  }
  return {};
}

/// aten._pdist_forward: the distances of the row pairs (i, j), i < j, in row-major order.
Error pdist_forward(const KernelArgs& a) {
  KILN_RETURN_IF_ERROR(check_f32(a, "aten._pdist_forward"));
  const Tensor& x = *a.inputs[0];
  const double p = a.attrs.get_float("p");
  const int64_t N = x.sizes[0], M = x.sizes[1];
  const float* px = x.data_as<const float>();
  float* po = a.outputs[0]->data_as<float>();
  int64_t k = 0;
  for (int64_t i = 0; i < N; ++i) {
    for (int64_t j = i + 1; j < N; ++j) po[k++] = pnorm_distance(px + i * M, px + j * M, M, p);
  }
  return {};
}

}  // namespace

void register_portable_spatial_extra(KernelRegistry& r) {
  r.add("aten.reflection_pad1d", pad_kernel<1, true>);
  r.add("aten.reflection_pad2d", pad_kernel<2, true>);
  r.add("aten.reflection_pad3d", pad_kernel<3, true>);
  r.add("aten.replication_pad1d", pad_kernel<1, false>);
  r.add("aten.replication_pad2d", pad_kernel<2, false>);
  r.add("aten.replication_pad3d", pad_kernel<3, false>);
  r.add("aten.max_pool3d_with_indices", max_pool3d_with_indices);
  r.add("aten.avg_pool3d", avg_pool3d);
  r.add("aten._adaptive_avg_pool3d", adaptive_avg_pool3d);
  r.add("aten.adaptive_max_pool2d", adaptive_max_pool<2>);
  r.add("aten.adaptive_max_pool3d", adaptive_max_pool<3>);
  r.add("aten.grid_sampler_2d", grid_sampler_2d);
  r.add("aten.grid_sampler_3d", grid_sampler_3d);
  r.add("aten.col2im", col2im);
  r.add("aten.im2col", im2col);
  r.add("aten._cdist_forward", cdist_forward);
  r.add("aten._pdist_forward", pdist_forward);
}

}  // namespace kiln
