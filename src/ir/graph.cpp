// Graph construction: every node is typed by the op registry as it is added.
#include <algorithm>
#include <optional>
#include <set>

#include "ir/op_registry.h"
#include "kiln/compiler.h"
#include "kiln/format.h"
#include "runtime/file_format.h"

namespace kiln {

namespace {

/// A Value with every member initialized (no -Wmissing-field-initializers on aggregate init).
Value make_value(TensorType type, std::string name, ConstantBytes constant, bool is_input) {
  Value v;
  v.type = std::move(type);
  v.name = std::move(name);
  v.constant = std::move(constant);
  v.is_input = is_input;
  return v;
}

/// A kernel-call Node (no delegate, no symbolic attributes yet).
Node make_node(const std::string& op, std::vector<ValueId> inputs, Attributes attrs, std::string debug_name) {
  Node n;
  n.op = op;
  n.inputs = std::move(inputs);
  n.attrs = std::move(attrs);
  n.debug_name = std::move(debug_name);
  return n;
}

// No value beyond what a program file may hold (file_format.h): then every numel of the graph
// fits in int64, whatever sizes the attributes asked for (an ONNX Tile's repeats, ...).
Error check_value_limits(const std::string& op, const TensorType& t, const std::string& where) {
  bool fits = t.dim() <= kMaxTensorRank;
  uint64_t volume = dtype_size(t.dtype);
  for (int64_t d : t.sizes) {
    const uint64_t f = d <= 0 ? 1 : static_cast<uint64_t>(d);
    fits = fits && volume <= kMaxTensorBytes / f;
    if (fits) volume *= f;
  }
  if (!fits) {
    return Error(ErrorCode::InvalidArgument, op + ": output " + t.to_string() +
                                                 " exceeds the program format's limits (rank <= 16; at most 2^46 "
                                                 "bytes, zero sizes counted as 1)" + where);
  }
  return {};
}

}  // namespace

ValueId Graph::add_input(std::string name, TensorType type) {
  values_.push_back(make_value(std::move(type), std::move(name), nullptr, true));
  const auto id = static_cast<ValueId>(values_.size() - 1);
  inputs_.push_back(id);
  return id;
}

Result<ValueId> Graph::add_constant(std::string name, TensorType type, ConstantBytes bytes) {
  if (!bytes || bytes->size() != type.nbytes()) {
    return Error(ErrorCode::InvalidArgument,
                 "constant '" + name + "' of type " + type.to_string() + " needs " + std::to_string(type.nbytes()) +
                     " bytes, got " + std::to_string(bytes ? bytes->size() : 0));
  }
  values_.push_back(make_value(std::move(type), std::move(name), std::move(bytes), false));
  return static_cast<ValueId>(values_.size() - 1);
}

Result<ValueId> Graph::add_constant(std::string name, TensorType type, std::vector<uint8_t> bytes) {
  return add_constant(std::move(name), std::move(type), std::make_shared<const std::vector<uint8_t>>(std::move(bytes)));
}

Result<std::vector<ValueId>> Graph::add_node(const std::string& op, std::vector<ValueId> inputs,
                                             const Attributes& attrs, std::string debug_name) {
  const std::string where = debug_name.empty() ? "" : " (at " + debug_name + ")";
  const OpDef* def = OpRegistry::get().find(op);
  if (def == nullptr) {
    return Error(ErrorCode::OperatorMissing, "op '" + op + "' is not in Kiln's op set" + where);
  }
  auto norm = def->normalize_attributes(attrs);
  if (!norm.ok()) return Error(norm.error().code(), norm.error().message() + where);
  std::vector<const TensorType*> types;
  for (ValueId id : inputs) {
    if (id == kNoValue) {
      types.push_back(nullptr);
    } else if (id < 0 || static_cast<size_t>(id) >= values_.size()) {
      return Error(ErrorCode::InvalidArgument, op + ": input value id " + std::to_string(id) + " out of range" + where);
    } else {
      types.push_back(&values_[static_cast<size_t>(id)].type);
    }
  }
  auto out_types = def->infer_types(types, norm.value());
  if (!out_types.ok()) return Error(out_types.error().code(), out_types.error().message() + where);
  for (const TensorType& t : out_types.value()) KILN_RETURN_IF_ERROR(check_value_limits(op, t, where));
  Node node = make_node(op, std::move(inputs), std::move(norm.value()), std::move(debug_name));
  for (auto& t : out_types.value()) {
    values_.push_back(make_value(std::move(t), {}, nullptr, false));
    node.outputs.push_back(static_cast<ValueId>(values_.size() - 1));
  }
  nodes_.push_back(std::move(node));
  return nodes_.back().outputs;
}

Result<int32_t> Graph::add_symbol(std::string name, int64_t min, int64_t max) {
  if (name.empty()) return Error(ErrorCode::InvalidArgument, "a symbol needs a name");
  if (min < 0 || min > max || max > kMaxSymbolValue) {
    return Error(ErrorCode::InvalidArgument, "symbol '" + name + "': range [" + std::to_string(min) + ", " +
                                                 std::to_string(max) + "] must satisfy 0 <= min <= max <= 2^40");
  }
  for (const SymbolDef& s : symbols_) {
    if (s.name == name) return Error(ErrorCode::InvalidArgument, "symbol '" + name + "' declared twice");
  }
  symbols_.push_back(SymbolDef{std::move(name), min, max});
  return static_cast<int32_t>(symbols_.size() - 1);
}

namespace {

/// Upper bounds of `sym` over the check bindings of `symbols` (also checks each expression).
Result<std::vector<int64_t>> bound_sizes(const std::vector<SymExpr>& sym, const std::vector<SymbolDef>& symbols) {
  std::vector<int64_t> bound(sym.size(), 0), sizes;
  for (const SymExpr& e : sym) {
    if (Error err = e.validate(symbols.size()); !err.ok()) return Error(ErrorCode::InvalidArgument, err.message());
  }
  for (const auto& b : check_bindings(symbols)) {
    KILN_RETURN_IF_ERROR(eval_sizes(sym, b, &sizes));
    for (size_t d = 0; d < sym.size(); ++d) bound[d] = std::max(bound[d], sizes[d]);
  }
  return bound;
}

/// Expressions that are all constants become fixed sizes (empty list).
void drop_if_static(std::vector<SymExpr>& sym) {
  if (std::all_of(sym.begin(), sym.end(), [](const SymExpr& e) { return e.is_constant(); })) sym.clear();
}

}  // namespace

Result<ValueId> Graph::add_input(std::string name, TensorType type, std::vector<SymExpr> sym_sizes) {
  if (!sym_sizes.empty() && sym_sizes.size() != type.sizes.size()) {
    return Error(ErrorCode::InvalidArgument, "input '" + name + "': " + std::to_string(sym_sizes.size()) +
                                                 " size expressions for rank " + std::to_string(type.sizes.size()));
  }
  drop_if_static(sym_sizes);
  if (!sym_sizes.empty()) {
    auto bound = bound_sizes(sym_sizes, symbols_);
    if (!bound.ok()) return Error(bound.error().code(), "input '" + name + "': " + bound.error().message());
    type.sizes = bound.value();
  }
  const ValueId id = add_input(std::move(name), std::move(type));
  values_.back().sym_sizes = std::move(sym_sizes);
  return id;
}

Result<ValueId> Graph::add_state(std::string name, TensorType type, ConstantBytes initial) {
  for (const StateDef& s : states_) {
    if (s.name == name) return Error(ErrorCode::InvalidArgument, "state '" + name + "' declared twice");
  }
  if (initial && initial->size() != type.nbytes()) {
    return Error(ErrorCode::InvalidArgument, "state '" + name + "' of type " + type.to_string() + " needs " +
                                                 std::to_string(type.nbytes()) + " bytes of initial value, got " +
                                                 std::to_string(initial->size()));
  }
  values_.push_back(make_value(type, name, nullptr, false));
  const auto id = static_cast<ValueId>(values_.size() - 1);
  values_.back().state = static_cast<int32_t>(states_.size());
  states_.push_back(StateDef{std::move(name), std::move(type), std::move(initial), id, kNoValue});
  return id;
}

Error Graph::set_state_update(ValueId state, ValueId value) {
  for (StateDef& s : states_) {
    if (s.value != state) continue;
    if (value < 0 || static_cast<size_t>(value) >= values_.size()) {
      return Error(ErrorCode::InvalidArgument, "state '" + s.name + "': update value id out of range");
    }
    const Value& v = values_[static_cast<size_t>(value)];
    if (!(v.type == s.type) || v.is_dynamic()) {
      return Error(ErrorCode::InvalidArgument, "state '" + s.name + "' of type " + s.type.to_string() +
                                                   " cannot take a value of type " + v.type.to_string() +
                                                   (v.is_dynamic() ? " with symbolic sizes" : ""));
    }
    s.update = value;
    return {};
  }
  return Error(ErrorCode::InvalidArgument, "value " + std::to_string(state) + " is not a state (add_state)");
}

Result<std::vector<ValueId>> Graph::add_node(const std::string& op, std::vector<ValueId> inputs, const Attributes& attrs,
                                             std::string debug_name, std::vector<SymAttr> sym_attrs,
                                             std::vector<std::vector<SymExpr>> out_sym_sizes) {
  bool dynamic = !sym_attrs.empty();
  for (ValueId id : inputs) {
    if (id >= 0 && static_cast<size_t>(id) < values_.size() && values_[static_cast<size_t>(id)].is_dynamic()) dynamic = true;
  }
  if (!dynamic) {
    for (auto& sizes : out_sym_sizes) drop_if_static(sizes);
    bool given_dynamic = false;
    for (const auto& sizes : out_sym_sizes) given_dynamic = given_dynamic || !sizes.empty();
    if (!given_dynamic) return add_node(op, std::move(inputs), attrs, std::move(debug_name));
  }
  const std::string where = debug_name.empty() ? "" : " (at " + debug_name + ")";
  const OpDef* def = OpRegistry::get().find(op);
  if (def == nullptr) return Error(ErrorCode::OperatorMissing, "op '" + op + "' is not in Kiln's op set" + where);
  auto norm = def->normalize_attributes(attrs);
  if (!norm.ok()) return Error(norm.error().code(), norm.error().message() + where);
  for (const SymAttr& a : sym_attrs) {
    if (Error e = a.expr.validate(symbols_.size()); !e.ok()) return Error(ErrorCode::InvalidArgument, op + ": " + e.message() + where);
    Attributes probe = norm.value();
    if (Error e = set_int_attribute(probe, a.name, a.index, 0); !e.ok()) return Error(e.code(), op + ": " + e.message() + where);
  }
  for (ValueId id : inputs) {
    if (id != kNoValue && (id < 0 || static_cast<size_t>(id) >= values_.size())) {
      return Error(ErrorCode::InvalidArgument, op + ": input value id " + std::to_string(id) + " out of range" + where);
    }
  }
  // Shape inference at every check binding, concretely.
  const auto bindings = check_bindings(symbols_);
  std::vector<std::vector<TensorType>> inferred;  // per binding
  std::vector<Attributes> bound_attrs;
  for (const auto& b : bindings) {
    std::vector<TensorType> in_types(inputs.size());
    std::vector<const TensorType*> ptrs(inputs.size(), nullptr);
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i] == kNoValue) continue;
      const Value& v = values_[static_cast<size_t>(inputs[i])];
      in_types[i] = v.type;
      KILN_RETURN_IF_ERROR(eval_sizes(v.sym_sizes, b, &in_types[i].sizes));
      ptrs[i] = &in_types[i];
    }
    Attributes at = norm.value();
    for (const SymAttr& a : sym_attrs) {
      auto v = a.expr.eval(b);
      if (!v.ok()) return Error(ErrorCode::InvalidArgument, op + ": " + v.error().message() + where);
      KILN_RETURN_IF_ERROR(set_int_attribute(at, a.name, a.index, v.value()));
    }
    auto out = def->infer_types(ptrs, at);
    if (!out.ok()) {
      std::string bs;
      for (size_t s = 0; s < symbols_.size(); ++s) bs += (s ? ", " : "") + symbols_[s].name + "=" + std::to_string(b[s]);
      return Error(out.error().code(), out.error().message() + " (with " + bs + ")" + where);
    }
    inferred.push_back(std::move(out.value()));
  }
  const size_t nout = inferred[0].size();
  if (!out_sym_sizes.empty() && out_sym_sizes.size() != nout) {
    return Error(ErrorCode::InvalidArgument, op + ": " + std::to_string(out_sym_sizes.size()) + " output size lists for " +
                                                 std::to_string(nout) + " outputs" + where);
  }
  out_sym_sizes.resize(nout);
  std::vector<int64_t> sizes;
  for (size_t o = 0; o < nout; ++o) {
    const size_t rank = inferred[0][o].sizes.size();
    auto& sym = out_sym_sizes[o];
    if (sym.empty()) {
      // Derive: each dim is a constant or matches an input dim or a symbolic attribute at every binding.
      std::vector<SymExpr> candidates;
      for (ValueId id : inputs) {
        if (id == kNoValue) continue;
        for (const SymExpr& e : values_[static_cast<size_t>(id)].sym_sizes) candidates.push_back(e);
      }
      for (const SymAttr& a : sym_attrs) candidates.push_back(a.expr);
      for (size_t d = 0; d < rank; ++d) {
        bool fixed = true;
        for (const auto& t : inferred) fixed = fixed && t[o].sizes[d] == inferred[0][o].sizes[d];
        std::optional<SymExpr> found;
        if (fixed) found = SymExpr::constant(inferred[0][o].sizes[d]);
        for (size_t c = 0; !found && c < candidates.size(); ++c) {
          bool all = true;
          for (size_t bi = 0; bi < bindings.size() && all; ++bi) {
            auto v = candidates[c].eval(bindings[bi]);
            all = v.ok() && v.value() == inferred[bi][o].sizes[d];
          }
          if (all) found = candidates[c];
        }
        if (!found) {
          return Error(ErrorCode::InvalidArgument, op + ": cannot derive a symbolic expression for output " + std::to_string(o) +
                                                       " dim " + std::to_string(d) + "; give out_sym_sizes" + where);
        }
        sym.push_back(*found);
      }
    }
    if (sym.size() != rank) {
      return Error(ErrorCode::InvalidArgument, op + ": output " + std::to_string(o) + " has rank " + std::to_string(rank) +
                                                   ", given " + std::to_string(sym.size()) + " size expressions" + where);
    }
    for (const SymExpr& e : sym) {
      if (Error err = e.validate(symbols_.size()); !err.ok()) return Error(ErrorCode::InvalidArgument, op + ": " + err.message() + where);
    }
    for (size_t bi = 0; bi < bindings.size(); ++bi) {
      KILN_RETURN_IF_ERROR(eval_sizes(sym, bindings[bi], &sizes));
      if (sizes != inferred[bi][o].sizes) {
        std::string bs;
        for (size_t s = 0; s < symbols_.size(); ++s) bs += (s ? ", " : "") + symbols_[s].name + "=" + std::to_string(bindings[bi][s]);
        return Error(ErrorCode::InvalidArgument, op + ": output " + std::to_string(o) + " is " + sizes_to_string(sizes) +
                                                     " by its size expressions but " + sizes_to_string(inferred[bi][o].sizes) +
                                                     " by the op's shape inference at " + bs + where);
      }
    }
  }
  // Outputs at their upper bounds; the node is added through the static path's checks.
  std::vector<TensorType> out_types;
  for (size_t o = 0; o < nout; ++o) {
    auto bound = bound_sizes(out_sym_sizes[o], symbols_);
    if (!bound.ok()) return Error(bound.error().code(), op + ": " + bound.error().message() + where);
    out_types.push_back(TensorType{inferred[0][o].dtype, bound.value()});
  }
  for (const TensorType& t : out_types) KILN_RETURN_IF_ERROR(check_value_limits(op, t, where));
  // The stored attribute values are those at the all-max binding (for reports; the runtime
  // evaluates the expressions).
  const auto& top = bindings[bindings.size() - 3];  // the last corner: every symbol at its max
  for (const SymAttr& a : sym_attrs) {
    auto v = a.expr.eval(top);
    if (v.ok()) KILN_RETURN_IF_ERROR(set_int_attribute(norm.value(), a.name, a.index, v.value()));
  }
  Node node = make_node(op, std::move(inputs), std::move(norm.value()), std::move(debug_name));
  node.sym_attrs = std::move(sym_attrs);
  for (size_t o = 0; o < nout; ++o) {
    values_.push_back(make_value(std::move(out_types[o]), {}, nullptr, false));
    drop_if_static(out_sym_sizes[o]);
    values_.back().sym_sizes = std::move(out_sym_sizes[o]);
    node.outputs.push_back(static_cast<ValueId>(values_.size() - 1));
  }
  nodes_.push_back(std::move(node));
  return nodes_.back().outputs;
}

