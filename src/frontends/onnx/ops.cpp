// ONNX op converters: each maps one ONNX op type (default domain, opsets 7..17) onto Kiln's ATen
// ops (docs/op-set.md), honouring every attribute or refusing the node with a NotSupported error
// naming the attribute. Semantics: the ONNX operator specification (https://onnx.ai/onnx/operators/
// and onnx/docs/Changelog.md for the per-opset differences noted below).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "frontends/onnx/importer_internal.h"
#include "ir/op_registry.h"

namespace kiln::onnx::detail {
namespace {

using Ints = std::vector<int64_t>;

#define TRY(var, expr)                       \
  auto var##_r = (expr);                     \
  if (!var##_r.ok()) return var##_r.error(); \
  auto var = std::move(var##_r).value()

Result<int64_t> wrap_axis(NodeCtx& c, int64_t axis, int64_t rank, const std::string& what) {
  if (axis < -rank || axis >= rank) {
    return c.invalid(what + " " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank));
  }
  return axis < 0 ? axis + rank : axis;
}

Result<ValueId> view(NodeCtx& c, ValueId x, const Ints& sizes) {
  if (c.type(x).sizes == sizes) return x;
  return c.emit("aten.view", {x}, {{"size", sizes}});
}

Result<ValueId> gather(NodeCtx& c, ValueId x, ValueId idx, int64_t axis);

// ---- elementwise ----

Error unary(NodeCtx& c, const char* op) {
  TRY(x, c.input(0));
  TRY(y, c.emit(op, {x}));
  return c.set_output(0, y);
}

Error check_same_dtype(NodeCtx& c, ValueId a, ValueId b) {
  if (c.type(a).dtype != c.type(b).dtype) {
    return c.invalid(std::string("inputs have different element types (") + dtype_name(c.type(a).dtype) + " and " +
                     dtype_name(c.type(b).dtype) + ")");
  }
  return {};
}

// Opsets < 7: binary ops broadcast only with broadcast = 1, B's dims matching A's from `axis`
// (default: the trailing dims); broadcast = 0 requires equal shapes (ONNX Changelog, Add-6).
Result<ValueId> legacy_broadcast(NodeCtx& c, ValueId a, ValueId b) {
  if (c.opset() >= 7) return b;
  TRY(bc, c.attr_int("broadcast", 0));
  const Ints as = c.type(a).sizes, bs = c.type(b).sizes;
  if (!bc) {
    if (as != bs) return c.invalid("broadcast = 0 but the shapes differ (" + sizes_to_string(as) + " and " + sizes_to_string(bs) + ")");
    return b;
  }
  if (!c.has_attr("axis")) return b;  // suffix matching is numpy broadcasting
  TRY(axis_raw, c.attr_int("axis", 0));
  TRY(axis, wrap_axis(c, axis_raw, static_cast<int64_t>(as.size()), "axis"));
  if (axis + static_cast<int64_t>(bs.size()) > static_cast<int64_t>(as.size())) return c.invalid("B does not fit A at axis");
  Ints nb = bs;
  nb.resize(as.size() - static_cast<size_t>(axis), 1);
  return view(c, b, nb);
}

// A constant operand of lower rank gets leading size-1 dims (a folded view): the same numpy
// broadcast, but delegates that cannot broadcast across ranks (xnnpack's NHWC layout) take it.
Result<ValueId> match_rank(NodeCtx& c, ValueId v, ValueId other) {
  const Ints s = c.type(v).sizes;
  const size_t r = c.type(other).sizes.size();
  if (!c.is_const(v) || s.size() >= r) return v;
  Ints full(r - s.size(), 1);
  full.insert(full.end(), s.begin(), s.end());
  return view(c, v, full);
}

/// A constant of x's dtype holding v, shaped [1, ..., 1] with x's rank (see match_rank).
Result<ValueId> scalar_for(NodeCtx& c, ValueId x, double v) {
  TRY(sc, c.scalar(c.type(x).dtype, v));
  return match_rank(c, sc, x);
}

Error binary(NodeCtx& c, const char* op) {
  TRY(a0, c.input(0));
  TRY(b0, c.input(1));
  KILN_RETURN_IF_ERROR(check_same_dtype(c, a0, b0));
  TRY(b1, legacy_broadcast(c, a0, b0));
  TRY(a, match_rank(c, a0, b1));
  TRY(b, match_rank(c, b1, a0));
  Attributes attrs;
  // ONNX Div on integers truncates toward zero (onnx reference: np.trunc-like C division).
  const DType dt = c.type(a).dtype;
  if (std::string(op) == "aten.div" && !is_floating(dt)) attrs.set("rounding_mode", std::string("trunc"));
  if (dt == DType::UInt8 || dt == DType::Int8) {
    // Kiln's arithmetic kernels take int32/int64/float32: compute in int32, convert back (wraps
    // modulo 2^8 like the ONNX reference's numpy arithmetic).
    TRY(a32, c.emit("aten._to_copy", {a}, {{"dtype", std::string("int32")}}));
    TRY(b32, c.emit("aten._to_copy", {b}, {{"dtype", std::string("int32")}}));
    TRY(r32, c.emit(op, {a32, b32}, attrs));
    TRY(y, c.emit("aten._to_copy", {r32}, {{"dtype", std::string(dtype_name(dt))}}));
    return c.set_output(0, y);
  }
  TRY(y, c.emit(op, {a, b}, attrs));
  return c.set_output(0, y);
}

Error cmp(NodeCtx& c, const char* op) {
  TRY(a, c.input(0));
  TRY(b0, c.input(1));
  KILN_RETURN_IF_ERROR(check_same_dtype(c, a, b0));
  TRY(b, legacy_broadcast(c, a, b0));
  TRY(y, c.emit(op, {a, b}));
  return c.set_output(0, y);
}

Error conv_Add(NodeCtx& c) { return binary(c, "aten.add"); }
Error conv_Sub(NodeCtx& c) { return binary(c, "aten.sub"); }
Error conv_Mul(NodeCtx& c) { return binary(c, "aten.mul"); }
Error conv_Div(NodeCtx& c) { return binary(c, "aten.div"); }
Error conv_Pow(NodeCtx& c) {
  TRY(a, c.input(0));
  TRY(b, c.input(1));
  const DType dt = c.type(a).dtype;
  if (dt == DType::Float32) {
    if (c.type(b).dtype != dt) {  // ONNX allows a different exponent type; the result has X's type
      TRY(bc, c.emit("aten._to_copy", {b}, {{"dtype", std::string("float32")}}));
      b = bc;
    }
    TRY(y, c.emit("aten.pow", {a, b}));
    return c.set_output(0, y);
  }
  // Other base types: computed in float32 and converted back (truncating, as a C cast does);
  // exact while |result| < 2^24.
  const std::string f32 = "float32";
  TRY(af, c.emit("aten._to_copy", {a}, {{"dtype", f32}}));
  ValueId bf = b;
  if (c.type(b).dtype != DType::Float32) {
    TRY(v, c.emit("aten._to_copy", {b}, {{"dtype", f32}}));
    bf = v;
  }
  TRY(p, c.emit("aten.pow", {af, bf}));
  TRY(y, c.emit("aten._to_copy", {p}, {{"dtype", std::string(dtype_name(dt))}}));
  return c.set_output(0, y);
}
Error conv_Equal(NodeCtx& c) { return cmp(c, "aten.eq"); }
Error conv_Less(NodeCtx& c) { return cmp(c, "aten.lt"); }
Error conv_LessOrEqual(NodeCtx& c) { return cmp(c, "aten.le"); }
Error conv_Greater(NodeCtx& c) { return cmp(c, "aten.gt"); }
Error conv_GreaterOrEqual(NodeCtx& c) { return cmp(c, "aten.ge"); }
Error conv_And(NodeCtx& c) { return cmp(c, "aten.logical_and"); }
Error conv_Or(NodeCtx& c) { return cmp(c, "aten.logical_or"); }
Error conv_Xor(NodeCtx& c) { return cmp(c, "aten.ne"); }  // on bools, xor == not-equal
Error conv_Not(NodeCtx& c) { return unary(c, "aten.logical_not"); }

Error conv_Abs(NodeCtx& c) { return unary(c, "aten.abs"); }
Error conv_Neg(NodeCtx& c) { return unary(c, "aten.neg"); }
Error conv_Exp(NodeCtx& c) { return unary(c, "aten.exp"); }
Error conv_Log(NodeCtx& c) { return unary(c, "aten.log"); }
Error conv_Sqrt(NodeCtx& c) { return unary(c, "aten.sqrt"); }
Error conv_Reciprocal(NodeCtx& c) { return unary(c, "aten.reciprocal"); }
Error conv_Erf(NodeCtx& c) { return unary(c, "aten.erf"); }
Error conv_Sin(NodeCtx& c) { return unary(c, "aten.sin"); }
Error conv_Cos(NodeCtx& c) { return unary(c, "aten.cos"); }
Error conv_Tanh(NodeCtx& c) { return unary(c, "aten.tanh"); }
Error conv_Sigmoid(NodeCtx& c) { return unary(c, "aten.sigmoid"); }
Error conv_Relu(NodeCtx& c) { return unary(c, "aten.relu"); }
Error conv_HardSwish(NodeCtx& c) { return unary(c, "aten.hardswish"); }

Error conv_Identity(NodeCtx& c) {
  TRY(x, c.input(0));
  return c.set_output(0, x);
}

// Dropout in inference is the identity: opset 12+ training_mode input must be absent or false;
// before 7 is_test must be 1; ratio and seed only matter in training. The mask output (opset
// 10+: bool) is then all true.
Error conv_Dropout(NodeCtx& c) {
  TRY(x, c.input(0));
  c.ignore_attr("ratio");  // opset < 12 attribute: only used in training
  c.ignore_attr("seed");   // opset 12+: only used in training
  if (c.has_attr("is_test")) {  // opset < 7
    TRY(t, c.attr_int("is_test", 0));
    if (!t) return c.unsupported("attribute 'is_test' = 0 (training)");
  } else if (c.opset() < 7) {
    return c.unsupported("is_test = 0 (training; the default before opset 7)");
  }
  if (c.has_input(2)) {
    TRY(tm, c.input(2));
    TRY(v, c.const_ints(tm, "training_mode"));
    if (v.size() != 1) return c.invalid("training_mode must be a scalar");
    if (v[0] != 0) {  // training: random drops unless ratio is 0 (then the identity, scale 1 / (1 - 0))
      std::vector<double> ratio{0.5};
      if (c.has_input(1)) {
        TRY(rv, c.input(1));
        TRY(r, c.const_floats(rv, "ratio"));
        ratio = r;
      }
      if (ratio.size() != 1 || ratio[0] != 0) return c.unsupported("training_mode = true with ratio != 0 (random)");
    }
  }
  KILN_RETURN_IF_ERROR(c.set_output(0, x));
  if (c.has_output(1)) {
    if (c.opset() < 10) return c.unsupported("the mask output before opset 10 (same type as the input)");
    const TensorType t = c.type(x);
    KILN_RETURN_IF_ERROR(c.check_constant_size(static_cast<double>(t.numel()), 1, "the mask"));
    TRY(m, c.constant(TensorType{DType::Bool, t.sizes}, std::vector<uint8_t>(static_cast<size_t>(t.numel()), 1)));
    KILN_RETURN_IF_ERROR(c.set_output(1, m));
  }
  return {};
}

Error conv_LeakyRelu(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(alpha, c.attr_float("alpha", 0.01));
  TRY(y, c.emit("aten.leaky_relu", {x}, {{"negative_slope", alpha}}));
  return c.set_output(0, y);
}

// HardSigmoid: max(0, min(1, alpha * x + beta)), alpha 0.2, beta 0.5 by default. PyTorch's
// hardsigmoid is the alpha = 1/6 case; other slopes become mul, add, clamp.
Error conv_HardSigmoid(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(alpha, c.attr_float("alpha", 0.2));
  TRY(beta, c.attr_float("beta", 0.5));
  if (static_cast<float>(alpha) == static_cast<float>(1.0 / 6.0) && beta == 0.5) {
    TRY(y, c.emit("aten.hardsigmoid", {x}));
    return c.set_output(0, y);
  }
  TRY(a, scalar_for(c, x, alpha));
  TRY(b, scalar_for(c, x, beta));
  TRY(m, c.emit("aten.mul", {x, a}));
  TRY(s, c.emit("aten.add", {m, b}));
  TRY(y, c.emit("aten.clamp", {s}, {{"min", 0.0}, {"max", 1.0}}));
  return c.set_output(0, y);
}

// Clip: opset < 11 attributes min/max (default -inf/+inf); opset 11+ optional constant inputs.
Error conv_Clip(NodeCtx& c) {
  TRY(x, c.input(0));
  AttrValue lo = std::monostate{}, hi = std::monostate{};
  if (c.opset() < 11) {
    if (c.has_attr("min")) {
      TRY(v, c.attr_float("min", 0));
      lo = v;
    }
    if (c.has_attr("max")) {
      TRY(v, c.attr_float("max", 0));
      hi = v;
    }
  } else {
    for (int i = 1; i <= 2; ++i) {
      if (!c.has_input(i)) continue;
      TRY(v, c.input(i));
      TRY(vals, c.const_floats(v, i == 1 ? "min" : "max"));
      if (vals.size() != 1) return c.invalid(std::string(i == 1 ? "min" : "max") + " must be a scalar");
      (i == 1 ? lo : hi) = vals[0];
    }
  }
  if (std::holds_alternative<std::monostate>(lo) && std::holds_alternative<std::monostate>(hi)) {
    TRY(y, c.emit("aten.clone", {x}));
    return c.set_output(0, y);
  }
  const DType dt = c.type(x).dtype;
  if (dt != DType::Float32) {  // aten.clamp is float32-only: where(x < lo, lo, x), then the same for hi
    ValueId y = x;
    if (!std::holds_alternative<std::monostate>(lo)) {
      TRY(l, scalar_for(c, x, std::get<double>(lo)));
      TRY(lt, c.emit("aten.lt", {y, l}));
      TRY(w, c.emit("aten.where", {lt, l, y}));
      y = w;
    }
    if (!std::holds_alternative<std::monostate>(hi)) {
      TRY(h, scalar_for(c, x, std::get<double>(hi)));
      TRY(gt, c.emit("aten.gt", {y, h}));
      TRY(w, c.emit("aten.where", {gt, h, y}));
      y = w;
    }
    return c.set_output(0, y);
  }
  TRY(y, c.emit("aten.clamp", {x}, {{"min", lo}, {"max", hi}}));
  return c.set_output(0, y);
}

// Variadic Sum / Mean / Max / Min with multidirectional broadcasting.
Error variadic(NodeCtx& c, const std::string& kind) {
  if (c.num_inputs() < 1) return c.invalid("needs at least one input");
  TRY(acc, c.input(0));
  for (int i = 1; i < c.num_inputs(); ++i) {
    TRY(b, c.input(i));
    KILN_RETURN_IF_ERROR(check_same_dtype(c, acc, b));
    if (kind == "Sum" || kind == "Mean") {
      TRY(s, c.emit("aten.add", {acc, b}));
      acc = s;
    } else {  // Max / Min: where(a >= b, a, b) (NaN propagation differs from fmax; not tested by ONNX)
      ValueId ca = acc, cb = b;
      if (c.type(acc).dtype == DType::Float16 || c.type(acc).dtype == DType::BFloat16) {  // compare in float32 (exact)
        TRY(fa, c.emit("aten._to_copy", {acc}, {{"dtype", std::string("float32")}}));
        TRY(fb, c.emit("aten._to_copy", {b}, {{"dtype", std::string("float32")}}));
        ca = fa, cb = fb;
      }
      TRY(cond, c.emit(kind == "Max" ? "aten.ge" : "aten.le", {ca, cb}));
      TRY(s, c.emit("aten.where", {cond, acc, b}));
      acc = s;
    }
  }
  if (kind == "Mean" && c.num_inputs() > 1) {
    TRY(n, c.scalar(c.type(acc).dtype, c.num_inputs()));
    TRY(s, c.emit("aten.div", {acc, n}));
    acc = s;
  } else if (c.num_inputs() == 1) {
    TRY(s, c.emit("aten.clone", {acc}));
    acc = s;
  }
  return c.set_output(0, acc);
}
Error conv_Sum(NodeCtx& c) { return variadic(c, "Sum"); }
Error conv_Mean(NodeCtx& c) { return variadic(c, "Mean"); }
Error conv_Max(NodeCtx& c) { return variadic(c, "Max"); }
Error conv_Min(NodeCtx& c) { return variadic(c, "Min"); }

Error conv_Where(NodeCtx& c) {
  TRY(cond, c.input(0));
  TRY(a, c.input(1));
  TRY(b, c.input(2));
  KILN_RETURN_IF_ERROR(check_same_dtype(c, a, b));
  TRY(y, c.emit("aten.where", {cond, a, b}));
  return c.set_output(0, y);
}

// Elu: x > 0 ? x : alpha * (exp(x) - 1).
Error conv_Elu(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(alpha, c.attr_float("alpha", 1.0));
  TRY(zero, scalar_for(c, x, 0));
  TRY(one, scalar_for(c, x, 1));
  TRY(a, scalar_for(c, x, alpha));
  TRY(pos, c.emit("aten.gt", {x, zero}));
  TRY(e, c.emit("aten.exp", {x}));
  TRY(em1, c.emit("aten.sub", {e, one}));
  TRY(neg, c.emit("aten.mul", {em1, a}));
  TRY(y, c.emit("aten.where", {pos, x, neg}));
  return c.set_output(0, y);
}

// Selu: gamma * (x > 0 ? x : alpha * (exp(x) - 1)), alpha 1.67326..., gamma 1.0507...
Error conv_Selu(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(alpha, c.attr_float("alpha", 1.67326319217681884765625));
  TRY(gamma, c.attr_float("gamma", 1.05070102214813232421875));
  TRY(zero, scalar_for(c, x, 0));
  TRY(one, scalar_for(c, x, 1));
  TRY(a, scalar_for(c, x, alpha));
  TRY(g, scalar_for(c, x, gamma));
  TRY(pos, c.emit("aten.gt", {x, zero}));
  TRY(e, c.emit("aten.exp", {x}));
  TRY(em1, c.emit("aten.sub", {e, one}));
  TRY(neg, c.emit("aten.mul", {em1, a}));
  TRY(w, c.emit("aten.where", {pos, x, neg}));
  TRY(y, c.emit("aten.mul", {w, g}));
  return c.set_output(0, y);
}

// Celu: max(0, x) + min(0, alpha * (exp(x / alpha) - 1)).
Error conv_Celu(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(alpha, c.attr_float("alpha", 1.0));
  if (alpha == 0) return c.invalid("alpha must be non-zero");
  TRY(zero, scalar_for(c, x, 0));
  TRY(one, scalar_for(c, x, 1));
  TRY(a, scalar_for(c, x, alpha));
  TRY(pos, c.emit("aten.gt", {x, zero}));
  TRY(xd, c.emit("aten.div", {x, a}));
  TRY(e, c.emit("aten.exp", {xd}));
  TRY(em1, c.emit("aten.sub", {e, one}));
  TRY(neg, c.emit("aten.mul", {em1, a}));
  TRY(y, c.emit("aten.where", {pos, x, neg}));
  return c.set_output(0, y);
}

// ThresholdedRelu: x > alpha ? x : 0.
Error conv_ThresholdedRelu(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(alpha, c.attr_float("alpha", 1.0));
  TRY(zero, scalar_for(c, x, 0));
  TRY(a, scalar_for(c, x, alpha));
  TRY(pos, c.emit("aten.gt", {x, a}));
  TRY(y, c.emit("aten.where", {pos, x, zero}));
  return c.set_output(0, y);
}

// PRelu: x < 0 ? slope * x : x (slope broadcasts to x, unidirectionally).
Error conv_PRelu(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(slope0, c.input(1));
  KILN_RETURN_IF_ERROR(check_same_dtype(c, x, slope0));
  ValueId slope = slope0;
  const Ints xs = c.type(x).sizes, ss = c.type(slope0).sizes;
  if (c.opset() < 7 && ss.size() == 1 && xs.size() >= 2 && ss[0] == xs[1] && ss[0] != 1) {
    // PRelu-6: a 1-D slope of size C is per channel (dim 1), not numpy-broadcast over the last dim.
    Ints v(xs.size() - 1, 1);
    v[0] = ss[0];
    TRY(sv, view(c, slope0, v));
    slope = sv;
  }
  TRY(zero, scalar_for(c, x, 0));
  TRY(neg, c.emit("aten.lt", {x, zero}));
  TRY(m, c.emit("aten.mul", {x, slope}));
  TRY(y, c.emit("aten.where", {neg, m, x}));
  if (c.type(y).sizes != c.type(x).sizes) return c.invalid("slope does not broadcast to X");
  return c.set_output(0, y);
}

// Softplus: log(exp(x) + 1). Softsign: x / (1 + |x|).
Error conv_Softplus(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(one, scalar_for(c, x, 1));
  TRY(e, c.emit("aten.exp", {x}));
  TRY(s, c.emit("aten.add", {e, one}));
  TRY(y, c.emit("aten.log", {s}));
  return c.set_output(0, y);
}
Error conv_Softsign(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(one, scalar_for(c, x, 1));
  TRY(a, c.emit("aten.abs", {x}));
  TRY(s, c.emit("aten.add", {a, one}));
  TRY(y, c.emit("aten.div", {x, s}));
  return c.set_output(0, y);
}

Error conv_Cast(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(to, c.attr_int("to", -1));
  if (!c.has_attr("to")) return c.invalid("missing attribute 'to'");
  auto dt = kiln_dtype(static_cast<int>(to));
  if (!dt.ok()) return c.unsupported("attribute 'to': " + dt.error().message());
  if (c.has_attr("saturate")) {  // opset 19 (float8 only)
    TRY(s, c.attr_int("saturate", 1));
    (void)s;
  }
  TRY(y, c.emit("aten._to_copy", {x}, {{"dtype", std::string(dtype_name(*dt))}}));
  return c.set_output(0, y);
}

// ---- shape ops ----

Error conv_Shape(NodeCtx& c) {
  TRY(x, c.input(0));
  const Ints s = c.type(x).sizes;
  const int64_t r = static_cast<int64_t>(s.size());
  TRY(start, c.attr_int("start", 0));  // opset 15
  TRY(end, c.attr_int("end", r));
  auto clampi = [&](int64_t v) { return std::clamp<int64_t>(v < 0 ? v + r : v, 0, r); };
  start = clampi(start);
  end = clampi(end);
  Ints out(s.begin() + start, s.begin() + std::max(start, end));
  TRY(y, c.int64_vector(out));
  return c.set_output(0, y);
}

Error conv_Size(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(y, c.scalar(DType::Int64, static_cast<double>(c.type(x).numel())));
  return c.set_output(0, y);
}

// Reshape: 0 copies the input's size (unless allowzero = 1, opset 14), one -1 is inferred.
Error conv_Reshape(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(sv, c.input(1));
  TRY(shape, c.const_ints(sv, "shape"));
  TRY(allowzero, c.attr_int("allowzero", 0));
  const Ints in = c.type(x).sizes;
  Ints out = shape;
  int infer = -1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == 0 && !allowzero) {
      if (i >= in.size()) return c.invalid("shape has 0 at dim " + std::to_string(i) + " beyond the input's rank");
      out[i] = in[i];
    } else if (out[i] == -1) {
      if (infer >= 0) return c.invalid("shape has more than one -1");
      infer = static_cast<int>(i);
    } else if (out[i] < 0) {
      return c.invalid("shape has negative size " + std::to_string(out[i]));
    }
  }
  // Products of the requested sizes (from the file) with overflow checks: one that overflows
  // cannot equal the input's element count.
  auto product = [&](int skip, int64_t* n) {
    *n = 1;
    for (size_t i = 0; i < out.size(); ++i) {
      if (static_cast<int>(i) != skip && __builtin_mul_overflow(*n, out[i], n)) return false;
    }
    return true;
  };
  const int64_t total = c.type(x).numel();
  if (infer >= 0) {
    int64_t known = 1;
    if (!product(infer, &known) || known == 0 || total % known != 0) {
      return c.invalid("cannot reshape " + sizes_to_string(in) + " to " + sizes_to_string(shape));
    }
    out[static_cast<size_t>(infer)] = total / known;
  }
  int64_t n = 0;
  if (!product(-1, &n) || n != total) return c.invalid("cannot reshape " + sizes_to_string(in) + " to " + sizes_to_string(shape));
  TRY(y, c.emit("aten.view", {x}, {{"size", out}}));
  return c.set_output(0, y);
}

Error conv_Flatten(NodeCtx& c) {
  TRY(x, c.input(0));
  const Ints s = c.type(x).sizes;
  const int64_t r = static_cast<int64_t>(s.size());
  TRY(axis, c.attr_int("axis", 1));
  if (axis < -r || axis > r) return c.invalid("axis " + std::to_string(axis) + " out of range");
  if (axis < 0) axis += r;
  int64_t a = 1, b = 1;
  for (int64_t i = 0; i < r; ++i) (i < axis ? a : b) *= s[static_cast<size_t>(i)];
  TRY(y, c.emit("aten.view", {x}, {{"size", Ints{a, b}}}));
  return c.set_output(0, y);
}

// Axes from the attribute (before `input_opset`) or the optional input.
Result<std::optional<Ints>> axes_of(NodeCtx& c, int input_index, int64_t input_opset) {
  if (c.opset() < input_opset) {
    if (!c.has_attr("axes")) return std::optional<Ints>{};
    TRY(a, c.attr_ints("axes", {}));
    return std::optional<Ints>{a};
  }
  if (!c.has_input(input_index)) return std::optional<Ints>{};
  TRY(v, c.input(input_index));
  TRY(a, c.const_ints(v, "axes"));
  return std::optional<Ints>{a};
}

Error conv_Squeeze(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(axes, axes_of(c, 1, 13));
  const Ints s = c.type(x).sizes;
  const int64_t r = static_cast<int64_t>(s.size());
  std::vector<bool> drop(s.size(), false);
  if (!axes) {
    for (size_t i = 0; i < s.size(); ++i) drop[i] = s[i] == 1;
  } else {
    for (int64_t a : *axes) {
      TRY(w, wrap_axis(c, a, r, "axis"));
      if (s[static_cast<size_t>(w)] != 1) return c.invalid("cannot squeeze dim " + std::to_string(a) + " of size " + std::to_string(s[static_cast<size_t>(w)]));
      drop[static_cast<size_t>(w)] = true;
    }
  }
  Ints out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (!drop[i]) out.push_back(s[i]);
  }
  TRY(y, c.emit("aten.view", {x}, {{"size", out}}));
  return c.set_output(0, y);
}

