// The one reader of .kiln files: header checks, the FlatBuffers verifier, then semantic
// checks of every method so that no kernel ever sees an out-of-range index, offset or size.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string_view>
#include <set>

#include "ir/fusion.h"
#include "kiln/format.h"
#include "ir/op_registry.h"
#include "program_generated.h"
#include "runtime/file_format.h"
#include "runtime/program_data.h"

namespace kiln::detail {
namespace {

constexpr int64_t kMaxRank = kMaxTensorRank;     // file_format.h (the compiler checks the same)
constexpr uint64_t kMaxBytes = kMaxTensorBytes;  // 64 TiB: anything larger is treated as hostile

Error bad(const std::string& what) { return Error(ErrorCode::InvalidProgram, what); }

bool add_overflows(uint64_t a, uint64_t b, uint64_t limit) { return a > limit || b > limit - a; }

// The FlatBuffers verifier (2.0.x) checks a vector's length prefix for 4-byte alignment only;
// vectors of 8-byte scalars must be checked here before any element is read (a misaligned
// read is undefined behaviour). The FlatBuffer starts 64 bytes into a page-aligned buffer, so
// absolute and buffer-relative alignment agree.
template <typename T>
bool elements_aligned(const flatbuffers::Vector<T>* v) {
  // An empty vector has no element to read (FlatBuffers may leave it 4-byte aligned).
  return v == nullptr || v->size() == 0 || reinterpret_cast<uintptr_t>(v->Data()) % alignof(T) == 0;
}

/// A tensor type from a file's dtype and sizes: rank <= 16, no negative size, and the product of
/// the sizes (zero counted as 1: a zero-element [0, 2^62, 2^62] would otherwise pass, and a kernel
/// multiplying its other sizes would overflow) times the element size within kMaxBytes.
Result<TensorType> read_sizes(DType dtype, const flatbuffers::Vector<int64_t>* sizes, const std::string& where) {
  TensorType type{dtype, {}};
  if (sizes == nullptr) return type;
  if (!elements_aligned(sizes)) return bad(where + ": misaligned sizes vector");
  if (sizes->size() > kMaxRank) return bad(where + ": rank above 16");
  uint64_t volume = 1;
  for (int64_t s : *sizes) {
    if (s < 0) return bad(where + ": negative size");
    const uint64_t f = s == 0 ? 1 : static_cast<uint64_t>(s);
    if (volume > kMaxBytes / f) return bad(where + ": size overflow");
    volume *= f;
    type.sizes.push_back(s);
  }
  if (volume > kMaxBytes / dtype_size(type.dtype)) return bad(where + ": size overflow");
  return type;
}

/// Every string of the file, checked before anything quotes it: valid UTF-8, and names (of
/// methods, values, outputs, symbols, states, ops, attributes, backends, metadata keys) without control
/// characters. A damaged file's bytes thus never reach an error message, MethodMeta or the
/// metadata raw (Python would get a UnicodeDecodeError or mojibake); the refusal quotes the string
/// with those bytes escaped (printable()).
Error check_strings(const fb::Program* prog) {
  const auto check = [](const flatbuffers::String* s, bool name, const std::function<std::string()>& what) -> Error {
    if (s == nullptr) return {};
    const std::string_view v(s->c_str(), s->size());
    if (name ? is_printable_name(v) : is_valid_utf8(v)) return {};
    return bad(what() + " is not " + (name ? "a printable UTF-8 name" : "valid UTF-8") + ": '" + printable(v) + "'");
  };
  if (prog->methods()) {
    for (flatbuffers::uoffset_t mi = 0; mi < prog->methods()->size(); ++mi) {
      const fb::Method* m = prog->methods()->Get(mi);
      const std::string mw = "method " + std::to_string(mi);
      KILN_RETURN_IF_ERROR(check(m->name(), true, [&] { return mw + ": the name"; }));
      if (m->symbols()) {
        for (flatbuffers::uoffset_t k = 0; k < m->symbols()->size(); ++k) {
          KILN_RETURN_IF_ERROR(check(m->symbols()->Get(k)->name(), true,
                                     [&] { return mw + " symbol " + std::to_string(k) + ": the name"; }));
        }
      }
      if (m->values()) {
        for (flatbuffers::uoffset_t k = 0; k < m->values()->size(); ++k) {
          KILN_RETURN_IF_ERROR(check(m->values()->Get(k)->name(), true,
                                     [&] { return mw + " value " + std::to_string(k) + ": the name"; }));
        }
      }
      if (m->output_names()) {
        for (flatbuffers::uoffset_t k = 0; k < m->output_names()->size(); ++k) {
          KILN_RETURN_IF_ERROR(check(m->output_names()->Get(k), true,
                                     [&] { return mw + " output " + std::to_string(k) + ": the name"; }));
        }
      }
      if (!m->instructions()) continue;
      for (flatbuffers::uoffset_t k = 0; k < m->instructions()->size(); ++k) {
        const fb::InstructionEntry* e = m->instructions()->Get(k);
        const std::string iw = mw + " instruction " + std::to_string(k);
        if (const fb::DelegateCall* d = e->instr_as_DelegateCall()) {
          KILN_RETURN_IF_ERROR(check(d->backend(), true, [&] { return iw + ": the backend name"; }));
        }
        const fb::KernelCall* call = e->instr_as_KernelCall();
        if (call == nullptr) continue;
        KILN_RETURN_IF_ERROR(check(call->op(), true, [&] { return iw + ": the op name"; }));
        KILN_RETURN_IF_ERROR(check(call->debug_name(), true, [&] { return iw + ": the debug name"; }));
        if (call->attributes()) {
          for (const fb::Attribute* a : *call->attributes()) {
            KILN_RETURN_IF_ERROR(check(a->name(), true, [&] { return iw + ": an attribute name"; }));
            KILN_RETURN_IF_ERROR(check(a->s(), false, [&] { return iw + ": attribute '" + a->name()->str() + "'"; }));
          }
        }
        if (call->sym_attributes()) {
          for (const fb::SymAttribute* a : *call->sym_attributes()) {
            KILN_RETURN_IF_ERROR(check(a->name(), true, [&] { return iw + ": a symbolic attribute name"; }));
          }
        }
      }
    }
  }
  if (prog->states()) {
    for (flatbuffers::uoffset_t k = 0; k < prog->states()->size(); ++k) {
      KILN_RETURN_IF_ERROR(check(prog->states()->Get(k)->name(), true, [&] { return "state " + std::to_string(k) + ": the name"; }));
    }
  }
  if (prog->metadata()) {
    for (flatbuffers::uoffset_t k = 0; k < prog->metadata()->size(); ++k) {
      const fb::KeyValue* kv = prog->metadata()->Get(k);
      KILN_RETURN_IF_ERROR(check(kv->key(), true, [&] { return "metadata entry " + std::to_string(k) + ": the key"; }));
      KILN_RETURN_IF_ERROR(check(kv->value(), false, [&] { return "metadata '" + kv->key()->str() + "': the value"; }));
    }
  }
  return {};
}

Result<TensorType> read_type(const fb::Tensor* t, const std::string& where) {
  if (t == nullptr) return bad(where + ": missing tensor");
  if (!is_valid_dtype(static_cast<int>(t->dtype()))) return bad(where + ": invalid dtype");
  auto type = read_sizes(static_cast<DType>(t->dtype()), t->sizes(), where);
  if (!type.ok()) return type.error();
  const size_t rank = type->sizes.size();
  if (t->dim_order()) {
    if (t->dim_order()->size() != rank) return bad(where + ": dim_order length differs from rank");
    for (size_t i = 0; i < rank; ++i) {
      if (t->dim_order()->Get(static_cast<flatbuffers::uoffset_t>(i)) != i) {
        return Error(ErrorCode::NotSupported, where + ": non-contiguous dim_order is not supported");
      }
    }
  }
  return type;
}

Result<Attributes> read_attributes(const flatbuffers::Vector<flatbuffers::Offset<fb::Attribute>>* list) {
  Attributes out;
  if (list == nullptr) return out;
  for (const fb::Attribute* a : *list) {
    if (a == nullptr || a->name() == nullptr) return bad("attribute without a name");
    if (!elements_aligned(a->ints()) || !elements_aligned(a->floats())) {
      return bad("attribute '" + a->name()->str() + "' has a misaligned list");
    }
    AttrValue v;
    switch (a->kind()) {
      case fb::AttrKind::None: break;
      case fb::AttrKind::Bool: v = a->i() != 0; break;
      case fb::AttrKind::Int: v = a->i(); break;
      case fb::AttrKind::Float: v = a->f(); break;
      case fb::AttrKind::String: v = a->s() ? a->s()->str() : std::string(); break;
      case fb::AttrKind::Ints:
        v = a->ints() ? std::vector<int64_t>(a->ints()->begin(), a->ints()->end()) : std::vector<int64_t>{};
        break;
      case fb::AttrKind::Floats:
        v = a->floats() ? std::vector<double>(a->floats()->begin(), a->floats()->end()) : std::vector<double>{};
        break;
      default: return bad("attribute '" + a->name()->str() + "' has an invalid kind");
    }
    if (out.has(a->name()->str())) return bad("duplicate attribute '" + a->name()->str() + "'");
    out.set(a->name()->str(), std::move(v));
  }
  return out;
}

Result<std::vector<int32_t>> read_indices(const flatbuffers::Vector<int32_t>* list, size_t num_values,
                                          bool allow_none, const std::string& where) {
  std::vector<int32_t> out;
  if (list == nullptr) return out;
  for (int32_t i : *list) {
    if (allow_none && i == -1) { out.push_back(i); continue; }
    if (i < 0 || static_cast<size_t>(i) >= num_values) {
      return bad(where + ": value index " + std::to_string(i) + " out of range");
    }
    out.push_back(i);
  }
  return out;
}

struct ConstantSpan {
  const uint8_t* data;
  uint64_t nbytes;
};

struct SegmentSpan {
  const uint8_t* data;
  uint64_t size;
  uint8_t kind;  // 0 = constants, 1 = delegate payload
};

constexpr uint8_t kPayloadSegment = 1;

// A delegate call: the backend must be registered and available, every index in range, the
// payload a kind-1 segment; the backend's init (at load_method) re-checks the payload itself.
Result<PlannedInstruction> plan_delegate(const fb::DelegateCall* d, const std::string& iw, size_t nv,
                                         const std::vector<SegmentSpan>& segments,
                                         const std::vector<ConstantSpan>& constants, const MethodPlan& plan,
                                         std::vector<bool>& defined, bool defer_backend_errors,
                                         const BackendSettings& settings) {
  if (d->backend() == nullptr) return bad(iw + ": delegate call without a backend name");
  const std::string name = d->backend()->str();
  PlannedInstruction pi;
  pi.backend_name = name;
  const Backend* backend = BackendRegistry::get().find(name);
  if (backend == nullptr) {
    pi.backend_error = Error(ErrorCode::NotFound, iw + ": backend '" + name + "' is not compiled into this runtime (not linked into this program: "
                                                "link the CMake target kiln::backend_" + name + ")");
  } else if (Error avail = backend->is_available(settings); !avail.ok()) {
    pi.backend_error = Error(ErrorCode::NotFound, iw + ": backend '" + name + "' is not available: " + avail.message());
  }
  if (!pi.backend_error.ok()) {
    if (!defer_backend_errors) return pi.backend_error;
    backend = nullptr;  // never used: load_method returns backend_error first
  }
  if (d->segment() >= segments.size()) return bad(iw + ": delegate payload segment out of range");
  const SegmentSpan& seg = segments[d->segment()];
  if (seg.kind != kPayloadSegment) return bad(iw + ": delegate payload refers to a segment that is not a payload segment");
  pi.backend = backend;
  pi.op = "delegate:" + name;
  pi.payload = {seg.data, static_cast<size_t>(seg.size)};
  if (d->constants()) {
    for (int32_t c : *d->constants()) {
      if (c < 0 || static_cast<size_t>(c) >= constants.size()) {
        return bad(iw + ": delegate constant index " + std::to_string(c) + " out of range");
      }
      const ConstantSpan& cs = constants[static_cast<size_t>(c)];
      pi.delegate_constants.emplace_back(cs.data, static_cast<size_t>(cs.nbytes));
    }
  }
  auto args = read_indices(d->inputs(), nv, false, iw);
  if (!args.ok()) return args.error();
  auto res = read_indices(d->outputs(), nv, false, iw);
  if (!res.ok()) return res.error();
  pi.args = args.value();
  pi.outputs = res.value();
  for (int32_t a : pi.args) {
    if (!defined[static_cast<size_t>(a)]) return bad(iw + ": reads value " + std::to_string(a) + " before it is written");
  }
  if (pi.outputs.empty()) return bad(iw + ": delegate call without outputs");
  for (int32_t o : pi.outputs) {
    if (plan.constant_data[static_cast<size_t>(o)]) return bad(iw + ": writes a constant");
    defined[static_cast<size_t>(o)] = true;
  }
  return pi;
}

// Kernels and delegates assume that an instruction's outputs share no bytes with its inputs or
// with each other (the memory planner never does that: their lifetimes overlap). A hostile file
// could place them on the same arena bytes; reject it instead of letting a kernel read what it
// is overwriting.
Error check_no_aliasing(const MethodPlan& plan, const PlannedInstruction& pi, const std::string& iw) {
  auto range = [&](int32_t v) -> std::pair<uint64_t, uint64_t> {
    const auto i = static_cast<size_t>(v);
    if (plan.arena_offsets[i] < 0) return {0, 0};  // constant: read-only, never written
    const auto off = static_cast<uint64_t>(plan.arena_offsets[i]);
    return {off, off + plan.value_types[i].nbytes()};
  };
  auto overlap = [](std::pair<uint64_t, uint64_t> a, std::pair<uint64_t, uint64_t> b) {
    return a.first < a.second && b.first < b.second && a.first < b.second && b.first < a.second;
  };
  // The one exception: an in-place activation (runs_in_place: the fusion table's epilogue ops,
  // src/ir/fusion.h) whose single output occupies exactly the bytes of its input 0, a value of the
  // same type (the planner's producer + activation pairs); its kernels read each element before
  // writing it.
  const bool in_place = pi.outputs.size() == 1 && !pi.args.empty() && pi.args[0] >= 0 &&
                        pi.args[0] != pi.outputs[0] && runs_in_place(pi.op) &&
                        plan.arena_offsets[static_cast<size_t>(pi.args[0])] >= 0 &&
                        range(pi.args[0]) == range(pi.outputs[0]) &&
                        plan.value_types[static_cast<size_t>(pi.args[0])] == plan.value_types[static_cast<size_t>(pi.outputs[0])];
  // And a zero-copy view (is_byte_view): its output occupies exactly the bytes of its input, a
  // value of the same dtype and byte size; its kernel then copies nothing.
  const bool same_bytes_view = pi.outputs.size() == 1 && pi.args.size() == 1 && pi.args[0] >= 0 &&
                               pi.args[0] != pi.outputs[0] && is_byte_view(pi.op) &&
                               plan.arena_offsets[static_cast<size_t>(pi.args[0])] >= 0 &&
                               range(pi.args[0]) == range(pi.outputs[0]) &&
                               plan.value_types[static_cast<size_t>(pi.args[0])].dtype ==
                                   plan.value_types[static_cast<size_t>(pi.outputs[0])].dtype;
  for (size_t o = 0; o < pi.outputs.size(); ++o) {
    const auto ro = range(pi.outputs[o]);
    for (size_t k = 0; k < pi.args.size(); ++k) {
      const int32_t a = pi.args[k];
      if (k == 0 && (in_place || same_bytes_view)) continue;
      if (a >= 0 && (a == pi.outputs[o] || overlap(ro, range(a)))) {
        return bad(iw + ": output value " + std::to_string(pi.outputs[o]) + " overlaps input value " + std::to_string(a) +
                   " in the arena");
      }
    }
    for (size_t p = 0; p < o; ++p) {
      if (pi.outputs[p] == pi.outputs[o] || overlap(ro, range(pi.outputs[p]))) {
        return bad(iw + ": output values " + std::to_string(pi.outputs[p]) + " and " + std::to_string(pi.outputs[o]) +
                   " overlap in the arena");
      }
    }
  }
  return {};
}


/// Version-2 checks of a method after its instructions: state updates, the input dims that bind
/// each symbol, and every kernel call re-typed by the op registry at each check binding (so that
/// a file whose size expressions disagree with the ops is rejected here, not at execute).
Error plan_symbols_and_state(const fb::Method* m, MethodPlan& plan, const std::vector<StatePlan>& states,
                             const std::vector<bool>& defined, const std::vector<int32_t>& state_read,
                             const std::vector<int64_t>& state_written_at,
                             const std::vector<std::vector<int64_t>>& bindings, const std::string& where) {
  const size_t nv = plan.value_types.size();
  std::vector<bool> updated(states.size(), false);
  if (m->state_updates()) {
    for (const fb::StateUpdate* u : *m->state_updates()) {
      const uint32_t st = u->state();
      const int32_t v = u->value();
      if (st >= states.size() || v < 0 || static_cast<size_t>(v) >= nv) return bad(where + ": state update out of range");
      if (updated[st]) return bad(where + ": state " + std::to_string(st) + " updated twice");
      if (!plan.state_holder[st].empty()) return bad(where + ": state '" + states[st].name + "' is held by a delegate and updated by the method");
      updated[st] = true;
      if (!defined[static_cast<size_t>(v)]) return bad(where + ": state update reads a value that is never written");
      if (!(plan.value_types[static_cast<size_t>(v)] == states[st].type) || !plan.value_sym[static_cast<size_t>(v)].empty()) {
        return bad(where + ": state update of '" + states[st].name + "' with a value of another type");
      }
      const int32_t vs = plan.value_state[static_cast<size_t>(v)];
      if (vs >= 0 && vs != static_cast<int32_t>(st)) return bad(where + ": state update from another state's bytes");
      if (vs < 0) plan.state_copies.emplace_back(st, v);
      if (vs >= 0 && state_written_at[st] < 0) return bad(where + ": state update from the state's unchanged value");
      plan.uses_state = true;
    }
  }
  for (size_t st = 0; st < states.size(); ++st) {
    if (state_written_at[st] >= 0 && !updated[st]) return bad(where + ": state '" + states[st].name + "' written in place but not declared updated");
  }
  std::set<std::string> used;
  for (size_t v = 0; v < nv; ++v) {
    if (plan.value_state[v] >= 0) used.insert(states[static_cast<size_t>(plan.value_state[v])].name);
  }
  for (const auto& u : plan.state_copies) used.insert(states[u.first].name);
  for (size_t st = 0; st < states.size(); ++st) {
    if (!plan.state_holder[st].empty()) used.insert(states[st].name);
  }
  plan.meta.states.assign(used.begin(), used.end());
  for (const std::string& name : plan.meta.states) {
    std::string holder;
    for (size_t st = 0; st < states.size(); ++st) {
      if (states[st].name == name) holder = plan.state_holder[st];
    }
    plan.meta.state_holders.push_back(holder);
  }
  (void)state_read;
  // Symbols: each bound by the first input dim that is exactly that symbol.
  plan.symbol_binding.assign(plan.symbols.size(), {SIZE_MAX, 0});
  for (size_t i = 0; i < plan.inputs.size(); ++i) {
    const auto& sym = plan.value_sym[static_cast<size_t>(plan.inputs[i])];
    for (size_t d = 0; d < sym.size(); ++d) {
      const int32_t s = sym[d].as_symbol();
      if (s >= 0 && plan.symbol_binding[static_cast<size_t>(s)].first == SIZE_MAX) plan.symbol_binding[static_cast<size_t>(s)] = {i, d};
    }
  }
  for (size_t s = 0; s < plan.symbols.size(); ++s) {
    if (plan.symbol_binding[s].first == SIZE_MAX) return bad(where + ": symbol '" + plan.symbols[s].name + "' is bound by no input dimension");
  }
  auto dims_text = [&](int32_t v) {
    std::vector<std::string> out;
    for (const SymExpr& e : plan.value_sym[static_cast<size_t>(v)]) out.push_back(e.is_constant() ? "" : e.to_string(plan.symbols));
    if (out.empty()) out.assign(plan.value_types[static_cast<size_t>(v)].sizes.size(), "");
    return out;
  };
  for (int32_t i : plan.inputs) plan.meta.input_dims.push_back(dims_text(i));
  for (int32_t o : plan.outputs) plan.meta.output_dims.push_back(dims_text(o));
  plan.meta.symbols = plan.symbols;
  if (plan.symbols.empty()) return {};
  // Re-type every call with symbolic sizes at each check binding.
  std::vector<TensorType> types(plan.value_types);
  for (const auto& b : bindings) {
    for (int32_t v : plan.dynamic_values) {
      if (Error e = eval_sizes(plan.value_sym[static_cast<size_t>(v)], b, &types[static_cast<size_t>(v)].sizes); !e.ok()) {
        return bad(where + ": value " + std::to_string(v) + ": " + e.message());
      }
    }
    for (size_t k = 0; k < plan.instructions.size(); ++k) {
      const PlannedInstruction& pi = plan.instructions[k];
      if (!pi.dynamic || !pi.backend_name.empty()) continue;  // a delegate checks its own sizes
      const OpDef* def = OpRegistry::get().find(pi.op);
      Attributes at = pi.attrs;
      for (const auto& sa : pi.sym_attrs) {
        auto v = sa.expr.eval(b);
        if (!v.ok()) return bad(where + " instruction " + std::to_string(k) + ": " + v.error().message());
        KILN_RETURN_IF_ERROR(set_int_attribute(at, sa.name, sa.index, v.value()));
      }
      std::vector<const TensorType*> in;
      for (int32_t a : pi.args) in.push_back(a < 0 ? nullptr : &types[static_cast<size_t>(a)]);
      auto inferred = def->infer_types(in, at);
      if (!inferred.ok()) return bad(where + " instruction " + std::to_string(k) + " (" + pi.op + "): " + inferred.error().message());
      for (size_t o = 0; o < pi.outputs.size(); ++o) {
        if (!((*inferred)[o] == types[static_cast<size_t>(pi.outputs[o])])) {
          return bad(where + " instruction " + std::to_string(k) + " (" + pi.op + "): output " +
                     types[static_cast<size_t>(pi.outputs[o])].to_string() + " by its size expressions, " +
                     (*inferred)[o].to_string() + " by the op's shape inference: shapes disagree with the symbols");
        }
      }
    }
  }
  return {};
}

Result<SymExpr> read_expr(const fb::SizeExpr* e, size_t num_symbols, const std::string& where) {
  if (e == nullptr || e->code() == nullptr) return bad(where + ": missing size expression");
  if (!elements_aligned(e->code())) return bad(where + ": misaligned size expression");
  SymExpr x = SymExpr::from_code(std::vector<int64_t>(e->code()->begin(), e->code()->end()));
  if (Error err = x.validate(num_symbols); !err.ok()) return bad(where + ": " + err.message());
  return x;
}

Result<MethodPlan> plan_method(const fb::Method* m, const std::vector<SegmentSpan>& segments,
                               const std::vector<ConstantSpan>& constants, bool defer_backend_errors,
                               const BackendSettings& settings, std::map<int32_t, std::shared_ptr<float>>& widened,
                               const std::vector<StatePlan>& states) {
  MethodPlan plan;
  if (m == nullptr || m->name() == nullptr) return bad("method without a name");
  const std::string where = "method '" + m->name()->str() + "'";
  plan.meta.name = m->name()->str();
  plan.meta.arena_bytes = m->arena_size();
  if (plan.meta.arena_bytes > kMaxBytes) return bad(where + ": arena size out of range");
  const size_t nv = m->values() ? m->values()->size() : 0;
  plan.value_types.resize(nv);
  plan.constant_data.assign(nv, nullptr);
  plan.stored_half.assign(nv, 0);
  plan.arena_offsets.assign(nv, -1);
  std::vector<std::string> names(nv);
  if (m->symbols()) {
    if (m->symbols()->size() > 16) return bad(where + ": more than 16 symbols");
    for (const fb::Symbol* sym : *m->symbols()) {
      const std::string name = sym->name()->str();
      if (name.empty() || sym->min() < 0 || sym->min() > sym->max() || sym->max() > kMaxSymbolValue) {
        return bad(where + ": symbol '" + name + "' has the invalid range [" + std::to_string(sym->min()) + ", " +
                   std::to_string(sym->max()) + "]");
      }
      for (const SymbolDef& o : plan.symbols) {
        if (o.name == name) return bad(where + ": symbol '" + name + "' declared twice");
      }
      plan.symbols.push_back(SymbolDef{name, sym->min(), sym->max()});
    }
  }
  const auto bindings = check_bindings(plan.symbols);
  plan.value_sym.resize(nv);
  plan.value_state.assign(nv, -1);
  plan.state_holder.assign(states.size(), std::string());
  for (size_t i = 0; i < nv; ++i) {
    const fb::Tensor* t = m->values()->Get(static_cast<flatbuffers::uoffset_t>(i));
    const std::string vw = where + " value " + std::to_string(i);
    auto type = read_type(t, vw);
    if (!type.ok()) return type.error();
    plan.value_types[i] = type.value();
    if (t->name()) names[i] = t->name()->str();
    const uint64_t nbytes = type->nbytes();
    if (t->sym_sizes() && t->sym_sizes()->size() > 0) {
      if (t->sym_sizes()->size() != type->sizes.size()) return bad(vw + ": size expressions differ in number from the rank");
      if (t->constant() != -1 || t->state() != -1) return bad(vw + ": a constant or state cannot have symbolic sizes");
      for (const fb::SizeExpr* e : *t->sym_sizes()) {
        auto x = read_expr(e, plan.symbols.size(), vw);
        if (!x.ok()) return x.error();
        plan.value_sym[i].push_back(std::move(x.value()));
      }
      std::vector<int64_t> sizes;
      for (const auto& b : bindings) {  // every check binding fits the planned (upper-bound) sizes
        if (Error err = eval_sizes(plan.value_sym[i], b, &sizes); !err.ok()) return bad(vw + ": " + err.message());
        for (size_t d = 0; d < sizes.size(); ++d) {
          if (sizes[d] > type->sizes[d]) {
            return bad(vw + ": symbolic size " + std::to_string(sizes[d]) + " of dim " + std::to_string(d) +
                       " exceeds its planned bound " + std::to_string(type->sizes[d]));
          }
        }
      }
      plan.dynamic_values.push_back(static_cast<int32_t>(i));
    }
    if (t->state() != -1) {
      if (t->state() < 0 || static_cast<size_t>(t->state()) >= states.size()) return bad(vw + ": state index out of range");
      if (t->constant() != -1) return bad(vw + ": a state cannot be a constant");
      if (t->arena_offset() != -1) return bad(vw + ": a state value has an arena offset (states live in the session, not the arena)");
      if (!(states[static_cast<size_t>(t->state())].type == type.value())) {
        return bad(vw + ": type " + type->to_string() + " differs from state '" + states[static_cast<size_t>(t->state())].name +
                   "' " + states[static_cast<size_t>(t->state())].type.to_string());
      }
      plan.value_state[i] = t->state();
      plan.uses_state = true;
      continue;  // the session's bytes: no arena range
    }
    if (t->constant() >= 0) {
      if (static_cast<size_t>(t->constant()) >= constants.size()) return bad(vw + ": constant index out of range");
      const ConstantSpan& c = constants[static_cast<size_t>(t->constant())];
      if (t->stored_as_float16()) {
        // Stored as binary16, widened to float32 once (CompileOptions::weights_dtype).
        if (type->dtype != DType::Float32) return bad(vw + ": only float32 constants can be stored as float16");
        const uint64_t n = static_cast<uint64_t>(type->numel());
        if (c.nbytes != n * 2) return bad(vw + ": float16-stored constant holds " + std::to_string(c.nbytes) + " bytes, type needs " + std::to_string(n * 2));
        auto& w = widened[t->constant()];
        if (!w) {
          void* p = std::aligned_alloc(64, ((n * 4 + 63) / 64) * 64 + 64);
          if (p == nullptr) return Error(ErrorCode::MemoryAllocationFailed, vw + ": cannot allocate " + std::to_string(n * 4) + " bytes to widen a float16 constant");
          w = std::shared_ptr<float>(static_cast<float*>(p), [](float* q) { std::free(q); });
          uint16_t h;
          for (uint64_t e = 0; e < n; ++e) {
            std::memcpy(&h, c.data + e * 2, 2);
            w.get()[e] = half_to_float(h);
          }
        }
        plan.constant_data[i] = reinterpret_cast<const uint8_t*>(w.get());
        plan.stored_half[i] = 1;
        continue;
      }
      if (c.nbytes != nbytes) return bad(vw + ": constant holds " + std::to_string(c.nbytes) + " bytes, type needs " + std::to_string(nbytes));
      plan.constant_data[i] = c.data;
    } else if (t->constant() != -1) {
      return bad(vw + ": invalid constant index");
    } else {
      if (t->arena_offset() < 0) return bad(vw + ": no arena offset");
      const auto off = static_cast<uint64_t>(t->arena_offset());
      if (off % 8 != 0 || add_overflows(off, nbytes, plan.meta.arena_bytes)) return bad(vw + ": arena range out of bounds");
      plan.arena_offsets[i] = t->arena_offset();
    }
  }
  auto ins = read_indices(m->inputs(), nv, false, where + " inputs");
  if (!ins.ok()) return ins.error();
  auto outs = read_indices(m->outputs(), nv, false, where + " outputs");
  if (!outs.ok()) return outs.error();
  plan.inputs = ins.value();
  plan.outputs = outs.value();
  if (plan.outputs.empty()) return bad(where + ": no outputs");
  std::vector<bool> defined(nv, false);
  for (size_t i = 0; i < nv; ++i) defined[i] = plan.constant_data[i] != nullptr;
  // A state's value read at the start of the method: a state value that no instruction writes.
  std::vector<bool> written(nv, false);
  for (size_t k = 0; m->instructions() && k < m->instructions()->size(); ++k) {
    const fb::InstructionEntry* e = m->instructions()->Get(static_cast<flatbuffers::uoffset_t>(k));
    const flatbuffers::Vector<int32_t>* outs = nullptr;
    if (e && e->instr_as_KernelCall()) outs = e->instr_as_KernelCall()->outputs();
    if (e && e->instr_as_DelegateCall()) outs = e->instr_as_DelegateCall()->outputs();
    for (size_t j = 0; outs && j < outs->size(); ++j) {
      const int32_t o = outs->Get(static_cast<flatbuffers::uoffset_t>(j));
      if (o >= 0 && static_cast<size_t>(o) < nv) written[static_cast<size_t>(o)] = true;
    }
  }
  std::vector<int32_t> state_read(states.size(), -1);     // per state: its read value
  std::vector<int64_t> state_written_at(states.size(), -1);  // per state: instruction writing it in place
  for (size_t i = 0; i < nv; ++i) {
    const int32_t st = plan.value_state[i];
    if (st < 0 || written[i]) continue;
    if (state_read[static_cast<size_t>(st)] >= 0) return bad(where + ": two values read state " + std::to_string(st));
    state_read[static_cast<size_t>(st)] = static_cast<int32_t>(i);
    defined[i] = true;
  }
  for (int32_t i : plan.inputs) {
    if (plan.constant_data[static_cast<size_t>(i)]) return bad(where + ": an input is a constant");
    if (plan.value_state[static_cast<size_t>(i)] >= 0) return bad(where + ": an input is a state");
    if (defined[static_cast<size_t>(i)]) return bad(where + ": input listed twice");
    defined[static_cast<size_t>(i)] = true;
    plan.meta.inputs.push_back(plan.value_types[static_cast<size_t>(i)]);
    plan.meta.input_names.push_back(names[static_cast<size_t>(i)]);
  }

  const auto* instrs = m->instructions();
  const size_t ni = instrs ? instrs->size() : 0;
  for (size_t k = 0; k < ni; ++k) {
    const fb::InstructionEntry* e = instrs->Get(static_cast<flatbuffers::uoffset_t>(k));
    const std::string iw = where + " instruction " + std::to_string(k);
    if (e == nullptr) return bad(iw + ": missing");
    if (const fb::DelegateCall* d = e->instr_as_DelegateCall()) {
      auto pi = plan_delegate(d, iw, nv, segments, constants, plan, defined, defer_backend_errors, settings);
      if (!pi.ok()) return pi.error();
      for (int32_t v : pi->args) {
        pi->dynamic = pi->dynamic || !plan.value_sym[static_cast<size_t>(v)].empty();
        if (plan.value_state[static_cast<size_t>(v)] >= 0 && state_written_at[static_cast<size_t>(plan.value_state[static_cast<size_t>(v)])] >= 0 &&
            v == state_read[static_cast<size_t>(plan.value_state[static_cast<size_t>(v)])]) {
          return bad(iw + ": reads a state's old value after it was written in place");
        }
      }
      for (int32_t v : pi->outputs) {
        pi->dynamic = pi->dynamic || !plan.value_sym[static_cast<size_t>(v)].empty();
        if (plan.value_state[static_cast<size_t>(v)] >= 0) return bad(iw + ": a delegate call writes a state in place");
      }
      // Held states: the backend keeps them; no value of this method is their bytes, no other call
      // holds them, and no StateUpdate names them (plan_symbols_and_state).
      if (d->states()) {
        for (uint32_t st : *d->states()) {
          if (st >= states.size()) return bad(iw + ": held state " + std::to_string(st) + " out of range");
          if (!plan.state_holder[st].empty()) return bad(iw + ": state '" + states[st].name + "' held twice");
          for (size_t v = 0; v < nv; ++v) {
            if (plan.value_state[v] == static_cast<int32_t>(st)) {
              return bad(iw + ": state '" + states[st].name + "' is held by the delegate but a value of the method is its bytes");
            }
          }
          if (pi->backend_name.empty()) return bad(iw + ": held state without a backend");
          plan.state_holder[st] = pi->backend_name;
          pi->held_states.push_back(st);
          plan.uses_state = true;
        }
        pi->writes_state = !pi->held_states.empty();
      }
      KILN_RETURN_IF_ERROR(check_no_aliasing(plan, pi.value(), iw));
      plan.instructions.push_back(std::move(pi.value()));
      continue;
    }
    const fb::KernelCall* call = e->instr_as_KernelCall();
    if (call == nullptr || call->op() == nullptr) return bad(iw + ": unknown instruction type");
    PlannedInstruction pi;
    pi.op = call->op()->str();
    if (call->debug_name()) pi.debug_name = call->debug_name()->str();
    const OpDef* def = OpRegistry::get().find(pi.op);
    if (def == nullptr) return Error(ErrorCode::OperatorMissing, iw + ": op '" + pi.op + "' is unknown to this runtime");
    pi.portable_kernel = KernelRegistry::get().find(pi.op);
    if (pi.portable_kernel == nullptr) return Error(ErrorCode::OperatorMissing, iw + ": no kernel for op '" + pi.op + "'");
    auto attrs = read_attributes(call->attributes());
    if (!attrs.ok()) return bad(iw + ": " + attrs.error().message());
    auto norm = def->normalize_attributes(attrs.value());
    if (!norm.ok()) return bad(iw + ": " + norm.error().message());
    pi.attrs = std::move(norm.value());
    auto args = read_indices(call->args(), nv, true, iw);
    if (!args.ok()) return args.error();
    auto res = read_indices(call->outputs(), nv, false, iw);
    if (!res.ok()) return res.error();
    pi.args = args.value();
    pi.outputs = res.value();
    if (call->sym_attributes()) {
      for (const fb::SymAttribute* sa : *call->sym_attributes()) {
        auto x = read_expr(sa->expr(), plan.symbols.size(), iw);
        if (!x.ok()) return x.error();
        Attributes probe = pi.attrs;
        if (Error err = set_int_attribute(probe, sa->name()->str(), sa->index(), 0); !err.ok()) return bad(iw + ": " + err.message());
        pi.sym_attrs.push_back({sa->name()->str(), sa->index(), std::move(x.value())});
      }
    }
    pi.dynamic = !pi.sym_attrs.empty();
    for (int32_t a : pi.args) pi.dynamic = pi.dynamic || (a >= 0 && !plan.value_sym[static_cast<size_t>(a)].empty());
    for (int32_t o : pi.outputs) pi.dynamic = pi.dynamic || !plan.value_sym[static_cast<size_t>(o)].empty();
    // State: an output that is a state's bytes is an in-place update (updates_state_in_place) of
    // that state's read value, given as self (args[0]), once; nothing reads the old value after it.
    for (size_t k2 = 0; k2 < pi.args.size(); ++k2) {
      const int32_t a = pi.args[k2];
      if (a < 0 || plan.value_state[static_cast<size_t>(a)] < 0) continue;
      const auto st = static_cast<size_t>(plan.value_state[static_cast<size_t>(a)]);
      if (state_written_at[st] >= 0 && a == state_read[st]) return bad(iw + ": reads a state's old value after it was written in place");
    }
    for (int32_t o : pi.outputs) {
      const int32_t st = plan.value_state[static_cast<size_t>(o)];
      if (st < 0) continue;
      if (!updates_state_in_place(pi.op) || pi.outputs.size() != 1 || pi.args.empty() || pi.args[0] != state_read[static_cast<size_t>(st)] ||
          state_written_at[static_cast<size_t>(st)] >= 0) {
        return bad(iw + ": writes state " + std::to_string(st) + " in place, which only an index_put or slice_scatter "
                   "of the state's value (as self), once per method, may");
      }
      for (size_t k2 = 1; k2 < pi.args.size(); ++k2) {
        if (pi.args[k2] >= 0 && plan.value_state[static_cast<size_t>(pi.args[k2])] == st) {
          return bad(iw + ": an in-place state update reads the state in another argument");
        }
      }
      state_written_at[static_cast<size_t>(st)] = static_cast<int64_t>(plan.instructions.size());
      pi.writes_state = true;
    }
    std::vector<const TensorType*> types;
    for (int32_t a : pi.args) {
      if (a >= 0 && !defined[static_cast<size_t>(a)]) return bad(iw + ": reads value " + std::to_string(a) + " before it is written");
      types.push_back(a < 0 ? nullptr : &plan.value_types[static_cast<size_t>(a)]);
    }
    // A call with symbolic sizes is re-typed at every check binding instead (plan_symbols_and_state):
    // its upper-bound types need not be one consistent call.
    auto inferred = pi.dynamic ? Result<std::vector<TensorType>>(std::vector<TensorType>(pi.outputs.size()))
                               : def->infer_types(types, pi.attrs);
    if (!inferred.ok()) return bad(iw + ": " + inferred.error().message());
    if (inferred->size() != pi.outputs.size()) return bad(iw + ": wrong number of outputs");
    for (size_t o = 0; o < pi.outputs.size(); ++o) {
      const auto ov = static_cast<size_t>(pi.outputs[o]);
      if (plan.constant_data[ov]) return bad(iw + ": writes a constant");
      if (!pi.dynamic && plan.value_types[ov] != (*inferred)[o]) {
        return bad(iw + ": output type " + plan.value_types[ov].to_string() + " differs from the op's inferred " +
                   (*inferred)[o].to_string());
      }
      defined[ov] = true;
    }
    if (def->num_outputs != static_cast<int>(pi.outputs.size())) return bad(iw + ": wrong number of outputs");
    {
      std::vector<const TensorType*> out_types;
      for (int32_t o : pi.outputs) out_types.push_back(&plan.value_types[static_cast<size_t>(o)]);
      const KernelSignature sig{types, out_types, pi.attrs};
      // An in-place state update runs the portable kernel (updates_state_in_place); a call with
      // symbolic sizes the optimized kernels registered with sizes_at_call (KernelRegistry::select).
      pi.kernel = KernelRegistry::get().select(pi.op, sig, pi.writes_state ? KernelSet::Portable : KernelSet::Optimized,
                                               pi.dynamic);
    }
    KILN_RETURN_IF_ERROR(check_no_aliasing(plan, pi, iw));
    plan.instructions.push_back(std::move(pi));
  }
  for (int32_t o : plan.outputs) {
    if (!defined[static_cast<size_t>(o)]) return bad(where + ": output value " + std::to_string(o) + " is never written");
    plan.meta.outputs.push_back(plan.value_types[static_cast<size_t>(o)]);
    plan.meta.output_names.push_back(names[static_cast<size_t>(o)]);
  }
  if (const auto* on = m->output_names()) {  // absent in older files: the value names above
    if (on->size() != plan.outputs.size()) {
      return bad(where + ": " + std::to_string(on->size()) + " output names for " + std::to_string(plan.outputs.size()) +
                 " outputs");
    }
    std::set<std::string_view> seen;
    for (flatbuffers::uoffset_t i = 0; i < on->size(); ++i) {
      const flatbuffers::String* n = on->Get(i);
      if (n == nullptr || n->size() == 0) return bad(where + ": output " + std::to_string(i) + " has an empty name");
      if (!seen.insert(n->string_view()).second) return bad(where + ": output name '" + n->str() + "' is given twice");
      plan.meta.output_names[i] = n->str();
    }
  }
  KILN_RETURN_IF_ERROR(plan_symbols_and_state(m, plan, states, defined, state_read, state_written_at, bindings, where));
  plan.meta.num_instructions = plan.instructions.size();
  plan.value_names = std::move(names);
  std::map<std::string, int> op_counts, cpu_op_counts, delegate_counts;
  for (const PlannedInstruction& pi : plan.instructions) {
    if (!pi.backend_name.empty()) {
      ++plan.meta.num_delegate_calls;
      ++delegate_counts[pi.backend_name];
      if (!pi.backend_error.ok() && plan.meta.unavailable.empty()) plan.meta.unavailable = pi.backend_error.message();
      continue;
    }
    ++plan.meta.num_kernel_calls;
    ++op_counts[pi.op];
    if (std::string_view(KernelRegistry::get().set_name(pi.kernel)) == "cpu") {
      ++plan.meta.num_cpu_kernel_calls;
      ++cpu_op_counts[pi.op];
    }
  }
  plan.meta.op_counts.assign(op_counts.begin(), op_counts.end());
  plan.meta.cpu_op_counts.assign(cpu_op_counts.begin(), cpu_op_counts.end());
  plan.meta.delegate_counts.assign(delegate_counts.begin(), delegate_counts.end());
  // Constant bytes by dtype and by weight scheme (quantized ops: src/ir/ops/quant.h).
  {
    std::map<std::string, uint64_t> by_dtype, by_scheme;
    std::vector<std::string> scheme(plan.value_types.size());
    std::vector<bool> counted(plan.value_types.size(), false);
    for (const PlannedInstruction& pi : plan.instructions) {
      if (!pi.backend_name.empty()) {
        for (const auto& c : pi.delegate_constants) {
          by_dtype["delegate"] += c.size();
          by_scheme["delegate"] += c.size();
        }
        continue;
      }
      if (pi.op.rfind("kiln.weight_quantized_", 0) != 0) continue;
      const int64_t bits = pi.attrs.get_int("bits", 8);
      const int64_t gs = pi.attrs.get_int("group_size", 0);
      const bool asym = pi.args.size() > 3 && pi.args[3] >= 0;
      const std::string name = bits == 8 ? "int8 per channel"
                                         : "int4 " + (gs == 0 ? std::string("per channel") : "g" + std::to_string(gs)) +
                                               (asym ? " asym" : " sym");
      for (size_t i = 1; i < 4 && i < pi.args.size(); ++i) {
        if (pi.args[i] >= 0) scheme[static_cast<size_t>(pi.args[i])] = name;
      }
    }
    for (const PlannedInstruction& pi : plan.instructions) {
      if (!pi.backend_name.empty()) continue;
      for (int32_t a : pi.args) {
        if (a < 0 || !plan.constant_data[static_cast<size_t>(a)] || counted[static_cast<size_t>(a)]) continue;
        counted[static_cast<size_t>(a)] = true;
        const TensorType& t = plan.value_types[static_cast<size_t>(a)];
        const bool half = plan.stored_half[static_cast<size_t>(a)] != 0;
        const std::string dt = half ? "float16 (widened to float32 at load)" : dtype_name(t.dtype);
        const uint64_t nb = half ? t.nbytes() / 2 : t.nbytes();
        by_dtype[dt] += nb;
        const std::string& sc = scheme[static_cast<size_t>(a)];
        by_scheme[sc.empty() ? dt : sc] += nb;
      }
    }
    plan.meta.constant_bytes_by_dtype.assign(by_dtype.begin(), by_dtype.end());
    plan.meta.constant_bytes_by_scheme.assign(by_scheme.begin(), by_scheme.end());
  }
  return plan;
}

}  // namespace

namespace {

/// A transparent huge page (x86-64 and the common arm64 configuration): program buffers and
/// mappings of this size or more start at a multiple of it and are advised MADV_HUGEPAGE.
constexpr uint64_t kHugePage = uint64_t{1} << 21;

}  // namespace

void FileBytes::release_pages(const void* p, size_t n) const {
  if (!mapped_ || p == nullptr || n == 0) return;
  const auto lo = reinterpret_cast<uintptr_t>(data_), hi = lo + size_;
  auto begin = reinterpret_cast<uintptr_t>(p), end = begin + n;
  if (begin < lo || end > hi) return;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  begin = (begin + page - 1) / page * page;  // whole pages inside the range only
  end = end / page * page;
  if (begin < end) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

FileBytes::~FileBytes() {
  if (mapped_) munmap(const_cast<uint8_t*>(data_), size_);
  std::free(owned_);
}

Result<std::unique_ptr<FileBytes>> FileBytes::allocate(uint64_t size) {
  auto fbytes = std::unique_ptr<FileBytes>(new FileBytes());
  // Buffers of 2 MiB or more: aligned to 2 MiB and advised as huge pages (fewer TLB misses when a
  // kernel streams the weights; a no-op where transparent huge pages are off).
  const uint64_t align = size >= kHugePage ? kHugePage : kSegmentAlignment;
  const uint64_t alloc = (size + align - 1) / align * align;
  if (alloc < size) return Error(ErrorCode::MemoryAllocationFailed, "cannot allocate program buffer");
  fbytes->owned_ = std::aligned_alloc(align, alloc == 0 ? align : alloc);
  if (fbytes->owned_ == nullptr) return Error(ErrorCode::MemoryAllocationFailed, "cannot allocate program buffer");
  if (align == kHugePage) ::madvise(fbytes->owned_, alloc, MADV_HUGEPAGE);
  fbytes->data_ = static_cast<const uint8_t*>(fbytes->owned_);
  fbytes->size_ = size;
  return fbytes;
}

Result<std::unique_ptr<FileBytes>> FileBytes::copy(std::span<const uint8_t> bytes) {
  auto fbytes = allocate(bytes.size());
  if (!fbytes.ok()) return fbytes.error();
  if (!bytes.empty()) std::memcpy((*fbytes)->owned_, bytes.data(), bytes.size());
  return fbytes;
}

namespace {

/// Maps `size` bytes of the file `fd` read-only; MAP_FAILED (errno set) on failure.
///
/// Files of 2 MiB or more are mapped at a 2 MiB-aligned address and advised MADV_HUGEPAGE before
/// anything is read. Where the file system caches files in large folios (XFS since Linux 5.18,
/// ext4 since 6.16), pages the mapping reads in then come as 2 MiB folios mapped by one page-table entry each,
/// so a kernel that streams every weight (an LLM decode step) takes no 4 KiB TLB misses: on a Zen 4
/// VM a plain read of a 663 MiB mapped file went from 21.8 to 31 GB/s. Pages already cached in
/// small folios (a file read before without the advice) keep them, until the cache drops them.
/// Where huge pages are off, the advice is a no-op.
///
/// prefault: populate every page now (MADV_POPULATE_READ, Linux 5.14; before that, one read per
/// page), so that the first execute takes no page faults; best effort, never a failure of load.
void* map_file(int fd, uint64_t size, bool prefault) {
  void* p = MAP_FAILED;
  if (size >= kHugePage) {
    // Reserve size + 2 MiB of address space, map the file over its first aligned address, and
    // give back the rest.
    const uint64_t span = size + kHugePage;
    void* reserve = ::mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (reserve != MAP_FAILED) {
      const auto lo = reinterpret_cast<uintptr_t>(reserve);
      const uintptr_t aligned = (lo + kHugePage - 1) & ~static_cast<uintptr_t>(kHugePage - 1);
      p = ::mmap(reinterpret_cast<void*>(aligned), size, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0);
      if (p == MAP_FAILED) {
        const int e = errno;
        ::munmap(reserve, span);
        errno = e;
        return MAP_FAILED;
      }
      const uintptr_t end = aligned + size, reserve_end = lo + span;
      const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
      const uintptr_t tail = (end + page - 1) / page * page;
      if (aligned > lo) ::munmap(reserve, aligned - lo);
      if (reserve_end > tail) ::munmap(reinterpret_cast<void*>(tail), reserve_end - tail);
      ::madvise(p, size, MADV_HUGEPAGE);
    }
  }
  if (p == MAP_FAILED) p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (p == MAP_FAILED || !prefault) return p;
#ifdef MADV_POPULATE_READ
  // Only a kernel without the advice (EINVAL, before 5.14) falls back to touching every page: on
  // any other failure (EFAULT: the file shrank under the mapping; EINTR; ENOMEM) touching could
  // raise SIGBUS, and load goes on without the prefault, as MAP_POPULATE did.
  if (::madvise(p, size, MADV_POPULATE_READ) == 0 || errno != EINVAL) return p;
#endif
  const auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const volatile uint8_t* bytes = static_cast<const uint8_t*>(p);
  for (uint64_t i = 0; i < size; i += page) (void)bytes[i];
  return p;
}

}  // namespace

Result<std::unique_ptr<FileBytes>> FileBytes::map(const std::string& path, bool use_mmap, bool prefault) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer (it is rejected below as not regular).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return Error(ErrorCode::NotFound, "cannot open '" + path + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Error(ErrorCode::InvalidProgram, "'" + path + "' is not a regular file");
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  // A file that does not start with Kiln's magic is refused before anything else is read: reading
  // (or prefaulting) a large file of another kind first costs its whole size in time and memory.
  char magic[sizeof(kFileMagic)] = {};
  if (size >= sizeof(FileHeader) &&
      (::pread(fd, magic, sizeof(magic), 0) != static_cast<ssize_t>(sizeof(magic)) ||
       std::memcmp(magic, kFileMagic, sizeof(kFileMagic)) != 0)) {
    ::close(fd);
    return Error(ErrorCode::InvalidProgram, "'" + path + "' is not a Kiln program (wrong magic)");
  }
  auto fbytes = std::unique_ptr<FileBytes>(new FileBytes());
  if (use_mmap && size > 0) {
    void* p = map_file(fd, size, prefault);
    const int map_errno = errno;
    ::close(fd);
    if (p == MAP_FAILED) return Error(ErrorCode::MemoryAllocationFailed, "cannot map '" + path + "': " + std::strerror(map_errno));
    fbytes->data_ = static_cast<const uint8_t*>(p);
    fbytes->size_ = size;
    fbytes->mapped_ = true;
    return fbytes;
  }
  auto owned = allocate(size);  // read straight into the program's buffer (one copy of the file)
  if (!owned.ok()) {
    ::close(fd);
    return owned.error();
  }
  auto* buf = static_cast<uint8_t*>((*owned)->owned_);
  uint64_t got = 0;
  while (got < size) {
    const ssize_t n = ::read(fd, buf + got, size - got);
    if (n <= 0) break;
    got += static_cast<uint64_t>(n);
  }
  ::close(fd);
  if (got != size) return Error(ErrorCode::InvalidProgram, "short read of '" + path + "'");
  return owned;
}

Result<std::unique_ptr<ProgramData>> verify_and_plan(std::unique_ptr<FileBytes> bytes, bool defer_backend_errors,
                                                     const BackendSettings& settings) {
  const uint8_t* base = bytes->data();
  const uint64_t size = bytes->size();
  if (size < sizeof(FileHeader)) return bad("file is " + std::to_string(size) + " bytes, shorter than the 64-byte header");
  FileHeader h;
  std::memcpy(&h, base, sizeof(h));
  if (std::memcmp(h.magic, kFileMagic, sizeof(kFileMagic)) != 0) return bad("not a Kiln program (wrong magic)");
  if (h.version < kMinFormatVersion || h.version > kFormatVersion) {
    return bad("format version " + std::to_string(h.version) + " is not supported (this runtime reads versions " +
               std::to_string(kMinFormatVersion) + " to " + std::to_string(kFormatVersion) + ")");
  }
  if (h.header_size != sizeof(FileHeader) || h.flatbuffer_offset != sizeof(FileHeader)) return bad("bad header size");
  if (h.file_size != size) {
    return bad("file is " + std::to_string(size) + " bytes but its header says " + std::to_string(h.file_size) +
               " (truncated or padded)");
  }
  if (add_overflows(h.flatbuffer_offset, h.flatbuffer_size, size)) return bad("FlatBuffer extends past the end of the file");
  const uint8_t* fbp = base + h.flatbuffer_offset;
  flatbuffers::Verifier verifier(fbp, h.flatbuffer_size, flatbuffers::Verifier::Options{});
  if (!fb::VerifyProgramBuffer(verifier)) return bad("FlatBuffer verification failed");
  const fb::Program* prog = fb::GetProgram(fbp);
  if (prog->version() != h.version) return bad("program version differs from the header's");
  KILN_RETURN_IF_ERROR(check_strings(prog));

  auto data = std::make_unique<ProgramData>();
  data->version = h.version;
  const uint64_t fb_end = h.flatbuffer_offset + h.flatbuffer_size;
  std::vector<SegmentSpan> segments;
  if (prog->segments()) {
    for (const fb::Segment* s : *prog->segments()) {
      if (s->offset() % kSegmentAlignment != 0 || s->offset() < fb_end || add_overflows(s->offset(), s->size(), size)) {
        return bad("segment out of the file's bounds or not page-aligned");
      }
      if (s->kind() > kPayloadSegment) return bad("segment of unknown kind " + std::to_string(s->kind()));
      segments.push_back({base + s->offset(), s->size(), s->kind()});
    }
  }
  std::vector<ConstantSpan> constants;
  if (prog->constants()) {
    for (const fb::ConstantRef* c : *prog->constants()) {
      if (c->segment() >= segments.size()) return bad("constant refers to a missing segment");
      const SegmentSpan& seg = segments[c->segment()];
      if (seg.kind != 0) return bad("constant refers to a delegate payload segment");
      if (c->offset() % kConstantAlignment != 0 || add_overflows(c->offset(), c->nbytes(), seg.size)) {
        return bad("constant range out of its segment's bounds");
      }
      constants.push_back({seg.data + c->offset(), c->nbytes()});
      data->constant_bytes += c->nbytes();
    }
  }
  if (prog->methods() == nullptr || prog->methods()->size() == 0) return bad("program has no methods");
  if (prog->states()) {
    for (const fb::State* st : *prog->states()) {
      const std::string sw = "state '" + st->name()->str() + "'";
      for (const StatePlan& o : data->states) {
        if (o.name == st->name()->str()) return bad(sw + " declared twice");
      }
      if (!is_valid_dtype(static_cast<int>(st->dtype()))) return bad(sw + ": invalid dtype");
      auto checked = read_sizes(static_cast<DType>(st->dtype()), st->sizes(), sw);
      if (!checked.ok()) return checked.error();
      const TensorType type = checked.value();
      StatePlan sp{st->name()->str(), type, nullptr};
      if (st->initial() >= 0) {
        if (static_cast<size_t>(st->initial()) >= constants.size()) return bad(sw + ": initial value constant out of range");
        const ConstantSpan& c = constants[static_cast<size_t>(st->initial())];
        if (c.nbytes != type.nbytes()) return bad(sw + ": initial value of " + std::to_string(c.nbytes) + " bytes, type needs " + std::to_string(type.nbytes()));
        sp.initial = c.data;
      } else if (st->initial() != -1) {
        return bad(sw + ": invalid initial value index");
      }
      data->state_infos.push_back(StateInfo{sp.name, sp.type, sp.initial == nullptr});
      data->states.push_back(std::move(sp));
    }
  }
  if (prog->metadata()) {
    for (const fb::KeyValue* kv : *prog->metadata()) {
      data->metadata.emplace_back(kv->key()->str(), kv->value() ? kv->value()->str() : std::string());
    }
  }
  // Entries that share a name are alternatives of one method, in order of preference: every
  // one is verified, and the first whose delegate backends are all available is kept.
  std::vector<std::vector<MethodPlan>> groups;
  for (const fb::Method* m : *prog->methods()) {
    auto plan = plan_method(m, segments, constants, /*defer_backend_errors=*/true, settings, data->widened, data->states);
    if (!plan.ok()) return plan.error();
    auto g = std::find_if(groups.begin(), groups.end(), [&](const auto& v) { return v[0].meta.name == plan->meta.name; });
    if (g == groups.end()) {
      groups.emplace_back();
      g = groups.end() - 1;
    } else if (&*g != &groups.back()) {
      return bad("alternatives of method '" + plan->meta.name + "' are not adjacent");
    }
    g->push_back(std::move(plan.value()));
  }
  for (auto& alts : groups) {
    size_t pick = 0;
    while (pick < alts.size() && !alts[pick].meta.unavailable.empty()) ++pick;
    std::vector<std::string> skipped;
    for (size_t a = 0; a < std::min(pick, alts.size()); ++a) skipped.push_back(alts[a].meta.unavailable);
    std::string why;  // every alternative unavailable: each one's reason
    if (pick == alts.size()) {
      why = skipped[0];
      if (alts.size() > 1) {
        why = "no alternative of method '" + alts[0].meta.name + "' can run here: alternative 0: " + skipped[0];
        for (size_t a = 1; a < skipped.size(); ++a) why += "; alternative " + std::to_string(a) + ": " + skipped[a];
      }
      if (!defer_backend_errors) return Error(ErrorCode::NotFound, why);
      pick = 0;  // keep the preferred one; load_method returns NotFound with every alternative's reason
    }
    MethodPlan chosen = std::move(alts[pick]);
    for (size_t a = 0; a < alts.size(); ++a) {
      if (a != pick) data->other_alternatives[chosen.meta.name].emplace_back(a, std::move(alts[a]));
    }
    if (!why.empty() && alts.size() > 1) {
      chosen.meta.unavailable = why;
      for (auto& ins : chosen.instructions) {
        if (!ins.backend_error.ok()) ins.backend_error = Error(ErrorCode::NotFound, why);
      }
    }
    chosen.meta.alternative = pick;
    chosen.meta.num_alternatives = alts.size();
    chosen.meta.skipped_alternatives = std::move(skipped);
    if (pick < chosen.meta.skipped_alternatives.size()) chosen.meta.skipped_alternatives.resize(pick);
    data->methods.push_back(std::move(chosen));
  }
  // Methods share the session's states: one that a delegate holds in one method must be held by
  // the same backend in every method that uses it (else one method would read stale bytes).
  for (size_t st = 0; st < data->states.size(); ++st) {
    const MethodPlan* first = nullptr;
    for (const MethodPlan& mp : data->methods) {
      const bool uses = std::find(mp.meta.states.begin(), mp.meta.states.end(), data->states[st].name) != mp.meta.states.end();
      if (!uses) continue;
      if (first != nullptr && first->state_holder[st] != mp.state_holder[st]) {
        return bad("state '" + data->states[st].name + "' is held by '" + first->state_holder[st] + "' in method '" +
                   first->meta.name + "' and by '" + mp.state_holder[st] + "' in method '" + mp.meta.name + "'");
      }
      if (first == nullptr) first = &mp;
    }
  }
  // Float16-stored constants are read once, to widen them: their file pages are dropped again
  // (re-read from the file if a delegate or a later load reads them), so that an fp16-weights
  // program does not hold both the float16 and the float32 copy.
  for (const auto& [index, widened] : data->widened) {
    const ConstantSpan& c = constants[static_cast<size_t>(index)];
    bytes->release_pages(c.data, c.nbytes);
  }
  data->bytes = std::move(bytes);
  data->backend_settings = settings;
  return data;
}

}  // namespace kiln::detail
