// Portable reduction kernels: sum, mean, amax, amin, argmax, argmin, any, max/min (dim), prod, var,
// _softmax, _log_softmax, cumsum.
// Float sums and softmax accumulate in double (more accurate than PyTorch's float cascade sum,
// within 1e-5 relative of it; float64 ones are plain double sums, within 1e-12 relative of
// torch's cascade sum for the sizes tested); integer sums wrap in int64 as torch's do. amax/amin propagate NaN
// and argmax returns the first maximum (NaN counting as the maximum), as torch does.
// Which dims are reduced comes from shape_rules.h, the same rule the ops' inference uses.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>

#include "ir/op_registry.h"
#include "ir/ops/shape_rules.h"
#include "kernels/kernel.h"

namespace kiln {
namespace {

namespace sr = shape_rules;

template <class T> struct TypeTag { using type = T; };

/// Input strides of the kept dims (one entry per output element, row-major) and of the
/// reduced dims (iterated row-major, so argmax sees candidates in increasing index order).
struct ReducePlan {
  std::vector<int64_t> kept_sizes, kept_strides, red_sizes, red_strides;
};

ReducePlan make_plan(const std::vector<int64_t>& sizes, const std::vector<bool>& mask) {
  ReducePlan p;
  const std::vector<int64_t> strides = sr::contiguous_strides(sizes);
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (mask[d]) {
      p.red_sizes.push_back(sizes[d]);
      p.red_strides.push_back(strides[d]);
    } else {
      p.kept_sizes.push_back(sizes[d]);
      p.kept_strides.push_back(strides[d]);
    }
  }
  return p;
}

/// Calls f(offset) for every coordinate of `sizes` in row-major order, offset = sum i_d * strides[d].
/// A rank-0 space has one point (offset 0); a space with a zero size has none.
template <typename F>
void for_each_offset(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides, F&& f) {
  for (int64_t s : sizes) {
    if (s == 0) return;
  }
  const size_t rank = sizes.size();
  std::vector<int64_t> idx(rank, 0);
  int64_t off = 0;
  while (true) {
    f(off);
    size_t d = rank;
    while (d > 0) {
      --d;
      off += strides[d];
      if (++idx[d] < sizes[d]) break;
      off -= strides[d] * sizes[d];
      idx[d] = 0;
      if (d == 0) return;
    }
    if (rank == 0) return;
  }
}

/// Resolves the reduced dims of `x` for an op with a `dim` int[] attribute (None or [] = all)
/// and checks that `out` has the sizes inference gave it.
Result<ReducePlan> plan_for(const char* op, const Tensor& x, const Tensor& out, const Attributes& attrs,
                            bool int_dim = false) {
  std::optional<std::vector<int64_t>> dims;
  if (!attrs.is_none("dim")) dims = int_dim ? std::vector<int64_t>{attrs.get_int("dim")} : attrs.get_ints("dim");
  auto mask = sr::reduction_mask(dims, x.dim(), "dim");
  if (!mask.ok()) return Error(mask.error().code(), std::string(op) + ": " + mask.error().message());
  const std::vector<int64_t> want = sr::reduced_sizes(x.sizes, *mask, attrs.get_bool("keepdim"));
  if (out.sizes != want) {
    return Error(ErrorCode::Internal, std::string(op) + ": output " + out.type().to_string() +
                                          " does not match the reduced sizes " + sizes_to_string(want));
  }
  return make_plan(x.sizes, *mask);
}

/// Runs `reduce(base_offset) -> value` for every output element, in output order.
template <typename Out, typename F>
void reduce_each(const ReducePlan& p, Out* out, F&& reduce) {
  int64_t o = 0;
  for_each_offset(p.kept_sizes, p.kept_strides, [&](int64_t base) { out[o++] = reduce(base); });
}

template <typename T>
void sum_int(const Tensor& x, const ReducePlan& p, int64_t* out) {
  const T* px = x.data_as<const T>();
  reduce_each(p, out, [&](int64_t base) {
    uint64_t acc = 0;  // unsigned: wraps like torch's int64 sum, without undefined behaviour
    for_each_offset(p.red_sizes, p.red_strides, [&](int64_t off) {
      acc += static_cast<uint64_t>(static_cast<int64_t>(px[base + off]));
    });
    return static_cast<int64_t>(acc);
  });
}

Error sum_or_mean(const KernelArgs& a, bool mean) {
  const char* op = mean ? "aten.mean" : "aten.sum";
  const Tensor& x = *a.inputs[0];
  Tensor& out = *a.outputs[0];
  auto plan = plan_for(op, x, out, a.attrs);
  if (!plan.ok()) return plan.error();
  const ReducePlan& p = plan.value();
  auto float_sum = [&](auto tag) {
    using T = typename decltype(tag)::type;
    int64_t count = 1;
    for (int64_t s : p.red_sizes) count *= s;
    const T* px = x.data_as<const T>();
    reduce_each(p, out.data_as<T>(), [&](int64_t base) {
      double acc = 0.0;
      for_each_offset(p.red_sizes, p.red_strides, [&](int64_t off) { acc += static_cast<double>(px[base + off]); });
      // mean of nothing is 0/0 = NaN, as torch gives.
      return static_cast<T>(mean ? acc / static_cast<double>(count) : acc);
    });
    return Error{};
  };
  if (x.dtype == DType::Float32 && out.dtype == DType::Float32) return float_sum(TypeTag<float>{});
  if (x.dtype == DType::Float64 && out.dtype == DType::Float64) return float_sum(TypeTag<double>{});
  if (!mean && out.dtype == DType::Int64) {
    int64_t* po = out.data_as<int64_t>();
    switch (x.dtype) {
      case DType::Int64: sum_int<int64_t>(x, p, po); return {};
      case DType::Int32: sum_int<int32_t>(x, p, po); return {};
      case DType::Int8: sum_int<int8_t>(x, p, po); return {};
      case DType::UInt8: sum_int<uint8_t>(x, p, po); return {};
      case DType::Bool: sum_int<uint8_t>(x, p, po); return {};  // bools are stored as 0/1 bytes
      default: break;
    }
  }
  return Error(ErrorCode::NotSupported, std::string(op) + ": dtype " + dtype_name(x.dtype) + " -> " +
                                            dtype_name(out.dtype) + " is not supported");
}

Error sum(const KernelArgs& a) { return sum_or_mean(a, false); }
Error mean(const KernelArgs& a) { return sum_or_mean(a, true); }

template <typename T>
bool is_nan(T v) {
  if constexpr (std::is_floating_point_v<T>) {
    return std::isnan(v);
  } else {
    return false;
  }
}

// amax (is_max) or amin of one dtype; the first NaN seen wins and stays.
template <typename T>
void extremum(const Tensor& x, const ReducePlan& p, T* out, bool is_max) {
  const T* px = x.data_as<const T>();
  reduce_each(p, out, [&](int64_t base) {
    bool first = true;
    T best{};
    for_each_offset(p.red_sizes, p.red_strides, [&](int64_t off) {
      const T v = px[base + off];
      if (first) {
        best = v;
        first = false;
      } else if (!is_nan(best) && (is_nan(v) || (is_max ? v > best : v < best))) {
        best = v;
      }
    });
    return best;
  });
}

Error amax_amin(const KernelArgs& a, bool is_max) {
  const char* op = is_max ? "aten.amax" : "aten.amin";
  const Tensor& x = *a.inputs[0];
  Tensor& out = *a.outputs[0];
  auto plan = plan_for(op, x, out, a.attrs);
  if (!plan.ok()) return plan.error();
  for (int64_t s : plan->red_sizes) {
    if (s == 0) return Error(ErrorCode::Internal, std::string(op) + ": reduction over an empty dim");
  }
  if (out.dtype != x.dtype) return Error(ErrorCode::Internal, std::string(op) + ": output dtype differs from input");
  switch (x.dtype) {
    case DType::Float32: extremum<float>(x, *plan, out.data_as<float>(), is_max); return {};
    case DType::Float64: extremum<double>(x, *plan, out.data_as<double>(), is_max); return {};
    case DType::Int64: extremum<int64_t>(x, *plan, out.data_as<int64_t>(), is_max); return {};
    case DType::Int32: extremum<int32_t>(x, *plan, out.data_as<int32_t>(), is_max); return {};
    case DType::Int8: extremum<int8_t>(x, *plan, out.data_as<int8_t>(), is_max); return {};
    case DType::UInt8:
    case DType::Bool: extremum<uint8_t>(x, *plan, out.data_as<uint8_t>(), is_max); return {};
    default: return Error(ErrorCode::NotSupported, std::string(op) + ": dtype " + dtype_name(x.dtype));
  }
}

Error amax(const KernelArgs& a) { return amax_amin(a, true); }
Error amin(const KernelArgs& a) { return amax_amin(a, false); }

/// Calls f(TypeTag<T>{}) for the storage type T of `d` among float32, float64, int64, int32, int8,
/// uint8 and bool (stored as 0/1 bytes: uint8_t); returns NotSupported naming `op` otherwise.
template <typename F>
Error visit_real(DType d, const char* op, F&& f) {
  switch (d) {
    case DType::Float32: f(TypeTag<float>{}); return {};
    case DType::Float64: f(TypeTag<double>{}); return {};
    case DType::Int64: f(TypeTag<int64_t>{}); return {};
    case DType::Int32: f(TypeTag<int32_t>{}); return {};
    case DType::Int8: f(TypeTag<int8_t>{}); return {};
    case DType::UInt8:
    case DType::Bool: f(TypeTag<uint8_t>{}); return {};
    default: return Error(ErrorCode::NotSupported, std::string(op) + ": dtype " + dtype_name(d));
  }
}

// Index (in the row-major order of the reduced space) of the first maximum (Largest) or minimum;
// a NaN counts as both (torch.argmax / torch.argmin: the first NaN wins).
template <typename T, bool Largest>
void arg_extreme_of(const Tensor& x, const ReducePlan& p, int64_t* out) {
  const T* px = x.data_as<const T>();
  reduce_each(p, out, [&](int64_t base) {
    int64_t i = 0, best_i = 0;
    T best{};
    for_each_offset(p.red_sizes, p.red_strides, [&](int64_t off) {
      const T v = px[base + off];
      if (i == 0 || (!is_nan(best) && (is_nan(v) || (Largest ? v > best : v < best)))) {
        best = v;
        best_i = i;
      }
      ++i;
    });
    return best_i;
  });
}

/// aten.argmax / aten.argmin: int64 output; float32, float64, int64, int32, int8, uint8 inputs.
template <bool Largest>
Error arg_extreme(const KernelArgs& a) {
  const char* op = Largest ? "aten.argmax" : "aten.argmin";
  const Tensor& x = *a.inputs[0];
  Tensor& out = *a.outputs[0];
  auto plan = plan_for(op, x, out, a.attrs, /*int_dim=*/true);
  if (!plan.ok()) return plan.error();
  for (int64_t s : plan->red_sizes) {
    if (s == 0) return Error(ErrorCode::Internal, std::string(op) + ": reduction over an empty dim");
  }
  if (out.dtype != DType::Int64 || x.dtype == DType::Bool) {
    return Error(ErrorCode::NotSupported, std::string(op) + ": bool input or non-int64 output");
  }
  return visit_real(x.dtype, op, [&](auto tag) {
    arg_extreme_of<typename decltype(tag)::type, Largest>(x, *plan, out.data_as<int64_t>());
  });
}

Error argmax(const KernelArgs& a) { return arg_extreme<true>(a); }
Error argmin(const KernelArgs& a) { return arg_extreme<false>(a); }

/// aten.any: out = some element of the reduced set != 0 (NaN counts, -0.0 does not); dim None
/// reduces every dim, [] none (the inference's rule); every dtype (float16/bfloat16 by their bits).
Error any(const KernelArgs& a) {
  const Tensor& x = *a.inputs[0];
  Tensor& out = *a.outputs[0];
  std::vector<bool> mask(static_cast<size_t>(x.dim()), true);
  if (!a.attrs.is_none("dim")) {
    const auto dims = a.attrs.get_ints("dim");
    if (dims.empty()) {
      mask.assign(mask.size(), false);
    } else {
      auto m = sr::reduction_mask(dims, x.dim(), "dim");
      if (!m.ok()) return Error(m.error().code(), "aten.any: " + m.error().message());
      mask = *m;
    }
  }
  const DType want = x.dtype == DType::UInt8 ? DType::UInt8 : DType::Bool;  // torch keeps uint8
  if (out.dtype != want || out.sizes != sr::reduced_sizes(x.sizes, mask, a.attrs.get_bool("keepdim"))) {
    return Error(ErrorCode::Internal, "aten.any: output type differs from the inferred one");
  }
  const ReducePlan p = make_plan(x.sizes, mask);
  auto run = [&](auto nonzero) {
    reduce_each(p, out.data_as<uint8_t>(), [&](int64_t base) {
      bool r = false;
      for_each_offset(p.red_sizes, p.red_strides, [&](int64_t off) { r = r || nonzero(base + off); });
      return static_cast<uint8_t>(r);
    });
  };
  if (x.dtype == DType::Float16 || x.dtype == DType::BFloat16) {
    const uint16_t* px = x.data_as<const uint16_t>();
    run([&](int64_t i) { return (px[i] & 0x7fffu) != 0; });
    return {};
  }
  return visit_real(x.dtype, "aten.any", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = x.data_as<const T>();
    run([&](int64_t i) { return px[i] != T(0) || is_nan(px[i]); });
  });
}

