// The `kiln` command-line tool.
//
//   kiln inspect model.kiln [--json]       what is in a program file (methods, types, ops, memory)
//   kiln run model.kiln --input x.npy --output-dir out/    run a method on .npy inputs
//   kiln bench model.kiln --threads 2 --runs 100 [--json]   time a method (latency, load, RSS)
//   kiln report model.kiln [--profile] -o report.html   one HTML page: how each method runs
//   kiln generate llm.kiln --prompt-ids 1,2,3 --max-new-tokens 16 [--json]   token ids from a language model
//   kiln compile model.onnx --input-shape x=1x3x224x224 --backends xnnpack -o model.kiln
//                                          import an ONNX model and compile it (when built with the
//                                          ONNX importer: libonnx-dev, libprotobuf-dev)
//
// inspect, run, bench and --version name the SIMD target of the optimized cpu kernels (the best
// one this CPU supports, or KILN_CPU_TARGET's; include/kiln/cpu_target.h).
//
// The tool never parses program files itself: everything it shows comes from the runtime's
// verified loader (kiln::Program::load and MethodMeta). Errors go to stderr as
// "kiln <command>: <ErrorCode>: <message>"; exit status 0 on success, 1 when Kiln reports an
// error, 2 for a command-line usage error.
#include <CLI/CLI.hpp>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <optional>
#include <random>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <set>
#include <string>
#include <vector>

#include "kiln/cpu_target.h"
#include "kiln/format.h"
#include "kiln/llm.h"
#include "kiln/runtime.h"
#include "kiln/npy.h"
#include "report_html.h"
#ifdef KILN_HAVE_ONNX
#include <fstream>

#include "kiln/compiler.h"
#include "kiln/onnx.h"
#endif

#ifndef KILN_VERSION
#define KILN_VERSION "unknown"
#endif

namespace {

using namespace kiln;

constexpr int kExitError = 1;
constexpr int kExitUsage = 2;

int fail(const std::string& command, const Error& e) {
  std::cerr << "kiln " << command << ": " << e.to_string() << "\n";
  return kExitError;
}

std::string display_name(const std::vector<std::string>& names, size_t i) {
  if (i < names.size() && !names[i].empty()) return names[i];
  return "#" + std::to_string(i);
}

// ---- JSON output (a tiny writer: strings quoted by json_quote, kiln/format.h) ----

std::string json_strings(const std::vector<std::string>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + json_quote(v[i]);
  return out + "]";
}

// ---- the cpu kernel target (include/kiln/cpu_target.h) ----

/// The value of KILN_CPU_TARGET, or "" when it is unset or empty.
std::string cpu_target_env() {
  const char* env = std::getenv("KILN_CPU_TARGET");
  return env != nullptr ? std::string(env) : std::string();
}

/// One line for the text outputs: "avx3_dl (available: avx3_dl, avx3, avx2, scalar)", plus
/// "; set by KILN_CPU_TARGET" when the environment chose it; "none: <why>" when KILN_CPU_TARGET is
/// refused (no program loads then, so only `kiln --version` gets to print that).
std::string cpu_target_summary() {
  if (Error st = cpu_target_status(); !st.ok()) return "none: " + st.message() + "; no program loads with it";
  std::string available;
  for (const std::string& t : available_cpu_targets()) available += (available.empty() ? "" : ", ") + t;
  return cpu_target() + " (available: " + available + (cpu_target_env().empty() ? ")" : "; set by KILN_CPU_TARGET)");
}

/// The JSON members (no braces) for the same: "cpu_target": name, "cpu_targets_available": [...],
/// "cpu_target_env": KILN_CPU_TARGET's value or null.
std::string cpu_target_json_members() {
  const std::string env = cpu_target_env();
  return "\"cpu_target\": " + json_quote(cpu_target()) + ", \"cpu_targets_available\": " +
         json_strings(available_cpu_targets()) + ", \"cpu_target_env\": " + (env.empty() ? std::string("null") : json_quote(env));
}

std::string json_sizes(const std::vector<int64_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "]";
}

/// Per tensor, per dim: the dim's symbolic expression, or null for a fixed dim.
std::string json_dims(const std::vector<std::vector<std::string>>& dims) {
  std::string out = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    out += i ? ", [" : "[";
    for (size_t d = 0; d < dims[i].size(); ++d) out += (d ? ", " : "") + (dims[i][d].empty() ? "null" : json_quote(dims[i][d]));
    out += "]";
  }
  return out + "]";
}

std::string json_symbols(const std::vector<SymbolDef>& symbols) {
  std::string out = "[";
  for (size_t i = 0; i < symbols.size(); ++i) {
    out += (i ? ", " : "") + std::string("{\"name\": ") + json_quote(symbols[i].name) + ", \"min\": " +
           std::to_string(symbols[i].min) + ", \"max\": " + std::to_string(symbols[i].max) + "}";
  }
  return out + "]";
}

std::string json_tensors(const std::vector<std::string>& names, const std::vector<TensorType>& types) {
  std::string out = "[";
  for (size_t i = 0; i < types.size(); ++i) {
    if (i) out += ", ";
    out += "{\"name\": " + json_quote(i < names.size() ? names[i] : std::string()) + ", \"dtype\": " +
           json_quote(dtype_name(types[i].dtype)) + ", \"sizes\": [";
    for (size_t d = 0; d < types[i].sizes.size(); ++d) out += (d ? ", " : "") + std::to_string(types[i].sizes[d]);
    out += "]}";
  }
  return out + "]";
}

/// {"name": count, ...} in the given order.
template <typename N>
std::string json_counts(const std::vector<std::pair<std::string, N>>& counts) {
  std::string out = "{";
  for (size_t i = 0; i < counts.size(); ++i) {
    out += (i ? ", " : "") + json_quote(counts[i].first) + ": " + std::to_string(counts[i].second);
  }
  return out + "}";
}

/// "xnnpack: 1 segment, mlx: 2 segments", or "none".
std::string delegate_summary(const MethodMeta& m) {
  std::string out;
  for (const auto& [backend, n] : m.delegate_counts) {
    out += (out.empty() ? "" : ", ") + backend + ": " + std::to_string(n) + (n == 1 ? " segment" : " segments");
  }
  return out.empty() ? "none" : out;
}

/// Writes `text` to `path` (created or truncated); InvalidArgument naming the path when it cannot.
Error write_text(const std::string& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return Error(ErrorCode::InvalidArgument, "cannot write '" + path + "': " + std::strerror(errno));
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const bool closed = std::fclose(f) == 0;
  if (!ok || !closed) return Error(ErrorCode::InvalidArgument, "cannot write '" + path + "': " + std::strerror(errno));
  return Error();
}

// ---- kiln inspect ----

struct InspectArgs {
  std::string file;
  bool json = false;
};

// The CLI loads any verified file: a missing or unavailable delegate backend is reported per
// method (inspect) or when that method is instantiated (run, bench), not for the whole file.
LoadOptions cli_load_options() {
  LoadOptions o;
  o.defer_backend_errors = true;
  return o;
}

