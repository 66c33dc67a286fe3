// The `kiln` command-line tool.
//
//   kiln inspect model.kiln [--json]       what is in a program file (methods, types, ops, memory)
//   kiln run model.kiln --input x.npy --output-dir out/    run a method on .npy inputs
//
// The tool never parses program files itself: everything it shows comes from the runtime's
// verified loader (kiln::Program::load and MethodMeta). Errors go to stderr as
// "kiln <command>: <ErrorCode>: <message>"; exit status 0 on success, 1 when Kiln reports an
// error, 2 for a command-line usage error.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/runtime.h"
#include "kiln/npy.h"

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

// ---- JSON output (a tiny writer: strings are escaped per RFC 8259) ----

std::string json_str(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

std::string json_tensors(const std::vector<std::string>& names, const std::vector<TensorType>& types) {
  std::string out = "[";
  for (size_t i = 0; i < types.size(); ++i) {
    if (i) out += ", ";
    out += "{\"name\": " + json_str(i < names.size() ? names[i] : std::string()) + ", \"dtype\": " +
           json_str(dtype_name(types[i].dtype)) + ", \"sizes\": [";
    for (size_t d = 0; d < types[i].sizes.size(); ++d) out += (d ? ", " : "") + std::to_string(types[i].sizes[d]);
    out += "]}";
  }
  return out + "]";
}

// ---- kiln inspect ----

struct InspectArgs {
  std::string file;
  bool json = false;
};

int cmd_inspect(const InspectArgs& a) {
  auto program = Program::load(a.file);
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
    o << "{\n  \"file\": " << json_str(a.file) << ",\n  \"format_version\": " << p.format_version()
      << ",\n  \"file_size\": " << p.file_size() << ",\n  \"constant_bytes\": " << p.constant_bytes()
      << ",\n  \"methods\": [";
    for (size_t k = 0; k < metas.size(); ++k) {
      const MethodMeta& m = metas[k];
      o << (k ? "," : "") << "\n    {\n      \"name\": " << json_str(m.name)
        << ",\n      \"inputs\": " << json_tensors(m.input_names, m.inputs)
        << ",\n      \"outputs\": " << json_tensors(m.output_names, m.outputs)
        << ",\n      \"num_instructions\": " << m.num_instructions
        << ",\n      \"num_kernel_calls\": " << m.num_kernel_calls
        << ",\n      \"num_delegate_calls\": " << m.num_delegate_calls
        << ",\n      \"arena_bytes\": " << m.arena_bytes << ",\n      \"op_counts\": {";
      for (size_t i = 0; i < m.op_counts.size(); ++i) {
        o << (i ? ", " : "") << json_str(m.op_counts[i].first) << ": " << m.op_counts[i].second;
      }
      o << "}\n    }";
    }
    o << "\n  ]\n}\n";
    std::cout << o.str();
    return 0;
  }

  o << "file            " << a.file << "\n"
    << "format version  " << p.format_version() << "\n"
    << "file size       " << p.file_size() << " bytes\n"
    << "constant bytes  " << p.constant_bytes() << " bytes (stored once, shared by all methods)\n"
    << "methods         " << metas.size() << "\n";
  for (const MethodMeta& m : metas) {
    size_t name_width = 0;
    for (size_t i = 0; i < m.inputs.size(); ++i) name_width = std::max(name_width, display_name(m.input_names, i).size());
    for (size_t i = 0; i < m.outputs.size(); ++i) name_width = std::max(name_width, display_name(m.output_names, i).size());
    auto row = [&](const std::string& name, const TensorType& t) {
      o << "    " << name << std::string(name_width - name.size() + 2, ' ') << t.to_string() << "\n";
    };
    o << "\nmethod '" << m.name << "'\n  inputs\n";
    if (m.inputs.empty()) o << "    (none)\n";
    for (size_t i = 0; i < m.inputs.size(); ++i) row(display_name(m.input_names, i), m.inputs[i]);
    o << "  outputs\n";
    for (size_t i = 0; i < m.outputs.size(); ++i) row(display_name(m.output_names, i), m.outputs[i]);
    o << "  instructions    " << m.num_instructions << " (" << m.num_kernel_calls << " kernel calls, "
      << m.num_delegate_calls << " delegate calls)\n"
      << "  arena           " << m.arena_bytes << " bytes\n"
      << "  ops\n";
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

// ---- kiln run ----

struct RunArgs {
  std::string file;
  std::string method = "forward";
  std::vector<std::string> inputs;
  std::string output_dir;
};

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

int cmd_run(const RunArgs& a) {
  using Clock = std::chrono::steady_clock;
  auto ms = [](Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };

  const auto t0 = Clock::now();
  auto program = Program::load(a.file);
  if (!program.ok()) return fail("run", program.error());
  auto meta = program.value()->method_meta(a.method);
  if (!meta.ok()) {
    std::string names;
    for (const auto& n : program.value()->method_names()) names += (names.empty() ? "" : ", ") + n;
    return fail("run", Error(meta.error().code(), meta.error().message() + " (methods: " + names + ")"));
  }
  const MethodMeta& m = meta.value();
  if (a.inputs.size() != m.inputs.size()) {
    std::string want;
    for (size_t i = 0; i < m.inputs.size(); ++i) {
      want += (i ? ", " : "") + display_name(m.input_names, i) + ": " + m.inputs[i].to_string();
    }
    return fail("run", Error(ErrorCode::InvalidArgument,
                             "method '" + m.name + "' takes " + std::to_string(m.inputs.size()) + " input(s) (" + want +
                                 "), got " + std::to_string(a.inputs.size()) + " --input file(s)"));
  }
  std::vector<npy::Array> arrays;
  for (size_t i = 0; i < a.inputs.size(); ++i) {
    const std::string what = "input '" + display_name(m.input_names, i) + "' (" + a.inputs[i] + ")";
    auto arr = npy::read_file(a.inputs[i]);  // its errors name the file
    if (!arr.ok()) {
      return fail("run", Error(arr.error().code(), "input '" + display_name(m.input_names, i) + "': " + arr.error().message()));
    }
    const TensorType& want = m.inputs[i];
    if (want.dtype == DType::BFloat16 && arr->dtype == DType::Float32) float32_to_bfloat16(arr.value());
    if (arr->dtype != want.dtype) {
      return fail("run", Error(ErrorCode::InvalidArgument, what + ": dtype " + dtype_name(arr->dtype) +
                                                               ", the method expects " + want.to_string()));
    }
    if (arr->shape != want.sizes) {
      return fail("run", Error(ErrorCode::InvalidArgument, what + ": shape " + sizes_to_string(arr->shape) +
                                                               ", the method expects " + want.to_string()));
    }
    arrays.push_back(std::move(arr.value()));
  }
  auto method = program.value()->load_method(a.method);
  if (!method.ok()) return fail("run", method.error());
  const auto t1 = Clock::now();

  std::vector<Tensor> inputs;
  for (npy::Array& arr : arrays) inputs.push_back(arr.view());
  const auto t2 = Clock::now();
  auto outputs = method->execute(inputs);
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
  for (size_t i = 0; i < outputs->size(); ++i) {
    const Tensor& t = (*outputs)[i];
    std::string line = "output " + std::to_string(i) + " '" + display_name(m.output_names, i) + "': " + t.type().to_string();
    if (!a.output_dir.empty()) {
      const std::string path = (std::filesystem::path(a.output_dir) / ("output_" + std::to_string(i) + ".npy")).string();
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
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kiln " KILN_VERSION ": inspect and run Kiln program files (.kiln).\n"
               "Every file is verified by the runtime's loader before anything is shown or run.",
               "kiln"};
  app.set_version_flag("--version", KILN_VERSION);
  app.require_subcommand(1);
  app.footer("Exit status: 0 success, 1 Kiln reported an error (printed as '<ErrorCode>: <message>'),\n"
             "2 command-line usage error.\n"
             "Run 'kiln <command> --help' for a command's options.");

  InspectArgs ia;
  CLI::App* inspect = app.add_subcommand(
      "inspect", "Show a program's format version, sizes and, per method, its inputs, outputs, instruction and op counts "
                 "and planned arena.");
  inspect->add_option("file", ia.file, "Program file (.kiln)")->required();
  inspect->add_flag("--json", ia.json, "Print JSON instead of text (keys: file, format_version, file_size, "
                                       "constant_bytes, methods[name, inputs, outputs, num_instructions, "
                                       "num_kernel_calls, num_delegate_calls, arena_bytes, op_counts])");
  inspect->footer("Example: kiln inspect model.kiln --json");

  RunArgs ra;
  CLI::App* run = app.add_subcommand(
      "run", "Run one method on inputs read from NumPy .npy files; print each output's dtype and shape and the "
             "execute time, and write the outputs as .npy files.");
  run->add_option("file", ra.file, "Program file (.kiln)")->required();
  run->add_option("--method,-m", ra.method, "Method to run")->capture_default_str();
  run->add_option("--input,-i", ra.inputs,
                  "Input .npy file, once per method input in order (little-endian, C order; dtypes float32, "
                  "float16, int64, int32, int8, uint8, bool; float32 for a bfloat16 input). Dtype and shape "
                  "must match the method's input exactly.");
  run->add_option("--output-dir,-o", ra.output_dir,
                  "Directory (created if missing) for output_0.npy, output_1.npy, ...; without it nothing is written");
  run->footer("Example: kiln run model.kiln --input x.npy --output-dir out/\n"
              "         python -c \"import numpy as np; print(np.load('out/output_0.npy'))\"");

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
  return kExitUsage;
}
