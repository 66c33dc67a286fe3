// The broadcasting map of the portable elementwise kernels and what their families share:
// element storage types and PyTorch's dtype conversions, the N-input broadcasting iteration
// (`map_elements`), dtype visitors, wrapping integer arithmetic and the kernel templates
// (float_unary, arith_unary, arith_binary, float_binary, compare_binary) that an op instantiates
// with its formula functor. Used by src/kernels/portable/elementwise.cpp and math.cpp.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ir/op_registry.h"
#include "kernels/kernel.h"

namespace kiln::portable_ew {

// ---------------------------------------------------------------------------------------------
// Element storage types and conversions
// ---------------------------------------------------------------------------------------------

/// Storage of one float16 / bfloat16 element (raw bits; arithmetic goes through float).
struct Half { uint16_t bits; };
struct BFloat16 { uint16_t bits; };

template <class T> struct Tag { using type = T; };

template <class T>
constexpr bool kIsHalfLike = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

/// The DType whose storage type is T.
template <class T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DType::Float32;
  else if constexpr (std::is_same_v<T, double>) return DType::Float64;
  else if constexpr (std::is_same_v<T, Half>) return DType::Float16;
  else if constexpr (std::is_same_v<T, BFloat16>) return DType::BFloat16;
  else if constexpr (std::is_same_v<T, int64_t>) return DType::Int64;
  else if constexpr (std::is_same_v<T, int32_t>) return DType::Int32;
  else if constexpr (std::is_same_v<T, int8_t>) return DType::Int8;
  else if constexpr (std::is_same_v<T, uint8_t>) return DType::UInt8;
  else {
    static_assert(std::is_same_v<T, bool>);
    return DType::Bool;
  }
}

/// Calls f(Tag<T>{}) with T the storage type of `d` (any of the 9 Kiln dtypes).
template <class F>
decltype(auto) visit_dtype(DType d, F&& f) {
  switch (d) {
    case DType::Float32: return f(Tag<float>{});
    case DType::Float16: return f(Tag<Half>{});
    case DType::BFloat16: return f(Tag<BFloat16>{});
    case DType::Int64: return f(Tag<int64_t>{});
    case DType::Int32: return f(Tag<int32_t>{});
    case DType::Int8: return f(Tag<int8_t>{});
    case DType::UInt8: return f(Tag<uint8_t>{});
    case DType::Float64: return f(Tag<double>{});
    case DType::Bool: break;
  }
  return f(Tag<bool>{});
}

/// float -> integer with PyTorch's semantics: truncation toward zero (C++ static_cast).
/// For int8/uint8 PyTorch goes through int64 and keeps the low byte (c10/util/TypeCast.h,
/// static_cast_with_inter_type for uint8; x86-64 truncation for int8), so -2.5 -> uint8 254
/// and 300.0 -> 44. Out of range and NaN are undefined behaviour in C++ and hence in PyTorch;
/// here they are defined as PyTorch shows them on x86-64: the type's minimum for int32/int64
/// ("integer indefinite"), 0 for int8/uint8 (the low byte of INT64_MIN). F is float or double
/// (float64 converts directly, without going through float32).
template <class To, class F>
To float_to_int(F v) {
  if constexpr (sizeof(To) == 1) {
    constexpr F kLimit = F(9223372036854775808.0);  // 2^63
    if (!(v >= -kLimit && v < kLimit)) return To(0);
    return static_cast<To>(static_cast<int64_t>(v));  // C++20: modular narrowing
  } else {
    constexpr F kLimit = static_cast<F>(std::numeric_limits<To>::max()) + F(1);  // 2^31 or 2^63
    if (!(v >= -kLimit && v < kLimit)) return std::numeric_limits<To>::min();
    return static_cast<To>(v);
  }
}

