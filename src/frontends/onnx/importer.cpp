// ONNX importer: reads a ModelProto (libonnx-dev's generated protobuf classes), validates
// everything it reads (tensor sizes and byte lengths, external data paths, value names, opset),
// and walks the graph in order, converting each node with its converter (ops.cpp) into Kiln ATen
// nodes. Nodes whose inputs are all constants are evaluated right away by the portable kernels
// (NodeCtx::emit), so shape-computing subgraphs (Shape -> Gather -> Concat -> Reshape) become
// constants for the given static input shapes.
//
// Semantics source: the ONNX operator specification, https://onnx.ai/onnx/operators/ (Changelog.md
// for older opset versions) and onnx.proto for the file format.
#include <google/protobuf/io/coded_stream.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <new>
#include <stdexcept>

#include "frontends/onnx/importer_internal.h"
#include "kernels/kernel.h"

namespace kiln::onnx {
namespace detail {
namespace {

Error invalid_program(std::string msg) { return Error(ErrorCode::InvalidProgram, std::move(msg)); }
Error not_supported(std::string msg) { return Error(ErrorCode::NotSupported, std::move(msg)); }

constexpr int64_t kMaxElements = int64_t{1} << 40;

}  // namespace

std::string onnx_type_name(int t) {
  switch (t) {
    case ::onnx::TensorProto::FLOAT: return "FLOAT";
    case ::onnx::TensorProto::UINT8: return "UINT8";
    case ::onnx::TensorProto::INT8: return "INT8";
    case ::onnx::TensorProto::UINT16: return "UINT16";
    case ::onnx::TensorProto::INT16: return "INT16";
    case ::onnx::TensorProto::INT32: return "INT32";
    case ::onnx::TensorProto::INT64: return "INT64";
    case ::onnx::TensorProto::STRING: return "STRING";
    case ::onnx::TensorProto::BOOL: return "BOOL";
    case ::onnx::TensorProto::FLOAT16: return "FLOAT16";
    case ::onnx::TensorProto::DOUBLE: return "DOUBLE";
    case ::onnx::TensorProto::UINT32: return "UINT32";
    case ::onnx::TensorProto::UINT64: return "UINT64";
    case ::onnx::TensorProto::COMPLEX64: return "COMPLEX64";
    case ::onnx::TensorProto::COMPLEX128: return "COMPLEX128";
    case ::onnx::TensorProto::BFLOAT16: return "BFLOAT16";
    // Later element types (onnx.proto of ONNX 1.14+; Debian's libonnx-dev 1.12 headers lack them).
    case 17: return "FLOAT8E4M3FN";
    case 18: return "FLOAT8E4M3FNUZ";
    case 19: return "FLOAT8E5M2";
    case 20: return "FLOAT8E5M2FNUZ";
    case 21: return "UINT4";
    case 22: return "INT4";
    case 23: return "FLOAT4E2M1";
    default: return "type " + std::to_string(t);
  }
}

Result<DType> kiln_dtype(int t) {
  switch (t) {
    case ::onnx::TensorProto::FLOAT: return DType::Float32;
    case ::onnx::TensorProto::FLOAT16: return DType::Float16;
    case ::onnx::TensorProto::BFLOAT16: return DType::BFloat16;
    case ::onnx::TensorProto::INT64: return DType::Int64;
    case ::onnx::TensorProto::INT32: return DType::Int32;
    case ::onnx::TensorProto::INT8: return DType::Int8;
    case ::onnx::TensorProto::UINT8: return DType::UInt8;
    case ::onnx::TensorProto::BOOL: return DType::Bool;
    case ::onnx::TensorProto::DOUBLE: return DType::Float64;
    default:
      return not_supported("element type " + onnx_type_name(t) +
                           " is not a Kiln dtype (float32, float16, bfloat16, float64, int64, int32, int8, uint8, bool)");
  }
}

namespace {

// Reads `length` bytes at `offset` of the external data file `location`, which must be a relative
// path that stays inside base_dir (no absolute paths, no "..", no symlink escaping it).
Result<std::vector<uint8_t>> read_external(const ::onnx::TensorProto& t, const std::string& base_dir,
                                          const std::string& what, size_t expected) {
  std::string location;
  int64_t offset = 0, length = -1;
  for (const auto& kv : t.external_data()) {
    auto parse = [&](int64_t& out) -> Error {
      const std::string& s = kv.value();
      if (s.empty() || s.size() > 18 || !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        return invalid_program(what + ": external data " + kv.key() + " '" + s + "' is not a non-negative integer");
      }
      out = std::stoll(s);
      return {};
    };
    if (kv.key() == "location") location = kv.value();
    else if (kv.key() == "offset") KILN_RETURN_IF_ERROR(parse(offset));
    else if (kv.key() == "length") KILN_RETURN_IF_ERROR(parse(length));
    // "checksum" and unknown keys do not change the bytes read.
  }
  if (location.empty()) return invalid_program(what + ": external data without a location");
  if (base_dir.empty()) return invalid_program(what + ": external data '" + location + "' but the model was not read from a file");
  namespace fs = std::filesystem;
  const fs::path rel(location);
  if (rel.is_absolute() || location.find('\0') != std::string::npos) {
    return invalid_program(what + ": external data location '" + location + "' must be relative to the model's directory");
  }
  for (const auto& part : rel) {
    if (part == "..") return invalid_program(what + ": external data location '" + location + "' leaves the model's directory");
  }
  std::error_code ec;
  const fs::path base = fs::weakly_canonical(fs::path(base_dir), ec);
  if (ec) return Error(ErrorCode::NotFound, what + ": cannot resolve model directory '" + base_dir + "'");
  const fs::path full = fs::weakly_canonical(base / rel, ec);
  if (ec) return Error(ErrorCode::NotFound, what + ": cannot resolve external data '" + location + "'");
  const std::string b = base.string(), f = full.string();
  if (f.size() <= b.size() || f.compare(0, b.size(), b) != 0 || (f[b.size()] != '/' && b.back() != '/')) {
    return invalid_program(what + ": external data '" + location + "' resolves outside the model's directory");
  }
  if (!fs::is_regular_file(full, ec)) return Error(ErrorCode::NotFound, what + ": external data file '" + location + "' not found");
  const uintmax_t size = fs::file_size(full, ec);
  if (ec) return Error(ErrorCode::NotFound, what + ": cannot stat external data '" + location + "'");
  if (length < 0) length = static_cast<int64_t>(expected);
  if (static_cast<uint64_t>(length) != expected) {
    return invalid_program(what + ": external data length " + std::to_string(length) + " but the tensor needs " +
                           std::to_string(expected) + " bytes");
  }
  if (static_cast<uintmax_t>(offset) > size || size - static_cast<uintmax_t>(offset) < static_cast<uintmax_t>(length)) {
    return invalid_program(what + ": external data '" + location + "' range [" + std::to_string(offset) + ", +" +
                           std::to_string(length) + ") exceeds the file's " + std::to_string(size) + " bytes");
  }
  std::ifstream in(full, std::ios::binary);
  if (!in) return Error(ErrorCode::NotFound, what + ": cannot open external data '" + location + "'");
  std::vector<uint8_t> bytes(expected);
  in.seekg(offset);
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(expected));
  if (!in) return Error(ErrorCode::NotFound, what + ": cannot read external data '" + location + "'");
  return bytes;
}

template <typename Dst, typename Src>
void store_as(std::vector<uint8_t>& bytes, const Src& src) {
  for (int i = 0; i < src.size(); ++i) {
    const Dst v = static_cast<Dst>(src.Get(i));
    std::memcpy(bytes.data() + static_cast<size_t>(i) * sizeof(Dst), &v, sizeof(Dst));
  }
}

}  // namespace

Result<HostTensor> read_tensor(const ::onnx::TensorProto& t, const std::string& base_dir, const std::string& what) {
  if (t.has_segment()) return not_supported(what + ": segmented tensors are not supported");
  auto dt = kiln_dtype(t.data_type());
  if (!dt.ok()) return Error(dt.error().code(), what + ": " + dt.error().message());
  HostTensor h;
  h.type.dtype = *dt;
  int64_t numel = 1;
  for (int64_t d : t.dims()) {
    if (d < 0) return invalid_program(what + ": negative dimension " + std::to_string(d));
    if (d > 0 && numel > kMaxElements / d) return invalid_program(what + ": too many elements");
    numel *= d;
    h.type.sizes.push_back(d);
  }
  const size_t nbytes = static_cast<size_t>(numel) * dtype_size(h.type.dtype);
  auto count_error = [&](const char* field, int64_t got) {
    return invalid_program(what + ": " + std::string(field) + " holds " + std::to_string(got) + " values but " +
                           h.type.to_string() + " has " + std::to_string(numel) + " elements");
  };
  if (t.data_location() == ::onnx::TensorProto::EXTERNAL) {
    auto bytes = read_external(t, base_dir, what, nbytes);
    if (!bytes.ok()) return bytes.error();
    h.bytes = std::move(bytes).value();
    return h;
  }
  if (t.has_raw_data()) {
    if (t.raw_data().size() != nbytes) {
      return invalid_program(what + ": raw_data has " + std::to_string(t.raw_data().size()) + " bytes but " +
                             h.type.to_string() + " needs " + std::to_string(nbytes));
    }
    h.bytes.assign(t.raw_data().begin(), t.raw_data().end());
    if (h.type.dtype == DType::Bool) {
      for (uint8_t& b : h.bytes) b = b != 0;
    }
    return h;
  }
  // Typed fields: the value count must match before anything is allocated.
  int64_t stored = 0;
  const char* field = "int32_data";
  switch (h.type.dtype) {
    case DType::Float32: stored = t.float_data_size(), field = "float_data"; break;
    case DType::Int64: stored = t.int64_data_size(), field = "int64_data"; break;
    case DType::Float64: stored = t.double_data_size(), field = "double_data"; break;
    default: stored = t.int32_data_size(); break;
  }
  if (stored != numel) return count_error(field, stored);
  h.bytes.assign(nbytes, 0);
  switch (h.type.dtype) {
    case DType::Float32:
      if (t.float_data_size() != numel) return count_error("float_data", t.float_data_size());
      store_as<float>(h.bytes, t.float_data());
      break;
    case DType::Int64:
      if (t.int64_data_size() != numel) return count_error("int64_data", t.int64_data_size());
      store_as<int64_t>(h.bytes, t.int64_data());
      break;
    case DType::Float64:
      if (t.double_data_size() != numel) return count_error("double_data", t.double_data_size());
      store_as<double>(h.bytes, t.double_data());
      break;
    case DType::Int32:
      if (t.int32_data_size() != numel) return count_error("int32_data", t.int32_data_size());
      store_as<int32_t>(h.bytes, t.int32_data());
      break;
    case DType::Int8:
      if (t.int32_data_size() != numel) return count_error("int32_data", t.int32_data_size());
      store_as<int8_t>(h.bytes, t.int32_data());
      break;
    case DType::UInt8:
      if (t.int32_data_size() != numel) return count_error("int32_data", t.int32_data_size());
      store_as<uint8_t>(h.bytes, t.int32_data());
      break;
    case DType::Bool:
      if (t.int32_data_size() != numel) return count_error("int32_data", t.int32_data_size());
      for (int i = 0; i < t.int32_data_size(); ++i) h.bytes[static_cast<size_t>(i)] = t.int32_data(i) != 0;
      break;
    case DType::Float16:
    case DType::BFloat16:  // bit patterns in int32_data (onnx.proto)
      if (t.int32_data_size() != numel) return count_error("int32_data", t.int32_data_size());
      store_as<uint16_t>(h.bytes, t.int32_data());
      break;
  }
  return h;
}

// ---- NodeCtx ----

std::string NodeCtx::where() const {
  return "node '" + node.name() + "' (#" + std::to_string(index) + ", " + node.op_type() + ")";
}
Error NodeCtx::unsupported(const std::string& msg) const { return Error(ErrorCode::NotSupported, where() + ": " + msg); }
Error NodeCtx::invalid(const std::string& msg) const { return Error(ErrorCode::InvalidProgram, where() + ": " + msg); }

Result<ValueId> NodeCtx::opt_input(int i) const {
  if (!has_input(i)) return kNoValue;
  auto it = im.names.find(node.input(i));
  if (it == im.names.end()) {
    return invalid("input " + std::to_string(i) + " '" + node.input(i) +
                   "' is not defined before this node (dangling name, or a cycle)");
  }
  return it->second;
}

Result<ValueId> NodeCtx::input(int i) const {
  if (!has_input(i)) return invalid("missing required input " + std::to_string(i));
  return opt_input(i);
}

namespace {
template <typename T>
T load(const uint8_t* p, size_t i) {
  T v;
  std::memcpy(&v, p + i * sizeof(T), sizeof(T));
  return v;
}
}  // namespace

Result<std::vector<double>> NodeCtx::const_floats(ValueId v, const std::string& what) const {
  if (!is_const(v)) return unsupported(what + " must be a constant (after folding for the given input shapes)");
  const Value& val = im.graph.value(v);
  const uint8_t* p = val.constant->data();
  const size_t n = static_cast<size_t>(val.type.numel());
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i) {
    switch (val.type.dtype) {
      case DType::Float32: out[i] = load<float>(p, i); break;
      case DType::Float64: out[i] = load<double>(p, i); break;
      case DType::Float16: out[i] = half_to_float(load<uint16_t>(p, i)); break;
      case DType::BFloat16: out[i] = bfloat16_to_float(load<uint16_t>(p, i)); break;
      case DType::Int64: out[i] = static_cast<double>(load<int64_t>(p, i)); break;
      case DType::Int32: out[i] = load<int32_t>(p, i); break;
      case DType::Int8: out[i] = load<int8_t>(p, i); break;
      case DType::UInt8: out[i] = load<uint8_t>(p, i); break;
      case DType::Bool: out[i] = load<uint8_t>(p, i) != 0; break;
    }
  }
  return out;
}

