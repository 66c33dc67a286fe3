// The xnnpack delegate: lowers float32 subgraphs of Kiln ops to XNNPACK's subgraph API (Debian
// libxnnpack-dev, 2022 snapshot: /usr/include/xnnpack.h) and runs them.
//
// Layout: Kiln tensors are contiguous NCHW; XNNPACK's 2-D operators take NHWC. Every rank-4 value
// is NHWC inside the delegate: rank-4 boundary inputs are transposed NCHW->NHWC before each run,
// rank-4 outputs NHWC->NCHW after it, and rank-4 constants (conv weights OIHW, 4-D operands of
// add/mul) are permuted (0, 2, 3, 1) once at init (OIHW -> OHWI, XNNPACK's filter layout). The
// payload records this per boundary value and constant (layout byte 1 = "NCHW outside").
//
// Payload (little-endian u32 words; floats as their bit patterns):
//   'KXN1', num_inputs, num_outputs, num_constants,
//   per input/constant: layout (0 as is, 1 NCHW outside / NHWC inside),
//   per constant: rank, dims (Kiln order),
//   num_nodes, per node: opcode, num_inputs, input ids, num_params, params
//   (each node defines the next value id), then num_outputs value ids.
// Value ids: [0, inputs) method inputs, then constants, then one per node.
// init re-infers every value's shape from the boundary types and the params (the same formulas
// XNNPACK's operators use), so an inconsistent or hostile payload is rejected before XNNPACK
// sees it; outputs must match the program's types exactly.
//
// Lowered ops: convolution (2-D, not transposed), relu/hardtanh/clamp, hardswish, hardsigmoid,
// sigmoid, silu, leaky_relu, add/sub (alpha 1)/mul/div (true division), mean over H, W and
// adaptive/avg/max pooling (a 1x1 window as a copy or an exact 1x1 depthwise subsample),
// linear/addmm (input rank 1-3, 5, 6), view, _softmax over the innermost (XNNPACK-order) dim,
// constant_pad_nd (no cropping) and inference batch norm with constant statistics. Anything else,
// or an attribute value XNNPACK cannot honour, is declined with the reason.
//
// Support is decided by building (docs/delegation.md "Support decided by building"): support()
// lowers the node alone with lower_subgraph, the function lower() runs, and then, when XNNPACK
// initializes on this machine, builds that one-node payload with build_runtime, the function
// init() runs (decode, define the XNNPACK subgraph, xnn_create_runtime_v2). check_build() builds
// each whole lowered segment the same way and names the Kiln node XNNPACK refused (through the
// Lowering's origin table: payload node -> position in Subgraph::nodes). When XNNPACK is not
// available at compile time (KILN_XNNPACK_DISABLE, an unsupported CPU) the lowering's own checks
// of XNNPACK's limits decide alone: every value of rank <= XNN_MAX_TENSOR_DIMS, clamp bounds
// min < max, no 1x1 pooling window, ... (the table in docs/delegation.md, found by defining each
// node of the installed XNNPACK at every rank and at edge attribute values).
#include <xnnpack.h>
#include <pthreadpool.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>

#include "backends/backend.h"