Error conv_Unsqueeze(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(axes, axes_of(c, 1, 13));
  if (!axes) return c.invalid("missing axes");
  const Ints s = c.type(x).sizes;
  const int64_t r = static_cast<int64_t>(s.size() + axes->size());
  std::vector<bool> ins(static_cast<size_t>(r), false);
  for (int64_t a : *axes) {
    TRY(w, wrap_axis(c, a, r, "axis"));
    if (ins[static_cast<size_t>(w)]) return c.invalid("axis " + std::to_string(a) + " repeated");
    ins[static_cast<size_t>(w)] = true;
  }
  Ints out;
  size_t k = 0;
  for (int64_t i = 0; i < r; ++i) out.push_back(ins[static_cast<size_t>(i)] ? 1 : s[k++]);
  TRY(y, c.emit("aten.view", {x}, {{"size", out}}));
  return c.set_output(0, y);
}

Error conv_Transpose(NodeCtx& c) {
  TRY(x, c.input(0));
  const int64_t r = c.rank(x);
  Ints def(static_cast<size_t>(r));
  for (int64_t i = 0; i < r; ++i) def[static_cast<size_t>(i)] = r - 1 - i;
  TRY(perm, c.attr_ints("perm", def));
  TRY(y, c.emit("aten.permute", {x}, {{"dims", perm}}));
  return c.set_output(0, y);
}

Error conv_Concat(NodeCtx& c) {
  if (!c.has_attr("axis")) return c.invalid("missing attribute 'axis'");
  TRY(axis, c.attr_int("axis", 0));
  std::vector<ValueId> ins;
  for (int i = 0; i < c.num_inputs(); ++i) {
    TRY(v, c.input(i));
    ins.push_back(v);
  }
  if (ins.empty()) return c.invalid("no inputs");
  // Zero-sized inputs contribute nothing (ONNX allows them with any rank-matching shape).
  std::vector<ValueId> kept;
  for (ValueId v : ins) {
    if (c.type(v).numel() != 0) kept.push_back(v);
  }
  if (kept.empty()) kept.push_back(ins[0]);
  if (kept.size() == 1 && ins.size() > 1) {
    TRY(y, c.emit("aten.clone", {kept[0]}));
    return c.set_output(0, y);
  }
  TRY(y, c.emit("aten.cat", kept, {{"dim", axis}}));
  return c.set_output(0, y);
}

// Slice: opset < 10 attributes starts/ends/axes; opset 10+ inputs (starts, ends, axes, steps).
Error conv_Slice(NodeCtx& c) {
  TRY(x, c.input(0));
  Ints starts, ends, axes, steps;
  if (c.opset() < 10) {
    TRY(s, c.attr_ints("starts", {}));
    TRY(e, c.attr_ints("ends", {}));
    TRY(a, c.attr_ints("axes", {}));
    starts = s, ends = e, axes = a;
  } else {
    TRY(sv, c.input(1));
    TRY(ev, c.input(2));
    TRY(s, c.const_ints(sv, "starts"));
    TRY(e, c.const_ints(ev, "ends"));
    starts = s, ends = e;
    if (c.has_input(3)) {
      TRY(av, c.input(3));
      TRY(a, c.const_ints(av, "axes"));
      axes = a;
    }
    if (c.has_input(4)) {
      TRY(tv, c.input(4));
      TRY(t, c.const_ints(tv, "steps"));
      steps = t;
    }
  }
  const int64_t r = c.rank(x);
  if (ends.size() != starts.size()) return c.invalid("starts and ends differ in length");
  if (axes.empty()) {
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
  }
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (axes.size() != starts.size() || steps.size() != starts.size()) return c.invalid("axes/steps length differs from starts");
  ValueId y = x;
  std::vector<bool> seen(static_cast<size_t>(r), false);
  for (size_t i = 0; i < starts.size(); ++i) {
    TRY(ax, wrap_axis(c, axes[i], r, "axis"));
    if (seen[static_cast<size_t>(ax)]) return c.invalid("axis repeated");
    seen[static_cast<size_t>(ax)] = true;
    const int64_t dim = c.type(y).sizes[static_cast<size_t>(ax)];
    const int64_t step = steps[i];
    if (step == 0) return c.invalid("step 0");
    if (step < 0) {  // ONNX: start clamps to [0, dim-1], end to [-1, dim-1]; a gather of the indices
      auto normn = [&](int64_t v, int64_t lo) {
        if (v < 0) v += dim;
        return std::clamp<int64_t>(v, lo, dim - 1);
      };
      const int64_t s0 = normn(starts[i], 0), e0 = ends[i] < -dim ? -1 : normn(ends[i], -1);
      Ints idx;
      for (int64_t k = s0; k > e0 && idx.size() < (size_t{1} << 30); k += step) idx.push_back(k);
      if (idx.empty() || dim == 0) return c.unsupported("an empty slice");
      TRY(iv, c.int64_vector(idx));
      TRY(g, gather(c, y, iv, ax));
      y = g;
      continue;
    }
    // ONNX: negative start/end add dim, then clamp to [0, dim].
    auto norm = [&](int64_t v) {
      if (v < 0) v = v < -dim ? 0 : v + dim;
      return std::clamp<int64_t>(v, 0, dim);
    };
    const int64_t s = norm(starts[i]);
    const int64_t e = std::max(s, norm(ends[i]));
    if (s == 0 && e == dim && step == 1) continue;
    TRY(v, c.emit("aten.slice", {y}, {{"dim", ax}, {"start", s}, {"end", e}, {"step", step}}));
    y = v;
  }
  if (y == x) {
    TRY(v, c.emit("aten.clone", {x}));
    y = v;
  }
  return c.set_output(0, y);
}

// Split: sizes from `split` (attribute before opset 13, input from 13), else equal parts.
Error conv_Split(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(axis_raw, c.attr_int("axis", 0));
  TRY(axis, wrap_axis(c, axis_raw, c.rank(x), "axis"));
  const int64_t dim = c.type(x).sizes[static_cast<size_t>(axis)];
  Ints split;
  if (c.opset() < 13) {
    TRY(s, c.attr_ints("split", {}));
    split = s;
  } else if (c.has_input(1)) {
    TRY(sv, c.input(1));
    TRY(s, c.const_ints(sv, "split"));
    split = s;
  }
  const int n = c.num_outputs();
  if (n < 1) return c.invalid("no outputs");
  if (c.opset() >= 18 && c.has_attr("num_outputs")) {
    // Split-18: num_outputs parts of ceil(dim / num_outputs), the last one smaller (exclusive with
    // the split input).
    TRY(parts, c.attr_int("num_outputs", 0));
    if (!split.empty()) return c.invalid("both the split input and num_outputs are given");
    if (parts != n) return c.invalid("num_outputs = " + std::to_string(parts) + " but the node has " + std::to_string(n) + " outputs");
    const int64_t chunk = (dim + parts - 1) / parts;
    for (int64_t i = 0; i < parts; ++i) split.push_back(std::max<int64_t>(0, std::min(chunk, dim - i * chunk)));
  }
  if (split.empty()) {
    if (dim % n != 0) return c.invalid("dim of size " + std::to_string(dim) + " does not split into " + std::to_string(n) + " equal parts");
    split.assign(static_cast<size_t>(n), dim / n);
  }
  if (static_cast<int>(split.size()) != n) return c.invalid("split has " + std::to_string(split.size()) + " sizes for " + std::to_string(n) + " outputs");
  int64_t off = 0;
  for (int i = 0; i < n; ++i) {
    if (split[static_cast<size_t>(i)] < 0) return c.invalid("negative split size");
    const int64_t end = off + split[static_cast<size_t>(i)];
    if (end > dim) return c.invalid("split sizes exceed the dim's size " + std::to_string(dim));
    TRY(v, c.emit("aten.slice", {x}, {{"dim", axis}, {"start", off}, {"end", end}, {"step", int64_t{1}}}));
    KILN_RETURN_IF_ERROR(c.set_output(i, v));
    off = end;
  }
  if (off != dim) return c.invalid("split sizes sum to " + std::to_string(off) + ", not " + std::to_string(dim));
  return {};
}

// Gather along `axis`: a 0-d constant index is aten.select; otherwise aten.embedding on the data
// moved to [dim, rest] (indices of any shape; negative constant indices are wrapped here,
// dynamic indices must be in [0, dim): the kernel bound-checks them).
Result<ValueId> gather(NodeCtx& c, ValueId x, ValueId idx, int64_t axis) {
  const int64_t r = c.rank(x);
  const Ints s = c.type(x).sizes;
  if (axis < 0 || axis >= r) return c.invalid("gather axis " + std::to_string(axis) + " out of range for rank " + std::to_string(r));
  const int64_t dim = s[static_cast<size_t>(axis)];
  const TensorType it = c.type(idx);
  if (it.dtype != DType::Int64 && it.dtype != DType::Int32) return c.invalid("indices must be int32 or int64");
  if (c.is_const(idx)) {
    TRY(vals, c.const_ints(idx, "indices"));
    for (int64_t& v : vals) {
      if (v < -dim || v >= dim) return c.invalid("index " + std::to_string(v) + " out of range for a dim of size " + std::to_string(dim));
      if (v < 0) v += dim;
    }
    if (it.dim() == 0) {
      return c.emit("aten.select", {x}, {{"dim", axis}, {"index", vals[0]}});
    }
    std::vector<uint8_t> b(vals.size() * 8);
    if (!vals.empty()) std::memcpy(b.data(), vals.data(), b.size());
    TRY(ci, c.constant(TensorType{DType::Int64, it.sizes}, std::move(b)));
    idx = ci;
  }
  if (!c.is_const(idx)) {  // negative indices count from the end: idx + dim where idx < 0
    TRY(zero, c.scalar(it.dtype, 0));
    TRY(d, c.scalar(it.dtype, static_cast<double>(dim)));
    TRY(neg, c.emit("aten.lt", {idx, zero}));
    TRY(shifted, c.emit("aten.add", {idx, d}));
    TRY(w, c.emit("aten.where", {neg, shifted, idx}));
    idx = w;
  }
  // data -> permute axis to front -> [dim, rest] -> embedding -> idx.shape + rest -> move back.
  Ints perm{axis};
  for (int64_t i = 0; i < r; ++i) {
    if (i != axis) perm.push_back(i);
  }
  ValueId d = x;
  if (axis != 0) {
    TRY(p, c.emit("aten.permute", {x}, {{"dims", perm}}));
    d = p;
  }
  int64_t rest = 1;
  Ints rest_sizes;
  for (int64_t i = 1; i < r; ++i) {
    rest *= s[static_cast<size_t>(perm[static_cast<size_t>(i)])];
    rest_sizes.push_back(s[static_cast<size_t>(perm[static_cast<size_t>(i)])]);
  }
  TRY(d2, view(c, d, {dim, rest}));
  TRY(e, c.emit("aten.embedding", {d2, idx}));
  Ints full = it.sizes;
  full.insert(full.end(), rest_sizes.begin(), rest_sizes.end());
  TRY(y0, view(c, e, full));
  ValueId y = y0;
  if (axis != 0) {  // [idx..., s[0..axis), s(axis..)] -> [s[0..axis), idx..., s(axis..)]
    const int64_t q = it.dim();
    Ints p2;
    for (int64_t i = 0; i < axis; ++i) p2.push_back(q + i);
    for (int64_t i = 0; i < q; ++i) p2.push_back(i);
    for (int64_t i = q + axis; i < static_cast<int64_t>(full.size()); ++i) p2.push_back(i);
    TRY(p, c.emit("aten.permute", {y}, {{"dims", p2}}));
    y = p;
  }
  return y;
}

Error conv_Gather(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(idx, c.input(1));
  TRY(axis_raw, c.attr_int("axis", 0));
  TRY(axis, wrap_axis(c, axis_raw, c.rank(x), "axis"));
  TRY(y, gather(c, x, idx, axis));
  return c.set_output(0, y);
}

// Expand: multidirectional broadcast of the input's shape with `shape`.
Error conv_Expand(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(sv, c.input(1));
  TRY(shape, c.const_ints(sv, "shape"));
  for (int64_t v : shape) {
    if (v < 0) return c.invalid("negative size in shape");
  }
  auto b = broadcast_shapes(c.type(x).sizes, shape);
  if (!b.ok()) return c.invalid("shape " + sizes_to_string(shape) + " does not broadcast with input " + sizes_to_string(c.type(x).sizes));
  TRY(y, c.emit("aten.expand", {x}, {{"size", *b}}));
  return c.set_output(0, y);
}

// Tile: view as [1, d0, 1, d1, ...], expand to [r0, d0, r1, d1, ...], view [r0*d0, ...].
Error conv_Tile(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(rv, c.input(1));
  TRY(reps, c.const_ints(rv, "repeats"));
  const Ints s = c.type(x).sizes;
  if (reps.size() != s.size()) return c.invalid("repeats has " + std::to_string(reps.size()) + " values for rank " + std::to_string(s.size()));
  Ints v1, ex, out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (reps[i] < 0) return c.invalid("negative repeat");
    int64_t d = 0;  // repeats come from the file: the product must not overflow
    if (__builtin_mul_overflow(reps[i], s[i], &d)) {
      return c.invalid("repeat " + std::to_string(reps[i]) + " of dim " + std::to_string(i) + " (size " +
                       std::to_string(s[i]) + ") overflows int64");
    }
    v1.push_back(1), v1.push_back(s[i]);
    ex.push_back(reps[i]), ex.push_back(s[i]);
    out.push_back(d);
  }
  TRY(a, view(c, x, v1));
  TRY(e, c.emit("aten.expand", {a}, {{"size", ex}}));
  TRY(y, view(c, e, out));
  return c.set_output(0, y);
}

Error conv_ConstantOfShape(NodeCtx& c) {
  TRY(sv, c.input(0));
  TRY(shape, c.const_ints(sv, "shape"));
  HostTensor value{{DType::Float32, {}}, std::vector<uint8_t>(4, 0)};
  if (const auto* a = c.attr("value")) {
    if (!a->has_t()) return c.invalid("attribute 'value' must be a tensor");
    TRY(h, read_tensor(a->t(), c.im.base_dir, c.where() + " value"));
    if (h.type.numel() != 1) return c.invalid("attribute 'value' must hold one element");
    value = std::move(h);
  }
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return c.invalid("negative size in shape");
    if (d > 0 && n > (int64_t{1} << 32) / d) return c.unsupported("constant too large");
    n *= d;
  }
  const size_t es = dtype_size(value.type.dtype);
  KILN_RETURN_IF_ERROR(c.check_constant_size(static_cast<double>(n), static_cast<double>(es), "the output"));
  std::vector<uint8_t> bytes(static_cast<size_t>(n) * es);
  for (int64_t i = 0; i < n; ++i) std::memcpy(bytes.data() + static_cast<size_t>(i) * es, value.bytes.data(), es);
  TRY(y, c.constant(TensorType{value.type.dtype, shape}, std::move(bytes)));
  return c.set_output(0, y);
}

Error conv_Constant(NodeCtx& c) {
  std::optional<HostTensor> h;
  int given = 0;
  for (const auto& a : c.node.attribute()) {
    const std::string& n = a.name();
    ++given;
    if (n == "value") {
      c.attr(n);
      TRY(t, read_tensor(a.t(), c.im.base_dir, c.where() + " value"));
      h = std::move(t);
    } else if (n == "value_float") {
      TRY(v, c.attr_float(n, 0));
      const float f = static_cast<float>(v);
      std::vector<uint8_t> b(4);
      std::memcpy(b.data(), &f, 4);
      h = HostTensor{{DType::Float32, {}}, b};
    } else if (n == "value_floats") {
      TRY(v, c.attr_floats(n, {}));
      std::vector<uint8_t> b(v.size() * 4);
      for (size_t i = 0; i < v.size(); ++i) {
        const float f = static_cast<float>(v[i]);
        std::memcpy(b.data() + i * 4, &f, 4);
      }
      h = HostTensor{{DType::Float32, {static_cast<int64_t>(v.size())}}, b};
    } else if (n == "value_int") {
      TRY(v, c.attr_int(n, 0));
      std::vector<uint8_t> b(8);
      std::memcpy(b.data(), &v, 8);
      h = HostTensor{{DType::Int64, {}}, b};
    } else if (n == "value_ints") {
      TRY(v, c.attr_ints(n, {}));
      std::vector<uint8_t> b(v.size() * 8);
      if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
      h = HostTensor{{DType::Int64, {static_cast<int64_t>(v.size())}}, b};
    } else {
      c.attr(n);
      return c.unsupported("attribute '" + n + "' (strings and sparse tensors are not Kiln tensors)");
    }
  }
  if (given != 1 || !h) return c.invalid("needs exactly one value attribute");
  TRY(y, c.constant(h->type, std::move(h->bytes)));
  return c.set_output(0, y);
}

// Range(start, limit, delta) on constant scalars: ceil((limit - start) / delta) elements.
Error conv_Range(NodeCtx& c) {
  TRY(s, c.input(0));
  TRY(l, c.input(1));
  TRY(d, c.input(2));
  const DType dt = c.type(s).dtype;
  TRY(sv, c.const_floats(s, "start"));
  TRY(lv, c.const_floats(l, "limit"));
  TRY(dv, c.const_floats(d, "delta"));
  if (sv.size() != 1 || lv.size() != 1 || dv.size() != 1) return c.invalid("start, limit, delta must be scalars");
  if (dv[0] == 0) return c.invalid("delta 0");
  const double n = std::max(0.0, std::ceil((lv[0] - sv[0]) / dv[0]));
  if (!(n <= (1 << 24))) return c.unsupported("range too long");
  std::vector<uint8_t> bytes(static_cast<size_t>(n) * dtype_size(dt));
  for (int64_t i = 0; i < static_cast<int64_t>(n); ++i) {
    auto put = [&](auto v) { std::memcpy(bytes.data() + static_cast<size_t>(i) * sizeof(v), &v, sizeof(v)); };
    switch (dt) {
      case DType::Float32: put(static_cast<float>(sv[0]) + static_cast<float>(i) * static_cast<float>(dv[0])); break;
      case DType::Float64: put(sv[0] + static_cast<double>(i) * dv[0]); break;
      case DType::Int64: put(static_cast<int64_t>(sv[0]) + i * static_cast<int64_t>(dv[0])); break;
      case DType::Int32: put(static_cast<int32_t>(sv[0] + static_cast<double>(i) * dv[0])); break;
      default: return c.unsupported(std::string("dtype ") + dtype_name(dt));
    }
  }
  TRY(y, c.constant(TensorType{dt, {static_cast<int64_t>(n)}}, std::move(bytes)));
  return c.set_output(0, y);
}

// Pad: mode "constant" only; pads from the attribute (opset < 11) or input (with an optional
// constant_value input; opset 18's axes input is out of range).
Error conv_Pad(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(mode, c.attr_string("mode", "constant"));
  if (mode != "constant" && mode != "reflect" && mode != "edge" && !(mode == "wrap" && c.opset() >= 19)) {
    return c.unsupported("attribute 'mode' = '" + mode + "'");
  }
  Ints pads;
  double value = 0;
  if (c.opset() < 11) {
    TRY(p, c.attr_ints("pads", {}));
    TRY(v, c.attr_float("value", 0.0));
    pads = p, value = v;
  } else {
    TRY(pv, c.input(1));
    TRY(p, c.const_ints(pv, "pads"));
    pads = p;
    if (c.has_input(2)) {
      TRY(vv, c.input(2));
      TRY(v, c.const_floats(vv, "constant_value"));
      if (v.size() != 1) return c.invalid("constant_value must be a scalar");
      value = v[0];
    }
  }
  const int64_t r = c.rank(x);
  if (c.opset() >= 18 && c.has_input(3)) {  // Pad-18: pads hold (begins, ends) of the listed axes only
    TRY(av, c.input(3));
    TRY(axes, c.const_ints(av, "axes"));
    if (pads.size() != 2 * axes.size()) return c.invalid("pads needs " + std::to_string(2 * axes.size()) + " values for " +
                                                         std::to_string(axes.size()) + " axes");
    Ints full(static_cast<size_t>(2 * r), 0);
    std::vector<bool> seen(static_cast<size_t>(r), false);
    for (size_t k = 0; k < axes.size(); ++k) {
      TRY(a, wrap_axis(c, axes[k], r, "axes"));
      if (seen[static_cast<size_t>(a)]) return c.invalid("axis " + std::to_string(a) + " repeated in axes");
      seen[static_cast<size_t>(a)] = true;
      full[static_cast<size_t>(a)] = pads[k];
      full[static_cast<size_t>(a + r)] = pads[k + axes.size()];
    }
    pads = full;
  }
  if (static_cast<int64_t>(pads.size()) != 2 * r) return c.invalid("pads needs " + std::to_string(2 * r) + " values");
  if (mode != "constant") {
    // edge / reflect (numpy.pad modes): a gather per padded axis with constant source indices.
    const Ints s = c.type(x).sizes;
    ValueId y = x;
    for (int64_t i = 0; i < r; ++i) {
      const int64_t pb = pads[static_cast<size_t>(i)], pe = pads[static_cast<size_t>(i + r)], n = s[static_cast<size_t>(i)];
      if (pb == 0 && pe == 0) continue;
      const int64_t len = n + pb + pe;
      if (len < 0 || len > (int64_t{1} << 30)) return c.invalid("pads give a bad size");
      if (n == 0) return c.invalid("cannot " + mode + "-pad an empty dim");
      if (mode == "reflect" && (pb >= n || pe >= n)) return c.unsupported("reflect pads >= the dim's size");
      // The gather's indices are a constant of len int64 (found by kiln_onnx_import_fuzzer: pads of
      // 2^26 asked for a 750 MB index vector before anything checked it).
      KILN_RETURN_IF_ERROR(c.check_constant_size(static_cast<double>(len), 8.0,
                                                 "the " + mode + "-pad indices of dim " + std::to_string(i)));
      Ints idx(static_cast<size_t>(len));
      for (int64_t j = 0; j < len; ++j) {
        int64_t src = j - pb;
        if (mode == "edge") {
          src = std::clamp<int64_t>(src, 0, n - 1);
        } else if (mode == "wrap") {  // Pad-19 (numpy.pad mode 'wrap')
          src = ((src % n) + n) % n;
        } else if (n == 1) {
          src = 0;
        } else {
          const int64_t period = 2 * (n - 1);
          src = ((src % period) + period) % period;
          if (src >= n) src = period - src;
        }
        idx[static_cast<size_t>(j)] = src;
      }
      TRY(iv, c.int64_vector(idx));
      TRY(g, gather(c, y, iv, i));
      y = g;
    }
    if (y == x) {
      TRY(v, c.emit("aten.clone", {x}));
      y = v;
    }
    return c.set_output(0, y);
  }
  Ints aten;  // last dim first: (begin, end) pairs
  for (int64_t i = r - 1; i >= 0; --i) {
    aten.push_back(pads[static_cast<size_t>(i)]);
    aten.push_back(pads[static_cast<size_t>(i + r)]);
  }
  TRY(y, c.emit("aten.constant_pad_nd", {x}, {{"pad", aten}, {"value", value}}));
  return c.set_output(0, y);
}