Result<std::vector<int64_t>> NodeCtx::const_ints(ValueId v, const std::string& what) const {
  if (!is_const(v)) return unsupported(what + " must be a constant (after folding for the given input shapes)");
  const Value& val = im.graph.value(v);
  if (is_floating(val.type.dtype)) return invalid(what + " must be an integer tensor, got " + val.type.to_string());
  const uint8_t* p = val.constant->data();
  const size_t n = static_cast<size_t>(val.type.numel());
  std::vector<int64_t> out(n);
  for (size_t i = 0; i < n; ++i) {
    switch (val.type.dtype) {
      case DType::Int64: out[i] = load<int64_t>(p, i); break;
      case DType::Int32: out[i] = load<int32_t>(p, i); break;
      case DType::Int8: out[i] = load<int8_t>(p, i); break;
      case DType::UInt8: out[i] = load<uint8_t>(p, i); break;
      case DType::Bool: out[i] = load<uint8_t>(p, i) != 0; break;
      default: break;
    }
  }
  return out;
}

const ::onnx::AttributeProto* NodeCtx::attr(const std::string& name) {
  for (const auto& a : node.attribute()) {
    if (a.name() == name) {
      used_attrs.insert(name);
      return &a;
    }
  }
  return nullptr;
}

bool NodeCtx::has_attr(const std::string& name) const {
  for (const auto& a : node.attribute()) {
    if (a.name() == name) return true;
  }
  return false;
}