namespace kiln {
namespace {

constexpr uint32_t kMagic = 0x314E584Bu;  // "KXN1"
constexpr uint32_t kNone = 0xFFFFFFFFu;
constexpr float kInf = std::numeric_limits<float>::infinity();
// XNNPACK's kernels may read up to XNN_EXTRA_BYTES past the end of an operand (xnnpack.h).
constexpr size_t kPadFloats = XNN_EXTRA_BYTES / sizeof(float);

enum Op : uint32_t {
  kLiteral = 0,   // params: rank, dims..., then numel floats (rank may be 0)
  kConv = 1,      // in: x, w, b; params: pad_h, pad_w, kh, kw, sh, sw, dh, dw, groups
  kClamp = 2,     // in: x; params: min, max (float bits)
  kHardswish = 3, // in: x
  kAdd = 4,       // in: a, b
  kMul = 5,       // in: a, b
  kGlobalAvg = 6, // in: x (NHWC) -> [N, 1, 1, C]
  kMaxPool = 7,   // in: x; params: kh, kw, sh, sw, pt, pl, pb, pr, dh, dw
  kAvgPool = 8,   // in: x; params: kh, kw, sh, sw (no padding)
  kFullyConnected = 9,  // in: x, w, b (b may be kNone); params: transpose_weights
  kReshape = 10,  // in: x; params: rank, dims (XNNPACK order)
  kSigmoid = 11,  // in: x
  kSub = 12,      // in: a, b
  kDiv = 13,      // in: a, b
  kLeakyRelu = 14,  // in: x; params: negative_slope (float bits)
  kSoftmax = 15,  // in: x; softmax over the last dim (XNNPACK order)
  kPad = 16,      // in: x; params: rank, pre[rank], post[rank], value (float bits), XNNPACK order
  kNumOps
};

Error unsupported(const std::string& why) { return Error(ErrorCode::NotSupported, why); }

uint32_t fbits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float bitsf(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// NCHW sizes -> the sizes XNNPACK sees (NHWC for rank 4).
std::vector<int64_t> to_xnn(const std::vector<int64_t>& s) {
  if (s.size() != 4) return s;
  return {s[0], s[2], s[3], s[1]};
}

// ---------------------------------------------------------------- compile half

struct PayloadNode {
  uint32_t op;
  std::vector<uint32_t> in, params;
};

// KILN_XNNPACK_STATIC_CHECKS=0 skips the lowering's checks of XNNPACK's limits (rank, clamp
// bounds), so that tests can show that building alone declines the same nodes. Never needed
// otherwise: the checks are copies of what XNNPACK refuses.
bool static_checks() {
  const char* v = std::getenv("KILN_XNNPACK_STATIC_CHECKS");
  return v == nullptr || std::string(v) != "0";
}

class Lowering {
 public:
  Lowering(const Graph& g, const Subgraph& sg, bool checks) : g_(g), sg_(sg), checks_(checks) {
    for (ValueId v : sg.inputs) ids_[v] = next_++;
    for (ValueId v : sg.constants) ids_[v] = next_++;
  }

  /// The position in Subgraph::nodes of the node being lowered: every payload node emitted from
  /// now on (literals and decompositions included) is attributed to it in origin().
  void at(size_t position) { position_ = position; }
  /// Per payload node, the position in Subgraph::nodes of the Kiln node it was lowered from.
  const std::vector<size_t>& origin() const { return origin_; }

  // XNNPACK defines no value of more than XNN_MAX_TENSOR_DIMS dims (xnn_define_tensor_value returns
  // xnn_status_unsupported_parameter). Every value a node reads or defines has its Kiln rank inside
  // the delegate (NHWC keeps the rank), and the literals and reshapes a lowering adds are of the
  // rank of one of them or less.
  Error ranks(const Node& n) const {
    if (!checks_) return {};
    auto check = [&](ValueId v, const char* what) -> Error {
      if (v == kNoValue) return {};
      const int64_t r = g_.value(v).type.dim();
      if (r <= static_cast<int64_t>(XNN_MAX_TENSOR_DIMS)) return {};
      return unsupported(std::string(what) + " of rank " + std::to_string(r) + ": rank " + std::to_string(r) +
                         " exceeds XNNPACK's limit of " + std::to_string(XNN_MAX_TENSOR_DIMS) +
                         " dims (XNN_MAX_TENSOR_DIMS; xnn_define_tensor_value returns xnn_status_unsupported_parameter)");
    };
    for (ValueId v : n.inputs) {
      if (v != kNoValue) KILN_RETURN_IF_ERROR(check(v, g_.value(v).constant ? "a constant operand" : "an input"));
    }
    for (ValueId v : n.outputs) KILN_RETURN_IF_ERROR(check(v, "the output"));
    return {};
  }

  Error node(const Node& n) {
    for (ValueId v : n.inputs) {
      if (v != kNoValue && g_.value(v).type.dtype != DType::Float32) {
        return unsupported("input " + g_.value(v).type.to_string() + " is not float32 (the xnnpack delegate is float32 only)");
      }
    }
    for (ValueId v : n.outputs) {
      if (g_.value(v).type.dtype != DType::Float32) return unsupported("output is not float32");
    }
    const std::string& op = n.op;
    const Attributes& a = n.attrs;
    if (op == "aten.convolution") return conv(n);
    if (op == "aten.relu") return emit(n, kClamp, {in(n, 0)}, {fbits(0.0f), fbits(kInf)});
    if (op == "aten.hardtanh") {
      return clamp(n, static_cast<float>(a.get_float("min_val")), static_cast<float>(a.get_float("max_val")));
    }
    if (op == "aten.clamp") {
      return clamp(n, a.is_none("min") ? -kInf : static_cast<float>(a.get_float("min")),
                   a.is_none("max") ? kInf : static_cast<float>(a.get_float("max")));
    }
    if (op == "aten.hardswish") return emit(n, kHardswish, {in(n, 0)}, {});
    if (op == "aten.hardsigmoid") return hardsigmoid(n);
    if (op == "aten.add" || op == "aten.mul" || op == "aten.sub" || op == "aten.div") return binary(n);
    if (op == "aten.sigmoid") return emit(n, kSigmoid, {in(n, 0)}, {});
    if (op == "aten.silu") return silu(n);
    if (op == "aten.leaky_relu") {
      const double slope = a.get_float("negative_slope", 0.01);
      if (!std::isfinite(slope)) return unsupported("non-finite negative_slope");
      return emit(n, kLeakyRelu, {in(n, 0)}, {fbits(static_cast<float>(slope))});
    }
    if (op == "aten._softmax") return softmax(n);
    if (op == "aten.constant_pad_nd") return constant_pad(n);
    if (op == "aten.native_batch_norm") return batch_norm(n);
    if (op == "aten.permute" || op == "aten.transpose" || op == "aten.cat") {
      return unsupported("op " + op + " has no xnnpack lowering (Debian's 2022 XNNPACK has no static transpose or "
                         "concatenate node in its subgraph API)");
    }
    if (op == "aten.mean") return mean(n);
    if (op == "aten.adaptive_avg_pool2d") return adaptive_avg(n);
    if (op == "aten.max_pool2d") return max_pool(n);
    if (op == "aten.avg_pool2d") return avg_pool(n);
    if (op == "aten.linear") return linear(n);
    if (op == "aten.addmm") return addmm(n);
    if (op == "aten.view") return view(n);
    return unsupported("op " + op + " has no xnnpack lowering");
  }

  Result<std::vector<uint8_t>> finish() {
    std::vector<uint32_t> w = {kMagic, static_cast<uint32_t>(sg_.inputs.size()),
                               static_cast<uint32_t>(sg_.outputs.size()), static_cast<uint32_t>(sg_.constants.size())};
    for (ValueId v : sg_.inputs) w.push_back(g_.value(v).type.dim() == 4 ? 1 : 0);
    for (ValueId v : sg_.constants) w.push_back(g_.value(v).type.dim() == 4 ? 1 : 0);
    for (ValueId v : sg_.constants) {
      const auto& s = g_.value(v).type.sizes;
      w.push_back(static_cast<uint32_t>(s.size()));
      for (int64_t d : s) w.push_back(static_cast<uint32_t>(d));
    }
    w.push_back(static_cast<uint32_t>(nodes_.size()));
    for (const PayloadNode& pn : nodes_) {
      w.push_back(pn.op);
      w.push_back(static_cast<uint32_t>(pn.in.size()));
      w.insert(w.end(), pn.in.begin(), pn.in.end());
      w.push_back(static_cast<uint32_t>(pn.params.size()));
      w.insert(w.end(), pn.params.begin(), pn.params.end());
    }
    for (ValueId v : sg_.outputs) {
      auto it = ids_.find(v);
      if (it == ids_.end()) return Error(ErrorCode::Internal, "xnnpack: subgraph output not produced");
      w.push_back(it->second);
    }
    std::vector<uint8_t> bytes(w.size() * 4);
    std::memcpy(bytes.data(), w.data(), bytes.size());
    return bytes;
  }

 private:
  uint32_t in(const Node& n, size_t i) const {
    const ValueId v = n.inputs[i];
    if (v == kNoValue) return kNone;
    auto it = ids_.find(v);
    return it == ids_.end() ? kNone : it->second;
  }
  bool is_const(const Node& n, size_t i) const {
    return n.inputs[i] != kNoValue && g_.value(n.inputs[i]).constant != nullptr;
  }
  const TensorType& type(const Node& n, size_t i) const { return g_.value(n.inputs[i]).type; }
  const TensorType& out_type(const Node& n) const { return g_.value(n.outputs[0]).type; }

  uint32_t add_node(uint32_t op, std::vector<uint32_t> ins, std::vector<uint32_t> params) {
    nodes_.push_back({op, std::move(ins), std::move(params)});
    origin_.push_back(position_);
    return next_++;
  }
  // `required`: how many leading inputs must be present (the rest may be kNone: an absent bias).
  Error emit(const Node& n, uint32_t op, std::vector<uint32_t> ins, std::vector<uint32_t> params,
             size_t required = SIZE_MAX) {
    for (size_t i = 0; i < ins.size() && i < required; ++i) {
      if (ins[i] == kNone) return Error(ErrorCode::Internal, "xnnpack: input of " + n.op + " not in the subgraph");
    }
    ids_[n.outputs[0]] = add_node(op, std::move(ins), std::move(params));
    return {};
  }
  uint32_t literal(size_t rank, float value) {
    std::vector<uint32_t> p = {static_cast<uint32_t>(rank)};
    for (size_t i = 0; i < rank; ++i) p.push_back(1);
    p.push_back(fbits(value));
    return add_node(kLiteral, {}, std::move(p));
  }

  // clamp/hardtanh with float32 bounds: XNNPACK's clamp operator requires min < max, neither NaN
  // (xnn_define_clamp accepts any bounds; xnn_create_runtime_v2 then returns
  // xnn_status_invalid_parameter). The bounds are compared after rounding to float32.
  Error clamp(const Node& n, float lo, float hi) {
    if (checks_ && !(lo < hi)) {
      std::ostringstream os;
      os << n.op << " bounds [" << lo << ", " << hi << "] in float32: XNNPACK's clamp requires min < max, neither NaN"
         << " (xnn_create_runtime_v2 returns xnn_status_invalid_parameter)";
      if (lo > hi) os << "; PyTorch then returns max everywhere";
      return unsupported(os.str());
    }
    return emit(n, kClamp, {in(n, 0)}, {fbits(lo), fbits(hi)});
  }

  Error conv(const Node& n) {
    const Attributes& a = n.attrs;
    if (a.get_bool("transposed")) return unsupported("transposed convolution is not lowered");
    if (type(n, 0).dim() != 4) return unsupported("only 2-D convolution (rank-4 input) is lowered");
    if (!is_const(n, 1)) return unsupported("weight is not a constant");
    if (n.inputs[2] != kNoValue && !is_const(n, 2)) return unsupported("bias is not a constant");
    const auto stride = a.get_ints("stride"), pad = a.get_ints("padding"), dil = a.get_ints("dilation");
    const auto& w = type(n, 1).sizes;
    auto two = [](const std::vector<int64_t>& v, size_t i) { return v.size() == 1 ? v[0] : v[i]; };
    if (stride.empty() || pad.empty() || dil.empty()) return unsupported("empty stride/padding/dilation");
    const int64_t groups = a.get_int("groups", 1);
    uint32_t bias = in(n, 2);
    if (bias == kNone) {
      // XNNPACK's convolution takes a bias: a zero literal of [C_out].
      std::vector<uint32_t> p = {1, static_cast<uint32_t>(w[0])};
      for (int64_t i = 0; i < w[0]; ++i) p.push_back(fbits(0.0f));
      bias = add_node(kLiteral, {}, std::move(p));
    }
    return emit(n, kConv, {in(n, 0), in(n, 1), bias},
                {static_cast<uint32_t>(two(pad, 0)), static_cast<uint32_t>(two(pad, 1)), static_cast<uint32_t>(w[2]),
                 static_cast<uint32_t>(w[3]), static_cast<uint32_t>(two(stride, 0)), static_cast<uint32_t>(two(stride, 1)),
                 static_cast<uint32_t>(two(dil, 0)), static_cast<uint32_t>(two(dil, 1)), static_cast<uint32_t>(groups)});
  }

  // add / mul / sub / div with NumPy broadcasting. alpha (add, sub) must be 1: XNNPACK has no scale
  // on the second input. div: true division only (rounding_mode None).
  Error binary(const Node& n) {
    const std::string& op = n.op;
    const Attributes& a = n.attrs;
    if ((op == "aten.add" || op == "aten.sub") && a.get_float("alpha", 1.0) != 1.0) {
      std::ostringstream os;
      os << "alpha=" << a.get_float("alpha") << " is not supported (XNNPACK's " << (op == "aten.add" ? "add" : "subtract")
         << " has no scale on the second input)";
      return unsupported(os.str());
    }
    if (op == "aten.div" && !a.is_none("rounding_mode")) {
      return unsupported("rounding_mode='" + a.get_string("rounding_mode") + "' is not supported (XNNPACK divides exactly)");
    }
    const auto& ta = g_.value(n.inputs[0]).type;
    const auto& tb = g_.value(n.inputs[1]).type;
    // A one-element operand broadcasts the same against NCHW and NHWC (a scalar constant from an
    // ONNX HardSigmoid/Clip decomposition, say); any other rank mismatch with a rank-4 tensor would
    // need NCHW broadcasting rules inside the NHWC delegate.
    const bool one_element = ta.numel() == 1 || tb.numel() == 1;
    if ((ta.dim() == 4 || tb.dim() == 4) && ta.dim() != tb.dim() && !one_element) {
      return unsupported("broadcasting a rank-4 tensor against rank " + std::to_string(std::min(ta.dim(), tb.dim())) +
                         " would need NCHW broadcasting inside the NHWC delegate");
    }
    const uint32_t code = op == "aten.add" ? kAdd : op == "aten.mul" ? kMul : op == "aten.sub" ? kSub : kDiv;
    return emit(n, code, {in(n, 0), in(n, 1)}, {});
  }

  // silu(x) = x * sigmoid(x) (PyTorch torch.nn.functional.silu).
  Error silu(const Node& n) {
    const uint32_t x = in(n, 0);
    if (x == kNone) return Error(ErrorCode::Internal, "xnnpack: input not in subgraph");
    const uint32_t sg = add_node(kSigmoid, {x}, {});
    ids_[n.outputs[0]] = add_node(kMul, {x, sg}, {});
    return {};
  }

  // Softmax over the innermost dim of the delegate's layout: the last dim for rank != 4, the
  // channels (dim 1) for rank 4 (NHWC inside).
  Error softmax(const Node& n) {
    const int64_t r = type(n, 0).dim();
    if (n.attrs.get_bool("half_to_float")) return unsupported("half_to_float=True");
    if (r < 1) return unsupported("softmax of a 0-d tensor is not lowered");
    int64_t d = n.attrs.get_int("dim");
    if (d < 0) d += r;
    const int64_t inner = r == 4 ? 1 : r - 1;
    if (d != inner) {
      return unsupported("softmax over dim " + std::to_string(d) + " of a rank-" + std::to_string(r) +
                         " tensor: XNNPACK normalizes over the innermost dim only (" +
                         (r == 4 ? std::string("dim 1, channels, in the NHWC delegate)") : "the last dim)"));
    }
    return emit(n, kSoftmax, {in(n, 0)}, {});
  }

  // constant_pad_nd: pad = (before, after) pairs from the last dim backwards; negative pads
  // (cropping) are declined. Rank 1-6 (Lowering::ranks checks the upper limit).
  Error constant_pad(const Node& n) {
    const auto& s = type(n, 0).sizes;
    const size_t r = s.size();
    const auto pad = n.attrs.get_ints("pad");
    if (r < 1) return unsupported("constant_pad_nd of a 0-d tensor is not lowered");
    if (pad.size() % 2 != 0 || pad.size() / 2 > r) return unsupported("pad list of odd length or longer than 2 * rank");
    std::vector<int64_t> pre(r, 0), post(r, 0);
    for (size_t i = 0; i < pad.size() / 2; ++i) {
      if (pad[2 * i] < 0 || pad[2 * i + 1] < 0) return unsupported("negative padding (cropping) is not lowered");
      if (pad[2 * i] > (1 << 16) || pad[2 * i + 1] > (1 << 16)) return unsupported("padding larger than 65536");
      pre[r - 1 - i] = pad[2 * i];
      post[r - 1 - i] = pad[2 * i + 1];
    }
    const auto xpre = to_xnn(pre), xpost = to_xnn(post);
    std::vector<uint32_t> p = {static_cast<uint32_t>(r)};
    for (int64_t v : xpre) p.push_back(static_cast<uint32_t>(v));
    for (int64_t v : xpost) p.push_back(static_cast<uint32_t>(v));
    p.push_back(fbits(static_cast<float>(n.attrs.get_float("value", 0.0))));
    return emit(n, kPad, {in(n, 0)}, std::move(p));
  }

  // An inference batch norm that was not folded into a convolution (e.g. after an add): with
  // constant statistics it is y = x * scale[c] + shift[c], scale = weight / sqrt(var + eps),
  // shift = bias - mean * scale (PyTorch aten/src/ATen/native/Normalization.cpp), two broadcast
  // operators on per-channel literals (computed in double, rounded to float32).
  Error batch_norm(const Node& n) {
    if (n.attrs.get_bool("training")) return unsupported("training=True (batch statistics)");
    const auto& s = type(n, 0).sizes;
    const size_t r = s.size();
    if (r < 2 || r > 4) return unsupported("batch norm is lowered for rank 2-4 only");
    for (size_t i = 1; i < 5; ++i) {
      if (n.inputs[i] != kNoValue && !is_const(n, i)) return unsupported("weight, bias and running statistics must be constants");
    }
    if (n.inputs[3] == kNoValue || n.inputs[4] == kNoValue) return unsupported("running statistics are missing");
    auto data = [&](size_t i) -> const float* {
      return n.inputs[i] == kNoValue ? nullptr : reinterpret_cast<const float*>(g_.value(n.inputs[i]).constant->data());
    };
    const float *w = data(1), *b = data(2), *mean = data(3), *var = data(4);
    const int64_t c = s[1];
    const double eps = n.attrs.get_float("eps", 1e-5);
    // Literal dims in XNNPACK order: the channel dim is last for rank 4 (NHWC), dim 1 otherwise.
    std::vector<uint32_t> dims(r, 1);
    dims[r == 4 ? 3 : 1] = static_cast<uint32_t>(c);
    // (x - mean) * scale + bias, scale = weight / sqrt(var + eps): centred first, so that a mean
    // large against the spread does not cancel (the folded x * scale + (bias - mean * scale) loses
    // the spread's digits when |mean * scale| >> |output|; docs/numerics.md).
    std::vector<uint32_t> header = {static_cast<uint32_t>(r)};
    header.insert(header.end(), dims.begin(), dims.end());
    std::vector<uint32_t> pm = header, ps = header, pb = header;
    bool any_bias = false;
    for (int64_t k = 0; k < c; ++k) {
      const double scale = (w ? static_cast<double>(w[k]) : 1.0) / std::sqrt(static_cast<double>(var[k]) + eps);
      pm.push_back(fbits(mean[k]));
      ps.push_back(fbits(static_cast<float>(scale)));
      pb.push_back(fbits(b ? b[k] : 0.0f));
      any_bias = any_bias || (b && b[k] != 0.0f);
    }
    const uint32_t x = in(n, 0);
    if (x == kNone) return Error(ErrorCode::Internal, "xnnpack: input not in subgraph");
    const uint32_t centred = add_node(kSub, {x, add_node(kLiteral, {}, std::move(pm))}, {});
    const uint32_t scaled = add_node(kMul, {centred, add_node(kLiteral, {}, std::move(ps))}, {});
    ids_[n.outputs[0]] = any_bias ? add_node(kAdd, {scaled, add_node(kLiteral, {}, std::move(pb))}, {}) : scaled;
    return {};
  }

  // hardsigmoid(x) = relu6(x + 3) / 6 (PyTorch aten/src/ATen/native/cpu/Activation.cpp): add,
  // clamp [0, 6], multiply by 1/6 (XNNPACK 2022 has no hardsigmoid operator).
  Error hardsigmoid(const Node& n) {
    const size_t rank = static_cast<size_t>(type(n, 0).dim());
    const uint32_t x = in(n, 0);
    if (x == kNone) return Error(ErrorCode::Internal, "xnnpack: input not in subgraph");
    const uint32_t three = literal(rank, 3.0f);
    const uint32_t s = add_node(kAdd, {x, three}, {});
    const uint32_t c = add_node(kClamp, {s}, {fbits(0.0f), fbits(6.0f)});
    const uint32_t sixth = literal(rank, 1.0f / 6.0f);
    ids_[n.outputs[0]] = add_node(kMul, {c, sixth}, {});
    return {};
  }

  Error global_avg(const Node& n, bool keepdim) {
    const auto& s = type(n, 0).sizes;
    const uint32_t gap = add_node(kGlobalAvg, {in(n, 0)}, {});
    if (keepdim) {
      ids_[n.outputs[0]] = gap;
    } else {
      ids_[n.outputs[0]] = add_node(kReshape, {gap}, {2, static_cast<uint32_t>(s[0]), static_cast<uint32_t>(s[1])});
    }
    return {};
  }
  Error mean(const Node& n) {
    if (type(n, 0).dim() != 4) return unsupported("mean is lowered only over H, W of a rank-4 tensor");
    auto dims = n.attrs.get_ints("dim");
    for (auto& d : dims) d = d < 0 ? d + 4 : d;
    std::sort(dims.begin(), dims.end());
    if (dims != std::vector<int64_t>{2, 3}) return unsupported("mean is lowered only over dims (2, 3) (global average pooling)");
    return global_avg(n, n.attrs.get_bool("keepdim"));
  }
  Error adaptive_avg(const Node& n) {
    if (type(n, 0).dim() != 4) return unsupported("adaptive_avg_pool2d is lowered only for rank-4 input");
    const auto os = n.attrs.get_ints("output_size");
    const auto& s = type(n, 0).sizes;
    if (os == std::vector<int64_t>{1, 1}) return global_avg(n, true);
    if (os.size() != 2 || os[0] <= 0 || os[1] <= 0 || s[2] % os[0] != 0 || s[3] % os[1] != 0) {
      return unsupported("adaptive_avg_pool2d is lowered only for output 1x1 or an input size divisible by the output size");
    }
    const uint32_t kh = static_cast<uint32_t>(s[2] / os[0]), kw = static_cast<uint32_t>(s[3] / os[1]);
    if (kh * kw == 1) return pool_1x1(n, 1, 1);
    return emit(n, kAvgPool, {in(n, 0)}, {kh, kw, kh, kw});
  }
  // A 1x1 pooling window (average or max of one element): XNNPACK's pooling nodes reject it
  // (xnn_define_average_pooling_2d / xnn_define_max_pooling_2d return
  // xnn_status_invalid_parameter), so it is lowered as what it is, a strided subsample
  // y[n, c, i, j] = x[n, c, i * sh, j * sw]: a copy (a reshape to the same shape) for stride 1,
  // otherwise a 1x1 depthwise convolution with weights 1 and bias 0, which is exact (x * 1 + 0;
  // only -0 becomes +0). `n`'s output size must be the floor formula's (no padding).
  Error pool_1x1(const Node& n, int64_t sh, int64_t sw) {
    const auto& x = type(n, 0).sizes;
    const auto& y = out_type(n).sizes;
    if (sh < 1 || sw < 1 || y[2] != (x[2] - 1) / sh + 1 || y[3] != (x[3] - 1) / sw + 1) {
      return unsupported("1x1 pooling with padding or an output size other than floor((H - 1) / stride) + 1");
    }
    if (sh == 1 && sw == 1) {
      const auto xs = to_xnn(y);
      std::vector<uint32_t> p = {4};
      for (int64_t d : xs) p.push_back(static_cast<uint32_t>(d));
      return emit(n, kReshape, {in(n, 0)}, std::move(p));
    }
    const uint32_t c = static_cast<uint32_t>(x[1]);
    std::vector<uint32_t> w = {4, c, 1, 1, 1}, b = {1, c};
    w.insert(w.end(), c, fbits(1.0f));
    b.insert(b.end(), c, fbits(0.0f));
    const uint32_t x_id = in(n, 0);
    if (x_id == kNone) return Error(ErrorCode::Internal, "xnnpack: input not in subgraph");
    const uint32_t wid = add_node(kLiteral, {}, std::move(w));
    const uint32_t bid = add_node(kLiteral, {}, std::move(b));
    return emit(n, kConv, {x_id, wid, bid},
                {0, 0, 1, 1, static_cast<uint32_t>(sh), static_cast<uint32_t>(sw), 1, 1, c});
  }
  Error max_pool(const Node& n) {
    if (type(n, 0).dim() != 4) return unsupported("max_pool2d is lowered only for rank-4 input");
    const auto k = n.attrs.get_ints("kernel_size"), st0 = n.attrs.get_ints("stride"), p = n.attrs.get_ints("padding"),
               d = n.attrs.get_ints("dilation");
    auto two = [](const std::vector<int64_t>& v, size_t i) { return v.size() == 1 ? v[0] : v[i]; };
    const auto st = st0.empty() ? k : st0;
    const auto& in_s = type(n, 0).sizes;
    const auto& out_s = out_type(n).sizes;
    std::vector<uint32_t> params = {static_cast<uint32_t>(two(k, 0)), static_cast<uint32_t>(two(k, 1)),
                                    static_cast<uint32_t>(two(st, 0)), static_cast<uint32_t>(two(st, 1))};
    // Padding: top/left as given; bottom/right chosen so that XNNPACK's floor formula gives the
    // output size Kiln inferred. With ceil_mode this adds the extra padding PyTorch's ceil rule
    // implies; XNNPACK's max pooling never selects a padding element, like PyTorch's.
    int64_t pad[4];
    for (int i = 0; i < 2; ++i) {
      const int64_t kk = two(k, static_cast<size_t>(i)), ss = two(st, static_cast<size_t>(i)),
                    pp = two(p, static_cast<size_t>(i)), dd = two(d, static_cast<size_t>(i));
      const int64_t eff = (out_s[static_cast<size_t>(2 + i)] - 1) * ss + dd * (kk - 1) + 1;
      const int64_t far = std::max<int64_t>(pp, eff - in_s[static_cast<size_t>(2 + i)] - pp);
      pad[i] = pp;
      pad[2 + i] = far;
    }
    if (two(k, 0) * two(k, 1) == 1) {
      if (pad[0] != 0 || pad[1] != 0) return unsupported("1x1 max pooling with padding");
      return pool_1x1(n, two(st, 0), two(st, 1));
    }
    params.insert(params.end(), {static_cast<uint32_t>(pad[0]), static_cast<uint32_t>(pad[1]),
                                 static_cast<uint32_t>(pad[2]), static_cast<uint32_t>(pad[3]),
                                 static_cast<uint32_t>(two(d, 0)), static_cast<uint32_t>(two(d, 1))});
    return emit(n, kMaxPool, {in(n, 0)}, std::move(params));
  }
  Error avg_pool(const Node& n) {
    const Attributes& a = n.attrs;
    if (type(n, 0).dim() != 4) return unsupported("avg_pool2d is lowered only for rank-4 input");
    const auto p = a.get_ints("padding");
    for (int64_t v : p) {
      if (v != 0) return unsupported("avg_pool2d with padding is not lowered (XNNPACK's divisor rule differs from count_include_pad)");
    }
    if (a.get_bool("ceil_mode")) return unsupported("avg_pool2d ceil_mode is not lowered");
    if (!a.is_none("divisor_override")) return unsupported("avg_pool2d divisor_override is not lowered");
    const auto k = a.get_ints("kernel_size"), st0 = a.get_ints("stride");
    const auto st = st0.empty() ? k : st0;
    auto two = [](const std::vector<int64_t>& v, size_t i) { return v.size() == 1 ? v[0] : v[i]; };
    if (two(k, 0) * two(k, 1) == 1) return pool_1x1(n, two(st, 0), two(st, 1));
    return emit(n, kAvgPool, {in(n, 0)}, {static_cast<uint32_t>(two(k, 0)), static_cast<uint32_t>(two(k, 1)),
                                          static_cast<uint32_t>(two(st, 0)), static_cast<uint32_t>(two(st, 1))});
  }
  Error linear(const Node& n) {
    // XNNPACK's fully connected node takes any rank (1-6); a rank-4 value is NHWC inside the
    // delegate, where Kiln's last dim is not the innermost.
    if (type(n, 0).dim() == 4 || type(n, 0).dim() < 1) {
      return unsupported("linear of a rank-4 input is not lowered (its last dim is not innermost in the NHWC delegate)");
    }
    if (!is_const(n, 1)) return unsupported("weight is not a constant");
    if (n.inputs[2] != kNoValue && !is_const(n, 2)) return unsupported("bias is not a constant");
    return emit(n, kFullyConnected, {in(n, 0), in(n, 1), in(n, 2)}, {0}, 2);
  }
  Error addmm(const Node& n) {
    if (n.attrs.get_float("alpha", 1.0) != 1.0 || n.attrs.get_float("beta", 1.0) != 1.0) {
      return unsupported("addmm with alpha or beta != 1 is not lowered");
    }
    if (!is_const(n, 2)) return unsupported("mat2 is not a constant");
    if (!is_const(n, 0) || type(n, 0).dim() != 1) return unsupported("self (bias) must be a rank-1 constant");
    return emit(n, kFullyConnected, {in(n, 1), in(n, 2), in(n, 0)}, {1});
  }
  Error view(const Node& n) {
    auto spatial = [](const TensorType& t) { return t.dim() == 4 && t.sizes[2] * t.sizes[3] != 1; };
    if (spatial(type(n, 0)) || spatial(out_type(n))) {
      return unsupported("view of a rank-4 tensor with H*W > 1 would need an NCHW transpose inside the NHWC delegate");
    }
    const auto s = to_xnn(out_type(n).sizes);
    std::vector<uint32_t> p = {static_cast<uint32_t>(s.size())};
    for (int64_t d : s) p.push_back(static_cast<uint32_t>(d));
    return emit(n, kReshape, {in(n, 0)}, std::move(p));
  }

  const Graph& g_;
  const Subgraph& sg_;
  const bool checks_;
  std::map<ValueId, uint32_t> ids_;
  std::vector<PayloadNode> nodes_;
  std::vector<size_t> origin_;
  size_t position_ = 0;
  uint32_t next_ = 0;
};

// A lowered subgraph: the payload and, per payload node, the position in Subgraph::nodes of the
// Kiln node it comes from (Lowering::origin).
struct Lowered {
  std::vector<uint8_t> payload;
  std::vector<size_t> origin;
};

// `checks`: run the static checks of XNNPACK's limits (they only ever decline a node; without
// them a subgraph that passes them lowers to the same payload).
Result<Lowered> lower_subgraph(const Subgraph& sg, bool checks = static_checks()) {
  Lowering l(*sg.graph, sg, checks);
  for (size_t pos = 0; pos < sg.nodes.size(); ++pos) {
    const Node& n = sg.graph->nodes()[sg.nodes[pos]];
    if (n.outputs.size() != 1) return unsupported("op " + n.op + " has " + std::to_string(n.outputs.size()) + " outputs");
    // XNNPACK values must be non-empty (init checks the same at the boundary).
    for (ValueId v : n.inputs) {
      if (v != kNoValue && sg.graph->value(v).type.numel() == 0) return unsupported("an input of " + n.op + " is an empty tensor");
    }
    if (sg.graph->value(n.outputs[0]).type.numel() == 0) return unsupported("the output of " + n.op + " is an empty tensor");
    KILN_RETURN_IF_ERROR(l.ranks(n));
    l.at(pos);
    KILN_RETURN_IF_ERROR(l.node(n));
  }
  auto payload = l.finish();
  if (!payload.ok()) return payload.error();
  return Lowered{std::move(payload.value()), l.origin()};
}

// ---------------------------------------------------------------- run half

struct XValue {
  std::vector<size_t> dims;  // XNNPACK order
  const void* data = nullptr;  // constants and literals
  uint32_t external = XNN_INVALID_VALUE_ID;
  uint32_t flags = 0;
};

// A pthreadpool shared by every xnnpack segment that runs with the same thread count. A method
// split into many segments must not own a pool (and its spinning workers) per segment: with 84
// segments at 2 threads that was 84 extra threads and runs 100x slower on 2 cores. `run` serializes
// the segments of concurrently running methods on the pool (one parallel computation at a time).
struct SharedPool {
  pthreadpool_t pool = nullptr;
  std::mutex run;
  ~SharedPool() {
    if (pool) pthreadpool_destroy(pool);
  }
};

// The process's pool of `num_threads` (> 1) threads, created on first use and destroyed with its
// last segment. Null when pthreadpool_create fails.
std::shared_ptr<SharedPool> shared_pool(int num_threads) {
  static std::mutex mu;
  static std::map<int, std::weak_ptr<SharedPool>> pools;
  std::lock_guard<std::mutex> lock(mu);
  std::weak_ptr<SharedPool>& slot = pools[num_threads];
  if (auto p = slot.lock()) return p;
  auto p = std::make_shared<SharedPool>();
  p->pool = pthreadpool_create(static_cast<size_t>(num_threads));
  if (p->pool == nullptr) return nullptr;
  slot = p;
  return p;
}

struct XnnHandle : DelegateHandle {
  xnn_runtime_t runtime = nullptr;
  std::shared_ptr<SharedPool> pool;  // null: run on the calling thread
  std::vector<std::vector<float>> owned;  // permuted constants and literals
  std::vector<std::vector<int64_t>> in_sizes, out_sizes;  // Kiln (NCHW) sizes
  std::vector<std::vector<float>> in_buf, out_buf;        // staging (inputs always; rank-4 outputs)
  std::vector<xnn_external_value> externals;
  ~XnnHandle() override {
    if (runtime) xnn_delete_runtime(runtime);  // before `pool`, which it uses
  }
};

// dst (NHWC) <- src (NCHW [n, c, h, w]) and the reverse.
void nchw_to_nhwc(const float* src, float* dst, const std::vector<int64_t>& s) {
  const int64_t N = s[0], C = s[1], HW = s[2] * s[3];
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t p = 0; p < HW; ++p) dst[(n * HW + p) * C + c] = src[(n * C + c) * HW + p];
}
void nhwc_to_nchw(const float* src, float* dst, const std::vector<int64_t>& s) {
  const int64_t N = s[0], C = s[1], HW = s[2] * s[3];
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t p = 0; p < HW; ++p) dst[(n * C + c) * HW + p] = src[(n * HW + p) * C + c];
}

Error bad(const std::string& why) { return Error(ErrorCode::InvalidProgram, "xnnpack payload: " + why); }

const char* xnn_status_name(xnn_status s) {
  switch (s) {
    case xnn_status_success: return "success";
    case xnn_status_uninitialized: return "uninitialized";
    case xnn_status_invalid_parameter: return "invalid parameter";
    case xnn_status_invalid_state: return "invalid state";
    case xnn_status_unsupported_parameter: return "unsupported parameter";
    case xnn_status_unsupported_hardware: return "unsupported hardware";
    case xnn_status_out_of_memory: return "out of memory";
  }
  return "unknown status";
}

std::string xnn_error(const char* what, xnn_status s) {
  return std::string(what) + " failed (xnn_status " + std::to_string(static_cast<int>(s)) + ", " + xnn_status_name(s) +
         ")";
}

// A node's xnn_define_* failure, naming the call and, where it is a limit found by trying the
// installed XNNPACK (docs/delegation.md), the limit.
std::string define_error(uint32_t op, xnn_status st, const std::vector<uint32_t>& p) {
  static const char* const kDefine[kNumOps] = {
      "literal", "xnn_define_convolution_2d", "xnn_define_clamp", "xnn_define_hardswish", "xnn_define_add2",
      "xnn_define_multiply2", "xnn_define_global_average_pooling_2d", "xnn_define_max_pooling_2d",
      "xnn_define_average_pooling_2d", "xnn_define_fully_connected", "xnn_define_static_reshape", "xnn_define_sigmoid",
      "xnn_define_subtract", "xnn_define_divide", "xnn_define_leaky_relu", "xnn_define_softmax",
      "xnn_define_static_constant_pad"};
  std::string m = xnn_error(op < kNumOps ? kDefine[op] : "xnn_define_*", st);
  if ((op == kMaxPool || op == kAvgPool) && p.size() >= 2 && p[0] * p[1] == 1) {
    m += ": XNNPACK rejects a 1x1 pooling window";
  } else if (op == kLeakyRelu && !p.empty() && !std::isfinite(bitsf(p[0]))) {
    m += ": XNNPACK requires a finite negative slope";
  }
  return m;
}

// The node alone, as the partitioner would hand it to lower(): its non-constant inputs, its
// constants (first-use order) and its outputs.
Subgraph single_node(size_t node, const Graph& graph) {
  const Node& n = graph.nodes()[node];
  Subgraph sg;
  sg.graph = &graph;
  sg.nodes = {node};
  for (ValueId v : n.inputs) {
    if (v == kNoValue) continue;
    auto& list = graph.value(v).constant ? sg.constants : sg.inputs;
    if (std::find(list.begin(), list.end(), v) == list.end()) list.push_back(v);
  }
  sg.outputs = n.outputs;
  return sg;
}

class XnnpackBackend : public Backend {
 public:
  std::string name() const override { return "xnnpack"; }
  std::string symbolic_sizes_reason() const override {
    return "symbolic sizes: Debian's XNNPACK (2022) cannot reshape a built runtime (it has no "
           "xnn_reshape_runtime), so a segment runs the one shape it was built for";
  }

