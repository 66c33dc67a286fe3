// The mlx delegate: lowers subgraphs of Kiln ops to MLX (Apple's array framework; its C++ library
// from the `mlx` Python package) and runs them on MLX's GPU (Metal or CUDA) or, with
// KILN_MLX_DEVICE=cpu, on MLX's CPU device.
//
// Payload (little-endian; version 2; init also reads version 1, which has no symbol, state or
// symbolic-attribute sections):
//   u32 'KMLX', u32 version, u8 compute dtype (Kiln DType: float32, float16 or bfloat16; float32
//   values are computed in it, boundaries stay as the program says),
//   u32 num_symbols, per symbol: str name, i64 min, i64 max   (0 for a segment of fixed shapes),
//   u32 num_inputs, u32 num_outputs, u32 num_constants, u32 num_states,
//   per input: type (its upper bound), u8 symbolic, if 1: one expr per dim,
//   per state and per constant: type,
//   u32 num_nodes, per node: str op, u32 num_inputs, i32 value ids (-1 = None),
//                            u32 num_attrs, per attr: str name, u8 kind, value,
//                            u32 num_sym_attrs, per: str name, i64 index (-1: the int itself), expr,
//   i32 output value ids[num_outputs], per state: i32 value id of its new value (-1 = unchanged).
//   str = u32 length + bytes; expr = u32 n + i64 tokens[n] (SymExpr's postfix code); attr kinds:
//   0 None, 1 bool (u8), 2 int (i64), 3 float (f64), 4 str, 5 ints (u32 n + i64s), 6 floats.
//   Value ids: [0, inputs) the delegate inputs, then one per held state (its value at the start of
//   the call), then the constants, then one per node.
// Nodes carry Kiln op names and Kiln attributes: init re-runs Kiln's own op definitions
// (OpDef::normalize_attributes + infer_types, which validate every attribute) and the mlx op
// table's check on every node, so a payload that init accepts is one `lower` could have written.
//
// Run time: init builds the computation once (constants wrapped from the mapped program file with
// mlx::core::array(void*, ..., deleter), which MLX uses in place where its allocator can wrap
// foreign memory (Metal, page-aligned) and copies once otherwise (MLX's CPU allocator, measured on
// mlx 0.32.4); conv weights relaid out and batch-norm scales computed once), validates it by
// tracing it, and fuses it with mlx::core::compile. execute wraps the inputs the same way,
// evaluates once (one synchronization) and copies the outputs. Each handle has its own compiled
// function; there is no lock shared between programs.
//
// Memory: MLX does not survive an allocation that fails (measured on mlx 0.32.4's CPU device: it
// writes through the null buffer), so init refuses a payload that would build an array larger
// than the load setting mlx.max_array_bytes (a decimal byte count; default: this machine's
// physical memory, beyond which no array can ever be allocated) with MemoryAllocationFailed: every
// node's output, checked as it is decoded, and every array of the traced computation (the
// lowerings' temporaries too, e.g. a padded input of a pooling window), walked once at init.
#include <unistd.h>

#include <mlx/compile.h>
#include <mlx/mlx.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <list>
#include <limits>
#include <map>
#include <memory>
#include <set>

#include "backends/backend.h"
#include "backends/mlx/mlx_ops.h"
#include "ir/op_registry.h"

namespace kiln {
namespace {

namespace mx = mlx::core;
using mlxb::NodeView;

constexpr uint32_t kMagic = 0x584C4D4Bu;  // "KMLX"
constexpr uint32_t kVersion = 2;

// ---------------------------------------------------------------- payload writer / reader

class Writer {
 public:
  void u8(uint8_t v) { bytes_.push_back(v); }
  void u32(uint32_t v) { raw(&v, 4); }
  void i32(int32_t v) { raw(&v, 4); }
  void i64(int64_t v) { raw(&v, 8); }
  void f64(double v) { raw(&v, 8); }
  void str(const std::string& s) {
    u32(static_cast<uint32_t>(s.size()));
    raw(s.data(), s.size());
  }
  void expr(const SymExpr& e) {
    u32(static_cast<uint32_t>(e.code().size()));
    for (int64_t x : e.code()) i64(x);
  }
  void type(const TensorType& t) {
    u8(static_cast<uint8_t>(t.dtype));
    u8(static_cast<uint8_t>(t.sizes.size()));
    for (int64_t d : t.sizes) i64(d);
  }
  void attr(const AttrValue& v) {
    u8(static_cast<uint8_t>(v.index()));
    if (const bool* b = std::get_if<bool>(&v)) u8(*b ? 1 : 0);
    if (const int64_t* i = std::get_if<int64_t>(&v)) i64(*i);
    if (const double* f = std::get_if<double>(&v)) f64(*f);
    if (const std::string* s = std::get_if<std::string>(&v)) str(*s);
    if (const auto* is = std::get_if<std::vector<int64_t>>(&v)) {
      u32(static_cast<uint32_t>(is->size()));
      for (int64_t x : *is) i64(x);
    }
    if (const auto* fs = std::get_if<std::vector<double>>(&v)) {
      u32(static_cast<uint32_t>(fs->size()));
      for (double x : *fs) f64(x);
    }
  }
  std::vector<uint8_t> take() { return std::move(bytes_); }