/// aten.max / aten.min (the dim forms): values and the int64 index of the first extremum along
/// dim; the first NaN wins and stays (torch's rule: NaN propagates with its index).
Error max_min_dim(const KernelArgs& a, bool is_max) {
  const char* op = is_max ? "aten.max" : "aten.min";
  const Tensor& x = *a.inputs[0];
  Tensor& vals = *a.outputs[0];
  Tensor& idx = *a.outputs[1];
  auto plan = plan_for(op, x, vals, a.attrs, /*int_dim=*/true);
  if (!plan.ok()) return plan.error();
  for (int64_t s : plan->red_sizes) {
    if (s == 0) return Error(ErrorCode::Internal, std::string(op) + ": reduction over an empty dim");
  }
  if (vals.dtype != x.dtype || idx.dtype != DType::Int64 || idx.sizes != vals.sizes) {
    return Error(ErrorCode::Internal, std::string(op) + ": output types differ from the inferred ones");
  }
  return visit_real(x.dtype, op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = x.data_as<const T>();
    T* pv = vals.data_as<T>();
    int64_t* pi = idx.data_as<int64_t>();
    int64_t o = 0;
    for_each_offset(plan->kept_sizes, plan->kept_strides, [&](int64_t base) {
      int64_t i = 0, best_i = 0;
      T best{};
      for_each_offset(plan->red_sizes, plan->red_strides, [&](int64_t off) {
        const T v = px[base + off];
        if (i == 0 || (!is_nan(best) && (is_nan(v) || (is_max ? v > best : v < best)))) {
          best = v;
          best_i = i;
        }
        ++i;
      });
      pv[o] = best;
      pi[o] = best_i;
      ++o;
    });
  });
}