  // Lowers the node alone (the lowering's static checks of XNNPACK's limits included), then
  // builds that payload the way init will when XNNPACK is available here.
  Error support(size_t node, const Graph& graph) const override {
    const Subgraph sg = single_node(node, graph);
    auto lowered = lower_subgraph(sg);
    if (!lowered.ok()) return lowered.error();
    size_t at_fault = SIZE_MAX;
    bool checked = false;
    return build_check(sg, lowered->payload, lowered->origin, &at_fault, &checked);
  }

  Result<std::vector<uint8_t>> lower(const Subgraph& subgraph) const override {
    auto lowered = lower_subgraph(subgraph);
    if (!lowered.ok()) return lowered.error();
    return std::move(lowered->payload);
  }

  // Builds the segment with build_runtime (init's code, one thread) and names the Kiln node of
  // the payload node that failed. The origin table comes from lowering `subgraph` again (the
  // lowering is deterministic); when that does not reproduce `payload`, no node is named.
  Error check_build(const Subgraph& subgraph, std::span<const uint8_t> payload, size_t* node_at_fault,
                    bool* checked) const override {
    auto lowered = lower_subgraph(subgraph, /*checks=*/false);
    std::vector<size_t> origin;
    if (lowered.ok() && std::equal(payload.begin(), payload.end(), lowered->payload.begin(), lowered->payload.end())) {
      origin = std::move(lowered->origin);
    }
    return build_check(subgraph, payload, origin, node_at_fault, checked);
  }