 private:
  void raw(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    bytes_.insert(bytes_.end(), b, b + n);
  }
  std::vector<uint8_t> bytes_;
};

/// Bounds-checked reader: after any read past the end, ok() is false and reads return zeros.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> b) : b_(b) {}
  bool ok() const { return ok_; }
  bool done() const { return pos_ == b_.size(); }
  size_t left() const { return b_.size() - pos_; }
  uint8_t u8() { uint8_t v = 0; raw(&v, 1); return v; }
  uint32_t u32() { uint32_t v = 0; raw(&v, 4); return v; }
  int32_t i32() { int32_t v = 0; raw(&v, 4); return v; }
  int64_t i64() { int64_t v = 0; raw(&v, 8); return v; }
  double f64() { double v = 0; raw(&v, 8); return v; }
  std::string str() {
    const uint32_t n = u32();
    if (!ok_ || n > left()) return fail(), std::string();
    std::string s(reinterpret_cast<const char*>(b_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  TensorType type() {
    TensorType t;
    const uint8_t dt = u8(), rank = u8();
    if (!is_valid_dtype(dt) || rank > 8) return fail(), t;
    t.dtype = static_cast<DType>(dt);
    for (uint8_t i = 0; i < rank; ++i) t.sizes.push_back(i64());
    return t;
  }
  /// An expression of at most kMaxSymExprTokens tokens over `num_symbols` symbols (else !ok()).
  SymExpr expr(size_t num_symbols) {
    const uint32_t n = u32();
    if (!ok_ || n > kMaxSymExprTokens || n > left() / 8) return fail(), SymExpr();
    std::vector<int64_t> code(n);
    for (auto& x : code) x = i64();
    SymExpr e = SymExpr::from_code(std::move(code));
    if (!e.validate(num_symbols).ok()) fail();
    return e;
  }
  AttrValue attr() {
    switch (u8()) {
      case 0: return std::monostate{};
      case 1: return u8() != 0;
      case 2: return i64();
      case 3: return f64();
      case 4: return str();
      case 5: {
        const uint32_t n = u32();
        if (!ok_ || n > left() / 8) return fail(), AttrValue{};
        std::vector<int64_t> v(n);
        for (auto& x : v) x = i64();
        return v;
      }
      case 6: {
        const uint32_t n = u32();
        if (!ok_ || n > left() / 8) return fail(), AttrValue{};
        std::vector<double> v(n);
        for (auto& x : v) x = f64();
        return v;
      }
      default: return fail(), AttrValue{};
    }
  }

 private:
  void fail() { ok_ = false; }
  void raw(void* p, size_t n) {
    if (!ok_ || n > left()) {
      ok_ = false;
      return;
    }
    std::memcpy(p, b_.data() + pos_, n);
    pos_ += n;
  }
  std::span<const uint8_t> b_;
  size_t pos_ = 0;
  bool ok_ = true;
};

// ---------------------------------------------------------------- compile half

/// Node n of g as the mlx table sees it at the symbol values `binding` (empty for a graph of fixed
/// shapes): each input's and the output's sizes evaluated, symbolic attributes set.
Result<NodeView> view_at(const Graph& g, const Node& n, std::span<const int64_t> binding) {
  auto type_of = [&](ValueId id) -> Result<TensorType> {
    const Value& v = g.value(id);
    TensorType t = v.type;
    if (v.is_dynamic()) KILN_RETURN_IF_ERROR(eval_sizes(v.sym_sizes, binding, &t.sizes));
    return t;
  };
  NodeView v;
  v.op = n.op;
  for (ValueId id : n.inputs) {
    if (id == kNoValue) {
      v.in.emplace_back(std::nullopt);
      v.in_const.push_back(false);
    } else {
      auto t = type_of(id);
      if (!t.ok()) return t.error();
      v.in.emplace_back(std::move(t.value()));
      v.in_const.push_back(g.value(id).constant != nullptr);
    }
  }
  v.attrs = n.attrs;
  for (const SymAttr& sa : n.sym_attrs) {
    auto x = sa.expr.eval(binding);
    if (!x.ok()) return x.error();
    KILN_RETURN_IF_ERROR(set_int_attribute(v.attrs, sa.name, sa.index, x.value()));
  }
  if (!n.outputs.empty()) {
    auto t = type_of(n.outputs[0]);
    if (!t.ok()) return t.error();
    v.out = std::move(t.value());
  }
  return v;
}

Error trace_node(const NodeView& v);  // run half, below: builds the node alone with MLX

/// A node is lowered when the table's check accepts it and it builds alone: a node with symbolic
/// sizes at every check binding of the graph's symbols (check_bindings: the corners of the box of
/// symbol ranges, a midpoint, min + 1), the bindings at which the loader checks kernel calls.
Error support_node(const Graph& g, const Node& n) {
  if (n.delegate) return Error(ErrorCode::NotSupported, "already delegated");
  if (n.outputs.size() != 1) {
    return Error(ErrorCode::NotSupported, "op " + n.op + " has " + std::to_string(n.outputs.size()) + " outputs");
  }
  std::vector<std::vector<int64_t>> bindings{{}};
  if (has_symbolic_sizes(g, n)) bindings = check_bindings(g.symbols());
  for (const auto& b : bindings) {
    auto v = view_at(g, n, b);
    if (!v.ok()) return Error(ErrorCode::NotSupported, "its sizes at a check binding: " + v.error().message());
    KILN_RETURN_IF_ERROR(mlxb::check_node(v.value()));
    KILN_RETURN_IF_ERROR(trace_node(v.value()));
  }
  return {};
}

Result<std::vector<uint8_t>> lower_subgraph(const Subgraph& sg) {
  const Graph& g = *sg.graph;
  bool symbolic = false;
  for (size_t i : sg.nodes) symbolic = symbolic || has_symbolic_sizes(g, g.nodes()[i]);
  std::map<ValueId, int32_t> ids;
  int32_t next = 0;
  for (ValueId v : sg.inputs) ids[v] = next++;
  for (const Subgraph::State& st : sg.states) {
    if (st.read != kNoValue) ids[st.read] = next;
    ++next;
  }
  for (ValueId v : sg.constants) ids[v] = next++;
  Writer w;
  w.u32(kMagic);
  w.u32(kVersion);
  if (!is_compute_float(sg.compute_dtype)) return Error(ErrorCode::InvalidArgument, "mlx: compute dtype must be a float type");
  w.u8(static_cast<uint8_t>(sg.compute_dtype));
  w.u32(symbolic ? static_cast<uint32_t>(g.symbols().size()) : 0u);
  if (symbolic) {
    for (const SymbolDef& sd : g.symbols()) {
      w.str(sd.name);
      w.i64(sd.min);
      w.i64(sd.max);
    }
  }
  w.u32(static_cast<uint32_t>(sg.inputs.size()));
  w.u32(static_cast<uint32_t>(sg.outputs.size()));
  w.u32(static_cast<uint32_t>(sg.constants.size()));
  w.u32(static_cast<uint32_t>(sg.states.size()));
  for (ValueId v : sg.inputs) {
    const Value& val = g.value(v);
    w.type(val.type);
    w.u8(val.is_dynamic() ? 1 : 0);
    if (val.is_dynamic()) {
      for (const SymExpr& e : val.sym_sizes) w.expr(e);
    }
  }
  for (const Subgraph::State& st : sg.states) w.type(g.states()[st.state].type);
  for (ValueId v : sg.constants) w.type(g.value(v).type);
  w.u32(static_cast<uint32_t>(sg.nodes.size()));
  for (size_t i : sg.nodes) {
    const Node& n = g.nodes()[i];
    KILN_RETURN_IF_ERROR(support_node(g, n));
    w.str(n.op);
    w.u32(static_cast<uint32_t>(n.inputs.size()));
    for (ValueId v : n.inputs) {
      if (v == kNoValue) {
        w.i32(-1);
        continue;
      }
      auto it = ids.find(v);
      if (it == ids.end()) return Error(ErrorCode::Internal, "mlx: input of " + n.op + " is not in the subgraph");
      w.i32(it->second);
    }
    w.u32(static_cast<uint32_t>(n.attrs.size()));
    for (const auto& [name, value] : n.attrs.items()) {
      w.str(name);
      w.attr(value);
    }
    w.u32(static_cast<uint32_t>(n.sym_attrs.size()));
    for (const SymAttr& sa : n.sym_attrs) {
      w.str(sa.name);
      w.i64(sa.index);
      w.expr(sa.expr);
    }
    ids[n.outputs[0]] = next++;
  }
  for (ValueId v : sg.outputs) {
    auto it = ids.find(v);
    if (it == ids.end()) return Error(ErrorCode::Internal, "mlx: subgraph output not produced");
    w.i32(it->second);
  }
  for (const Subgraph::State& st : sg.states) {
    if (st.update == kNoValue) {
      w.i32(-1);
      continue;
    }
    auto it = ids.find(st.update);
    if (it == ids.end()) return Error(ErrorCode::Internal, "mlx: a held state's new value is not produced in the segment");
    w.i32(it->second);
  }
  return w.take();
}

// ---------------------------------------------------------------- run half

// Messages may quote names read from an untrusted payload: anything but printable ASCII -> '?'.
Error bad(std::string why) {
  for (char& ch : why) {
    if (ch < 0x20 || ch > 0x7e) ch = '?';
  }
  if (why.size() > 400) why = why.substr(0, 400) + "...";
  return Error(ErrorCode::InvalidProgram, "mlx payload: " + why);
}

/// The device a new handle runs on: MLX's GPU, or its CPU with the load setting mlx.device=cpu
/// (LoadOptions::backend_settings) or, without that setting, KILN_MLX_DEVICE=cpu.
Result<mx::Device> pick_device(const BackendSettings& settings) {
  std::string want, from = "KILN_MLX_DEVICE";
  for (const auto& [k, v] : settings) {
    if (k.rfind("mlx.", 0) == 0 && k != "mlx.device" && k != "mlx.max_array_bytes") {
      return Error(ErrorCode::NotFound, "mlx: unknown setting '" + k + "'");
    }
  }
  if (const std::string* s = find_setting(settings, "mlx.device")) {
    want = *s;
    from = "setting mlx.device";
  } else if (const char* env = std::getenv("KILN_MLX_DEVICE")) {
    want = env;
  }
  if (want == "cpu") return mx::Device(mx::Device::cpu);
  if (!want.empty() && want != "gpu") {
    return Error(ErrorCode::NotFound, "mlx: " + from + "='" + want + "' is neither 'cpu' nor 'gpu'");
  }
  bool gpu = false;
  try {
    gpu = mx::is_available(mx::Device(mx::Device::gpu));
  } catch (const std::exception&) {
    gpu = false;
  }
  if (!gpu) return Error(ErrorCode::NotFound, "mlx: no GPU device (load with the setting mlx.device=cpu, or set KILN_MLX_DEVICE=cpu, to run on MLX's CPU device)");
  return mx::Device(mx::Device::gpu);
}

/// The largest array (bytes) init accepts: the setting mlx.max_array_bytes, else the machine's
/// physical memory (UINT64_MAX when unknown). NotFound for a setting that is not a decimal count.
Result<uint64_t> max_array_bytes(const BackendSettings& settings) {
  if (const std::string* s = find_setting(settings, "mlx.max_array_bytes")) {
    uint64_t v = 0;
    bool ok = !s->empty() && s->size() <= 19;
    for (char ch : *s) {
      ok = ok && ch >= '0' && ch <= '9';
      v = v * 10 + static_cast<uint64_t>(ch - '0');
    }
    if (!ok) return Error(ErrorCode::NotFound, "mlx: setting mlx.max_array_bytes='" + *s + "' is not a byte count");
    return v;
  }
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return UINT64_MAX;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
}

/// Bytes of a value of type t, saturating at UINT64_MAX (sizes come from an untrusted payload;
/// negative sizes count as UINT64_MAX).
uint64_t value_bytes(const TensorType& t) {
  uint64_t n = dtype_size(t.dtype);
  for (int64_t d : t.sizes) {
    if (d < 0) return UINT64_MAX;
    if (d != 0 && n > UINT64_MAX / static_cast<uint64_t>(d)) return UINT64_MAX;
    n *= static_cast<uint64_t>(d);
  }
  return n;
}

/// MemoryAllocationFailed when an array of the lazy graphs under `roots` (inputs and siblings,
/// transitively) is larger than `max_bytes`: evaluating it would need that allocation.
Error check_array_sizes(const std::vector<mx::array>& roots, uint64_t max_bytes) {
  std::vector<mx::array> stack(roots.begin(), roots.end());
  std::set<std::uintptr_t> seen;
  while (!stack.empty()) {
    const mx::array a = stack.back();
    stack.pop_back();
    if (!seen.insert(a.id()).second) continue;
    if (a.nbytes() > max_bytes) {
      std::string shape;
      for (int d : a.shape()) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
      return Error(ErrorCode::MemoryAllocationFailed,
                   "mlx: the computation builds an array [" + shape + "] of " + std::to_string(a.nbytes()) +
                       " bytes, above the limit of " + std::to_string(max_bytes) +
                       " (load setting mlx.max_array_bytes; default: this machine's memory)");
    }
    for (const mx::array& in : a.inputs()) stack.push_back(in);
    for (const mx::array& sib : a.siblings()) stack.push_back(sib);
  }
  return {};
}

/// One node of the verified payload, ready to build.
struct Step {
  const mlxb::OpLowering* lowering = nullptr;
  NodeView node;
  std::vector<int32_t> inputs;       // value ids, -1 = None
  std::vector<mx::array> prepared;   // from OpLowering::prepare, evaluated at init
};

/// Everything the traced function needs at one binding of the symbols (for a segment of fixed
/// shapes, the only one); shared by the raw and the compiled function.
struct Plan {
  mx::Device dev = mx::Device(mx::Device::cpu);
  mx::Dtype compute = mx::float32;  // float32 values are computed in this dtype
  bool taps_conv = false;           // BuildCtx::taps_conv
  size_t num_inputs = 0;
  size_t num_states = 0;
  std::vector<mx::array> constants;
  std::vector<Step> steps;
  std::vector<int32_t> outputs;
  std::vector<int32_t> state_updates;  // per held state: the value id of its new value, -1 = unchanged
  std::vector<TensorType> value_types;
  std::vector<bool> is_output;  // per value id: a delegate output
  /// The first value id after the inputs, states and constants (= the first node's).
  size_t first_node() const { return num_inputs + num_states + constants.size(); }
};

/// Where init failed: the payload node (index into the payload's node list, which is also the
/// position in Subgraph::nodes of the segment lower_subgraph wrote) and its op; SIZE_MAX when
/// the failure is not one node's.
struct BuildSite {
  size_t node = SIZE_MAX;
  std::string op;
};
/// Points `site` at the node that produces value `id` (none for inputs and constants).
void point_at(BuildSite* site, const Plan& p, int32_t id) {
  const size_t first = p.first_node();
  if (id < 0 || static_cast<size_t>(id) < first || static_cast<size_t>(id) - first >= p.steps.size()) return;
  site->node = static_cast<size_t>(id) - first;
  site->op = p.steps[site->node].node.op;
}

/// Builds step `s` from the values built so far (`vals`, indexed by value id): float32-inside ops
/// get their inputs in float32 (converted up from the compute dtype), the result is converted to
/// the dtype the value has inside the computation (a float32-inside result that is a delegate
/// output, `is_output`, stays float32), and its shape is checked against Kiln's inference.
/// Throws what MLX throws, or std::invalid_argument for a shape that differs.
mx::array build_step(mlxb::BuildCtx& ctx, const Step& s, const std::vector<std::optional<mx::array>>& vals,
                     bool is_output) {
  const mx::Dtype compute = ctx.compute;
  const bool reduced = compute != mx::float32;
  mlxb::Inputs in;
  const bool up = reduced && s.lowering->float32_inside;
  for (size_t k = 0; k < s.inputs.size(); ++k) {
    const int32_t id = s.inputs[k];
    const bool replaced = !s.prepared.empty() && ((s.lowering->prepared_replaces >> k) & 1u);
    std::optional<mx::array> a = id < 0 || replaced ? std::nullopt : vals[static_cast<size_t>(id)];
    if (up && a && a->dtype() == compute) a = mx::astype(*a, mx::float32, ctx.dev);
    in.push_back(std::move(a));
  }
  if (up) ctx.compute = mx::float32;
  struct Restore {  // the compute dtype back, also when build throws
    mlxb::BuildCtx& c;
    mx::Dtype d;
    ~Restore() { c.compute = d; }
  } restore{ctx, compute};
  mx::array y = s.lowering->build(ctx, s.node, in, s.prepared);
  ctx.compute = compute;  // (also done by `restore`)
  const TensorType& want = s.node.out;
  // A float32-inside result that is a delegate output stays float32 (e.g. a sum beyond the
  // float16 range); consumers inside the graph then compute in float32 as MLX promotes.
  const bool keep32 = up && y.dtype() == mx::float32 && is_output;
  if (!keep32 && y.dtype() != ctx.dtype(want.dtype)) y = mx::astype(y, ctx.dtype(want.dtype), ctx.dev);
  bool same = y.ndim() == want.sizes.size();
  for (size_t d = 0; same && d < want.sizes.size(); ++d) same = y.shape(static_cast<int>(d)) == want.sizes[d];
  if (!same) throw std::invalid_argument(s.node.op + " built a result of another shape than " + want.to_string());
  return y;
}

/// The dtype a held state of Kiln dtype `d` is kept in inside MLX: a float32 state in the compute
/// dtype (a float16 KV cache for a float16 segment: no conversion per call), others as they are.
mx::Dtype state_storage(DType d, mx::Dtype compute) {
  return d == DType::Float32 ? compute : mlxb::to_mx(d);
}

/// Builds the outputs (made contiguous), then the new values of the held states that change (in
/// their storage dtype), then the runtime-check flags. `inputs` holds the delegate inputs followed
/// by the held states' current values. `building`, when given, is the index of the step being
/// built while it is built (SIZE_MAX after the last), so that a caller catching MLX's exception
/// knows which payload node threw.
std::vector<mx::array> run_plan(const Plan& p, const std::vector<mx::array>& inputs, std::vector<std::string>* messages,
                                size_t* building = nullptr) {
  std::vector<std::optional<mx::array>> vals;
  vals.reserve(p.value_types.size());
  const bool reduced = p.compute != mx::float32;
  for (size_t i = 0; i < p.num_inputs; ++i) {
    const mx::array& a = inputs[i];
    vals.emplace_back(reduced && a.dtype() == mx::float32 ? mx::astype(a, p.compute, p.dev) : a);
  }
  for (size_t i = 0; i < p.num_states; ++i) vals.emplace_back(inputs[p.num_inputs + i]);  // already stored in compute
  for (const auto& a : p.constants) vals.emplace_back(a);  // converted at init
  std::vector<mlxb::RuntimeCheck> checks;
  mlxb::BuildCtx ctx{p.dev, &checks, p.compute, p.taps_conv};
  for (size_t k = 0; k < p.steps.size(); ++k) {
    if (building) *building = k;
    const bool out = p.is_output[vals.size()];
    vals.emplace_back(build_step(ctx, p.steps[k], vals, out));
  }
  if (building) *building = SIZE_MAX;
  std::vector<mx::array> out;
  for (int32_t id : p.outputs) {
    const mx::array& v = *vals[static_cast<size_t>(id)];
    const mx::Dtype dt = mlxb::to_mx(p.value_types[static_cast<size_t>(id)].dtype);
    out.push_back(mx::contiguous(v.dtype() == dt ? v : mx::astype(v, dt, p.dev), false, p.dev));
  }
  for (size_t i = 0; i < p.num_states; ++i) {
    const int32_t id = p.state_updates[i];
    if (id < 0) continue;
    const mx::array& v = *vals[static_cast<size_t>(id)];
    const mx::Dtype dt = state_storage(p.value_types[p.num_inputs + i].dtype, p.compute);
    out.push_back(v.dtype() == dt ? v : mx::astype(v, dt, p.dev));
  }
  for (auto& c : checks) {
    out.push_back(c.flag);
    if (messages) messages->push_back(c.message);
  }
  return out;
}

/// Whether `op` builds differently with BuildCtx::taps_conv (2-D convolutions on MLX's CPU device).
bool uses_taps(const std::string& op) { return op == "aten.convolution" || op == "kiln.weight_quantized_convolution"; }

/// Builds one node alone at its shapes on MLX's CPU device without evaluating anything: its
/// inputs are lazy zeros (constants go through the op's prepare as init does), then build_step
/// (both convolution forms for convolutions). Catches what tracing the node inside a segment
/// would throw at init (MLX's own shape, dtype and attribute checks), as NotSupported naming it.
Error trace_node(const mlxb::NodeView& v) {
  const mlxb::OpLowering* l = mlxb::find_lowering(v.op);
  if (l == nullptr) return mlxb::no("op " + v.op + " has no mlx lowering");
  try {
    const mx::Device dev(mx::Device::cpu);
    Step s;
    s.lowering = l;
    s.node = v;
    std::vector<std::optional<mx::array>> vals;
    mlxb::Inputs consts;
    for (size_t i = 0; i < v.in.size(); ++i) {
      if (!v.in[i]) {
        s.inputs.push_back(-1);
        consts.emplace_back(std::nullopt);
        continue;
      }
      s.inputs.push_back(static_cast<int32_t>(vals.size()));
      mx::array z = mx::zeros(mlxb::shape_of(v.in[i]->sizes), mlxb::to_mx(v.in[i]->dtype), dev);
      consts.emplace_back(v.in_const[i] ? std::optional<mx::array>(z) : std::nullopt);
      vals.emplace_back(std::move(z));
    }
    if (l->prepare != nullptr) s.prepared = l->prepare(s.node, consts, dev);
    std::vector<mlxb::RuntimeCheck> checks;
    for (bool taps : {false, true}) {
      if (taps && !uses_taps(v.op)) break;
      mlxb::BuildCtx ctx{dev, &checks, mx::float32, taps};
      (void)build_step(ctx, s, vals, true);
    }
  } catch (const std::exception& e) {
    return mlxb::no(std::string("MLX does not build it: ") + e.what());
  } catch (...) {
    return mlxb::no("MLX does not build it (a non-standard exception)");
  }
  return {};
}

/// KILN_MLX_PROFILE=1 at load: per handle, the time of each execute phase, printed to stderr when
/// the handle is destroyed. wrap = wrapping inputs (a copy on MLX's CPU device), dispatch = calling
/// the compiled function (replaying its graph), eval = MLX's evaluation (one synchronization),
/// copy = runtime checks and output copies. Everything but eval is the boundary cost. Also counted:
/// the host<->device copies of each execute (one per input and per output, with their bytes), the
/// held states uploaded (created from their initial value: once per session and reset) and the
/// graphs built for new symbol bindings.
struct Profile {
  bool on = false;
  uint64_t runs = 0;
  double wrap = 0, dispatch = 0, eval = 0, copy = 0;  // seconds
  uint64_t copies_in = 0, bytes_in = 0, copies_out = 0, bytes_out = 0;
  uint64_t state_uploads = 0, state_upload_bytes = 0, graphs_built = 0;
  double build = 0;  // seconds building graphs for new bindings (not in wrap)
  // Executes of a graph that had run before (the steady decode loop: no trace, no first-run kernel
  // compile): their count, total time and time outside evaluation.
  uint64_t steady_runs = 0;
  double steady_total = 0, steady_outside = 0;
};

/// A held state (a KV cache) in MLX's memory, in its storage dtype (state_storage).
struct MlxState : DelegateState {
  mx::array value;
  mx::Device dev;
  MlxState(mx::array v, mx::Device d) : value(std::move(v)), dev(d) {}
  Error read(void* dst, size_t nbytes) const override {
    try {
      // The state's own dtype is float32 when stored in a reduced compute dtype.
      const mx::Dtype want = value.dtype() == mx::float16 || value.dtype() == mx::bfloat16 ? mx::float32 : value.dtype();
      mx::array a = mx::contiguous(value.dtype() == want ? value : mx::astype(value, want, dev), false, dev);
      mx::eval(a);
      if (a.nbytes() != nbytes) return Error(ErrorCode::Internal, "mlx: held state has " + std::to_string(a.nbytes()) + " bytes, expected " + std::to_string(nbytes));
      std::memcpy(dst, a.data<uint8_t>(), nbytes);
    } catch (const std::exception& e) {
      return Error(ErrorCode::Internal, std::string("mlx: reading a held state failed: ") + e.what());
    }
    return {};
  }
};

/// A decoded payload (not yet checked against Kiln's op definitions: `instantiate` does that at each
/// binding of the symbols).
struct Payload {
  struct Node {
    std::string op;
    std::vector<int32_t> inputs;
    Attributes given;  // as written (symbolic attributes hold placeholders)
    std::vector<SymAttr> sym;
  };
  DType compute = DType::Float32;
  std::vector<SymbolDef> symbols;  // empty: fixed shapes
  std::vector<TensorType> inputs;  // upper bounds
  std::vector<std::vector<SymExpr>> input_sym;
  std::vector<TensorType> states, constants;
  std::vector<Node> nodes;
  std::vector<int32_t> outputs, state_updates;
  size_t first_node() const { return inputs.size() + states.size() + constants.size(); }
};

/// What every binding's plan shares: the constants as MLX arrays (converted to the compute dtype,
/// released where only prepared forms read them) and the prepared arrays of nodes without
/// symbolic attributes (prepared once, at init).
struct Shared {
  mx::Device dev = mx::Device(mx::Device::cpu);
  mx::Dtype compute = mx::float32;
  bool taps_conv = false;
  uint64_t max_bytes = UINT64_MAX;
  std::vector<mx::array> constants;
  std::vector<std::optional<std::vector<mx::array>>> prepared;  // per payload node
};

/// One binding's plan and its compiled function (MlxHandle::graphs).
struct Graph1 {
  std::vector<int64_t> binding;
  std::shared_ptr<Plan> plan;
  std::function<std::vector<mx::array>(const std::vector<mx::array>&)> fn;  // compiled
  std::vector<std::string> check_messages;
  uint64_t runs = 0;  // executes that reached evaluation
};

/// Compiled graphs a handle of a segment with symbolic sizes keeps, most recently used first: the
/// decode step (seq = 1) stays while prompts of other lengths come and go. A binding not among them
/// is instantiated, traced and compiled again (MLX's own compile cache keys on the shapes too).
constexpr size_t kGraphCacheSize = 8;

struct MlxHandle : DelegateHandle {
  std::shared_ptr<const Payload> payload;
  std::shared_ptr<Shared> shared;
  std::list<Graph1> graphs;  // most recently used first
  std::vector<TensorType> in_types, out_types;  // upper bounds (the program's boundary types)
  Profile profile;
  ~MlxHandle() override {
    const Profile& p = profile;
    if (!p.on || p.runs == 0) return;
    const double n = static_cast<double>(p.runs), total = p.wrap + p.dispatch + p.eval + p.copy;
    std::fprintf(stderr,
                 "[kiln mlx] %llu executes, per execute: wrap %.3f ms, dispatch %.3f ms, eval %.3f ms, copy %.3f ms; "
                 "outside eval %.2f%%; host<->device copies per execute: %.2f in (%.0f bytes), %.2f out (%.0f bytes); "
                 "held states uploaded: %llu (%llu bytes); graphs built: %llu (%.1f ms); steady: %llu executes, "
                 "%.3f ms each, outside eval %.2f%%\n",
                 static_cast<unsigned long long>(p.runs), 1e3 * p.wrap / n, 1e3 * p.dispatch / n, 1e3 * p.eval / n,
                 1e3 * p.copy / n, total > 0 ? 100.0 * (total - p.eval) / total : 0.0, static_cast<double>(p.copies_in) / n,
                 static_cast<double>(p.bytes_in) / n, static_cast<double>(p.copies_out) / n,
                 static_cast<double>(p.bytes_out) / n, static_cast<unsigned long long>(p.state_uploads),
                 static_cast<unsigned long long>(p.state_upload_bytes), static_cast<unsigned long long>(p.graphs_built),
                 1e3 * p.build, static_cast<unsigned long long>(p.steady_runs),
                 p.steady_runs ? 1e3 * p.steady_total / static_cast<double>(p.steady_runs) : 0.0,
                 p.steady_total > 0 ? 100.0 * p.steady_outside / p.steady_total : 0.0);
  }
};

mx::Shape to_shape(const std::vector<int64_t>& s) {
  mx::Shape out;
  for (int64_t d : s) out.push_back(static_cast<int32_t>(d));
  return out;
}

uint64_t shape_rules_numel(const TensorType& t) {
  uint64_t n = 1;
  for (int64_t d : t.sizes) {
    if (n > (1ull << 40) / static_cast<uint64_t>(d)) return ~0ull / 16;
    n *= static_cast<uint64_t>(d);
  }
  return n;
}

/// Decodes a version 1 or 2 payload and checks it against the program's delegate call (boundary
/// counts and types, constant byte sizes, value ids in range). InvalidProgram otherwise.
Result<std::shared_ptr<Payload>> decode(std::span<const uint8_t> bytes, std::span<const std::span<const uint8_t>> constants,
                                        std::span<const TensorType> inputs, std::span<const TensorType> outputs,
                                        BuildSite* site) {
  Reader r(bytes);
  if (r.u32() != kMagic) return bad("wrong magic (not an mlx payload)");
  const uint32_t version = r.u32();
  if (version != 1 && version != kVersion) {
    return bad("version " + std::to_string(version) + " (this runtime reads versions 1 and 2)");
  }
  const uint8_t compute = r.u8();
  if (!r.ok() || !is_valid_dtype(compute) || !is_compute_float(static_cast<DType>(compute))) {
    return bad("compute dtype must be float32, float16 or bfloat16");
  }
  auto p = std::make_shared<Payload>();
  p->compute = static_cast<DType>(compute);
  if (version >= 2) {
    const uint32_t nsym = r.u32();
    if (!r.ok() || nsym > 64) return bad("symbol count");
    for (uint32_t i = 0; i < nsym; ++i) {
      SymbolDef sd;
      sd.name = r.str();
      sd.min = r.i64();
      sd.max = r.i64();
      if (!r.ok() || sd.min < 0 || sd.min > sd.max || sd.max > kMaxSymbolValue) return bad("symbol " + std::to_string(i));
      p->symbols.push_back(std::move(sd));
    }
  }
  const uint32_t ni = r.u32(), no = r.u32(), nc = r.u32();
  const uint32_t ns = version >= 2 ? r.u32() : 0;
  if (!r.ok() || ni != inputs.size() || no != outputs.size() || nc != constants.size() || no == 0 || ns > 4096) {
    return bad("boundary counts differ from the program's delegate call");
  }
  constexpr int64_t kMaxDim = std::numeric_limits<int32_t>::max();
  auto sane = [&](const TensorType& t) {
    for (int64_t d : t.sizes) {
      if (d <= 0 || d > kMaxDim) return false;
    }
    return true;
  };
  for (uint32_t i = 0; i < ni; ++i) {
    const TensorType t = r.type();
    if (!r.ok() || t != inputs[i] || !sane(t)) return bad("input " + std::to_string(i) + " type differs from the program's");
    p->inputs.push_back(t);
    std::vector<SymExpr> sym;
    if (version >= 2 && r.u8() != 0) {
      for (size_t d = 0; d < t.sizes.size(); ++d) sym.push_back(r.expr(p->symbols.size()));
      if (!r.ok()) return bad("input " + std::to_string(i) + " size expressions");
    }
    p->input_sym.push_back(std::move(sym));
  }
  for (uint32_t i = 0; i < ns; ++i) {
    const TensorType t = r.type();
    if (!r.ok() || !sane(t)) return bad("state " + std::to_string(i) + " type");
    p->states.push_back(t);
  }
  for (uint32_t c = 0; c < nc; ++c) {
    const TensorType t = r.type();
    if (!r.ok() || !sane(t)) return bad("constant " + std::to_string(c) + " type");
    if (shape_rules_numel(t) * dtype_size(t.dtype) != constants[c].size()) {
      return bad("constant " + std::to_string(c) + " byte size differs from " + t.to_string());
    }
    p->constants.push_back(t);
  }
  const uint32_t nn = r.u32();
  if (!r.ok() || nn > r.left()) return bad("node count");
  const size_t first = p->first_node();
  for (uint32_t k = 0; k < nn; ++k) {
    const std::string where = "node " + std::to_string(k);
    Payload::Node n;
    n.op = r.str();
    site->node = k;
    site->op = n.op;
    const uint32_t nin = r.u32();
    if (!r.ok() || nin > r.left() / 4) return bad(where + ": truncated");
    for (uint32_t i = 0; i < nin; ++i) {
      const int32_t id = r.i32();
      if (id < -1 || id >= static_cast<int32_t>(first + k)) return bad(where + ": input id out of range");
      n.inputs.push_back(id);
    }
    const uint32_t na = r.u32();
    if (!r.ok() || na > r.left()) return bad(where + ": truncated");
    for (uint32_t a = 0; a < na; ++a) {
      std::string name = r.str();
      AttrValue v = r.attr();
      if (!r.ok()) return bad(where + ": truncated attribute");
      n.given.set(std::move(name), std::move(v));
    }
    if (version >= 2) {
      const uint32_t nsa = r.u32();
      if (!r.ok() || nsa > r.left()) return bad(where + ": truncated");
      if (nsa > 0 && p->symbols.empty()) return bad(where + ": symbolic attributes without symbols");
      for (uint32_t a = 0; a < nsa; ++a) {
        SymAttr sa;
        sa.name = r.str();
        sa.index = r.i64();
        sa.expr = r.expr(p->symbols.size());
        if (!r.ok()) return bad(where + ": symbolic attribute");
        Attributes probe = n.given;
        if (!set_int_attribute(probe, sa.name, sa.index, 0).ok()) return bad(where + ": symbolic attribute '" + sa.name + "' is no int attribute");
        n.sym.push_back(std::move(sa));
      }
    }
    p->nodes.push_back(std::move(n));
  }
  site->node = SIZE_MAX;
  const size_t nv = first + nn;
  std::set<int32_t> seen;
  for (uint32_t o = 0; o < no; ++o) {
    const int32_t id = r.i32();
    if (!r.ok() || id < static_cast<int32_t>(first) || id >= static_cast<int32_t>(nv) || !seen.insert(id).second) {
      return bad("output " + std::to_string(o) + " id invalid or repeated");
    }
    p->outputs.push_back(id);
  }
  for (uint32_t i = 0; i < ns; ++i) {
    const int32_t id = r.i32();
    if (!r.ok() || id < -1 || (id >= 0 && (id < static_cast<int32_t>(first) || id >= static_cast<int32_t>(nv)))) {
      return bad("state " + std::to_string(i) + " update id invalid");
    }
    p->state_updates.push_back(id);
  }
  if (!r.done()) return bad("trailing bytes");
  return p;
}

/// The plan of payload `pl` at the symbol values `binding` (empty for fixed shapes): each node's
/// symbolic attributes set, its attributes normalized and its type inferred by Kiln's own op
/// definitions at this binding's sizes, the mlx table's check; prepared arrays taken from `sh`
/// (nodes without symbolic attributes) or prepared now (and, with `keep_prepared`, stored there);
/// new arrays converted to the compute dtype and evaluated. InvalidProgram / MemoryAllocationFailed
/// with the node (`site`) at fault; MLX's exceptions propagate.
Result<std::shared_ptr<Plan>> instantiate(const Payload& pl, Shared& sh, std::span<const int64_t> binding, BuildSite* site,
                                          bool keep_prepared) {
  auto plan = std::make_shared<Plan>();
  plan->dev = sh.dev;
  plan->compute = sh.compute;
  plan->taps_conv = sh.taps_conv;
  plan->num_inputs = pl.inputs.size();
  plan->num_states = pl.states.size();
  plan->constants = sh.constants;
  plan->outputs = pl.outputs;
  plan->state_updates = pl.state_updates;
  for (size_t i = 0; i < pl.inputs.size(); ++i) {
    TensorType t = pl.inputs[i];
    if (!pl.input_sym[i].empty()) {
      if (Error e = eval_sizes(pl.input_sym[i], binding, &t.sizes); !e.ok()) return bad("input " + std::to_string(i) + ": " + e.message());
    }
    plan->value_types.push_back(std::move(t));
  }
  for (const TensorType& t : pl.states) plan->value_types.push_back(t);
  for (const TensorType& t : pl.constants) plan->value_types.push_back(t);
  const int32_t ni = static_cast<int32_t>(pl.inputs.size() + pl.states.size());
  const int32_t nc = static_cast<int32_t>(pl.constants.size());
  std::vector<mx::array> to_eval;
  for (size_t k = 0; k < pl.nodes.size(); ++k) {
    const Payload::Node& pn = pl.nodes[k];
    const std::string where = "node " + std::to_string(k);
    site->node = k;
    site->op = pn.op;
    Step s;
    s.node.op = pn.op;
    s.inputs = pn.inputs;
    std::vector<const TensorType*> types;
    for (int32_t id : pn.inputs) {
      types.push_back(id < 0 ? nullptr : &plan->value_types[static_cast<size_t>(id)]);
      s.node.in.emplace_back(id < 0 ? std::nullopt : std::optional<TensorType>(plan->value_types[static_cast<size_t>(id)]));
      s.node.in_const.push_back(id >= ni && id < ni + nc);
    }
    Attributes given = pn.given;
    for (const SymAttr& sa : pn.sym) {
      auto v = sa.expr.eval(binding);
      if (!v.ok()) return bad(where + ": " + v.error().message());
      if (Error e = set_int_attribute(given, sa.name, sa.index, v.value()); !e.ok()) return bad(where + ": " + e.message());
    }
    const OpDef* def = OpRegistry::get().find(s.node.op);
    s.lowering = mlxb::find_lowering(s.node.op);
    if (def == nullptr || s.lowering == nullptr) return bad(where + ": op '" + s.node.op + "' has no mlx lowering");
    auto attrs = def->normalize_attributes(given);
    if (!attrs.ok()) return bad(where + ": " + attrs.error().message());
    auto out = def->infer_types(types, attrs.value());
    if (!out.ok()) return bad(where + " (" + s.node.op + "): " + out.error().message());
    if (out.value().size() != 1) return bad(where + ": ops with several outputs are not lowered");
    s.node.attrs = std::move(attrs.value());
    s.node.out = out.value()[0];
    // Before check_node, which multiplies the sizes in int64 (an inferred type may overflow it).
    if (const uint64_t nb = value_bytes(s.node.out); nb > sh.max_bytes) {
      return Error(ErrorCode::MemoryAllocationFailed,
                   "mlx: " + where + " (" + s.node.op + "): its output " + s.node.out.to_string() + " needs " +
                       (nb == UINT64_MAX ? std::string("more than 2^64") : std::to_string(nb)) +
                       " bytes, above the limit of " + std::to_string(sh.max_bytes) +
                       " (load setting mlx.max_array_bytes; default: this machine's memory)");
    }
    if (Error e = mlxb::check_node(s.node); !e.ok()) return bad(where + " (" + s.node.op + "): " + e.message());
    // Constant-only work: prepared once (nodes whose attributes do not depend on the symbols),
    // evaluated here so that the traced graph reads it as constants.
    if (s.lowering->prepare != nullptr) {
      if (pn.sym.empty() && sh.prepared[k]) {
        s.prepared = *sh.prepared[k];
      } else {
        mlxb::Inputs consts;
        for (int32_t id : s.inputs) {
          const bool is_const = id >= ni && id < ni + nc;
          consts.push_back(is_const ? std::optional<mx::array>(sh.constants[static_cast<size_t>(id - ni)]) : std::nullopt);
        }
        s.prepared = s.lowering->prepare(s.node, consts, sh.dev);  // in float32, converted here
        for (mx::array& a : s.prepared) {
          if (!s.lowering->float32_inside && sh.compute != mx::float32 && a.dtype() == mx::float32) a = mx::astype(a, sh.compute, sh.dev);
          to_eval.push_back(a);
        }
        if (pn.sym.empty() && keep_prepared) sh.prepared[k] = s.prepared;
      }
    }
    plan->value_types.push_back(s.node.out);
    plan->steps.push_back(std::move(s));
  }
  site->node = SIZE_MAX;
  KILN_RETURN_IF_ERROR(check_array_sizes(to_eval, sh.max_bytes));
  if (!to_eval.empty()) {
    try {
      mx::eval(to_eval);
    } catch (const std::exception&) {
      // Find the node whose prepared arrays fail, for the error (then rethrow).
      for (size_t k = 0; k < plan->steps.size(); ++k) {
        if (plan->steps[k].prepared.empty()) continue;
        site->node = k;
        site->op = plan->steps[k].node.op;
        mx::eval(plan->steps[k].prepared);
      }
      site->node = SIZE_MAX;
      throw;
    }
  }
  for (size_t i = 0; i < pl.states.size(); ++i) {
    const int32_t id = pl.state_updates[i];
    if (id >= 0 && plan->value_types[static_cast<size_t>(id)] != pl.states[i]) {
      point_at(site, *plan, id);
      return bad("the new value of state " + std::to_string(i) + " is " + plan->value_types[static_cast<size_t>(id)].to_string() +
                 ", the state is " + pl.states[i].to_string());
    }
  }
  plan->is_output.assign(plan->value_types.size(), false);
  for (int32_t id : plan->outputs) plan->is_output[static_cast<size_t>(id)] = true;
  for (int32_t id : plan->state_updates) {
    if (id >= 0) plan->is_output[static_cast<size_t>(id)] = true;
  }
  return plan;
}

/// Lazy zeros of the plan's input types and of the held states (storage dtype): for tracing.
std::vector<mx::array> probe_inputs(const Plan& p) {
  std::vector<mx::array> probe;
  for (size_t i = 0; i < p.num_inputs + p.num_states; ++i) {
    const TensorType& t = p.value_types[i];
    const mx::Dtype dt = i < p.num_inputs ? mlxb::to_mx(t.dtype) : state_storage(t.dtype, p.compute);
    probe.push_back(mx::zeros(to_shape(t.sizes), dt, p.dev));
  }
  return probe;
}

/// Traces `plan` once (lazy: nothing evaluated) to validate it: every array within the size limit,
/// the outputs of the types `outputs` says (for a symbolic segment: `exact` false, each dim at most
/// the bound). The runtime-check messages go to `messages`.
Error trace_plan(const Plan& plan, uint64_t max_bytes, std::span<const TensorType> outputs, bool exact,
                 std::vector<std::string>* messages, BuildSite* site) {
  size_t building = SIZE_MAX;
  std::vector<mx::array> traced;
  try {
    traced = run_plan(plan, probe_inputs(plan), messages, &building);
  } catch (...) {
    if (building < plan.steps.size()) {
      site->node = building;
      site->op = plan.steps[building].node.op;
    }
    throw;
  }
  KILN_RETURN_IF_ERROR(check_array_sizes(traced, max_bytes));
  for (size_t o = 0; o < outputs.size(); ++o) {
    bool fits = traced[o].dtype() == mlxb::to_mx(outputs[o].dtype) && traced[o].ndim() == outputs[o].sizes.size();
    for (size_t d = 0; fits && d < outputs[o].sizes.size(); ++d) {
      const int64_t got = traced[o].shape(static_cast<int>(d)), bound = outputs[o].sizes[d];
      fits = exact ? got == bound : got <= bound;
    }
    if (!fits) {
      point_at(site, plan, plan.outputs[o]);
      return bad("output " + std::to_string(o) + " does not build to " + outputs[o].to_string());
    }
  }
  return {};
}

/// A compiled graph for `plan` (its runtime-check messages from a trace).
Graph1 compile_graph(std::shared_ptr<Plan> plan, std::vector<int64_t> binding, std::vector<std::string> messages) {
  Graph1 g;
  g.binding = std::move(binding);
  g.check_messages = std::move(messages);
  g.fn = mx::compile([plan](const std::vector<mx::array>& in) { return run_plan(*plan, in, nullptr); });
  g.plan = std::move(plan);
  return g;
}

class MlxBackend : public Backend {
 public:
  std::string name() const override { return "mlx"; }
  /// Symbolic sizes are lowered: the payload carries the expressions and each binding gets its own
  /// graph (kGraphCacheSize of them kept per handle).
  std::string symbolic_sizes_reason() const override { return ""; }
  bool holds_state() const override { return true; }

  Error support(size_t node, const Graph& graph) const override { return support_node(graph, graph.nodes()[node]); }

  Result<std::vector<uint8_t>> lower(const Subgraph& subgraph) const override { return lower_subgraph(subgraph); }

  Error is_available(const BackendSettings& settings) const override {
    auto d = pick_device(settings);
    if (!d.ok()) return d.error();
    auto limit = max_array_bytes(settings);
    return limit.ok() ? Error() : limit.error();
  }

  Result<std::unique_ptr<DelegateHandle>> init(std::span<const uint8_t> payload,
                                               std::span<const std::span<const uint8_t>> constants,
                                               std::span<const TensorType> inputs,
                                               std::span<const TensorType> outputs,
                                               const DelegateOptions& options) const override {
    const BackendSettings no_settings;
    const BackendSettings& settings = options.settings ? *options.settings : no_settings;
    auto dev = pick_device(settings);
    if (!dev.ok()) return dev.error();
    auto limit = max_array_bytes(settings);
    if (!limit.ok()) return limit.error();
    BuildSite site;
    auto h = init_guarded(dev.value(), limit.value(), payload, constants, inputs, outputs, std::nullopt, &site);
    if (!h.ok()) return h;
    // The held states the payload expects are the program's (a damaged size would otherwise show
    // only at the first call, after a session allocated the program's states).
    const Payload& pl = *static_cast<MlxHandle&>(*h.value()).payload;
    if (pl.states.size() != options.held_states.size()) {
      return bad("the segment holds " + std::to_string(pl.states.size()) + " states, the program's call " +
                 std::to_string(options.held_states.size()));
    }
    for (size_t i = 0; i < pl.states.size(); ++i) {
      if (pl.states[i] != options.held_states[i]) {
        return bad("held state " + std::to_string(i) + " is " + pl.states[i].to_string() + " in the segment, " +
                   options.held_states[i].to_string() + " in the program");
      }
    }
    return h;
  }

  /// Support decided by building: the segment is built as init builds it (decoded and
  /// re-verified, constants prepared and evaluated, traced, compiled), on MLX's CPU device, which
  /// every MLX build has, so the check runs on any machine (`*checked` is always true); segments
  /// with 2-D convolutions are built both ways init may build them (MLX's convolution on a GPU,
  /// the im2col / taps forms on the CPU device). On failure `*node_at_fault` is the payload node
  /// that failed: lower_subgraph writes node k of the payload from subgraph.nodes[k], so it is
  /// also the position in subgraph.nodes (SIZE_MAX when the failure is not one node's).
  Error check_build(const Subgraph& subgraph, std::span<const uint8_t> payload, size_t* node_at_fault,
                    bool* checked) const override {
    *node_at_fault = SIZE_MAX;
    *checked = true;
    const Graph& g = *subgraph.graph;
    const SubgraphBoundary b(subgraph);
    auto limit = max_array_bytes(BackendSettings{});
    if (!limit.ok()) return limit.error();
    bool has_conv = false;
    for (size_t i : subgraph.nodes) has_conv = has_conv || uses_taps(g.nodes()[i].op);
    for (bool taps : {true, false}) {
      if (!taps && !has_conv) break;
      BuildSite site;
      auto h = init_guarded(mx::Device(mx::Device::cpu), limit.value(), payload, b.constants, b.inputs, b.outputs, taps,
                            &site);
      if (!h.ok()) {
        if (site.node >= subgraph.nodes.size()) return Error(ErrorCode::NotSupported, h.error().message());
        *node_at_fault = site.node;
        return Error(ErrorCode::NotSupported, "mlx does not build node " + std::to_string(site.node) + " (" + site.op +
                                                  ") of the segment: " + h.error().message());
      }
    }
    return {};
  }

  Error execute(DelegateHandle& handle, std::span<const Tensor* const> inputs,
                std::span<Tensor* const> outputs) const override {
    return execute_in_context(handle, inputs, outputs, ExecuteContext{});
  }

  Error execute_in_context(DelegateHandle& handle, std::span<const Tensor* const> inputs, std::span<Tensor* const> outputs,
                           const ExecuteContext& context) const override {
    auto& h = static_cast<MlxHandle&>(handle);
    const Payload& pl = *h.payload;
    if (inputs.size() != h.in_types.size() || outputs.size() != h.out_types.size()) {
      return Error(ErrorCode::InvalidArgument, "mlx: wrong number of delegate inputs/outputs");
    }
    if (context.states.size() != pl.states.size()) {
      return Error(ErrorCode::InvalidArgument, "mlx: the call holds " + std::to_string(context.states.size()) +
                                                   " states, the segment " + std::to_string(pl.states.size()));
    }
    for (size_t i = 0; i < pl.states.size(); ++i) {
      const DelegateStateSlot& slot = context.states[i];
      if (slot.state == nullptr || slot.type != pl.states[i] || slot.initial.size() != slot.type.nbytes()) {
        return Error(ErrorCode::InvalidArgument, "mlx: held state " + std::to_string(i) + " is not a " + pl.states[i].to_string());
      }
    }
    const bool symbolic = !pl.symbols.empty();
    if (symbolic && context.symbols.size() != pl.symbols.size()) {
      return Error(ErrorCode::InvalidArgument, "mlx: the call binds " + std::to_string(context.symbols.size()) +
                                                   " symbols, the segment has " + std::to_string(pl.symbols.size()));
    }
    try {
      using clock = std::chrono::steady_clock;
      const auto tb = clock::now();
      // The graph of this binding: the most recent one, another kept one, or a new one.
      const std::vector<int64_t> binding = symbolic ? std::vector<int64_t>(context.symbols.begin(), context.symbols.end())
                                                    : std::vector<int64_t>();
      auto it = std::find_if(h.graphs.begin(), h.graphs.end(), [&](const Graph1& g) { return g.binding == binding; });
      if (it == h.graphs.end()) {
        for (size_t s = 0; s < binding.size(); ++s) {
          if (binding[s] < pl.symbols[s].min || binding[s] > pl.symbols[s].max) {
            return Error(ErrorCode::InvalidArgument, "mlx: symbol '" + pl.symbols[s].name + "' = " + std::to_string(binding[s]) + " is outside [" +
                                                         std::to_string(pl.symbols[s].min) + ", " + std::to_string(pl.symbols[s].max) + "]");
          }
        }
        BuildSite site;
        auto plan = instantiate(pl, *h.shared, binding, &site, false);
        if (!plan.ok()) return plan.error();
        std::vector<std::string> messages;
        KILN_RETURN_IF_ERROR(trace_plan(*plan.value(), h.shared->max_bytes, h.out_types, false, &messages, &site));
        h.graphs.push_front(compile_graph(std::move(plan.value()), binding, std::move(messages)));
        if (h.graphs.size() > kGraphCacheSize) h.graphs.pop_back();
        h.profile.graphs_built++;
        it = h.graphs.begin();
      } else if (it != h.graphs.begin()) {
        h.graphs.splice(h.graphs.begin(), h.graphs, it);
        it = h.graphs.begin();
      }
      Graph1& g = *it;
      const Plan& plan = *g.plan;
      const auto t0 = clock::now();
      h.profile.build += std::chrono::duration<double>(t0 - tb).count();
      for (size_t i = 0; i < inputs.size(); ++i) {
        if (inputs[i]->type() != plan.value_types[i]) {
          return Error(ErrorCode::InvalidArgument, "mlx: input " + std::to_string(i) + " is " + inputs[i]->type().to_string() +
                                                       ", expected " + plan.value_types[i].to_string());
        }
      }
      for (size_t o = 0; o < outputs.size(); ++o) {
        const TensorType& want = plan.value_types[static_cast<size_t>(plan.outputs[o])];
        if (outputs[o]->type() != want) {
          return Error(ErrorCode::InvalidArgument, "mlx: output " + std::to_string(o) + " is " + outputs[o]->type().to_string() +
                                                       ", the segment computes " + want.to_string());
        }
      }
      // Inputs are wrapped like constants (in place where MLX's allocator allows, else copied);
      // `held` keeps a second reference so that MLX never donates (writes into) their buffers.
      std::vector<mx::array> in, held;
      for (size_t i = 0; i < inputs.size(); ++i) {
        in.emplace_back(inputs[i]->data, to_shape(inputs[i]->sizes), mlxb::to_mx(inputs[i]->dtype), [](void*) {});
        h.profile.copies_in++;
        h.profile.bytes_in += inputs[i]->nbytes();
      }
      // Held states: the session's MLX array, or (first call after new_session / reset) one made
      // from the initial bytes; the slot is only set once the call succeeded.
      std::vector<std::optional<mx::array>> fresh(pl.states.size());
      for (size_t i = 0; i < pl.states.size(); ++i) {
        const DelegateStateSlot& slot = context.states[i];
        if (*slot.state) {
          in.push_back(static_cast<const MlxState&>(**slot.state).value);
          continue;
        }
        const TensorType& t = pl.states[i];
        mx::array raw(const_cast<uint8_t*>(slot.initial.data()), to_shape(t.sizes), mlxb::to_mx(t.dtype), [](void*) {});
        mx::array a = mx::astype(raw, state_storage(t.dtype, plan.compute), plan.dev);
        mx::eval(a);  // its own buffer, not the session's bytes
        fresh[i] = a;
        in.push_back(a);
        h.profile.state_uploads++;
        h.profile.state_upload_bytes += a.nbytes();  // in the storage dtype (float16 for a float16 segment)
      }
      held = in;
      const auto t1 = clock::now();
      std::vector<mx::array> out = g.fn(in);
      const auto t2 = clock::now();
      mx::eval(out);
      const auto t3 = clock::now();
      struct Finish {  // adds the copy phase when the scope ends (also on an error return)
        MlxHandle& h;
        clock::time_point t0, t1, t2, t3;
        bool steady;
        ~Finish() {
          if (!h.profile.on) return;
          const auto t4 = clock::now();
          auto s = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
          h.profile.runs++;
          h.profile.wrap += s(t0, t1);
          h.profile.dispatch += s(t1, t2);
          h.profile.eval += s(t2, t3);
          h.profile.copy += s(t3, t4);
          if (steady) {
            h.profile.steady_runs++;
            h.profile.steady_total += s(t0, t4);
            h.profile.steady_outside += s(t0, t4) - s(t2, t3);
          }
        }
      } finish{h, t0, t1, t2, t3, g.runs > 0};
      g.runs++;
      size_t num_updates = 0;
      for (int32_t id : plan.state_updates) num_updates += id >= 0 ? 1 : 0;
      const size_t first_check = outputs.size() + num_updates;
      if (out.size() != first_check + g.check_messages.size()) return Error(ErrorCode::Internal, "mlx: output count");
      for (size_t k = 0; k < g.check_messages.size(); ++k) {
        if (out[first_check + k].item<bool>()) return Error(ErrorCode::InvalidArgument, g.check_messages[k]);
      }
      for (size_t o = 0; o < outputs.size(); ++o) {
        const mx::array& a = out[o];
        const size_t nbytes = outputs[o]->nbytes();
        if (!a.flags().row_contiguous || a.nbytes() != nbytes) {
          return Error(ErrorCode::Internal, "mlx: output " + std::to_string(o) + " is not a contiguous " +
                                                outputs[o]->type().to_string());
        }
        std::memcpy(outputs[o]->data, a.data<uint8_t>(), nbytes);
        h.profile.copies_out++;
        h.profile.bytes_out += nbytes;
      }
      // The call succeeded: the held states take their new values (the old buffers are released).
      size_t u = outputs.size();
      for (size_t i = 0; i < pl.states.size(); ++i) {
        std::unique_ptr<DelegateState>& slot = *context.states[i].state;
        std::optional<mx::array> next = fresh[i];
        if (plan.state_updates[i] >= 0) next = out[u++];
        if (!next) continue;
        if (slot) {
          static_cast<MlxState&>(*slot).value = *next;
        } else {
          slot = std::make_unique<MlxState>(*next, plan.dev);
        }
      }
    } catch (const std::exception& e) {
      return Error(ErrorCode::Internal, std::string("mlx: execute failed: ") + e.what());
    } catch (...) {
      return Error(ErrorCode::Internal, "mlx: execute failed (a non-standard exception)");
    }
    return {};
  }

 private:
  /// init_on with every exception turned into an error value naming the payload node being
  /// built when it was thrown (`site`, also filled for the payload errors of one node).
  static Result<std::unique_ptr<DelegateHandle>> init_guarded(mx::Device dev, uint64_t max_bytes,
                                                              std::span<const uint8_t> payload,
                                                              std::span<const std::span<const uint8_t>> constants,
                                                              std::span<const TensorType> inputs,
                                                              std::span<const TensorType> outputs,
                                                              std::optional<bool> taps_conv, BuildSite* site) {
    std::string what;
    try {
      return init_on(dev, max_bytes, payload, constants, inputs, outputs, taps_conv, site);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
      what = "a non-standard exception";
    }
    std::string where = "building the computation";
    if (site->node != SIZE_MAX) where = "building node " + std::to_string(site->node) + " (" + site->op + ")";
    return Error(ErrorCode::InvalidProgram, "mlx: " + where + " failed: " + what);
  }

  /// Decodes and verifies the payload, prepares constants, traces and compiles. `taps_conv`
  /// overrides the convolution form (default: the taps forms on MLX's CPU device unless
  /// KILN_MLX_CONV=native). `site` tracks the payload node being decoded, prepared or built.
  /// `max_bytes`: the largest array it may build (LoadOptions setting mlx.max_array_bytes).
  /// A segment with symbolic sizes is instantiated and traced at every check binding of its
  /// symbols (check_bindings) and compiled per binding at execute.
  static Result<std::unique_ptr<DelegateHandle>> init_on(mx::Device dev, uint64_t max_bytes,
                                                         std::span<const uint8_t> payload,
                                                         std::span<const std::span<const uint8_t>> constants,
                                                         std::span<const TensorType> inputs,
                                                         std::span<const TensorType> outputs,
                                                         std::optional<bool> taps_conv, BuildSite* site) {
    auto decoded = decode(payload, constants, inputs, outputs, site);
    if (!decoded.ok()) return decoded.error();
    std::shared_ptr<Payload> pl = std::move(decoded.value());
    auto sh = std::make_shared<Shared>();
    sh->dev = dev;
    sh->compute = mlxb::to_mx(pl->compute);
    sh->max_bytes = max_bytes;
    // KILN_MLX_CONV=native keeps MLX's own convolution on the CPU device too (tests use it).
    const char* conv_env = std::getenv("KILN_MLX_CONV");
    sh->taps_conv = taps_conv ? *taps_conv : dev == mx::Device(mx::Device::cpu) && !(conv_env && std::string(conv_env) == "native");
    for (size_t c = 0; c < constants.size(); ++c) {
      // MLX uses the mapped program file in place where its allocator can wrap it (else one copy,
      // here, once). The program outlives the handle; the shared state holds a reference, so MLX
      // never donates (writes into) it.
      const TensorType& t = pl->constants[c];
      sh->constants.emplace_back(const_cast<uint8_t*>(constants[c].data()), to_shape(t.sizes), mlxb::to_mx(t.dtype), [](void*) {});
    }
    sh->prepared.resize(pl->nodes.size());
    // The plan at the upper bound, every node prepared (prepare reads the constants in float32).
    std::vector<int64_t> bound;
    for (const SymbolDef& sd : pl->symbols) bound.push_back(sd.max);
    auto first = instantiate(*pl, *sh, bound, site, true);
    if (!first.ok()) return first.error();
    // Constants read only through prepared forms (conv weights, batch-norm statistics, 4-bit
    // weights for MLX's quantized matmul) by nodes without symbolic attributes are released now
    // that those are evaluated: a placeholder keeps the ids. The rest are converted once to a
    // reduced compute dtype (what later bindings' prepare reads too).
    const int32_t ni = static_cast<int32_t>(pl->inputs.size() + pl->states.size());
    const int32_t nc = static_cast<int32_t>(pl->constants.size());
    std::vector<bool> still_read(static_cast<size_t>(nc), false);
    for (size_t k = 0; k < pl->nodes.size(); ++k) {
      const Step& st = first.value()->steps[k];
      const bool fixed = pl->nodes[k].sym.empty();
      for (size_t j = 0; j < st.inputs.size(); ++j) {
        const int32_t id = st.inputs[j];
        const bool replaced = fixed && !st.prepared.empty() && ((st.lowering->prepared_replaces >> j) & 1u);
        if (!replaced && id >= ni && id < ni + nc) still_read[static_cast<size_t>(id - ni)] = true;
      }
    }
    std::vector<mx::array> converted;
    for (int32_t c = 0; c < nc; ++c) {
      mx::array& a = sh->constants[static_cast<size_t>(c)];
      if (!still_read[static_cast<size_t>(c)]) {
        a = mx::array(0.0f);
      } else if (sh->compute != mx::float32 && a.dtype() == mx::float32) {
        a = mx::astype(a, sh->compute, dev);
        converted.push_back(a);
      }
    }
    KILN_RETURN_IF_ERROR(check_array_sizes(converted, max_bytes));
    if (!converted.empty()) mx::eval(converted);
    first.value()->constants = sh->constants;

    auto h = std::make_unique<MlxHandle>();
    const char* prof = std::getenv("KILN_MLX_PROFILE");
    h->profile.on = prof != nullptr && std::string(prof) == "1";
    h->payload = pl;
    h->shared = sh;
    h->in_types.assign(inputs.begin(), inputs.end());
    h->out_types.assign(outputs.begin(), outputs.end());
    const bool symbolic = !pl->symbols.empty();
    std::vector<std::string> messages;
    KILN_RETURN_IF_ERROR(trace_plan(*first.value(), max_bytes, outputs, !symbolic, &messages, site));
    if (!symbolic) {
      // Validated by tracing once (lazy: nothing is evaluated), then compiled; the first compiled
      // call traces and fuses (per thread: MLX's compile cache is thread-local).
      h->graphs.push_back(compile_graph(first.value(), {}, std::move(messages)));
      (void)h->graphs.front().fn(probe_inputs(*first.value()));
      return std::unique_ptr<DelegateHandle>(std::move(h));
    }
    // Symbolic sizes: valid at every check binding (as the loader checks kernel calls); the graphs
    // themselves are compiled per binding at execute.
    for (const auto& b : check_bindings(pl->symbols)) {
      auto plan = instantiate(*pl, *sh, b, site, false);
      if (!plan.ok()) return plan.error();
      std::vector<std::string> unused;
      KILN_RETURN_IF_ERROR(trace_plan(*plan.value(), max_bytes, outputs, false, &unused, site));
    }
    return std::unique_ptr<DelegateHandle>(std::move(h));
  }
};

}  // namespace

}  // namespace kiln

// kiln::backend_mlx registers this backend when it is linked (KILN_REGISTER_BACKEND: backend.h).
KILN_REGISTER_BACKEND(mlx, std::make_unique<kiln::MlxBackend>)