namespace {
bool kind_is(const ::onnx::AttributeProto& a, ::onnx::AttributeProto::AttributeType t) {
  return a.type() == t || a.type() == ::onnx::AttributeProto::UNDEFINED;
}
}  // namespace

Result<int64_t> NodeCtx::attr_int(const std::string& name, int64_t fallback) {
  const auto* a = attr(name);
  if (!a) return fallback;
  if (!kind_is(*a, ::onnx::AttributeProto::INT)) return invalid("attribute '" + name + "' must be an int");
  return a->i();
}
Result<double> NodeCtx::attr_float(const std::string& name, double fallback) {
  const auto* a = attr(name);
  if (!a) return fallback;
  if (!kind_is(*a, ::onnx::AttributeProto::FLOAT)) return invalid("attribute '" + name + "' must be a float");
  return static_cast<double>(a->f());
}
Result<std::string> NodeCtx::attr_string(const std::string& name, const std::string& fallback) {
  const auto* a = attr(name);
  if (!a) return fallback;
  if (!kind_is(*a, ::onnx::AttributeProto::STRING)) return invalid("attribute '" + name + "' must be a string");
  return a->s();
}
Result<std::vector<int64_t>> NodeCtx::attr_ints(const std::string& name, const std::vector<int64_t>& fallback) {
  const auto* a = attr(name);
  if (!a) return fallback;
  if (!kind_is(*a, ::onnx::AttributeProto::INTS)) return invalid("attribute '" + name + "' must be a list of ints");
  return std::vector<int64_t>(a->ints().begin(), a->ints().end());
}
Result<std::vector<double>> NodeCtx::attr_floats(const std::string& name, const std::vector<double>& fallback) {
  const auto* a = attr(name);
  if (!a) return fallback;
  if (!kind_is(*a, ::onnx::AttributeProto::FLOATS)) return invalid("attribute '" + name + "' must be a list of floats");
  return std::vector<double>(a->floats().begin(), a->floats().end());
}