  // Unavailable when XNNPACK cannot initialize on this processor, or when the environment variable
  // KILN_XNNPACK_DISABLE is set to anything but "" or "0" (to test or force the fallback path).
  Error is_available(const BackendSettings& settings) const override {
    for (const auto& [k, v] : settings) {
      if (k.rfind("xnnpack.", 0) == 0) return Error(ErrorCode::NotFound, "xnnpack: unknown setting '" + k + "'");
    }
    if (const char* off = std::getenv("KILN_XNNPACK_DISABLE"); off != nullptr && *off != '\0' && std::string(off) != "0") {
      return Error(ErrorCode::NotFound, std::string("disabled by the environment (KILN_XNNPACK_DISABLE=") + off + ")");
    }
    static const xnn_status status = xnn_initialize(nullptr);
    if (status != xnn_status_success) {
      return Error(ErrorCode::NotFound, status == xnn_status_unsupported_hardware
                                            ? "XNNPACK does not support this processor"
                                            : xnn_error("xnn_initialize", status));
    }
    return {};
  }

  Result<std::unique_ptr<DelegateHandle>> init(std::span<const uint8_t> payload,
                                               std::span<const std::span<const uint8_t>> constants,
                                               std::span<const TensorType> inputs,
                                               std::span<const TensorType> outputs,
                                               const DelegateOptions& options) const override {
    KILN_RETURN_IF_ERROR(is_available(options.settings ? *options.settings : BackendSettings{}));
    size_t failed_node = SIZE_MAX;
    return build_runtime(payload, constants, inputs, outputs, options, &failed_node);
  }