int cmd_inspect(const InspectArgs& a) {
  auto program = Program::load(a.file, cli_load_options());
  if (!program.ok()) return fail("inspect", program.error());
  const Program& p = *program.value();
  std::vector<MethodMeta> metas;
  for (const std::string& name : p.method_names()) {
    auto meta = p.method_meta(name);
    if (!meta.ok()) return fail("inspect", meta.error());
    metas.push_back(std::move(meta.value()));
  }

  std::ostringstream o;
  if (a.json) {
    o << "{\n  \"file\": " << json_quote(a.file) << ",\n  \"format_version\": " << p.format_version()
      << ",\n  \"file_size\": " << p.file_size() << ",\n  \"constant_bytes\": " << p.constant_bytes()
      << ",\n  " << cpu_target_json_members() << ",\n  \"cpu_targets_compiled\": " << json_strings(compiled_cpu_targets())
      << ",\n  \"metadata\": {";
    for (size_t i = 0; i < p.metadata().size(); ++i) {
      o << (i ? ", " : "") << json_quote(p.metadata()[i].first) << ": " << json_quote(p.metadata()[i].second);
    }
    o << "},\n  \"states\": [";
    for (size_t i = 0; i < p.states().size(); ++i) {
      const StateInfo& st = p.states()[i];
      o << (i ? ", " : "") << "{\"name\": " << json_quote(st.name) << ", \"dtype\": " << json_quote(dtype_name(st.type.dtype))
        << ", \"sizes\": " << json_sizes(st.type.sizes) << ", \"bytes\": " << st.type.nbytes()
        << ", \"initial\": " << json_quote(st.zero_initial ? "zeros" : "constant") << "}";
    }
    o << "],\n  \"methods\": [";
    for (size_t k = 0; k < metas.size(); ++k) {
      const MethodMeta& m = metas[k];
      o << (k ? "," : "") << "\n    {\n      \"name\": " << json_quote(m.name)
        << ",\n      \"inputs\": " << json_tensors(m.input_names, m.inputs)
        << ",\n      \"outputs\": " << json_tensors(m.output_names, m.outputs)
        << ",\n      \"symbols\": " << json_symbols(m.symbols)
        << ",\n      \"input_dims\": " << json_dims(m.input_dims)
        << ",\n      \"output_dims\": " << json_dims(m.output_dims)
        << ",\n      \"states\": " << json_strings(m.states)
        << ",\n      \"state_holders\": " << json_strings(m.state_holders)
        << ",\n      \"num_instructions\": " << m.num_instructions
        << ",\n      \"num_kernel_calls\": " << m.num_kernel_calls
        << ",\n      \"num_delegate_calls\": " << m.num_delegate_calls
        << ",\n      \"num_cpu_kernel_calls\": " << m.num_cpu_kernel_calls
        << ",\n      \"num_portable_kernel_calls\": " << m.num_kernel_calls - m.num_cpu_kernel_calls
        << ",\n      \"arena_bytes\": " << m.arena_bytes << ",\n      \"op_counts\": " << json_counts(m.op_counts)
        << ",\n      \"cpu_op_counts\": " << json_counts(m.cpu_op_counts)
        << ",\n      \"delegate_segments\": " << json_counts(m.delegate_counts)
        << ",\n      \"constant_bytes_by_dtype\": " << json_counts(m.constant_bytes_by_dtype)
        << ",\n      \"constant_bytes_by_scheme\": " << json_counts(m.constant_bytes_by_scheme)
        << ",\n      \"alternative\": " << m.alternative << ",\n      \"num_alternatives\": " << m.num_alternatives
        << ",\n      \"unavailable\": " << (m.unavailable.empty() ? std::string("null") : json_quote(m.unavailable)) << "\n    }";
    }
    o << "\n  ]\n}\n";
    std::cout << o.str();
    return 0;
  }

  o << "file            " << a.file << "\n"
    << "format version  " << p.format_version() << "\n"
    << "file size       " << p.file_size() << " bytes\n"
    << "constant bytes  " << p.constant_bytes() << " bytes (stored once, shared by all methods)\n"
    << "methods         " << metas.size() << "\n"
    << "cpu target      " << cpu_target_summary() << "\n";
  if (!p.states().empty()) {
    uint64_t total = 0;
    for (const StateInfo& st : p.states()) total += st.type.nbytes();
    o << "states          " << p.states().size() << " (" << total << " bytes per session)\n";
    for (const StateInfo& st : p.states()) {
      o << "    " << st.name << "  " << st.type.to_string() << "  initial " << (st.zero_initial ? "zeros" : "constant") << "\n";
    }
  }
  if (!p.metadata().empty()) {
    o << "metadata\n";
    // values may hold control characters (terminal escapes): shown escaped, as \xNN
    for (const auto& [k, v] : p.metadata()) {
      if (k == "kiln.delegation") {  // the compiler's delegation record: long JSON, shown by `kiln report`
        o << "    " << k << " = (" << v.size() << " bytes of JSON: which nodes each backend took and why; `kiln report` shows it)\n";
        continue;
      }
      o << "    " << k << " = " << printable(v) << "\n";
    }
  }
  for (const MethodMeta& m : metas) {
    size_t name_width = 0;
    for (size_t i = 0; i < m.inputs.size(); ++i) name_width = std::max(name_width, display_name(m.input_names, i).size());
    for (size_t i = 0; i < m.outputs.size(); ++i) name_width = std::max(name_width, display_name(m.output_names, i).size());
    auto row = [&](const std::string& name, const TensorType& t, const std::vector<std::string>& dims) {
      o << "    " << name << std::string(name_width - name.size() + 2, ' ') << type_to_string(t, dims) << "\n";
    };
    auto dims_of = [](const std::vector<std::vector<std::string>>& d, size_t i) {
      return i < d.size() ? d[i] : std::vector<std::string>{};
    };
    o << "\nmethod '" << m.name << "'\n";
    if (!m.symbols.empty()) {
      o << "  symbols        ";
      for (size_t i = 0; i < m.symbols.size(); ++i) {
        o << (i ? ", " : " ") << m.symbols[i].name << " in [" << m.symbols[i].min << ", " << m.symbols[i].max << "]";
      }
      o << " (memory planned at the upper bounds)\n";
    }
    if (!m.states.empty()) {
      o << "  states         ";
      for (size_t i = 0; i < m.states.size(); ++i) {
        o << (i ? ", " : " ") << m.states[i];
        if (i < m.state_holders.size() && !m.state_holders[i].empty()) o << " (held by " << m.state_holders[i] << ")";
      }
      o << "\n";
    }
    o << "  inputs\n";
    if (m.inputs.empty()) o << "    (none)\n";
    for (size_t i = 0; i < m.inputs.size(); ++i) row(display_name(m.input_names, i), m.inputs[i], dims_of(m.input_dims, i));
    o << "  outputs\n";
    for (size_t i = 0; i < m.outputs.size(); ++i) row(display_name(m.output_names, i), m.outputs[i], dims_of(m.output_dims, i));
    o << "  instructions    " << m.num_instructions << " (" << m.num_kernel_calls << " kernel calls, "
      << m.num_delegate_calls << " delegate calls)\n"
      << "  kernel calls    " << m.num_kernel_calls << " (" << m.num_cpu_kernel_calls << " optimized cpu, "
      << m.num_kernel_calls - m.num_cpu_kernel_calls << " portable)\n"
      << "  delegates       " << delegate_summary(m) << "\n";
    if (m.num_alternatives > 1) {
      o << "  alternative     " << m.alternative + 1 << " of " << m.num_alternatives << " (the first whose backends are available)\n";
      for (size_t a = 0; a < m.skipped_alternatives.size(); ++a) {
        o << "    skipped " << a + 1 << ": " << m.skipped_alternatives[a] << "\n";
      }
    }
    if (!m.unavailable.empty()) o << "  NOT RUNNABLE    " << m.unavailable << "\n";
    o << "  arena           " << m.arena_bytes << " bytes\n";
    auto bytes_list = [&](const char* label, const std::vector<std::pair<std::string, uint64_t>>& v) {
      if (v.empty()) return;
      o << label;
      for (size_t i = 0; i < v.size(); ++i) o << (i ? ", " : "") << v[i].first << " " << v[i].second;
      o << " bytes\n";
    };
    bytes_list("  constants       by dtype: ", m.constant_bytes_by_dtype);
    bytes_list("                  by scheme: ", m.constant_bytes_by_scheme);
    if (!m.cpu_op_counts.empty()) {
      o << "  cpu kernels     ";
      for (size_t i = 0; i < m.cpu_op_counts.size(); ++i) {
        o << (i ? ", " : "") << m.cpu_op_counts[i].first << " " << m.cpu_op_counts[i].second;
      }
      o << "\n";
    }
    o << "  ops\n";
    if (m.op_counts.empty()) o << "    (none)\n";
    size_t width = 0;
    for (const auto& [op, n] : m.op_counts) width = std::max(width, op.size());
    for (const auto& [op, n] : m.op_counts) {
      o << "    " << op << std::string(width - op.size() + 2, ' ') << n << "\n";
    }
  }
  std::cout << o.str();
  return 0;
}

// ---- options shared by kiln run and kiln bench ----

constexpr int kMaxThreads = ThreadPool::kMaxThreads;

/// How a method is instantiated: its thread pool and kernel set.
struct ExecOptions {
  int threads = 0;                 ///< 0: ThreadPool::default_pool() (KILN_NUM_THREADS or the core count)
  std::string kernels = "cpu";     ///< "cpu" (optimized where one accepts the call) or "portable"
};

/// A bad option value: printed as "kiln WHERE: message", exit status 2 (usage), as for CLI11's own
/// parse errors.
int usage_fail(const char* where, const Error& e) {
  fail(where, e);
  return kExitUsage;
}

/// Checks --threads and --kernels; InvalidArgument naming the bad value.
Error check_exec_options(const ExecOptions& e) {
  if (e.threads < 0 || e.threads > kMaxThreads) {
    return Error(ErrorCode::InvalidArgument, "--threads must be between 1 and " + std::to_string(kMaxThreads) +
                                                 " (0: the default pool), got " + std::to_string(e.threads));
  }
  if (e.kernels != "cpu" && e.kernels != "portable") {
    return Error(ErrorCode::InvalidArgument, "--kernels must be 'cpu' or 'portable', got '" + e.kernels + "'");
  }
  return Error();
}

/// Adds --threads and --kernels to a subcommand.
void add_exec_options(CLI::App* cmd, ExecOptions& e) {
  cmd->add_option("--threads,-t", e.threads,
                  "Threads for Kiln's kernels and for delegates (the method's pool); 0 uses the default pool "
                  "(KILN_NUM_THREADS, else the number of cores)")
      ->capture_default_str();
  cmd->add_option("--kernels", e.kernels,
                  "Kernel set: 'cpu' runs the optimized cpu kernels wherever one accepts the call (portable "
                  "elsewhere); 'portable' runs the reference kernels only")
      ->capture_default_str();
}

/// A loaded method together with the thread pool it runs on (the pool outlives the method).
struct LoadedMethod {
  std::unique_ptr<ThreadPool> own_pool;
  ThreadPool* pool = nullptr;
  std::optional<Method> method;
};

Result<LoadedMethod> instantiate(const Program& program, const std::string& name, const ExecOptions& e) {
  LoadedMethod lm;
  if (e.threads > 0) {
    lm.own_pool = std::make_unique<ThreadPool>(e.threads);
    lm.pool = lm.own_pool.get();
  } else {
    lm.pool = ThreadPool::default_pool();
  }
  MethodOptions mo;
  mo.pool = lm.pool;
  mo.portable_kernels_only = e.kernels == "portable";
  auto m = program.load_method(name, mo);
  if (!m.ok()) return m.error();
  lm.method.emplace(std::move(m.value()));
  return lm;
}

/// The method's meta, or NotFound listing the program's methods.
Result<MethodMeta> find_method(const Program& program, const std::string& name) {
  auto meta = program.method_meta(name);
  if (meta.ok()) return meta;
  std::string names;
  for (const auto& n : program.method_names()) names += (names.empty() ? "" : ", ") + n;
  return Error(meta.error().code(), meta.error().message() + " (methods: " + names + ")");
}

/// Converts a float32 array to bfloat16 in place (NumPy has no bfloat16; the CLI takes float32
/// .npy files for bfloat16 inputs and writes bfloat16 outputs as float32).
void float32_to_bfloat16(npy::Array& a) {
  const size_t n = a.data.size() / 4;
  std::vector<uint8_t> out(n * 2);
  for (size_t i = 0; i < n; ++i) {
    float f;
    std::memcpy(&f, a.data.data() + 4 * i, 4);
    const uint16_t b = float_to_bfloat16(f);
    std::memcpy(out.data() + 2 * i, &b, 2);
  }
  a.data = std::move(out);
  a.dtype = DType::BFloat16;
}

