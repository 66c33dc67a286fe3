// Portable kernels of the elementwise math family (src/ir/ops/math.cpp): inverse and hyperbolic
// trigonometry, expm1/log1p/log2/log10, rounding, sign, isinf/isnan, atan2, remainder/fmod,
// maximum/minimum, logical_xor, bitwise ops and elu. Built on the broadcasting map and kernel
// templates of kernels/portable/elementwise_map.h; each functor holds one op's formula.
//
// Semantics follow PyTorch eager on CPU (aten/src/ATen/native/cpu/UnaryOpsKernel.cpp,
// BinaryOpsKernel.cpp, Activation.cpp); special cases are cited at each functor. Inference has
// already checked shapes and dtypes; the dispatch re-checks dtypes and returns NotSupported for
// any other. Integer division by zero (remainder, fmod) is InvalidArgument naming the op (PyTorch
// raises "ZeroDivisionError"), never a SIGFPE.
#include <atomic>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/kernel.h"
#include "kernels/portable/elementwise_map.h"

namespace kiln {
namespace {

using namespace portable_ew;  // NOLINT: the shared broadcasting map, dtype visitors and kernel templates

/// Calls f(Tag<T>{}) for float32, float64, int64, int32, int8, uint8; NotSupported otherwise.
template <class F>
Error visit_numeric(const char* op, DType d, F&& f) {
  switch (d) {
    case DType::Float32: return f(Tag<float>{});
    case DType::Float64: return f(Tag<double>{});
    case DType::Int64: return f(Tag<int64_t>{});
    case DType::Int32: return f(Tag<int32_t>{});
    case DType::Int8: return f(Tag<int8_t>{});
    case DType::UInt8: return f(Tag<uint8_t>{});
    default: return unsupported(op, d);
  }
}

/// Calls f(Tag<T>{}) for the bitwise dtypes int64, int32, int8, uint8, bool; NotSupported otherwise.
template <class F>
Error visit_bitwise(const char* op, DType d, F&& f) {
  switch (d) {
    case DType::Int64: return f(Tag<int64_t>{});
    case DType::Int32: return f(Tag<int32_t>{});
    case DType::Int8: return f(Tag<int8_t>{});
    case DType::UInt8: return f(Tag<uint8_t>{});
    case DType::Bool: return f(Tag<bool>{});
    default: return unsupported(op, d);
  }
}

// ---------------------------------------------------------------------------------------------
// Op formulas
// ---------------------------------------------------------------------------------------------

// Floating unary math: templates over T = float (float32 and promoted integer inputs) or double
// (float64), the C library's functions as ATen's scalar kernels call them.
struct Acos { template <class T> T operator()(T x) const { return std::acos(x); } };
struct Acosh { template <class T> T operator()(T x) const { return std::acosh(x); } };
struct Asin { template <class T> T operator()(T x) const { return std::asin(x); } };
struct Asinh { template <class T> T operator()(T x) const { return std::asinh(x); } };
struct Atan { template <class T> T operator()(T x) const { return std::atan(x); } };
struct Atanh { template <class T> T operator()(T x) const { return std::atanh(x); } };
struct Cosh { template <class T> T operator()(T x) const { return std::cosh(x); } };
struct Sinh { template <class T> T operator()(T x) const { return std::sinh(x); } };
struct Tan { template <class T> T operator()(T x) const { return std::tan(x); } };
struct Expm1 { template <class T> T operator()(T x) const { return std::expm1(x); } };
struct Log1p { template <class T> T operator()(T x) const { return std::log1p(x); } };
struct Log2 { template <class T> T operator()(T x) const { return std::log2(x); } };
struct Log10 { template <class T> T operator()(T x) const { return std::log10(x); } };

/// aten.atan2: C99 atan2 (signed zeros and infinities: atan2(+-0, -0) = +-pi, atan2(+-inf, +inf)
/// = +-pi/4, ...), the quadrant from both signs.
struct Atan2 { template <class T> T operator()(T x, T y) const { return std::atan2(x, y); } };

struct Ceil { template <class T> T operator()(T x) const { return std::ceil(x); } };
struct Floor { template <class T> T operator()(T x) const { return std::floor(x); } };
struct Trunc { template <class T> T operator()(T x) const { return std::trunc(x); } };

/// aten.round: nearbyint in the default rounding mode (half to even). With decimals d != 0, as
/// ATen's round_decimals_kernel: p = 10^|d| converted to the compute type; d > 0:
/// nearbyint(x * p) / p, d < 0: nearbyint(x / p) * p (so large d overflow p to inf, giving NaN,
/// as in PyTorch).
struct Round {
  int64_t decimals;
  explicit Round(const Attributes& at) : decimals(at.get_int("decimals", 0)) {}
  template <class T> T operator()(T x) const {
    if (decimals == 0) return std::nearbyint(x);
    // |d| in double: -d overflows for d = INT64_MIN (attributes come from untrusted files).
    const T p = static_cast<T>(std::pow(10.0, std::fabs(static_cast<double>(decimals))));
    return decimals > 0 ? std::nearbyint(x * p) / p : std::nearbyint(x / p) * p;
  }
};

/// aten.sign: (0 < x) - (x < 0) (UnaryOpsKernel.cpp sign_kernel, scalar and vector paths alike),
/// so sign(NaN) = 0 and sign(-0.0) = +0.0; bool is unchanged.
struct Sign {
  template <class T> T operator()(T x) const {
    if constexpr (std::is_same_v<T, bool>) return x;
    else if constexpr (std::is_unsigned_v<T>) return static_cast<T>(x > 0);
    else return static_cast<T>(static_cast<int>(T(0) < x) - static_cast<int>(x < T(0)));
  }
};

/// Integer division by zero flag shared by remainder and fmod (set by any thread, read after the map).
struct DivisionByZero {
  const char* op;
  mutable std::atomic<bool> hit{false};
  explicit DivisionByZero(const char* name) : op(name) {}
  DivisionByZero(const DivisionByZero& o) : op(o.op) {}
  Error error() const {
    if (hit.load()) {
      return Error(ErrorCode::InvalidArgument, std::string(op) + ": integer division by zero (PyTorch raises ZeroDivisionError)");
    }
    return {};
  }
};

/// aten.remainder (BinaryOpsKernel.cpp remainder_kernel). Floats: mod = fmod(x, y), plus y when
/// mod != 0 and its sign differs from y's (remainder(x, 0) = NaN, remainder(-1, inf) = inf).
/// Integers: the same with C's %; y == 0 is an error; x % -1 = 0 (INT_MIN % -1 does not trap).
struct Remainder : DivisionByZero {
  Remainder() : DivisionByZero("aten.remainder") {}
  template <class T> T operator()(T x, T y) const {
    if constexpr (std::is_floating_point_v<T>) {
      T mod = std::fmod(x, y);
      if (mod != 0 && ((y < 0) != (mod < 0))) mod += y;
      return mod;
    } else {
      if (y == 0) {
        hit.store(true, std::memory_order_relaxed);
        return 0;
      }
      if constexpr (std::is_signed_v<T>) {
        if (y == -1) return 0;
        T r = static_cast<T>(x % y);
        if (r != 0 && ((r < 0) != (y < 0))) r = static_cast<T>(r + y);
        return r;
      } else {
        return static_cast<T>(x % y);
      }
    }
  }
};

/// aten.fmod: C fmod for floats (sign of the dividend; fmod(x, 0) = NaN, fmod(x, inf) = x);
/// integers: C's truncating %, y == 0 is an error, x % -1 = 0.
struct Fmod : DivisionByZero {
  Fmod() : DivisionByZero("aten.fmod") {}
  template <class T> T operator()(T x, T y) const {
    if constexpr (std::is_floating_point_v<T>) {
      return std::fmod(x, y);
    } else {
      if (y == 0) {
        hit.store(true, std::memory_order_relaxed);
        return 0;
      }
      if constexpr (std::is_signed_v<T>) {
        if (y == -1) return 0;
      }
      return static_cast<T>(x % y);
    }
  }
};

/// aten.maximum / aten.minimum: NaN in either operand gives NaN (TensorCompareKernel.cpp);
/// bool: or / and.
template <bool kMax>
struct MaxMin {
  template <class T> T operator()(T x, T y) const {
    if constexpr (std::is_floating_point_v<T>) return kMax ? nan_max(x, y) : nan_min(x, y);
    else if constexpr (std::is_same_v<T, bool>) return kMax ? (x || y) : (x && y);
    else return kMax ? (x > y ? x : y) : (x < y ? x : y);
  }
};

struct BitAnd { template <class T> T operator()(T x, T y) const { return static_cast<T>(x & y); } };
struct BitOr { template <class T> T operator()(T x, T y) const { return static_cast<T>(x | y); } };
struct BitXor { template <class T> T operator()(T x, T y) const { return static_cast<T>(x ^ y); } };

/// aten.elu (Activation.cpp elu_kernel): x <= 0 ? expm1(x * input_scale) * (alpha * scale)
/// : x * scale, the coefficients converted to the compute type; NaN stays NaN.
struct Elu {
  double alpha, scale, input_scale;
  explicit Elu(const Attributes& at)
      : alpha(at.get_float("alpha", 1.0)), scale(at.get_float("scale", 1.0)), input_scale(at.get_float("input_scale", 1.0)) {}
  template <class T> T operator()(T x) const {
    const T negcoef = static_cast<T>(alpha) * static_cast<T>(scale);
    return x <= T(0) ? std::expm1(x * static_cast<T>(input_scale)) * negcoef : x * static_cast<T>(scale);
  }
};

// ---------------------------------------------------------------------------------------------
// Kernels
// ---------------------------------------------------------------------------------------------

/// ceil/floor/trunc/round: floats computed by Op; integers are copied unchanged (PyTorch).
template <class Op>
Error rounding(const KernelArgs& a) {
  const Op op = make_op<Op>(a.attrs);
  return visit_numeric("rounding op", a.outputs[0]->dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_floating_point_v<T>) map_elements<T, T>(a, [&](T x) { return op(x); });
    else map_elements<T, T>(a, [](T x) { return x; });
    return Error{};
  });
}

