// Portable elementwise kernels: every elementwise op of docs/op-set.md, built from one
// broadcasting map (`map_elements`, kernels/portable/elementwise_map.h) plus small per-op
// functors that hold each op's formula (the math family's are in math.cpp).
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
#include "kernels/portable/elementwise_map.h"

namespace kiln {
namespace {

using namespace portable_ew;  // NOLINT: the shared broadcasting map, dtype visitors and kernel templates

// ---------------------------------------------------------------------------------------------
// Op formulas
// ---------------------------------------------------------------------------------------------

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

/// Integer power as ATen's powi (aten/src/ATen/native/Pow.h): a negative exponent gives 1 for
/// base 1, +-1 for base -1 (by the exponent's parity) and 0 otherwise; otherwise square and
/// multiply with two's-complement wrap-around.
template <class T>
T int_pow(T base, T exp) {
  if constexpr (std::is_signed_v<T>) {
    if (exp < 0) {
      if (base == 1) return 1;
      if (base == -1) return exp % 2 != 0 ? T(-1) : T(1);
      return 0;
    }
  }
  T result = 1;
  while (exp != 0) {
    if (exp & 1) result = wrap_mul(result, base);
    exp = static_cast<T>(exp / 2);
    base = wrap_mul(base, base);
  }
  return result;
}

/// aten.pow: std::pow for floats (IEEE special cases: pow(x, 0) = 1, pow(1, y) = 1), int_pow for integers.
struct Pow {
  template <class T> T operator()(T x, T y) const {
    if constexpr (std::is_floating_point_v<T>) return std::pow(x, y);
    else return int_pow(x, y);
  }
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

/// aten.hardswish: x * relu6(x + 3) / 6 (torch.nn.functional.hardswish), evaluated as
/// x * (relu6(x + 3) / 6): PyTorch's order (Activation.cpp hardswish_kernel, x * relu6 first)
/// overflows to inf for x > FLT_MAX / 6 where the value is x itself; here relu6 / 6 is exactly 1
/// for x >= 3 (NaN propagates as before).
struct Hardswish {
  template <class T> T operator()(T x) const { return x * (nan_min(nan_max(x + T(3), T(0)), T(6)) / T(6)); }
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

/// aten.pow: float32/float64 through float_binary (integer inputs promoted when the result is
/// floating); integer results (int64, int32, int8, uint8) computed in that type.
Error pow_kernel(const KernelArgs& a) {
  const DType d = a.outputs[0]->dtype;
  if (d == DType::Float32 || d == DType::Float64) return float_binary<Pow>(a);
  auto ints = [&](auto tag) {
    using T = typename decltype(tag)::type;
    map_elements<T, T, T>(a, [](T x, T y) { return Pow{}(x, y); });
    return Error{};
  };
  switch (d) {
    case DType::Int64: return ints(Tag<int64_t>{});
    case DType::Int32: return ints(Tag<int32_t>{});
    case DType::Int8: return ints(Tag<int8_t>{});
    case DType::UInt8: return ints(Tag<uint8_t>{});
    default: return unsupported("aten.pow", d);
  }
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
  r.add("aten.pow", pow_kernel);

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