  // Builds the lowered `sg` (`payload`, `origin` from lower_subgraph) with build_runtime, with the
  // graph's constants, on one thread, when XNNPACK is available here (*checked then true).
  // NotSupported with XNNPACK's refusal otherwise; *node_at_fault: the position in sg.nodes of the
  // node whose payload node failed, SIZE_MAX when no node can be named (xnn_create_runtime_v2).
  Error build_check(const Subgraph& sg, std::span<const uint8_t> payload, const std::vector<size_t>& origin,
                    size_t* node_at_fault, bool* checked) const {
    *node_at_fault = SIZE_MAX;
    *checked = false;
    const BackendSettings no_settings;
    if (!is_available(no_settings).ok()) return {};
    const SubgraphBoundary b(sg);
    DelegateOptions options;
    options.num_threads = 1;
    options.settings = &no_settings;
    size_t failed = SIZE_MAX;
    auto handle = build_runtime(payload, b.constants, b.inputs, b.outputs, options, &failed);
    *checked = true;
    if (handle.ok()) return {};
    if (failed < origin.size()) *node_at_fault = origin[failed];
    std::string why = handle.error().message();
    const std::string prefix = "xnnpack payload: ";
    if (why.rfind(prefix, 0) == 0) why = why.substr(prefix.size());
    return unsupported("XNNPACK does not build it: " + why);
  }