/// Reads one .npy file per method input; each must match the input's dtype and shape exactly.
/// Errors name the input and the file.
Result<std::vector<npy::Array>> read_inputs(const MethodMeta& m, const std::vector<std::string>& files) {
  if (files.size() != m.inputs.size()) {
    std::string want;
    for (size_t i = 0; i < m.inputs.size(); ++i) {
      want += (i ? ", " : "") + display_name(m.input_names, i) + ": " +
              type_to_string(m.inputs[i], i < m.input_dims.size() ? m.input_dims[i] : std::vector<std::string>{});
    }
    return Error(ErrorCode::InvalidArgument, "method '" + m.name + "' takes " + std::to_string(m.inputs.size()) +
                                                 " input(s) (" + want + "), got " + std::to_string(files.size()) +
                                                 " --input file(s)");
  }
  std::vector<npy::Array> arrays;
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string what = "input '" + display_name(m.input_names, i) + "' (" + files[i] + ")";
    auto arr = npy::read_file(files[i]);  // its errors name the file
    if (!arr.ok()) {
      return Error(arr.error().code(), "input '" + display_name(m.input_names, i) + "': " + arr.error().message());
    }
    const TensorType& want = m.inputs[i];
    if (want.dtype == DType::BFloat16 && arr->dtype == DType::Float32) float32_to_bfloat16(arr.value());
    if (arr->dtype != want.dtype) {
      return Error(ErrorCode::InvalidArgument,
                   what + ": dtype " + dtype_name(arr->dtype) + ", the method expects " +
                       type_to_string(want, i < m.input_dims.size() ? m.input_dims[i] : std::vector<std::string>{}));
    }
    // Symbolic dims take any size in their range (execute checks it and names the symbol).
    const std::vector<std::string> dims = i < m.input_dims.size() ? m.input_dims[i] : std::vector<std::string>{};
    bool same = arr->shape.size() == want.sizes.size();
    for (size_t d = 0; same && d < want.sizes.size(); ++d) {
      same = arr->shape[d] == want.sizes[d] || (d < dims.size() && !dims[d].empty());
    }
    if (!same) {
      return Error(ErrorCode::InvalidArgument, what + ": shape " + sizes_to_string(arr->shape) +
                                                   ", the method expects " + type_to_string(want, dims));
    }
    arrays.push_back(std::move(arr.value()));
  }
  return arrays;
}

// ---- kiln generate ----

struct GenerateArgs {
  std::string file;
  std::string method = "forward";
  std::string prompt_ids;
  int64_t max_new_tokens = 16;
  float temperature = 0.0f;
  int64_t top_k = 0;
  float top_p = 1.0f;
  uint64_t seed = 0;
  bool ignore_eos = false;
  bool json = false;
  bool no_mmap = false;
  ExecOptions exec;
};

/// "1,2,3" -> {1, 2, 3}; InvalidArgument naming the bad item.
Result<std::vector<int64_t>> parse_ids(const std::string& text) {
  std::vector<int64_t> ids;
  if (!text.empty() && text.back() == ',') {
    return Error(ErrorCode::InvalidArgument, "--prompt-ids: empty item at the end of '" + text + "'");
  }
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    if (b == std::string::npos) return Error(ErrorCode::InvalidArgument, "--prompt-ids: empty item in '" + text + "'");
    item = item.substr(b, e - b + 1);
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (errno != 0 || end == item.c_str() || *end != '\0' || v < 0) {
      return Error(ErrorCode::InvalidArgument, "--prompt-ids: '" + item + "' is not a token id (a non-negative integer)");
    }
    ids.push_back(v);
  }
  if (ids.empty()) return Error(ErrorCode::InvalidArgument, "--prompt-ids: no token ids");
  return ids;
}

/// The llm.* metadata value `key` as a positive integer (decimal digits only, at most 2^62); NotFound
/// naming the key when absent, InvalidProgram quoting the value otherwise ("2x6", "-12", "0").
Result<int64_t> llm_int(const Program& p, const char* key) {
  const std::string* v = p.metadata_value(key);
  if (v == nullptr) {
    return Error(ErrorCode::NotFound, std::string("the program has no '") + key +
                                          "' metadata: export it with `python -m kiln export-llm`");
  }
  int64_t value = 0;
  bool ok = !v->empty() && v->size() <= 18;
  for (size_t i = 0; ok && i < v->size(); ++i) {
    ok = (*v)[i] >= '0' && (*v)[i] <= '9';
    value = value * 10 + ((*v)[i] - '0');
  }
  if (!ok || value < 1) {
    return Error(ErrorCode::InvalidProgram, std::string("metadata '") + key + "' is '" + printable(*v) + "', not a positive integer");
  }
  return value;
}

int cmd_generate(const GenerateArgs& a) {
  if (Error e = check_exec_options(a.exec); !e.ok()) return usage_fail("generate", e);
  auto prompt = parse_ids(a.prompt_ids);
  if (!prompt.ok()) return usage_fail("generate", prompt.error());
  if (a.max_new_tokens < 0) {
    return usage_fail("generate", Error(ErrorCode::InvalidArgument, "--max-new-tokens must be >= 0"));
  }
  LoadOptions load_options;
  load_options.prefault = true;  // every step reads every weight: no page faults in the first prefill
  load_options.use_mmap = !a.no_mmap;
  auto program = Program::load(a.file, load_options);
  if (!program.ok()) return fail("generate", program.error());
  const Program& p = *program.value();
  auto max_seq_len = llm_int(p, "llm.max_seq_len");
  if (!max_seq_len.ok()) return fail("generate", max_seq_len.error());
  auto vocab = llm_int(p, "llm.vocab_size");
  if (!vocab.ok()) return fail("generate", vocab.error());
  // The request checked against the program's limits (vocabulary, max_seq_len) before anything
  // runs: a bad request is a usage error (exit 2), like every other bad argument; exit 1 is left
  // for a program that cannot be loaded or a generation that failed.
  for (int64_t id : *prompt) {
    if (id >= *vocab) {
      return usage_fail("generate", Error(ErrorCode::InvalidArgument, "--prompt-ids: token id " + std::to_string(id) +
                                                                          " is outside the vocabulary of " + std::to_string(*vocab)));
    }
  }
  GenerateOptions o;
  o.max_new_tokens = a.max_new_tokens;
  o.max_seq_len = *max_seq_len;
  o.ignore_eos = a.ignore_eos;
  o.sampling.temperature = a.temperature;
  o.sampling.top_k = a.top_k;
  o.sampling.top_p = a.top_p;
  o.sampling.seed = a.seed;
  if (const std::string* eos = p.metadata_value("llm.eos_ids"); eos != nullptr && !eos->empty()) {
    auto ids = parse_ids(*eos);
    if (!ids.ok()) return fail("generate", Error(ErrorCode::InvalidProgram, "metadata llm.eos_ids: " + ids.error().message()));
    o.eos_ids = *ids;
  }
  if (Error e = o.sampling.validate(); !e.ok()) return usage_fail("generate", e);
  if (Error e = check_generate_request(*prompt, o); !e.ok()) return usage_fail("generate", e);
  auto lm = instantiate(p, a.method, a.exec);
  if (!lm.ok()) return fail("generate", lm.error());
  auto session = p.new_session();
  if (!session.ok()) return fail("generate", session.error());
  Method& method = *lm->method;
  std::vector<int64_t> pos(1);
  StepFn step = [&](std::span<const int64_t> tokens, int64_t input_pos) -> Result<std::span<const float>> {
    pos[0] = input_pos;
    const Tensor t{DType::Int64, {1, static_cast<int64_t>(tokens.size())}, const_cast<int64_t*>(tokens.data())};
    const Tensor ps{DType::Int64, {1}, pos.data()};
    auto out = method.execute(**session, {t, ps});
    if (!out.ok()) return out.error();
    const Tensor& l = (*out)[0];
    if (l.dtype != DType::Float32 || l.sizes.empty()) {
      return Error(ErrorCode::InvalidArgument, "the method's output 0 is " + l.type().to_string() +
                                                   ", not float32 logits [1, vocab]");
    }
    return std::span<const float>(static_cast<const float*>(l.data), static_cast<size_t>(l.sizes.back()));
  };
  GenerateStats stats;
  std::function<void(int64_t)> echo;
  if (!a.json) echo = [](int64_t) {};
  auto ids = generate(step, *prompt, o, &stats, echo);
  if (!ids.ok()) return fail("generate", ids.error());
  std::ostringstream out;
  if (a.json) {
    auto num = [](double v) {
      std::ostringstream n;
      n.precision(6);
      n << std::fixed << v;
      return n.str();
    };
    out << "{\"ids\": " << json_sizes(*ids) << ", \"prompt_tokens\": " << prompt->size()
        << ", \"prefill_tokens_per_s\": " << num(stats.prefill_tokens_per_s)
        << ", \"decode_tokens_per_s\": " << num(stats.decode_tokens_per_s)
        << ", \"time_to_first_token_ms\": " << num(stats.time_to_first_token_ms)
        << ", \"peak_rss_mib\": " << num(stats.peak_rss_mib) << "}\n";
  } else {
    for (size_t i = 0; i < ids->size(); ++i) out << (i ? "," : "") << (*ids)[i];
    out << "\n";
    std::fprintf(stderr, "kiln generate: %zu prompt tokens, %zu new; prefill %.1f tokens/s, decode %.1f tokens/s, "
                         "time to first token %.2f ms, peak RSS %.1f MiB\n",
                 prompt->size(), ids->size(), stats.prefill_tokens_per_s, stats.decode_tokens_per_s,
                 stats.time_to_first_token_ms, stats.peak_rss_mib);
  }
  std::cout << out.str();
  return 0;
}

/// A CLI check for an option naming a file to write: an empty path is a usage error (exit 2,
/// before any work) rather than a silent no-op or a late "cannot write ''".
CLI::Validator non_empty_path() {
  return CLI::Validator([](std::string& v) { return v.empty() ? std::string("must not be empty: give a file path") : std::string(); },
                        "PATH", "non-empty path");
}