Error max_dim(const KernelArgs& a) { return max_min_dim(a, true); }
Error min_dim(const KernelArgs& a) { return max_min_dim(a, false); }

/// aten.prod: the product over the reduced dims (1 for an empty set) in the output's accumulation
/// type: double for float32/float64 outputs (then rounded), wrapping 64-bit for integer outputs (an
/// int32 output keeps the low 32 bits, which is what a wrapping int32 product gives).
Error prod(const KernelArgs& a) {
  const Tensor& x = *a.inputs[0];
  Tensor& out = *a.outputs[0];
  auto plan = plan_for("aten.prod", x, out, a.attrs, /*int_dim=*/true);
  if (!plan.ok()) return plan.error();
  const ReducePlan& p = *plan;
  const bool int_out = out.dtype == DType::Int64 || out.dtype == DType::Int32;
  if (!int_out && out.dtype != DType::Float32 && out.dtype != DType::Float64) {
    return Error(ErrorCode::NotSupported, std::string("aten.prod: output dtype ") + dtype_name(out.dtype));
  }
  if (int_out && (x.dtype == DType::Float32 || x.dtype == DType::Float64)) {
    return Error(ErrorCode::NotSupported, "aten.prod: an integer dtype for a floating input");
  }
  return visit_real(x.dtype, "aten.prod", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = x.data_as<const T>();
    auto run = [&](auto out_tag, auto acc_init) {
      using O = typename decltype(out_tag)::type;
      using Acc = decltype(acc_init);
      reduce_each(p, out.data_as<O>(), [&](int64_t base) {
        Acc acc = acc_init;
        for_each_offset(p.red_sizes, p.red_strides, [&](int64_t off) {
          if constexpr (std::is_floating_point_v<Acc>) {
            acc *= static_cast<double>(static_cast<O>(px[base + off]));  // torch converts self to dtype first
          } else {
            acc *= static_cast<uint64_t>(static_cast<int64_t>(px[base + off]));  // wraps, no UB
          }
        });
        return static_cast<O>(acc);
      });
    };
    switch (out.dtype) {
      case DType::Float32: run(TypeTag<float>{}, 1.0); break;
      case DType::Float64: run(TypeTag<double>{}, 1.0); break;
      case DType::Int64:
        if constexpr (std::is_integral_v<T>) run(TypeTag<int64_t>{}, uint64_t{1});
        break;
      case DType::Int32:
        if constexpr (std::is_integral_v<T>) run(TypeTag<int32_t>{}, uint64_t{1});
        break;
      default: break;
    }
  });
}

