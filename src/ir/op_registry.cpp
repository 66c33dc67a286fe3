// OpDef normalization/inference and the registry itself.
#include "ir/op_registry.h"

#include <algorithm>

namespace kiln {
namespace {

const char* kind_name(AttrKind k) {
  switch (k) {
    case AttrKind::Bool: return "bool";
    case AttrKind::Int: return "int";
    case AttrKind::Float: return "float";
    case AttrKind::String: return "str";
    case AttrKind::Ints: return "int[]";
    case AttrKind::Floats: return "float[]";
  }
  return "?";
}

// Converts `v` to `kind` where PyTorch would accept it (int for float, bool for int,
// one int for an int list, ints for a float list). Returns false when impossible.
bool coerce(const AttrValue& v, AttrKind kind, AttrValue& out) {
  switch (kind) {
    case AttrKind::Bool:
      if (auto* b = std::get_if<bool>(&v)) { out = *b; return true; }
      if (auto* i = std::get_if<int64_t>(&v)) { if (*i == 0 || *i == 1) { out = *i == 1; return true; } }
      return false;
    case AttrKind::Int:
      if (auto* i = std::get_if<int64_t>(&v)) { out = *i; return true; }
      if (auto* b = std::get_if<bool>(&v)) { out = static_cast<int64_t>(*b); return true; }
      return false;
    case AttrKind::Float:
      if (auto* d = std::get_if<double>(&v)) { out = *d; return true; }
      if (auto* i = std::get_if<int64_t>(&v)) { out = static_cast<double>(*i); return true; }
      if (auto* b = std::get_if<bool>(&v)) { out = *b ? 1.0 : 0.0; return true; }
      return false;
    case AttrKind::String:
      if (auto* s = std::get_if<std::string>(&v)) { out = *s; return true; }
      return false;
    case AttrKind::Ints:
      if (auto* l = std::get_if<std::vector<int64_t>>(&v)) { out = *l; return true; }
      if (auto* i = std::get_if<int64_t>(&v)) { out = std::vector<int64_t>{*i}; return true; }
      if (auto* f = std::get_if<std::vector<double>>(&v); f && f->empty()) { out = std::vector<int64_t>{}; return true; }
      return false;
    case AttrKind::Floats:
      if (auto* f = std::get_if<std::vector<double>>(&v)) { out = *f; return true; }
      if (auto* l = std::get_if<std::vector<int64_t>>(&v)) {
        out = std::vector<double>(l->begin(), l->end());
        return true;
      }
      if (auto* d = std::get_if<double>(&v)) { out = std::vector<double>{*d}; return true; }
      return false;
  }
  return false;
}

}  // namespace

Result<Attributes> OpDef::normalize_attributes(const Attributes& given) const {
  for (const auto& item : given.items()) {
    const std::string& n = item.first;  // not a structured binding: clang < 16 cannot capture those
    bool known = std::any_of(attrs.begin(), attrs.end(), [&](const AttrSpec& s) { return s.name == n; });
    if (!known) {
      return Error(ErrorCode::InvalidArgument, name + ": unknown attribute '" + n + "'");
    }
  }
  Attributes out;
  for (const AttrSpec& spec : attrs) {
    const AttrValue* v = given.find(spec.name);
    if (v == nullptr || std::holds_alternative<std::monostate>(*v)) {
      if (v != nullptr && spec.nullable) {
        out.set(spec.name, AttrValue{});  // explicit None where the schema allows it
      } else if (!spec.required) {
        out.set(spec.name, spec.default_value);
      } else {
        return Error(ErrorCode::InvalidArgument, name + ": missing required attribute '" + spec.name + "'");
      }
      continue;
    }
    AttrValue coerced;
    if (!coerce(*v, spec.kind, coerced)) {
      return Error(ErrorCode::InvalidArgument, name + ": attribute '" + spec.name + "' must be " +
                                                   kind_name(spec.kind) + ", got " + attr_kind_name(*v) +
                                                   " " + attr_to_string(*v));
    }
    out.set(spec.name, std::move(coerced));
  }
  return out;
}

Result<std::vector<TensorType>> OpDef::infer_types(InputTypes in, const Attributes& normalized) const {
  if (variadic) {
    if (in.empty()) return Error(ErrorCode::InvalidArgument, name + ": expects at least one tensor");
    for (const TensorType* t : in) {
      if (t == nullptr) return Error(ErrorCode::InvalidArgument, name + ": tensor list may not contain None");
    }
  } else {
    if (in.size() != inputs.size()) {
      return Error(ErrorCode::InvalidArgument, name + ": expected " + std::to_string(inputs.size()) +
                                                   " tensor arguments, got " + std::to_string(in.size()));
    }
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (in[i] == nullptr && !inputs[i].optional) {
        return Error(ErrorCode::InvalidArgument, name + ": tensor argument '" + inputs[i].name + "' may not be None");
      }
    }
  }
  for (const TensorType* t : in) {
    if (t == nullptr) continue;
    for (int64_t s : t->sizes) {
      if (s < 0) return Error(ErrorCode::InvalidArgument, name + ": negative size");
    }
  }
  auto out = infer(in, normalized);
  if (!out.ok()) {
    return Error(out.error().code(), name + ": " + out.error().message());
  }
  if (static_cast<int>(out->size()) != num_outputs) {
    return Error(ErrorCode::Internal, name + ": inference returned the wrong number of outputs");
  }
  return out;
}