  // The code init runs: decodes the untrusted payload (re-inferring every shape), defines the
  // XNNPACK subgraph and creates its runtime. On failure *failed_node is the payload node at
  // fault (the node XNNPACK refused, whose input or output it could not define, or whose params
  // do not decode), SIZE_MAX when none is.
  Result<std::unique_ptr<DelegateHandle>> build_runtime(std::span<const uint8_t> payload,
                                                        std::span<const std::span<const uint8_t>> constants,
                                                        std::span<const TensorType> inputs,
                                                        std::span<const TensorType> outputs,
                                                        const DelegateOptions& options, size_t* failed_node) const {
    *failed_node = SIZE_MAX;
    if (payload.size() % 4 != 0) return bad("size is not a multiple of 4");
    std::vector<uint32_t> w(payload.size() / 4);
    if (!w.empty()) std::memcpy(w.data(), payload.data(), payload.size());
    size_t pos = 0;
    bool ok = true;
    auto next = [&]() -> uint32_t {
      if (pos >= w.size()) {
        ok = false;
        return 0;
      }
      return w[pos++];
    };
    if (next() != kMagic) return bad("wrong magic");
    const uint32_t ni = next(), no = next(), nc = next();
    if (!ok || ni != inputs.size() || no != outputs.size() || nc != constants.size()) {
      return bad("boundary counts differ from the program's delegate call");
    }
    auto h = std::make_unique<XnnHandle>();
    std::vector<XValue> values;
    std::vector<uint32_t> layout(ni + nc);
    for (auto& l : layout) l = next();
    constexpr uint64_t kMaxElems = 1ull << 34;
    auto check_dims = [&](const std::vector<int64_t>& s) {
      uint64_t numel = 1;
      for (int64_t d : s) {
        if (d <= 0 || static_cast<uint64_t>(d) > kMaxElems || numel > kMaxElems / static_cast<uint64_t>(d)) return false;
        numel *= static_cast<uint64_t>(d);
      }
      return true;
    };
    for (uint32_t i = 0; i < ni; ++i) {
      const TensorType& t = inputs[i];
      if (t.dtype != DType::Float32 || !check_dims(t.sizes)) return bad("input " + std::to_string(i) + " is not a non-empty float32 tensor");
      if (layout[i] != (t.dim() == 4 ? 1u : 0u)) return bad("input layout flag disagrees with its rank");
      XValue v;
      const auto xs = to_xnn(t.sizes);
      v.dims.assign(xs.begin(), xs.end());
      v.external = i;
      v.flags = XNN_VALUE_FLAG_EXTERNAL_INPUT;
      values.push_back(v);
      h->in_sizes.push_back(t.sizes);
      h->in_buf.emplace_back(static_cast<size_t>(t.numel()) + XNN_EXTRA_BYTES / sizeof(float));
    }
    for (uint32_t c = 0; c < nc; ++c) {
      const uint32_t rank = next();
      if (!ok || rank > 8) return bad("constant rank");
      std::vector<int64_t> s(rank);
      for (auto& d : s) d = next();
      if (!ok || !check_dims(s)) return bad("constant dims");
      const uint64_t numel = static_cast<uint64_t>(numel_of(s));
      if (constants[c].size() != numel * 4) return bad("constant " + std::to_string(c) + " byte size differs from its dims");
      if (layout[ni + c] != (rank == 4 ? 1u : 0u)) return bad("constant layout flag disagrees with its rank");
      XValue v;
      const auto xs = to_xnn(s);
      v.dims.assign(xs.begin(), xs.end());
      if (rank == 4) {
        h->owned.emplace_back(numel + kPadFloats);
        nchw_to_nhwc(reinterpret_cast<const float*>(constants[c].data()), h->owned.back().data(), s);
        v.data = h->owned.back().data();
      } else {
        v.data = constants[c].data();
      }
      values.push_back(v);
    }
    struct XNode {
      uint32_t op;
      std::vector<uint32_t> in, params;
    };
    const uint32_t nn = next();
    if (!ok || nn > (1u << 20)) return bad("node count");
    std::vector<XNode> nodes;
    for (uint32_t k = 0; k < nn; ++k) {
      XNode xn;
      xn.op = next();
      const uint32_t nin = next();
      if (!ok || xn.op >= kNumOps || nin > 3) return bad("node " + std::to_string(k) + ": bad opcode or arity");
      for (uint32_t i = 0; i < nin; ++i) {
        const uint32_t id = next();
        if (id != kNone && id >= values.size()) return bad("node " + std::to_string(k) + ": input id out of range");
        xn.in.push_back(id);
      }
      const uint32_t np = next();
      if (!ok || np > w.size() - pos) return bad("params");
      for (uint32_t i = 0; i < np; ++i) xn.params.push_back(next());
      if (!ok) return bad("truncated");
      auto dims_out = infer(xn.op, xn.in, xn.params, values, *h);
      if (!dims_out.ok()) {
        *failed_node = k;
        return bad("node " + std::to_string(k) + ": " + dims_out.error().message());
      }
      // Every value within the boundaries' limit: XNNPACK multiplies dims in size_t unchecked, so
      // a larger one (broadcasts, padded convolutions of large inputs) could wrap its buffer sizes.
      {
        std::vector<int64_t> s;
        for (size_t d : dims_out.value()) s.push_back(d > kMaxElems ? -1 : static_cast<int64_t>(d));
        if (!check_dims(s)) {
          *failed_node = k;
          return bad("node " + std::to_string(k) + ": output has more than 2^34 elements");
        }
      }
      XValue v;
      v.dims = std::move(dims_out.value());
      if (xn.op == kLiteral) v.data = h->owned.back().data();
      values.push_back(v);
      nodes.push_back(std::move(xn));
    }
    std::vector<uint32_t> outs(no);
    for (uint32_t o = 0; o < no; ++o) {
      outs[o] = next();
      if (!ok || outs[o] < ni + nc || outs[o] >= values.size() || values[outs[o]].external != XNN_INVALID_VALUE_ID) {
        return bad("output " + std::to_string(o) + " id invalid or repeated");
      }
      const TensorType& t = outputs[o];
      const auto xs = to_xnn(t.sizes);
      if (t.dtype != DType::Float32 || std::vector<size_t>(xs.begin(), xs.end()) != values[outs[o]].dims) {
        return bad("output " + std::to_string(o) + " shape differs from the program's " + t.to_string());
      }
      values[outs[o]].external = ni + o;
      values[outs[o]].flags = XNN_VALUE_FLAG_EXTERNAL_OUTPUT;
      h->out_sizes.push_back(t.sizes);
      h->out_buf.emplace_back(t.dim() == 4 ? static_cast<size_t>(t.numel()) : 0);
    }
    if (pos != w.size()) return bad("trailing bytes");
    // XNNPACK allocates no memory for a node output nothing reads (and then asserts): every
    // non-literal node must feed another node or a boundary output.
    std::vector<bool> used(values.size(), false);
    for (const XNode& xn : nodes) {
      for (uint32_t i : xn.in) {
        if (i != kNone) used[i] = true;
      }
    }
    for (uint32_t o : outs) used[o] = true;
    for (size_t k = 0; k < nodes.size(); ++k) {
      if (nodes[k].op != kLiteral && !used[ni + nc + k]) return bad("node " + std::to_string(k) + "'s output is never used");
    }

    // Constants read as operands (not as conv/FC weights or biases, which XNNPACK packs and reads
    // exactly) are copied into padded buffers: the file mapping may end right after them.
    std::vector<bool> copied(values.size(), false);
    for (const XNode& xn : nodes) {
      for (size_t i = 0; i < xn.in.size(); ++i) {
        const uint32_t id = xn.in[i];
        const bool weight_slot = (xn.op == kConv || xn.op == kFullyConnected) && i > 0;
        if (weight_slot || id == kNone || id < ni || id >= ni + nc || layout[id] == 1 || copied[id]) continue;
        copied[id] = true;
        const auto* src = static_cast<const float*>(values[id].data);
        const size_t numel = constants[id - ni].size() / sizeof(float);
        h->owned.emplace_back(numel + kPadFloats);
        std::memcpy(h->owned.back().data(), src, numel * sizeof(float));
        values[id].data = h->owned.back().data();
      }
    }

    // Build the XNNPACK subgraph.
    xnn_subgraph_t sub = nullptr;
    xnn_status st = xnn_create_subgraph(ni + no, 0, &sub);
    if (st != xnn_status_success) return Error(ErrorCode::MemoryAllocationFailed, xnn_error("xnn_create_subgraph", st));
    struct SubgraphGuard {
      xnn_subgraph_t s;
      ~SubgraphGuard() { xnn_delete_subgraph(s); }
    } guard{sub};
    // Values are defined when a node first reads them (and each node's output just before the
    // node), so that a value XNNPACK refuses is pinned on the node that needs it.
    std::vector<uint32_t> xid(values.size(), XNN_INVALID_VALUE_ID);
    auto define = [&](size_t i) -> Error {
      if (xid[i] != XNN_INVALID_VALUE_ID) return {};
      const XValue& v = values[i];
      const xnn_status vs =
          xnn_define_tensor_value(sub, xnn_datatype_fp32, v.dims.size(), v.dims.data(), v.data, v.external, v.flags, &xid[i]);
      if (vs == xnn_status_success) return {};
      std::string what = i < ni ? "input " + std::to_string(i)
                         : i < ni + nc ? "constant " + std::to_string(i - ni)
                                       : "the output of node " + std::to_string(i - ni - nc);
      std::string msg = xnn_error("xnn_define_tensor_value", vs) + " for " + what + " of rank " + std::to_string(v.dims.size());
      if (v.dims.size() > XNN_MAX_TENSOR_DIMS) {
        msg += ": rank " + std::to_string(v.dims.size()) + " exceeds XNNPACK's limit of " +
               std::to_string(XNN_MAX_TENSOR_DIMS) + " dims (XNN_MAX_TENSOR_DIMS)";
      }
      return bad(msg);
    };
    for (size_t k = 0; k < nodes.size(); ++k) {
      const XNode& xn = nodes[k];
      *failed_node = k;
      for (uint32_t i : xn.in) {
        if (i != kNone) KILN_RETURN_IF_ERROR(define(i));
      }
      KILN_RETURN_IF_ERROR(define(ni + nc + k));
      const uint32_t out = xid[ni + nc + k];
      auto id = [&](size_t i) { return xn.in[i] == kNone ? XNN_INVALID_VALUE_ID : xid[xn.in[i]]; };
      const auto& p = xn.params;
      switch (xn.op) {
        case kLiteral: st = xnn_status_success; break;
        case kConv: {
          const auto& wd = values[xn.in[1]].dims;  // [Cout, kh, kw, gin]
          const uint32_t groups = p[8];
          st = xnn_define_convolution_2d(sub, p[0], p[1], p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], groups, wd[3],
                                         wd[0] / groups, -kInf, kInf, id(0), id(1), id(2), out, 0);
          break;
        }
        case kClamp: st = xnn_define_clamp(sub, bitsf(p[0]), bitsf(p[1]), id(0), out, 0); break;
        case kHardswish: st = xnn_define_hardswish(sub, id(0), out, 0); break;
        case kSigmoid: st = xnn_define_sigmoid(sub, id(0), out, 0); break;
        case kSub: st = xnn_define_subtract(sub, -kInf, kInf, id(0), id(1), out, 0); break;
        case kDiv: st = xnn_define_divide(sub, -kInf, kInf, id(0), id(1), out, 0); break;
        case kLeakyRelu: st = xnn_define_leaky_relu(sub, bitsf(p[0]), id(0), out, 0); break;
        case kSoftmax: st = xnn_define_softmax(sub, id(0), out, 0); break;
        case kPad: {
          const uint32_t r = p[0];
          std::vector<size_t> pre(p.begin() + 1, p.begin() + 1 + r), post(p.begin() + 1 + r, p.begin() + 1 + 2 * r);
          st = xnn_define_static_constant_pad(sub, pre.data(), post.data(), bitsf(p[1 + 2 * r]), id(0), out, 0);
          break;
        }
        case kAdd: st = xnn_define_add2(sub, -kInf, kInf, id(0), id(1), out, 0); break;
        case kMul: st = xnn_define_multiply2(sub, -kInf, kInf, id(0), id(1), out, 0); break;
        case kGlobalAvg: st = xnn_define_global_average_pooling_2d(sub, -kInf, kInf, id(0), out, 0); break;
        case kMaxPool:
          st = xnn_define_max_pooling_2d(sub, p[4], p[7], p[6], p[5], p[0], p[1], p[2], p[3], p[8], p[9], -kInf, kInf,
                                         id(0), out, 0);
          break;
        case kAvgPool:
          st = xnn_define_average_pooling_2d(sub, 0, 0, 0, 0, p[0], p[1], p[2], p[3], -kInf, kInf, id(0), out, 0);
          break;
        case kFullyConnected:
          st = xnn_define_fully_connected(sub, -kInf, kInf, id(0), id(1), id(2), out, p[0] ? XNN_FLAG_TRANSPOSE_WEIGHTS : 0);
          break;
        case kReshape: {
          const std::vector<size_t> shape(values[ni + nc + k].dims);
          st = xnn_define_static_reshape(sub, shape.size(), shape.data(), id(0), out, 0);
          break;
        }
        default: return bad("opcode");
      }
      if (st != xnn_status_success) return bad(define_error(xn.op, st, xn.params) + " at node " + std::to_string(k));
    }
    *failed_node = SIZE_MAX;
    // Boundary values no node reads (only in a hostile payload) are defined all the same, so that
    // every external id passed to xnn_setup_runtime names a value.
    for (size_t i = 0; i < values.size(); ++i) KILN_RETURN_IF_ERROR(define(i));
    // XNNPACK parallelizes over a pthreadpool of the method's thread count, shared by every
    // segment with that thread count (shared_pool). Its workers are
    // yielded back to the OS after the last operator (XNN_FLAG_YIELD_WORKERS), so they do not
    // spin against Kiln's kernels or other segments; Kiln's own pool sleeps while a delegate
    // call runs (after its short poll, include/kiln/thread_pool.h).
    if (options.num_threads > 1) {
      h->pool = shared_pool(options.num_threads);
      if (h->pool == nullptr) return Error(ErrorCode::MemoryAllocationFailed, "xnnpack: pthreadpool_create failed");
    }
    st = xnn_create_runtime_v2(sub, h->pool ? h->pool->pool : nullptr, h->pool ? XNN_FLAG_YIELD_WORKERS : 0,
                               &h->runtime);
    if (st != xnn_status_success) return Error(ErrorCode::NotSupported, "xnnpack: " + xnn_error("xnn_create_runtime_v2", st));
    h->externals.resize(ni + no);
    for (uint32_t i = 0; i < ni + no; ++i) h->externals[i].id = i;
    return std::unique_ptr<DelegateHandle>(std::move(h));
  }