// DepthToSpace (DCR or CRD) and SpaceToDepth as view + permute + view.
Error conv_DepthToSpace(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(bs, c.attr_int("blocksize", 0));
  TRY(mode, c.attr_string("mode", "DCR"));
  if (c.rank(x) != 4 || bs < 1) return c.invalid("needs a 4-D input and blocksize >= 1");
  const Ints s = c.type(x).sizes;
  const int64_t n = s[0], ch = s[1], h = s[2], w = s[3];
  if (ch % (bs * bs) != 0) return c.invalid("channels not divisible by blocksize^2");
  const int64_t co = ch / (bs * bs);
  ValueId v;
  Ints perm;
  if (mode == "DCR") {
    TRY(a, view(c, x, {n, bs, bs, co, h, w}));
    v = a, perm = {0, 3, 4, 1, 5, 2};
  } else if (mode == "CRD") {
    TRY(a, view(c, x, {n, co, bs, bs, h, w}));
    v = a, perm = {0, 1, 4, 2, 5, 3};
  } else {
    return c.unsupported("attribute 'mode' = '" + mode + "'");
  }
  TRY(p, c.emit("aten.permute", {v}, {{"dims", perm}}));
  TRY(y, view(c, p, {n, co, h * bs, w * bs}));
  return c.set_output(0, y);
}

Error conv_SpaceToDepth(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(bs, c.attr_int("blocksize", 0));
  if (c.rank(x) != 4 || bs < 1) return c.invalid("needs a 4-D input and blocksize >= 1");
  const Ints s = c.type(x).sizes;
  const int64_t n = s[0], ch = s[1], h = s[2], w = s[3];
  if (h % bs || w % bs) return c.invalid("spatial size not divisible by blocksize");
  TRY(a, view(c, x, {n, ch, h / bs, bs, w / bs, bs}));
  TRY(p, c.emit("aten.permute", {a}, {{"dims", Ints{0, 3, 5, 1, 2, 4}}}));
  TRY(y, view(c, p, {n, ch * bs * bs, h / bs, w / bs}));
  return c.set_output(0, y);
}

// ---- reductions, softmax ----

// ReduceX with axes from the attribute (or the input from opset 13 for ReduceSum; 18 for the
// others, beyond the supported range) and keepdims (default 1); no axes = all dims, or the
// identity when noop_with_empty_axes = 1 (ReduceSum 13).
Error reduce(NodeCtx& c, const std::string& kind) {
  TRY(x, c.input(0));
  TRY(axes, axes_of(c, 1, kind == "ReduceSum" ? 13 : 18));
  TRY(keep, c.attr_int("keepdims", 1));
  TRY(noop, c.attr_int("noop_with_empty_axes", 0));
  const int64_t r = c.rank(x);
  if ((!axes || axes->empty()) && noop) {
    TRY(y, c.emit("aten.clone", {x}));
    return c.set_output(0, y);
  }
  Ints dims;
  if (axes && !axes->empty()) {
    for (int64_t a : *axes) {
      TRY(w, wrap_axis(c, a, r, "axis"));
      dims.push_back(w);
    }
  } else {
    for (int64_t i = 0; i < r; ++i) dims.push_back(i);
  }
  const bool kd = keep != 0;
  if (kind == "ReduceMax" || kind == "ReduceMin") {
    // Opset 18's empty-set rule: max over no elements is the dtype's lowest value (-inf, false),
    // min its highest (+inf, true); aten.amax / amin refuse an empty reduction.
    const Ints xs = c.type(x).sizes;
    bool empty = false;
    for (int64_t d : dims) empty |= xs[static_cast<size_t>(d)] == 0;
    if (empty) {
      Ints os;
      for (int64_t i = 0; i < r; ++i) {
        const bool red = std::find(dims.begin(), dims.end(), i) != dims.end();
        if (!red) os.push_back(xs[static_cast<size_t>(i)]);
        else if (kd) os.push_back(1);
      }
      const bool hi = kind == "ReduceMin";
      const DType dt = c.type(x).dtype;
      std::vector<uint8_t> one(dtype_size(dt));
      auto put = [&](auto v) { std::memcpy(one.data(), &v, sizeof(v)); };
      const double inf = std::numeric_limits<double>::infinity();
      switch (dt) {
        case DType::Float32: put(static_cast<float>(hi ? inf : -inf)); break;
        case DType::Float64: put(hi ? inf : -inf); break;
        case DType::Float16: put(float_to_half(static_cast<float>(hi ? inf : -inf))); break;
        case DType::BFloat16: put(float_to_bfloat16(static_cast<float>(hi ? inf : -inf))); break;
        case DType::Int64: put(hi ? std::numeric_limits<int64_t>::max() : std::numeric_limits<int64_t>::lowest()); break;
        case DType::Int32: put(hi ? std::numeric_limits<int32_t>::max() : std::numeric_limits<int32_t>::lowest()); break;
        case DType::Int8: put(hi ? std::numeric_limits<int8_t>::max() : std::numeric_limits<int8_t>::lowest()); break;
        case DType::UInt8: put(static_cast<uint8_t>(hi ? 255 : 0)); break;
        case DType::Bool: put(static_cast<uint8_t>(hi ? 1 : 0)); break;
      }
      const int64_t n = numel_of(os);
      KILN_RETURN_IF_ERROR(c.check_constant_size(static_cast<double>(n), static_cast<double>(one.size()), "the empty-set result"));
      std::vector<uint8_t> bytes;
      bytes.reserve(static_cast<size_t>(n) * one.size());
      for (int64_t i = 0; i < n; ++i) bytes.insert(bytes.end(), one.begin(), one.end());
      TRY(k, c.constant(TensorType{dt, os}, std::move(bytes)));
      TRY(y, c.emit("aten.clone", {k}));
      return c.set_output(0, y);
    }
  }
  ValueId in = x;
  std::string op = "aten.sum";
  if (kind == "ReduceMean") op = "aten.mean";
  else if (kind == "ReduceMax") op = "aten.amax";
  else if (kind == "ReduceMin") op = "aten.amin";
  else if (kind == "ReduceSumSquare" || kind == "ReduceL2") {
    TRY(sq, c.emit("aten.mul", {x, x}));
    in = sq;
  } else if (kind == "ReduceL1") {
    TRY(a, c.emit("aten.abs", {x}));
    in = a;
  } else if (kind == "ReduceLogSumExp") {
    TRY(e, c.emit("aten.exp", {x}));
    in = e;
  }
  if (r == 0) {
    TRY(y, c.emit("aten.clone", {in}));
    return c.set_output(0, y);
  }
  TRY(y0, c.emit(op, {in}, {{"dim", dims}, {"keepdim", kd}}));
  ValueId y = y0;
  if (c.type(y).dtype != c.type(x).dtype) {  // aten.sum of integers gives int64; ONNX keeps the type
    TRY(v, c.emit("aten._to_copy", {y}, {{"dtype", std::string(dtype_name(c.type(x).dtype))}}));
    y = v;
  }
  if (kind == "ReduceL2") {
    TRY(s, c.emit("aten.sqrt", {y}));
    y = s;
  } else if (kind == "ReduceLogSumExp" || kind == "ReduceLogSum") {
    TRY(s, c.emit("aten.log", {y}));
    y = s;
  }
  return c.set_output(0, y);
}
Error conv_ReduceMean(NodeCtx& c) { return reduce(c, "ReduceMean"); }
Error conv_ReduceSum(NodeCtx& c) { return reduce(c, "ReduceSum"); }
Error conv_ReduceMax(NodeCtx& c) { return reduce(c, "ReduceMax"); }
Error conv_ReduceMin(NodeCtx& c) { return reduce(c, "ReduceMin"); }
Error conv_ReduceSumSquare(NodeCtx& c) { return reduce(c, "ReduceSumSquare"); }
Error conv_ReduceL1(NodeCtx& c) { return reduce(c, "ReduceL1"); }
Error conv_ReduceL2(NodeCtx& c) { return reduce(c, "ReduceL2"); }
Error conv_ReduceLogSumExp(NodeCtx& c) { return reduce(c, "ReduceLogSumExp"); }
Error conv_ReduceLogSum(NodeCtx& c) { return reduce(c, "ReduceLogSum"); }

Error conv_ArgMax(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(axis_raw, c.attr_int("axis", 0));
  TRY(keep, c.attr_int("keepdims", 1));
  TRY(last, c.attr_int("select_last_index", 0));
  TRY(axis, wrap_axis(c, axis_raw, c.rank(x), "axis"));
  if (!last) {
    TRY(y, c.emit("aten.argmax", {x}, {{"dim", axis}, {"keepdim", keep != 0}}));
    return c.set_output(0, y);
  }
  // Last index of the maximum: (n - 1) - argmax(x reversed along axis); the reversal is a gather
  // with the constant indices n-1 .. 0.
  const int64_t n = c.type(x).sizes[static_cast<size_t>(axis)];
  Ints rev(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) rev[static_cast<size_t>(i)] = n - 1 - i;
  TRY(ri, c.int64_vector(rev));
  TRY(xr, gather(c, x, ri, axis));
  TRY(am, c.emit("aten.argmax", {xr}, {{"dim", axis}, {"keepdim", keep != 0}}));
  TRY(top, c.scalar(DType::Int64, static_cast<double>(n - 1)));
  TRY(y, c.emit("aten.sub", {top, am}));
  return c.set_output(0, y);
}

// Softmax / LogSoftmax: opset 13+ over `axis` (default -1); before 13 the input is coerced to 2-D
// [prod(dims < axis), prod(dims >= axis)] (default axis 1) and normalized over the second dim.
Error softmax(NodeCtx& c, const char* op) {
  TRY(x, c.input(0));
  const int64_t r = c.rank(x);
  TRY(axis_raw, c.attr_int("axis", c.opset() >= 13 ? -1 : 1));
  if (r == 0) return c.unsupported("0-d input");
  TRY(axis, wrap_axis(c, axis_raw, r, "axis"));
  if (c.opset() >= 13 || axis == r - 1) {
    TRY(y, c.emit(op, {x}, {{"dim", axis}, {"half_to_float", false}}));
    return c.set_output(0, y);
  }
  const Ints s = c.type(x).sizes;
  int64_t a = 1, b = 1;
  for (int64_t i = 0; i < r; ++i) (i < axis ? a : b) *= s[static_cast<size_t>(i)];
  TRY(v, view(c, x, {a, b}));
  TRY(sm, c.emit(op, {v}, {{"dim", int64_t{1}}, {"half_to_float", false}}));
  TRY(y, view(c, sm, s));
  return c.set_output(0, y);
}
Error conv_Softmax(NodeCtx& c) { return softmax(c, "aten._softmax"); }
Error conv_LogSoftmax(NodeCtx& c) { return softmax(c, "aten._log_softmax"); }

// ---- linear algebra ----

// MatMul with numpy semantics: 1-D operands get a dim added and removed; a 2-D right operand is
// aten.linear with its transpose (folded when constant); otherwise batch dims are broadcast and
// the product is aten.bmm on [batch, M, K] x [batch, K, N].
Error conv_MatMul(NodeCtx& c) {
  TRY(a0, c.input(0));
  TRY(b0, c.input(1));
  KILN_RETURN_IF_ERROR(check_same_dtype(c, a0, b0));
  Ints as = c.type(a0).sizes, bs = c.type(b0).sizes;
  if (as.empty() || bs.empty()) return c.invalid("MatMul operands must have rank >= 1");
  ValueId a = a0, b = b0;
  const bool a1 = as.size() == 1, b1 = bs.size() == 1;
  if (a1) {
    as.insert(as.begin(), 1);
    TRY(v, view(c, a, as));
    a = v;
  }
  if (b1) {
    bs.push_back(1);
    TRY(v, view(c, b, bs));
    b = v;
  }
  const int64_t K = as.back(), N = bs.back(), M = as[as.size() - 2];
  if (bs[bs.size() - 2] != K) return c.invalid("shapes " + sizes_to_string(c.type(a0).sizes) + " and " + sizes_to_string(c.type(b0).sizes) + " cannot be multiplied");
  ValueId y;
  Ints out;
  if (bs.size() == 2) {
    TRY(bt, c.emit("aten.permute", {b}, {{"dims", Ints{1, 0}}}));
    TRY(l, c.emit("aten.linear", {a, bt, kNoValue}));
    y = l;
    out = c.type(y).sizes;
  } else {
    Ints ab(as.begin(), as.end() - 2), bb(bs.begin(), bs.end() - 2);
    auto batch = broadcast_shapes(ab, bb);
    if (!batch.ok()) return c.invalid("batch dims do not broadcast: " + batch.error().message());
    const int64_t nb = numel_of(*batch);
    Ints ae = *batch, be = *batch;
    ae.push_back(M), ae.push_back(K);
    be.push_back(K), be.push_back(N);
    ValueId ax = a, bx = b;
    if (as != ae) {
      TRY(v, c.emit("aten.expand", {a}, {{"size", ae}}));
      ax = v;
    }
    if (bs != be) {
      TRY(v, c.emit("aten.expand", {b}, {{"size", be}}));
      bx = v;
    }
    TRY(a3, view(c, ax, {nb, M, K}));
    TRY(b3, view(c, bx, {nb, K, N}));
    TRY(p, c.emit("aten.bmm", {a3, b3}));
    out = *batch;
    out.push_back(M), out.push_back(N);
    TRY(v, view(c, p, out));
    y = v;
  }
  if (a1 || b1) {
    Ints o = c.type(y).sizes;
    if (b1) o.pop_back();
    if (a1) o.erase(o.end() - (b1 ? 1 : 2));
    TRY(v, view(c, y, o));
    y = v;
  }
  return c.set_output(0, y);
}

// Gemm: Y = alpha * A' B' + beta * C (A' = A^T when transA, B' likewise).
Error conv_Gemm(NodeCtx& c) {
  TRY(a, c.input(0));
  TRY(b, c.input(1));
  TRY(cc, c.opt_input(2));
  TRY(alpha, c.attr_float("alpha", 1.0));
  TRY(beta, c.attr_float("beta", 1.0));
  TRY(ta, c.attr_int("transA", 0));
  TRY(tb, c.attr_int("transB", 0));
  if (c.opset() < 7) {  // Gemm-6: broadcast = 1 lets C broadcast; 0 wants C of shape [M, N] (checked by linear)
    TRY(bc, c.attr_int("broadcast", 0));
    (void)bc;
  }
  if (c.rank(a) != 2 || c.rank(b) != 2) return c.invalid("A and B must be 2-D");
  KILN_RETURN_IF_ERROR(check_same_dtype(c, a, b));
  if (ta) {
    TRY(v, c.emit("aten.permute", {a}, {{"dims", Ints{1, 0}}}));
    a = v;
  }
  ValueId w = b;  // aten.linear wants [N, K]
  if (!tb) {
    TRY(v, c.emit("aten.permute", {b}, {{"dims", Ints{1, 0}}}));
    w = v;
  }
  ValueId bias = kNoValue;
  if (cc != kNoValue && beta != 0) {
    bias = cc;
    if (beta != 1) {
      TRY(bs, c.scalar(c.type(cc).dtype, beta));
      TRY(v, c.emit("aten.mul", {cc, bs}));
      bias = v;
    }
  }
  ValueId y;
  if (alpha == 1) {
    TRY(v, c.emit("aten.linear", {a, w, bias}));
    y = v;
  } else {
    TRY(l, c.emit("aten.linear", {a, w, kNoValue}));
    TRY(as, c.scalar(c.type(l).dtype, alpha));
    TRY(m, c.emit("aten.mul", {l, as}));
    y = m;
    if (bias != kNoValue) {
      TRY(s, c.emit("aten.add", {y, bias}));
      y = s;
    }
  }
  return c.set_output(0, y);
}

// ---- convolution and pooling ----

struct Spatial {
  Ints kernel, strides, dilations, pad_begin, pad_end;
};

// auto_pad / pads / strides / dilations of a Conv or pool node with spatial input `in`.
Result<Spatial> spatial_attrs(NodeCtx& c, const Ints& in, const Ints& kernel, bool dilations_attr) {
  const size_t n = in.size();
  Spatial s;
  s.kernel = kernel;
  TRY(strides, c.attr_ints("strides", Ints(n, 1)));
  Ints dil(n, 1);
  if (dilations_attr) {
    TRY(d, c.attr_ints("dilations", Ints(n, 1)));
    dil = d;
  }
  TRY(pads, c.attr_ints("pads", Ints(2 * n, 0)));
  TRY(auto_pad, c.attr_string("auto_pad", "NOTSET"));
  if (strides.size() != n || dil.size() != n || pads.size() != 2 * n) {
    return c.invalid("strides/dilations/pads do not match the " + std::to_string(n) + " spatial dims");
  }
  for (size_t i = 0; i < n; ++i) {
    if (strides[i] < 1 || dil[i] < 1 || kernel[i] < 1) return c.invalid("strides, dilations and kernel sizes must be >= 1");
    if (pads[i] < 0 || pads[i + n] < 0) return c.unsupported("negative pads");
  }
  s.strides = strides;
  s.dilations = dil;
  s.pad_begin.assign(pads.begin(), pads.begin() + static_cast<long>(n));
  s.pad_end.assign(pads.begin() + static_cast<long>(n), pads.end());
  if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
    for (size_t i = 0; i < n; ++i) {
      const int64_t out = (in[i] + strides[i] - 1) / strides[i];
      const int64_t total = std::max<int64_t>(0, (out - 1) * strides[i] + (kernel[i] - 1) * dil[i] + 1 - in[i]);
      const int64_t small = total / 2, big = total - small;
      s.pad_begin[i] = auto_pad == "SAME_UPPER" ? small : big;
      s.pad_end[i] = auto_pad == "SAME_UPPER" ? big : small;
    }
  } else if (auto_pad == "VALID") {
    std::fill(s.pad_begin.begin(), s.pad_begin.end(), 0);
    std::fill(s.pad_end.begin(), s.pad_end.end(), 0);
  } else if (auto_pad != "NOTSET" && !auto_pad.empty()) {
    return c.invalid("attribute 'auto_pad' = '" + auto_pad + "'");
  }
  return s;
}

// Pads `x` explicitly (constant_pad_nd with `value`) where begin != end and returns the symmetric
// remainder in s.pad_begin (pad_end cleared to match).
Result<ValueId> pad_asymmetric(NodeCtx& c, ValueId x, Spatial& s, double value) {
  const size_t n = s.pad_begin.size();
  bool asym = false;
  for (size_t i = 0; i < n; ++i) asym |= s.pad_begin[i] != s.pad_end[i];
  if (!asym) return x;
  Ints aten;
  for (size_t k = n; k-- > 0;) {
    aten.push_back(s.pad_begin[k]);
    aten.push_back(s.pad_end[k]);
  }
  std::fill(s.pad_begin.begin(), s.pad_begin.end(), 0);
  std::fill(s.pad_end.begin(), s.pad_end.end(), 0);
  return c.emit("aten.constant_pad_nd", {x}, {{"pad", aten}, {"value", value}});
}


// ---- 3-D convolution and pooling as sums / maxima of 2-D ones over the depth taps ----

// x [N, C, D, H, W] padded explicitly by s's pads (value `pad`); returns it and clears the pads.
Result<ValueId> pad3d(NodeCtx& c, ValueId x, Spatial& s, double pad) {
  bool any = false;
  for (size_t i = 0; i < 3; ++i) any |= s.pad_begin[i] != 0 || s.pad_end[i] != 0;
  if (!any) return x;
  Ints aten;
  for (size_t k = 3; k-- > 0;) {
    aten.push_back(s.pad_begin[k]);
    aten.push_back(s.pad_end[k]);
  }
  std::fill(s.pad_begin.begin(), s.pad_begin.end(), 0);
  std::fill(s.pad_end.begin(), s.pad_end.end(), 0);
  return c.emit("aten.constant_pad_nd", {x}, {{"pad", aten}, {"value", pad}});
}

// Output depth of a window (kd, dilation dd, stride sd) over padded depth dp; 0 when none fits.
int64_t out_depth(int64_t dp, int64_t kd, int64_t dd, int64_t sd) {
  const int64_t eff = (kd - 1) * dd + 1;
  return dp < eff ? 0 : (dp - eff) / sd + 1;
}

// The depth tap k of x [N, C, Dp, H, W]: the OD slices at depth k*dd + j*sd, as [N*OD, C, H, W]
// (folded into the batch; `channels_last_depth` false) or [N, C*OD, H, W] (true).
Result<ValueId> depth_tap(NodeCtx& c, ValueId x, int64_t k, int64_t dd, int64_t sd, int64_t od, bool into_channels) {
  const Ints xs = c.type(x).sizes;
  const int64_t start = k * dd;
  TRY(sl, c.emit("aten.slice", {x}, {{"dim", int64_t{2}}, {"start", start}, {"end", start + (od - 1) * sd + 1}, {"step", sd}}));
  if (into_channels) return view(c, sl, {xs[0], xs[1] * od, xs[3], xs[4]});
  TRY(p, c.emit("aten.permute", {sl}, {{"dims", Ints{0, 2, 1, 3, 4}}}));
  return view(c, p, {xs[0] * od, xs[1], xs[3], xs[4]});
}

// Conv with a 5-D input: sum over kd of conv2d(depth tap kd, W[:, :, kd]); bias added at the end.
Error conv3d(NodeCtx& c, ValueId x, ValueId w, ValueId b, Spatial s, int64_t group) {
  TRY(xp, pad3d(c, x, s, 0.0));
  const Ints xs = c.type(xp).sizes, ws = c.type(w).sizes;
  const int64_t od = out_depth(xs[2], ws[2], s.dilations[0], s.strides[0]);
  if (od < 1) return c.invalid("the kernel does not fit the padded depth");
  if (ws[2] > 64) return c.unsupported("3-D kernels deeper than 64");
  ValueId acc = kNoValue;
  for (int64_t k = 0; k < ws[2]; ++k) {
    TRY(tap, depth_tap(c, xp, k, s.dilations[0], s.strides[0], od, false));
    TRY(wk, c.emit("aten.select", {w}, {{"dim", int64_t{2}}, {"index", k}}));
    TRY(y, c.emit("aten.convolution", {tap, wk, kNoValue},
                  {{"stride", Ints{s.strides[1], s.strides[2]}}, {"padding", Ints{0, 0}},
                   {"dilation", Ints{s.dilations[1], s.dilations[2]}}, {"transposed", false},
                   {"output_padding", Ints{0, 0}}, {"groups", group}}));
    if (acc == kNoValue) {
      acc = y;
    } else {
      TRY(a, c.emit("aten.add", {acc, y}));
      acc = a;
    }
  }
  const Ints ys = c.type(acc).sizes;  // [N*OD, O, OH, OW]
  TRY(v, view(c, acc, {xs[0], od, ys[1], ys[2], ys[3]}));
  TRY(out, c.emit("aten.permute", {v}, {{"dims", Ints{0, 2, 1, 3, 4}}}));
  ValueId y = out;
  if (b != kNoValue) {
    TRY(bv, view(c, b, {ys[1], 1, 1, 1}));
    TRY(a, c.emit("aten.add", {y, bv}));
    y = a;
  }
  return c.set_output(0, y);
}

// MaxPool / AveragePool with a 5-D input: the maximum (or the mean) over kd of 2-D pools of the
// depth taps; average pooling without count_include_pad divides by the pooled count of a ones mask.
Error pool3d(NodeCtx& c, ValueId x, Spatial s, bool is_max, bool cip) {
  const Ints xs0 = c.type(x).sizes;
  if (c.type(x).dtype != DType::Float32) return c.unsupported(std::string("dtype ") + dtype_name(c.type(x).dtype));
  bool padded = false;
  for (size_t i = 0; i < 3; ++i) padded |= s.pad_begin[i] != 0 || s.pad_end[i] != 0;
  ValueId mask = kNoValue;
  if (!is_max && padded && !cip) {
    KILN_RETURN_IF_ERROR(c.check_constant_size(static_cast<double>(c.type(x).numel()), 4, "the count mask"));
    std::vector<uint8_t> ones(c.type(x).nbytes());
    const float one = 1.0f;
    for (size_t i = 0; i < ones.size(); i += 4) std::memcpy(ones.data() + i, &one, 4);
    TRY(m, c.constant(c.type(x), std::move(ones)));
    Spatial sm = s;
    TRY(mp, pad3d(c, m, sm, 0.0));
    mask = mp;
  }
  const double fill = is_max ? -std::numeric_limits<double>::infinity() : 0.0;
  TRY(xp, pad3d(c, x, s, fill));
  const Ints xs = c.type(xp).sizes;
  const int64_t od = out_depth(xs[2], s.kernel[0], s.dilations[0], s.strides[0]);
  if (od < 1) return c.invalid("the kernel does not fit the padded depth");
  if (s.kernel[0] > 64) return c.unsupported("3-D kernels deeper than 64");
  auto pooled = [&](ValueId src, int64_t k) -> Result<ValueId> {
    TRY(tap, depth_tap(c, src, k, s.dilations[0], s.strides[0], od, true));
    if (is_max) {
      return c.emit("aten.max_pool2d", {tap}, {{"kernel_size", Ints{s.kernel[1], s.kernel[2]}},
                                              {"stride", Ints{s.strides[1], s.strides[2]}}, {"padding", Ints{0, 0}},
                                              {"dilation", Ints{s.dilations[1], s.dilations[2]}}, {"ceil_mode", false}});
    }
    return c.emit("aten.avg_pool2d", {tap}, {{"kernel_size", Ints{s.kernel[1], s.kernel[2]}},
                                            {"stride", Ints{s.strides[1], s.strides[2]}}, {"padding", Ints{0, 0}},
                                            {"ceil_mode", false}, {"count_include_pad", true}});
  };
  ValueId acc = kNoValue, den = kNoValue;
  for (int64_t k = 0; k < s.kernel[0]; ++k) {
    TRY(p, pooled(xp, k));
    if (acc == kNoValue) {
      acc = p;
    } else if (is_max) {
      TRY(ge, c.emit("aten.ge", {acc, p}));
      TRY(m, c.emit("aten.where", {ge, acc, p}));
      acc = m;
    } else {
      TRY(a, c.emit("aten.add", {acc, p}));
      acc = a;
    }
    if (mask != kNoValue) {
      TRY(q, pooled(mask, k));
      if (den == kNoValue) {
        den = q;
      } else {
        TRY(a, c.emit("aten.add", {den, q}));
        den = a;
      }
    }
  }
  ValueId y = acc;
  if (!is_max) {
    if (den != kNoValue) {
      TRY(v, c.emit("aten.div", {acc, den}));
      y = v;
    } else {
      TRY(kd, c.scalar(DType::Float32, static_cast<double>(s.kernel[0])));
      TRY(v, c.emit("aten.div", {acc, kd}));
      y = v;
    }
  }
  const Ints ys = c.type(y).sizes;  // [N, C*OD, OH, OW]
  TRY(out, view(c, y, {xs0[0], xs0[1], od, ys[2], ys[3]}));
  return c.set_output(0, out);
}