/// InvalidArgument when `output` (the file an option names) is the input file `input` itself (the
/// same path, a link or another name of it): writing it would destroy the input, so the command
/// refuses before any work. A path that does not exist yet is never the input.
Error check_not_input(const std::string& input, const std::string& output, const char* option) {
  std::error_code ec;
  if (output.empty() || !std::filesystem::exists(output, ec)) return Error();
  if (std::filesystem::equivalent(input, output, ec) && !ec) {
    return Error(ErrorCode::InvalidArgument, std::string(option) + " '" + output + "' is the input file '" + input +
                                                 "': writing it would overwrite the input (give another path)");
  }
  return Error();
}

// ---- kiln run ----

/// The .npy file stem of each output: its name with every character outside [A-Za-z0-9._-]
/// (and a leading '.') replaced by '_', at most 200 bytes; "output_<i>" for an unnamed output or
/// with `numbered`. A file named exactly after an output holds that output: names that are already
/// safe stems claim them first (first occurrence), then the changed ones take theirs if free; any
/// other gets "_<i>" appended (then "_<k>", k = 2, 3, ...) until it is no output's stem.
std::vector<std::string> output_file_stems(const std::vector<std::string>& names, size_t n, bool numbered) {
  std::vector<std::string> stems(n);
  std::vector<bool> exact(n, false), done(n, false);
  for (size_t i = 0; i < n; ++i) {
    std::string& s = stems[i];
    if (!numbered && i < names.size()) {
      for (char c : names[i].substr(0, 200)) {
        const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                        c == '_' || (c == '.' && !s.empty());
        s += ok ? c : '_';
      }
      exact[i] = !s.empty() && s == names[i];
    }
    if (s.empty()) s = "output_" + std::to_string(i);
  }
  std::set<std::string> claimed;
  for (bool tier : {true, false}) {  // exact names first
    for (size_t i = 0; i < n; ++i) {
      if (exact[i] == tier && claimed.insert(stems[i]).second) done[i] = true;
    }
  }
  std::set<std::string> taken(stems.begin(), stems.end());
  for (size_t i = 0; i < n; ++i) {
    if (done[i]) continue;
    std::string c = stems[i] + "_" + std::to_string(i);
    for (int k = 2; taken.count(c); ++k) c = stems[i] + "_" + std::to_string(i) + "_" + std::to_string(k);
    taken.insert(c);
    stems[i] = c;
  }
  return stems;
}

struct RunArgs {
  std::string file;
  std::string method = "forward";
  std::vector<std::string> inputs;
  std::string output_dir;
  bool numbered = false;  ///< output_<i>.npy whatever the output names
  ExecOptions exec;
};

int cmd_run(const RunArgs& a) {
  using Clock = std::chrono::steady_clock;
  auto ms = [](Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };

  if (Error e = check_exec_options(a.exec); !e.ok()) return usage_fail("run", e);
  const auto t0 = Clock::now();
  auto program = Program::load(a.file, cli_load_options());
  if (!program.ok()) return fail("run", program.error());
  auto meta = find_method(*program.value(), a.method);
  if (!meta.ok()) return fail("run", meta.error());
  const MethodMeta& m = meta.value();
  auto arrays = read_inputs(m, a.inputs);
  if (!arrays.ok()) return fail("run", arrays.error());
  auto method = instantiate(*program.value(), a.method, a.exec);
  if (!method.ok()) return fail("run", method.error());
  const auto t1 = Clock::now();

  std::vector<Tensor> inputs;
  for (npy::Array& arr : arrays.value()) inputs.push_back(arr.view());
  const auto t2 = Clock::now();
  auto outputs = method->method->execute(inputs);
  const auto t3 = Clock::now();
  if (!outputs.ok()) return fail("run", outputs.error());

  if (!a.output_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(a.output_dir, ec);
    if (ec) {
      return fail("run", Error(ErrorCode::NotFound, "cannot create output directory '" + a.output_dir + "': " + ec.message()));
    }
  }
  std::printf("method '%s': %zu input(s), %zu output(s)\n", m.name.c_str(), inputs.size(), outputs->size());
  const std::vector<std::string> stems = output_file_stems(m.output_names, outputs->size(), a.numbered);
  for (size_t i = 0; i < outputs->size(); ++i) {
    const Tensor& t = (*outputs)[i];
    std::string line = "output " + std::to_string(i) + " '" + display_name(m.output_names, i) + "': " + t.type().to_string();
    if (!a.output_dir.empty()) {
      const std::string path = (std::filesystem::path(a.output_dir) / (stems[i] + ".npy")).string();
      Tensor to_write = t;
      std::vector<float> widened;
      if (t.dtype == DType::BFloat16) {
        widened.resize(static_cast<size_t>(t.numel()));
        const auto* src = t.data_as<const uint16_t>();
        for (size_t k = 0; k < widened.size(); ++k) widened[k] = bfloat16_to_float(src[k]);
        to_write = Tensor{DType::Float32, t.sizes, widened.data()};
        line += " (written as float32: .npy has no bfloat16)";
      }
      Error e = npy::write_file(path, to_write);
      if (!e.ok()) return fail("run", e);
      line += " -> " + path;
    }
    std::printf("%s\n", line.c_str());
  }
  std::printf("load: %.3f ms\nexecute: %.3f ms\n", ms(t1 - t0), ms(t3 - t2));
  std::printf("cpu target: %s%s\n", cpu_target_summary().c_str(),
              a.exec.kernels == "portable" ? " (unused: --kernels portable)" : "");
  return 0;
}


// ---- kiln bench ----

struct BenchArgs {
  std::string file;
  std::string method = "forward";
  std::vector<std::string> inputs;  ///< .npy files; empty: seeded random data
  int runs = 50;
  int warmup = 5;
  uint64_t seed = 0;
  bool json = false;
  int profile = 0;  ///< 0: off; N > 0: profile --runs extra executions, show the top N rows
  std::string trace;  ///< Chrome trace-event file of the profiled executions; "" off
  ExecOptions exec;
};

/// One row of `kiln bench --profile`: the instructions of one op with the same fused op, kernel
/// and argument types, with their time summed.
struct ProfileRow {
  std::string op, fused, kernel, shapes;
  size_t instructions = 0;
  uint64_t calls = 0;
  double total_ms = 0.0;
  double min_ms = 0.0;  ///< sum over the row's instructions of each one's fastest execution
};

/// "f32[1,16,112,112], f32[16,1,3,3] -> f32[1,16,56,56]" (None arguments left out).
std::string profile_shapes(const InstructionProfile& p) {
  auto list = [](const std::vector<TensorType>& ts) {
    std::string s;
    for (size_t i = 0; i < ts.size(); ++i) s += (i ? ", " : "") + ts[i].to_string();
    return s;
  };
  return list(p.inputs) + " -> " + list(p.outputs);
}

/// Profile rows: by op (shapes empty; `fused` and `kernel` kept apart) when `by_shape` is false,
/// else by op + fused + kernel + shapes; sorted by total time, largest first.
std::vector<ProfileRow> profile_rows(const std::vector<InstructionProfile>& prof, bool by_shape) {
  std::vector<ProfileRow> rows;
  for (const InstructionProfile& p : prof) {
    const std::string shapes = by_shape ? profile_shapes(p) : std::string();
    auto it = std::find_if(rows.begin(), rows.end(), [&](const ProfileRow& r) {
      return r.op == p.op && r.fused == p.fused && r.kernel == p.kernel && r.shapes == shapes;
    });
    if (it == rows.end()) {
      rows.push_back(ProfileRow{p.op, p.fused, p.kernel, shapes});
      it = rows.end() - 1;
    }
    ++it->instructions;
    it->calls += p.calls;
    it->total_ms += p.total_ms;
    it->min_ms += p.min_ms;
  }
  std::stable_sort(rows.begin(), rows.end(), [](const ProfileRow& x, const ProfileRow& y) { return x.total_ms > y.total_ms; });
  return rows;
}

/// Fills `a` (dtype and shape set) with seeded random data: floats from N(0, 1), integers
/// uniform in [0, 3] (small, so that index inputs such as embedding ids stay in range), bools 0/1.
void fill_random(npy::Array& a, std::mt19937_64& rng) {
  int64_t n = 1;
  for (int64_t d : a.shape) n *= d;
  a.data.assign(static_cast<size_t>(n) * dtype_size(a.dtype), 0);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> small(0, 3);
  std::uniform_int_distribution<int> bit(0, 1);
  uint8_t* p = a.data.data();
  for (int64_t i = 0; i < n; ++i) {
    switch (a.dtype) {
      case DType::Float32: { const float v = normal(rng); std::memcpy(p + 4 * i, &v, 4); break; }
      case DType::Float16: { const uint16_t v = float_to_half(normal(rng)); std::memcpy(p + 2 * i, &v, 2); break; }
      case DType::BFloat16: { const uint16_t v = float_to_bfloat16(normal(rng)); std::memcpy(p + 2 * i, &v, 2); break; }
      case DType::Int64: { const int64_t v = small(rng); std::memcpy(p + 8 * i, &v, 8); break; }
      case DType::Int32: { const int32_t v = small(rng); std::memcpy(p + 4 * i, &v, 4); break; }
      case DType::Int8: p[i] = static_cast<uint8_t>(small(rng)); break;
      case DType::UInt8: p[i] = static_cast<uint8_t>(small(rng)); break;
      case DType::Bool: p[i] = static_cast<uint8_t>(bit(rng)); break;
      case DType::Float64: { const double v = normal(rng); std::memcpy(p + 8 * i, &v, 8); break; }
    }
  }
}

/// The q-quantile (0 <= q <= 1) of sorted values, linear between the closest ranks (NumPy's
/// default "linear" method: position q * (n - 1)).
double quantile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0.0;
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const auto lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (pos - static_cast<double>(lo)) * (sorted[hi] - sorted[lo]);
}