/// aten.var: sum((x - mean)^2) / max(N - correction, 0) over the reduced dims, two passes in
/// double (the mean first, then the squared deviations: no cancellation for large means);
/// correction None = 1. N = 0 gives NaN, N <= correction gives inf or NaN, as torch.
Error var(const KernelArgs& a) {
  const Tensor& x = *a.inputs[0];
  Tensor& out = *a.outputs[0];
  auto plan = plan_for("aten.var", x, out, a.attrs);
  if (!plan.ok()) return plan.error();
  const ReducePlan& p = *plan;
  const double correction = a.attrs.is_none("correction") ? 1.0 : a.attrs.get_float("correction");
  int64_t count = 1;
  for (int64_t s : p.red_sizes) count *= s;
  const double denom = std::max(0.0, static_cast<double>(count) - correction);
  auto run = [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = x.data_as<const T>();
    reduce_each(p, out.data_as<T>(), [&](int64_t base) {
      double sum = 0.0;
      for_each_offset(p.red_sizes, p.red_strides, [&](int64_t off) { sum += static_cast<double>(px[base + off]); });
      const double mean = sum / static_cast<double>(count);
      double ss = 0.0;
      for_each_offset(p.red_sizes, p.red_strides, [&](int64_t off) {
        const double d = static_cast<double>(px[base + off]) - mean;
        ss += d * d;
      });
      return static_cast<T>(ss / denom);
    });
  };
  if (out.dtype != x.dtype) return Error(ErrorCode::Internal, "aten.var: output dtype differs from the input's");
  if (x.dtype == DType::Float32) run(TypeTag<float>{});
  else if (x.dtype == DType::Float64) run(TypeTag<double>{});
  else return Error(ErrorCode::NotSupported, std::string("aten.var: dtype ") + dtype_name(x.dtype));
  return {};
}

