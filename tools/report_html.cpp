// `kiln report`: the HTML page (see report_html.h). Static HTML with inline CSS only: bars are CSS
// widths, the per-instruction strip is one coloured cell per instruction.
#include "report_html.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include "kiln/format.h"

namespace kiln::tools {
namespace {

// ---- a small JSON reader for the "kiln.delegation" metadata (untrusted: bounded depth, no throws) ----

struct Json {
  enum Kind { Null, Bool, Number, String, Array, Object } kind = Null;
  double number = 0.0;
  bool boolean = false;
  std::string str;
  std::vector<Json> items;                               // Array
  std::vector<std::pair<std::string, Json>> members;     // Object

  const Json* get(const std::string& key) const {
    if (kind != Object) return nullptr;
    for (const auto& [k, v] : members) {
      if (k == key) return &v;
    }
    return nullptr;
  }
  std::string get_str(const std::string& key) const {
    const Json* v = get(key);
    return v != nullptr && v->kind == String ? v->str : std::string();
  }
  double get_num(const std::string& key) const {
    const Json* v = get(key);
    return v != nullptr && v->kind == Number ? v->number : 0.0;
  }
  const std::vector<Json>& get_array(const std::string& key) const {
    static const std::vector<Json> empty;
    const Json* v = get(key);
    return v != nullptr && v->kind == Array ? v->items : empty;
  }
};

class JsonParser {
 public:
  explicit JsonParser(const std::string& s) : s_(s) {}
  bool parse(Json& out) {
    if (!value(out, 0)) return false;
    ws();
    return i_ == s_.size();
  }

