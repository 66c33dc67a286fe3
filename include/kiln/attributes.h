// Non-tensor op arguments (ATen schema names: stride, padding, alpha, eps, ...).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace kiln {

/// None, bool, int, float, string, int list, float list.
using AttrValue = std::variant<std::monostate, bool, int64_t, double, std::string,
                               std::vector<int64_t>, std::vector<double>>;

/// "None", "bool", "int", "float", "str", "int[]", "float[]".
const char* attr_kind_name(const AttrValue& v);
/// "[1, 2]", "0.5", "True", ... (for reports and error messages).
std::string attr_to_string(const AttrValue& v);

/// An ordered name -> value list. After an op's schema has normalized it
/// (see OpDef::normalize_attributes), every attribute of the schema is present with its
/// declared kind, so kernels read them without checks.
class Attributes {
 public:
  Attributes() = default;
  Attributes(std::initializer_list<std::pair<std::string, AttrValue>> items) : items_(items) {}

  void set(std::string name, AttrValue value);
  const AttrValue* find(std::string_view name) const;
  bool has(std::string_view name) const { return find(name) != nullptr; }
  bool is_none(std::string_view name) const;

  /// Typed getters. On a missing name or another kind they return `fallback`
  /// (normalized attributes never hit that path). get_float accepts ints too.
  bool get_bool(std::string_view name, bool fallback = false) const;
  int64_t get_int(std::string_view name, int64_t fallback = 0) const;
  double get_float(std::string_view name, double fallback = 0.0) const;
  std::string get_string(std::string_view name, std::string fallback = {}) const;
  std::vector<int64_t> get_ints(std::string_view name, std::vector<int64_t> fallback = {}) const;
  std::vector<double> get_floats(std::string_view name, std::vector<double> fallback = {}) const;

  const std::vector<std::pair<std::string, AttrValue>>& items() const { return items_; }
  size_t size() const { return items_.size(); }
  /// "stride=[2, 2], padding=[1, 1]".
  std::string to_string() const;

 private:
  std::vector<std::pair<std::string, AttrValue>> items_;
};

}  // namespace kiln
