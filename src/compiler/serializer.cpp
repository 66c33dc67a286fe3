// ProgramBuilder::compile: passes, memory planning and the one writer of .kiln files.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "common/file_write.h"
#include "kiln/compiler.h"
#include "kiln/format.h"
#include "program_generated.h"
#include "runtime/file_format.h"

namespace kiln {
namespace {

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/// The compact JSON stored under kDelegationMetadataKey: per compiled method entry (one per
/// alternative), the backends requested, what each delegate took, and the ops left on the CPU with
/// each backend's reason (DelegationReport::cpu_ops). Read by `kiln report`.
std::string delegation_json(const std::vector<MethodReport>& reports, const std::vector<std::vector<std::string>>& alternatives) {
  std::string j = "{\"version\":1,\"methods\":[";
  for (size_t m = 0; m < reports.size(); ++m) {
    const MethodReport& r = reports[m];
    j += (m ? ",{" : "{") + std::string("\"name\":") + json_quote(r.name) + ",\"alternative\":" + std::to_string(r.alternative) +
         ",\"nodes\":" + std::to_string(r.num_nodes) + ",\"requested\":[";
    const auto& req = r.alternative < alternatives.size() ? alternatives[r.alternative] : std::vector<std::string>{};
    for (size_t i = 0; i < req.size(); ++i) j += (i ? "," : "") + json_quote(req[i]);
    j += "],\"backends\":[";
    for (size_t i = 0; i < r.delegation.backends.size(); ++i) {
      const auto& b = r.delegation.backends[i];
      j += (i ? ",{" : "{") + std::string("\"backend\":") + json_quote(b.backend) + ",\"segments\":" + std::to_string(b.segments) +
           ",\"nodes\":" + std::to_string(b.nodes) + ",\"constant_bytes\":" + std::to_string(b.constant_bytes) + "}";
    }
    j += "],\"cpu_ops\":[";
    for (size_t i = 0; i < r.delegation.cpu_ops.size(); ++i) {
      const auto& c = r.delegation.cpu_ops[i];
      j += (i ? ",{" : "{") + std::string("\"op\":") + json_quote(c.op) + ",\"count\":" + std::to_string(c.count) + ",\"reasons\":[";
      for (size_t k = 0; k < c.reasons.size(); ++k) {
        j += (k ? ",[" : "[") + json_quote(c.reasons[k].first) + "," + json_quote(c.reasons[k].second) + "]";
      }
      j += "]}";
    }
    j += "]}";
  }
  return j + "]}";
}

flatbuffers::Offset<fb::Attribute> write_attr(flatbuffers::FlatBufferBuilder& b, const std::string& name,
                                              const AttrValue& v) {
  auto n = b.CreateString(name);
  switch (v.index()) {
    case 1: return fb::CreateAttribute(b, n, fb::AttrKind::Bool, std::get<bool>(v) ? 1 : 0);
    case 2: return fb::CreateAttribute(b, n, fb::AttrKind::Int, std::get<int64_t>(v));
    case 3: return fb::CreateAttribute(b, n, fb::AttrKind::Float, 0, std::get<double>(v));
    case 4: {
      auto s = b.CreateString(std::get<std::string>(v));
      return fb::CreateAttribute(b, n, fb::AttrKind::String, 0, 0, s);
    }
    case 5: {
      auto l = b.CreateVector(std::get<std::vector<int64_t>>(v));
      return fb::CreateAttribute(b, n, fb::AttrKind::Ints, 0, 0, 0, l);
    }
    case 6: {
      auto l = b.CreateVector(std::get<std::vector<double>>(v));
      return fb::CreateAttribute(b, n, fb::AttrKind::Floats, 0, 0, 0, 0, l);
    }
    default: return fb::CreateAttribute(b, n, fb::AttrKind::None);
  }
}

// Unique constant storage: identical (dtype, sizes, bytes) stored once.
struct ConstantTable {
  std::vector<ConstantBytes> data;
  std::vector<uint64_t> offsets;
  uint64_t size = 0;
  std::map<std::pair<size_t, uint64_t>, std::vector<int>> by_hash;  // (nbytes, hash) -> indices