  Error execute(DelegateHandle& handle, std::span<const Tensor* const> inputs,
                std::span<Tensor* const> outputs) const override {
    auto& h = static_cast<XnnHandle&>(handle);
    if (inputs.size() != h.in_sizes.size() || outputs.size() != h.out_sizes.size()) {
      return Error(ErrorCode::InvalidArgument, "xnnpack: wrong number of delegate inputs/outputs");
    }
    for (size_t i = 0; i < inputs.size(); ++i) {
      const auto* src = inputs[i]->data_as<const float>();
      if (h.in_sizes[i].size() == 4) {
        nchw_to_nhwc(src, h.in_buf[i].data(), h.in_sizes[i]);
      } else {
        std::memcpy(h.in_buf[i].data(), src, inputs[i]->nbytes());
      }
      h.externals[i].data = h.in_buf[i].data();
    }
    const size_t ni = inputs.size();
    for (size_t o = 0; o < outputs.size(); ++o) {
      h.externals[ni + o].data = h.out_sizes[o].size() == 4 ? h.out_buf[o].data() : outputs[o]->data;
    }
    xnn_status st = xnn_setup_runtime(h.runtime, h.externals.size(), h.externals.data());
    if (st != xnn_status_success) return Error(ErrorCode::Internal, "xnnpack: " + xnn_error("xnn_setup_runtime", st));
    std::unique_lock<std::mutex> run_lock;
    if (h.pool) run_lock = std::unique_lock<std::mutex>(h.pool->run);
    st = xnn_invoke_runtime(h.runtime);
    if (st != xnn_status_success) return Error(ErrorCode::Internal, "xnnpack: " + xnn_error("xnn_invoke_runtime", st));
    for (size_t o = 0; o < outputs.size(); ++o) {
      if (h.out_sizes[o].size() == 4) nhwc_to_nchw(h.out_buf[o].data(), outputs[o]->data_as<float>(), h.out_sizes[o]);
    }
    return {};
  }