// softmax / log_softmax along one dim, numerically stable (x - max), sums in double
// (PyTorch aten/src/ATen/native/cpu/SoftMaxKernel.cpp computes the same quantities). T is the
// storage type: float (float32) or double (float64).
template <class T>
Error softmax_impl(const KernelArgs& a, bool log) {
  const char* op = log ? "aten._log_softmax" : "aten._softmax";
  const Tensor& x = *a.inputs[0];
  Tensor& out = *a.outputs[0];
  auto d = wrap_dim(a.attrs.get_int("dim"), x.dim());
  if (!d.ok()) return Error(ErrorCode::InvalidArgument, std::string(op) + ": dim: " + d.error().message());
  int64_t outer = 1, n = 1, inner = 1;
  for (int64_t k = 0; k < x.dim(); ++k) {
    const int64_t s = x.sizes[static_cast<size_t>(k)];
    if (k < *d) outer *= s;
    else if (k == *d) n = s;
    else inner *= s;
  }
  const T* px = x.data_as<const T>();
  T* po = out.data_as<T>();
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      const T* xs = px + o * n * inner + i;
      T* ys = po + o * n * inner + i;
      double mx = -std::numeric_limits<double>::infinity();
      bool any_nan = false;
      for (int64_t k = 0; k < n; ++k) {
        const double v = xs[k * inner];
        if (std::isnan(v)) any_nan = true;
        if (v > mx) mx = v;
      }
      if (any_nan) mx = std::numeric_limits<double>::quiet_NaN();
      double s = 0.0;
      for (int64_t k = 0; k < n; ++k) s += std::exp(static_cast<double>(xs[k * inner]) - mx);
      if (log) {
        const double lse = std::log(s);
        for (int64_t k = 0; k < n; ++k) ys[k * inner] = static_cast<T>(static_cast<double>(xs[k * inner]) - mx - lse);
      } else {
        for (int64_t k = 0; k < n; ++k) ys[k * inner] = static_cast<T>(std::exp(static_cast<double>(xs[k * inner]) - mx) / s);
      }
    }
  }
  return {};
}

Error softmax_dispatch(const KernelArgs& a, bool log) {
  const Tensor& x = *a.inputs[0];
  const Tensor& out = *a.outputs[0];
  if (out.dtype != x.dtype || out.sizes != x.sizes || (x.dtype != DType::Float32 && x.dtype != DType::Float64)) {
    return Error(ErrorCode::Internal, std::string(log ? "aten._log_softmax" : "aten._softmax") +
                                          ": output type differs from the input's (float32 or float64)");
  }
  return x.dtype == DType::Float64 ? softmax_impl<double>(a, log) : softmax_impl<float>(a, log);
}