  int add(const ConstantBytes& bytes) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a 64
    for (uint8_t c : *bytes) h = (h ^ c) * 1099511628211ull;
    auto& bucket = by_hash[{bytes->size(), h}];
    for (int idx : bucket) {
      if (data[static_cast<size_t>(idx)] == bytes || *data[static_cast<size_t>(idx)] == *bytes) return idx;
    }
    const int idx = static_cast<int>(data.size());
    data.push_back(bytes);
    size = align_up(size, kConstantAlignment);
    offsets.push_back(size);
    size += bytes->size();
    bucket.push_back(idx);
    return idx;
  }
};

// InvalidArgument when a tensor the method's file entry would hold breaks the loader's limits
// (file_format.h: rank, bytes with zero sizes counted as 1), so that what compiles also loads.
Error check_format_limits(const Graph& g, const std::string& method) {
  std::vector<bool> used(g.values().size(), false);
  for (ValueId v : g.inputs()) used[static_cast<size_t>(v)] = true;
  for (ValueId v : g.outputs()) used[static_cast<size_t>(v)] = true;
  for (const Node& n : g.nodes()) {
    for (ValueId v : n.inputs) {
      if (v != kNoValue) used[static_cast<size_t>(v)] = true;
    }
    for (ValueId v : n.outputs) used[static_cast<size_t>(v)] = true;
  }
  for (size_t i = 0; i < used.size(); ++i) {
    if (!used[i]) continue;
    const Value& v = g.values()[i];
    bool ok = v.type.dim() <= kMaxTensorRank;
    uint64_t volume = dtype_size(v.type.dtype);
    for (int64_t s : v.type.sizes) {
      const uint64_t f = s <= 0 ? 1 : static_cast<uint64_t>(s);
      ok = ok && volume <= kMaxTensorBytes / f;
      if (ok) volume *= f;
    }
    if (!ok) {
      return Error(ErrorCode::InvalidArgument, "method '" + method + "': value '" + v.name + "' " + v.type.to_string() +
                                                   " exceeds the program format's limits (rank <= 16; at most 2^46 "
                                                   "bytes, zero sizes counted as 1)");
    }
  }
  return {};
}

// InvalidArgument unless every symbol of the graph is exactly some input's dim: that is where
// execute binds it (the loader refuses the file otherwise; say so at compile time).
Error check_symbols_bound(const Graph& g, const std::string& method) {
  for (size_t s = 0; s < g.symbols().size(); ++s) {
    bool bound = false;
    for (ValueId id : g.inputs()) {
      for (const SymExpr& e : g.value(id).sym_sizes) bound = bound || e.as_symbol() == static_cast<int32_t>(s);
    }
    if (!bound) {
      return Error(ErrorCode::InvalidArgument,
                   "method '" + method + "': symbol '" + g.symbols()[s].name +
                       "' is bound by no input dimension: execute binds a symbol from an input dim that is exactly "
                       "that symbol (a dim such as 2 * " + g.symbols()[s].name + " alone cannot bind it); make some "
                       "input dim exactly '" + g.symbols()[s].name + "'");
    }
  }
  return {};
}

}  // namespace

Error ProgramBuilder::add_method(std::string name, Graph graph) {
  if (name.empty()) return Error(ErrorCode::InvalidArgument, "method name is empty");
  for (const auto& [n, g] : methods_) {
    if (n == name) return Error(ErrorCode::InvalidArgument, "duplicate method '" + name + "'");
  }
  if (graph.outputs().empty()) return Error(ErrorCode::InvalidArgument, "method '" + name + "' has no outputs");
  KILN_RETURN_IF_ERROR(check_symbols_bound(graph, name));
  methods_.emplace_back(std::move(name), std::move(graph));
  return {};
}

void ProgramBuilder::set_metadata(std::string key, std::string value) {
  for (auto& [k, v] : metadata_) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  metadata_.emplace_back(std::move(key), std::move(value));
}