const OpRegistry& OpRegistry::get() {
  static const OpRegistry registry = [] {
    OpRegistry r;
    register_elementwise_ops(r);
    register_math_ops(r);
    register_conv_ops(r);
    register_linear_ops(r);
    register_norm_ops(r);
    register_pool_ops(r);
    register_upsample_ops(r);
    register_reduction_ops(r);
    register_shape_ops(r);
    register_quant_ops(r);
    register_sort_ops(r);
    register_creation_ops(r);
    register_layout_ops(r);
    register_indexing_ops(r);
    register_spatial_extra_ops(r);
    register_llm_ops(r);
    std::sort(r.ops_.begin(), r.ops_.end(), [](const OpDef& a, const OpDef& b) { return a.name < b.name; });
    return r;
  }();
  return registry;
}

const OpDef* OpRegistry::find(std::string_view name) const {
  auto it = std::lower_bound(ops_.begin(), ops_.end(), name,
                             [](const OpDef& d, std::string_view n) { return d.name < n; });
  if (it != ops_.end() && it->name == name) return &*it;
  return nullptr;
}

void OpRegistry::add(OpDef def) { ops_.push_back(std::move(def)); }

Result<std::vector<int64_t>> broadcast_shapes(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  const size_t n = std::max(a.size(), b.size());
  std::vector<int64_t> out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1) {
      return Error(ErrorCode::InvalidArgument, "shapes " + sizes_to_string(a) + " and " + sizes_to_string(b) +
                                                   " cannot be broadcast");
    }
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Result<int64_t> wrap_dim(int64_t dim, int64_t rank) {
  const int64_t r = rank == 0 ? 1 : rank;  // PyTorch allows dim 0/-1 on 0-d tensors
  if (dim < -r || dim >= r) {
    return Error(ErrorCode::InvalidArgument, "dim " + std::to_string(dim) + " out of range for rank " +
                                                 std::to_string(rank));
  }
  return dim < 0 ? dim + r : dim;
}

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  auto rank = [](DType d) {
    switch (d) {
      case DType::Bool: return 0;
      case DType::UInt8: return 1;
      case DType::Int8: return 2;
      case DType::Int32: return 3;
      case DType::Int64: return 4;
      case DType::BFloat16: return 5;
      case DType::Float16: return 6;
      case DType::Float32: return 7;
      case DType::Float64: return 8;
    }
    return 0;
  };
  // PyTorch: uint8 with int8 promotes to int16 (absent here) -> int32; f16 with bf16 -> f32.
  if ((a == DType::UInt8 && b == DType::Int8) || (a == DType::Int8 && b == DType::UInt8)) return DType::Int32;
  if ((a == DType::Float16 && b == DType::BFloat16) || (a == DType::BFloat16 && b == DType::Float16)) return DType::Float32;
  return rank(a) >= rank(b) ? a : b;
}

DType result_type(const TensorType& a, const TensorType& b) {
  const bool a0 = a.sizes.empty(), b0 = b.sizes.empty();
  if (a0 == b0) return promote_types(a.dtype, b.dtype);
  const DType dim = a0 ? b.dtype : a.dtype;   // the tensor with dimensions
  const DType zero = a0 ? a.dtype : b.dtype;  // the 0-d tensor
  auto category = [](DType d) { return d == DType::Bool ? 0 : (is_floating(d) ? 2 : 1); };
  return category(zero) > category(dim) ? promote_types(dim, zero) : dim;
}

bool updates_state_in_place(std::string_view op) { return op == "aten.index_put" || op == "aten.slice_scatter"; }

bool is_byte_view(std::string_view op) { return op == "aten.view" || op == "aten.squeeze" || op == "aten.unsqueeze"; }

}  // namespace kiln