Error conv_Conv(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(w, c.input(1));
  TRY(b, c.opt_input(2));
  const Ints xs = c.type(x).sizes, ws = c.type(w).sizes;
  if (xs.size() < 3 || xs.size() > 5) return c.unsupported("input of rank " + std::to_string(xs.size()) + " (1-D, 2-D and 3-D convolutions only)");
  if (ws.size() != xs.size()) return c.invalid("weight rank differs from input rank");
  Ints kernel(ws.begin() + 2, ws.end());
  TRY(ks, c.attr_ints("kernel_shape", kernel));
  if (ks != kernel) return c.invalid("kernel_shape " + sizes_to_string(ks) + " differs from the weight's " + sizes_to_string(kernel));
  TRY(group, c.attr_int("group", 1));
  TRY(s, spatial_attrs(c, Ints(xs.begin() + 2, xs.end()), kernel, true));
  if (xs.size() == 5) return conv3d(c, x, w, b, s, group);
  TRY(xp, pad_asymmetric(c, x, s, 0.0));
  TRY(y, c.emit("aten.convolution", {xp, w, b},
                {{"stride", s.strides}, {"padding", s.pad_begin}, {"dilation", s.dilations}, {"transposed", false},
                 {"output_padding", Ints(kernel.size(), 0)}, {"groups", group}}));
  return c.set_output(0, y);
}

// ConvTranspose: output = stride * (in - 1) + output_padding + (k - 1) * d + 1 - pad_begin - pad_end;
// output_shape (or SAME_* auto_pad) determines the pads as the ONNX spec says.
Error conv_ConvTranspose(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(w, c.input(1));
  TRY(b, c.opt_input(2));
  const Ints xs = c.type(x).sizes, ws = c.type(w).sizes;
  if (xs.size() != 3 && xs.size() != 4) return c.unsupported("input of rank " + std::to_string(xs.size()) + " (1-D and 2-D only)");
  if (ws.size() != xs.size()) return c.invalid("weight rank differs from input rank");
  const size_t n = xs.size() - 2;
  Ints kernel(ws.begin() + 2, ws.end());
  TRY(ks, c.attr_ints("kernel_shape", kernel));
  if (ks != kernel) return c.invalid("kernel_shape differs from the weight's");
  TRY(group, c.attr_int("group", 1));
  TRY(strides, c.attr_ints("strides", Ints(n, 1)));
  TRY(dil, c.attr_ints("dilations", Ints(n, 1)));
  TRY(pads, c.attr_ints("pads", Ints(2 * n, 0)));
  TRY(opad, c.attr_ints("output_padding", Ints(n, 0)));
  TRY(oshape, c.attr_ints("output_shape", {}));
  TRY(auto_pad, c.attr_string("auto_pad", "NOTSET"));
  if (strides.size() != n || dil.size() != n || pads.size() != 2 * n || opad.size() != n) {
    return c.invalid("strides/dilations/pads/output_padding do not match the spatial dims");
  }
  for (size_t i = 0; i < n; ++i) {
    if (strides[i] < 1 || dil[i] < 1) return c.invalid("strides and dilations must be >= 1");
    if (pads[i] < 0 || pads[i + n] < 0 || opad[i] < 0) return c.unsupported("negative pads");
  }
  if (oshape.size() > n) oshape.erase(oshape.begin(), oshape.end() - static_cast<long>(n));  // may include N, C
  const bool same = auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER";
  if (!same && auto_pad != "NOTSET" && auto_pad != "VALID" && !auto_pad.empty()) return c.invalid("attribute 'auto_pad' = '" + auto_pad + "'");
  if (auto_pad == "VALID") std::fill(pads.begin(), pads.end(), 0);
  if (!oshape.empty() || same) {
    if (!oshape.empty() && oshape.size() != n) return c.invalid("output_shape length");
    for (size_t i = 0; i < n; ++i) {
      const int64_t want = oshape.empty() ? xs[2 + i] * strides[i] : oshape[i];
      const int64_t total = strides[i] * (xs[2 + i] - 1) + opad[i] + (kernel[i] - 1) * dil[i] + 1 - want;
      if (total < 0) {  // a larger output_shape: the extra rows/cols are output padding at the end
        if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") return c.unsupported("output_shape larger than the full output with SAME padding");
        opad[i] += -total;
        pads[i] = pads[i + n] = 0;
        continue;
      }
      if (auto_pad == "SAME_UPPER") {
        pads[i] = total / 2, pads[i + n] = total - total / 2;
      } else {
        pads[i] = total - total / 2, pads[i + n] = total / 2;
      }
    }
  }
  // aten.convolution pads both ends alike and takes output_padding < max(stride, dilation)
  // (PyTorch's rule). Asymmetric pads: the larger begin pad becomes extra output_padding when that
  // stays within the rule; otherwise the convolution pads by the smaller of the two and slices
  // the rest off each end (trim_begin / trim).
  Ints padding(n), out_pad(n), trim(n, 0), trim_begin(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const int64_t pb = pads[i], pe = pads[i + n];
    const int64_t limit = std::max(strides[i], dil[i]);
    if (opad[i] >= limit) {
      return c.unsupported("output_padding " + std::to_string(opad[i]) + " >= max(stride, dilation) = " +
                           std::to_string(limit));
    }
    if (pb >= pe && opad[i] + (pb - pe) < limit) {
      padding[i] = pb;
      out_pad[i] = opad[i] + (pb - pe);
    } else {
      padding[i] = std::min(pb, pe);
      out_pad[i] = opad[i];
      trim_begin[i] = pb - padding[i];
      trim[i] = pe - padding[i];
    }
  }
  TRY(y0, c.emit("aten.convolution", {x, w, b},
                 {{"stride", strides}, {"padding", padding}, {"dilation", dil}, {"transposed", true},
                  {"output_padding", out_pad}, {"groups", group}}));
  ValueId y = y0;
  for (size_t i = 0; i < n; ++i) {
    if (!trim[i] && !trim_begin[i]) continue;
    const int64_t d = c.type(y).sizes[2 + i];
    if (trim[i] + trim_begin[i] >= d) return c.invalid("pads remove the whole output");
    TRY(v, c.emit("aten.slice", {y}, {{"dim", static_cast<int64_t>(2 + i)}, {"start", trim_begin[i]}, {"end", d - trim[i]}, {"step", int64_t{1}}}));
    y = v;
  }
  return c.set_output(0, y);
}

// MaxPool / AveragePool (2-D; 1-D through an added dim). ceil_mode, count_include_pad,
// dilations (MaxPool), storage_order (affects only the unsupported Indices output).
// Adds one node with several outputs (no eager constant evaluation); errors as NodeCtx::emit.
Result<std::vector<ValueId>> emit_multi(NodeCtx& c, const std::string& op, std::vector<ValueId> inputs,
                                        const Attributes& attrs) {
  const std::string debug = c.node.name().empty() ? c.node.op_type() + "#" + std::to_string(c.index) : c.node.name();
  auto outs = c.im.graph.add_node(op, inputs, attrs, debug);
  if (!outs.ok()) {
    const ErrorCode code = outs.error().code() == ErrorCode::InvalidArgument ? ErrorCode::InvalidProgram : outs.error().code();
    return Error(code, c.where() + ": " + outs.error().message());
  }
  return outs;
}

// MaxPool with its Indices output (1-D / 2-D, symmetric pads): aten.max_pool2d_with_indices gives
// ih * W + iw within each (n, c) plane; ONNX wants the index into the whole N x C x H x W tensor
// ("the indices do not consider padding"), row-major (storage_order 0) or with h and w swapped in
// the plane (storage_order 1: ih + iw * H), as the ONNX reference op_max_pool.py computes it.
// `x` is the (possibly float32-converted, 1-D -> [N, C, 1, L] viewed) input; xs0 the original sizes.
Error max_pool_with_indices(NodeCtx& c, ValueId x, const Ints& xs0, const Spatial& s, bool ceil, int64_t storage_order,
                            DType in_dt) {
  const Ints xs = c.type(x).sizes;  // [N, C, H, W]
  const int64_t n = xs[0], ch = xs[1], h = xs[2], w = xs[3];
  TRY(outs, emit_multi(c, "aten.max_pool2d_with_indices", {x},
                       {{"kernel_size", s.kernel}, {"stride", s.strides}, {"padding", s.pad_begin},
                        {"dilation", s.dilations}, {"ceil_mode", ceil}}));
  ValueId y = outs[0], idx = outs[1];
  if (storage_order == 1 && h > 1) {
    TRY(wv, c.scalar(DType::Int64, static_cast<double>(w)));
    TRY(hv, c.scalar(DType::Int64, static_cast<double>(h)));
    TRY(row, c.emit("aten.div", {idx, wv}, {{"rounding_mode", std::string("floor")}}));
    TRY(rw, c.emit("aten.mul", {row, wv}));
    TRY(col, c.emit("aten.sub", {idx, rw}));
    TRY(ch2, c.emit("aten.mul", {col, hv}));
    TRY(v, c.emit("aten.add", {ch2, row}));
    idx = v;
  }
  KILN_RETURN_IF_ERROR(c.check_constant_size(static_cast<double>(n) * static_cast<double>(ch), 8, "the plane offsets"));
  std::vector<int64_t> offs(static_cast<size_t>(n * ch));
  for (int64_t p = 0; p < n * ch; ++p) offs[static_cast<size_t>(p)] = p * h * w;
  std::vector<uint8_t> ob(offs.size() * 8);
  if (!ob.empty()) std::memcpy(ob.data(), offs.data(), ob.size());
  TRY(base, c.constant(TensorType{DType::Int64, {n, ch, 1, 1}}, std::move(ob)));
  TRY(full, c.emit("aten.add", {idx, base}));
  idx = full;
  if (xs0.size() == 3) {
    Ints o = c.type(y).sizes;
    TRY(v, view(c, y, {o[0], o[1], o[3]}));
    TRY(vi, view(c, idx, {o[0], o[1], o[3]}));
    y = v, idx = vi;
  }
  if (c.type(y).dtype != in_dt) {
    TRY(v, c.emit("aten._to_copy", {y}, {{"dtype", std::string(dtype_name(in_dt))}}));
    y = v;
  }
  KILN_RETURN_IF_ERROR(c.set_output(0, y));
  return c.set_output(1, idx);
}

Error pool(NodeCtx& c, bool is_max) {
  TRY(x0, c.input(0));
  const Ints xs0 = c.type(x0).sizes;
  if (xs0.size() < 3 || xs0.size() > 5) return c.unsupported("input of rank " + std::to_string(xs0.size()) + " (1-D, 2-D and 3-D pooling only)");
  if (!c.has_attr("kernel_shape")) return c.invalid("missing attribute 'kernel_shape'");
  TRY(kernel, c.attr_ints("kernel_shape", {}));
  if (kernel.size() != xs0.size() - 2) return c.invalid("kernel_shape length differs from the spatial rank");
  TRY(ceil, c.attr_int("ceil_mode", 0));
  TRY(s, spatial_attrs(c, Ints(xs0.begin() + 2, xs0.end()), kernel, is_max));
  int64_t cip = 0;
  int64_t storage_order = 0;
  const bool want_indices = is_max && c.has_output(1);
  if (is_max) {
    TRY(so, c.attr_int("storage_order", 0));
    if (so != 0 && so != 1) return c.invalid("storage_order must be 0 or 1");
    storage_order = so;  // row/column-major order of the Indices output only
    if (want_indices && xs0.size() == 5) return c.unsupported("the Indices output of 3-D pooling");
  } else {
    TRY(v, c.attr_int("count_include_pad", 0));
    cip = v;
  }
  if (xs0.size() == 5) {
    if (ceil) return c.unsupported("ceil_mode = 1 for 3-D pooling");
    return pool3d(c, x0, s, is_max, cip != 0);
  }
  ValueId x = x0;
  const DType in_dt = c.type(x0).dtype;
  if (is_max && (in_dt == DType::UInt8 || in_dt == DType::Int8 || in_dt == DType::Float16)) {
    TRY(v, c.emit("aten._to_copy", {x0}, {{"dtype", std::string("float32")}}));  // exact; converted back below
    x = v;
  }
  const bool one_d = xs0.size() == 3;
  if (one_d) {  // [N, C, L] -> [N, C, 1, L]
    TRY(v, view(c, x, {xs0[0], xs0[1], 1, xs0[2]}));
    x = v;
    s.kernel.insert(s.kernel.begin(), 1);
    s.strides.insert(s.strides.begin(), 1);
    s.dilations.insert(s.dilations.begin(), 1);
    s.pad_begin.insert(s.pad_begin.begin(), 0);
    s.pad_end.insert(s.pad_end.begin(), 0);
  }
  bool asym = false, too_big = false;
  for (size_t i = 0; i < s.kernel.size(); ++i) {
    asym |= s.pad_begin[i] != s.pad_end[i];
    too_big |= s.pad_begin[i] > s.kernel[i] / 2;
  }
  if ((asym || too_big) && ceil) return c.unsupported("asymmetric pads (or pads larger than half the kernel) with ceil_mode = 1");
  if ((asym || too_big) && want_indices) {
    return c.unsupported("the Indices output with asymmetric pads (or pads larger than half the kernel)");
  }
  if (want_indices) return max_pool_with_indices(c, x, xs0, s, ceil != 0, storage_order, in_dt);
  if ((asym || too_big) && !is_max && !cip) {
    // Average over the valid elements only: sum-pool(zero-padded x) / sum-pool(zero-padded ones),
    // both as avg_pool2d without padding (the kernel-area divisors cancel).
    Ints aten;
    for (size_t k = s.kernel.size(); k-- > 0;) {
      aten.push_back(s.pad_begin[k]);
      aten.push_back(s.pad_end[k]);
    }
    const TensorType xt = c.type(x);
    // Before filling the float32 mask: an int8 or float16 input's nbytes would not hold it.
    if (xt.dtype != DType::Float32) return c.unsupported(std::string("dtype ") + dtype_name(xt.dtype));
    KILN_RETURN_IF_ERROR(c.check_constant_size(static_cast<double>(xt.numel()), 4, "the count mask"));
    std::vector<uint8_t> ones(xt.nbytes());
    for (int64_t i = 0; i < xt.numel(); ++i) {
      const float one = 1.0f;
      std::memcpy(ones.data() + static_cast<size_t>(i) * 4, &one, 4);
    }
    TRY(mask, c.constant(xt, std::move(ones)));
    Attributes pa{{"kernel_size", s.kernel}, {"stride", s.strides}, {"padding", Ints(s.kernel.size(), 0)},
                  {"ceil_mode", false}, {"count_include_pad", true}};
    TRY(xp, c.emit("aten.constant_pad_nd", {x}, {{"pad", aten}, {"value", 0.0}}));
    TRY(mp, c.emit("aten.constant_pad_nd", {mask}, {{"pad", aten}, {"value", 0.0}}));
    TRY(num, c.emit("aten.avg_pool2d", {xp}, pa));
    TRY(den, c.emit("aten.avg_pool2d", {mp}, pa));
    TRY(v, c.emit("aten.div", {num, den}));
    ValueId y = v;
    if (one_d) {
      Ints o = c.type(y).sizes;
      TRY(w, view(c, y, {o[0], o[1], o[3]}));
      y = w;
    }
    return c.set_output(0, y);
  }
  if (asym || too_big) {
    // Pad explicitly (-inf for max, 0 for average with count_include_pad) and pool unpadded.
    Spatial s2 = s;
    Ints aten;
    for (size_t k = s2.kernel.size(); k-- > 0;) {
      aten.push_back(s2.pad_begin[k]);
      aten.push_back(s2.pad_end[k]);
    }
    TRY(v, c.emit("aten.constant_pad_nd", {x}, {{"pad", aten}, {"value", is_max ? -std::numeric_limits<double>::infinity() : 0.0}}));
    x = v;
    s = s2;
    std::fill(s.pad_begin.begin(), s.pad_begin.end(), 0);
  }
  ValueId y;
  if (is_max) {
    TRY(v, c.emit("aten.max_pool2d", {x}, {{"kernel_size", s.kernel}, {"stride", s.strides}, {"padding", s.pad_begin},
                                            {"dilation", s.dilations}, {"ceil_mode", ceil != 0}}));
    y = v;
  } else {
    TRY(v, c.emit("aten.avg_pool2d", {x}, {{"kernel_size", s.kernel}, {"stride", s.strides}, {"padding", s.pad_begin},
                                            {"ceil_mode", ceil != 0}, {"count_include_pad", cip != 0}}));
    y = v;
  }
  if (one_d) {
    Ints o = c.type(y).sizes;
    TRY(v, view(c, y, {o[0], o[1], o[3]}));
    y = v;
  }
  if (c.type(y).dtype != in_dt) {
    TRY(v, c.emit("aten._to_copy", {y}, {{"dtype", std::string(dtype_name(in_dt))}}));
    y = v;
  }
  return c.set_output(0, y);
}
Error conv_MaxPool(NodeCtx& c) { return pool(c, true); }
Error conv_AveragePool(NodeCtx& c) { return pool(c, false); }

Error global_pool(NodeCtx& c, bool is_max) {
  TRY(x, c.input(0));
  const int64_t r = c.rank(x);
  if (r < 3) return c.invalid("input must have rank >= 3 (N, C, spatial...)");
  if (!is_max && r == 4) {
    TRY(y, c.emit("aten.adaptive_avg_pool2d", {x}, {{"output_size", Ints{1, 1}}}));
    return c.set_output(0, y);
  }
  Ints dims;
  for (int64_t i = 2; i < r; ++i) dims.push_back(i);
  TRY(y, c.emit(is_max ? "aten.amax" : "aten.mean", {x}, {{"dim", dims}, {"keepdim", true}}));
  return c.set_output(0, y);
}
Error conv_GlobalAveragePool(NodeCtx& c) { return global_pool(c, false); }
Error conv_GlobalMaxPool(NodeCtx& c) { return global_pool(c, true); }

// ---- normalization ----

// BatchNormalization (inference): training_mode (opset 14) must be 0, spatial (opset < 9) must be
// 1; momentum only affects training statistics. Extra outputs (training) are not supported.
Error conv_BatchNormalization(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(scale, c.input(1));
  TRY(bias, c.input(2));
  TRY(mean, c.input(3));
  TRY(var, c.input(4));
  TRY(eps, c.attr_float("epsilon", 1e-5));
  TRY(momentum, c.attr_float("momentum", 0.9));
  (void)momentum;  // running-statistics update rate: training only
  TRY(training, c.attr_int("training_mode", 0));
  TRY(spatial, c.attr_int("spatial", 1));
  if (c.opset() < 7) {  // BatchNormalization-6: is_test = 0 (the default) means training statistics
    TRY(is_test, c.attr_int("is_test", 0));
    if (!is_test) return c.unsupported("attribute 'is_test' = 0 (training)");
  }
  if (training) return c.unsupported("attribute 'training_mode' = 1 (inference only)");
  if (spatial != 1) return c.unsupported("attribute 'spatial' = 0");
  for (int i = 1; i < c.num_outputs(); ++i) {
    if (c.has_output(i)) return c.unsupported("output " + std::to_string(i) + " (training statistics)");
  }
  if (c.rank(x) < 2) return c.invalid("input must have rank >= 2");
  TRY(y, c.emit("aten.native_batch_norm", {x, scale, bias, mean, var},
                {{"training", false}, {"momentum", 0.1}, {"eps", eps}}));
  return c.set_output(0, y);
}

// InstanceNormalization: group norm with one group per channel.
Error conv_InstanceNormalization(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(scale, c.input(1));
  TRY(bias, c.input(2));
  TRY(eps, c.attr_float("epsilon", 1e-5));
  const Ints s = c.type(x).sizes;
  if (s.size() < 3) return c.invalid("input must have rank >= 3");
  int64_t hw = 1;
  for (size_t i = 2; i < s.size(); ++i) hw *= s[i];
  TRY(y, c.emit("aten.native_group_norm", {x, scale, bias},
                {{"N", s[0]}, {"C", s[1]}, {"HxW", hw}, {"group", s[1]}, {"eps", eps}}));
  return c.set_output(0, y);
}

// LayerNormalization (opset 17): normalizes over dims [axis, rank); stash_type 1 (float32
// statistics) is what Kiln computes; Mean / InvStdDev outputs are not supported.
Error conv_LayerNormalization(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(scale, c.input(1));
  TRY(bias, c.opt_input(2));
  TRY(axis_raw, c.attr_int("axis", -1));
  TRY(eps, c.attr_float("epsilon", 1e-5));
  TRY(stash, c.attr_int("stash_type", 1));
  if (stash != 1) return c.unsupported("attribute 'stash_type' = " + std::to_string(stash));
  const Ints s = c.type(x).sizes;
  TRY(axis, wrap_axis(c, axis_raw, static_cast<int64_t>(s.size()), "axis"));
  Ints norm(s.begin() + axis, s.end());
  // Scale/B broadcast to the normalized shape in ONNX; aten wants them exactly that shape.
  auto fit = [&](ValueId v) -> Result<ValueId> {
    if (v == kNoValue || c.type(v).sizes == norm) return v;
    return c.emit("aten.expand", {v}, {{"size", norm}});
  };
  TRY(sc, fit(scale));
  TRY(bi, fit(bias));
  TRY(y, c.emit("aten.native_layer_norm", {x, sc, bi}, {{"normalized_shape", norm}, {"eps", eps}}));
  KILN_RETURN_IF_ERROR(c.set_output(0, y));
  if (c.has_output(1) || c.has_output(2)) {  // Mean and InvStdDev = 1 / sqrt(var + eps), dims >= axis kept as 1
    Ints dims;
    for (int64_t i = axis; i < static_cast<int64_t>(s.size()); ++i) dims.push_back(i);
    TRY(mean, c.emit("aten.mean", {x}, {{"dim", dims}, {"keepdim", true}}));
    KILN_RETURN_IF_ERROR(c.set_output(1, mean));
    if (c.has_output(2)) {
      TRY(d, c.emit("aten.sub", {x, mean}));
      TRY(d2, c.emit("aten.mul", {d, d}));
      TRY(var, c.emit("aten.mean", {d2}, {{"dim", dims}, {"keepdim", true}}));
      TRY(e, c.scalar(c.type(var).dtype, eps));
      TRY(ve, c.emit("aten.add", {var, e}));
      TRY(inv, c.emit("aten.rsqrt", {ve}));
      KILN_RETURN_IF_ERROR(c.set_output(2, inv));
    }
  }
  return {};
}


// ---- more elementwise decompositions ----

Result<ValueId> floor_of(NodeCtx& c, ValueId x) {
  TRY(one, scalar_for(c, x, 1.0));
  return c.emit("aten.div", {x, one}, {{"rounding_mode", std::string("floor")}});
}

Error float_only(NodeCtx& c, ValueId x) {
  if (c.type(x).dtype != DType::Float32) return c.unsupported(std::string("dtype ") + dtype_name(c.type(x).dtype) + " (float32 only)");
  return {};
}

// Floor: floor division by 1 (aten.div rounding_mode="floor"); Ceil: -floor(-x).
Error conv_Floor(NodeCtx& c) {
  TRY(x, c.input(0));
  KILN_RETURN_IF_ERROR(float_only(c, x));
  TRY(y, floor_of(c, x));
  return c.set_output(0, y);
}
Error conv_Ceil(NodeCtx& c) {
  TRY(x, c.input(0));
  KILN_RETURN_IF_ERROR(float_only(c, x));
  TRY(n, c.emit("aten.neg", {x}));
  TRY(f, floor_of(c, n));
  TRY(y, c.emit("aten.neg", {f}));
  return c.set_output(0, y);
}