Result<ValueId> NodeCtx::emit(const std::string& op, std::vector<ValueId> inputs, const Attributes& attrs) {
  const std::string debug = node.name().empty() ? node.op_type() + "#" + std::to_string(index) : node.name();
  auto outs = im.graph.add_node(op, inputs, attrs, debug);
  if (!outs.ok()) {
    const ErrorCode code = outs.error().code() == ErrorCode::InvalidArgument ? ErrorCode::InvalidProgram : outs.error().code();
    return Error(code, where() + ": " + outs.error().message());
  }
  if (outs->size() != 1) return Error(ErrorCode::Internal, where() + ": " + op + " has " + std::to_string(outs->size()) + " outputs");
  const ValueId out = (*outs)[0];
  // Evaluate now when every input is a constant (the compiler's fold_constants, done eagerly).
  bool all_const = !inputs.empty();
  for (ValueId in : inputs) {
    if (in != kNoValue && !is_const(in)) all_const = false;
  }
  KernelFn fn = all_const ? KernelRegistry::get().find(op) : nullptr;
  if (fn == nullptr) return out;
  if (static_cast<double>(im.graph.value(out).type.numel()) * static_cast<double>(dtype_size(im.graph.value(out).type.dtype)) >
      im.max_constant_bytes) {
    return out;  // too large to evaluate here: left to the compiler (and its memory limits)
  }
  auto& values = im.graph.mutable_values();
  std::vector<Tensor> in_t(inputs.size());
  std::vector<const Tensor*> in_p;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i] == kNoValue) {
      in_p.push_back(nullptr);
      continue;
    }
    const Value& v = values[static_cast<size_t>(inputs[i])];
    in_t[i] = Tensor{v.type.dtype, v.type.sizes, const_cast<uint8_t*>(v.constant->data())};
    in_p.push_back(&in_t[i]);
  }
  const TensorType ot = values[static_cast<size_t>(out)].type;
  std::vector<uint8_t> bytes(ot.nbytes());
  Tensor out_t{ot.dtype, ot.sizes, bytes.data()};
  Tensor* out_p = &out_t;
  Error err = fn(KernelArgs{in_p, std::span<Tensor* const>(&out_p, 1), im.graph.nodes().back().attrs, nullptr});
  if (!err.ok()) {
    if (err.code() == ErrorCode::NotSupported) return out;  // left to the compiler / runtime to report
    return Error(err.code(), where() + ": evaluating " + op + " on constants: " + err.message());
  }
  values[static_cast<size_t>(out)].constant = std::make_shared<const std::vector<uint8_t>>(std::move(bytes));
  im.graph.mutable_nodes().pop_back();
  return out;
}

Error NodeCtx::check_constant_size(double elements, double element_bytes, const std::string& what) const {
  if (!(elements >= 0) || elements * element_bytes > im.max_constant_bytes) {
    const auto limit = static_cast<uint64_t>(im.max_constant_bytes);
    const std::string text = limit % (uint64_t{1} << 30) == 0 ? std::to_string(limit >> 30) + " GiB"
                             : limit % (uint64_t{1} << 20) == 0 ? std::to_string(limit >> 20) + " MiB"
                                                               : std::to_string(limit) + " bytes";
    return unsupported(what + " would be a constant of more than " + text);
  }
  return {};
}

Result<ValueId> NodeCtx::constant(TensorType type, std::vector<uint8_t> bytes) {
  auto r = im.graph.add_constant(node.name() + ":const", std::move(type), std::move(bytes));
  if (!r.ok()) return Error(ErrorCode::Internal, where() + ": " + r.error().message());
  return r;
}

Result<ValueId> NodeCtx::scalar(DType dtype, double v) {
  // An integer dtype takes v truncated, when that fits (a float-to-integer conversion out of range
  // is undefined; v may come from a file's float attribute, e.g. Elu's alpha on a uint8 input).
  auto fits = [&](double lo, double hi) { return v > lo && v < hi; };  // false for NaN
  bool ok = true;
  switch (dtype) {
    case DType::Int64: ok = v >= -0x1p63 && v < 0x1p63; break;
    case DType::Int32: ok = fits(-2147483649.0, 2147483648.0); break;
    case DType::Int8: ok = fits(-129.0, 128.0); break;
    case DType::UInt8: ok = fits(-1.0, 256.0); break;
    default: break;
  }
  if (!ok) return unsupported("the constant " + std::to_string(v) + " does not fit " + dtype_name(dtype));
  std::vector<uint8_t> b(dtype_size(dtype));
  auto put = [&](auto x) { std::memcpy(b.data(), &x, sizeof(x)); };
  switch (dtype) {
    case DType::Float32: put(static_cast<float>(v)); break;
    case DType::Float64: put(v); break;
    case DType::Float16: put(float_to_half(static_cast<float>(v))); break;
    case DType::BFloat16: put(float_to_bfloat16(static_cast<float>(v))); break;
    case DType::Int64: put(static_cast<int64_t>(v)); break;
    case DType::Int32: put(static_cast<int32_t>(v)); break;
    case DType::Int8: put(static_cast<int8_t>(v)); break;
    case DType::UInt8: put(static_cast<uint8_t>(v)); break;
    case DType::Bool: put(static_cast<uint8_t>(v != 0)); break;
  }
  return constant(TensorType{dtype, {}}, std::move(b));
}

Result<ValueId> NodeCtx::int64_vector(const std::vector<int64_t>& v) {
  std::vector<uint8_t> b(v.size() * 8);
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return constant(TensorType{DType::Int64, {static_cast<int64_t>(v.size())}}, std::move(b));
}

Error NodeCtx::set_output(int i, ValueId v) {
  if (!has_output(i)) return {};
  const std::string& name = node.output(i);
  if (im.names.count(name)) return invalid("output '" + name + "' is defined twice");
  im.names[name] = v;
  return {};
}

// ---- the model ----