/// What one bench-style timing produced (run_bench): shared by `kiln bench` and `kiln report --profile`.
struct BenchRun {
  std::shared_ptr<Program> program;
  MethodMeta meta;
  LoadedMethod method;
  double load_ms = 0.0, init_ms = 0.0;
  std::vector<double> times;               ///< --runs timed executions, ms
  std::vector<InstructionProfile> prof;    ///< with profiling: summed over --runs more executions
  double prof_wall_ms = 0.0;               ///< wall time of those executions (each one's execute call)
  /// With trace: per profiled execution, its start and duration (steady_clock ns) and its
  /// instructions' profile (InstructionProfile::last_start_ns / last_ns of that execution).
  struct TracedRun {
    int64_t start_ns = 0, dur_ns = 0;
    std::vector<InstructionProfile> instructions;
  };
  std::vector<TracedRun> traced;
};

/// Loads the program, makes the inputs (--input files or seeded random data), instantiates the
/// method, runs --warmup and --runs timed executions and, when `profile` (or `trace`), --runs more
/// with each instruction timed (`trace`: each execution's instruction timings kept). Returns 0, or
/// the exit status after printing the error as "kiln WHERE: ...".
int run_bench(const BenchArgs& a, const char* where, bool profile, bool trace, BenchRun& r) {
  using Clock = std::chrono::steady_clock;
  auto ms = [](Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };

  if (Error e = check_exec_options(a.exec); !e.ok()) return usage_fail(where, e);
  if (a.runs < 1 || a.runs > 1000000) {
    return usage_fail(where, Error(ErrorCode::InvalidArgument, "--runs must be between 1 and 1000000, got " + std::to_string(a.runs)));
  }
  if (a.warmup < 0 || a.warmup > 1000000) {
    return usage_fail(where, Error(ErrorCode::InvalidArgument, "--warmup must be between 0 and 1000000, got " + std::to_string(a.warmup)));
  }

  const auto t0 = Clock::now();
  auto program = Program::load(a.file, cli_load_options());
  const auto t1 = Clock::now();
  if (!program.ok()) return fail(where, program.error());
  r.program = program.value();
  r.load_ms = ms(t1 - t0);
  auto meta = find_method(*r.program, a.method);
  if (!meta.ok()) return fail(where, meta.error());
  r.meta = meta.value();
  const MethodMeta& m = r.meta;

  std::vector<npy::Array> arrays;
  if (!a.inputs.empty()) {
    auto read = read_inputs(m, a.inputs);
    if (!read.ok()) return fail(where, read.error());
    arrays = std::move(read.value());
  } else {
    std::mt19937_64 rng(a.seed);
    for (size_t i = 0; i < m.inputs.size(); ++i) {
      const TensorType& t = m.inputs[i];
      npy::Array arr;
      arr.dtype = t.dtype;
      arr.shape = t.sizes;
      // A symbolic dim takes its symbol's minimum (for a language model: one token, a decode step);
      // other sizes need --input files.
      const std::vector<std::string> dims = i < m.input_dims.size() ? m.input_dims[i] : std::vector<std::string>{};
      for (size_t d = 0; d < dims.size() && d < arr.shape.size(); ++d) {
        if (dims[d].empty()) continue;
        auto sym = std::find_if(m.symbols.begin(), m.symbols.end(), [&](const SymbolDef& s) { return s.name == dims[d]; });
        if (sym == m.symbols.end()) {
          return usage_fail(where, Error(ErrorCode::InvalidArgument,
                                         "input '" + display_name(m.input_names, i) + "' dim " + std::to_string(d) +
                                             " is " + dims[d] + ": give the inputs with --input files"));
        }
        arr.shape[d] = sym->min;
      }
      fill_random(arr, rng);
      if (!m.symbols.empty() && (t.dtype == DType::Int64 || t.dtype == DType::Int32)) {
        // Integer inputs of a symbolic method are often positions or token ids (0 is always valid).
        std::fill(arr.data.begin(), arr.data.end(), uint8_t{0});
      }
      arrays.push_back(std::move(arr));
    }
  }

  const auto t2 = Clock::now();
  auto method = instantiate(*r.program, a.method, a.exec);
  const auto t3 = Clock::now();
  if (!method.ok()) return fail(where, method.error());
  r.method = std::move(method.value());
  r.init_ms = ms(t3 - t2);
  std::vector<Tensor> inputs;
  for (npy::Array& arr : arrays) inputs.push_back(arr.view());

  Method& run = *r.method.method;
  for (int i = 0; i < a.warmup; ++i) {
    auto out = run.execute(inputs);
    if (!out.ok()) return fail(where, out.error());
  }
  r.times.reserve(static_cast<size_t>(a.runs));
  for (int i = 0; i < a.runs; ++i) {
    const auto s = Clock::now();
    auto out = run.execute(inputs);
    const auto e = Clock::now();
    if (!out.ok()) return fail(where, out.error());
    r.times.push_back(ms(e - s));
  }
  // Profile: as many executions again, timed per instruction (the latency figures above are
  // from executions without the profiler's clock reads).
  if (profile || trace) {
    run.set_profiling(true);
    for (int i = 0; i < a.runs; ++i) {
      const auto s = Clock::now();
      auto out = run.execute(inputs);
      const auto e = Clock::now();
      if (!out.ok()) return fail(where, out.error());
      r.prof_wall_ms += ms(e - s);
      if (trace) {  // this execution's timings (read outside the timed call)
        BenchRun::TracedRun tr;
        tr.start_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(s.time_since_epoch()).count();
        tr.dur_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(e - s).count();
        tr.instructions = run.profile();
        r.traced.push_back(std::move(tr));
      }
    }
    r.prof = run.profile();
    run.set_profiling(false);
  }
  return 0;
}

/// Writes `runs` as a Chrome trace-event file (the JSON object format: {"traceEvents": [...]},
/// timestamps in microseconds from the first run's start): per execution one "X" event for the
/// whole execute call (thread 1, cat "run") and one per executed instruction (thread 2, cat
/// "kernel" or "delegate", args: index, op, kernel, fused, shapes). Perfetto and chrome://tracing
/// open it.
Error write_trace(const std::string& path, const std::string& method, const std::vector<BenchRun::TracedRun>& runs) {
  const int64_t origin = runs.empty() ? 0 : runs.front().start_ns;
  auto us = [&](int64_t ns) {
    char b[32];
    std::snprintf(b, sizeof(b), "%.3f", static_cast<double>(ns) / 1000.0);
    return std::string(b);
  };
  std::string j = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  j += "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": 1, \"args\": {\"name\": " +
       json_quote("kiln bench: method " + method) + "}},\n";
  j += "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": 1, \"args\": {\"name\": \"runs\"}},\n";
  j += "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": 2, \"args\": {\"name\": \"instructions\"}}";
  for (size_t r = 0; r < runs.size(); ++r) {
    const auto& run = runs[r];
    j += ",\n{\"name\": \"execute " + std::to_string(r) + "\", \"cat\": \"run\", \"ph\": \"X\", \"ts\": " +
         us(run.start_ns - origin) + ", \"dur\": " + us(run.dur_ns) + ", \"pid\": 1, \"tid\": 1, \"args\": {\"run\": " +
         std::to_string(r) + "}}";
    for (const InstructionProfile& p : run.instructions) {
      if (p.last_ns <= 0 && p.last_start_ns == 0) continue;
      j += ",\n{\"name\": " + json_quote(p.op) + ", \"cat\": " + json_quote(p.kernel == "delegate" ? "delegate" : "kernel") +
           ", \"ph\": \"X\", \"ts\": " + us(p.last_start_ns - origin) + ", \"dur\": " + us(std::max<int64_t>(p.last_ns, 0)) +
           ", \"pid\": 1, \"tid\": 2, \"args\": {\"run\": " + std::to_string(r) + ", \"index\": " + std::to_string(p.index) +
           ", \"kernel\": " + json_quote(p.kernel) + ", \"fused\": " + json_quote(p.fused) + ", \"shapes\": " +
           json_quote(profile_shapes(p)) + "}}";
    }
  }
  j += "\n]}\n";
  return write_text(path, j);
}