// Round half to even: r = floor(x), f = x - r (exact); r + (f > 0.5 or (f == 0.5 and r odd)).
Result<ValueId> round_half_even(NodeCtx& c, ValueId x) {
  TRY(r, floor_of(c, x));
  TRY(f, c.emit("aten.sub", {x, r}));
  TRY(half, scalar_for(c, x, 0.5));
  TRY(two, scalar_for(c, x, 2.0));
  TRY(gt, c.emit("aten.gt", {f, half}));
  TRY(eq, c.emit("aten.eq", {f, half}));
  TRY(r2, c.emit("aten.div", {r, two}, {{"rounding_mode", std::string("floor")}}));
  TRY(r2x, c.emit("aten.mul", {r2, two}));
  TRY(odd, c.emit("aten.ne", {r2x, r}));
  TRY(tie, c.emit("aten.logical_and", {eq, odd}));
  TRY(up, c.emit("aten.logical_or", {gt, tie}));
  TRY(upf, c.emit("aten._to_copy", {up}, {{"dtype", std::string(dtype_name(c.type(x).dtype))}}));
  return c.emit("aten.add", {r, upf});
}
Error conv_Round(NodeCtx& c) {
  TRY(x, c.input(0));
  KILN_RETURN_IF_ERROR(float_only(c, x));
  TRY(y, round_half_even(c, x));
  return c.set_output(0, y);
}

// Sign: (x > 0) - (x < 0) in x's type.
Error conv_Sign(NodeCtx& c) {
  TRY(x, c.input(0));
  const DType dt = c.type(x).dtype;
  if (dt == DType::Bool || dt == DType::Float16 || dt == DType::BFloat16) return c.unsupported(std::string("dtype ") + dtype_name(dt));
  TRY(zero, scalar_for(c, x, 0));
  TRY(one, scalar_for(c, x, 1));
  TRY(m1, scalar_for(c, x, -1));
  TRY(pos, c.emit("aten.gt", {x, zero}));
  TRY(neg, c.emit("aten.lt", {x, zero}));
  TRY(a, c.emit("aten.where", {neg, m1, zero}));
  TRY(y, c.emit("aten.where", {pos, one, a}));
  return c.set_output(0, y);
}

// Mod: fmod = 1: x - y * trunc(x / y) (C fmod, sign of x); fmod = 0 (integers): x - y * floor(x / y)
// (sign of the divisor, Python %).
Error conv_Mod(NodeCtx& c) {
  TRY(a, c.input(0));
  TRY(b, c.input(1));
  KILN_RETURN_IF_ERROR(check_same_dtype(c, a, b));
  TRY(fmod, c.attr_int("fmod", 0));
  const DType dt = c.type(a).dtype;
  if (is_floating(dt) && !fmod) return c.invalid("fmod must be 1 for floating-point inputs");
  if (dt == DType::Bool || dt == DType::BFloat16) return c.unsupported(std::string("dtype ") + dtype_name(dt));
  // int8/uint8 compute in int32, float16 in float32 (exact for these ops), then convert back.
  const DType ct = dt == DType::Int8 || dt == DType::UInt8 ? DType::Int32 : dt == DType::Float16 ? DType::Float32 : dt;
  ValueId ac = a, bc = b;
  if (ct != dt) {
    TRY(va, c.emit("aten._to_copy", {a}, {{"dtype", std::string(dtype_name(ct))}}));
    TRY(vb, c.emit("aten._to_copy", {b}, {{"dtype", std::string(dtype_name(ct))}}));
    ac = va, bc = vb;
  }
  TRY(q, c.emit("aten.div", {ac, bc}, {{"rounding_mode", std::string(fmod ? "trunc" : "floor")}}));
  TRY(m, c.emit("aten.mul", {q, bc}));
  TRY(y0, c.emit("aten.sub", {ac, m}));
  ValueId y = y0;
  if (ct != dt) {
    TRY(v, c.emit("aten._to_copy", {y0}, {{"dtype", std::string(dtype_name(dt))}}));
    y = v;
  }
  return c.set_output(0, y);
}

// float16 / bfloat16 inputs of IsNaN / IsInf are widened to float32 first (exact).
Result<ValueId> widen_half(NodeCtx& c, ValueId x) {
  const DType dt = c.type(x).dtype;
  if (dt != DType::Float16 && dt != DType::BFloat16) return x;
  return c.emit("aten._to_copy", {x}, {{"dtype", std::string("float32")}});
}
Error conv_IsNaN(NodeCtx& c) {
  TRY(x0, c.input(0));
  TRY(x, widen_half(c, x0));
  TRY(y, c.emit("aten.ne", {x, x}));
  return c.set_output(0, y);
}

Error conv_IsInf(NodeCtx& c) {
  TRY(x0, c.input(0));
  TRY(x, widen_half(c, x0));
  TRY(pos, c.attr_int("detect_positive", 1));
  TRY(neg, c.attr_int("detect_negative", 1));
  KILN_RETURN_IF_ERROR(float_only(c, x));
  const double inf = std::numeric_limits<double>::infinity();
  TRY(pi, scalar_for(c, x, inf));
  TRY(ni, scalar_for(c, x, -inf));
  TRY(ep, c.emit("aten.eq", {x, pi}));
  TRY(en, c.emit("aten.eq", {x, ni}));
  ValueId y;
  if (pos && neg) {
    TRY(v, c.emit("aten.logical_or", {ep, en}));
    y = v;
  } else if (pos) {
    y = ep;
  } else if (neg) {
    y = en;
  } else {
    TRY(v, c.emit("aten.logical_and", {ep, en}));  // all false
    y = v;
  }
  return c.set_output(0, y);
}

// Tan = sin / cos; Sinh, Cosh from exp; Asinh, Acosh, Atanh from log (their textbook forms).
Error conv_Tan(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(s0, c.emit("aten.sin", {x}));
  TRY(c0, c.emit("aten.cos", {x}));
  TRY(y, c.emit("aten.div", {s0, c0}));
  return c.set_output(0, y);
}
Error sinh_cosh(NodeCtx& c, bool is_sinh) {
  TRY(x, c.input(0));
  KILN_RETURN_IF_ERROR(float_only(c, x));
  TRY(e, c.emit("aten.exp", {x}));
  TRY(n, c.emit("aten.neg", {x}));
  TRY(en, c.emit("aten.exp", {n}));
  TRY(s0, c.emit(is_sinh ? "aten.sub" : "aten.add", {e, en}));
  TRY(two, scalar_for(c, x, 2.0));
  TRY(y, c.emit("aten.div", {s0, two}));
  return c.set_output(0, y);
}
Error conv_Sinh(NodeCtx& c) { return sinh_cosh(c, true); }
Error conv_Cosh(NodeCtx& c) { return sinh_cosh(c, false); }
Error conv_Asinh(NodeCtx& c) {  // log(x + sqrt(x^2 + 1))
  TRY(x, c.input(0));
  KILN_RETURN_IF_ERROR(float_only(c, x));
  TRY(one, scalar_for(c, x, 1.0));
  TRY(x2, c.emit("aten.mul", {x, x}));
  TRY(a, c.emit("aten.add", {x2, one}));
  TRY(r, c.emit("aten.sqrt", {a}));
  TRY(s0, c.emit("aten.add", {x, r}));
  TRY(y, c.emit("aten.log", {s0}));
  return c.set_output(0, y);
}
Error conv_Acosh(NodeCtx& c) {  // log(x + sqrt(x^2 - 1))
  TRY(x, c.input(0));
  KILN_RETURN_IF_ERROR(float_only(c, x));
  TRY(one, scalar_for(c, x, 1.0));
  TRY(x2, c.emit("aten.mul", {x, x}));
  TRY(a, c.emit("aten.sub", {x2, one}));
  TRY(r, c.emit("aten.sqrt", {a}));
  TRY(s0, c.emit("aten.add", {x, r}));
  TRY(y, c.emit("aten.log", {s0}));
  return c.set_output(0, y);
}
Error conv_Atanh(NodeCtx& c) {  // 0.5 * log((1 + x) / (1 - x))
  TRY(x, c.input(0));
  KILN_RETURN_IF_ERROR(float_only(c, x));
  TRY(one, scalar_for(c, x, 1.0));
  TRY(half, scalar_for(c, x, 0.5));
  TRY(p, c.emit("aten.add", {one, x}));
  TRY(m, c.emit("aten.sub", {one, x}));
  TRY(q, c.emit("aten.div", {p, m}));
  TRY(l, c.emit("aten.log", {q}));
  TRY(y, c.emit("aten.mul", {l, half}));
  return c.set_output(0, y);
}

// Mish: x * tanh(softplus(x)) = x * tanh(log(1 + exp(x))).
Error conv_Mish(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(one, scalar_for(c, x, 1.0));
  TRY(e, c.emit("aten.exp", {x}));
  TRY(s0, c.emit("aten.add", {e, one}));
  TRY(sp, c.emit("aten.log", {s0}));
  TRY(t, c.emit("aten.tanh", {sp}));
  TRY(y, c.emit("aten.mul", {x, t}));
  return c.set_output(0, y);
}

// Shrink: x < -lambd ? x + bias : x > lambd ? x - bias : 0.
Error conv_Shrink(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(lambd, c.attr_float("lambd", 0.5));
  TRY(bias, c.attr_float("bias", 0.0));
  const DType dt = c.type(x).dtype;
  if (dt != DType::Float32 && dt != DType::Int64 && dt != DType::Int32) return c.unsupported(std::string("dtype ") + dtype_name(dt));
  TRY(l, scalar_for(c, x, lambd));
  TRY(nl, scalar_for(c, x, -lambd));
  TRY(bv, scalar_for(c, x, bias));
  TRY(zero, scalar_for(c, x, 0));
  TRY(lo, c.emit("aten.lt", {x, nl}));
  TRY(hi, c.emit("aten.gt", {x, l}));
  TRY(xp, c.emit("aten.add", {x, bv}));
  TRY(xm, c.emit("aten.sub", {x, bv}));
  TRY(a, c.emit("aten.where", {hi, xm, zero}));
  TRY(y, c.emit("aten.where", {lo, xp, a}));
  return c.set_output(0, y);
}

// CastLike: Cast to the element type of input 1.
Error conv_CastLike(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(like, c.input(1));
  if (c.has_attr("saturate")) {
    TRY(sat, c.attr_int("saturate", 1));  // opset 19 (float8 only)
    (void)sat;
  }
  TRY(y, c.emit("aten._to_copy", {x}, {{"dtype", std::string(dtype_name(c.type(like).dtype))}}));
  return c.set_output(0, y);
}

// ---- index-based ops ----

// ArgMin: argmax(-x) (first index of the minimum); select_last_index as for ArgMax.
Error conv_ArgMin(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(axis_raw, c.attr_int("axis", 0));
  TRY(keep, c.attr_int("keepdims", 1));
  TRY(last, c.attr_int("select_last_index", 0));
  TRY(axis, wrap_axis(c, axis_raw, c.rank(x), "axis"));
  KILN_RETURN_IF_ERROR(float_only(c, x));
  TRY(n0, c.emit("aten.neg", {x}));
  ValueId nx = n0;
  const int64_t n = c.type(x).sizes[static_cast<size_t>(axis)];
  if (last) {
    Ints rev(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) rev[static_cast<size_t>(i)] = n - 1 - i;
    TRY(ri, c.int64_vector(rev));
    TRY(g, gather(c, n0, ri, axis));
    nx = g;
  }
  TRY(am, c.emit("aten.argmax", {nx}, {{"dim", axis}, {"keepdim", keep != 0}}));
  ValueId y = am;
  if (last) {
    TRY(top, c.scalar(DType::Int64, static_cast<double>(n - 1)));
    TRY(v, c.emit("aten.sub", {top, am}));
    y = v;
  }
  return c.set_output(0, y);
}

// A constant int64 tensor [1, .., n, .., 1] (rank r, n at `axis`) holding 0 .. n-1.
Result<ValueId> iota_along(NodeCtx& c, int64_t n, int64_t axis, int64_t r) {
  Ints v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), int64_t{0});
  TRY(iv, c.int64_vector(v));
  Ints shape(static_cast<size_t>(r), 1);
  shape[static_cast<size_t>(axis)] = n;
  return view(c, iv, shape);
}

// Hardmax: 1 at the first maximum along `axis` (opset 13: default -1; before: the input coerced to
// 2-D at axis, default 1), 0 elsewhere.
Error conv_Hardmax(NodeCtx& c) {
  TRY(x0, c.input(0));
  KILN_RETURN_IF_ERROR(float_only(c, x0));
  const Ints s = c.type(x0).sizes;
  const int64_t r = static_cast<int64_t>(s.size());
  TRY(axis_raw, c.attr_int("axis", c.opset() >= 13 ? -1 : 1));
  TRY(axis0, wrap_axis(c, axis_raw, r, "axis"));
  ValueId x = x0;
  int64_t axis = axis0, rank = r;
  if (c.opset() < 13) {
    int64_t a = 1, b = 1;
    for (int64_t i = 0; i < r; ++i) (i < axis0 ? a : b) *= s[static_cast<size_t>(i)];
    TRY(v, view(c, x0, {a, b}));
    x = v, axis = 1, rank = 2;
  }
  const int64_t n = c.type(x).sizes[static_cast<size_t>(axis)];
  TRY(am, c.emit("aten.argmax", {x}, {{"dim", axis}, {"keepdim", true}}));
  TRY(io, iota_along(c, n, axis, rank));
  TRY(eq, c.emit("aten.eq", {io, am}));
  TRY(y0, c.emit("aten._to_copy", {eq}, {{"dtype", std::string("float32")}}));
  TRY(y, view(c, y0, s));
  return c.set_output(0, y);
}

// OneHot(indices, depth, values=[off, on]): out[..., k, ...] = (indices == k) ? on : off, with k
// inserted at `axis` (default -1); negative indices count from depth.
Error conv_OneHot(NodeCtx& c) {
  TRY(idx, c.input(0));
  TRY(dv, c.input(1));
  TRY(vals, c.input(2));
  TRY(axis_raw, c.attr_int("axis", -1));
  TRY(depth_v, c.const_floats(dv, "depth"));
  if (depth_v.size() != 1 || !(depth_v[0] >= 1) || depth_v[0] > (1 << 24)) return c.invalid("depth must be a positive scalar");
  const int64_t depth = static_cast<int64_t>(depth_v[0]);
  if (c.type(vals).numel() != 2) return c.invalid("values must hold [off_value, on_value]");
  const int64_t r = c.rank(idx) + 1;
  TRY(axis, wrap_axis(c, axis_raw, r, "axis"));
  ValueId ix = idx;
  if (c.type(idx).dtype != DType::Int64) {
    TRY(v, c.emit("aten._to_copy", {idx}, {{"dtype", std::string("int64")}}));
    ix = v;
  }
  TRY(zero, c.scalar(DType::Int64, 0));
  TRY(dep, c.scalar(DType::Int64, static_cast<double>(depth)));
  TRY(neg, c.emit("aten.lt", {ix, zero}));
  TRY(sh, c.emit("aten.add", {ix, dep}));
  TRY(w, c.emit("aten.where", {neg, sh, ix}));
  Ints us = c.type(idx).sizes;
  us.insert(us.begin() + axis, 1);
  TRY(u, view(c, w, us));
  TRY(io, iota_along(c, depth, axis, r));
  TRY(eq, c.emit("aten.eq", {u, io}));
  TRY(off, c.emit("aten.select", {vals}, {{"dim", int64_t{0}}, {"index", int64_t{0}}}));
  TRY(on, c.emit("aten.select", {vals}, {{"dim", int64_t{0}}, {"index", int64_t{1}}}));
  TRY(y, c.emit("aten.where", {eq, on, off}));
  return c.set_output(0, y);
}

// EyeLike: a constant of the input's 2-D shape with ones on diagonal k; dtype attribute or the input's.
Error conv_EyeLike(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(k, c.attr_int("k", 0));
  DType dt = c.type(x).dtype;
  if (c.has_attr("dtype")) {
    TRY(t, c.attr_int("dtype", 1));
    auto d = kiln_dtype(static_cast<int>(t));
    if (!d.ok()) return c.unsupported("attribute 'dtype': " + d.error().message());
    dt = *d;
  }
  const Ints s = c.type(x).sizes;
  if (s.size() != 2) return c.invalid("input must be 2-D");
  KILN_RETURN_IF_ERROR(c.check_constant_size(static_cast<double>(s[0]) * static_cast<double>(s[1]),
                                             static_cast<double>(dtype_size(dt)), "the output"));
  std::vector<uint8_t> bytes(static_cast<size_t>(s[0] * s[1]) * dtype_size(dt), 0);
  TRY(one, c.scalar(dt, 1));
  const auto& ob = *c.im.graph.value(one).constant;
  for (int64_t i = 0; i < s[0]; ++i) {
    const int64_t j = i + k;
    if (j >= 0 && j < s[1]) std::memcpy(bytes.data() + static_cast<size_t>(i * s[1] + j) * dtype_size(dt), ob.data(), dtype_size(dt));
  }
  TRY(y, c.constant(TensorType{dt, s}, std::move(bytes)));
  return c.set_output(0, y);
}

// Trilu: keeps the upper (upper = 1: j - i >= k) or lower (j - i <= k) triangle of the last two dims.
Error conv_Trilu(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(upper, c.attr_int("upper", 1));
  int64_t k = 0;
  if (c.has_input(1)) {
    TRY(kv, c.input(1));
    TRY(kk, c.const_ints(kv, "k"));
    if (kk.size() != 1) return c.invalid("k must be a scalar");
    k = kk[0];
  }
  const Ints s = c.type(x).sizes;
  if (s.size() < 2) return c.invalid("input must have rank >= 2");
  const int64_t n = s[s.size() - 2], m = s[s.size() - 1];
  KILN_RETURN_IF_ERROR(c.check_constant_size(static_cast<double>(n) * static_cast<double>(m), 1, "the triangle mask"));
  std::vector<uint8_t> mask(static_cast<size_t>(n * m));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < m; ++j) mask[static_cast<size_t>(i * m + j)] = upper ? (j - i >= k) : (j - i <= k);
  }
  TRY(mv, c.constant(TensorType{DType::Bool, {n, m}}, std::move(mask)));
  TRY(zero, c.scalar(c.type(x).dtype, 0));
  TRY(y, c.emit("aten.where", {mv, x, zero}));
  return c.set_output(0, y);
}

// Reverses x along `axis` as an embedding lookup: x with axis moved first, viewed [n, rest], rows
// gathered in the order n-1 .. 0.
Result<ValueId> flip_axis(NodeCtx& c, ValueId x, int64_t axis) {
  const Ints s = c.type(x).sizes;
  const int64_t n = s[static_cast<size_t>(axis)];
  ValueId xt = x;
  if (axis != 0) {
    TRY(v, c.emit("aten.transpose", {x}, {{"dim0", int64_t{0}}, {"dim1", axis}}));
    xt = v;
  }
  const Ints ts = c.type(xt).sizes;
  TRY(x2, view(c, xt, {n, numel_of(ts) / std::max<int64_t>(n, 1)}));
  Ints rev(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) rev[static_cast<size_t>(i)] = n - 1 - i;
  TRY(iv, c.int64_vector(rev));
  TRY(e, c.emit("aten.embedding", {x2, iv}));
  TRY(y, view(c, e, ts));
  if (axis == 0) return y;
  return c.emit("aten.transpose", {y}, {{"dim0", int64_t{0}}, {"dim1", axis}});
}

// CumSum along a constant axis: aten.cumsum (float32/float64 sums accumulate in double, integer
// ones wrap in int64, then convert back to int32); reverse = flip, cumsum, flip; exclusive shifts
// the running sum by one along the axis (a zero slice, then all but the last sum), so it is exact.
Error conv_CumSum(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(av, c.input(1));
  TRY(exclusive, c.attr_int("exclusive", 0));
  TRY(reverse, c.attr_int("reverse", 0));
  TRY(ax, c.const_ints(av, "axis"));
  if (ax.size() != 1) return c.invalid("axis must be a scalar");
  const int64_t r = c.rank(x);
  if (r == 0) return c.invalid("input must have rank >= 1");
  TRY(axis, wrap_axis(c, ax[0], r, "axis"));
  const DType dt = c.type(x).dtype;
  if (dt != DType::Float32 && dt != DType::Float64 && dt != DType::Int32 && dt != DType::Int64) {
    return c.unsupported(std::string("dtype ") + dtype_name(dt));
  }
  const int64_t n = c.type(x).sizes[static_cast<size_t>(axis)];
  ValueId in = x;
  if (reverse && n > 1) {
    TRY(v, flip_axis(c, x, axis));
    in = v;
  }
  TRY(cs, c.emit("aten.cumsum", {in}, {{"dim", axis}}));
  ValueId y = cs;
  if (c.type(y).dtype != dt) {
    TRY(v, c.emit("aten._to_copy", {y}, {{"dtype", std::string(dtype_name(dt))}}));
    y = v;
  }
  if (exclusive && n > 0) {
    Ints zs = c.type(x).sizes;
    zs[static_cast<size_t>(axis)] = 1;
    TRY(zero, c.constant(TensorType{dt, zs}, std::vector<uint8_t>(static_cast<size_t>(numel_of(zs)) * dtype_size(dt), 0)));
    ValueId parts_y = zero;
    if (n > 1) {
      TRY(head, c.emit("aten.slice", {y}, {{"dim", axis}, {"start", int64_t{0}}, {"end", n - 1}, {"step", int64_t{1}}}));
      TRY(v, c.emit("aten.cat", {zero, head}, {{"dim", axis}}));
      parts_y = v;
    }
    y = parts_y;
  }
  if (reverse && n > 1) {
    TRY(v, flip_axis(c, y, axis));
    y = v;
  }
  return c.set_output(0, y);
}

// GatherElements: out[i...] = data[i with i[axis] = indices[i...]]: an embedding lookup into the
// flattened data at linear index base(i) + (indices[i] wrapped) * stride(axis).
Error conv_GatherElements(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(idx0, c.input(1));
  TRY(axis_raw, c.attr_int("axis", 0));
  const Ints ds = c.type(x).sizes, is = c.type(idx0).sizes;
  const int64_t r = static_cast<int64_t>(ds.size());
  TRY(axis, wrap_axis(c, axis_raw, r, "axis"));
  if (static_cast<int64_t>(is.size()) != r) return c.invalid("indices must have the data's rank");
  for (int64_t d = 0; d < r; ++d) {
    if (d != axis && is[static_cast<size_t>(d)] > ds[static_cast<size_t>(d)]) return c.invalid("indices larger than data");
  }
  Ints stride(static_cast<size_t>(r), 1);
  for (int64_t d = r - 2; d >= 0; --d) stride[static_cast<size_t>(d)] = stride[static_cast<size_t>(d + 1)] * ds[static_cast<size_t>(d + 1)];
  const int64_t n = numel_of(is);
  KILN_RETURN_IF_ERROR(c.check_constant_size(static_cast<double>(n), 8, "the index table"));
  std::vector<int64_t> base(static_cast<size_t>(n));
  for (int64_t flat = 0; flat < n; ++flat) {
    int64_t rem = flat, off = 0;
    for (int64_t d = r - 1; d >= 0; --d) {
      const int64_t coord = rem % is[static_cast<size_t>(d)];
      rem /= is[static_cast<size_t>(d)];
      if (d != axis) off += coord * stride[static_cast<size_t>(d)];
    }
    base[static_cast<size_t>(flat)] = off;
  }
  ValueId idx = idx0;
  if (c.type(idx0).dtype != DType::Int64) {
    TRY(v, c.emit("aten._to_copy", {idx0}, {{"dtype", std::string("int64")}}));
    idx = v;
  }
  const int64_t dim = ds[static_cast<size_t>(axis)];
  TRY(zero, c.scalar(DType::Int64, 0));
  TRY(dv, c.scalar(DType::Int64, static_cast<double>(dim)));
  TRY(neg, c.emit("aten.lt", {idx, zero}));
  TRY(sh, c.emit("aten.add", {idx, dv}));
  TRY(w, c.emit("aten.where", {neg, sh, idx}));
  TRY(st, c.scalar(DType::Int64, static_cast<double>(stride[static_cast<size_t>(axis)])));
  TRY(ws, c.emit("aten.mul", {w, st}));
  std::vector<uint8_t> bb(base.size() * 8);
  if (!base.empty()) std::memcpy(bb.data(), base.data(), bb.size());
  TRY(bv, c.constant(TensorType{DType::Int64, is}, std::move(bb)));
  TRY(lin0, c.emit("aten.add", {ws, bv}));
  // An index outside [-dim, dim) would read a neighbouring element of the flat table: give it the
  // index numel (out of the table) so aten.embedding fails with InvalidArgument.
  TRY(lo, c.emit("aten.lt", {w, zero}));
  TRY(hi, c.emit("aten.ge", {w, dv}));
  TRY(bad, c.emit("aten.logical_or", {lo, hi}));
  TRY(beyond, c.scalar(DType::Int64, static_cast<double>(numel_of(ds))));
  TRY(lin, c.emit("aten.where", {bad, beyond, lin0}));
  TRY(flat, view(c, x, {numel_of(ds), 1}));
  TRY(e, c.emit("aten.embedding", {flat, lin}));
  TRY(y, view(c, e, is));
  return c.set_output(0, y);
}