namespace {

Result<TensorType> input_type(const ::onnx::ValueInfoProto& vi, const ImportOptions& options) {
  const std::string what = "graph input '" + vi.name() + "'";
  if (!vi.type().has_tensor_type()) return not_supported(what + ": not a tensor (sequences, maps, optionals are not supported)");
  const auto& tt = vi.type().tensor_type();
  auto dt = kiln_dtype(tt.elem_type());
  if (!dt.ok()) return Error(dt.error().code(), what + ": " + dt.error().message());
  TensorType type{*dt, {}};
  auto given = options.input_shapes.find(vi.name());
  bool dynamic = !tt.has_shape();
  std::string shape_text;
  if (tt.has_shape()) {
    for (const auto& d : tt.shape().dim()) {
      if (d.has_dim_value() && d.dim_value() >= 0) {
        type.sizes.push_back(d.dim_value());
        shape_text += (shape_text.empty() ? "" : "x") + std::to_string(d.dim_value());
      } else {
        dynamic = true;
        type.sizes.push_back(-1);
        shape_text += (shape_text.empty() ? "" : "x") + (d.has_dim_param() ? d.dim_param() : std::string("?"));
      }
    }
  }
  if (given != options.input_shapes.end()) {
    const auto& s = given->second;
    if (tt.has_shape() && static_cast<int>(s.size()) != tt.shape().dim_size()) {
      return Error(ErrorCode::InvalidArgument, what + " has rank " + std::to_string(tt.shape().dim_size()) + " (" +
                                                   shape_text + ") but --input-shape gives " + sizes_to_string(s));
    }
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] < 0 || s[i] > (int64_t{1} << 31)) {
        return Error(ErrorCode::InvalidArgument, what + ": bad size " + std::to_string(s[i]) + " in the given shape");
      }
      if (tt.has_shape() && type.sizes[i] >= 0 && type.sizes[i] != s[i]) {
        return Error(ErrorCode::InvalidArgument, what + " has static size " + std::to_string(type.sizes[i]) + " in dim " +
                                                     std::to_string(i) + " (" + shape_text + ") but the given shape is " +
                                                     sizes_to_string(s));
      }
    }
    type.sizes = s;
  }
  double numel = 1;
  for (int64_t d : type.sizes) numel *= static_cast<double>(std::max<int64_t>(d, 0));
  if (numel > double(int64_t{1} << 40)) {
    return Error(ErrorCode::InvalidArgument, what + ": " + sizes_to_string(type.sizes) + " has too many elements");
  }
  if (given != options.input_shapes.end()) {
    return type;
  }
  if (dynamic) {
    return Error(ErrorCode::InvalidArgument, what + " has dynamic shape " + (tt.has_shape() ? shape_text : "(unknown)") +
                                                 ": give static sizes, e.g. --input-shape " + vi.name() + "=1x3x224x224");
  }
  return type;
}

Error convert_nodes(Importer& im, const ::onnx::GraphProto& g);

constexpr int kMaxSubgraphDepth = 16;     ///< nested If / Loop bodies
constexpr int64_t kMaxLoopUnroll = 4096;  ///< iterations of one folded Loop
constexpr size_t kMaxUnrolledNodes = 1u << 20;  ///< ONNX nodes converted in all, unrolled bodies included

// Converts a subgraph (an If branch or a Loop body) into the importer's graph: its inputs are
// bound to `inputs`, its initializers become constants, outer-scope names stay visible and the
// subgraph's own names are dropped afterwards (they may shadow outer ones). Returns the values of
// its outputs.
Result<std::vector<ValueId>> inline_graph(NodeCtx& ctx, const ::onnx::GraphProto& g, const std::vector<ValueId>& inputs,
                                          const std::string& what) {
  Importer& im = ctx.im;
  if (im.depth >= kMaxSubgraphDepth) return ctx.unsupported(what + ": subgraphs nested more than " + std::to_string(kMaxSubgraphDepth) + " deep");
  if (g.input_size() != static_cast<int>(inputs.size())) {
    return ctx.invalid(what + " has " + std::to_string(g.input_size()) + " inputs, expected " + std::to_string(inputs.size()));
  }
  if (g.sparse_initializer_size() > 0) return ctx.unsupported(what + ": sparse initializers are not supported");
  const std::map<std::string, ValueId> saved = im.names;
  for (int i = 0; i < g.input_size(); ++i) im.names[g.input(i).name()] = inputs[static_cast<size_t>(i)];
  for (int i = 0; i < g.initializer_size(); ++i) {
    const auto& t = g.initializer(i);
    auto h = read_tensor(t, im.base_dir, what + " initializer '" + t.name() + "'");
    if (!h.ok()) return Error(h.error().code(), ctx.where() + ": " + h.error().message());
    auto id = im.graph.add_constant(t.name(), h->type, std::move(h->bytes));
    if (!id.ok()) return Error(ErrorCode::Internal, id.error().message());
    im.names[t.name()] = *id;
  }
  ++im.depth;
  Error err = convert_nodes(im, g);
  --im.depth;
  std::vector<ValueId> outs;
  if (err.ok()) {
    for (const auto& vi : g.output()) {
      auto it = im.names.find(vi.name());
      if (it == im.names.end()) {
        err = ctx.invalid(what + ": output '" + vi.name() + "' is not produced");
        break;
      }
      outs.push_back(it->second);
    }
  }
  im.names = saved;
  if (!err.ok()) {
    // Errors inside the subgraph name the subgraph's node; say which If / Loop holds it.
    return Error(err.code(), err.message() + " (in " + what + " of " + ctx.where() + ")");
  }
  return outs;
}

const ::onnx::GraphProto* graph_attr(NodeCtx& ctx, const std::string& name) {
  const auto* a = ctx.attr(name);
  if (a == nullptr || !a->has_g()) return nullptr;
  return &a->g();
}

// A 0-d or one-element constant's truth value / integer; NotSupported (naming the node) when the
// value is not known at import.
Result<int64_t> known_scalar(NodeCtx& ctx, ValueId v, const std::string& what, const std::string& why) {
  if (!ctx.is_const(v)) {
    return ctx.unsupported(what + " must be a constant (after folding for the given input shapes): " + why);
  }
  auto vals = ctx.const_ints(v, what);
  if (!vals.ok()) return vals.error();
  if (vals->size() != 1) return ctx.invalid(what + " must have one element, got " + ctx.type(v).to_string());
  return (*vals)[0];
}

// If: folded when the condition is known once the input shapes are fixed (a constant, or
// computed from shapes): the chosen branch is inlined, the other is never converted.
Error fold_if(NodeCtx& ctx) {
  auto cond = ctx.input(0);
  if (!cond.ok()) return cond.error();
  const auto* then_g = graph_attr(ctx, "then_branch");
  const auto* else_g = graph_attr(ctx, "else_branch");
  if (then_g == nullptr || else_g == nullptr) return ctx.invalid("needs graph attributes 'then_branch' and 'else_branch'");
  auto c = known_scalar(ctx, *cond, "the condition", "only If nodes whose condition is known at import are folded");
  if (!c.ok()) return c.error();
  const bool take_then = *c != 0;
  auto outs = inline_graph(ctx, take_then ? *then_g : *else_g, {}, take_then ? "then_branch" : "else_branch");
  if (!outs.ok()) return outs.error();
  if (static_cast<int>(outs->size()) != ctx.num_outputs()) {
    return ctx.invalid("the branch has " + std::to_string(outs->size()) + " outputs, the node " + std::to_string(ctx.num_outputs()));
  }
  for (int i = 0; i < ctx.num_outputs(); ++i) KILN_RETURN_IF_ERROR(ctx.set_output(i, (*outs)[static_cast<size_t>(i)]));
  return {};
}