/// aten.sign: same dtype in and out (floats, integers, bool).
Error sign(const KernelArgs& a) {
  const DType d = a.outputs[0]->dtype;
  if (d == DType::Bool) {
    map_elements<bool, bool>(a, [](bool x) { return x; });
    return {};
  }
  return visit_numeric("aten.sign", d, [&](auto tag) {
    using T = typename decltype(tag)::type;
    map_elements<T, T>(a, [](T x) { return Sign{}(x); });
    return Error{};
  });
}

/// isinf/isnan: float32 read directly, any other input dtype read as double (exact for every
/// Kiln dtype's values; integers are never inf or NaN); bool output.
template <bool kInf>
Error inf_nan(const KernelArgs& a) {
  auto test = [](auto x) { return kInf ? std::isinf(x) : std::isnan(x); };
  if (a.inputs[0]->dtype == DType::Float32) map_elements<bool, float>(a, test);
  else map_elements<bool, double>(a, test);
  return {};
}

/// Broadcasting binary op in the output dtype (float32, float64, int64, int32, int8, uint8), both
/// operands converted to it first; returns the op's error (integer division by zero).
template <class Op>
Error numeric_binary(const KernelArgs& a) {
  const Op op{};
  return visit_numeric("numeric binary op", a.outputs[0]->dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    map_elements<T, T, T>(a, [&](T x, T y) { return op(x, y); });
    return op.error();
  });
}