Error softmax(const KernelArgs& a) { return softmax_dispatch(a, false); }
Error log_softmax(const KernelArgs& a) { return softmax_dispatch(a, true); }

// cumsum along dim: out[..., k, ...] = sum_{j <= k} x[..., j, ...], accumulated in the
// accumulation type of the output (double for float32/float64, as ATen's CPU cumsum uses
// acc_type<float> = double; wrapping int64 for int64 outputs), then stored in the output dtype.
template <class Out, class Acc>
void cumsum_typed(const Tensor& x, Tensor& out, int64_t outer, int64_t n, int64_t inner) {
  Out* po = out.data_as<Out>();
  auto load = [&](int64_t i) -> Acc {
    switch (x.dtype) {
      case DType::Float32: return static_cast<Acc>(x.data_as<const float>()[i]);
      case DType::Float64: return static_cast<Acc>(x.data_as<const double>()[i]);
      case DType::Int64: return static_cast<Acc>(x.data_as<const int64_t>()[i]);
      case DType::Int32: return static_cast<Acc>(x.data_as<const int32_t>()[i]);
      case DType::Int8: return static_cast<Acc>(x.data_as<const int8_t>()[i]);
      default: return static_cast<Acc>(x.data_as<const uint8_t>()[i]);  // UInt8, Bool (0/1 bytes)
    }
  };
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      Acc acc = 0;
      for (int64_t k = 0; k < n; ++k) {
        const int64_t idx = (o * n + k) * inner + i;
        if constexpr (std::is_integral_v<Acc>) {
          acc = static_cast<Acc>(static_cast<uint64_t>(acc) + static_cast<uint64_t>(load(idx)));  // wraps, no UB
        } else {
          acc += static_cast<Acc>(static_cast<Out>(load(idx)));  // torch converts self to dtype first
        }
        po[idx] = static_cast<Out>(acc);
      }
    }
  }
}

Error cumsum(const KernelArgs& a) {
  const Tensor& x = *a.inputs[0];
  Tensor& out = *a.outputs[0];
  if (out.sizes != x.sizes) return Error(ErrorCode::Internal, "aten.cumsum: output sizes differ from the input's");
  if (x.dtype == DType::Float16 || x.dtype == DType::BFloat16) {
    return Error(ErrorCode::NotSupported, std::string("aten.cumsum: dtype ") + dtype_name(x.dtype));
  }
  auto d = wrap_dim(a.attrs.get_int("dim"), x.dim());
  if (!d.ok()) return Error(ErrorCode::InvalidArgument, "aten.cumsum: dim: " + d.error().message());
  int64_t outer = 1, n = 1, inner = 1;
  for (int64_t k = 0; k < x.dim(); ++k) {
    const int64_t s = x.sizes[static_cast<size_t>(k)];
    if (k < *d) outer *= s;
    else if (k == *d) n = s;
    else inner *= s;
  }
  if (x.numel() == 0) return {};
  switch (out.dtype) {
    case DType::Float32: cumsum_typed<float, double>(x, out, outer, n, inner); return {};
    case DType::Float64: cumsum_typed<double, double>(x, out, outer, n, inner); return {};
    case DType::Int64:
      if (x.dtype == DType::Float32 || x.dtype == DType::Float64) {
        return Error(ErrorCode::NotSupported, "aten.cumsum: a float input with dtype int64");
      }
      cumsum_typed<int64_t, int64_t>(x, out, outer, n, inner);
      return {};
    default: return Error(ErrorCode::NotSupported, std::string("aten.cumsum: output dtype ") + dtype_name(out.dtype));
  }
}

}  // namespace

void register_portable_reduction(KernelRegistry& r) {
  r.add("aten.sum", sum);
  r.add("aten.mean", mean);
  r.add("aten.amax", amax);
  r.add("aten.amin", amin);
  r.add("aten.argmax", argmax);
  r.add("aten._softmax", softmax);
  r.add("aten._log_softmax", log_softmax);
  r.add("aten.cumsum", cumsum);
  r.add("aten.argmin", argmin);
  r.add("aten.any", any);
  r.add("aten.max", max_dim);
  r.add("aten.min", min_dim);
  r.add("aten.prod", prod);
  r.add("aten.var", var);
}

}  // namespace kiln
