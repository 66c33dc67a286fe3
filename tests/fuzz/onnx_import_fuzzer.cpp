// libFuzzer target: untrusted bytes through the ONNX importer (kiln::onnx::import_model_bytes,
// src/frontends/onnx) and, when the import succeeds, the compiler and the loader:
//   1. Graph inputs with symbolic or unknown dims get static sizes (dim 0 -> 1, others -> 64; the
//      harness reads the graph inputs from its own parse of the ModelProto), so that models such
//      as PP-OCR's (batch x 3 x H x W) get past the input shapes into the converters.
//   2. import_model_bytes with no base directory (external data is refused, nothing is read from
//      disk) and ImportOptions::max_constant_bytes = 16 MiB (the harness's memory bound).
//   3. When every value of the imported graph fits in 256 MiB in total (the harness's resource
//      limit, as in load_fuzzer.cpp): compile with the default options (constant folding, dead
//      code elimination, batch-norm folding, memory planning, serialization). A compiled program
//      must load (Program::load_from_buffer, then load_method): an error there aborts (a finding).
// KILN_FUZZ_VERBOSE=1 prints each input's outcome (to see how far the seeds get).
// Errors of the import or the compile are fine; crashes, sanitizer reports, exceptions and
// allocations the file's sizes did not justify are bugs.
#include <cstdio>
#include <cstdlib>

#include <google/protobuf/io/coded_stream.h>

#include "frontends/onnx/importer_internal.h"
#include "kiln/onnx.h"
#include "kiln/runtime.h"

namespace {

constexpr uint64_t kMaxGraphBytes = 256ull << 20;

kiln::onnx::ImportOptions options_for(const uint8_t* data, size_t size) {
  kiln::onnx::ImportOptions o;
  o.max_constant_bytes = 16ull << 20;
  ::onnx::ModelProto model;
  google::protobuf::io::CodedInputStream in(data, static_cast<int>(size));
  in.SetRecursionLimit(64);
  if (!model.ParseFromCodedStream(&in)) return o;
  std::set<std::string> initializers;
  for (const auto& t : model.graph().initializer()) initializers.insert(t.name());
  for (const auto& vi : model.graph().input()) {
    if (initializers.count(vi.name()) || !vi.type().has_tensor_type() || !vi.type().tensor_type().has_shape()) continue;
    const auto& dims = vi.type().tensor_type().shape().dim();
    if (dims.size() > 16) continue;
    bool dynamic = false;
    std::vector<int64_t> sizes;
    for (int i = 0; i < dims.size(); ++i) {
      const bool known = dims[i].has_dim_value() && dims[i].dim_value() >= 0;
      dynamic |= !known;
      sizes.push_back(known ? dims[i].dim_value() : (i == 0 ? 1 : 64));
    }
    if (dynamic) o.input_shapes[vi.name()] = sizes;
  }
  return o;
}

uint64_t graph_bytes(const kiln::Graph& g) {
  uint64_t total = 0;
  for (const kiln::Value& v : g.values()) {
    uint64_t n = kiln::dtype_size(v.type.dtype);
    for (int64_t d : v.type.sizes) {
      if (d < 0) return UINT64_MAX;
      if (d != 0 && n > kMaxGraphBytes / static_cast<uint64_t>(d)) return UINT64_MAX;
      n *= static_cast<uint64_t>(d);
    }
    total += n;
    if (total > kMaxGraphBytes) return UINT64_MAX;
  }
  return total;
}

[[noreturn]] void finding(const char* what, const kiln::Error& e) {
  std::fprintf(stderr, "kiln_onnx_import_fuzzer: %s: %s\n", what, e.to_string().c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool verbose = std::getenv("KILN_FUZZ_VERBOSE") != nullptr;
  if (size > (1u << 30)) return 0;
  const kiln::onnx::ImportOptions options = options_for(data, size);
  auto m = kiln::onnx::import_model_bytes(std::span<const uint8_t>(data, size), "", options);
  if (!m.ok()) {
    if (verbose) std::fprintf(stderr, "import: %s\n", m.error().to_string().c_str());
    return 0;
  }
  if (graph_bytes(m->graph) > kMaxGraphBytes) {
    if (verbose) std::fprintf(stderr, "imported; values above the harness's 256 MiB: not compiled\n");
    return 0;
  }
  kiln::ProgramBuilder pb;
  if (!pb.add_method("forward", std::move(m->graph)).ok()) return 0;
  auto compiled = pb.compile();
  if (!compiled.ok()) {
    if (verbose) std::fprintf(stderr, "imported; compile: %s\n", compiled.error().to_string().c_str());
    return 0;
  }
  if (verbose) std::fprintf(stderr, "imported, compiled and loaded\n");
  auto program = kiln::Program::load_from_buffer(compiled->bytes);
  if (!program.ok()) finding("a program the compiler wrote does not load", program.error());
  static kiln::ThreadPool pool(1);
  kiln::MethodOptions mo;
  mo.pool = &pool;
  auto method = (*program)->load_method("forward", mo);
  if (!method.ok()) finding("a method the compiler wrote does not load", method.error());
  return 0;
}