// GatherND: out[b..., i..., rest] = data[b..., indices[b..., i..., :], rest] as an embedding lookup
// into data viewed [prod(data.shape[:batch_dims + k]), rest] at the linear index
// batch_offset(b) + sum_j indices[..., j] * stride_j (strides over data.shape[batch_dims:batch_dims + k];
// batch_offset is a constant: the flat batch index times prod(data.shape[batch_dims:batch_dims + k])).
Error conv_GatherND(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(idx0, c.input(1));
  TRY(bd, c.attr_int("batch_dims", 0));
  const Ints ds = c.type(x).sizes, is = c.type(idx0).sizes;
  if (is.empty()) return c.invalid("indices must have rank >= 1");
  const int64_t rd = static_cast<int64_t>(ds.size()), ri = static_cast<int64_t>(is.size());
  if (bd < 0 || bd >= std::min(rd, ri)) return c.invalid("batch_dims must be in [0, min(data rank, indices rank))");
  for (int64_t d = 0; d < bd; ++d) {
    if (ds[static_cast<size_t>(d)] != is[static_cast<size_t>(d)]) return c.invalid("the first batch_dims dims of data and indices must be equal");
  }
  const int64_t k = is.back();
  if (k < 1 || k > rd - bd) return c.invalid("indices' last dim must be in [1, data rank - batch_dims]");
  Ints stride(static_cast<size_t>(k), 1);
  for (int64_t j = k - 2; j >= 0; --j) stride[static_cast<size_t>(j)] = stride[static_cast<size_t>(j + 1)] * ds[static_cast<size_t>(bd + j + 1)];
  int64_t lead = 1, rest = 1, batch = 1, block = 1;
  for (int64_t j = 0; j < rd; ++j) (j < bd + k ? lead : rest) *= ds[static_cast<size_t>(j)];
  for (int64_t j = 0; j < bd; ++j) batch *= ds[static_cast<size_t>(j)];
  for (int64_t j = bd; j < bd + k; ++j) block *= ds[static_cast<size_t>(j)];
  ValueId idx = idx0;
  if (c.type(idx0).dtype != DType::Int64) {
    TRY(v, c.emit("aten._to_copy", {idx0}, {{"dtype", std::string("int64")}}));
    idx = v;
  }
  // An index component outside [-dim, dim) would land in a neighbouring row or batch of the flat
  // table: such positions get the linear index `lead` (out of the table), so aten.embedding fails
  // with InvalidArgument instead of reading a wrong element.
  ValueId lin = kNoValue, bad = kNoValue;
  for (int64_t j = 0; j < k; ++j) {
    TRY(sel, c.emit("aten.select", {idx}, {{"dim", int64_t{-1}}, {"index", j}}));
    TRY(zero, c.scalar(DType::Int64, 0));
    TRY(dv, c.scalar(DType::Int64, static_cast<double>(ds[static_cast<size_t>(bd + j)])));
    TRY(neg, c.emit("aten.lt", {sel, zero}));
    TRY(sh, c.emit("aten.add", {sel, dv}));
    TRY(w, c.emit("aten.where", {neg, sh, sel}));
    TRY(lo, c.emit("aten.lt", {w, zero}));
    TRY(hi, c.emit("aten.ge", {w, dv}));
    TRY(oob, c.emit("aten.logical_or", {lo, hi}));
    if (bad == kNoValue) {
      bad = oob;
    } else {
      TRY(o, c.emit("aten.logical_or", {bad, oob}));
      bad = o;
    }
    TRY(st, c.scalar(DType::Int64, static_cast<double>(stride[static_cast<size_t>(j)])));
    TRY(term, c.emit("aten.mul", {w, st}));
    if (lin == kNoValue) {
      lin = term;
    } else {
      TRY(a, c.emit("aten.add", {lin, term}));
      lin = a;
    }
  }
  if (bd > 0) {
    Ints bs(is.begin(), is.begin() + bd);
    bs.resize(static_cast<size_t>(ri - 1), 1);  // broadcasts over the non-batch index dims
    std::vector<int64_t> offs(static_cast<size_t>(batch));
    for (int64_t b = 0; b < batch; ++b) offs[static_cast<size_t>(b)] = b * block;
    std::vector<uint8_t> ob(offs.size() * 8);
    std::memcpy(ob.data(), offs.data(), ob.size());
    TRY(bo, c.constant(TensorType{DType::Int64, bs}, std::move(ob)));
    TRY(a, c.emit("aten.add", {lin, bo}));
    lin = a;
  }
  TRY(beyond, c.scalar(DType::Int64, static_cast<double>(lead)));
  TRY(checked, c.emit("aten.where", {bad, beyond, lin}));
  lin = checked;
  TRY(d2, view(c, x, {lead, rest}));
  TRY(e, c.emit("aten.embedding", {d2, lin}));
  Ints out(is.begin(), is.end() - 1);
  out.insert(out.end(), ds.begin() + bd + k, ds.end());
  TRY(y, view(c, e, out));
  return c.set_output(0, y);
}

// ---- normalizations ----

// LpNormalization: x / ||x||_p along axis (p = 1 or 2).
Error conv_LpNormalization(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(axis_raw, c.attr_int("axis", -1));
  TRY(p, c.attr_int("p", 2));
  if (p != 1 && p != 2) return c.invalid("p must be 1 or 2");
  KILN_RETURN_IF_ERROR(float_only(c, x));
  TRY(axis, wrap_axis(c, axis_raw, c.rank(x), "axis"));
  ValueId t;
  if (p == 2) {
    TRY(v, c.emit("aten.mul", {x, x}));
    t = v;
  } else {
    TRY(v, c.emit("aten.abs", {x}));
    t = v;
  }
  TRY(sm, c.emit("aten.sum", {t}, {{"dim", Ints{axis}}, {"keepdim", true}}));
  ValueId norm = sm;
  if (p == 2) {
    TRY(v, c.emit("aten.sqrt", {sm}));
    norm = v;
  }
  TRY(q, c.emit("aten.div", {x, norm}));
  // A zero norm gives 0, not 0/0 (the onnx reference's LpNormalization, whose opset-22 test data
  // covers it).
  TRY(zero, scalar_for(c, norm, 0.0));
  TRY(isz, c.emit("aten.eq", {norm, zero}));
  TRY(zq, scalar_for(c, q, 0.0));
  TRY(y, c.emit("aten.where", {isz, zq, q}));
  return c.set_output(0, y);
}

// MeanVarianceNormalization (its ONNX function body): (X - E[X]) / (sqrt(E[X^2] - E[X]^2) + 1e-9)
// over `axes` (default [0, 2, 3]).
Error conv_MeanVarianceNormalization(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(axes, c.attr_ints("axes", {0, 2, 3}));
  KILN_RETURN_IF_ERROR(float_only(c, x));
  Ints dims;
  for (int64_t a : axes) {
    TRY(w, wrap_axis(c, a, c.rank(x), "axis"));
    dims.push_back(w);
  }
  TRY(ex, c.emit("aten.mean", {x}, {{"dim", dims}, {"keepdim", true}}));
  TRY(x2, c.emit("aten.mul", {x, x}));
  TRY(ex2, c.emit("aten.mean", {x2}, {{"dim", dims}, {"keepdim", true}}));
  TRY(exsq, c.emit("aten.mul", {ex, ex}));
  TRY(var, c.emit("aten.sub", {ex2, exsq}));
  TRY(sd, c.emit("aten.sqrt", {var}));
  TRY(eps, scalar_for(c, x, 1e-9));
  TRY(sde, c.emit("aten.add", {sd, eps}));
  TRY(d, c.emit("aten.sub", {x, ex}));
  TRY(y, c.emit("aten.div", {d, sde}));
  return c.set_output(0, y);
}

// LRN: x / (bias + alpha / size * sum of x^2 over the channel window [c - floor((size-1)/2),
// c + ceil((size-1)/2)])^beta; the window sum is an avg_pool2d over channels times size.
Error conv_LRN(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(alpha, c.attr_float("alpha", 1e-4));
  TRY(beta, c.attr_float("beta", 0.75));
  TRY(bias, c.attr_float("bias", 1.0));
  TRY(size, c.attr_int("size", 0));
  KILN_RETURN_IF_ERROR(float_only(c, x));
  const Ints s = c.type(x).sizes;
  if (s.size() < 3 || size < 1) return c.invalid("needs rank >= 3 and size >= 1");
  int64_t rest = 1;
  for (size_t i = 2; i < s.size(); ++i) rest *= s[i];
  TRY(sq, c.emit("aten.mul", {x, x}));
  TRY(v4, view(c, sq, {s[0], 1, s[1], rest}));
  const int64_t before = (size - 1) / 2, after = size - 1 - before;
  TRY(pd, c.emit("aten.constant_pad_nd", {v4}, {{"pad", Ints{0, 0, before, after}}, {"value", 0.0}}));
  TRY(av, c.emit("aten.avg_pool2d", {pd}, {{"kernel_size", Ints{size, 1}}, {"stride", Ints{1, 1}},
                                             {"padding", Ints{0, 0}}, {"ceil_mode", false}, {"count_include_pad", true}}));
  TRY(sum4, view(c, av, s));  // mean over the window = sum / size
  TRY(a, scalar_for(c, x, alpha));
  TRY(b, scalar_for(c, x, bias));
  TRY(be, scalar_for(c, x, beta));
  TRY(m, c.emit("aten.mul", {sum4, a}));
  TRY(t, c.emit("aten.add", {m, b}));
  TRY(pw, c.emit("aten.pow", {t, be}));
  TRY(y, c.emit("aten.div", {x, pw}));
  return c.set_output(0, y);
}

// GlobalLpPool / LpPool (p-norm over windows): (sum |x|^p)^(1/p); LpPool's window sum is
// avg_pool2d (count_include_pad) times the kernel area.
Error conv_GlobalLpPool(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(p, c.attr_int("p", 2));
  KILN_RETURN_IF_ERROR(float_only(c, x));
  if (p < 1) return c.invalid("p must be >= 1");
  const int64_t r = c.rank(x);
  if (r < 3) return c.invalid("input must have rank >= 3");
  TRY(ab, c.emit("aten.abs", {x}));
  TRY(pv, scalar_for(c, x, static_cast<double>(p)));
  TRY(pw, c.emit("aten.pow", {ab, pv}));
  Ints dims;
  for (int64_t i = 2; i < r; ++i) dims.push_back(i);
  TRY(sm, c.emit("aten.sum", {pw}, {{"dim", dims}, {"keepdim", true}}));
  TRY(ip, scalar_for(c, sm, 1.0 / static_cast<double>(p)));
  TRY(y, c.emit("aten.pow", {sm, ip}));
  return c.set_output(0, y);
}
Error conv_LpPool(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(p, c.attr_int("p", 2));
  KILN_RETURN_IF_ERROR(float_only(c, x));
  if (p < 1) return c.invalid("p must be >= 1");
  const Ints xs = c.type(x).sizes;
  if (xs.size() != 4) return c.unsupported("input of rank " + std::to_string(xs.size()) + " (2-D pooling only)");
  if (!c.has_attr("kernel_shape")) return c.invalid("missing attribute 'kernel_shape'");
  TRY(kernel, c.attr_ints("kernel_shape", {}));
  if (kernel.size() != 2) return c.invalid("kernel_shape must have 2 values");
  TRY(ceil, c.attr_int("ceil_mode", 0));
  if (ceil) return c.unsupported("attribute 'ceil_mode' = 1");
  TRY(s, spatial_attrs(c, Ints(xs.begin() + 2, xs.end()), kernel, true));
  TRY(ab, c.emit("aten.abs", {x}));
  TRY(pv, scalar_for(c, x, static_cast<double>(p)));
  TRY(pw, c.emit("aten.pow", {ab, pv}));
  Ints aten;
  for (size_t k = 2; k-- > 0;) {
    aten.push_back(s.pad_begin[k]);
    aten.push_back(s.pad_end[k]);
  }
  TRY(pd, c.emit("aten.constant_pad_nd", {pw}, {{"pad", aten}, {"value", 0.0}}));
  for (int64_t d : s.dilations) {
    if (d != 1) return c.unsupported("dilations");
  }
  TRY(av, c.emit("aten.avg_pool2d", {pd}, {{"kernel_size", s.kernel}, {"stride", s.strides}, {"padding", Ints{0, 0}},
                                            {"ceil_mode", false}, {"count_include_pad", true}}));
  TRY(area, scalar_for(c, av, static_cast<double>(kernel[0] * kernel[1])));
  TRY(sm, c.emit("aten.mul", {av, area}));
  TRY(ip, scalar_for(c, sm, 1.0 / static_cast<double>(p)));
  TRY(y, c.emit("aten.pow", {sm, ip}));
  return c.set_output(0, y);
}

// ---- quantization (QDQ) ----

// DequantizeLinear: (x - zero_point) * scale, per tensor or per `axis` (1-D scale).
Error conv_DequantizeLinear(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(scale, c.input(1));
  TRY(zp, c.opt_input(2));
  TRY(axis_raw, c.attr_int("axis", 1));
  const int64_t r = c.rank(x);
  auto per_axis = [&](ValueId v) -> Result<ValueId> {
    if (v == kNoValue || c.rank(v) == 0 || r == 0) return v;
    if (c.rank(v) != 1) return c.invalid("scale / zero_point must be a scalar or 1-D");
    TRY(axis, wrap_axis(c, axis_raw, r, "axis"));
    Ints shape(static_cast<size_t>(r), 1);
    shape[static_cast<size_t>(axis)] = c.type(v).sizes[0];
    return view(c, v, shape);
  };
  TRY(xf, c.emit("aten._to_copy", {x}, {{"dtype", std::string("float32")}}));
  ValueId y = xf;
  if (zp != kNoValue) {
    TRY(zf, c.emit("aten._to_copy", {zp}, {{"dtype", std::string("float32")}}));
    TRY(zr, per_axis(zf));
    TRY(v, c.emit("aten.sub", {y, zr}));
    y = v;
  }
  TRY(sr, per_axis(scale));
  TRY(v, c.emit("aten.mul", {y, sr}));
  return c.set_output(0, v);
}

// QuantizeLinear: saturate(round_half_even(x / scale) + zero_point) to uint8 (default) or int8.
Error conv_QuantizeLinear(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(scale, c.input(1));
  TRY(zp, c.opt_input(2));
  TRY(axis_raw, c.attr_int("axis", 1));
  if (c.has_attr("saturate")) {
    TRY(sat, c.attr_int("saturate", 1));  // opset 19, float8 only
    (void)sat;
  }
  KILN_RETURN_IF_ERROR(float_only(c, x));
  const DType out = zp == kNoValue ? DType::UInt8 : c.type(zp).dtype;
  if (out != DType::UInt8 && out != DType::Int8) return c.unsupported(std::string("output dtype ") + dtype_name(out));
  const int64_t r = c.rank(x);
  auto per_axis = [&](ValueId v) -> Result<ValueId> {
    if (v == kNoValue || c.rank(v) == 0 || r == 0) return v;
    if (c.rank(v) != 1) return c.invalid("scale / zero_point must be a scalar or 1-D");
    TRY(axis, wrap_axis(c, axis_raw, r, "axis"));
    Ints shape(static_cast<size_t>(r), 1);
    shape[static_cast<size_t>(axis)] = c.type(v).sizes[0];
    return view(c, v, shape);
  };
  TRY(sr, per_axis(scale));
  TRY(q, c.emit("aten.div", {x, sr}));
  TRY(rq, round_half_even(c, q));
  ValueId y = rq;
  if (zp != kNoValue) {
    TRY(zf, c.emit("aten._to_copy", {zp}, {{"dtype", std::string("float32")}}));
    TRY(zr, per_axis(zf));
    TRY(v, c.emit("aten.add", {y, zr}));
    y = v;
  }
  const double lo = out == DType::UInt8 ? 0 : -128, hi = out == DType::UInt8 ? 255 : 127;
  TRY(cl, c.emit("aten.clamp", {y}, {{"min", lo}, {"max", hi}}));
  TRY(v, c.emit("aten._to_copy", {cl}, {{"dtype", std::string(dtype_name(out))}}));
  return c.set_output(0, v);
}


// ---- losses (pure functions of their inputs, usable in inference graphs) ----

// NegativeLogLikelihoodLoss(input [N, C, d...], target [N, d...], weight [C]?): loss = -input[n,
// target, d...] * weight[target], 0 where target == ignore_index; reduction none / sum / mean (sum
// divided by the sum of the applied weights).
Result<ValueId> nll_loss(NodeCtx& c, ValueId x, ValueId t, ValueId w, const std::string& reduction,
                         std::optional<int64_t> ignore) {
  const Ints xs = c.type(x).sizes;
  const int64_t r = static_cast<int64_t>(xs.size());
  if (r < 2) return c.invalid("input must have rank >= 2 [N, C, ...]");
  Ints ts = xs;
  ts.erase(ts.begin() + 1);
  if (c.type(t).sizes != ts) return c.invalid("target shape must be the input's without dim 1");
  if (c.type(x).dtype != DType::Float32) return c.unsupported(std::string("dtype ") + dtype_name(c.type(x).dtype));
  if (reduction != "none" && reduction != "sum" && reduction != "mean") return c.invalid("reduction '" + reduction + "'");
  if (w != kNoValue && c.type(w).sizes != Ints{xs[1]}) {
    return c.invalid("weight must be [C] = [" + std::to_string(xs[1]) + "], got " + sizes_to_string(c.type(w).sizes));
  }
  ValueId ti = t;
  if (c.type(t).dtype != DType::Int64) {
    TRY(v, c.emit("aten._to_copy", {t}, {{"dtype", std::string("int64")}}));
    ti = v;
  }
  ValueId valid = kNoValue, tsafe = ti;
  if (ignore) {
    TRY(ig, c.scalar(DType::Int64, static_cast<double>(*ignore)));
    TRY(zero, c.scalar(DType::Int64, 0));
    TRY(ne, c.emit("aten.ne", {ti, ig}));
    TRY(ts2, c.emit("aten.where", {ne, ti, zero}));
    valid = ne, tsafe = ts2;
  }
  Ints us = ts;
  us.insert(us.begin() + 1, 1);
  TRY(tu, view(c, tsafe, us));
  TRY(io, iota_along(c, xs[1], 1, r));
  TRY(oh, c.emit("aten.eq", {tu, io}));
  TRY(zf, c.scalar(DType::Float32, 0));
  TRY(sel, c.emit("aten.where", {oh, x, zf}));
  TRY(picked, c.emit("aten.sum", {sel}, {{"dim", Ints{1}}, {"keepdim", false}}));
  TRY(loss0, c.emit("aten.neg", {picked}));
  ValueId wt = kNoValue;  // weight applied per element
  if (w != kNoValue) {
    TRY(g, gather(c, w, tsafe, 0));
    wt = g;
  }
  if (valid != kNoValue) {
    TRY(vf, c.emit("aten._to_copy", {valid}, {{"dtype", std::string("float32")}}));
    if (wt == kNoValue) {
      wt = vf;
    } else {
      TRY(m, c.emit("aten.mul", {wt, vf}));
      wt = m;
    }
  }
  ValueId loss = loss0;
  if (wt != kNoValue) {
    TRY(m, c.emit("aten.mul", {loss0, wt}));
    loss = m;
  }
  if (reduction == "none") return loss;
  TRY(total, c.emit("aten.sum", {loss}, {{"dim", std::monostate{}}, {"keepdim", false}}));
  if (reduction == "sum") return total;
  if (wt == kNoValue) return c.emit("aten.mean", {loss}, {{"dim", std::monostate{}}, {"keepdim", false}});
  TRY(den, c.emit("aten.sum", {wt}, {{"dim", std::monostate{}}, {"keepdim", false}}));
  return c.emit("aten.div", {total, den});
}

Error conv_NegativeLogLikelihoodLoss(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(t, c.input(1));
  TRY(w, c.opt_input(2));
  TRY(reduction, c.attr_string("reduction", "mean"));
  std::optional<int64_t> ignore;
  if (c.has_attr("ignore_index")) {
    TRY(v, c.attr_int("ignore_index", 0));
    ignore = v;
  }
  TRY(y, nll_loss(c, x, t, w, reduction, ignore));
  return c.set_output(0, y);
}

// SoftmaxCrossEntropyLoss: NegativeLogLikelihoodLoss of log_softmax(scores) over dim 1; the optional
// second output is that log_softmax.
Error conv_SoftmaxCrossEntropyLoss(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(t, c.input(1));
  TRY(w, c.opt_input(2));
  TRY(reduction, c.attr_string("reduction", "mean"));
  std::optional<int64_t> ignore;
  if (c.has_attr("ignore_index")) {
    TRY(v, c.attr_int("ignore_index", 0));
    ignore = v;
  }
  if (c.rank(x) < 2) return c.invalid("scores must have rank >= 2 [N, C, ...]");
  TRY(lp, c.emit("aten._log_softmax", {x}, {{"dim", int64_t{1}}, {"half_to_float", false}}));
  TRY(y, nll_loss(c, lp, t, w, reduction, ignore));
  KILN_RETURN_IF_ERROR(c.set_output(0, y));
  return c.set_output(1, lp);
}

// ReduceProd: products of the slices along each reduced axis (axes of up to 64 elements).
Error conv_ReduceProd(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(axes, axes_of(c, 1, 18));
  TRY(keep, c.attr_int("keepdims", 1));
  const int64_t r = c.rank(x);
  const DType dt = c.type(x).dtype;
  if (dt != DType::Float32 && dt != DType::Int64 && dt != DType::Int32) return c.unsupported(std::string("dtype ") + dtype_name(dt));
  std::vector<bool> red(static_cast<size_t>(r), !axes || axes->empty());
  if (axes) {
    for (int64_t a : *axes) {
      TRY(w, wrap_axis(c, a, r, "axis"));
      red[static_cast<size_t>(w)] = true;
    }
  }
  ValueId y = x;
  for (int64_t d = 0; d < r; ++d) {
    if (!red[static_cast<size_t>(d)]) continue;
    const int64_t n = c.type(y).sizes[static_cast<size_t>(d)];
    if (n > 64) return c.unsupported("ReduceProd over an axis of more than 64 elements");
    if (n == 0) {  // the product of no elements is 1 (opset 18's empty-set rule): sum (0) + 1
      TRY(s0, c.emit("aten.sum", {y}, {{"dim", Ints{d}}, {"keepdim", true}}));
      ValueId z = s0;
      if (c.type(s0).dtype != dt) {
        TRY(v, c.emit("aten._to_copy", {s0}, {{"dtype", std::string(dtype_name(dt))}}));
        z = v;
      }
      TRY(one, scalar_for(c, z, 1.0));
      TRY(v, c.emit("aten.add", {z, one}));
      y = v;
      continue;
    }
    TRY(acc0, c.emit("aten.slice", {y}, {{"dim", d}, {"start", int64_t{0}}, {"end", int64_t{1}}, {"step", int64_t{1}}}));
    ValueId acc = acc0;
    for (int64_t i = 1; i < n; ++i) {
      TRY(sl, c.emit("aten.slice", {y}, {{"dim", d}, {"start", i}, {"end", i + 1}, {"step", int64_t{1}}}));
      TRY(m, c.emit("aten.mul", {acc, sl}));
      acc = m;
    }
    y = acc;
  }
  if (!keep) {
    Ints out;
    for (int64_t d = 0; d < r; ++d) {
      if (!red[static_cast<size_t>(d)]) out.push_back(c.type(y).sizes[static_cast<size_t>(d)]);
    }
    TRY(v, c.emit("aten.view", {y}, {{"size", out}}));
    y = v;
  }
  if (y == x) {
    TRY(v, c.emit("aten.clone", {x}));
    y = v;
  }
  return c.set_output(0, y);
}

// Hann / Hamming / Blackman windows of a constant size: generalized cosine windows
// w[n] = sum_k (-1)^k a_k cos(2 pi k n / N), N = size (periodic) or size - 1 (symmetric);
// Hamming uses a0 = 25/46, a1 = 21/46 as the ONNX spec does.
Error cosine_window(NodeCtx& c, std::vector<double> a) {
  TRY(sv, c.input(0));
  TRY(size_v, c.const_ints(sv, "size"));
  TRY(periodic, c.attr_int("periodic", 1));
  TRY(odt, c.attr_int("output_datatype", 1));
  auto dt = kiln_dtype(static_cast<int>(odt));
  if (!dt.ok()) return c.unsupported("attribute 'output_datatype': " + dt.error().message());
  if (size_v.size() != 1 || size_v[0] < 0 || size_v[0] > (1 << 24)) return c.invalid("size must be a non-negative scalar");
  const int64_t n = size_v[0];
  const double denom = periodic ? static_cast<double>(n) : static_cast<double>(n - 1);
  std::vector<double> w(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    double v = 0;
    for (size_t k = 0; k < a.size(); ++k) {
      v += (k % 2 ? -1.0 : 1.0) * a[k] * std::cos(2.0 * M_PI * static_cast<double>(k) * static_cast<double>(i) / denom);
    }
    w[static_cast<size_t>(i)] = denom == 0 ? 1.0 : v;
  }
  std::vector<uint8_t> bytes(static_cast<size_t>(n) * dtype_size(*dt));
  for (int64_t i = 0; i < n; ++i) {
    TRY(one, c.scalar(*dt, w[static_cast<size_t>(i)]));
    std::memcpy(bytes.data() + static_cast<size_t>(i) * dtype_size(*dt), c.im.graph.value(one).constant->data(), dtype_size(*dt));
  }
  TRY(y, c.constant(TensorType{*dt, {n}}, std::move(bytes)));
  return c.set_output(0, y);
}
Error conv_HannWindow(NodeCtx& c) { return cosine_window(c, {0.5, 0.5}); }
Error conv_HammingWindow(NodeCtx& c) { return cosine_window(c, {25.0 / 46.0, 21.0 / 46.0}); }
Error conv_BlackmanWindow(NodeCtx& c) { return cosine_window(c, {0.42, 0.5, 0.08}); }