/// Converts one element between storage types with PyTorch's `Tensor.to(dtype)` semantics:
/// float16/bfloat16 go through float32 (round to nearest even, include/kiln/dtype.h; float64 ->
/// float16 rounds to float32 first, as c10::Half(float) does in PyTorch's cast);
/// -> bool is `v != 0` (NaN is true); bool -> number is 0/1; integer narrowing is modular;
/// float -> integer as float_to_int.
template <class To, class From>
To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<From, Half>) {
    return convert<To>(half_to_float(v.bits));
  } else if constexpr (std::is_same_v<From, BFloat16>) {
    return convert<To>(bfloat16_to_float(v.bits));
  } else if constexpr (std::is_same_v<To, Half>) {
    return Half{float_to_half(convert<float>(v))};
  } else if constexpr (std::is_same_v<To, BFloat16>) {
    return BFloat16{float_to_bfloat16(convert<float>(v))};
  } else if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else if constexpr (std::is_integral_v<To> && std::is_floating_point_v<From>) {
    return float_to_int<To, From>(v);
  } else {
    return static_cast<To>(v);
  }
}

/// Reads element i of a tensor whose storage type is T.
template <class T>
struct DirectLoad {
  const T* p;
  T operator[](int64_t i) const { return p[i]; }
};

/// Reads element i of a tensor of any dtype, converted to T (type promotion of mixed inputs).
template <class T>
struct ConvertLoad {
  const void* p;
  DType dtype;
  T operator[](int64_t i) const {
    return visit_dtype(dtype, [&](auto tag) -> T {
      using S = typename decltype(tag)::type;
      return convert<T>(static_cast<const S*>(p)[i]);
    });
  }
};

// ---------------------------------------------------------------------------------------------
// Broadcasting iteration
// ---------------------------------------------------------------------------------------------

/// How N contiguous inputs map onto a contiguous output: output dims of size 1 are dropped and
/// adjacent dims that every input either spans fully or broadcasts over are merged, so
/// same-shape operands become one run. strides[k][d] is input k's element stride along
/// coalesced dim d (0 where it broadcasts). rank >= 1.
template <size_t N>
struct BroadcastPlan {
  std::vector<int64_t> sizes;
  std::array<std::vector<int64_t>, N> strides;
};

/// Builds the plan. Requires each input shape to broadcast to `out` (checked by inference).
template <size_t N>
BroadcastPlan<N> plan_broadcast(const std::vector<int64_t>& out, const std::array<const std::vector<int64_t>*, N>& in) {
  const size_t r = out.size();
  BroadcastPlan<N> plan;
  std::vector<std::array<bool, N>> flags;  // per coalesced dim: input k broadcasts
  for (size_t d = 0; d < r; ++d) {
    if (out[d] == 1) continue;
    std::array<bool, N> f{};
    for (size_t k = 0; k < N; ++k) {
      const size_t lead = r - in[k]->size();
      f[k] = d < lead || (*in[k])[d - lead] == 1;
    }
    if (!flags.empty() && flags.back() == f) {
      plan.sizes.back() *= out[d];
    } else {
      plan.sizes.push_back(out[d]);
      flags.push_back(f);
    }
  }
  if (plan.sizes.empty()) {  // 0-d or all-ones output: one element
    plan.sizes.push_back(1);
    flags.push_back({});
  }
  for (size_t k = 0; k < N; ++k) {
    plan.strides[k].assign(plan.sizes.size(), 0);
    int64_t running = 1;
    for (size_t d = plan.sizes.size(); d-- > 0;) {
      if (flags[d][k]) continue;
      plan.strides[k][d] = running;
      running *= plan.sizes[d];
    }
  }
  return plan;
}

/// Calls body(out_offset, len, in_offsets, in_steps) for every run of consecutive output
/// elements in [begin, end) along the innermost coalesced dim; element j of a run reads
/// input k at in_offsets[k] + j * in_steps[k] (in_steps are 0 or 1).
template <size_t N, class Body>
void for_each_run(const BroadcastPlan<N>& p, int64_t begin, int64_t end, Body&& body) {
  const size_t r = p.sizes.size();
  std::vector<int64_t> idx(r);
  std::array<int64_t, N> off{}, step{};
  int64_t rem = begin;
  for (size_t d = r; d-- > 0;) {
    idx[d] = rem % p.sizes[d];
    rem /= p.sizes[d];
    for (size_t k = 0; k < N; ++k) off[k] += idx[d] * p.strides[k][d];
  }
  for (size_t k = 0; k < N; ++k) step[k] = p.strides[k][r - 1];
  const int64_t inner = p.sizes[r - 1];
  int64_t pos = begin;
  while (pos < end) {
    const int64_t len = std::min(inner - idx[r - 1], end - pos);
    body(pos, len, off, step);
    pos += len;
    idx[r - 1] += len;
    for (size_t k = 0; k < N; ++k) off[k] += len * step[k];
    // Carry into the outer dims.
    for (size_t d = r - 1; d > 0 && idx[d] == p.sizes[d]; --d) {
      idx[d] = 0;
      idx[d - 1] += 1;
      for (size_t k = 0; k < N; ++k) off[k] += p.strides[k][d - 1] - p.sizes[d] * p.strides[k][d];
    }
  }
}

