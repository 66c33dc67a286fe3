// Text for messages: strings from a program file made safe to quote, and method input / output
// types with their symbolic dims.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "kiln/tensor.h"

namespace kiln {

/// Whether `text` is valid UTF-8 (no stray continuation bytes, truncated or overlong sequences,
/// surrogates, or code points past U+10FFFF).
bool is_valid_utf8(std::string_view text);

/// Whether `text` is a name a program file may hold (methods, values, symbols, states, ops,
/// attributes, backends, metadata keys): valid UTF-8 without ASCII control characters (< 0x20,
/// 0x7F). The loader refuses a file with any other name; the compiler refuses to write one.
bool is_printable_name(std::string_view text);

/// `text` made safe to quote in a message: every byte that is not part of a valid UTF-8 sequence,
/// and every ASCII control character, written as \xNN. Strings read from a program file go
/// through this before they reach an error message (a damaged file must not put raw bytes there).
std::string printable(std::string_view text);

/// `text` as a JSON string literal (RFC 8259), quotes included: '"' and '\\' escaped, \n \r \t in
/// their short forms, other control characters (< 0x20, 0x7F) as \u00XX, valid UTF-8 kept as it
/// is. Text that is not valid UTF-8 goes through printable() first (its bad bytes become the four
/// characters \xNN), so the result is always valid UTF-8 JSON. Used by every JSON writer in Kiln
/// (the compiler's delegation record, `kiln inspect --json`, `kiln bench --json` and --trace).
std::string json_quote(std::string_view text);

/// A method input's or output's type with its symbolic dims shown as their expression and upper
/// bound: "int64[1, seq <= 512]" (dims[d] is the expression text of dim d, "" for a fixed dim, as
/// in MethodMeta::input_dims; without dims the same as TensorType::to_string()).
std::string type_to_string(const TensorType& type, const std::vector<std::string>& dims);

}  // namespace kiln