/// maximum/minimum in the output (promoted) dtype: every dtype but float16/bfloat16.
template <bool kMax>
Error max_min(const KernelArgs& a) {
  return visit_comparable(kMax ? "aten.maximum" : "aten.minimum", a.outputs[0]->dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    map_elements<T, T, T>(a, [](T x, T y) { return MaxMin<kMax>{}(x, y); });
    return Error{};
  });
}

/// bitwise_and/or/xor in the output (promoted) dtype: integers and bool.
template <class Op>
Error bitwise_binary(const KernelArgs& a) {
  return visit_bitwise("bitwise op", a.outputs[0]->dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    map_elements<T, T, T>(a, [](T x, T y) { return Op{}(x, y); });
    return Error{};
  });
}

/// bitwise_not: ~x for integers, !x for bool.
Error bitwise_not(const KernelArgs& a) {
  return visit_bitwise("aten.bitwise_not", a.outputs[0]->dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, bool>) map_elements<bool, bool>(a, [](bool x) { return !x; });
    else map_elements<T, T>(a, [](T x) { return static_cast<T>(~x); });
    return Error{};
  });
}

/// logical_xor: any dtypes, truth is x != 0 (NaN is true); bool output.
Error logical_xor(const KernelArgs& a) {
  map_elements<bool, bool, bool>(a, [](bool x, bool y) { return x != y; });
  return {};
}

}  // namespace

void register_portable_math(KernelRegistry& r) {
  r.add("aten.acos", float_unary<Acos>);
  r.add("aten.acosh", float_unary<Acosh>);
  r.add("aten.asin", float_unary<Asin>);
  r.add("aten.asinh", float_unary<Asinh>);
  r.add("aten.atan", float_unary<Atan>);
  r.add("aten.atanh", float_unary<Atanh>);
  r.add("aten.cosh", float_unary<Cosh>);
  r.add("aten.sinh", float_unary<Sinh>);
  r.add("aten.tan", float_unary<Tan>);
  r.add("aten.expm1", float_unary<Expm1>);
  r.add("aten.log1p", float_unary<Log1p>);
  r.add("aten.log2", float_unary<Log2>);
  r.add("aten.log10", float_unary<Log10>);
  r.add("aten.elu", float_unary<Elu>);

  r.add("aten.ceil", rounding<Ceil>);
  r.add("aten.floor", rounding<Floor>);
  r.add("aten.trunc", rounding<Trunc>);
  r.add("aten.round", rounding<Round>);
  r.add("aten.sign", sign);
  r.add("aten.isinf", inf_nan<true>);
  r.add("aten.isnan", inf_nan<false>);

  r.add("aten.atan2", float_binary<Atan2>);
  r.add("aten.remainder", numeric_binary<Remainder>);
  r.add("aten.fmod", numeric_binary<Fmod>);
  r.add("aten.maximum", max_min<true>);
  r.add("aten.minimum", max_min<false>);
  r.add("aten.logical_xor", logical_xor);
  r.add("aten.bitwise_and", bitwise_binary<BitAnd>);
  r.add("aten.bitwise_or", bitwise_binary<BitOr>);
  r.add("aten.bitwise_xor", bitwise_binary<BitXor>);
  r.add("aten.bitwise_not", bitwise_not);
}

}  // namespace kiln
