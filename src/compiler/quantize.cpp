// Weight-only quantization pass: constant float32 weights of linear / matmul / convolution /
// embedding nodes become packed int8 or int4 weights with scales (and zeros), read directly by the
// kernels of kiln.weight_quantized_linear / _convolution / _embedding (src/ir/ops/quant.h).
#include <fnmatch.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "ir/op_registry.h"
#include "ir/ops/quant.h"
#include "kiln/compiler.h"

namespace kiln {
namespace {

Error invalid(std::string msg) { return Error(ErrorCode::InvalidArgument, std::move(msg)); }

const float* const_f32(const Graph& g, ValueId id) {
  if (id == kNoValue) return nullptr;
  const Value& v = g.value(id);
  if (!v.constant || v.type.dtype != DType::Float32) return nullptr;
  return reinterpret_cast<const float*>(v.constant->data());
}

bool excluded(const QuantizeOptions& o, const std::string& debug_name, const std::string& weight_name) {
  for (const std::string& p : o.exclude) {
    if (fnmatch(p.c_str(), debug_name.c_str(), 0) == 0 || fnmatch(p.c_str(), weight_name.c_str(), 0) == 0) return true;
  }
  return false;
}

/// Stores `v` as float32 or float16 at index i of `out`, returns the stored value widened back.
double store_scale(std::vector<uint8_t>& out, size_t i, double v, DType dt) {
  if (dt == DType::Float16) {
    const uint16_t h = float_to_half(static_cast<float>(v));
    std::memcpy(out.data() + i * 2, &h, 2);
    return half_to_float(h);
  }
  const float f = static_cast<float>(v);
  std::memcpy(out.data() + i * 4, &f, 4);
  return f;
}

Error check_options(const QuantizeOptions& o) {
  if (o.bits != 4 && o.bits != 8) return invalid("quantize: bits must be 4 or 8, got " + std::to_string(o.bits));
  if (o.bits == 4 && o.group_size < 2) return invalid("quantize: group_size must be >= 2, got " + std::to_string(o.group_size));
  if (o.scale_dtype != DType::Float32 && o.scale_dtype != DType::Float16) {
    return invalid(std::string("quantize: scale dtype must be float32 or float16, got ") + dtype_name(o.scale_dtype));
  }
  if (o.bits == 8 && !o.symmetric) return invalid("quantize: 8-bit quantization is symmetric only");
  if (o.activation_bits != 0 && o.activation_bits != 8) {
    return invalid("quantize: activation_bits must be 0 or 8, got " + std::to_string(o.activation_bits));
  }
  return {};
}

}  // namespace

Error quantize_matrix(const float* w, int64_t rows, int64_t k, const QuantizeOptions& o, std::vector<uint8_t>& packed,
                      std::vector<uint8_t>& scales, std::vector<uint8_t>& zeros) {
  KILN_RETURN_IF_ERROR(check_options(o));
  if (rows < 1 || k < 1) return invalid("quantize: empty weight");
  const int64_t gs = o.bits == 8 ? k : std::min(o.group_size, k);
  const int64_t G = (k + gs - 1) / gs;
  const int64_t row_bytes = o.bits == 8 ? k : (k + 1) / 2;
  const size_t esz = dtype_size(o.scale_dtype);
  packed.assign(static_cast<size_t>(rows * row_bytes), 0);
  scales.assign(static_cast<size_t>(rows * G) * esz, 0);
  zeros.assign(o.bits == 4 && !o.symmetric ? static_cast<size_t>(rows * G) * esz : 0, 0);
  for (int64_t n = 0; n < rows; ++n) {
    const float* wr = w + n * k;
    uint8_t* pr = packed.data() + n * row_bytes;
    for (int64_t g = 0; g < G; ++g) {
      const int64_t c0 = g * gs, c1 = std::min(k, c0 + gs);
      double lo = wr[c0], hi = wr[c0], amax = 0.0;
      for (int64_t c = c0; c < c1; ++c) {
        if (!std::isfinite(wr[c])) {  // its scale would be inf and every value of the group NaN or 0
          return invalid("quantize: weight element [" + std::to_string(n) + ", " + std::to_string(c) + "] is " +
                         (std::isnan(wr[c]) ? "nan" : "inf") + "; a non-finite weight cannot be quantized");
        }
        lo = std::min(lo, static_cast<double>(wr[c]));
        hi = std::max(hi, static_cast<double>(wr[c]));
        amax = std::max(amax, std::fabs(static_cast<double>(wr[c])));
      }
      const size_t si = static_cast<size_t>(n * G + g);
      if (o.scale_dtype == DType::Float16) {  // the scale (and zero) as stored must stay finite
        const double sv = o.bits == 8 ? amax / 127.0 : o.symmetric ? amax / 7.0 : (hi - lo) / 15.0;
        const double zv = o.bits == 4 && !o.symmetric ? std::fabs(lo) + 8.0 * sv : 0.0;
        if (std::max(sv, zv) > 65504.0) {
          return invalid("quantize: weight row " + std::to_string(n) + " has values up to " + std::to_string(amax) +
                         " in magnitude; their scale overflows float16 (use float32 scales)");
        }
      }
      if (o.bits == 8) {
        const double s = store_scale(scales, si, amax / 127.0, o.scale_dtype);
        for (int64_t c = c0; c < c1; ++c) {
          const double q = s > 0 ? std::clamp(std::nearbyint(wr[c] / s), -127.0, 127.0) : 0.0;
          pr[c] = static_cast<uint8_t>(static_cast<int8_t>(q));
        }
        continue;
      }
      double s, z = 0.0;
      if (o.symmetric) {
        s = store_scale(scales, si, amax / 7.0, o.scale_dtype);
      } else {
        s = store_scale(scales, si, (hi - lo) / 15.0, o.scale_dtype);
        z = store_scale(zeros, si, lo + 8.0 * s, o.scale_dtype);
      }
      for (int64_t c = c0; c < c1; ++c) {
        const double u = s > 0 ? std::clamp(std::nearbyint((wr[c] - z) / s) + 8.0, 0.0, 15.0) : 8.0;
        pr[c >> 1] |= static_cast<uint8_t>(static_cast<int>(u) << ((c & 1) * 4));
      }
    }
  }
  return {};
}

Result<size_t> quantize_weights(Graph& graph, const QuantizeOptions& o) {
  KILN_RETURN_IF_ERROR(check_options(o));
  const OpRegistry& reg = OpRegistry::get();
  struct Quantized {
    ValueId weight, scales, zeros;
  };
  std::map<std::pair<ValueId, bool>, Quantized> done;  // (weight, transposed) -> constants
  size_t count = 0;
  for (size_t i = 0; i < graph.nodes().size(); ++i) {
    const Node n = graph.nodes()[i];
    if (n.delegate || n.outputs.size() != 1) continue;
    ValueId x = kNoValue, wid = kNoValue, bias = kNoValue;
    bool transpose = false, conv = false, embedding = false;
    if (n.op == "aten.embedding" && n.inputs.size() == 2) {
      if (!o.embeddings) continue;
      // The table [V, D] quantized row by row as a linear weight [N = V, K = D]: an output
      // projection tied to it (the same constant) reuses the quantized constants below.
      wid = n.inputs[0], x = n.inputs[1], embedding = true;
    } else if (n.op == "aten.linear" && n.inputs.size() == 3) {
      x = n.inputs[0], wid = n.inputs[1], bias = n.inputs[2];
    } else if (n.op == "aten.mm" && n.inputs.size() == 2) {
      x = n.inputs[0], wid = n.inputs[1], transpose = true;
    } else if (n.op == "aten.addmm" && n.inputs.size() == 3 && n.attrs.get_float("alpha", 1.0) == 1.0 &&
               n.attrs.get_float("beta", 1.0) == 1.0) {
      x = n.inputs[1], wid = n.inputs[2], bias = n.inputs[0], transpose = true;
    } else if (n.op == "aten.convolution" && n.inputs.size() == 3 && !n.attrs.get_bool("transposed")) {
      x = n.inputs[0], wid = n.inputs[1], bias = n.inputs[2], conv = true;
    } else {
      continue;
    }
    const float* w = const_f32(graph, wid);
    if (w == nullptr) continue;
    const TensorType wt = graph.value(wid).type;
    if ((conv && wt.dim() != 4) || (!conv && wt.dim() != 2)) continue;
    if (bias != kNoValue) {
      const TensorType& bt = graph.value(bias).type;
      const int64_t nout = transpose ? wt.sizes[1] : wt.sizes[0];
      if (bt.dtype != DType::Float32 || bt.sizes != std::vector<int64_t>{nout}) continue;
    }
    if (excluded(o, n.debug_name, graph.value(wid).name)) continue;
    const int64_t rows = transpose ? wt.sizes[1] : wt.sizes[0];
    const int64_t k = wt.numel() / std::max<int64_t>(rows, 1);
    if (rows < 1 || k < 1) continue;

    auto it = done.find({wid, transpose});
    if (it == done.end()) {
      std::vector<float> tmp;
      const float* src = w;
      if (transpose) {  // [K, N] -> [N, K]
        tmp.resize(static_cast<size_t>(rows * k));
        for (int64_t p = 0; p < k; ++p) {
          for (int64_t j = 0; j < rows; ++j) tmp[static_cast<size_t>(j * k + p)] = w[p * rows + j];
        }
        src = tmp.data();
      }
      std::vector<uint8_t> packed, scales, zeros;
      if (Error e = quantize_matrix(src, rows, k, o, packed, scales, zeros); !e.ok()) {
        const std::string& wname = graph.value(wid).name;
        return Error(e.code(), e.message() + " (weight '" + (wname.empty() ? n.debug_name : wname) + "' of node '" +
                                   n.debug_name + "'; exclude the layer from quantization)");
      }
      const int64_t gs = o.bits == 8 ? k : std::min(o.group_size, k);
      const int64_t G = (k + gs - 1) / gs;
      const std::string base = graph.value(wid).name.empty() ? n.debug_name : graph.value(wid).name;
      const std::string tag = o.bits == 8 ? "(int8)" : "(int4 g" + std::to_string(gs) + ")";
      auto qw = graph.add_constant(base + tag, {o.bits == 8 ? DType::Int8 : DType::UInt8, {rows, o.bits == 8 ? k : (k + 1) / 2}},
                                   std::move(packed));
      if (!qw.ok()) return qw.error();
      auto qs = graph.add_constant(base + ".scales", {o.scale_dtype, {rows, G}}, std::move(scales));
      if (!qs.ok()) return qs.error();
      ValueId qz = kNoValue;
      if (!zeros.empty()) {
        auto z = graph.add_constant(base + ".zeros", {o.scale_dtype, {rows, G}}, std::move(zeros));
        if (!z.ok()) return z.error();
        qz = z.value();
      }
      it = done.emplace(std::make_pair(wid, transpose), Quantized{qw.value(), qs.value(), qz}).first;
    }
    Node q;
    q.op = conv ? "kiln.weight_quantized_convolution"
                : (embedding ? "kiln.weight_quantized_embedding" : "kiln.weight_quantized_linear");
    q.inputs = {x, it->second.weight, it->second.scales, it->second.zeros};
    if (!embedding) q.inputs.push_back(bias);
    q.outputs = n.outputs;
    q.debug_name = n.debug_name;
    Attributes given{{"bits", int64_t{o.bits}}, {"group_size", int64_t{o.bits == 8 ? 0 : o.group_size}}};
    if (embedding) given.set("embedding_dim", k);
    if (!embedding && !conv && o.activation_bits == 8) {
      const int64_t gs = o.bits == 8 ? k : std::min(o.group_size, k);
      if (k % kActivationBlock == 0 && gs % kActivationBlock == 0) given.set("activation_bits", int64_t{8});
    }
    if (conv) {
      given.set("kernel_size", std::vector<int64_t>{wt.sizes[2], wt.sizes[3]});
      for (const char* a : {"stride", "padding", "dilation"}) given.set(a, n.attrs.get_ints(a));
      given.set("groups", n.attrs.get_int("groups", 1));
    }
    const OpDef* def = reg.find(q.op);
    auto attrs = def->normalize_attributes(given);
    if (!attrs.ok()) return attrs.error();
    q.attrs = std::move(attrs).value();
    // The replacement must produce exactly the original output type; otherwise leave the node.
    std::vector<const TensorType*> types;
    TensorType none;
    for (ValueId id : q.inputs) types.push_back(id == kNoValue ? nullptr : &graph.value(id).type);
    auto out = def->infer_types(types, q.attrs);
    if (!out.ok() || out->size() != 1 || (*out)[0] != graph.value(n.outputs[0]).type) continue;
    graph.mutable_nodes()[i] = std::move(q);
    ++count;
  }
  return count;
}

}  // namespace kiln