 private:
  const std::string& s_;
  size_t i_ = 0;
  void ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\r' || s_[i_] == '\t')) ++i_;
  }
  bool lit(const char* w) {
    const std::string t(w);
    if (s_.compare(i_, t.size(), t) != 0) return false;
    i_ += t.size();
    return true;
  }
  bool string(std::string& out) {
    if (i_ >= s_.size() || s_[i_] != '"') return false;
    ++i_;
    while (i_ < s_.size() && s_[i_] != '"') {
      char c = s_[i_++];
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i_ >= s_.size()) return false;
      c = s_[i_++];
      switch (c) {
        case '"': case '\\': case '/': out += c; break;
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'u': {
          if (i_ + 4 > s_.size()) return false;
          unsigned v = 0;
          for (int k = 0; k < 4; ++k) {
            const char h = s_[i_++];
            v <<= 4;
            if (h >= '0' && h <= '9') v |= static_cast<unsigned>(h - '0');
            else if (h >= 'a' && h <= 'f') v |= static_cast<unsigned>(h - 'a' + 10);
            else if (h >= 'A' && h <= 'F') v |= static_cast<unsigned>(h - 'A' + 10);
            else return false;
          }
          if (v < 0x80) {
            out += static_cast<char>(v);
          } else if (v < 0x800) {
            out += static_cast<char>(0xC0 | (v >> 6));
            out += static_cast<char>(0x80 | (v & 0x3F));
          } else {  // surrogates are kept as their (invalid) bytes; printable() escapes them later
            out += static_cast<char>(0xE0 | (v >> 12));
            out += static_cast<char>(0x80 | ((v >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (v & 0x3F));
          }
          break;
        }
        default: return false;
      }
    }
    if (i_ >= s_.size()) return false;
    ++i_;
    return true;
  }
  bool value(Json& out, int depth) {
    if (depth > 16) return false;
    ws();
    if (i_ >= s_.size()) return false;
    const char c = s_[i_];
    if (c == '{') {
      out.kind = Json::Object;
      ++i_;
      ws();
      if (i_ < s_.size() && s_[i_] == '}') return ++i_, true;
      while (true) {
        ws();
        std::string key;
        if (!string(key)) return false;
        ws();
        if (i_ >= s_.size() || s_[i_] != ':') return false;
        ++i_;
        Json v;
        if (!value(v, depth + 1)) return false;
        out.members.emplace_back(std::move(key), std::move(v));
        ws();
        if (i_ < s_.size() && s_[i_] == ',') { ++i_; continue; }
        if (i_ < s_.size() && s_[i_] == '}') return ++i_, true;
        return false;
      }
    }
    if (c == '[') {
      out.kind = Json::Array;
      ++i_;
      ws();
      if (i_ < s_.size() && s_[i_] == ']') return ++i_, true;
      while (true) {
        Json v;
        if (!value(v, depth + 1)) return false;
        out.items.push_back(std::move(v));
        ws();
        if (i_ < s_.size() && s_[i_] == ',') { ++i_; continue; }
        if (i_ < s_.size() && s_[i_] == ']') return ++i_, true;
        return false;
      }
    }
    if (c == '"') {
      out.kind = Json::String;
      return string(out.str);
    }
    if (lit("true")) { out.kind = Json::Bool; out.boolean = true; return true; }
    if (lit("false")) { out.kind = Json::Bool; return true; }
    if (lit("null")) return true;
    const size_t b = i_;
    while (i_ < s_.size() && std::string("+-0123456789.eE").find(s_[i_]) != std::string::npos) ++i_;
    if (i_ == b || i_ - b > 40) return false;
    out.kind = Json::Number;
    char* end = nullptr;
    const std::string num = s_.substr(b, i_ - b);
    out.number = std::strtod(num.c_str(), &end);
    return end == num.c_str() + num.size() && std::isfinite(out.number);
  }
};

// ---- formatting ----

std::string h(const std::string& s) { return html_escape(s); }

std::string bytes_text(uint64_t n) {
  char b[64];
  if (n >= (uint64_t{1} << 20)) {
    std::snprintf(b, sizeof(b), "%.2f MiB", static_cast<double>(n) / (1 << 20));
  } else if (n >= 1024) {
    std::snprintf(b, sizeof(b), "%.1f KiB", static_cast<double>(n) / 1024);
  } else {
    std::snprintf(b, sizeof(b), "%llu B", static_cast<unsigned long long>(n));
  }
  return b;
}

std::string fixed(double v, int digits) {
  char b[64];
  std::snprintf(b, sizeof(b), "%.*f", digits, v);
  return b;
}

std::string plural(size_t n, const char* one, const char* many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

/// A backend's colour (known ones fixed; others from a hash of the name).
std::string backend_color(const std::string& backend) {
  if (backend == "xnnpack") return "#2f6fdf";
  if (backend == "mlx") return "#e07b00";
  if (backend == "vulkan") return "#8a3fd1";
  unsigned hsh = 2166136261u;
  for (unsigned char c : backend) hsh = (hsh ^ c) * 16777619u;
  char b[32];
  std::snprintf(b, sizeof(b), "hsl(%u, 60%%, 45%%)", hsh % 360);
  return b;
}
const char* kCpuColor = "#7d8590";
const char* kPortableColor = "#c9a227";

std::string instruction_color(const InstructionInfo& ins) {
  if (ins.kernel == "delegate") return backend_color(ins.backend);
  return ins.kernel == "portable" ? kPortableColor : kCpuColor;
}

std::string value_text(const InstructionValue& v) {
  if (v.index < 0) return "<span class=dim>None</span>";
  std::string t = "<span class=ty>" + h(v.type.to_string()) + "</span>";
  if (v.constant) return t + " <span class=dim>const</span>";
  if (!v.state.empty()) return t + " <span class=dim>state " + h(v.state) + "</span>";
  if (v.arena_offset >= 0) {
    t += " <span class=off>@" + std::to_string(v.arena_offset) + " +" + std::to_string(v.type.nbytes()) + "</span>";
  }
  return t;
}

const char* kStyle = R"CSS(
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1f2328;background:#fff}
header{background:#1f2328;color:#fff;padding:14px 24px}
header h1{margin:0;font-size:20px}
header .sub{color:#c9d1d9;font-size:13px}
main{padding:8px 24px 40px}
section.method{border:1px solid #d0d7de;border-radius:8px;margin:18px 0;padding:4px 16px 12px}
h2{font-size:18px;margin:12px 0 6px}
h3{font-size:15px;margin:14px 0 6px}
table{border-collapse:collapse;margin:4px 0}
td,th{border-bottom:1px solid #eaeef2;padding:2px 8px;text-align:left;vertical-align:top}
th{background:#f6f8fa;font-weight:600}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
code,.ty,.off{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12px}
.off{color:#57606a}
.dim{color:#6e7781}
.badge{display:inline-block;color:#fff;border-radius:10px;padding:0 8px;margin:1px 4px 1px 0;font-size:12px}
.strip{display:flex;height:22px;border:1px solid #d0d7de;border-radius:4px;overflow:hidden;margin:6px 0}
.strip div{flex:1 1 0;min-width:1px}
.bar{height:12px;border-radius:2px;min-width:1px}
.barcell{width:320px}
.warn{background:#fff8c5;border:1px solid #d4a72c;border-radius:6px;padding:6px 10px;margin:6px 0}
.err{background:#ffebe9;border:1px solid #ff8182;border-radius:6px;padding:6px 10px;margin:6px 0}
.legend span{margin-right:14px}
.sw{display:inline-block;width:12px;height:12px;border-radius:2px;vertical-align:-1px;margin-right:4px}
details{margin:6px 0}
summary{cursor:pointer;font-weight:600}
)CSS";

struct Delegation {
  bool present = false;
  bool valid = false;
  Json root;
};

/// Whether `v` (when present) is a non-negative integer a uint64_t holds exactly.
bool count_ok(const Json* v) {
  return v == nullptr || (v->kind == Json::Number && v->number >= 0 && v->number <= 9007199254740992.0 &&
                          v->number == static_cast<double>(static_cast<uint64_t>(v->number)));
}

/// Whether `v` (when present) is an array whose items all pass `ok`.
template <typename F>
bool array_ok(const Json* v, F ok) {
  if (v == nullptr) return true;
  if (v->kind != Json::Array) return false;
  for (const Json& x : v->items) {
    if (!ok(x)) return false;
  }
  return true;
}

bool string_ok(const Json* v) { return v == nullptr || v->kind == Json::String; }

/// Whether one "methods" entry has the shape the serializer writes (delegation_json): every field
/// present of its type, counts non-negative integers, reasons [backend, reason] string pairs, and
/// `alternative` one of the method's alternatives (when the program has that method).
bool entry_ok(const Json& e, const std::vector<MethodMeta>& metas) {
  if (e.kind != Json::Object || e.get("name") == nullptr || e.get("name")->kind != Json::String) return false;
  if (!count_ok(e.get("alternative")) || !count_ok(e.get("nodes"))) return false;
  for (const MethodMeta& m : metas) {
    if (m.name == e.get_str("name") && e.get_num("alternative") >= static_cast<double>(std::max<size_t>(m.num_alternatives, 1))) return false;
  }
  auto is_string = [](const Json& x) { return x.kind == Json::String; };
  if (!array_ok(e.get("requested"), is_string)) return false;
  if (!array_ok(e.get("backends"), [](const Json& b) {
        return b.kind == Json::Object && string_ok(b.get("backend")) && count_ok(b.get("segments")) &&
               count_ok(b.get("nodes")) && count_ok(b.get("constant_bytes"));
      })) {
    return false;
  }
  return array_ok(e.get("cpu_ops"), [&](const Json& c) {
    return c.kind == Json::Object && string_ok(c.get("op")) && count_ok(c.get("count")) &&
           array_ok(c.get("reasons"), [](const Json& r) {
             return r.kind == Json::Array && r.items.size() == 2 && r.items[0].kind == Json::String &&
                    r.items[1].kind == Json::String;
           });
  });
}

/// The program's "kiln.delegation" record; `valid` only when all of it has the shape Kiln writes
/// (a crafted record is not shown in part).
Delegation read_delegation(const Program& p, const std::vector<MethodMeta>& metas) {
  Delegation d;
  const std::string* v = p.metadata_value("kiln.delegation");
  if (v == nullptr) return d;
  d.present = true;
  JsonParser parser(*v);
  d.valid = parser.parse(d.root) && d.root.kind == Json::Object && d.root.get("methods") != nullptr &&
            d.root.get("methods")->kind == Json::Array;
  if (d.valid) d.valid = array_ok(d.root.get("methods"), [&](const Json& e) { return entry_ok(e, metas); });
  return d;
}

void write_delegation(std::ostringstream& o, const Delegation& d, const MethodMeta& m) {
  o << "<h3>Delegation (recorded at compile time)</h3>\n";
  if (!d.present) {
    o << "<p class=warn>Which nodes each backend declined, and why: not recorded in this file (compiled before Kiln "
         "recorded the delegation in the program's metadata, key <code>kiln.delegation</code>). Recompile it to see "
         "the reasons.</p>\n";
    return;
  }
  if (!d.valid) {
    o << "<p class=err>The file's <code>kiln.delegation</code> metadata is not the JSON Kiln writes: not shown.</p>\n";
    return;
  }
  bool any = false;
  for (const Json& e : d.root.get_array("methods")) {
    if (e.get_str("name") != m.name) continue;
    any = true;
    const size_t alt = static_cast<size_t>(std::max(0.0, e.get_num("alternative")));
    std::string requested;
    for (const Json& b : e.get_array("requested")) {
      if (b.kind == Json::String) requested += (requested.empty() ? "" : ", ") + h(b.str);
    }
    o << "<div class=alt><p><b>Alternative " << alt + 1 << (alt == m.alternative && m.unavailable.empty() ? " (the one this machine runs)" : "")
      << "</b>: backends requested: " << (requested.empty() ? "none (Kiln's CPU kernels only)" : requested) << "; "
      << plural(static_cast<uint64_t>(e.get_num("nodes")), "node", "nodes") << " after passes.</p>\n";
    const auto& backends = e.get_array("backends");
    if (!backends.empty()) {
      o << "<table><tr><th>backend</th><th class=num>segments</th><th class=num>nodes taken</th><th class=num>constants</th></tr>\n";
      for (const Json& b : backends) {
        const std::string name = b.get_str("backend");
        const auto segs = static_cast<uint64_t>(b.get_num("segments"));
        o << "<tr><td><span class=badge style=\"background:" << backend_color(name) << "\">" << h(name) << "</span></td><td class=num>"
          << plural(segs, "segment", "segments") << "</td><td class=num>" << static_cast<uint64_t>(b.get_num("nodes"))
          << "</td><td class=num>" << bytes_text(static_cast<uint64_t>(b.get_num("constant_bytes"))) << "</td></tr>\n";
      }
      o << "</table>\n";
    }
    const auto& cpu = e.get_array("cpu_ops");
    if (!backends.empty() && cpu.empty()) o << "<p>Every node was delegated: none left on the CPU.</p>\n";
    if (!cpu.empty()) {
      o << "<p>Nodes left on the CPU, with each backend's reason:</p>\n<table><tr><th>op</th><th class=num>nodes</th><th>why not delegated</th></tr>\n";
      for (const Json& c : cpu) {
        o << "<tr><td><code>" << h(c.get_str("op")) << "</code></td><td class=num>" << static_cast<uint64_t>(c.get_num("count"))
          << "</td><td>";
        for (const Json& r : c.get_array("reasons")) {
          if (r.kind != Json::Array || r.items.size() != 2 || r.items[0].kind != Json::String || r.items[1].kind != Json::String) continue;
          o << "<div class=reason><span class=badge style=\"background:" << backend_color(r.items[0].str) << "\">"
            << h(r.items[0].str) << "</span>" << h(r.items[1].str) << "</div>";
        }
        o << "</td></tr>\n";
      }
      o << "</table>\n";
    }
    o << "</div>\n";
  }
  if (!any) o << "<p class=dim>No entry for this method in the file's delegation record.</p>\n";
}

void write_profile_chart(std::ostringstream& o, const ReportProfile& rp) {
  if (!rp.error.empty()) {
    o << "<h3>Profile</h3><p class=err>Not timed: " << h(rp.error) << "</p>\n";
    return;
  }
  const double r = std::max(1, rp.runs);
  double total = 0.0;
  for (const auto& p : rp.prof) total += p.total_ms;
  o << "<h3>Profile</h3>\n<p>" << rp.runs << " executions timed per instruction on " << plural(static_cast<size_t>(rp.threads), "thread", "threads")
    << ": " << fixed(rp.wall_ms_per_run, 3) << " ms per execution, of which " << fixed(total / r, 3)
    << " ms inside instructions. Milliseconds per execution by op (an instruction fused into the one before it counts there):</p>\n";
  std::map<std::string, std::pair<double, std::string>> by_op;  // op -> (ms, colour)
  for (const auto& p : rp.prof) {
    auto& e = by_op[p.op];
    e.first += p.total_ms / r;
    e.second = p.kernel == "delegate" ? backend_color(p.op.substr(p.op.find(':') + 1)) : p.kernel == "portable" ? kPortableColor : kCpuColor;
  }
  std::vector<std::pair<std::string, std::pair<double, std::string>>> rows(by_op.begin(), by_op.end());
  std::stable_sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  const double top = rows.empty() ? 1.0 : std::max(rows.front().second.first, 1e-9);
  o << "<table class=chart><tr><th>op</th><th class=num>ms</th><th class=num>%</th><th></th></tr>\n";
  for (const auto& [op, v] : rows) {
    o << "<tr><td><code>" << h(op) << "</code></td><td class=num>" << fixed(v.first, 4) << "</td><td class=num>"
      << fixed(total > 0 ? 100.0 * v.first * r / total : 0.0, 1) << "</td><td class=barcell><div class=bar style=\"width:"
      << fixed(100.0 * v.first / top, 2) << "%;background:" << v.second << "\"></div></td></tr>\n";
  }
  o << "</table>\n";
}

/// What one alternative's instructions add up to.
struct Tally {
  std::map<std::string, size_t> segments;  ///< delegate segments per backend
  size_t cpu = 0, portable = 0;
  size_t constants = 0;
  uint64_t constant_bytes = 0, delegate_constants = 0, delegate_constant_bytes = 0;
};

Tally tally(const std::vector<InstructionInfo>& list) {
  Tally t;
  std::set<int32_t> consts;
  for (const InstructionInfo& i : list) {
    if (i.kernel == "delegate") {
      ++t.segments[i.backend];
      t.delegate_constants += i.delegate_constants;
      t.delegate_constant_bytes += i.delegate_constant_bytes;
    } else if (i.kernel == "portable") {
      ++t.portable;
    } else {
      ++t.cpu;
    }
    for (const InstructionValue& v : i.inputs) {
      if (v.constant && consts.insert(v.index).second) t.constant_bytes += v.type.nbytes();
    }
  }
  t.constants = consts.size();
  return t;
}

/// "N instructions: a optimized cpu kernel calls, b portable, c delegate calls. Delegate segments: ..."
void write_tally(std::ostringstream& o, const std::vector<InstructionInfo>& list, const Tally& t) {
  size_t delegates = 0;
  for (const auto& [b, n] : t.segments) delegates += n;
  o << "<p class=tally>" << plural(list.size(), "instruction", "instructions") << ": " << plural(t.cpu, "optimized cpu kernel call", "optimized cpu kernel calls") << ", "
    << plural(t.portable, "portable kernel call", "portable kernel calls") << ", " << plural(delegates, "delegate call", "delegate calls") << ". Delegate segments: ";
  if (t.segments.empty()) o << "none";
  for (const auto& [b, n] : t.segments) {
    o << "<span class=badge style=\"background:" << backend_color(b) << "\">" << h(b) << ": " << plural(n, "segment", "segments")
      << "</span>";
  }
  o << "</p>\n";
}

/// The strip (one cell per instruction, coloured by where it runs) and the instruction table,
/// with the profile's time per instruction when `rp` holds one.
void write_instructions(std::ostringstream& o, const std::vector<InstructionInfo>& list, const Tally& t, const ReportProfile* rp) {
  const bool timed = rp != nullptr && rp->error.empty();
  std::map<size_t, const InstructionProfile*> prof_of;
  double top = 0.0, runs = 1.0;
  if (timed) {
    runs = std::max(1, rp->runs);
    for (const auto& pr : rp->prof) {
      prof_of[pr.index] = &pr;
      top = std::max(top, pr.total_ms / runs);
    }
  }
  o << "<div class=legend><span><span class=sw style=\"background:" << kCpuColor
    << "\"></span>cpu kernel</span><span><span class=sw style=\"background:" << kPortableColor << "\"></span>portable kernel</span>";
  for (const auto& [b, n] : t.segments) {
    o << "<span><span class=sw style=\"background:" << backend_color(b) << "\"></span>" << h(b) << " segment</span>";
  }
  o << "</div>\n<div class=strip>";
  for (const InstructionInfo& i : list) {
    o << "<div style=\"background:" << instruction_color(i) << "\" title=\"" << i.index << " " << h(i.op) << "\"></div>";
  }
  o << "</div>\n";
  o << "<table class=instructions><tr><th class=num>#</th><th>op / delegate call</th><th>kernel</th><th>inputs</th><th>outputs "
       "(arena @offset +bytes)</th>"
    << (timed ? "<th class=num>ms</th><th></th>" : "") << "</tr>\n";
  for (const InstructionInfo& i : list) {
    o << "<tr><td class=num>" << i.index << "</td><td>";
    if (i.kernel == "delegate") {
      o << "<span class=badge style=\"background:" << backend_color(i.backend) << "\">" << h(i.backend) << "</span>delegate call"
        << " <span class=dim>payload " << bytes_text(i.payload_bytes) << ", " << plural(i.delegate_constants, "constant", "constants")
        << " " << bytes_text(i.delegate_constant_bytes) << "</span>";
    } else {
      o << "<code>" << h(i.op) << "</code>";
    }
    if (!i.debug_name.empty()) o << "<br><span class=dim>" << h(i.debug_name) << "</span>";
    o << "</td><td><span class=sw style=\"background:" << instruction_color(i) << "\"></span>" << h(i.kernel) << "</td><td>";
    for (size_t k = 0; k < i.inputs.size(); ++k) o << (k ? "<br>" : "") << value_text(i.inputs[k]);
    o << "</td><td>";
    for (size_t k = 0; k < i.outputs.size(); ++k) o << (k ? "<br>" : "") << value_text(i.outputs[k]);
    o << "</td>";
    if (timed) {
      auto it = prof_of.find(i.index);
      if (it == prof_of.end()) {
        o << "<td class=\"num dim\">fused</td><td></td>";
      } else {
        const double msr = it->second->total_ms / runs;
        o << "<td class=num>" << fixed(msr, 4) << "</td><td class=barcell><div class=bar style=\"width:"
          << fixed(top > 0 ? 100.0 * msr / top : 0.0, 2) << "%;background:" << instruction_color(i) << "\"></div></td>";
      }
    }
    o << "</tr>\n";
  }
  o << "</table>\n";
}

void write_method(std::ostringstream& o, const Program& p, const MethodMeta& m, const Delegation& d, const ReportProfile* rp,
                  size_t ordinal) {
  o << "<section class=method id=\"method-" << ordinal << "\">\n<h2>Method <code>" << h(m.name) << "</code></h2>\n";
  auto ins = p.method_instructions(m.name);
  if (!ins.ok()) {
    o << "<p class=err>" << h(ins.error().to_string()) << "</p></section>\n";
    return;
  }
  const std::vector<InstructionInfo>& list = ins.value();
  const Tally t = tally(list);
  write_tally(o, list, t);
  o << "<p>Arena " << bytes_text(m.arena_bytes) << " (" << m.arena_bytes << " bytes).</p>\n";
  const bool runs_here = m.unavailable.empty();  // else no alternative runs on this machine
  if (m.num_alternatives > 1) {
    if (runs_here) {
      o << "<p>Alternative " << m.alternative + 1 << " of " << m.num_alternatives
        << " runs here (the first whose backends are available on this machine); the instructions below are its own, the "
           "other alternatives' follow them.";
    } else {
      o << "<p>None of the " << m.num_alternatives << " alternatives runs here; alternative " << m.alternative + 1
        << "'s instructions are below, the other alternatives' follow them.";
    }
    for (size_t a = 0; a < m.skipped_alternatives.size(); ++a) {
      o << "<br>Alternative " << a + 1 << " skipped: " << h(m.skipped_alternatives[a]);
    }
    o << "</p>\n";
  }
  if (!m.unavailable.empty()) o << "<p class=err>Not runnable on this machine: " << h(m.unavailable) << "</p>\n";

  // Inputs / outputs.
  o << "<h3>Inputs and outputs</h3>\n<table><tr><th></th><th>name</th><th>type</th></tr>\n";
  auto io = [&](const char* kind, const std::vector<std::string>& names, const std::vector<TensorType>& types,
                const std::vector<std::vector<std::string>>& dims) {
    for (size_t i = 0; i < types.size(); ++i) {
      std::string name = i < names.size() ? names[i] : std::string();
      if (name.empty()) name.append("#").append(std::to_string(i));
      o << "<tr><td>" << kind << "</td><td><code>" << h(name) << "</code></td><td class=ty>"
        << h(type_to_string(types[i], i < dims.size() ? dims[i] : std::vector<std::string>{})) << "</td></tr>\n";
    }
  };
  io("input", m.input_names, m.inputs, m.input_dims);
  io("output", m.output_names, m.outputs, m.output_dims);
  o << "</table>\n";
  if (!m.states.empty()) {
    o << "<p>States: ";
    for (size_t i = 0; i < m.states.size(); ++i) {
      o << (i ? ", " : "") << "<code>" << h(m.states[i]) << "</code>";
      if (i < m.state_holders.size() && !m.state_holders[i].empty()) o << " (held by " << h(m.state_holders[i]) << ")";
    }
    o << "</p>\n";
  }

  // Constants.
  o << "<h3>Constants</h3>\n<p>Kernel calls read " << plural(t.constants, "constant", "constants") << " (" << bytes_text(t.constant_bytes)
    << "); delegate payloads refer to " << plural(t.delegate_constants, "constant", "constants") << " ("
    << bytes_text(t.delegate_constant_bytes) << ").";
  if (!m.constant_bytes_by_scheme.empty()) {
    o << " By scheme: ";
    for (size_t i = 0; i < m.constant_bytes_by_scheme.size(); ++i) {
      o << (i ? ", " : "") << h(m.constant_bytes_by_scheme[i].first) << " " << bytes_text(m.constant_bytes_by_scheme[i].second);
    }
    o << ".";
  }
  o << "</p>\n";

  write_delegation(o, d, m);
  if (rp != nullptr) write_profile_chart(o, *rp);

  o << "<h3>Instructions in execution order" << (m.num_alternatives > 1 ? " (alternative " + std::to_string(m.alternative + 1) + (runs_here ? ", runs here)" : ")") : "")
    << "</h3>\n";
  write_instructions(o, list, t, rp);
  for (size_t a = 0; a < m.num_alternatives; ++a) {
    if (a == m.alternative) continue;
    auto other = p.method_instructions(m.name, a);
    o << "<h3>Instructions of alternative " << a + 1 << " (not run here)</h3>\n";
    if (!other.ok()) {
      o << "<p class=err>" << h(other.error().to_string()) << "</p>\n";
      continue;
    }
    const Tally ot = tally(other.value());
    write_tally(o, other.value(), ot);
    write_instructions(o, other.value(), ot, nullptr);
  }
  o << "</section>\n";
}

}  // namespace

std::string html_escape(const std::string& text) {
  const std::string s = printable(text);
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string report_html(const Program& p, const std::string& file_label, const std::vector<ReportProfile>& profiles) {
  std::ostringstream o;
  std::vector<MethodMeta> metas;
  for (const std::string& name : p.method_names()) {
    auto meta = p.method_meta(name);
    if (meta.ok()) metas.push_back(std::move(meta.value()));
  }
  const Delegation d = read_delegation(p, metas);
  o << "<!DOCTYPE html>\n<html lang=en>\n<head>\n<meta charset=\"utf-8\">\n"
    << "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; img-src data:\">\n"
    << "<title>kiln report: " << h(file_label) << "</title>\n<style>" << kStyle << "</style>\n</head>\n<body>\n"
    << "<header><h1>kiln report: " << h(file_label) << "</h1><div class=sub>format version " << p.format_version() << ", "
    << bytes_text(p.file_size()) << ", constants " << bytes_text(p.constant_bytes()) << " (stored once), "
    << plural(metas.size(), "method", "methods") << "</div></header>\n<main>\n";
  o << "<p>Each method as the runtime runs it: its instructions in order with their ops, kernels, argument types and arena "
       "offsets, delegate segments coloured by backend, and (from the compiler's record) the nodes left on the CPU with "
       "each backend's reason.</p>\n";
  if (metas.size() > 1) {
    o << "<p>Methods: ";
    for (size_t i = 0; i < metas.size(); ++i) {
      o << (i ? ", " : "") << "<a href=\"#method-" << i << "\"><code>" << h(metas[i].name) << "</code></a>";
    }
    o << "</p>\n";
  }
  if (!p.metadata().empty()) {
    o << "<details><summary>Metadata (" << plural(p.metadata().size(), "key", "keys") << ")</summary><table>";
    for (const auto& [k, v] : p.metadata()) {
      o << "<tr><td><code>" << h(k) << "</code></td><td><code>"
        << (k == "kiln.delegation" ? std::string("(").append(std::to_string(v.size())).append(" bytes of JSON: shown per method)") : h(v))
        << "</code></td></tr>";
    }
    o << "</table></details>\n";
  }
  if (!p.states().empty()) {
    o << "<p>States: ";
    for (size_t i = 0; i < p.states().size(); ++i) {
      const StateInfo& st = p.states()[i];
      o << (i ? ", " : "") << "<code>" << h(st.name) << "</code> <span class=ty>" << h(st.type.to_string()) << "</span>";
    }
    o << "</p>\n";
  }
  for (size_t i = 0; i < metas.size(); ++i) {
    const ReportProfile* rp = nullptr;
    for (const ReportProfile& r : profiles) {
      if (r.method == metas[i].name) rp = &r;
    }
    write_method(o, p, metas[i], d, rp, i);
  }
  o << "</main>\n</body>\n</html>\n";
  return o.str();
}

}  // namespace kiln::tools