// ---- scatter with constant indices ----

// out = data where no update lands, else the update written there: `src[j]` is the flat update index
// written to data element j (-1: none; for duplicate indices the last update wins, as in the
// ONNX reference). Built as where(mask, embedding(updates, idx), data).
Error scatter_by_map(NodeCtx& c, ValueId data, ValueId updates, const std::vector<int64_t>& src) {
  const TensorType dt = c.type(data);
  std::vector<uint8_t> mask(src.size());
  std::vector<int64_t> idx(src.size());
  for (size_t j = 0; j < src.size(); ++j) {
    mask[j] = src[j] >= 0;
    idx[j] = std::max<int64_t>(src[j], 0);
  }
  TRY(mv, c.constant(TensorType{DType::Bool, dt.sizes}, std::move(mask)));
  std::vector<uint8_t> ib(idx.size() * 8);
  if (!idx.empty()) std::memcpy(ib.data(), idx.data(), ib.size());
  TRY(iv, c.constant(TensorType{DType::Int64, dt.sizes}, std::move(ib)));
  TRY(uf, view(c, updates, {c.type(updates).numel(), 1}));
  TRY(e, c.emit("aten.embedding", {uf, iv}));
  TRY(g, view(c, e, dt.sizes));
  TRY(y, c.emit("aten.where", {mv, g, data}));
  return c.set_output(0, y);
}

// Scatter with reduction "add" / "mul" / "max" / "min" (opset 18; ATen scatter_reduce / index_put_(accumulate=True)
// semantics, as the ONNX reference: every update is combined into its element in update order).
// `srcs[j]` lists, in order, the flat update indices landing on data element j. Round r combines
// each element's r-th update: out = where(mask_r, out OP embedding(updates, idx_r), out), so
// duplicates accumulate in the reference's order. Arithmetic dtypes only (float32, float64, int32,
// int64: aten.add / aten.mul / aten.maximum / aten.minimum).
Error scatter_reduce_by_map(NodeCtx& c, ValueId data, ValueId updates, const std::vector<std::vector<int64_t>>& srcs,
                            const std::string& red) {
  const TensorType dt = c.type(data);
  if (dt.dtype != DType::Float32 && dt.dtype != DType::Float64 && dt.dtype != DType::Int32 && dt.dtype != DType::Int64) {
    return c.unsupported("reduction '" + red + "' on dtype " + dtype_name(dt.dtype));
  }
  size_t rounds = 0;
  for (const auto& s : srcs) rounds = std::max(rounds, s.size());
  if (rounds > 64) return c.unsupported("more than 64 updates land on one element (reduction '" + red + "')");
  TRY(uf, view(c, updates, {c.type(updates).numel(), 1}));
  ValueId out = data;
  for (size_t r = 0; r < rounds; ++r) {
    std::vector<uint8_t> mask(srcs.size());
    std::vector<int64_t> idx(srcs.size(), 0);
    for (size_t j = 0; j < srcs.size(); ++j) {
      mask[j] = r < srcs[j].size();
      if (mask[j]) idx[j] = srcs[j][r];
    }
    TRY(mv, c.constant(TensorType{DType::Bool, dt.sizes}, std::move(mask)));
    std::vector<uint8_t> ib(idx.size() * 8);
    if (!idx.empty()) std::memcpy(ib.data(), idx.data(), ib.size());
    TRY(iv, c.constant(TensorType{DType::Int64, dt.sizes}, std::move(ib)));
    TRY(e, c.emit("aten.embedding", {uf, iv}));
    TRY(g, view(c, e, dt.sizes));
    const char* op = red == "add" ? "aten.add" : red == "mul" ? "aten.mul" : red == "max" ? "aten.maximum" : "aten.minimum";
    TRY(comb, c.emit(op, {out, g}));
    TRY(y, c.emit("aten.where", {mv, comb, out}));
    out = y;
  }
  if (rounds == 0) {
    TRY(y, c.emit("aten.clone", {data}));
    out = y;
  }
  return c.set_output(0, out);
}

// ScatterND (reduction "none", "add", "mul"): indices [..., k] (constant) address slices of data of
// rank r - k.
Error conv_ScatterND(NodeCtx& c) {
  TRY(data, c.input(0));
  TRY(iv, c.input(1));
  TRY(updates, c.input(2));
  TRY(red, c.attr_string("reduction", "none"));
  if (red != "none" && red != "add" && red != "mul" && !(c.opset() >= 18 && (red == "max" || red == "min"))) {
    return c.unsupported("attribute 'reduction' = '" + red + "'");
  }
  KILN_RETURN_IF_ERROR(check_same_dtype(c, data, updates));
  TRY(ind, c.const_ints(iv, "indices"));
  const Ints ds = c.type(data).sizes, is = c.type(iv).sizes;
  if (is.empty()) return c.invalid("indices must have rank >= 1");
  const int64_t k = is.back(), r = static_cast<int64_t>(ds.size());
  if (k < 1 || k > r) return c.invalid("indices' last dim must be in [1, data rank]");
  int64_t slice = 1;
  for (int64_t d = k; d < r; ++d) slice *= ds[static_cast<size_t>(d)];
  const int64_t nidx = numel_of(is) / k;
  Ints us(is.begin(), is.end() - 1);
  us.insert(us.end(), ds.begin() + k, ds.end());
  if (c.type(updates).sizes != us) return c.invalid("updates must have shape " + sizes_to_string(us));
  KILN_RETURN_IF_ERROR(c.check_constant_size(static_cast<double>(numel_of(ds)), 9, "the scatter map"));
  std::vector<int64_t> src(static_cast<size_t>(numel_of(ds)), -1);
  std::vector<std::vector<int64_t>> srcs(red == "none" ? 0 : src.size());
  for (int64_t i = 0; i < nidx; ++i) {
    int64_t off = 0;
    for (int64_t d = 0; d < k; ++d) {
      int64_t v = ind[static_cast<size_t>(i * k + d)];
      const int64_t n = ds[static_cast<size_t>(d)];
      if (v < -n || v >= n) return c.invalid("index " + std::to_string(v) + " out of range for a dim of size " + std::to_string(n));
      if (v < 0) v += n;
      off = off * n + v;
    }
    for (int64_t e = 0; e < slice; ++e) {
      if (red == "none") src[static_cast<size_t>(off * slice + e)] = i * slice + e;
      else srcs[static_cast<size_t>(off * slice + e)].push_back(i * slice + e);
    }
  }
  if (red != "none") return scatter_reduce_by_map(c, data, updates, srcs, red);
  return scatter_by_map(c, data, updates, src);
}

// ScatterElements / Scatter (reduction "none", "add", "mul"): data[i with i[axis] = indices[i]] =
// updates[i] (or combined with it) for constant indices.
Error conv_ScatterElements(NodeCtx& c) {
  TRY(data, c.input(0));
  TRY(iv, c.input(1));
  TRY(updates, c.input(2));
  TRY(axis_raw, c.attr_int("axis", 0));
  TRY(red, c.attr_string("reduction", "none"));
  if (red != "none" && red != "add" && red != "mul" && !(c.opset() >= 18 && (red == "max" || red == "min"))) {
    return c.unsupported("attribute 'reduction' = '" + red + "'");
  }
  KILN_RETURN_IF_ERROR(check_same_dtype(c, data, updates));
  TRY(ind, c.const_ints(iv, "indices"));
  const Ints ds = c.type(data).sizes, is = c.type(iv).sizes;
  const int64_t r = static_cast<int64_t>(ds.size());
  TRY(axis, wrap_axis(c, axis_raw, r, "axis"));
  if (c.type(updates).sizes != is || static_cast<int64_t>(is.size()) != r) return c.invalid("indices and updates must have the same shape and data's rank");
  for (int64_t d = 0; d < r; ++d) {
    if (is[static_cast<size_t>(d)] > ds[static_cast<size_t>(d)] && d != axis) return c.invalid("indices larger than data");
  }
  KILN_RETURN_IF_ERROR(c.check_constant_size(static_cast<double>(numel_of(ds)), 9, "the scatter map"));
  std::vector<int64_t> src(static_cast<size_t>(numel_of(ds)), -1);
  std::vector<std::vector<int64_t>> srcs(red == "none" ? 0 : src.size());
  const int64_t n = numel_of(is);
  for (int64_t flat = 0; flat < n; ++flat) {
    int64_t rem = flat, off = 0, mul = 1;
    for (int64_t d = r - 1; d >= 0; --d) {
      int64_t coord = rem % is[static_cast<size_t>(d)];
      rem /= is[static_cast<size_t>(d)];
      if (d == axis) {
        const int64_t dim = ds[static_cast<size_t>(d)];
        int64_t v = ind[static_cast<size_t>(flat)];
        if (v < -dim || v >= dim) return c.invalid("index " + std::to_string(v) + " out of range for a dim of size " + std::to_string(dim));
        coord = v < 0 ? v + dim : v;
      }
      off += coord * mul;
      mul *= ds[static_cast<size_t>(d)];
    }
    if (red == "none") src[static_cast<size_t>(off)] = flat;
    else srcs[static_cast<size_t>(off)].push_back(flat);
  }
  if (red != "none") return scatter_reduce_by_map(c, data, updates, srcs, red);
  return scatter_by_map(c, data, updates, src);
}

// ---- resize ----

// Taps of one axis of a separable resize: output o = sum_k w[k][o] * input[idx[k][o]].
struct AxisTaps {
  std::vector<Ints> idx;
  std::vector<std::vector<double>> w;
  std::vector<bool> valid;  // false: extrapolation_value (tf_crop_and_resize outside the roi)
  bool any_invalid = false;
};

struct ResizeSpec {
  std::string mode, coord, nearest;
  double cubic_a = -0.75, extrapolation = 0;
  bool exclude_outside = false;
  bool antialias = false;  ///< Resize-18: linear / cubic filters stretched by 1 / scale when downscaling
};

// ONNX Resize (onnx/reference/ops/op_resize.py): source coordinate of output index o per
// coordinate_transformation_mode; the n = 1 (nearest), 2 (linear) or 4 (cubic) nearest input
// indices (edge-clamped) with their coefficients; exclude_outside zeroes the taps outside the
// input and renormalizes.
// `len` is the resized length as the reference computes it: in * scale (not floored) when scales
// are given, else the output size.
AxisTaps axis_taps(const ResizeSpec& r, int64_t in, int64_t out, double scale, double len, double roi_start, double roi_end) {
  AxisTaps t;
  int n = r.mode == "nearest" ? 1 : r.mode == "linear" ? 2 : 4;
  // Antialias (op_resize.py _linear_coeffs_antialias / _cubic_coeffs_antialias): taps at offsets
  // i in [i0, 1 - i0] ... from floor(x), weights of the filter at min(scale, 1) * (i - ratio),
  // normalized; i0 = floor(-support / s) + 1 (support 1 for linear, 2 for cubic).
  const double aa_s = std::min(scale, 1.0);
  const bool aa = r.antialias && n > 1;
  int64_t i0 = 0;
  if (aa) {
    i0 = static_cast<int64_t>(std::floor(-(n == 2 ? 1.0 : 2.0) / aa_s)) + 1;
    if (2 - 2 * i0 > 4096) i0 = -2047;  // absurd downscales: bounded (the constant size checks follow)
    n = static_cast<int>(2 - 2 * i0);
  }
  t.idx.assign(static_cast<size_t>(n), Ints(static_cast<size_t>(out)));
  t.w.assign(static_cast<size_t>(n), std::vector<double>(static_cast<size_t>(out)));
  t.valid.assign(static_cast<size_t>(out), true);
  for (int64_t o = 0; o < out; ++o) {
    const double xo = static_cast<double>(o);
    double x;
    if (r.coord == "half_pixel") x = (xo + 0.5) / scale - 0.5;
    else if (r.coord == "half_pixel_symmetric") {  // Resize-19: the ROI's center maps to the output's center
      const double adjustment = static_cast<double>(out) / len;
      const double offset = static_cast<double>(in) / 2 * (1 - adjustment);
      x = offset + (xo + 0.5) / scale - 0.5;
    }
    else if (r.coord == "pytorch_half_pixel") x = len > 1 ? (xo + 0.5) / scale - 0.5 : 0.0;
    else if (r.coord == "align_corners") x = len == 1 ? 0.0 : xo * static_cast<double>(in - 1) / (len - 1);
    else if (r.coord == "tf_half_pixel_for_nn") x = (xo + 0.5) / scale;
    else if (r.coord == "tf_crop_and_resize") {
      x = len > 1 ? roi_start * static_cast<double>(in - 1) + xo * (roi_end - roi_start) * static_cast<double>(in - 1) / (len - 1)
                  : 0.5 * (roi_start + roi_end) * static_cast<double>(in - 1);
      if (x < 0 || x > static_cast<double>(in - 1)) {
        t.valid[static_cast<size_t>(o)] = false;
        t.any_invalid = true;
      }
    } else {
      x = xo / scale;  // asymmetric
    }
    if (!std::isfinite(x)) x = 0;
    x = std::clamp(x, -1e9, 1e9);
    auto clampi = [&](double v) { return static_cast<int64_t>(std::clamp<double>(v, 0.0, static_cast<double>(in - 1))); };
    if (n == 1) {
      double k;
      if (x == std::floor(x)) k = x;
      else if (r.nearest == "floor") k = std::floor(x);
      else if (r.nearest == "ceil") k = std::ceil(x);
      else if (r.nearest == "round_prefer_ceil") k = (x - std::floor(x) >= 0.5) ? std::ceil(x) : std::floor(x);
      else k = (x - std::floor(x) <= 0.5) ? std::floor(x) : std::ceil(x);  // round_prefer_floor
      t.idx[0][static_cast<size_t>(o)] = clampi(k);
      t.w[0][static_cast<size_t>(o)] = 1.0;
      continue;
    }
    const double f = x == std::floor(x) ? x - 1 : std::floor(x);
    const double ratio = x - f;  // in (0, 1]
    std::vector<double> cf;
    if (aa) {
      const double A = r.cubic_a;
      double sum = 0;
      for (int k = 0; k < n; ++k) {
        const double a = std::abs(aa_s * (static_cast<double>(i0 + k) - ratio));
        double v;
        if (r.mode == "linear") v = std::clamp(1 - a, 0.0, 1.0);
        else if (a <= 1) v = (A + 2) * a * a * a - (A + 3) * a * a + 1;
        else if (a < 2) v = A * a * a * a - 5 * A * a * a + 8 * A * a - 4 * A;
        else v = 0;
        cf.push_back(v);
        sum += v;
      }
      for (double& v : cf) v /= sum;
    } else if (n == 2) {
      cf = {1 - ratio, ratio};
    } else {
      const double A = r.cubic_a, a1 = ratio + 1, b = 1 - ratio, b1 = b + 1;
      cf = {((A * a1 - 5 * A) * a1 + 8 * A) * a1 - 4 * A, ((A + 2) * ratio - (A + 3)) * ratio * ratio + 1,
            ((A + 2) * b - (A + 3)) * b * b + 1, ((A * b1 - 5 * A) * b1 + 8 * A) * b1 - 4 * A};
    }
    std::vector<double> pos(static_cast<size_t>(n));
    for (int k = 0; k < n; ++k) pos[static_cast<size_t>(k)] = f - n / 2 + 1 + k;
    if (r.exclude_outside) {
      double sum = 0;
      for (int k = 0; k < n; ++k) {
        if (pos[static_cast<size_t>(k)] < 0 || pos[static_cast<size_t>(k)] > static_cast<double>(in - 1)) cf[static_cast<size_t>(k)] = 0;
        sum += cf[static_cast<size_t>(k)];
      }
      if (sum != 0) {
        for (double& v : cf) v /= sum;
      }
    }
    for (int k = 0; k < n; ++k) {
      t.idx[static_cast<size_t>(k)][static_cast<size_t>(o)] = clampi(pos[static_cast<size_t>(k)]);
      t.w[static_cast<size_t>(k)][static_cast<size_t>(o)] = cf[static_cast<size_t>(k)];
    }
  }
  return t;
}

bool taps_identity(const AxisTaps& t, int64_t in, int64_t out) {
  if (in != out || t.any_invalid) return false;
  for (int64_t o = 0; o < out; ++o) {
    double self = 0, other = 0;
    for (size_t k = 0; k < t.idx.size(); ++k) {
      (t.idx[k][static_cast<size_t>(o)] == o ? self : other) += std::abs(t.w[k][static_cast<size_t>(o)]);
    }
    if (std::abs(self - 1) > 1e-12 || other > 1e-12) return false;
  }
  return true;
}

// PyTorch's upsample_nearest2d source indices (src/kernels/portable/upsample.cpp nearest_idx).
bool matches_torch_nearest(const AxisTaps& t, int64_t in, int64_t out, std::optional<double> scale) {
  if (t.idx.size() != 1 || t.any_invalid) return false;
  const float s = scale ? static_cast<float>(1.0 / *scale) : static_cast<float>(in) / static_cast<float>(out);
  for (int64_t o = 0; o < out; ++o) {
    int64_t want;
    if (out == in) want = o;
    else if (out == 2 * in) want = o >> 1;
    else {
      // Compared before the cast: s comes from the file's scale (inf or NaN for a tiny or odd one).
      const float f = std::floor(static_cast<float>(o) * s);
      if (!(f > -1.0f)) return false;
      want = f < static_cast<float>(in - 1) ? static_cast<int64_t>(f) : in - 1;
    }
    if (t.idx[0][static_cast<size_t>(o)] != want) return false;
  }
  return true;
}

// Resize (opset 10: X, scales; 11+: X, roi, scales, sizes; 18: antialias, axes,
// keep_aspect_ratio_policy; 19: half_pixel_symmetric)
// and Upsample (opset 7: scales attribute; 9: scales input), any rank. Fast paths onto
// aten.upsample_nearest2d / upsample_bilinear2d when a 4-D resize of H and W computes exactly what
// PyTorch's kernels compute (nearest: the same source indices; linear: align_corners, or half_pixel
// / pytorch_half_pixel with output sizes > 1). Every other mode, coordinate transformation,
// nearest_mode, cubic coefficient, exclude_outside and tf_crop_and_resize roi/extrapolation_value
// becomes a separable sum of gathers with constant indices and weights per resized axis.
Error resize(NodeCtx& c, bool is_upsample) {
  TRY(x, c.input(0));
  ResizeSpec r;
  TRY(mode, c.attr_string("mode", "nearest"));
  r.mode = mode == "bilinear" ? "linear" : mode;
  r.coord = "asymmetric";
  r.nearest = "floor";  // Upsample / Resize-10: x_original = x_resized / scale, floor (ONNX Upsample-7)
  std::vector<double> scales, roi;
  Ints sizes;
  ValueId scales_v = kNoValue, sizes_v = kNoValue, roi_v = kNoValue;
  if (is_upsample) {
    if (c.opset() < 9) {
      TRY(sc, c.attr_floats("scales", {}));
      scales = sc;
    } else {
      TRY(v, c.input(1));
      scales_v = v;
    }
  } else if (c.opset() < 11) {
    TRY(v, c.input(1));
    scales_v = v;
  } else {
    TRY(cm, c.attr_string("coordinate_transformation_mode", "half_pixel"));
    TRY(nm, c.attr_string("nearest_mode", "round_prefer_floor"));
    TRY(ca, c.attr_float("cubic_coeff_a", -0.75));
    TRY(ex, c.attr_int("exclude_outside", 0));
    TRY(ev, c.attr_float("extrapolation_value", 0.0));
    r.coord = cm, r.nearest = nm, r.cubic_a = ca, r.exclude_outside = ex != 0, r.extrapolation = ev;
    TRY(rv, c.opt_input(1));
    TRY(sv, c.opt_input(2));
    TRY(zv, c.opt_input(3));
    roi_v = rv, scales_v = sv, sizes_v = zv;
  }
  Ints axes;  // Resize-18: scales / sizes / roi of these axes only
  std::string policy = "stretch";
  if (!is_upsample && c.opset() >= 18) {
    TRY(aa, c.attr_int("antialias", 0));
    TRY(ax, c.attr_ints("axes", {}));
    TRY(kp, c.attr_string("keep_aspect_ratio_policy", "stretch"));
    if (aa != 0 && aa != 1) return c.invalid("attribute 'antialias' must be 0 or 1");
    if (kp != "stretch" && kp != "not_larger" && kp != "not_smaller") {
      return c.invalid("attribute 'keep_aspect_ratio_policy' = '" + kp + "'");
    }
    r.antialias = aa == 1, axes = ax, policy = kp;
  }
  if (r.mode != "nearest" && r.mode != "linear" && r.mode != "cubic") return c.unsupported("attribute 'mode' = '" + mode + "'");
  static const char* kCoords[] = {"half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_half_pixel_for_nn",
                                  "tf_crop_and_resize", "half_pixel_symmetric"};
  if (std::find(std::begin(kCoords), std::end(kCoords), r.coord) == std::end(kCoords) ||
      (r.coord == "half_pixel_symmetric" && c.opset() < 19)) {
    return c.invalid("coordinate_transformation_mode '" + r.coord + "'");
  }
  static const char* kNearest[] = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"};
  if (std::find(std::begin(kNearest), std::end(kNearest), r.nearest) == std::end(kNearest)) {
    return c.invalid("nearest_mode '" + r.nearest + "'");
  }
  if (scales_v != kNoValue && c.type(scales_v).numel() > 0) {
    TRY(sc, c.const_floats(scales_v, "scales"));
    scales = sc;
  }
  if (sizes_v != kNoValue && c.type(sizes_v).numel() > 0) {
    TRY(sz, c.const_ints(sizes_v, "sizes"));
    sizes = sz;
  }
  const Ints in = c.type(x).sizes;
  const size_t rank = in.size();
  const bool has_axes = c.has_attr("axes");
  if (has_axes) {  // expanded to every axis (onnx reference _interpolate_nd)
    std::vector<bool> seen(rank, false);
    for (int64_t& a : axes) {
      TRY(w, wrap_axis(c, a, static_cast<int64_t>(rank), "axes"));
      if (seen[static_cast<size_t>(w)]) return c.invalid("axis " + std::to_string(w) + " repeated in axes");
      seen[static_cast<size_t>(w)] = true;
      a = w;
    }
    const size_t na = axes.size();
    if (!scales.empty()) {
      if (scales.size() != na) return c.invalid("scales must have " + std::to_string(na) + " values (one per axis)");
      std::vector<double> full(rank, 1.0);
      for (size_t k = 0; k < na; ++k) full[static_cast<size_t>(axes[k])] = scales[k];
      scales = full;
    }
    if (!sizes.empty()) {
      if (sizes.size() != na) return c.invalid("sizes must have " + std::to_string(na) + " values (one per axis)");
      Ints full = in;
      for (size_t k = 0; k < na; ++k) full[static_cast<size_t>(axes[k])] = sizes[k];
      sizes = full;
    }
  } else {
    for (size_t i = 0; i < rank; ++i) axes.push_back(static_cast<int64_t>(i));
  }
  if (r.coord == "tf_crop_and_resize") {
    if (roi_v == kNoValue) return c.invalid("tf_crop_and_resize needs roi");
    TRY(rr0, c.const_floats(roi_v, "roi"));
    std::vector<double> rr = rr0;
    if (has_axes) {
      if (rr.size() != 2 * axes.size()) return c.invalid("roi needs " + std::to_string(2 * axes.size()) + " values");
      std::vector<double> full(2 * rank);
      for (size_t i = 0; i < rank; ++i) full[i] = 0, full[i + rank] = 1;
      for (size_t k = 0; k < axes.size(); ++k) {
        full[static_cast<size_t>(axes[k])] = rr[k];
        full[static_cast<size_t>(axes[k]) + rank] = rr[k + axes.size()];
      }
      rr = full;
    }
    if (rr.size() != 2 * rank) return c.invalid("roi needs " + std::to_string(2 * rank) + " values");
    roi = rr;
  }
  Ints out(rank);
  std::vector<double> scale(rank);
  std::vector<bool> given_scale(rank, false);
  if (!sizes.empty()) {
    if (!scales.empty()) return c.invalid("both scales and sizes given");
    if (sizes.size() != rank) return c.invalid("sizes must have " + std::to_string(rank) + " values");
    for (size_t i = 0; i < rank; ++i) {
      if (sizes[i] < 1 || sizes[i] > (int64_t{1} << 24)) return c.invalid("bad output size " + std::to_string(sizes[i]));
      if (in[i] == 0) return c.invalid("cannot resize an empty dim");
      out[i] = sizes[i];
      scale[i] = static_cast<double>(out[i]) / static_cast<double>(in[i]);
    }
    if (policy != "stretch") {  // one scale for every listed axis; sizes rounded half up
      double k = policy == "not_larger" ? 1e300 : 0;
      for (int64_t a : axes) {
        k = policy == "not_larger" ? std::min(k, scale[static_cast<size_t>(a)]) : std::max(k, scale[static_cast<size_t>(a)]);
      }
      for (int64_t a : axes) {
        const size_t i = static_cast<size_t>(a);
        const double o = std::floor(k * static_cast<double>(in[i]) + 0.5);
        if (o < 1 || o > static_cast<double>(int64_t{1} << 24)) return c.invalid("bad output size with keep_aspect_ratio_policy");
        out[i] = static_cast<int64_t>(o);
        scale[i] = k;
        given_scale[i] = true;  // the reference's length is in * scale, as for given scales
      }
    }
  } else if (!scales.empty()) {
    if (scales.size() != rank) return c.invalid("scales must have " + std::to_string(rank) + " values");
    for (size_t i = 0; i < rank; ++i) {
      if (!(scales[i] > 0) || !std::isfinite(scales[i])) return c.invalid("scales must be positive");
      const double o = std::floor(static_cast<double>(in[i]) * scales[i]);
      if (o < 1 || o > static_cast<double>(int64_t{1} << 24)) return c.invalid("bad output size for scale " + std::to_string(scales[i]));
      out[i] = static_cast<int64_t>(o);
      scale[i] = scales[i];
      given_scale[i] = true;
    }
  } else {
    return c.invalid("needs scales or sizes");
  }
  if (numel_of(out) > (int64_t{1} << 31)) return c.unsupported("output too large");
  std::vector<AxisTaps> taps(rank);
  std::vector<bool> resized(rank, false), exact_len(rank, true);
  for (size_t i = 0; i < rank; ++i) {
    const double rs = roi.empty() ? 0 : roi[i], re = roi.empty() ? 1 : roi[i + rank];
    const double len = given_scale[i] ? static_cast<double>(in[i]) * scale[i] : static_cast<double>(out[i]);
    exact_len[i] = len == static_cast<double>(out[i]);
    taps[i] = axis_taps(r, in[i], out[i], scale[i], len, rs, re);
    resized[i] = !taps_identity(taps[i], in[i], out[i]);
  }
  // Fast paths: 4-D, only H and W resized.
  if (rank == 4 && !resized[0] && !resized[1] && c.type(x).dtype == DType::Float32 && !taps[2].any_invalid &&
      !taps[3].any_invalid && !(r.antialias && (scale[2] < 1 || scale[3] < 1))) {
    std::optional<double> sh, sw;
    if (given_scale[2]) sh = scale[2], sw = scale[3];
    Attributes attrs{{"output_size", Ints{out[2], out[3]}}};
    if (sh) attrs.set("scales_h", *sh), attrs.set("scales_w", *sw);
    if (r.mode == "nearest" && matches_torch_nearest(taps[2], in[2], out[2], sh) &&
        matches_torch_nearest(taps[3], in[3], out[3], sw)) {
      TRY(y, c.emit("aten.upsample_nearest2d", {x}, attrs));
      return c.set_output(0, y);
    }
    const bool half = (r.coord == "half_pixel" || r.coord == "pytorch_half_pixel") && out[2] > 1 && out[3] > 1;
    const bool corners = r.coord == "align_corners" && exact_len[2] && exact_len[3];
    if (r.mode == "linear" && (half || corners)) {
      if (r.coord == "align_corners") attrs.set("scales_h", std::monostate{}), attrs.set("scales_w", std::monostate{});
      attrs.set("align_corners", r.coord == "align_corners");
      TRY(y, c.emit("aten.upsample_bilinear2d", {x}, attrs));
      return c.set_output(0, y);
    }
  }
  // General path: per resized axis, sum_k gather(y, idx_k, axis) * w_k.
  const DType dt = c.type(x).dtype;
  if (r.mode != "nearest" && dt != DType::Float32) return c.unsupported(std::string("linear/cubic resize of dtype ") + dtype_name(dt));
  ValueId y = x;
  ValueId mask = kNoValue;
  for (size_t i = 0; i < rank; ++i) {
    if (!resized[i]) continue;
    const AxisTaps& t = taps[i];
    ValueId acc = kNoValue;
    Ints wshape(rank, 1);
    wshape[i] = out[i];
    for (size_t k = 0; k < t.idx.size(); ++k) {
      bool all_zero = true, all_one = true;
      for (double w : t.w[k]) {
        all_zero &= w == 0;
        all_one &= w == 1;
      }
      if (all_zero) continue;
      TRY(iv, c.int64_vector(t.idx[k]));
      TRY(g, gather(c, y, iv, static_cast<int64_t>(i)));
      ValueId term = g;
      if (!all_one) {
        std::vector<uint8_t> wb(t.w[k].size() * 4);
        for (size_t o = 0; o < t.w[k].size(); ++o) {
          const float f = static_cast<float>(t.w[k][o]);
          std::memcpy(wb.data() + o * 4, &f, 4);
        }
        TRY(wv, c.constant(TensorType{DType::Float32, wshape}, std::move(wb)));
        TRY(m, c.emit("aten.mul", {g, wv}));
        term = m;
      }
      if (acc == kNoValue) {
        acc = term;
      } else {
        TRY(s2, c.emit("aten.add", {acc, term}));
        acc = s2;
      }
    }
    if (acc == kNoValue) {  // every weight zero (degenerate cubic coefficients)
      TRY(iv, c.int64_vector(t.idx[0]));
      TRY(g, gather(c, y, iv, static_cast<int64_t>(i)));
      TRY(z, c.scalar(dt, 0));
      TRY(m, c.emit("aten.mul", {g, z}));
      acc = m;
    }
    y = acc;
    if (t.any_invalid) {
      std::vector<uint8_t> vb(t.valid.size());
      for (size_t o = 0; o < t.valid.size(); ++o) vb[o] = t.valid[o];
      TRY(mv, c.constant(TensorType{DType::Bool, wshape}, std::move(vb)));
      if (mask == kNoValue) {
        mask = mv;
      } else {
        TRY(a2, c.emit("aten.logical_and", {mask, mv}));
        mask = a2;
      }
    }
  }
  if (y == x) {
    TRY(v, c.emit("aten.clone", {x}));
    y = v;
  }
  if (mask != kNoValue) {
    TRY(ev, c.scalar(dt, r.extrapolation));
    TRY(v, c.emit("aten.where", {mask, y, ev}));
    y = v;
  }
  return c.set_output(0, y);
}
Error conv_Resize(NodeCtx& c) { return resize(c, false); }
Error conv_Upsample(NodeCtx& c) { return resize(c, true); }

