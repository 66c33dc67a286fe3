// Portable elementwise kernels: every elementwise op of docs/op-set.md, built from one
// broadcasting map (`map_elements`) plus small per-op functors that hold each op's formula.
//
// Semantics follow PyTorch eager on CPU; formulas and special cases are cited at each functor.
// Inference (src/ir/ops/elementwise.cpp) has already checked shapes, dtypes and attributes;
// the kernels re-check dtypes through their dispatch and return NotSupported for any other.
#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "ir/op_registry.h"
#include "kernels/kernel.h"

namespace kiln {
namespace {

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

constexpr int64_t kParallelGrain = 1 << 15;  ///< elements per thread chunk, at least

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

Error unsupported(const char* op, DType d) {
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

// ---------------------------------------------------------------------------------------------
// Op formulas
// ---------------------------------------------------------------------------------------------

/// Rejects nothing; arith_binary ops without a runtime error condition inherit this.
struct NoError {
  Error error() const { return {}; }
};

/// aten.add / aten.sub: self ± alpha * other (alpha cast to the compute type; inference
/// guarantees an integral alpha for integer outputs). PyTorch BinaryOpsKernel.cpp add_kernel.
template <bool kSub>
struct AddSub : NoError {
  double alpha;
  explicit AddSub(const Attributes& at) : alpha(at.get_float("alpha", 1.0)) {}
  template <class T>
  T operator()(T x, T y) const {
    if constexpr (std::is_floating_point_v<T>) {
      const T s = static_cast<T>(alpha) * y;
      return kSub ? x - s : x + s;
    } else {
      const T s = wrap_mul(static_cast<T>(static_cast<int64_t>(alpha)), y);
      return kSub ? wrap_sub(x, s) : wrap_add(x, s);
    }
  }
};

struct Mul : NoError {
  template <class T>
  T operator()(T x, T y) const {
    if constexpr (std::is_floating_point_v<T>) return x * y;
    else return wrap_mul(x, y);
  }
};

/// aten.div with rounding_mode "trunc" or "floor" (integers, float32 and float64).
/// Floats: trunc(x / y) (BinaryOpsKernel.cpp div_trunc_kernel); floor uses the CPython-style
/// floor division of c10/util/generic_math.h div_floor_floating: y == 0 gives x / y (inf/NaN);
/// otherwise the quotient is derived from fmod so it is exact near integer boundaries.
/// Integers: C division truncates; floor subtracts one when the remainder is non-zero and the
/// signs differ (div_floor_integer). Integer division by zero is an error, as in PyTorch
/// ("ZeroDivisionError"); INT_MIN / -1 wraps instead of trapping.
struct DivRounding {
  bool floor_mode;
  mutable std::atomic<bool> divided_by_zero{false};
  explicit DivRounding(const Attributes& at) : floor_mode(at.get_string("rounding_mode") == "floor") {}
  DivRounding(const DivRounding& o) : floor_mode(o.floor_mode) {}

  template <class T>
  T operator()(T x, T y) const {
    if constexpr (std::is_floating_point_v<T>) {
      if (!floor_mode) return std::trunc(x / y);
      if (y == 0) return x / y;
      const T mod = std::fmod(x, y);
      T div = (x - mod) / y;
      if (mod != 0 && ((y < 0) != (mod < 0))) div -= 1;
      if (div == 0) return std::copysign(T(0), x / y);
      T floordiv = std::floor(div);
      if (div - floordiv > T(0.5)) floordiv += 1;
      return floordiv;
    } else {
      if (y == 0) {
        divided_by_zero.store(true, std::memory_order_relaxed);
        return 0;
      }
      if (y == -1) return wrap_neg(x);
      T q = x / y;
      if (floor_mode && x % y != 0 && ((x < 0) != (y < 0))) q -= 1;
      return q;
    }
  }
  Error error() const {
    if (divided_by_zero.load()) return Error(ErrorCode::InvalidArgument, "aten.div: integer division by zero");
    return {};
  }
};

/// aten.div (rounding_mode None): true division in float32 (integers are promoted first) or float64.
struct TrueDiv {
  template <class T> T operator()(T x, T y) const { return x / y; }
};

/// aten.pow (Tensor_Tensor): std::pow (IEEE special cases: pow(x, 0) = 1, pow(1, y) = 1).
struct Pow {
  template <class T> T operator()(T x, T y) const { return std::pow(x, y); }
};

struct Neg {
  template <class T>
  T operator()(T x) const {
    if constexpr (std::is_floating_point_v<T>) return -x;
    else return wrap_neg(x);
  }
};

/// aten.abs: |x|; abs(INT_MIN) wraps to INT_MIN as in PyTorch.
struct Abs {
  template <class T>
  T operator()(T x) const {
    if constexpr (std::is_floating_point_v<T>) return std::fabs(x);
    else return x < 0 ? wrap_neg(x) : x;
  }
};

/// aten.relu = clamp_min(x, 0): NaN propagates (PyTorch Activation.cpp / TensorCompare).
struct Relu {
  template <class T>
  T operator()(T x) const {
    if constexpr (std::is_floating_point_v<T>) return std::isnan(x) ? x : (x > 0 ? x : T(0));
    else return x > 0 ? x : T(0);
  }
};

// The floating functors below are templates over T = float or double: float32 ops compute in
// float, float64 ops in double (constants are converted to T, as ATen's scalar_t kernels do).
struct Exp { template <class T> T operator()(T x) const { return std::exp(x); } };
struct Log { template <class T> T operator()(T x) const { return std::log(x); } };
struct Sqrt { template <class T> T operator()(T x) const { return std::sqrt(x); } };
/// aten.rsqrt: 1 / sqrt(x) (UnaryOpsKernel.cpp): rsqrt(0) = inf, rsqrt(-1) = NaN.
struct Rsqrt { template <class T> T operator()(T x) const { return T(1) / std::sqrt(x); } };
struct Reciprocal { template <class T> T operator()(T x) const { return T(1) / x; } };
struct Erf { template <class T> T operator()(T x) const { return std::erf(x); } };
struct Sin { template <class T> T operator()(T x) const { return std::sin(x); } };
struct Cos { template <class T> T operator()(T x) const { return std::cos(x); } };
struct Tanh { template <class T> T operator()(T x) const { return std::tanh(x); } };

/// aten.sigmoid: 1 / (1 + exp(-x)) (UnaryOpsKernel.cpp sigmoid_kernel).
struct Sigmoid { template <class T> T operator()(T x) const { return T(1) / (T(1) + std::exp(-x)); } };

/// aten.silu: x * sigmoid(x), computed as x / (1 + exp(-x)) (Activation.cpp silu_kernel);
/// silu(-inf) is NaN there too.
struct Silu { template <class T> T operator()(T x) const { return x / (T(1) + std::exp(-x)); } };

/// aten.hardswish: x * min(max(x + 3, 0), 6) / 6 = x * relu6(x + 3) / 6 (Activation.cpp
/// hardswish_kernel).
struct Hardswish {
  template <class T> T operator()(T x) const { return x * nan_min(nan_max(x + T(3), T(0)), T(6)) / T(6); }
};

/// aten.hardsigmoid: min(max(x + 3, 0), 6) / 6 = relu6(x + 3) / 6 (Activation.cpp).
struct Hardsigmoid {
  template <class T> T operator()(T x) const { return nan_min(nan_max(x + T(3), T(0)), T(6)) / T(6); }
};

/// aten.leaky_relu: x > 0 ? x : x * negative_slope (Activation.cpp leaky_relu_kernel).
struct LeakyRelu {
  double slope;
  explicit LeakyRelu(const Attributes& at) : slope(at.get_float("negative_slope", 0.01)) {}
  template <class T> T operator()(T x) const { return x > 0 ? x : x * static_cast<T>(slope); }
};

/// aten.gelu. approximate "none": x * 0.5 * (1 + erf(x / sqrt(2)));
/// "tanh": 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))
/// (Activation.cpp GeluKernelImpl, kBeta = M_SQRT2 * M_2_SQRTPI * 0.5, kKappa = 0.044715).
struct Gelu {
  bool tanh_mode;
  explicit Gelu(const Attributes& at) : tanh_mode(at.get_string("approximate", "none") == "tanh") {}
  template <class T> T operator()(T x) const {
    if (tanh_mode) {
      constexpr T kBeta = static_cast<T>(0.79788456080286535588);  // sqrt(2 / pi)
      constexpr T kKappa = static_cast<T>(0.044715);
      const T inner = kBeta * (x + kKappa * x * x * x);
      return T(0.5) * x * (T(1) + std::tanh(inner));
    }
    constexpr T kAlpha = static_cast<T>(0.70710678118654752440);  // 1 / sqrt(2)
    return x * T(0.5) * (T(1) + std::erf(x * kAlpha));
  }
};

/// aten.clamp / aten.hardtanh: min(max(x, lo), hi) with NaN propagating from x or a bound;
/// lo > hi gives hi everywhere (PyTorch clamp semantics). Absent bounds are skipped. The bounds
/// are converted to the compute type (float for float32, double for float64).
struct Clamp {
  bool has_lo = false, has_hi = false;
  double lo = 0, hi = 0;
  explicit Clamp(const Attributes& at) {
    if (at.has("min_val")) {  // hardtanh
      has_lo = has_hi = true;
      lo = at.get_float("min_val", -1.0);
      hi = at.get_float("max_val", 1.0);
      return;
    }
    has_lo = !at.is_none("min");
    has_hi = !at.is_none("max");
    lo = at.get_float("min");
    hi = at.get_float("max");
  }
  template <class T> T operator()(T x) const {
    if (has_lo) x = nan_max(x, static_cast<T>(lo));
    if (has_hi) x = nan_min(x, static_cast<T>(hi));
    return x;
  }
};

struct Eq { template <class T> bool operator()(T x, T y) const { return x == y; } };
struct Ne { template <class T> bool operator()(T x, T y) const { return x != y; } };
struct Lt { template <class T> bool operator()(T x, T y) const { return x < y; } };
struct Le { template <class T> bool operator()(T x, T y) const { return x <= y; } };
struct Gt { template <class T> bool operator()(T x, T y) const { return x > y; } };
struct Ge { template <class T> bool operator()(T x, T y) const { return x >= y; } };

// ---------------------------------------------------------------------------------------------
// Kernels with their own dispatch
// ---------------------------------------------------------------------------------------------

/// aten.div: rounding_mode None -> true division (float32 or float64 out); "trunc"/"floor" -> DivRounding.
Error div(const KernelArgs& a) {
  if (a.attrs.is_none("rounding_mode")) return float_binary<TrueDiv>(a);
  return arith_binary<DivRounding>(a);
}

/// aten.logical_not / logical_and / logical_or: any dtype, truth is `x != 0` (NaN is true);
/// bool output.
Error logical_not(const KernelArgs& a) {
  map_elements<bool, bool>(a, [](bool x) { return !x; });
  return {};
}
Error logical_and(const KernelArgs& a) {
  map_elements<bool, bool, bool>(a, [](bool x, bool y) { return x && y; });
  return {};
}
Error logical_or(const KernelArgs& a) {
  map_elements<bool, bool, bool>(a, [](bool x, bool y) { return x || y; });
  return {};
}

/// aten.where(condition: bool, self, other): three-way broadcasting; self/other are converted
/// to the output (promoted) dtype; any of the 9 dtypes.
Error where(const KernelArgs& a) {
  if (a.inputs[0]->dtype != DType::Bool) return unsupported("aten.where condition", a.inputs[0]->dtype);
  return visit_dtype(a.outputs[0]->dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    map_elements<T, bool, T, T>(a, [](bool c, T x, T y) { return c ? x : y; });
    return Error{};
  });
}

/// aten._to_copy: converts between any two of the 9 dtypes (see `convert`).
Error to_copy(const KernelArgs& a) {
  return visit_dtype(a.outputs[0]->dtype, [&](auto out_tag) {
    using To = typename decltype(out_tag)::type;
    return visit_dtype(a.inputs[0]->dtype, [&](auto in_tag) {
      using From = typename decltype(in_tag)::type;
      map_elements<To, From>(a, [](From v) { return convert<To>(v); });
      return Error{};
    });
  });
}

/// aten.clone: a byte copy (any dtype).
Error clone(const KernelArgs& a) {
  const Tensor& x = *a.inputs[0];
  Tensor& out = *a.outputs[0];
  if (x.dtype != out.dtype || x.nbytes() != out.nbytes()) {
    return Error(ErrorCode::InvalidArgument, "aten.clone: input and output types differ");
  }
  if (out.nbytes() != 0) std::memcpy(out.data, x.data, out.nbytes());
  return {};
}

}  // namespace

void register_portable_elementwise(KernelRegistry& r) {
  r.add("aten.add", arith_binary<AddSub<false>>);
  r.add("aten.sub", arith_binary<AddSub<true>>);
  r.add("aten.mul", arith_binary<Mul>);
  r.add("aten.div", div);
  r.add("aten.pow", float_binary<Pow>);

  r.add("aten.neg", arith_unary<Neg>);
  r.add("aten.abs", arith_unary<Abs>);
  r.add("aten.relu", arith_unary<Relu>);

  r.add("aten.exp", float_unary<Exp>);
  r.add("aten.log", float_unary<Log>);
  r.add("aten.sqrt", float_unary<Sqrt>);
  r.add("aten.rsqrt", float_unary<Rsqrt>);
  r.add("aten.reciprocal", float_unary<Reciprocal>);
  r.add("aten.erf", float_unary<Erf>);
  r.add("aten.sin", float_unary<Sin>);
  r.add("aten.cos", float_unary<Cos>);
  r.add("aten.sigmoid", float_unary<Sigmoid>);
  r.add("aten.tanh", float_unary<Tanh>);
  r.add("aten.silu", float_unary<Silu>);
  r.add("aten.hardswish", float_unary<Hardswish>);
  r.add("aten.hardsigmoid", float_unary<Hardsigmoid>);
  r.add("aten.hardtanh", float_unary<Clamp>);
  r.add("aten.leaky_relu", float_unary<LeakyRelu>);
  r.add("aten.gelu", float_unary<Gelu>);
  r.add("aten.clamp", float_unary<Clamp>);

  r.add("aten.eq", compare_binary<Eq>);
  r.add("aten.ne", compare_binary<Ne>);
  r.add("aten.lt", compare_binary<Lt>);
  r.add("aten.le", compare_binary<Le>);
  r.add("aten.gt", compare_binary<Gt>);
  r.add("aten.ge", compare_binary<Ge>);

  r.add("aten.logical_not", logical_not);
  r.add("aten.logical_and", logical_and);
  r.add("aten.logical_or", logical_or);
  r.add("aten.where", where);
  r.add("aten._to_copy", to_copy);
  r.add("aten.clone", clone);
}

}  // namespace kiln