// Loop: unrolled when the trip count M is a known constant (cond absent: a for loop) or the
// condition stays a known constant every iteration (cond given: a while loop, bounded by M when
// M is given). Loop-carried values flow from one unrolled body to the next; scan outputs are
// stacked along a new axis 0. Refused (NotSupported naming the node) otherwise: an unknown M or
// condition, an infinite loop (neither given), more than kMaxLoopUnroll iterations, or scan
// outputs of a loop that runs zero times (their shapes are unknown).
Error fold_loop(NodeCtx& ctx) {
  Importer& im = ctx.im;
  const auto* body = graph_attr(ctx, "body");
  if (body == nullptr) return ctx.invalid("needs the graph attribute 'body'");
  const int n_carried = ctx.num_inputs() - 2;
  if (n_carried < 0) return ctx.invalid("needs inputs M and cond (either may be empty)");
  if (body->input_size() != n_carried + 2) {
    return ctx.invalid("body has " + std::to_string(body->input_size()) + " inputs, expected " + std::to_string(n_carried + 2));
  }
  const int n_scan = body->output_size() - 1 - n_carried;
  if (n_scan < 0) return ctx.invalid("body has " + std::to_string(body->output_size()) + " outputs, expected at least " + std::to_string(n_carried + 1));
  if (ctx.num_outputs() > n_carried + n_scan) return ctx.invalid("more outputs than loop-carried values and scan outputs");
  const std::string why = "only Loop nodes with a known trip count or condition are unrolled";
  int64_t trips = -1;  // unbounded
  if (ctx.has_input(0)) {
    auto m = ctx.input(0);
    if (!m.ok()) return m.error();
    auto t = known_scalar(ctx, *m, "the trip count M", why);
    if (!t.ok()) return t.error();
    trips = std::max<int64_t>(*t, 0);
  }
  bool cond = true;
  const bool use_cond = ctx.has_input(1);
  if (use_cond) {
    auto cv = ctx.input(1);
    if (!cv.ok()) return cv.error();
    auto c = known_scalar(ctx, *cv, "the condition", why);
    if (!c.ok()) return c.error();
    cond = *c != 0;
  } else if (trips < 0) {
    return ctx.unsupported("neither a trip count nor a condition: an infinite loop");
  }
  if (trips > kMaxLoopUnroll) {
    return ctx.unsupported("trip count " + std::to_string(trips) + " exceeds the " + std::to_string(kMaxLoopUnroll) +
                           " iterations a Loop is unrolled to");
  }
  std::vector<ValueId> carried;
  for (int i = 0; i < n_carried; ++i) {
    auto v = ctx.input(2 + i);
    if (!v.ok()) return v.error();
    carried.push_back(*v);
  }
  std::vector<std::vector<ValueId>> scans(static_cast<size_t>(n_scan));
  int64_t it = 0;
  for (; cond && (trips < 0 || it < trips); ++it) {
    if (it >= kMaxLoopUnroll) {
      return ctx.unsupported("the condition stays true after " + std::to_string(kMaxLoopUnroll) + " iterations (unroll limit)");
    }
    if (im.converted_nodes > kMaxUnrolledNodes) return ctx.unsupported("unrolling converts more than 2^20 nodes");
    std::vector<uint8_t> ib(8);
    std::memcpy(ib.data(), &it, 8);
    auto iter = ctx.constant(TensorType{DType::Int64, {}}, std::move(ib));  // the iteration number, 0-d int64
    if (!iter.ok()) return iter.error();
    auto cin = ctx.scalar(DType::Bool, cond ? 1 : 0);
    if (!cin.ok()) return cin.error();
    std::vector<ValueId> ins{*iter, *cin};
    ins.insert(ins.end(), carried.begin(), carried.end());
    auto outs = inline_graph(ctx, *body, ins, "body iteration " + std::to_string(it));
    if (!outs.ok()) return outs.error();
    if (use_cond) {
      auto c = known_scalar(ctx, (*outs)[0], "the body's condition output (iteration " + std::to_string(it) + ")", why);
      if (!c.ok()) return c.error();
      cond = *c != 0;
    }
    for (int i = 0; i < n_carried; ++i) carried[static_cast<size_t>(i)] = (*outs)[static_cast<size_t>(1 + i)];
    for (int k = 0; k < n_scan; ++k) scans[static_cast<size_t>(k)].push_back((*outs)[static_cast<size_t>(1 + n_carried + k)]);
  }
  for (int i = 0; i < n_carried; ++i) KILN_RETURN_IF_ERROR(ctx.set_output(i, carried[static_cast<size_t>(i)]));
  for (int k = 0; k < n_scan; ++k) {
    if (!ctx.has_output(n_carried + k)) continue;
    const auto& parts = scans[static_cast<size_t>(k)];
    if (parts.empty()) return ctx.unsupported("scan output " + std::to_string(k) + " of a loop that runs zero times");
    std::vector<ValueId> rows;
    for (ValueId p : parts) {
      auto u = ctx.emit("aten.unsqueeze", {p}, {{"dim", int64_t{0}}});
      if (!u.ok()) return u.error();
      rows.push_back(*u);
    }
    ValueId y = rows[0];
    if (rows.size() > 1) {
      auto cat = ctx.emit("aten.cat", rows, {{"dim", int64_t{0}}});
      if (!cat.ok()) return cat.error();
      y = *cat;
    }
    KILN_RETURN_IF_ERROR(ctx.set_output(n_carried + k, y));
  }
  if (it == 0) im.notes.push_back(ctx.where() + " runs zero times: its outputs are its initial values");
  return {};
}