int cmd_bench(const BenchArgs& a) {
  if (Error e = check_not_input(a.file, a.trace, "--trace"); !e.ok()) return usage_fail("bench", e);
  BenchRun br;
  if (int rc = run_bench(a, "bench", a.profile > 0, !a.trace.empty(), br); rc != 0) return rc;
  if (!a.trace.empty()) {
    if (Error e = write_trace(a.trace, br.meta.name, br.traced); !e.ok()) return fail("bench", e);
  }
  const MethodMeta& m = br.meta;
  Method& run = *br.method.method;
  const std::vector<double>& times = br.times;
  const std::vector<InstructionProfile>& prof = br.prof;
  const double prof_wall_ms = br.prof_wall_ms;
  std::vector<double> sorted = times;
  std::sort(sorted.begin(), sorted.end());
  double sum = 0;
  for (double t : times) sum += t;
  const double mean = sum / static_cast<double>(times.size());
  const double rss = peak_rss_mib();
  const int threads = br.method.pool->num_threads();
  const size_t cpu_calls = a.exec.kernels == "portable" ? 0 : m.num_cpu_kernel_calls;

  std::ostringstream o;
  char buf[64];
  auto num = [&](double v) {
    std::snprintf(buf, sizeof(buf), "%.4f", v);
    return std::string(buf);
  };
  if (a.json) {
    o << "{\"file\": " << json_quote(a.file) << ", \"method\": " << json_quote(m.name) << ", \"threads\": " << threads
      << ", \"kernels\": " << json_quote(a.exec.kernels) << ", " << cpu_target_json_members()
      << ", \"runs\": " << a.runs << ", \"warmup\": " << a.warmup
      << ", \"inputs\": " << json_quote(a.inputs.empty() ? "random(seed=" + std::to_string(a.seed) + ")" : "npy")
      << ", \"load_ms\": " << num(br.load_ms) << ", \"init_ms\": " << num(br.init_ms)
      << ", \"min_ms\": " << num(sorted.front()) << ", \"median_ms\": " << num(quantile(sorted, 0.5))
      << ", \"p90_ms\": " << num(quantile(sorted, 0.9)) << ", \"max_ms\": " << num(sorted.back())
      << ", \"mean_ms\": " << num(mean) << ", \"peak_rss_mib\": " << num(rss)
      << ", \"kernel_calls\": " << m.num_kernel_calls << ", \"cpu_kernel_calls\": " << cpu_calls
      << ", \"portable_kernel_calls\": " << m.num_kernel_calls - cpu_calls
      << ", \"fused_instructions\": " << run.num_fused_instructions()
      << ", \"prepared_mib\": " << num(static_cast<double>(run.prepared_bytes()) / (1 << 20))
      << ", \"delegate_segments\": " << json_counts(m.delegate_counts) << ", \"times_ms\": [";
    for (size_t i = 0; i < times.size(); ++i) o << (i ? ", " : "") << num(times[i]);
    o << "]";
    if (a.profile > 0) {
      // Milliseconds per execution (summed over --runs profiled executions, divided by --runs).
      const double r = static_cast<double>(a.runs);
      auto rows_json = [&](const std::vector<ProfileRow>& rows, size_t limit) {
        std::string j = "[";
        for (size_t i = 0; i < rows.size() && i < limit; ++i) {
          const ProfileRow& w = rows[i];
          j += std::string(i ? ", " : "") + "{\"op\": " + json_quote(w.op) + ", \"fused\": " + json_quote(w.fused) +
               ", \"kernel\": " + json_quote(w.kernel) + (w.shapes.empty() ? "" : ", \"shapes\": " + json_quote(w.shapes)) +
               ", \"instructions\": " + std::to_string(w.instructions) + ", \"ms_per_run\": " + num(w.total_ms / r) + ", \"min_ms\": " + num(w.min_ms) + "}";
        }
        return j + "]";
      };
      double total = 0.0;
      for (const auto& p : prof) total += p.total_ms;
      o << ", \"profile\": {\"runs\": " << a.runs << ", \"wall_ms_per_run\": " << num(prof_wall_ms / r)
        << ", \"instructions_ms_per_run\": " << num(total / r) << ", \"by_op\": " << rows_json(profile_rows(prof, false), SIZE_MAX)
        << ", \"top\": " << rows_json(profile_rows(prof, true), static_cast<size_t>(a.profile)) << "}";
    }
    o << "}\n";
    std::cout << o.str();
    return 0;
  }
  o << "file            " << a.file << "\n"
    << "method          " << m.name << "\n"
    << "threads         " << threads << "\n"
    << "kernels         " << a.exec.kernels << " (" << cpu_calls << " optimized cpu, " << m.num_kernel_calls - cpu_calls
    << " portable kernel calls)\n"
    << "cpu target      " << cpu_target_summary()
    << (a.exec.kernels == "portable" ? " (unused: --kernels portable)" : "") << "\n"
    << "delegates       " << delegate_summary(m) << "\n"
    << "inputs          " << (a.inputs.empty() ? "random (seed " + std::to_string(a.seed) + ")" : "from .npy files") << "\n"
    << "load            " << num(br.load_ms) << " ms\n"
    << "method init     " << num(br.init_ms) << " ms\n"
    << "runs            " << a.runs << " (after " << a.warmup << " warm-up)\n"
    << "latency ms      min " << num(sorted.front()) << "  median " << num(quantile(sorted, 0.5)) << "  p90 "
    << num(quantile(sorted, 0.9)) << "  max " << num(sorted.back()) << "  mean " << num(mean) << "\n"
    << "fused           " << run.num_fused_instructions() << " instructions; prepared state "
    << num(static_cast<double>(run.prepared_bytes()) / (1 << 20)) << " MiB\n"
    << "peak RSS        " << num(rss) << " MiB\n";
  if (a.profile > 0) {
    const double r = static_cast<double>(a.runs);
    double total = 0.0;
    for (const auto& p : prof) total += p.total_ms;
    auto pct = [&](double v) { return total > 0 ? num(100.0 * v / total).substr(0, 5) : std::string("0"); };
    char line[512];
    o << "\nprofile         " << a.runs << " more runs timed per instruction: " << num(prof_wall_ms / r)
      << " ms per run, of which " << num(total / r) << " ms inside instructions\n"
      << "by op (ms per run, % of instruction time, sum of each instruction's fastest run in ms, instructions, kernel; "
         "'+op': fused):\n";
    for (const ProfileRow& w : profile_rows(prof, false)) {
      const std::string name = w.op + (w.fused.empty() ? "" : " +" + w.fused);
      std::snprintf(line, sizeof(line), "  %-44s %9.4f %6s%% %9.4f %5zu  %s\n", name.c_str(), w.total_ms / r,
                    pct(w.total_ms).c_str(), w.min_ms, w.instructions, w.kernel.c_str());
      o << line;
    }
    o << "top " << a.profile << " by op and shapes (ms per run, %, fastest, instructions, kernel, op, shapes):\n";
    const auto rows = profile_rows(prof, true);
    for (size_t i = 0; i < rows.size() && i < static_cast<size_t>(a.profile); ++i) {
      const ProfileRow& w = rows[i];
      const std::string name = w.op + (w.fused.empty() ? "" : " +" + w.fused);
      std::snprintf(line, sizeof(line), "  %9.4f %6s%% %9.4f x%-3zu %-8s %s  %s\n", w.total_ms / r,
                    pct(w.total_ms).c_str(), w.min_ms, w.instructions, w.kernel.c_str(), name.c_str(), w.shapes.c_str());
      o << line;
    }
  }
  std::cout << o.str();
  return 0;
}

// ---- kiln report ----

struct ReportArgs {
  std::string file;
  std::string output;
  bool profile = false;
  std::vector<std::string> methods;  ///< methods to profile; empty: all
  int runs = 10;
  int warmup = 2;
  ExecOptions exec;
};

int cmd_report(const ReportArgs& a) {
  if (Error e = check_not_input(a.file, a.output, "--output"); !e.ok()) return usage_fail("report", e);
  auto program = Program::load(a.file, cli_load_options());
  if (!program.ok()) return fail("report", program.error());
  for (const std::string& name : a.methods) {
    if (auto meta = find_method(*program.value(), name); !meta.ok()) return usage_fail("report", meta.error());
  }
  std::vector<tools::ReportProfile> profiles;
  if (a.profile) {
    // Each method timed as `kiln bench --profile` times it (run_bench: seeded random inputs); a method
    // that cannot run here (a backend missing, an input that needs a file) gets its error on the page.
    for (const std::string& name : program.value()->method_names()) {
      if (!a.methods.empty() && std::find(a.methods.begin(), a.methods.end(), name) == a.methods.end()) continue;
      BenchArgs ba;
      ba.file = a.file;
      ba.method = name;
      ba.runs = a.runs;
      ba.warmup = a.warmup;
      ba.exec = a.exec;
      tools::ReportProfile rp;
      rp.method = name;
      rp.runs = a.runs;
      BenchRun br;
      std::ostringstream captured;  // run_bench prints its error; the page shows it too
      std::streambuf* old = std::cerr.rdbuf(captured.rdbuf());
      const int rc = run_bench(ba, "report", true, false, br);
      std::cerr.rdbuf(old);
      if (rc == kExitUsage) {
        std::cerr << captured.str();
        return rc;
      }
      if (rc != 0) {
        std::string msg = captured.str();
        if (msg.rfind("kiln report: ", 0) == 0) msg = msg.substr(13);
        while (!msg.empty() && msg.back() == '\n') msg.pop_back();
        std::cerr << "kiln report: method '" << name << "' not profiled: " << msg << "\n";
        rp.error = msg;
      } else {
        rp.prof = br.prof;
        rp.threads = br.method.pool->num_threads();
        rp.wall_ms_per_run = br.prof_wall_ms / std::max(1, a.runs);
      }
      profiles.push_back(std::move(rp));
    }
  }
  const std::string html = tools::report_html(*program.value(), std::filesystem::path(a.file).filename().string(), profiles);
  if (Error e = write_text(a.output, html); !e.ok()) return fail("report", e);
  std::cout << a.output << "\n";
  return 0;
}

}  // namespace

#ifdef KILN_HAVE_ONNX
// ---- compile: ONNX model -> .kiln ----

struct CompileArgs {
  std::string file;
  std::string output;
  std::vector<std::string> backends;
  std::vector<std::string> input_shapes;
  std::string report_json;
  std::string require_delegation;
  std::string method = "forward";
  bool quiet = false;
};

// "x=1x3x224x224" -> ("x", {1, 3, 224, 224}); InvalidArgument otherwise.
Result<std::pair<std::string, std::vector<int64_t>>> parse_input_shape(const std::string& text) {
  const auto eq = text.rfind('=');
  const auto bad = [&] {
    return Error(ErrorCode::InvalidArgument, "--input-shape '" + text + "': expected NAME=SIZES, e.g. x=1x3x224x224");
  };
  if (eq == std::string::npos || eq == 0 || eq + 1 == text.size()) return bad();
  std::vector<int64_t> sizes;
  std::string dims = text.substr(eq + 1);
  size_t pos = 0;
  while (pos <= dims.size()) {
    size_t next = dims.find_first_of("x,", pos);
    if (next == std::string::npos) next = dims.size();
    const std::string d = dims.substr(pos, next - pos);
    if (d.empty() || d.size() > 12 || d.find_first_not_of("0123456789") != std::string::npos) return bad();
    sizes.push_back(std::stoll(d));
    pos = next + 1;
  }
  return std::make_pair(text.substr(0, eq), sizes);
}