Result<CompiledProgram> ProgramBuilder::compile(const CompileOptions& options) const {
  if (methods_.empty()) return Error(ErrorCode::InvalidArgument, "program has no methods");
  for (const auto& [k, v] : metadata_) {  // what the loader accepts (a file it refuses is never written)
    if (!is_printable_name(k)) {
      return Error(ErrorCode::InvalidArgument, "metadata key '" + printable(k) + "' is not a printable UTF-8 name");
    }
    if (!is_valid_utf8(v)) {
      return Error(ErrorCode::InvalidArgument, "metadata '" + printable(k) + "': the value is not valid UTF-8");
    }
  }
  CompiledProgram result;
  ConstantTable constants;
  flatbuffers::FlatBufferBuilder b(1 << 16);
  std::vector<flatbuffers::Offset<fb::Method>> fb_methods;
  std::vector<std::shared_ptr<const DelegateBlob>> payloads;  // segments 1.. in order

  // Program states, by name across methods (a KV cache that prefill and decode share): the first
  // method declaring one fixes its type and initial value; the others must agree.
  std::vector<const StateDef*> states;
  for (const auto& [name, g] : methods_) {
    for (const StateDef& st : g.states()) {
      auto same = std::find_if(states.begin(), states.end(), [&](const StateDef* o) { return o->name == st.name; });
      if (same == states.end()) {
        states.push_back(&st);
        continue;
      }
      const bool same_initial = (*same)->initial == st.initial ||
                                ((*same)->initial && st.initial && *(*same)->initial == *st.initial);
      if (!((*same)->type == st.type) || !same_initial) {
        return Error(ErrorCode::InvalidArgument, "state '" + st.name + "' is declared by two methods with different " +
                                                     ((*same)->type == st.type ? "initial values" : "types (" +
                                                     (*same)->type.to_string() + ", " + st.type.to_string() + ")"));
      }
    }
  }
  auto program_state = [&](const std::string& state_name) -> int32_t {
    for (size_t i = 0; i < states.size(); ++i) {
      if (states[i]->name == state_name) return static_cast<int32_t>(i);
    }
    return -1;
  };
  auto write_expr = [&b](const SymExpr& e) { return fb::CreateSizeExpr(b, b.CreateVector(e.code())); };

  // Held states (DelegateBlob::states): per (alternative, program state), the backend holding it
  // ("" = the session's bytes) and the first method that decided so. Every method of one
  // alternative must agree, since they share the session's state.
  std::map<std::pair<size_t, int32_t>, std::pair<std::string, std::string>> holder;
  std::string require_failures;  // require_delegation: the undelegated nodes of every method
  // Alternatives: each method is compiled once per backend list, in preference order; the file
  // holds one method entry per alternative (same name), and the loader runs the first whose
  // backends are all available.
  std::vector<std::vector<std::string>> alternatives = options.alternatives;
  if (alternatives.empty()) {
    alternatives.push_back(options.backends);
  } else if (!options.backends.empty() || !options.require_delegation.empty()) {
    return Error(ErrorCode::InvalidArgument, "alternatives replace backends and require_delegation: give one or the other");
  }
  if (options.weights_dtype != DType::Float32 && options.weights_dtype != DType::Float16) {
    return Error(ErrorCode::InvalidArgument, std::string("weights_dtype must be float32 or float16, got ") +
                                                 dtype_name(options.weights_dtype));
  }
  // weights_dtype float16: the binary16 copy of each eligible float32 constant (null: kept float32).
  std::map<const std::vector<uint8_t>*, ConstantBytes> half_of;
  auto as_half = [&](const Value& v) -> ConstantBytes {
    if (options.weights_dtype != DType::Float16 || v.type.dtype != DType::Float32 || v.type.numel() < 1024) return nullptr;
    auto it = half_of.find(v.constant.get());
    if (it != half_of.end()) return it->second;
    const auto* f = reinterpret_cast<const float*>(v.constant->data());
    const size_t n = static_cast<size_t>(v.type.numel());
    ConstantBytes out;
    bool ok = true;
    for (size_t i = 0; i < n && ok; ++i) ok = std::isfinite(f[i]) && std::fabs(f[i]) <= 65504.0f;
    if (ok) {
      auto bytes = std::make_shared<std::vector<uint8_t>>(n * 2);
      auto* h = reinterpret_cast<uint16_t*>(bytes->data());
      for (size_t i = 0; i < n; ++i) h[i] = float_to_half(f[i]);
      out = std::move(bytes);
    }
    half_of[v.constant.get()] = out;
    return out;
  };
  for (const auto& [name, original] : methods_) {
    for (size_t alt = 0; alt < alternatives.size(); ++alt) {
      Graph g = original;
      MethodReport rep;
      rep.name = name;
      // Runs one graph pass (its result: how many rewrites it made) into *count; its error names
      // the method and the pass. (`method`, not the structured binding `name`: clang 14 cannot
      // capture those in a lambda.)
      const std::string& method = name;
      auto run_pass = [&method](const char* what, Result<size_t> r, size_t* count) -> Error {
        if (!r.ok()) return Error(r.error().code(), "method '" + method + "': " + what + r.error().message());
        *count = r.value();
        return Error::success();
      };
      if (options.fold_constants) KILN_RETURN_IF_ERROR(run_pass("", fold_constants(g), &rep.num_folded));
      // The pattern rewrites come after constant folding (their constants 3, 6, c, eps and an
      // RMS norm's (1 + weight) must be folded first) and before the affine folding, which folds the scales quick-GELU leaves
      // (and would otherwise take hardswish's 1/6 into a following convolution).
      if (options.fold_constants) {
        KILN_RETURN_IF_ERROR(run_pass("hardswish recognition: ", fuse_hardswish(g), &rep.num_hardswish));
        KILN_RETURN_IF_ERROR(run_pass("quick-GELU rewrite: ", rewrite_quick_gelu(g), &rep.num_quick_gelu));
        KILN_RETURN_IF_ERROR(run_pass("RMS norm recognition: ", rewrite_rms_norm(g), &rep.num_rms_norm));
      }
      if (options.fold_batch_norm) {
        KILN_RETURN_IF_ERROR(run_pass("batch-norm folding: ", fold_batch_norm(g), &rep.num_bn_folded));
        KILN_RETURN_IF_ERROR(run_pass("affine folding: ", fold_scalar_affine(g), &rep.num_affine_folded));
      }
      if (options.quantize.bits != 0) {
        KILN_RETURN_IF_ERROR(run_pass("", quantize_weights(g, options.quantize), &rep.num_quantized));
      }
      if (options.eliminate_dead_code) rep.num_dead = eliminate_dead_code(g);
      KILN_RETURN_IF_ERROR(check_format_limits(g, name));
      rep.num_nodes = g.nodes().size();
      std::vector<std::string> backends = alternatives[alt];
      rep.alternative = alt;
      if (backends.empty() && !options.require_delegation.empty()) backends.push_back(options.require_delegation);
      if (!options.require_delegation.empty() &&
          std::find(backends.begin(), backends.end(), options.require_delegation) == backends.end()) {
        return Error(ErrorCode::InvalidArgument, "require_delegation '" + options.require_delegation +
                                                     "' is not among the requested backends");
      }
      auto delegation = partition(g, backends, options.compute_dtype);
      if (!delegation.ok()) return Error(delegation.error().code(), "method '" + name + "': " + delegation.error().message());
      rep.delegation = std::move(delegation.value());
      if (!options.require_delegation.empty()) {
        std::string missing;
        size_t count = 0;
        for (const auto& d : rep.delegation.declined) {
          if (d.backend != options.require_delegation) continue;
          ++count;
          missing += "\n  " + d.op + (d.debug_name.empty() ? "" : " (" + d.debug_name + ")") + ": " + d.reason;
        }
        if (count > 0) {
          // Keep going: the error lists the nodes of every method, not just the first one's.
          require_failures += std::string(require_failures.empty() ? "" : "\n") + "method '" + name + "': " +
                              std::to_string(count) + " node(s) not delegated to required backend '" +
                              options.require_delegation + "':" + missing;
          continue;
        }
      }
      std::vector<std::string> held_by(g.states().size());  // per graph state: its holding backend, or ""
      for (const Node& n : g.nodes()) {
        if (!n.delegate) continue;
        for (size_t st : n.delegate->states) held_by[st] = n.delegate->backend;
      }
      for (size_t st = 0; st < g.states().size(); ++st) {
        const auto key = std::make_pair(alt, program_state(g.states()[st].name));
        auto [it, added] = holder.emplace(key, std::make_pair(held_by[st], name));
        if (!added && it->second.first != held_by[st]) {
          auto where = [](const std::string& backend) { return backend.empty() ? std::string("the session") : "the " + backend + " delegate"; };
          return Error(ErrorCode::NotSupported, "state '" + g.states()[st].name + "' is held by " + where(it->second.first) +
                                                    " in method '" + it->second.second + "' but by " + where(held_by[st]) +
                                                    " in method '" + name + "': methods sharing a state must delegate "
                                                    "its reads and writes alike");
        }
      }
      plan_state_updates(g);
      MemoryPlan plan = plan_memory(g);
      rep.arena_bytes = plan.arena_bytes;
      rep.activation_bytes = plan.total_bytes;

      // Only values that are used get a slot in the file; renumber them.
      const auto& values = g.values();
      std::vector<int32_t> index(values.size(), -1);
      std::vector<int64_t> arena_offset(values.size(), -1);
      for (const PlannedValue& pv : plan.values) arena_offset[static_cast<size_t>(pv.value)] = static_cast<int64_t>(pv.offset);
      std::vector<flatbuffers::Offset<fb::Tensor>> fb_values;
      auto use = [&](ValueId id) -> int32_t {
        if (id == kNoValue) return -1;
        auto& slot = index[static_cast<size_t>(id)];
        if (slot >= 0) return slot;
        const Value& v = values[static_cast<size_t>(id)];
        int constant = -1;
        ConstantBytes half = v.constant ? as_half(v) : nullptr;
        if (v.constant) {
          const ConstantBytes& stored = half ? half : v.constant;
          constant = constants.add(stored);
          rep.constant_bytes += stored->size();
        }
        std::vector<uint8_t> dim_order(v.type.sizes.size());
        for (size_t i = 0; i < dim_order.size(); ++i) dim_order[i] = static_cast<uint8_t>(i);
        flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<fb::SizeExpr>>> sym = 0;
        if (v.is_dynamic()) {
          std::vector<flatbuffers::Offset<fb::SizeExpr>> exprs;
          for (const SymExpr& e : v.sym_sizes) exprs.push_back(write_expr(e));
          sym = b.CreateVector(exprs);
        }
        const int32_t state = v.state >= 0 ? program_state(g.states()[static_cast<size_t>(v.state)].name) : -1;
        fb_values.push_back(fb::CreateTensor(b, static_cast<fb::DType>(v.type.dtype), b.CreateVector(v.type.sizes),
                                             b.CreateVector(dim_order), constant,
                                             v.constant || state >= 0 ? -1 : arena_offset[static_cast<size_t>(id)],
                                             v.name.empty() ? 0 : b.CreateString(v.name), half != nullptr, sym, state));
        slot = static_cast<int32_t>(fb_values.size() - 1);
        return slot;
      };
      std::vector<int32_t> ins, outs;
      for (ValueId id : g.inputs()) ins.push_back(use(id));
      std::vector<flatbuffers::Offset<fb::InstructionEntry>> instrs;
      for (const Node& n : g.nodes()) {
        if (n.delegate) {
          std::vector<int32_t> args, res, consts;
          for (ValueId id : n.inputs) args.push_back(use(id));
          for (ValueId id : n.outputs) res.push_back(use(id));
          for (ValueId id : n.delegate->constants) {
            const ConstantBytes& cb = values[static_cast<size_t>(id)].constant;
            consts.push_back(constants.add(cb));
            rep.constant_bytes += cb->size();
          }
          std::vector<uint32_t> held;
          for (size_t st : n.delegate->states) held.push_back(static_cast<uint32_t>(program_state(g.states()[st].name)));
          payloads.push_back(n.delegate);
          const auto segment = static_cast<uint32_t>(payloads.size());  // segment 0 holds the constants
          auto call = fb::CreateDelegateCall(b, b.CreateString(n.delegate->backend), segment, b.CreateVector(args),
                                             b.CreateVector(res), b.CreateVector(consts),
                                             held.empty() ? 0 : b.CreateVector(held));
          instrs.push_back(fb::CreateInstructionEntry(b, fb::Instruction::DelegateCall, call.Union()));
          continue;
        }
        std::vector<int32_t> args, res;
        for (ValueId id : n.inputs) args.push_back(use(id));
        for (ValueId id : n.outputs) res.push_back(use(id));
        std::vector<flatbuffers::Offset<fb::Attribute>> attrs;
        for (const auto& [an, av] : n.attrs.items()) attrs.push_back(write_attr(b, an, av));
        std::vector<flatbuffers::Offset<fb::SymAttribute>> sym_attrs;
        for (const SymAttr& sa : n.sym_attrs) {
          sym_attrs.push_back(fb::CreateSymAttribute(b, b.CreateString(sa.name), sa.index, write_expr(sa.expr)));
        }
        auto call = fb::CreateKernelCall(b, b.CreateString(n.op), b.CreateVector(args), b.CreateVector(res),
                                         b.CreateVector(attrs), n.debug_name.empty() ? 0 : b.CreateString(n.debug_name),
                                         sym_attrs.empty() ? 0 : b.CreateVector(sym_attrs));
        instrs.push_back(fb::CreateInstructionEntry(b, fb::Instruction::KernelCall, call.Union()));
      }
      for (ValueId id : g.outputs()) outs.push_back(use(id));
      std::vector<flatbuffers::Offset<fb::StateUpdate>> updates;
      for (size_t si = 0; si < g.states().size(); ++si) {
        const StateDef& st = g.states()[si];
        if (st.update == kNoValue || st.update == st.value || !held_by[si].empty()) continue;
        updates.push_back(fb::CreateStateUpdate(b, static_cast<uint32_t>(program_state(st.name)), use(st.update)));
      }
      std::vector<flatbuffers::Offset<fb::Symbol>> symbols;
      for (const SymbolDef& sd : g.symbols()) symbols.push_back(fb::CreateSymbol(b, b.CreateString(sd.name), sd.min, sd.max));
      fb_methods.push_back(fb::CreateMethod(b, b.CreateString(name), b.CreateVector(fb_values), b.CreateVector(ins),
                                            b.CreateVector(outs), b.CreateVector(instrs), plan.arena_bytes,
                                            symbols.empty() ? 0 : b.CreateVector(symbols),
                                            updates.empty() ? 0 : b.CreateVector(updates),
                                            g.output_names().empty() ? 0 : b.CreateVectorOfStrings(g.output_names())));
      result.methods.push_back(rep);
    }
  }
  if (!require_failures.empty()) return Error(ErrorCode::NotSupported, require_failures);

  std::vector<flatbuffers::Offset<fb::State>> fb_states;
  for (const StateDef* st : states) {
    const int initial = st->initial ? constants.add(st->initial) : -1;
    fb_states.push_back(fb::CreateState(b, b.CreateString(st->name), static_cast<fb::DType>(st->type.dtype),
                                        b.CreateVector(st->type.sizes), initial));
  }
  std::vector<flatbuffers::Offset<fb::KeyValue>> meta;
  bool delegation_set = false;  // a caller's own value under the key is kept as given
  for (const auto& [k, v] : metadata_) {
    meta.push_back(fb::CreateKeyValue(b, b.CreateString(k), b.CreateString(v)));
    delegation_set = delegation_set || k == kDelegationMetadataKey;
  }
  if (!delegation_set) {
    meta.push_back(fb::CreateKeyValue(b, b.CreateString(kDelegationMetadataKey),
                                      b.CreateString(delegation_json(result.methods, alternatives))));
  }
  // The refs are written after the states: a state's initial value adds a constant.
  std::vector<flatbuffers::Offset<fb::ConstantRef>> refs;
  for (size_t i = 0; i < constants.data.size(); ++i) {
    refs.push_back(fb::CreateConstantRef(b, 0, constants.offsets[i], constants.data[i]->size()));
  }
  // Segment offsets depend on the FlatBuffer's size, which depends on the offsets: write the
  // segment table with placeholders and patch them (fixed-width scalars) after finishing.
  // Segment 0 holds the constants (present whenever there are constants or payloads), then one
  // payload segment (kind 1) per delegate call.
  const bool any_segments = !constants.data.empty() || !payloads.empty();
  std::vector<flatbuffers::Offset<fb::Segment>> segs;
  if (any_segments) {
    segs.push_back(fb::CreateSegment(b, ~0ull, constants.size, 0));
    for (const auto& p : payloads) segs.push_back(fb::CreateSegment(b, ~0ull, p->payload.size(), 1));
  }
  auto program = fb::CreateProgram(b, kFormatVersion, b.CreateVector(fb_methods), b.CreateVector(refs), b.CreateVector(segs),
                                   fb_states.empty() ? 0 : b.CreateVector(fb_states),
                                   meta.empty() ? 0 : b.CreateVector(meta));
  fb::FinishProgramBuffer(b, program);

  const uint64_t fb_offset = sizeof(FileHeader);
  const uint64_t fb_size = b.GetSize();
  const uint64_t seg_offset = align_up(fb_offset + fb_size, kSegmentAlignment);
  std::vector<uint64_t> seg_offsets;
  uint64_t file_size = fb_offset + fb_size;
  if (any_segments) {
    seg_offsets.push_back(seg_offset);
    file_size = seg_offset + constants.size;
    for (const auto& p : payloads) {
      seg_offsets.push_back(align_up(file_size, kSegmentAlignment));
      file_size = seg_offsets.back() + p->payload.size();
    }
  }

  std::vector<uint8_t>& out = result.bytes;
  out.assign(file_size, 0);
  FileHeader h{};
  std::memcpy(h.magic, kFileMagic, sizeof(kFileMagic));
  h.version = kFormatVersion;
  h.header_size = sizeof(FileHeader);
  h.flatbuffer_offset = fb_offset;
  h.flatbuffer_size = fb_size;
  h.segments_offset = any_segments ? seg_offset : file_size;
  h.file_size = file_size;
  std::memcpy(out.data(), &h, sizeof(h));
  std::memcpy(out.data() + fb_offset, b.GetBufferPointer(), fb_size);
  if (any_segments) {
    auto* prog = fb::GetMutableProgram(out.data() + fb_offset);
    for (size_t k = 0; k < seg_offsets.size(); ++k) {
      prog->mutable_segments()->GetMutableObject(static_cast<flatbuffers::uoffset_t>(k))->mutate_offset(seg_offsets[k]);
    }
    for (size_t i = 0; i < constants.data.size(); ++i) {
      if (constants.data[i]->empty()) continue;  // memcpy from an empty vector's null data is UB
      std::memcpy(out.data() + seg_offset + constants.offsets[i], constants.data[i]->data(), constants.data[i]->size());
    }
    for (size_t k = 0; k < payloads.size(); ++k) {
      const auto& p = payloads[k]->payload;
      if (!p.empty()) std::memcpy(out.data() + seg_offsets[k + 1], p.data(), p.size());
    }
  }
  result.constant_bytes = 0;
  for (const auto& c : constants.data) result.constant_bytes += c->size();
  return result;
}