Error convert_nodes(Importer& im, const ::onnx::GraphProto& g) {
  const auto& conv = converters();
  for (int i = 0; i < g.node_size(); ++i) {
    const auto& node = g.node(i);
    NodeCtx ctx(im, node, static_cast<size_t>(i));
    if (!node.domain().empty() && node.domain() != "ai.onnx") {
      return ctx.unsupported("op domain '" + node.domain() + "' is not supported (only the default ONNX domain)");
    }
    const bool control_flow = node.op_type() == "If" || node.op_type() == "Loop";
    if (node.op_type() == "Scan") {
      return ctx.unsupported("control flow: Scan is not folded (only If with a condition and Loop with a trip count or "
                             "condition known at import are)");
    }
    auto it = conv.find(node.op_type());
    if (!control_flow && it == conv.end()) {
      return ctx.unsupported("op type '" + node.op_type() + "' is not supported by Kiln's ONNX importer");
    }
    if (!control_flow && im.opset < it->second.min_opset) {
      return ctx.unsupported("opset " + std::to_string(im.opset) + " (" + node.op_type() + " before opset " +
                             std::to_string(it->second.min_opset) + " has other semantics)");
    }
    for (int k = 0; k < node.input_size(); ++k) {  // every named input must exist (dangling / cyclic graphs)
      auto v = ctx.opt_input(k);
      if (!v.ok()) return v.error();
    }
    for (const auto& a : node.attribute()) {
      if ((a.type() == ::onnx::AttributeProto::GRAPH || a.type() == ::onnx::AttributeProto::GRAPHS) && !control_flow) {
        return ctx.unsupported("attribute '" + a.name() + "' holds a subgraph (control flow is not supported)");
      }
      if (!a.ref_attr_name().empty()) return ctx.unsupported("attribute '" + a.name() + "' refers to a function attribute");
    }
    const size_t nodes_before = im.graph.nodes().size();
    ++im.converted_nodes;
    KILN_RETURN_IF_ERROR(control_flow ? (node.op_type() == "If" ? fold_if(ctx) : fold_loop(ctx)) : it->second.fn(ctx));
    for (const auto& a : node.attribute()) {
      if (!ctx.used_attrs.count(a.name())) {
        return ctx.unsupported("attribute '" + a.name() + "' is not supported for " + node.op_type() + " (opset " +
                               std::to_string(im.opset) + ")");
      }
    }
    for (int k = 0; k < node.output_size(); ++k) {
      if (!node.output(k).empty() && !im.names.count(node.output(k))) {
        return ctx.unsupported("output " + std::to_string(k) + " ('" + node.output(k) + "') is not supported");
      }
    }
    if (im.graph.nodes().size() == nodes_before) ++im.folded;
  }

  return {};
}

Result<ImportedModel> import_proto(const ::onnx::ModelProto& model, const std::string& base_dir,
                                   const ImportOptions& options) {
  Importer im;
  im.base_dir = base_dir;
  im.max_constant_bytes = static_cast<double>(options.max_constant_bytes);
  bool has_default = false;
  for (const auto& os : model.opset_import()) {
    if (os.domain().empty() || os.domain() == "ai.onnx") {
      // Two entries for the default domain ('' and 'ai.onnx' are the same) leave its opset
      // ambiguous: refused, rather than letting the order of the list pick one.
      if (has_default) {
        return invalid_program("the model imports the default domain twice (opset " + std::to_string(im.opset) +
                               " and opset " + std::to_string(os.version()) + ")");
      }
      has_default = true;
      im.opset = os.version();
    }
  }
  if (!has_default) {
    if (model.opset_import_size() == 0 && model.ir_version() < 3) im.opset = 1;
    else return invalid_program("the model imports no default-domain opset");
  }
  if (im.opset < kMinOpset || im.opset > kMaxOpset) {
    return not_supported("opset " + std::to_string(im.opset) + " is outside the supported range " +
                         std::to_string(kMinOpset) + ".." + std::to_string(kMaxOpset));
  }
  if (!model.has_graph()) return invalid_program("the model has no graph");
  const auto& g = model.graph();
  if (g.sparse_initializer_size() > 0) return not_supported("sparse initializers are not supported");

  // Initializers first (they may also be listed as graph inputs: then they are constants).
  for (int i = 0; i < g.initializer_size(); ++i) {
    const auto& t = g.initializer(i);
    if (t.name().empty()) return invalid_program("initializer #" + std::to_string(i) + " has no name");
    if (im.names.count(t.name())) return invalid_program("initializer '" + t.name() + "' is defined twice");
    auto h = read_tensor(t, base_dir, "initializer '" + t.name() + "'");
    if (!h.ok()) return h.error();
    auto id = im.graph.add_constant(t.name(), h->type, std::move(h->bytes));
    if (!id.ok()) return Error(ErrorCode::Internal, id.error().message());
    im.names[t.name()] = *id;
  }
  ImportedModel out;
  std::set<std::string> input_names;
  std::vector<std::string> given_names;
  for (const auto& kv : options.input_shapes) given_names.push_back(kv.first);
  for (const auto& kv : options.constant_inputs) given_names.push_back(kv.first);
  for (const auto& name : given_names) {  // before any shape is needed
    bool found = false;
    std::string known;
    for (const auto& vi : g.input()) {
      if (im.names.count(vi.name())) continue;
      found |= vi.name() == name;
      known += (known.empty() ? "" : ", ") + vi.name();
    }
    if (!found) {
      return Error(ErrorCode::InvalidArgument, "input shape/value given for '" + name + "', which is not a graph input (inputs: " +
                                                   (known.empty() ? "none" : known) + ")");
    }
  }
  for (const auto& vi : g.input()) {
    if (im.names.count(vi.name())) continue;  // an initializer
    if (vi.name().empty()) return invalid_program("a graph input has no name");
    if (!input_names.insert(vi.name()).second) return invalid_program("graph input '" + vi.name() + "' is listed twice");
    auto fixed = options.constant_inputs.find(vi.name());
    if (fixed != options.constant_inputs.end()) {
      ImportOptions o;
      o.input_shapes[vi.name()] = fixed->second.first.sizes;
      auto type = input_type(vi, o);
      if (!type.ok()) return type.error();
      if (type->dtype != fixed->second.first.dtype) {
        return Error(ErrorCode::InvalidArgument, "constant value for input '" + vi.name() + "' has dtype " +
                                                     dtype_name(fixed->second.first.dtype) + ", the input is " +
                                                     dtype_name(type->dtype));
      }
      auto id = im.graph.add_constant(vi.name(), *type, fixed->second.second);
      if (!id.ok()) return Error(ErrorCode::InvalidArgument, id.error().message());
      im.names[vi.name()] = *id;
      continue;
    }
    auto type = input_type(vi, options);
    if (!type.ok()) return type.error();
    im.names[vi.name()] = im.graph.add_input(vi.name(), *type);
    out.input_names.push_back(vi.name());
  }
  KILN_RETURN_IF_ERROR(convert_nodes(im, g));

  std::vector<ValueId> outputs;
  for (const auto& vi : g.output()) {
    auto it = im.names.find(vi.name());
    if (it == im.names.end()) return invalid_program("graph output '" + vi.name() + "' is not produced by any node");
    ValueId v = it->second;
    const Value& val = im.graph.value(v);
    if (val.is_input || val.constant || std::find(outputs.begin(), outputs.end(), v) != outputs.end()) {
      // Program outputs are node outputs: copy inputs, constants and repeated outputs.
      auto c = im.graph.add_node("aten.clone", {v}, {}, "output:" + vi.name());
      if (!c.ok()) return c.error();
      v = (*c)[0];
    }
    outputs.push_back(v);
    out.output_names.push_back(vi.name());
  }
  if (outputs.empty()) return invalid_program("the graph has no outputs");
  KILN_RETURN_IF_ERROR(im.graph.set_outputs(outputs));
  out.graph = std::move(im.graph);
  out.opset = im.opset;
  out.onnx_nodes = static_cast<size_t>(g.node_size());
  out.folded_nodes = im.folded;
  out.notes = std::move(im.notes);
  return out;
}