// The compile report as JSON, with the keys of the Python report (python/kiln/capture.py).
std::string report_json(const CompiledProgram& c, const onnx::ImportedModel& m, const CompileArgs& a,
                        const std::vector<std::string>& delegates) {
  std::ostringstream o;
  auto strs = [&](const std::vector<std::string>& v) {
    std::string out = "[";
    for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + json_quote(v[i]);
    return out + "]";
  };
  o << "{\n  \"path\": " << json_quote(a.output) << ",\n  \"source\": " << json_quote(a.file)
    << ",\n  \"onnx\": {\"opset\": " << m.opset << ", \"nodes\": " << m.onnx_nodes << ", \"folded_at_import\": "
    << m.folded_nodes << ", \"inputs\": " << strs(m.input_names) << ", \"outputs\": " << strs(m.output_names)
    << "},\n  \"backends\": " << strs(delegates) << ",\n  \"require_delegation\": "
    << (a.require_delegation.empty() ? std::string("null") : json_quote(a.require_delegation))
    << ",\n  \"constant_bytes\": " << c.constant_bytes << ",\n  \"file_size\": " << c.bytes.size()
    << ",\n  \"methods\": [";
  for (size_t k = 0; k < c.methods.size(); ++k) {
    const MethodReport& r = c.methods[k];
    o << (k ? "," : "") << "\n    {\"name\": " << json_quote(r.name) << ", \"num_nodes\": " << r.num_nodes
      << ", \"num_folded\": " << r.num_folded << ", \"num_bn_folded\": " << r.num_bn_folded
      << ", \"num_hardswish\": " << r.num_hardswish << ", \"num_affine_folded\": " << r.num_affine_folded
      << ", \"num_quick_gelu\": " << r.num_quick_gelu
      << ", \"num_dead\": " << r.num_dead << ", \"arena_bytes\": " << r.arena_bytes
      << ", \"activation_bytes\": " << r.activation_bytes << ", \"constant_bytes\": " << r.constant_bytes
      << ",\n     \"delegation\": {\"backends\": [";
    for (size_t i = 0; i < r.delegation.backends.size(); ++i) {
      const auto& b = r.delegation.backends[i];
      o << (i ? ", " : "") << "{\"backend\": " << json_quote(b.backend) << ", \"segments\": " << b.segments
        << ", \"nodes\": " << b.nodes << ", \"constant_bytes\": " << b.constant_bytes << "}";
    }
    o << "], \"cpu_ops\": [";
    for (size_t i = 0; i < r.delegation.cpu_ops.size(); ++i) {
      const auto& cpu = r.delegation.cpu_ops[i];
      o << (i ? ", " : "") << "{\"op\": " << json_quote(cpu.op) << ", \"count\": " << cpu.count << ", \"reasons\": [";
      for (size_t j = 0; j < cpu.reasons.size(); ++j) {
        o << (j ? ", " : "") << "[" << json_quote(cpu.reasons[j].first) << ", " << json_quote(cpu.reasons[j].second) << "]";
      }
      o << "]}";
    }
    o << "], \"states\": [";
    for (size_t i = 0; i < r.delegation.states.size(); ++i) {
      const auto& st = r.delegation.states[i];
      o << (i ? ", " : "") << "{\"state\": " << json_quote(st.state) << ", \"backend\": " << json_quote(st.backend)
        << ", \"resident\": " << (st.resident ? "true" : "false") << ", \"reason\": " << json_quote(st.reason) << "}";
    }
    o << "]}}";
  }
  o << "\n  ]\n}\n";
  return o.str();
}