inline constexpr int64_t kParallelGrain = 1 << 15;  ///< elements per thread chunk, at least

/// Computes out[i] = f(in_0[...], ..., in_{N-1}[...]) over the broadcast of the first N inputs
/// of `a` to the output shape, reading input k as In_k (converted when its dtype differs) and
/// storing Out (a storage type equal to the output's dtype, checked by the caller's dispatch).
/// `f` must be thread-safe: large outputs are split across a.pool.
template <class Out, class... In, size_t... K, class F>
void map_impl(const KernelArgs& a, const F& f, std::index_sequence<K...>) {
  constexpr size_t N = sizeof...(In);
  Tensor& out = *a.outputs[0];
  const int64_t n = out.numel();
  if (n == 0) return;
  const BroadcastPlan<N> plan = plan_broadcast<N>(out.sizes, {&a.inputs[K]->sizes...});
  Out* po = out.data_as<Out>();
  auto run = [&](auto... loads) {
    auto body = [&](int64_t o, int64_t len, const std::array<int64_t, N>& off, const std::array<int64_t, N>& step) {
      if (((step[K] == 1) && ...)) {
        for (int64_t j = 0; j < len; ++j) po[o + j] = f(loads[off[K] + j]...);
      } else {
        for (int64_t j = 0; j < len; ++j) po[o + j] = f(loads[off[K] + j * step[K]]...);
      }
    };
    if (a.pool != nullptr && n >= 2 * kParallelGrain) {
      a.pool->parallel_for(n, kParallelGrain, [&](int64_t b, int64_t e) { for_each_run(plan, b, e, body); });
    } else {
      for_each_run(plan, 0, n, body);
    }
  };
  if (((a.inputs[K]->dtype == dtype_of<In>()) && ...)) {
    run(DirectLoad<In>{a.inputs[K]->template data_as<const In>()}...);
  } else {
    run(ConvertLoad<In>{a.inputs[K]->data, a.inputs[K]->dtype}...);
  }
}

template <class Out, class... In, class F>
void map_elements(const KernelArgs& a, const F& f) {
  map_impl<Out, In...>(a, f, std::index_sequence_for<In...>{});
}

inline Error unsupported(const char* op, DType d) {
  return Error(ErrorCode::NotSupported, std::string(op) + ": dtype " + dtype_name(d) + " has no portable kernel");
}

/// Calls f(Tag<T>{}) for the arithmetic dtypes float32, float64, int64, int32; NotSupported otherwise.
template <class F>
Error visit_arith(const char* op, DType d, F&& f) {
  switch (d) {
    case DType::Float32: return f(Tag<float>{});
    case DType::Float64: return f(Tag<double>{});
    case DType::Int64: return f(Tag<int64_t>{});
    case DType::Int32: return f(Tag<int32_t>{});
    default: return unsupported(op, d);
  }
}

/// Calls f(Tag<T>{}) for every dtype except float16/bfloat16 (comparison compute types).
template <class F>
Error visit_comparable(const char* op, DType d, F&& f) {
  switch (d) {
    case DType::Float32: return f(Tag<float>{});
    case DType::Float64: return f(Tag<double>{});
    case DType::Int64: return f(Tag<int64_t>{});
    case DType::Int32: return f(Tag<int32_t>{});
    case DType::Int8: return f(Tag<int8_t>{});
    case DType::UInt8: return f(Tag<uint8_t>{});
    case DType::Bool: return f(Tag<bool>{});
    default: return unsupported(op, d);
  }
}

template <class Op>
Op make_op(const Attributes& attrs) {
  if constexpr (std::is_constructible_v<Op, const Attributes&>) return Op(attrs);
  else return Op{};
}