std::string CompiledProgram::report() const {
  std::ostringstream os;
  os << "program: " << bytes.size() << " bytes, " << constant_bytes << " constant bytes (deduplicated)\n";
  for (const MethodReport& m : methods) {
    os << "  method '" << m.name << "': " << m.num_nodes << " kernel calls (" << m.num_folded << " folded, "
       << m.num_bn_folded << " batch norms folded, " << m.num_affine_folded << " scalar affines folded, " << m.num_hardswish << " hardswish recognized, " << m.num_quick_gelu << " quick-GELU rewritten, " << m.num_dead << " dead removed), arena " << m.arena_bytes << " bytes (activations " << m.activation_bytes
       << " bytes without reuse), constants " << m.constant_bytes << " bytes\n";
    const DelegationReport& d = m.delegation;
    if (d.backends.empty()) continue;
    os << "    delegation:\n";
    for (const auto& b : d.backends) {
      os << "      " << b.backend << ": " << b.segments << " segment(s), " << b.nodes << " node(s), constants "
         << b.constant_bytes << " bytes\n";
    }
    if (d.cpu_ops.empty()) {
      os << "      CPU kernels: none\n";
    } else {
      os << "      CPU kernels:\n";
      for (const auto& c : d.cpu_ops) {
        os << "        " << c.op << " x" << c.count << "\n";
        for (const auto& [backend, reason] : c.reasons) os << "          " << backend << ": " << reason << "\n";
      }
    }
    for (const auto& st : d.states) {
      os << "      state " << st.state << ": "
         << (st.resident ? "held by " + st.backend + " (no copy across the boundary per call)"
                         : "through the " + st.backend + " boundary: " + st.reason)
         << "\n";
    }
  }
  return os.str();
}

Error write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  return write_file_replacing(path, bytes.data(), bytes.size());
}

}  // namespace kiln
