// Symbolic sizes: a method's inputs may declare dimensions as named symbols with ranges
// (`seq` in 1..512, from torch.export's Dim); every value's size is then an integer expression of
// the symbols (what torch.export's shape propagation produces: sums, products, floor division with
// constants). Memory is planned at the upper bound once; at execute the runtime binds the symbols
// from the actual inputs and evaluates every expression (docs/generative.md).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kiln/attributes.h"
#include "kiln/error.h"
#include "kiln/tensor.h"

namespace kiln {

/// A named symbol of a method with its inclusive range [min, max] (0 <= min <= max <= 2^40).
struct SymbolDef {
  std::string name;
  int64_t min = 1;
  int64_t max = 1;
};

/// Largest symbol bound a program may declare (keeps every product of a few sizes in int64).
inline constexpr int64_t kMaxSymbolValue = int64_t{1} << 40;
/// Longest expression (tokens) a program may hold.
inline constexpr size_t kMaxSymExprTokens = 256;

/// An integer expression over a method's symbols, stored as a postfix program: the token stream
/// `code` of opcodes (SymExpr::Op), CONST and SYM each followed by one operand (the constant, or the
/// symbol's index in the method's symbol list). Evaluation is exact int64 arithmetic with overflow
/// checks; FloorDiv and Mod follow Python's (and sympy's) floor semantics, as torch.export's
/// guards do.
class SymExpr {
 public:
  enum Op : int64_t { Const = 0, Sym = 1, Add = 2, Sub = 3, Mul = 4, FloorDiv = 5, Mod = 6, Min = 7, Max = 8 };

  SymExpr() : code_{Const, 0} {}
  static SymExpr constant(int64_t v) { return SymExpr({Const, v}); }
  static SymExpr symbol(int32_t index) { return SymExpr({Sym, index}); }
  /// An expression from its token stream (not checked; see validate()).
  static SymExpr from_code(std::vector<int64_t> code) { return SymExpr(std::move(code)); }

  SymExpr operator+(const SymExpr& o) const { return binary(o, Add); }
  SymExpr operator-(const SymExpr& o) const { return binary(o, Sub); }
  SymExpr operator*(const SymExpr& o) const { return binary(o, Mul); }
  SymExpr floordiv(const SymExpr& o) const { return binary(o, FloorDiv); }
  SymExpr mod(const SymExpr& o) const { return binary(o, Mod); }
  SymExpr min(const SymExpr& o) const { return binary(o, Min); }
  SymExpr max(const SymExpr& o) const { return binary(o, Max); }

  const std::vector<int64_t>& code() const { return code_; }
  bool is_constant() const { return code_.size() == 2 && code_[0] == Const; }
  /// Index of the symbol when the expression is exactly one symbol, else -1.
  int32_t as_symbol() const { return code_.size() == 2 && code_[0] == Sym ? static_cast<int32_t>(code_[1]) : -1; }
  bool operator==(const SymExpr& o) const { return code_ == o.code_; }

  /// InvalidProgram unless the stream is a well-formed expression of at most kMaxSymExprTokens
  /// tokens whose symbol indices are below num_symbols.
  Error validate(size_t num_symbols) const;
  /// The value for the symbol values `symbols` (indexed like the method's symbols).
  /// InvalidArgument on int64 overflow or division / modulo by zero.
  Result<int64_t> eval(std::span<const int64_t> symbols) const;
  /// Infix text with the symbols' names, e.g. "seq", "seq * 64", "(seq + 1) // 2".
  std::string to_string(std::span<const SymbolDef> symbols) const;

 private:
  explicit SymExpr(std::vector<int64_t> code) : code_(std::move(code)) {}
  SymExpr binary(const SymExpr& o, Op op) const;
  std::vector<int64_t> code_;
};

/// Symbol bindings at which a symbolic graph is checked: every corner of the box of the symbol
/// ranges (each symbol at its min or max; at most 2^6 corners, the first 6 symbols varied and the
/// rest at their max), then one binding with each symbol at its midpoint and one just above its
/// min. The upper-bound sizes of a value are the maximum over these bindings.
std::vector<std::vector<int64_t>> check_bindings(std::span<const SymbolDef> symbols);

/// Sets attribute `name` of `attrs` (an int, or a float Scalar taking the int's value, when
/// index < 0; else element `index` of an int list) to `value`. InvalidArgument when there is no such int attribute or element.
Error set_int_attribute(Attributes& attrs, const std::string& name, int64_t index, int64_t value);

/// The sizes of a value at the symbol values `symbols`: each expression evaluated (sym empty: the
/// fixed sizes). InvalidArgument when an expression fails or gives a negative size.
Error eval_sizes(const std::vector<SymExpr>& sym, std::span<const int64_t> symbols, std::vector<int64_t>* sizes);

}  // namespace kiln