// ---- opset 18-20 ops ----

// BitwiseAnd / Or / Xor / Not (opset 18): integer tensors, numpy broadcasting.
Error conv_BitwiseAnd(NodeCtx& c) { return cmp(c, "aten.bitwise_and"); }
Error conv_BitwiseOr(NodeCtx& c) { return cmp(c, "aten.bitwise_or"); }
Error conv_BitwiseXor(NodeCtx& c) { return cmp(c, "aten.bitwise_xor"); }
Error conv_BitwiseNot(NodeCtx& c) { return unary(c, "aten.bitwise_not"); }

// Gelu (opset 20): approximate "none" (erf) or "tanh", as aten.gelu.
Error conv_Gelu(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(approx, c.attr_string("approximate", "none"));
  if (approx != "none" && approx != "tanh") return c.invalid("attribute 'approximate' = '" + approx + "'");
  TRY(y, c.emit("aten.gelu", {x}, {{"approximate", approx}}));
  return c.set_output(0, y);
}

// GroupNormalization (opset 18; 21): X (N, C, D1, ...), num_groups G dividing C. Opset 18's
// scale and bias have one value per group (repeated over the group's C / G channels here);
// opset 21's have one per channel. stash_type 1 (float32 statistics, the default): inputs of
// another float dtype are normalized in float32 and converted back.
Error conv_GroupNormalization(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(scale, c.input(1));
  TRY(bias, c.input(2));
  TRY(eps, c.attr_float("epsilon", 1e-5));
  TRY(groups, c.attr_int("num_groups", 0));
  TRY(stash, c.attr_int("stash_type", 1));
  if (stash != 1) return c.unsupported("attribute 'stash_type' = " + std::to_string(stash) + " (float32 statistics only)");
  if (!c.has_attr("num_groups")) return c.invalid("attribute 'num_groups' is required");
  const Ints s = c.type(x).sizes;
  if (s.size() < 2) return c.invalid("input must have rank >= 2");
  const DType dt = c.type(x).dtype;
  if (!is_floating(dt)) return c.invalid("input must be a float tensor, got " + c.type(x).to_string());
  const int64_t ch = s[1];
  if (groups <= 0 || ch % groups != 0) {
    return c.invalid("num_groups " + std::to_string(groups) + " does not divide the " + std::to_string(ch) + " channels");
  }
  const int64_t per = c.opset() >= 21 ? ch : groups;
  for (ValueId v : {scale, bias}) {
    if (c.type(v).sizes != Ints{per}) {
      return c.invalid("scale and bias must have shape [" + std::to_string(per) + "] (opset " + std::to_string(c.opset()) +
                       "), got " + c.type(v).to_string());
    }
  }
  ValueId w = scale, b = bias;
  if (c.opset() < 21 && groups != ch) {  // per group -> per channel
    Ints idx(static_cast<size_t>(ch));
    for (int64_t i = 0; i < ch; ++i) idx[static_cast<size_t>(i)] = i / (ch / groups);
    TRY(iv, c.int64_vector(idx));
    TRY(w2, c.emit("aten.index_select", {scale, iv}, {{"dim", int64_t{0}}}));
    TRY(b2, c.emit("aten.index_select", {bias, iv}, {{"dim", int64_t{0}}}));
    w = w2, b = b2;
  }
  ValueId in = x;
  const std::string f32 = "float32";
  if (dt != DType::Float32) {
    TRY(xf, c.emit("aten._to_copy", {x}, {{"dtype", f32}}));
    in = xf;
  }
  if (c.type(w).dtype != DType::Float32) {
    TRY(wf, c.emit("aten._to_copy", {w}, {{"dtype", f32}}));
    w = wf;
  }
  if (c.type(b).dtype != DType::Float32) {
    TRY(bf, c.emit("aten._to_copy", {b}, {{"dtype", f32}}));
    b = bf;
  }
  int64_t hw = 1;
  for (size_t i = 2; i < s.size(); ++i) hw *= s[i];
  TRY(y0, c.emit("aten.native_group_norm", {in, w, b},
                 {{"N", s[0]}, {"C", ch}, {"HxW", hw}, {"group", groups}, {"eps", eps}}));
  ValueId y = y0;
  if (dt != DType::Float32) {
    TRY(yc, c.emit("aten._to_copy", {y0}, {{"dtype", std::string(dtype_name(dt))}}));
    y = yc;
  }
  return c.set_output(0, y);
}

// Acos / Asin / Atan (opset 7; 22 adds bfloat16).
Error conv_Acos(NodeCtx& c) { return unary(c, "aten.acos"); }
Error conv_Asin(NodeCtx& c) { return unary(c, "aten.asin"); }
Error conv_Atan(NodeCtx& c) { return unary(c, "aten.atan"); }

// CenterCropPad (opset 18): per listed axis (all by default), a centered crop to the constant
// target size (start (dim - target) / 2, rounded down) or a centered zero pad (begin (target - dim)
// / 2, rounded down), as aten.slice and aten.constant_pad_nd.
Error conv_CenterCropPad(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(sv, c.input(1));
  TRY(shape, c.const_ints(sv, "shape"));
  const int64_t r = c.rank(x);
  Ints def(static_cast<size_t>(r));
  std::iota(def.begin(), def.end(), int64_t{0});
  TRY(axes0, c.attr_ints("axes", def));
  if (shape.size() != axes0.size()) {
    return c.invalid("shape has " + std::to_string(shape.size()) + " values for " + std::to_string(axes0.size()) + " axes");
  }
  std::vector<bool> seen(static_cast<size_t>(r), false);
  Ints pad(static_cast<size_t>(2 * r), 0);  // (begin, end) per dim, aten order built below
  ValueId y = x;
  for (size_t k = 0; k < axes0.size(); ++k) {
    TRY(a, wrap_axis(c, axes0[k], r, "axes"));
    if (seen[static_cast<size_t>(a)]) return c.invalid("axis " + std::to_string(a) + " repeated in axes");
    seen[static_cast<size_t>(a)] = true;
    const int64_t dim = c.type(x).sizes[static_cast<size_t>(a)], want = shape[k];
    if (want < 0 || want > (int64_t{1} << 31)) return c.invalid("bad target size " + std::to_string(want));
    if (want < dim) {
      const int64_t start = (dim - want) / 2;
      TRY(v, c.emit("aten.slice", {y}, {{"dim", a}, {"start", start}, {"end", start + want}, {"step", int64_t{1}}}));
      y = v;
    } else if (want > dim) {
      pad[static_cast<size_t>(2 * a)] = (want - dim) / 2;
      pad[static_cast<size_t>(2 * a + 1)] = want - dim - (want - dim) / 2;
    }
  }
  bool any_pad = false;
  Ints aten;  // last dim first
  for (int64_t i = r - 1; i >= 0; --i) {
    aten.push_back(pad[static_cast<size_t>(2 * i)]);
    aten.push_back(pad[static_cast<size_t>(2 * i + 1)]);
    any_pad |= pad[static_cast<size_t>(2 * i)] != 0 || pad[static_cast<size_t>(2 * i + 1)] != 0;
  }
  if (any_pad) {
    TRY(v, c.emit("aten.constant_pad_nd", {y}, {{"pad", aten}, {"value", 0.0}}));
    y = v;
  }
  if (y == x) {
    TRY(v, c.emit("aten.clone", {x}));
    y = v;
  }
  return c.set_output(0, y);
}

// GridSample (opset 16: mode bilinear / nearest / bicubic on 4-D input; 20: linear / nearest /
// cubic on any rank) as aten.grid_sampler_2d / 3d (float32; 4-D and 5-D input, cubic 4-D only).
Error conv_GridSample(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(grid, c.input(1));
  const bool v20 = c.opset() >= 20;
  TRY(mode, c.attr_string("mode", v20 ? "linear" : "bilinear"));
  TRY(padding, c.attr_string("padding_mode", "zeros"));
  TRY(align, c.attr_int("align_corners", 0));
  int64_t interp = -1;
  if (mode == (v20 ? "linear" : "bilinear")) interp = 0;
  else if (mode == "nearest") interp = 1;
  else if (mode == (v20 ? "cubic" : "bicubic")) interp = 2;
  else return c.invalid("attribute 'mode' = '" + mode + "' (opset " + std::to_string(c.opset()) + ")");
  int64_t pad = -1;
  if (padding == "zeros") pad = 0;
  else if (padding == "border") pad = 1;
  else if (padding == "reflection") pad = 2;
  else return c.invalid("attribute 'padding_mode' = '" + padding + "'");
  const int64_t r = c.rank(x);
  if (r != 4 && r != 5) return c.unsupported("input of rank " + std::to_string(r) + " (4-D and 5-D only)");
  if (c.type(x).dtype != DType::Float32 || c.type(grid).dtype != DType::Float32) {
    return c.unsupported("dtype " + std::string(dtype_name(c.type(x).dtype)) + " (float32 only)");
  }
  TRY(y, c.emit(r == 4 ? "aten.grid_sampler_2d" : "aten.grid_sampler_3d", {x, grid},
                {{"interpolation_mode", interp}, {"padding_mode", pad}, {"align_corners", align != 0}}));
  return c.set_output(0, y);
}

// AffineGrid (opset 20): theta (N, 2, 3) / (N, 3, 4), constant size (N, C, [D,] H, W) -> grid
// (N, [D,] H, W, 2 or 3) = base @ theta^T per batch, where base holds (x, y, [z,] 1) per output
// position: -1 + 2 i / (n - 1) with align_corners, else -1 + (2 i + 1) / n (onnx reference
// op_affine_grid.py). float32, as aten.bmm.
Error conv_AffineGrid(NodeCtx& c) {
  TRY(theta, c.input(0));
  TRY(sv, c.input(1));
  TRY(size, c.const_ints(sv, "size"));
  TRY(align, c.attr_int("align_corners", 0));
  if (size.size() != 4 && size.size() != 5) return c.invalid("size must have 4 or 5 values");
  const int64_t nd = static_cast<int64_t>(size.size()) - 2, n = size[0];
  const TensorType tt = c.type(theta);
  if (tt.dtype != DType::Float32) return c.unsupported("dtype " + std::string(dtype_name(tt.dtype)) + " (float32 only)");
  if (tt.sizes != Ints{n, nd, nd + 1}) {
    return c.invalid("theta must have shape [" + std::to_string(n) + ", " + std::to_string(nd) + ", " +
                     std::to_string(nd + 1) + "], got " + tt.to_string());
  }
  Ints spatial(size.begin() + 2, size.end());
  double m = 1;
  for (int64_t d : spatial) {
    if (d < 1) return c.invalid("size must be positive");
    m *= static_cast<double>(d);
  }
  KILN_RETURN_IF_ERROR(c.check_constant_size(m * static_cast<double>(n), 4.0 * static_cast<double>(nd + 1), "the base grid"));
  const int64_t mi = static_cast<int64_t>(m);
  auto coord = [&](int64_t i, int64_t len) {
    if (align) return len == 1 ? -1.0 : -1.0 + 2.0 * static_cast<double>(i) / static_cast<double>(len - 1);
    return -1.0 + (2.0 * static_cast<double>(i) + 1.0) / static_cast<double>(len);
  };
  std::vector<float> base(static_cast<size_t>(mi * (nd + 1)));
  for (int64_t p = 0; p < mi; ++p) {
    int64_t rem = p;
    std::vector<int64_t> idx(static_cast<size_t>(nd));
    for (int64_t d = nd - 1; d >= 0; --d) {
      idx[static_cast<size_t>(d)] = rem % spatial[static_cast<size_t>(d)];
      rem /= spatial[static_cast<size_t>(d)];
    }
    // (x, y, [z]): x runs over the last spatial dim (W), y over H, z over D.
    for (int64_t k = 0; k < nd; ++k) {
      const size_t d = static_cast<size_t>(nd - 1 - k);
      base[static_cast<size_t>(p * (nd + 1) + k)] = static_cast<float>(coord(idx[d], spatial[d]));
    }
    base[static_cast<size_t>(p * (nd + 1) + nd)] = 1.0f;
  }
  std::vector<uint8_t> bytes(base.size() * 4);
  if (!bytes.empty()) std::memcpy(bytes.data(), base.data(), bytes.size());
  TRY(bv, c.constant(TensorType{DType::Float32, {1, mi, nd + 1}}, std::move(bytes)));
  TRY(be, c.emit("aten.expand", {bv}, {{"size", Ints{n, mi, nd + 1}}}));
  TRY(tt2, c.emit("aten.permute", {theta}, {{"dims", Ints{0, 2, 1}}}));
  TRY(g, c.emit("aten.bmm", {be, tt2}));
  Ints out{n};
  out.insert(out.end(), spatial.begin(), spatial.end());
  out.push_back(nd);
  TRY(y, view(c, g, out));
  return c.set_output(0, y);
}

// Col2Im (opset 18): input (N, C * prod(block_shape), L), constant image_shape and block_shape of
// two spatial dims, as aten.col2im (2-D, the same padding at both ends of a dim).
Error conv_Col2Im(NodeCtx& c) {
  TRY(x, c.input(0));
  TRY(isv, c.input(1));
  TRY(bsv, c.input(2));
  TRY(image, c.const_ints(isv, "image_shape"));
  TRY(block, c.const_ints(bsv, "block_shape"));
  if (image.size() != block.size()) return c.invalid("image_shape and block_shape have different lengths");
  if (image.size() != 2) return c.unsupported(std::to_string(image.size()) + " spatial dims (2-D only, aten.col2im)");
  TRY(dil, c.attr_ints("dilations", {1, 1}));
  TRY(pads, c.attr_ints("pads", {0, 0, 0, 0}));
  TRY(strides, c.attr_ints("strides", {1, 1}));
  if (dil.size() != 2 || strides.size() != 2 || pads.size() != 4) return c.invalid("dilations, strides need 2 values, pads 4");
  if (pads[0] != pads[2] || pads[1] != pads[3]) return c.unsupported("pads differing at the two ends of a dim");
  if (c.rank(x) != 3) return c.invalid("input must have rank 3 (N, C * prod(block_shape), L)");
  TRY(y, c.emit("aten.col2im", {x},
                {{"output_size", image}, {"kernel_size", block}, {"dilation", dil}, {"padding", Ints{pads[0], pads[1]}},
                 {"stride", strides}}));
  return c.set_output(0, y);
}

#undef TRY

}  // namespace

const std::map<std::string, OpConverter>& converters() {
  // Minimum opset: ops whose semantics changed in ways the converter does not handle are
  // refused below the version it implements (e.g. Reshape-1 took the shape as an attribute).
  // Legacy attributes that do not change results when absent (consumed_inputs, ...) are caught by
  // the importer's unread-attribute check instead.
  static const std::map<std::string, OpConverter> table = {
#define K(name) {#name, {conv_##name, 1}}
#define K6(name) {#name, {conv_##name, 6}}
      K(Abs), K(Add), K(And), K(ArgMax), K(AveragePool), K6(BatchNormalization), K6(Cast), K(Celu), K6(Clip),
      {"Concat", {conv_Concat, 4}}, K(Constant), K(ConstantOfShape), K(Conv), K(ConvTranspose), K(Cos),
      K(DepthToSpace), K(Div), K6(Dropout), K(Elu), K(Equal), K(Erf), K(Exp), K(Expand), K(Flatten), K(Gather),
      K6(Gemm), K(GlobalAveragePool), K(GlobalMaxPool), K(Greater), K(GreaterOrEqual), K(HardSigmoid),
      K(HardSwish), K(Identity), K(InstanceNormalization), K(LayerNormalization), K(LeakyRelu), K(Less),
      K(LessOrEqual), K(Log), K(LogSoftmax), K(MatMul), K6(Max), K(MaxPool), K6(Mean), K6(Min), K(Mul), K(Neg),
      K(Not), K(Or), {"Pad", {conv_Pad, 2}}, K(Pow), K(PRelu), K(Range), K(Reciprocal), K(ReduceL1), K(ReduceL2),
      K(ReduceLogSum), K(ReduceLogSumExp), K(ReduceMax), K(ReduceMean), K(ReduceMin), K(ReduceSum),
      K(ReduceSumSquare), K(Relu), {"Reshape", {conv_Reshape, 5}}, K(Resize), K(Selu), K(Shape), K(Sigmoid),
      K(Sin), K(Size), K(Slice), K(Softmax), K(Softplus), K(Softsign), K(SpaceToDepth), {"Split", {conv_Split, 2}},
      K(Sqrt), K(Squeeze), K(Sub), K6(Sum), K(Tanh), K(ThresholdedRelu), K6(Tile), K(Transpose), K(Unsqueeze),
      {"Upsample", {conv_Upsample, 7}}, K(Where), K(Xor),
      K(Floor), K(Ceil), K(Round), K(Sign), K(Mod), K(IsNaN), K(IsInf), K(Tan), K(Sinh), K(Cosh), K(Asinh),
      K(Acosh), K(Atanh), K(Mish), K(Shrink), K(CastLike), K(ArgMin), K(Hardmax), K(OneHot), K(EyeLike), K(Trilu),
      K(CumSum), K(GatherElements), K(GatherND), K(LpNormalization), K(MeanVarianceNormalization), K(LRN),
      K(GlobalLpPool), K(LpPool), K(DequantizeLinear), K(QuantizeLinear), K(NegativeLogLikelihoodLoss),
      K(SoftmaxCrossEntropyLoss), K(ReduceProd), K(HannWindow), K(HammingWindow), K(BlackmanWindow), K(ScatterND),
      K(ScatterElements), {"Scatter", {conv_ScatterElements, 9}},
      {"BitwiseAnd", {conv_BitwiseAnd, 18}}, {"BitwiseOr", {conv_BitwiseOr, 18}}, {"BitwiseXor", {conv_BitwiseXor, 18}},
      {"BitwiseNot", {conv_BitwiseNot, 18}}, {"Col2Im", {conv_Col2Im, 18}}, {"GroupNormalization", {conv_GroupNormalization, 18}},
      {"Gelu", {conv_Gelu, 20}}, {"CenterCropPad", {conv_CenterCropPad, 18}}, K(Acos), K(Asin), K(Atan),
      {"GridSample", {conv_GridSample, 16}}, {"AffineGrid", {conv_AffineGrid, 20}},
#undef K
#undef K6
  };
  return table;
}

}  // namespace kiln::onnx::detail

namespace kiln::onnx {
std::vector<std::string> supported_op_types() {
  std::vector<std::string> out;
  for (const auto& [k, v] : detail::converters()) out.push_back(k);
  // Control flow folded by the importer itself (importer.cpp fold_if / fold_loop).
  out.push_back("If");
  out.push_back("Loop");
  std::sort(out.begin(), out.end());
  return out;
}
}  // namespace kiln::onnx