 private:
  // Shape of a node's output (XNNPACK order) from its inputs' shapes and params; the formulas
  // of XNNPACK's operators (src/operators/*.c output size computations). Errors name the check.
  static Result<std::vector<size_t>> infer(uint32_t op, const std::vector<uint32_t>& in, const std::vector<uint32_t>& p,
                                           const std::vector<XValue>& values, XnnHandle& h) {
    auto need = [&](size_t nin, size_t np) { return in.size() == nin && p.size() == np; };
    auto dims = [&](size_t i) -> const std::vector<size_t>& { return values[in[i]].dims; };
    auto present = [&](size_t n) {
      for (size_t i = 0; i < n; ++i) {
        if (in[i] == kNone) return false;
      }
      return true;
    };
    auto fail = [](const std::string& m) { return Error(ErrorCode::InvalidProgram, m); };
    auto pos = [](uint32_t v) { return v >= 1 && v <= (1u << 16); };
    switch (op) {
      case kLiteral: {
        if (!in.empty() || p.empty() || p[0] > 8 || p.size() < 1 + p[0]) return fail("literal header");
        std::vector<size_t> d(p.begin() + 1, p.begin() + 1 + p[0]);
        uint64_t numel = 1;
        for (size_t x : d) {
          if (x == 0 || x > (1u << 24)) return fail("literal dims");
          numel *= x;
        }
        if (numel > (1u << 24) || p.size() != 1 + p[0] + numel) return fail("literal data size");
        h.owned.emplace_back(numel + kPadFloats);
        for (size_t i = 0; i < numel; ++i) h.owned.back()[i] = bitsf(p[1 + p[0] + i]);
        return d;
      }
      case kConv: {
        if (!need(3, 9) || !present(3)) return fail("conv arity");
        const auto &x = dims(0), &wd = dims(1), &b = dims(2);
        if (x.size() != 4 || wd.size() != 4 || b.size() != 1) return fail("conv ranks");
        const uint32_t groups = p[8];
        if (!pos(p[2]) || !pos(p[3]) || !pos(p[4]) || !pos(p[5]) || !pos(p[6]) || !pos(p[7]) || !pos(groups) ||
            p[0] > (1u << 16) || p[1] > (1u << 16)) {
          return fail("conv params out of range");
        }
        if (wd[1] != p[2] || wd[2] != p[3] || wd[3] * groups != x[3] || wd[0] % groups != 0 || b[0] != wd[0]) {
          return fail("conv weight/bias shape");
        }
        const int64_t eh = static_cast<int64_t>(x[1]) + 2 * p[0] - static_cast<int64_t>(p[6]) * (p[2] - 1) - 1;
        const int64_t ew = static_cast<int64_t>(x[2]) + 2 * p[1] - static_cast<int64_t>(p[7]) * (p[3] - 1) - 1;
        if (eh < 0 || ew < 0) return fail("conv window larger than the padded input");
        return std::vector<size_t>{x[0], static_cast<size_t>(eh / p[4] + 1), static_cast<size_t>(ew / p[5] + 1), wd[0]};
      }
      case kClamp:
        if (!need(1, 2) || !present(1)) return fail("clamp arity");
        return dims(0);
      case kHardswish:
      case kSigmoid:
        if (!need(1, 0) || !present(1)) return fail("unary arity");
        return dims(0);
      case kLeakyRelu:
        if (!need(1, 1) || !present(1) || !std::isfinite(bitsf(p[0]))) return fail("leaky relu arity or slope");
        return dims(0);
      case kSoftmax:
        if (!need(1, 0) || !present(1) || dims(0).empty()) return fail("softmax arity or rank");
        return dims(0);
      case kPad: {
        if (in.size() != 1 || !present(1) || p.empty()) return fail("pad arity");
        const uint32_t r = p[0];
        // A rank above XNN_MAX_TENSOR_DIMS is XNNPACK's to refuse: the input's definition fails
        // before the node's.
        if (r != dims(0).size() || r < 1 || p.size() != 2 + 2 * static_cast<size_t>(r)) {
          return fail("pad rank");
        }
        std::vector<size_t> out = dims(0);
        for (uint32_t i = 0; i < r; ++i) {
          if (p[1 + i] > (1u << 16) || p[1 + r + i] > (1u << 16)) return fail("pad out of range");
          out[i] += p[1 + i] + p[1 + r + i];
        }
        uint64_t numel = 1;
        for (size_t d : out) {
          numel *= d;
          if (numel > (1ull << 34)) return fail("padded tensor too large");
        }
        return out;
      }
      case kAdd:
      case kMul:
      case kSub:
      case kDiv: {
        if (!need(2, 0) || !present(2)) return fail("binary arity");
        const auto &a = dims(0), &b = dims(1);
        const size_t r = std::max(a.size(), b.size());
        std::vector<size_t> out(r);
        for (size_t i = 0; i < r; ++i) {
          const size_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
          const size_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
          if (da != db && da != 1 && db != 1) return fail("binary shapes do not broadcast");
          out[i] = std::max(da, db);
        }
        return out;
      }
      case kGlobalAvg: {
        if (!need(1, 0) || !present(1) || dims(0).size() != 4) return fail("global average pooling input");
        return std::vector<size_t>{dims(0)[0], 1, 1, dims(0)[3]};
      }
      case kMaxPool:
      case kAvgPool: {
        const bool mx = op == kMaxPool;
        if (!need(1, mx ? 10 : 4) || !present(1) || dims(0).size() != 4) return fail("pooling arity");
        for (size_t i = 0; i < 4; ++i) {
          if (!pos(p[i])) return fail("pooling params out of range");
        }
        uint32_t pt = 0, pl = 0, pb = 0, pr = 0, dh = 1, dw = 1;
        if (mx) {
          pt = p[4], pl = p[5], pb = p[6], pr = p[7], dh = p[8], dw = p[9];
          if (!pos(dh) || !pos(dw) || pt > (1u << 16) || pl > (1u << 16) || pb > (1u << 16) || pr > (1u << 16)) {
            return fail("pooling params out of range");
          }
          if (p[0] * p[1] == 1) return fail("1x1 max pooling");
        }
        const auto& x = dims(0);
        const int64_t eh = static_cast<int64_t>(x[1]) + pt + pb - static_cast<int64_t>(dh) * (p[0] - 1) - 1;
        const int64_t ew = static_cast<int64_t>(x[2]) + pl + pr - static_cast<int64_t>(dw) * (p[1] - 1) - 1;
        if (eh < 0 || ew < 0) return fail("pooling window larger than the padded input");
        return std::vector<size_t>{x[0], static_cast<size_t>(eh / p[2] + 1), static_cast<size_t>(ew / p[3] + 1), x[3]};
      }
      case kFullyConnected: {
        if (!need(3, 1) || in[0] == kNone || in[1] == kNone || p[0] > 1) return fail("fully connected arity");
        const auto &x = dims(0), &wd = dims(1);
        if (x.empty() || x.size() == 4 || wd.size() != 2) return fail("fully connected ranks");
        const size_t k = p[0] ? wd[0] : wd[1], n = p[0] ? wd[1] : wd[0];
        if (x.back() != k) return fail("fully connected inner dimension");
        if (in[2] != kNone && dims(2) != std::vector<size_t>{n}) return fail("fully connected bias shape");
        std::vector<size_t> out = x;
        out.back() = n;
        return out;
      }
      case kReshape: {
        if (in.size() != 1 || !present(1) || p.empty() || p[0] > 8 || p.size() != 1 + p[0]) return fail("reshape arity");
        std::vector<size_t> d(p.begin() + 1, p.end());
        uint64_t a = 1, b = 1;
        for (size_t x : dims(0)) a *= x;
        for (size_t x : d) b *= x;
        if (a != b) return fail("reshape changes the element count");
        return d;
      }
      default: return fail("opcode");
    }
  }
};

}  // namespace

}  // namespace kiln

// kiln::backend_xnnpack registers this backend when it is linked (KILN_REGISTER_BACKEND: backend.h).
KILN_REGISTER_BACKEND(xnnpack, std::make_unique<kiln::XnnpackBackend>)