Error Graph::set_outputs(std::vector<ValueId> outputs) {
  for (ValueId id : outputs) {
    if (id < 0 || static_cast<size_t>(id) >= values_.size()) {
      return Error(ErrorCode::InvalidArgument, "output value id " + std::to_string(id) + " out of range");
    }
  }
  outputs_ = std::move(outputs);
  output_names_.clear();
  return {};
}

Error Graph::set_output_names(std::vector<std::string> names) {
  if (!names.empty() && names.size() != outputs_.size()) {
    return Error(ErrorCode::InvalidArgument, std::to_string(names.size()) + " output names for " +
                                                 std::to_string(outputs_.size()) + " outputs");
  }
  std::set<std::string> seen;
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i].empty()) return Error(ErrorCode::InvalidArgument, "output " + std::to_string(i) + " has an empty name");
    if (!is_printable_name(names[i])) {
      return Error(ErrorCode::InvalidArgument, "output " + std::to_string(i) + " name '" + printable(names[i]) +
                                                   "' is not a printable UTF-8 name");
    }
    if (!seen.insert(names[i]).second) {
      return Error(ErrorCode::InvalidArgument, "output name '" + names[i] + "' is given twice");
    }
  }
  output_names_ = std::move(names);
  return {};
}

std::vector<std::string> unique_output_names(std::vector<std::string> names) {
  // Base names: an empty name is a placeholder "output_<i>", a non-printable one is escaped; only a
  // name given as it is counts as exact. Exact names claim theirs first (first occurrence), then
  // the altered ones; every other gets the first "_<k>" suffix that no output's name has.
  std::vector<bool> exact(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    exact[i] = !names[i].empty() && is_printable_name(names[i]);
    if (names[i].empty()) names[i] = "output_" + std::to_string(i);
    if (!is_printable_name(names[i])) names[i] = printable(names[i]);  // control characters, bad UTF-8 -> \xNN
  }
  std::vector<bool> done(names.size(), false);
  std::set<std::string> claimed;
  for (bool tier : {true, false}) {
    for (size_t i = 0; i < names.size(); ++i) {
      if (exact[i] == tier && claimed.insert(names[i]).second) done[i] = true;
    }
  }
  std::set<std::string> taken(names.begin(), names.end());
  for (size_t i = 0; i < names.size(); ++i) {
    if (done[i]) continue;
    for (int k = 2;; ++k) {
      std::string c = names[i] + "_" + std::to_string(k);
      if (taken.insert(c).second) {
        names[i] = c;
        break;
      }
    }
  }
  return names;
}

}  // namespace kiln