// Names and strings from the file may hold any bytes: messages and names handed on (error text,
// program value names, Python strings) get invalid UTF-8 and control characters as \xNN.
std::string printable(const std::string& s) {
  std::string out;
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  auto esc = [&](unsigned char c) {
    static const char* hex = "0123456789abcdef";
    out += "\\x";
    out += hex[c >> 4];
    out += hex[c & 15];
  };
  for (size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      if (c < 0x20 && c != '\n' && c != '\t') esc(c); else out += static_cast<char>(c);
      ++i;
      continue;
    }
    size_t len = (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    bool ok = len > 0 && i + len <= n && c != 0xc0 && c != 0xc1 && c < 0xf5;
    for (size_t k = 1; ok && k < len; ++k) ok = (p[i + k] & 0xc0) == 0x80;
    if (ok && len == 3 && c == 0xe0 && p[i + 1] < 0xa0) ok = false;   // overlong
    if (ok && len == 3 && c == 0xed && p[i + 1] >= 0xa0) ok = false;  // surrogates
    if (ok && len == 4 && c == 0xf0 && p[i + 1] < 0x90) ok = false;   // overlong
    if (ok && len == 4 && c == 0xf4 && p[i + 1] >= 0x90) ok = false;  // > U+10FFFF
    if (!ok) {
      esc(c);
      ++i;
      continue;
    }
    out.append(s, i, len);
    i += len;
  }
  return out;
}

}  // namespace
}  // namespace detail

Result<ImportedModel> import_model_bytes(std::span<const uint8_t> bytes, const std::string& base_dir,
                                         const ImportOptions& options) {
  if (bytes.size() > options.max_file_bytes || bytes.size() > static_cast<size_t>(INT32_MAX)) {
    return Error(ErrorCode::InvalidProgram, "model of " + std::to_string(bytes.size()) + " bytes exceeds the limit");
  }
  ::onnx::ModelProto model;
  google::protobuf::io::CodedInputStream in(bytes.data(), static_cast<int>(bytes.size()));
  in.SetRecursionLimit(64);
  if (!model.ParseFromCodedStream(&in) || !in.ConsumedEntireMessage()) {
    return Error(ErrorCode::InvalidProgram, "not a valid ONNX model (protobuf ModelProto parse failed: truncated or corrupt)");
  }
  // The importer allocates only sizes it has checked, but a graph of many large constants can
  // still exhaust memory: that is an error value here, never an exception leaving the API.
  Result<ImportedModel> r = Error(ErrorCode::Internal, "not imported");
  try {
    r = detail::import_proto(model, base_dir, options);
  } catch (const std::bad_alloc&) {
    return Error(ErrorCode::MemoryAllocationFailed, "out of memory while importing the model");
  } catch (const std::length_error&) {
    return Error(ErrorCode::MemoryAllocationFailed, "a tensor of the model is too large to allocate");
  }
  if (!r.ok()) return Error(r.error().code(), detail::printable(r.error().message()));
  ImportedModel& m = r.value();
  for (auto& n : m.input_names) n = detail::printable(n);
  // The program's names from the file's own bytes: unique_output_names escapes what is not a
  // printable name and lets a name that needs no escaping keep itself first (an output literally
  // named "\\xff.." keeps that name; one whose bytes are escaped to the same text gets "_2").
  KILN_RETURN_IF_ERROR(m.graph.set_output_names(unique_output_names(m.output_names)));
  for (auto& n : m.output_names) n = detail::printable(n);
  for (auto& n : m.notes) n = detail::printable(n);
  for (auto& v : m.graph.mutable_values()) v.name = detail::printable(v.name);
  for (auto& n : m.graph.mutable_nodes()) n.debug_name = detail::printable(n.debug_name);
  return r;
}

Result<ImportedModel> import_model(const std::string& path, const ImportOptions& options) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) return Error(ErrorCode::InvalidArgument, path + " is a directory, not an ONNX file");
  if (!fs::is_regular_file(path, ec)) return Error(ErrorCode::NotFound, "no such file: " + path);
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) return Error(ErrorCode::NotFound, "cannot stat " + path);
  if (size > options.max_file_bytes) return Error(ErrorCode::InvalidProgram, path + ": file too large");
  std::ifstream f(path, std::ios::binary);
  if (!f) return Error(ErrorCode::NotFound, "cannot open " + path);
  std::vector<uint8_t> bytes(size);
  f.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size));
  if (!f) return Error(ErrorCode::NotFound, "cannot read " + path);
  std::string dir = fs::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  auto r = import_model_bytes(bytes, dir, options);
  if (!r.ok()) return Error(r.error().code(), detail::printable(path) + ": " + r.error().message());
  return r;
}

}  // namespace kiln::onnx