// Two's-complement wrapping integer arithmetic (what PyTorch's CPU kernels produce on
// overflow, without C++ undefined behaviour).
template <class T> T wrap_add(T x, T y) { using U = std::make_unsigned_t<T>; return static_cast<T>(static_cast<U>(x) + static_cast<U>(y)); }
template <class T> T wrap_sub(T x, T y) { using U = std::make_unsigned_t<T>; return static_cast<T>(static_cast<U>(x) - static_cast<U>(y)); }
template <class T> T wrap_mul(T x, T y) { using U = std::make_unsigned_t<T>; return static_cast<T>(static_cast<U>(x) * static_cast<U>(y)); }
template <class T> T wrap_neg(T x) { using U = std::make_unsigned_t<T>; return static_cast<T>(U(0) - static_cast<U>(x)); }

/// max/min that return NaN when either operand is NaN (ATen's `maximum`/`minimum` and
/// `clamp` semantics, aten/src/ATen/native/cpu/TensorCompareKernel.cpp).
template <class T> T nan_max(T x, T y) { return std::isnan(x) || std::isnan(y) ? x + y : (x > y ? x : y); }
template <class T> T nan_min(T x, T y) { return std::isnan(x) || std::isnan(y) ? x + y : (x < y ? x : y); }

// ---------------------------------------------------------------------------------------------
// Kernel templates: one per op class
// ---------------------------------------------------------------------------------------------

/// float32 -> float32 (or int/bool -> float32, PyTorch's int-to-float promotion of unary
/// floating ops): out = Op(x) computed in float; float64 -> float64 computed in double.
template <class Op>
Error float_unary(const KernelArgs& a) {
  const Op op = make_op<Op>(a.attrs);
  if (a.outputs[0]->dtype == DType::Float64) {
    map_elements<double, double>(a, [&](double x) { return op(x); });
    return {};
  }
  if (a.outputs[0]->dtype != DType::Float32) return unsupported("float unary op", a.outputs[0]->dtype);
  map_elements<float, float>(a, [&](float x) { return op(x); });
  return {};
}

/// Same dtype in and out for float32/int64/int32: out = Op(x) computed in that type.
template <class Op>
Error arith_unary(const KernelArgs& a) {
  const Op op = make_op<Op>(a.attrs);
  return visit_arith("arith unary op", a.outputs[0]->dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    map_elements<T, T>(a, [&](T x) { return op(x); });
    return Error{};
  });
}

/// Broadcasting binary op computed in the output dtype (float32/int64/int32): both operands
/// are converted to it first (type promotion, as PyTorch's TensorIterator common dtype).
template <class Op>
Error arith_binary(const KernelArgs& a) {
  const Op op = make_op<Op>(a.attrs);
  return visit_arith("arith binary op", a.outputs[0]->dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    map_elements<T, T, T>(a, [&](T x, T y) { return op(x, y); });
    return op.error();
  });
}

/// Broadcasting binary op computed in float32 with a float32 output (true division, pow), or in
/// double with a float64 output.
template <class Op>
Error float_binary(const KernelArgs& a) {
  const Op op = make_op<Op>(a.attrs);
  if (a.outputs[0]->dtype == DType::Float64) {
    map_elements<double, double, double>(a, [&](double x, double y) { return op(x, y); });
    return {};
  }
  if (a.outputs[0]->dtype != DType::Float32) return unsupported("float binary op", a.outputs[0]->dtype);
  map_elements<float, float, float>(a, [&](float x, float y) { return op(x, y); });
  return {};
}

/// Broadcasting comparison in result_type(self, other) (PyTorch type promotion); bool output.
template <class Op>
Error compare_binary(const KernelArgs& a) {
  const DType common = result_type(a.inputs[0]->type(), a.inputs[1]->type());
  return visit_comparable("comparison", common, [&](auto tag) {
    using T = typename decltype(tag)::type;
    map_elements<bool, T, T>(a, [](T x, T y) { return Op{}(x, y); });
    return Error{};
  });
}

/// Rejects nothing; arith_binary ops without a runtime error condition inherit this.
struct NoError {
  Error error() const { return {}; }
};

}  // namespace kiln::portable_ew