int cmd_compile(const CompileArgs& a) {
  const std::string where = "compile";
  for (const auto& [path, option] : {std::pair{a.output, "--output"}, std::pair{a.report_json, "--report-json"}}) {
    if (Error e = check_not_input(a.file, path, option); !e.ok()) return usage_fail(where.c_str(), e);
  }
  onnx::ImportOptions io;
  for (const auto& text : a.input_shapes) {
    auto p = parse_input_shape(text);
    if (!p.ok()) {
      std::cerr << "kiln compile: " << p.error().message() << "\n";
      return kExitUsage;
    }
    if (!io.input_shapes.emplace(p->first, p->second).second) {
      std::cerr << "kiln compile: --input-shape gives input '" << p->first << "' twice\n";
      return kExitUsage;
    }
  }
  CompileOptions co;
  for (const auto& list : a.backends) {  // "--backends cpu,xnnpack" or repeated
    std::stringstream ss(list);
    std::string b;
    while (std::getline(ss, b, ',')) {
      if (b.empty() || b == "cpu" || b == "portable") continue;  // Kiln's own kernels run what no delegate takes
      co.backends.push_back(b);
    }
  }
  co.require_delegation = a.require_delegation;
  if (co.require_delegation == "cpu" || co.require_delegation == "portable") {
    std::cerr << "kiln compile: --require-delegation takes a delegate backend (xnnpack, mlx), not '"
              << co.require_delegation << "': Kiln's own kernels run whatever no delegate takes\n";
    return kExitUsage;
  }
  if (!co.require_delegation.empty()) {
    if (a.backends.empty()) {
      co.backends.push_back(co.require_delegation);  // no --backends: the required one is the one requested
    } else if (std::find(co.backends.begin(), co.backends.end(), co.require_delegation) == co.backends.end()) {
      // "--backends cpu --require-delegation xnnpack" asks for two contradicting things: say so, delegate nothing.
      std::string given;
      for (const auto& list : a.backends) given += (given.empty() ? "" : ",") + list;
      std::cerr << "kiln compile: --require-delegation " << co.require_delegation
                << " is not among the requested backends (--backends " << given << ")\n";
      return kExitUsage;
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto m = onnx::import_model(a.file, io);
  if (!m.ok()) return fail(where, m.error());
  ProgramBuilder pb;
  const size_t graph_nodes = m->graph.nodes().size();
  if (Error e = pb.add_method(a.method, m->graph); !e.ok()) return fail(where, e);
  auto c = pb.compile(co);
  if (!c.ok()) return fail(where, Error(c.error().code(), c.error().message() + "\nnothing was written"));
  const std::string json = a.report_json.empty() ? std::string() : report_json(*c, *m, a, co.backends);
  if (!a.report_json.empty()) {  // the report first: a report that cannot be written leaves no program behind
    std::ofstream f(a.report_json, std::ios::trunc);
    f << json;
    if (!f) return fail(where, Error(ErrorCode::InvalidArgument, "cannot write " + a.report_json));
  }
  if (Error e = write_file(a.output, c->bytes); !e.ok()) return fail(where, e);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (a.quiet) {
    std::cout << a.output << "\n";
    return 0;
  }
  std::string backends;
  for (const auto& b : co.backends) backends += b + " + ";
  std::printf("[kiln] wrote %s: %zu bytes, %.1f s, backends: %sportable/cpu kernels\n", a.output.c_str(),
              c->bytes.size(), secs, backends.c_str());
  std::printf("[kiln]   %s: opset %lld, %zu ONNX nodes (%zu folded at import) -> %zu Kiln nodes before passes\n",
              a.file.c_str(), static_cast<long long>(m->opset), m->onnx_nodes, m->folded_nodes, graph_nodes);
  std::cout << c->report();
  if (!a.report_json.empty()) std::cout << "[kiln]   report: " << a.report_json << "\n";
  for (const auto& n : m->notes) std::cout << "[kiln]   note: " << n << "\n";
  return 0;
}
#endif

int main(int argc, char** argv) {
  CLI::App app{"kiln " KILN_VERSION ": inspect, run and benchmark Kiln program files (.kiln).\n"
               "Every file is verified by the runtime's loader before anything is shown or run.",
               "kiln"};
  // --version also names the cpu kernel target this process would run at (and why a KILN_CPU_TARGET
  // value is refused): the one place that says it without a program file.
  app.set_version_flag("--version", [] {
    std::string compiled;
    for (const std::string& t : compiled_cpu_targets()) compiled += (compiled.empty() ? "" : ", ") + t;
    return std::string("kiln " KILN_VERSION "\ncpu kernels: ") + cpu_target_summary() + "\ncompiled targets: " + compiled;
  });
  app.require_subcommand(1);
  app.footer("Exit status: 0 success, 1 Kiln reported an error (printed as '<ErrorCode>: <message>'),\n"
             "2 command-line usage error.\n"
             "Environment: KILN_CPU_TARGET=avx3_dl|avx3|avx2|sve2|sve|neon|scalar runs the optimized cpu kernels at that\n"
             "instruction set instead of the best one this CPU supports (inspect, run, bench and --version show the\n"
             "target); a value this build or CPU cannot run makes every program load fail (InvalidArgument, exit 1).\n"
             "Run 'kiln <command> --help' for a command's options.");

  InspectArgs ia;
  CLI::App* inspect = app.add_subcommand(
      "inspect", "Show a program's format version, sizes and, per method, its inputs, outputs, instruction and op counts, "
                 "how many kernel calls get an optimized cpu kernel (the rest run portable kernels), its delegate "
                 "segments per backend and planned arena.");
  inspect->add_option("file", ia.file, "Program file (.kiln)")->required();
  inspect->add_flag("--json", ia.json, "Print JSON instead of text (keys: file, format_version, file_size, "
                                       "constant_bytes, cpu_target, cpu_targets_available, cpu_target_env, "
                                       "cpu_targets_compiled, methods[name, inputs, outputs, num_instructions, "
                                       "num_kernel_calls, num_delegate_calls, num_cpu_kernel_calls, "
                                       "num_portable_kernel_calls, arena_bytes, op_counts, cpu_op_counts, "
                                       "delegate_segments, constant_bytes_by_dtype, constant_bytes_by_scheme])");
  inspect->footer("Example: kiln inspect model.kiln --json");

  RunArgs ra;
  CLI::App* run = app.add_subcommand(
      "run", "Run one method on inputs read from NumPy .npy files; print each output's dtype and shape and the "
             "execute time, and write the outputs as .npy files.");
  run->add_option("file", ra.file, "Program file (.kiln)")->required();
  run->add_option("--method,-m", ra.method, "Method to run")->capture_default_str();
  run->add_option("--input,-i", ra.inputs,
                  "Input .npy file, once per method input in order (little-endian, C order; dtypes float32, "
                  "float64, float16, int64, int32, int8, uint8, bool; float32 for a bfloat16 input). Dtype and shape "
                  "must match the method's input exactly.");
  run->add_option("--output-dir,-o", ra.output_dir,
                  "Directory (created if missing) for one .npy file per output, named after the output (as kiln "
                  "inspect lists it; characters other than letters, digits, '.', '-' and '_' become '_'), "
                  "output_<i>.npy for an unnamed one; without it nothing is written");
  run->add_flag("--numbered", ra.numbered,
                "Name the files output_0.npy, output_1.npy, ... by position, whatever the output names");
  add_exec_options(run, ra.exec);
  run->footer("Example: kiln run model.kiln --input x.npy --output-dir out/\n"
              "         python -c \"import numpy as np; print(np.load('out/logits.npy'))\"");

  BenchArgs ba;
  CLI::App* bench = app.add_subcommand(
      "bench", "Time one method: load the program, instantiate the method on a pool of --threads threads, run "
               "--warmup untimed and --runs timed executions, and print min / median / p90 / max latency, load and "
               "method-init time and peak RSS (VmHWM).");
  bench->add_option("file", ba.file, "Program file (.kiln)")->required();
  bench->add_option("--method,-m", ba.method, "Method to time")->capture_default_str();
  bench->add_option("--runs,-r", ba.runs, "Timed executions")->capture_default_str();
  bench->add_option("--warmup,-w", ba.warmup, "Untimed executions before timing")->capture_default_str();
  add_exec_options(bench, ba.exec);
  bench->add_option("--input,--input-npy,-i", ba.inputs,
                    "Input .npy file, once per method input in order (as for 'kiln run'); without any, inputs are "
                    "seeded random data of the method's input types (floats N(0,1), integers in [0, 3]; with symbolic dims: "
                    "each at its symbol's minimum and integer inputs 0, e.g. one decode step of a language model)");
  bench->add_option("--seed", ba.seed, "Seed of the random inputs (0 to 2^64-1)")
      ->check(CLI::Validator(
          [](std::string& v) { return v.find('-') != std::string::npos ? std::string("must be >= 0") : std::string(); },
          "", "non-negative"))
      ->capture_default_str();
  bench->add_option("--profile", ba.profile,
                    "Per-instruction profile: after the timed runs, run --runs more executions with each instruction "
                    "timed (wall clock around its kernel or delegate call) and print the milliseconds per run by op "
                    "and the top N rows by op and argument shapes (with --json: key 'profile'). 0: off")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  bench->add_option("--trace", ba.trace,
                    "Write a Chrome trace-event file (JSON; opens in Perfetto or chrome://tracing): runs --runs more "
                    "executions with each instruction timed (as --profile does) and records one event per execution "
                    "(cat 'run') and one per executed instruction of each (cat 'kernel' or 'delegate'; an instruction "
                    "fused into the one before it has none)")
      ->check(non_empty_path());
  bench->add_flag("--json", ba.json, "Print one JSON object (keys: file, method, threads, kernels, cpu_target, "
                                     "cpu_targets_available, cpu_target_env, runs, warmup, "
                                     "inputs, load_ms, init_ms, min_ms, median_ms, p90_ms, max_ms, mean_ms, "
                                     "peak_rss_mib, kernel_calls, cpu_kernel_calls, portable_kernel_calls, "
                                     "fused_instructions, prepared_mib, delegate_segments, times_ms; profile with --profile)");
  bench->footer("Example: kiln bench mv3.kiln --threads 2 --runs 100 --json\n"
                "         kiln bench mv3.kiln --threads 1 --profile 20   (where the time goes)\n"
                "         kiln bench mv3.kiln --runs 5 --trace trace.json   (a timeline for Perfetto)\n");

  ReportArgs rpa;
  CLI::App* report = app.add_subcommand(
      "report", "Write one self-contained HTML page (inline CSS, no scripts, nothing fetched) showing each method as "
                "the runtime runs it: instructions in order with ops, kernels, shapes and arena offsets, delegate "
                "segments coloured by backend, the nodes left on the CPU with each backend's reason (recorded at "
                "compile time), constants, alternatives; with --profile the time per instruction and per op as bar "
                "charts (docs/report.md).");
  report->add_option("file", rpa.file, "Program file (.kiln)")->required();
  report->add_option("--output,-o", rpa.output, "HTML file to write")->required()->check(non_empty_path());
  report->add_flag("--profile", rpa.profile,
                   "Time every method as `kiln bench --profile` does (seeded random inputs, --warmup, then --runs "
                   "executions with each instruction timed) and add the charts");
  report->add_option("--method,-m", rpa.methods, "With --profile: only these methods (repeat); default all");
  report->add_option("--runs,-r", rpa.runs, "With --profile: timed executions per method")->capture_default_str();
  report->add_option("--warmup,-w", rpa.warmup, "With --profile: untimed executions first")->capture_default_str();
  add_exec_options(report, rpa.exec);
  report->footer("Example: kiln report mv3.kiln --profile -o report.html");

  GenerateArgs ga;
  CLI::App* gen = app.add_subcommand(
      "generate", "Generate token ids with a language model exported by `python -m kiln export-llm`: prefill the "
                  "prompt, then decode one token per call on one session (the KV cache) until --max-new-tokens or an "
                  "eos id (llm.eos_ids). Prints the new ids (comma-separated) and, on stderr, prefill / decode speed, "
                  "time to first token and peak RSS; with --json one object {ids, prompt_tokens, prefill_tokens_per_s, "
                  "decode_tokens_per_s, time_to_first_token_ms, peak_rss_mib}. Token ids only: `python -m kiln "
                  "generate --tokenizer DIR --prompt TEXT` works on text.");
  gen->add_option("file", ga.file, "Program file (.kiln) from export-llm")->required();
  gen->add_option("--prompt-ids", ga.prompt_ids, "Prompt token ids, comma-separated (e.g. 1,2,3)")->required();
  gen->add_option("--max-new-tokens,-n", ga.max_new_tokens, "Tokens to generate at most")->capture_default_str();
  gen->add_option("--temperature", ga.temperature, "0: greedy; > 0: sample from softmax(logits / T)")->capture_default_str();
  gen->add_option("--top-k", ga.top_k, "Keep the k most likely tokens (0: off)")->capture_default_str();
  gen->add_option("--top-p", ga.top_p, "Keep the most likely tokens up to cumulative probability p (1: off)")
      ->capture_default_str();
  gen->add_option("--seed", ga.seed, "Seed of the sampler (0 to 2^64-1; same seed, same tokens)")
      ->check(CLI::Validator(
          [](std::string& v) { return v.find('-') != std::string::npos ? std::string("must be >= 0") : std::string(); },
          "", "non-negative"))
      ->capture_default_str();
  gen->add_flag("--ignore-eos", ga.ignore_eos, "Never choose an eos id (its logit set to -inf before sampling)");
  gen->add_flag("--no-mmap", ga.no_mmap,
                "Read the program into memory (huge pages where the kernel grants them) instead of mapping the file: "
                "load copies the file; for a machine whose page cache cannot hold it in 2 MiB folios "
                "(docs/generative.md \"Huge pages\")");
  gen->add_option("--method,-m", ga.method, "Method to run")->capture_default_str();
  add_exec_options(gen, ga.exec);
  gen->add_flag("--json", ga.json, "Print one JSON object instead of the ids");
  gen->footer("Example: kiln generate llama.kiln --prompt-ids 1,15043,29892 --max-new-tokens 32 --json\n\n"
              "Exit status: 0 generated; 1 the program cannot be loaded (or has no llm.* metadata) or the generation "
              "failed while running; 2 bad arguments, including a request the program's limits refuse before anything "
              "runs: a prompt id outside [0, llm.vocab_size), or prompt + --max-new-tokens past llm.max_seq_len.");

#ifdef KILN_HAVE_ONNX
  CompileArgs ca;
  CLI::App* compile = app.add_subcommand(
      "compile", "Import an ONNX model (default domain, opsets 1 to " + std::to_string(onnx::kMaxOpset) + ") and compile it into a .kiln program: ONNX ops are mapped "
                 "onto Kiln's op set, shape computations are folded for the given input shapes, nodes go to the "
                 "requested delegate backends and the rest to Kiln's CPU kernels. Prints the compiler's report "
                 "(nodes, arena, constants, delegation per backend and why nodes stayed on the CPU).");
  compile->add_option("file", ca.file, "ONNX model (.onnx); external data files are read from its directory")->required();
  compile->add_option("--output,-o", ca.output, "Program file to write (.kiln)")->required();
  compile->add_option("--backends", ca.backends,
                      "Delegate backends in order of preference, comma-separated or repeated (e.g. cpu,xnnpack or "
                      "mlx); 'cpu'/'portable' name Kiln's own kernels, which always run what no delegate takes");
  compile->add_option("--input-shape", ca.input_shapes,
                      "NAME=SIZES for an input with dynamic dims, e.g. x=1x3x640x640 (repeat per input)");
  compile->add_option("--report-json", ca.report_json, "Also write the compile report as JSON");
  compile->add_option("--require-delegation", ca.require_delegation,
                      "Fail (exit 1, listing every node not delegated and why) unless BACKEND takes every node");
  compile->add_option("--method,-m", ca.method, "Name of the program's method")->capture_default_str();
  compile->add_flag("--quiet,-q", ca.quiet, "Print only the written path");
  compile->footer("Example: kiln compile det.onnx --input-shape x=1x3x640x640 --backends cpu,xnnpack -o det.kiln");
#else
  CLI::App* compile = app.add_subcommand(
      "compile", "Import an ONNX model (not in this build: it was built without libonnx-dev / libprotobuf-dev)");
  compile->allow_extras();
#endif

  // Usage errors in one line (the subcommand's --help has the details).
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return std::string("kiln: usage error: ") + e.what() + " (see 'kiln <command> --help')\n";
  });

  if (argc <= 1) {
    std::cerr << app.help();
    return kExitUsage;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : kExitUsage;
  }
  if (inspect->parsed()) return cmd_inspect(ia);
  if (run->parsed()) return cmd_run(ra);
  if (bench->parsed()) return cmd_bench(ba);
  if (gen->parsed()) return cmd_generate(ga);
  if (report->parsed()) return cmd_report(rpa);
#ifdef KILN_HAVE_ONNX
  if (compile->parsed()) return cmd_compile(ca);
#else
  if (compile->parsed()) {
    std::cerr << "kiln compile: NotFound: this kiln was built without the ONNX importer (install libonnx-dev and "
                 "libprotobuf-dev, then rebuild)\n";
    return kExitError;
  }
#endif
  return kExitUsage;
}
