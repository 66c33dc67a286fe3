// SymExpr: validation, evaluation and printing of symbolic size expressions (kiln/symbolic.h).
#include "kiln/symbolic.h"

#include <algorithm>

namespace kiln {

namespace {

constexpr size_t kMaxStack = 64;

int arity(int64_t op) {
  switch (op) {
    case SymExpr::Const: case SymExpr::Sym: return 0;
    case SymExpr::Add: case SymExpr::Sub: case SymExpr::Mul: case SymExpr::FloorDiv: case SymExpr::Mod:
    case SymExpr::Min: case SymExpr::Max: return 2;
    default: return -1;
  }
}

const char* infix(int64_t op) {
  switch (op) {
    case SymExpr::Add: return " + ";
    case SymExpr::Sub: return " - ";
    case SymExpr::Mul: return " * ";
    case SymExpr::FloorDiv: return " // ";
    case SymExpr::Mod: return " % ";
    default: return nullptr;
  }
}

}  // namespace

SymExpr SymExpr::binary(const SymExpr& o, Op op) const {
  std::vector<int64_t> code = code_;
  code.insert(code.end(), o.code_.begin(), o.code_.end());
  code.push_back(op);
  return SymExpr(std::move(code));
}

Error SymExpr::validate(size_t num_symbols) const {
  if (code_.empty() || code_.size() > kMaxSymExprTokens) {
    return Error(ErrorCode::InvalidProgram, "size expression of " + std::to_string(code_.size()) + " tokens (1.." +
                                                std::to_string(kMaxSymExprTokens) + " allowed)");
  }
  size_t depth = 0;
  for (size_t i = 0; i < code_.size(); ++i) {
    const int a = arity(code_[i]);
    if (a < 0) return Error(ErrorCode::InvalidProgram, "size expression: unknown opcode " + std::to_string(code_[i]));
    if (a == 0) {
      if (i + 1 >= code_.size()) return Error(ErrorCode::InvalidProgram, "size expression: missing operand");
      if (code_[i] == Sym && (code_[i + 1] < 0 || static_cast<uint64_t>(code_[i + 1]) >= num_symbols)) {
        return Error(ErrorCode::InvalidProgram, "size expression: symbol index " + std::to_string(code_[i + 1]) +
                                                    " out of range (" + std::to_string(num_symbols) + " symbols)");
      }
      ++i;
      if (++depth > kMaxStack) return Error(ErrorCode::InvalidProgram, "size expression nests too deeply");
    } else {
      if (depth < 2) return Error(ErrorCode::InvalidProgram, "size expression: operator without operands");
      --depth;
    }
  }
  if (depth != 1) return Error(ErrorCode::InvalidProgram, "size expression leaves " + std::to_string(depth) + " values");
  return {};
}

Result<int64_t> SymExpr::eval(std::span<const int64_t> symbols) const {
  int64_t stack[kMaxStack];
  size_t n = 0;
  auto fail = [](const char* what) { return Error(ErrorCode::InvalidArgument, std::string("size expression: ") + what); };
  for (size_t i = 0; i < code_.size(); ++i) {
    const int64_t op = code_[i];
    if (op == Const || op == Sym) {
      if (i + 1 >= code_.size() || n >= kMaxStack) return fail("malformed");
      const int64_t v = code_[++i];
      if (op == Sym && (v < 0 || static_cast<uint64_t>(v) >= symbols.size())) return fail("symbol out of range");
      stack[n++] = op == Const ? v : symbols[static_cast<size_t>(v)];
      continue;
    }
    if (n < 2) return fail("malformed");
    const int64_t b = stack[--n];
    int64_t& a = stack[n - 1];
    int64_t r = 0;
    switch (op) {
      case Add: if (__builtin_add_overflow(a, b, &r)) return fail("int64 overflow"); break;
      case Sub: if (__builtin_sub_overflow(a, b, &r)) return fail("int64 overflow"); break;
      case Mul: if (__builtin_mul_overflow(a, b, &r)) return fail("int64 overflow"); break;
      case FloorDiv:
      case Mod: {
        if (b == 0) return fail("division by zero");
        if (a == INT64_MIN && b == -1) return fail("int64 overflow");
        int64_t q = a / b, m = a % b;
        if (m != 0 && ((m < 0) != (b < 0))) {  // Python's floor semantics
          q -= 1;
          m += b;
        }
        r = op == FloorDiv ? q : m;
        break;
      }
      case Min: r = std::min(a, b); break;
      case Max: r = std::max(a, b); break;
      default: return fail("unknown opcode");
    }
    a = r;
  }
  if (n != 1) return fail("malformed");
  return stack[0];
}

std::string SymExpr::to_string(std::span<const SymbolDef> symbols) const {
  // Each stack entry: text and whether it is a compound (needs parentheses as an operand).
  std::vector<std::pair<std::string, bool>> st;
  for (size_t i = 0; i < code_.size(); ++i) {
    const int64_t op = code_[i];
    if (op == Const || op == Sym) {
      if (i + 1 >= code_.size()) return "<malformed>";
      const int64_t v = code_[++i];
      if (op == Const) {
        st.emplace_back(std::to_string(v), v < 0);
      } else {
        st.emplace_back(v >= 0 && static_cast<uint64_t>(v) < symbols.size() ? symbols[static_cast<size_t>(v)].name
                                                                             : "s" + std::to_string(v),
                        false);
      }
      continue;
    }
    if (st.size() < 2) return "<malformed>";
    auto b = st.back();
    st.pop_back();
    auto a = st.back();
    st.pop_back();
    if (const char* s = infix(op)) {
      auto wrap = [](const std::pair<std::string, bool>& x) { return x.second ? "(" + x.first + ")" : x.first; };
      st.emplace_back(wrap(a) + s + wrap(b), true);
    } else {
      st.emplace_back(std::string(op == Min ? "min(" : "max(") + a.first + ", " + b.first + ")", false);
    }
  }
  return st.size() == 1 ? st[0].first : "<malformed>";
}

std::vector<std::vector<int64_t>> check_bindings(std::span<const SymbolDef> symbols) {
  std::vector<std::vector<int64_t>> out;
  const size_t n = symbols.size();
  const size_t varied = std::min<size_t>(n, 6);
  for (uint64_t mask = 0; mask < (uint64_t{1} << varied); ++mask) {
    std::vector<int64_t> b(n);
    for (size_t i = 0; i < n; ++i) b[i] = i < varied && !(mask >> i & 1) ? symbols[i].min : symbols[i].max;
    out.push_back(std::move(b));
  }
  std::vector<int64_t> mid(n), low(n);
  for (size_t i = 0; i < n; ++i) {
    mid[i] = symbols[i].min + (symbols[i].max - symbols[i].min) / 2;
    low[i] = std::min(symbols[i].max, symbols[i].min + 1);
  }
  out.push_back(std::move(mid));
  out.push_back(std::move(low));
  return out;
}

Error set_int_attribute(Attributes& attrs, const std::string& name, int64_t index, int64_t value) {
  const AttrValue* v = attrs.find(name);
  if (v == nullptr) return Error(ErrorCode::InvalidArgument, "symbolic attribute '" + name + "' is not an attribute of the op");
  if (index < 0) {
    if (std::holds_alternative<double>(*v)) {  // a Scalar argument (aten.arange's end): the int as a float
      attrs.set(name, static_cast<double>(value));
      return {};
    }
    if (!std::holds_alternative<int64_t>(*v)) {
      return Error(ErrorCode::InvalidArgument, "symbolic attribute '" + name + "' is not an int");
    }
    attrs.set(name, value);
    return {};
  }
  if (!std::holds_alternative<std::vector<int64_t>>(*v) ||
      static_cast<uint64_t>(index) >= std::get<std::vector<int64_t>>(*v).size()) {
    return Error(ErrorCode::InvalidArgument, "symbolic attribute '" + name + "[" + std::to_string(index) +
                                                 "]' is not an element of an int list");
  }
  std::vector<int64_t> list = std::get<std::vector<int64_t>>(*v);
  list[static_cast<size_t>(index)] = value;
  attrs.set(name, std::move(list));
  return {};
}

Error eval_sizes(const std::vector<SymExpr>& sym, std::span<const int64_t> symbols, std::vector<int64_t>* sizes) {
  if (sym.empty()) return {};
  sizes->resize(sym.size());
  for (size_t d = 0; d < sym.size(); ++d) {
    auto v = sym[d].eval(symbols);
    if (!v.ok()) return v.error();
    if (v.value() < 0) return Error(ErrorCode::InvalidArgument, "size expression gives the negative size " + std::to_string(v.value()));
    (*sizes)[d] = v.value();
  }
  return {};
}

}  // namespace kiln
