// kiln._kiln: the binding between Python capture and the C++ compiler/runtime.
// Python builds a Graph node by node; all compilation and serialization happen in C++.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <map>
#include <mutex>

#include "backends/backend.h"
#include "common/file_write.h"
#include "ir/op_registry.h"
#include "kernels/kernel.h"
#include "kiln/compiler.h"
#include "kiln/cpu_target.h"
#include "kiln/format.h"
#include "kiln/runtime.h"
#ifdef KILN_HAVE_ONNX
#include "kiln/onnx.h"
#endif

namespace py = pybind11;
using namespace kiln;

// python/llm_binding.cpp: sampling_distribution, Sampler, generate (include/kiln/llm.h).
void register_llm(py::module_& m, void (*check)(const Error&));

namespace {

/// Raised for every kiln::Error; .code holds the ErrorCode name.
struct KilnError {
  Error error;
};

void check(const Error& e);

/// CompileOptions::quantize from the Python arguments ('' = off, 'w8', 'w4', 'w8a8', 'w4a8').
QuantizeOptions quantize_options(const std::string& scheme, int64_t group_size, bool symmetric,
                                 const std::string& scale_dtype, std::vector<std::string> exclude) {
  QuantizeOptions q;
  if (scheme.empty() || scheme == "none") return q;
  if (scheme == "w8" || scheme == "w8a8") {
    q.bits = 8;
  } else if (scheme == "w4" || scheme == "w4a8") {
    q.bits = 4;
  } else {
    check(Error(ErrorCode::InvalidArgument,
                "quantize: unknown scheme '" + scheme + "' (expected 'w8', 'w4', 'w8a8' or 'w4a8')"));
  }
  if (scheme.size() == 4) q.activation_bits = 8;  // w8a8 / w4a8: int8 activation blocks
  q.group_size = group_size;
  q.symmetric = symmetric;
  auto sd = dtype_from_name(scale_dtype);
  if (!sd) check(Error(ErrorCode::InvalidArgument, "scale_dtype: unknown dtype '" + scale_dtype + "'"));
  q.scale_dtype = *sd;
  q.exclude = std::move(exclude);
  return q;
}

template <typename T>
T unwrap(Result<T> r) {
  if (!r.ok()) throw KilnError{r.error()};
  return std::move(r).value();
}
void check(const Error& e) {
  if (!e.ok()) throw KilnError{e};
}

AttrValue to_attr(const py::handle& v) {
  if (v.is_none()) return std::monostate{};
  if (py::isinstance<py::bool_>(v)) return v.cast<bool>();
  if (py::isinstance<py::int_>(v)) return v.cast<int64_t>();
  if (py::isinstance<py::float_>(v)) return v.cast<double>();
  if (py::isinstance<py::str>(v)) return v.cast<std::string>();
  if (py::isinstance<py::list>(v) || py::isinstance<py::tuple>(v)) {
    bool all_int = true;
    for (auto item : v) {
      if (!py::isinstance<py::int_>(item) || py::isinstance<py::bool_>(item)) all_int = false;
    }
    if (all_int) return v.cast<std::vector<int64_t>>();
    return v.cast<std::vector<double>>();
  }
  throw py::type_error("unsupported attribute value: " + std::string(py::str(v)));
}

Attributes to_attrs(const py::dict& d) {
  Attributes a;
  for (auto [k, v] : d) a.set(k.cast<std::string>(), to_attr(v));
  return a;
}

DType dtype_of(const std::string& name) {
  auto d = dtype_from_name(name);
  if (!d) throw py::value_error("unknown dtype '" + name + "'");
  return *d;
}

// NumPy has no bfloat16: bf16 tensors cross the boundary as uint16 bit patterns.
std::string numpy_format(DType d) {
  switch (d) {
    case DType::Float32: return "float32";
    case DType::Float16: return "float16";
    case DType::BFloat16: return "uint16";
    case DType::Int64: return "int64";
    case DType::Int32: return "int32";
    case DType::Int8: return "int8";
    case DType::UInt8: return "uint8";
    case DType::Bool: return "bool";
    case DType::Float64: return "float64";
  }
  return "float32";
}

py::array to_numpy(const Tensor& t) {
  py::array out(py::dtype(numpy_format(t.dtype)), std::vector<py::ssize_t>(t.sizes.begin(), t.sizes.end()));
  if (t.nbytes()) std::memcpy(out.mutable_data(), t.data, t.nbytes());
  return out;
}

py::dict type_dict(const TensorType& t) {
  py::dict d;
  d["dtype"] = dtype_name(t.dtype);
  d["sizes"] = t.sizes;
  return d;
}

// One Method instance may not run on two threads at once (include/kiln/runtime.h), and its
// outputs are views into its arena: `mu` serializes execute() plus the copy of the outputs, so
// Python threads sharing a LoadedProgram get correct results (one at a time per method).
struct PyMethod {
  std::shared_ptr<ThreadPool> pool;  // the method's own pool when num_threads was given (outlives method)
  Method method;
  std::unique_ptr<std::mutex> mu = std::make_unique<std::mutex>();
};

/// A Session with a lock: one call at a time per session (include/kiln/runtime.h).
struct PySession {
  std::unique_ptr<Session> session;
  std::unique_ptr<std::mutex> mu = std::make_unique<std::mutex>();
};

SymExpr expr_of(const std::vector<int64_t>& code) { return SymExpr::from_code(code); }

std::vector<SymExpr> exprs_of(const std::vector<std::vector<int64_t>>& codes) {
  std::vector<SymExpr> out;
  for (const auto& c : codes) out.push_back(expr_of(c));
  return out;
}

py::dict meta_dict(const MethodMeta& m) {
  py::dict d;
  d["name"] = m.name;
  py::list ins, outs, syms;
  for (size_t i = 0; i < m.inputs.size(); ++i) {
    py::dict t = type_dict(m.inputs[i]);
    t["name"] = m.input_names[i];
    t["dims"] = i < m.input_dims.size() ? m.input_dims[i] : std::vector<std::string>{};
    ins.append(t);
  }
  for (size_t i = 0; i < m.outputs.size(); ++i) {
    py::dict t = type_dict(m.outputs[i]);
    t["name"] = m.output_names[i];
    t["dims"] = i < m.output_dims.size() ? m.output_dims[i] : std::vector<std::string>{};
    outs.append(t);
  }
  for (const auto& s : m.symbols) syms.append(py::make_tuple(s.name, s.min, s.max));
  d["inputs"] = ins;
  d["outputs"] = outs;
  d["symbols"] = syms;
  d["states"] = m.states;
  d["state_holders"] = m.state_holders;
  d["arena_bytes"] = m.arena_bytes;
  d["num_kernel_calls"] = m.num_kernel_calls;
  d["num_delegate_calls"] = m.num_delegate_calls;
  d["alternative"] = m.alternative;
  d["num_alternatives"] = m.num_alternatives;
  return d;
}

}  // namespace

PYBIND11_MODULE(_kiln, m) {
  m.doc() = "Kiln compiler and runtime binding (graph building, compile, load, execute).";
  m.attr("__version__") = KILN_VERSION;  // CMake's PROJECT_VERSION (python/CMakeLists.txt)
  // KilnError(message, code): code is the ErrorCode name, e.g. "InvalidArgument".
  static PyObject* exc_type = PyErr_NewExceptionWithDoc(
      "kiln._kiln.KilnError", "An error value returned by Kiln: args = (message, code name).", PyExc_RuntimeError, nullptr);
  m.attr("KilnError") = py::handle(exc_type);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const KilnError& e) {
      // A message may quote bytes from a damaged file that are not UTF-8: replaced, not a
      // UnicodeDecodeError in place of the KilnError.
      const std::string msg = e.error.to_string();
      py::object text = py::reinterpret_steal<py::object>(
          PyUnicode_DecodeUTF8(msg.data(), static_cast<Py_ssize_t>(msg.size()), "replace"));
      py::tuple args = py::make_tuple(text, error_code_name(e.error.code()));
      PyErr_SetObject(exc_type, args.ptr());
    }
  });

  m.def("op_names", [] {
    std::vector<std::string> names;
    for (const auto& d : OpRegistry::get().ops()) names.push_back(d.name);
    return names;
  }, "Names of every op in Kiln's op set (ATen names).");
  m.def("kernel_names", [] { return KernelRegistry::get().ops(); }, "Ops with a kernel in this build.");
  m.def("op_schema", [](const std::string& name) {
    const OpDef* d = OpRegistry::get().find(name);
    if (!d) throw KilnError{Error(ErrorCode::NotFound, "no op '" + name + "'")};
    py::dict out;
    py::list ins, attrs;
    for (const auto& a : d->inputs) ins.append(py::make_tuple(a.name, a.optional));
    for (const auto& a : d->attrs) attrs.append(a.name);
    out["inputs"] = ins;
    out["attrs"] = attrs;
    out["num_outputs"] = d->num_outputs;
    out["variadic"] = d->variadic;
    out["doc"] = d->doc;
    return out;
  }, "Schema of one op: tensor inputs (name, optional), attribute names, output count.");

  py::class_<Graph>(m, "Graph", "A dataflow graph of ATen ops; nodes are typed as they are added.")
      .def(py::init<>())
      .def("add_input", [](Graph& g, const std::string& name, const std::string& dtype, std::vector<int64_t> sizes) {
        return g.add_input(name, {dtype_of(dtype), std::move(sizes)});
      }, py::arg("name"), py::arg("dtype"), py::arg("sizes"))
      .def("add_constant", [](Graph& g, const std::string& name, const std::string& dtype, std::vector<int64_t> sizes,
                              py::buffer data) {
        py::buffer_info info = data.request();
        if (!info.item_type_is_equivalent_to<uint8_t>() && info.ndim != 1) {
          // any contiguous buffer is accepted; only its bytes matter
        }
        const auto* p = static_cast<const uint8_t*>(info.ptr);
        std::vector<uint8_t> bytes(p, p + info.size * info.itemsize);
        return unwrap(g.add_constant(name, {dtype_of(dtype), std::move(sizes)}, std::move(bytes)));
      }, py::arg("name"), py::arg("dtype"), py::arg("sizes"), py::arg("data"),
         "Adds a constant; `data` is a C-contiguous buffer of exactly the tensor's bytes.")
      .def("add_node", [](Graph& g, const std::string& op, std::vector<ValueId> inputs, py::dict attrs,
                          const std::string& debug_name) {
        return unwrap(g.add_node(op, std::move(inputs), to_attrs(attrs), debug_name));
      }, py::arg("op"), py::arg("inputs"), py::arg("attrs") = py::dict(), py::arg("debug_name") = "",
         "Adds a node (inputs: value ids, -1 for None); returns its output value ids.")
      .def("add_symbol", [](Graph& g, const std::string& name, int64_t min, int64_t max) {
        return unwrap(g.add_symbol(name, min, max));
      }, py::arg("name"), py::arg("min"), py::arg("max"), "Declares a dimension symbol in [min, max]; returns its index.")
      .def("add_input_sym", [](Graph& g, const std::string& name, const std::string& dtype, std::vector<int64_t> sizes,
                               const std::vector<std::vector<int64_t>>& exprs) {
        return unwrap(g.add_input(name, {dtype_of(dtype), std::move(sizes)}, exprs_of(exprs)));
      }, py::arg("name"), py::arg("dtype"), py::arg("sizes"), py::arg("exprs"),
         "An input with symbolic sizes: exprs holds one SymExpr token list per dim (kiln/symbolic.h).")
      .def("add_state", [](Graph& g, const std::string& name, const std::string& dtype, std::vector<int64_t> sizes,
                           py::object initial) {
        ConstantBytes bytes;
        if (!initial.is_none()) {
          py::buffer_info info = initial.cast<py::buffer>().request();
          const auto* p = static_cast<const uint8_t*>(info.ptr);
          bytes = std::make_shared<const std::vector<uint8_t>>(p, p + info.size * info.itemsize);
        }
        return unwrap(g.add_state(name, {dtype_of(dtype), std::move(sizes)}, std::move(bytes)));
      }, py::arg("name"), py::arg("dtype"), py::arg("sizes"), py::arg("initial") = py::none(),
         "Declares a state tensor (initial: its bytes, or None for zeros); returns the value holding it.")
      .def("set_state_update", [](Graph& g, ValueId state, ValueId value) { check(g.set_state_update(state, value)); })
      .def("add_node_sym", [](Graph& g, const std::string& op, std::vector<ValueId> inputs, py::dict attrs,
                              const std::string& debug_name, const std::vector<std::tuple<std::string, int64_t, std::vector<int64_t>>>& sym_attrs,
                              const std::vector<std::vector<std::vector<int64_t>>>& out_exprs) {
        std::vector<SymAttr> sa;
        for (const auto& [name, index, code] : sym_attrs) sa.push_back(SymAttr{name, index, expr_of(code)});
        std::vector<std::vector<SymExpr>> outs;
        for (const auto& o : out_exprs) outs.push_back(exprs_of(o));
        return unwrap(g.add_node(op, std::move(inputs), to_attrs(attrs), debug_name, std::move(sa), std::move(outs)));
      }, py::arg("op"), py::arg("inputs"), py::arg("attrs"), py::arg("debug_name"), py::arg("sym_attrs"),
         py::arg("out_exprs") = std::vector<std::vector<std::vector<int64_t>>>{},
         "add_node with symbolic int attributes [(name, index or -1, tokens)] and optional output size expressions.")
      .def("value_exprs", [](const Graph& g, ValueId id) {
        if (id < 0 || static_cast<size_t>(id) >= g.values().size()) throw py::index_error("value id out of range");
        std::vector<std::vector<int64_t>> out;
        for (const SymExpr& e : g.value(id).sym_sizes) out.push_back(e.code());
        return out;
      }, "A value's size expressions (token lists; empty for fixed sizes).")
      .def("set_outputs", [](Graph& g, std::vector<ValueId> outs, std::optional<std::vector<std::string>> names) {
        check(g.set_outputs(std::move(outs)));
        if (names) check(g.set_output_names(std::move(*names)));
      }, py::arg("outputs"), py::arg("names") = py::none(),
         "Sets the method's outputs (value ids) and optionally their names (one per output, non-empty, distinct: "
         "KilnError otherwise; see unique_output_names).")
      .def_property_readonly("output_names", [](const Graph& g) { return g.output_names(); },
                             "The outputs' names ([] when unnamed).")
      .def("value_type", [](const Graph& g, ValueId id) {
        if (id < 0 || static_cast<size_t>(id) >= g.values().size()) throw py::index_error("value id out of range");
        return type_dict(g.value(id).type);
      })
      .def_property_readonly("num_nodes", [](const Graph& g) { return g.nodes().size(); });

  py::class_<ProgramBuilder>(m, "ProgramBuilder", "Collects methods and compiles them into one .kiln program.")
      .def(py::init<>())
      .def("add_method", [](ProgramBuilder& pb, const std::string& name, const Graph& g) {
        check(pb.add_method(name, g));
      })
      .def("set_metadata", [](ProgramBuilder& pb, const std::string& key, const std::string& value) {
        pb.set_metadata(key, value);
      }, "Stores a string key/value in the program (shown by kiln inspect).")
      .def("compile", [](const ProgramBuilder& pb, bool fold_constants, bool eliminate_dead_code,
                         std::vector<std::string> backends, std::string require_delegation, bool fold_batch_norm,
                         const std::string& compute_dtype, std::vector<std::vector<std::string>> alternatives,
                         const std::string& quantize, int64_t group_size, bool symmetric, const std::string& scale_dtype,
                         std::vector<std::string> quantize_exclude, bool quantize_embeddings,
                         const std::string& weights_dtype) {
        CompileOptions o;
        auto wdt = dtype_from_name(weights_dtype);
        if (!wdt) check(Error(ErrorCode::InvalidArgument, "weights_dtype: unknown dtype '" + weights_dtype + "'"));
        o.weights_dtype = *wdt;
        o.quantize = quantize_options(quantize, group_size, symmetric, scale_dtype, std::move(quantize_exclude));
        o.quantize.embeddings = quantize_embeddings;
        auto cdt = dtype_from_name(compute_dtype);
        if (!cdt) check(Error(ErrorCode::InvalidArgument, "compute_dtype: unknown dtype '" + compute_dtype + "'"));
        o.compute_dtype = *cdt;
        o.fold_constants = fold_constants;
        o.fold_batch_norm = fold_batch_norm;
        o.eliminate_dead_code = eliminate_dead_code;
        o.backends = std::move(backends);
        o.require_delegation = std::move(require_delegation);
        o.alternatives = std::move(alternatives);
        CompiledProgram c;
        {
          py::gil_scoped_release release;
          auto r = pb.compile(o);
          if (!r.ok()) {
            py::gil_scoped_acquire acquire;
            throw KilnError{r.error()};
          }
          c = std::move(r).value();
        }
        py::list methods;
        for (const auto& mr : c.methods) {
          py::dict d;
          d["name"] = mr.name;
          d["alternative"] = mr.alternative;
          d["num_nodes"] = mr.num_nodes;
          d["num_folded"] = mr.num_folded;
          d["num_bn_folded"] = mr.num_bn_folded;
          d["num_hardswish"] = mr.num_hardswish;
          d["num_affine_folded"] = mr.num_affine_folded;
          d["num_quick_gelu"] = mr.num_quick_gelu;
          d["num_rms_norm"] = mr.num_rms_norm;
          d["num_dead"] = mr.num_dead;
          d["num_quantized"] = mr.num_quantized;
          d["arena_bytes"] = mr.arena_bytes;
          d["activation_bytes"] = mr.activation_bytes;
          d["constant_bytes"] = mr.constant_bytes;
          py::list dbs, cpu;
          for (const auto& b : mr.delegation.backends) {
            py::dict bd;
            bd["backend"] = b.backend;
            bd["segments"] = b.segments;
            bd["nodes"] = b.nodes;
            bd["constant_bytes"] = b.constant_bytes;
            dbs.append(bd);
          }
          for (const auto& c : mr.delegation.cpu_ops) {
            py::dict cd;
            cd["op"] = c.op;
            cd["count"] = c.count;
            py::list reasons;
            for (const auto& [backend, reason] : c.reasons) reasons.append(py::make_tuple(backend, reason));
            cd["reasons"] = reasons;
            cpu.append(cd);
          }
          py::list sts;
          for (const auto& st : mr.delegation.states) {
            py::dict sd;
            sd["state"] = st.state;
            sd["backend"] = st.backend;
            sd["resident"] = st.resident;
            sd["reason"] = st.reason;
            sts.append(sd);
          }
          py::dict del;
          del["backends"] = dbs;
          del["cpu_ops"] = cpu;
          del["states"] = sts;
          d["delegation"] = del;
          methods.append(d);
        }
        py::dict report;
        report["methods"] = methods;
        report["constant_bytes"] = c.constant_bytes;
        report["text"] = c.report();
        return py::make_tuple(py::bytes(reinterpret_cast<const char*>(c.bytes.data()), c.bytes.size()), report);
      }, py::arg("fold_constants") = true, py::arg("eliminate_dead_code") = true,
         py::arg("backends") = std::vector<std::string>{}, py::arg("require_delegation") = "",
         py::arg("fold_batch_norm") = true, py::arg("compute_dtype") = "float32",
         py::arg("alternatives") = std::vector<std::vector<std::string>>{},
         py::arg("quantize") = "", py::arg("group_size") = 128, py::arg("symmetric") = true,
         py::arg("scale_dtype") = "float32", py::arg("quantize_exclude") = std::vector<std::string>{},
         py::arg("quantize_embeddings") = false, py::arg("weights_dtype") = "float32",
         "Compiles; returns (program bytes, report dict). backends: delegate backends in order of "
         "preference; require_delegation: fail unless every node is delegated to that backend; "
         "fold_batch_norm: fold inference batch norms into the convolution/linear feeding them; "
         "compute_dtype: 'float32', 'float16' or 'bfloat16', the precision delegates that support it (mlx) compute in. "
         "report['methods'][i]['delegation'] = {backends: [{backend, segments, nodes, constant_bytes}], "
         "cpu_ops: [{op, count, reasons: [(backend, reason)]}], states: [{state, backend, resident, reason}]}. alternatives: e.g. [['mlx'], ['xnnpack']]: every "
         "method is compiled once per backend list and the loader runs the first whose backends are available "
         "(replaces backends/require_delegation; report['methods'] then has one entry per alternative). "
         "quantize: '' (off), 'w8' (int8 per output channel) or 'w4' (int4 in groups of group_size along the "
         "reduction dim; symmetric or not); scale_dtype 'float32' or 'float16'; quantize_exclude: fnmatch patterns of "
         "node debug names / weight names left in float32; quantize_embeddings: also quantize aten.embedding tables "
         "row by row. weights_dtype: 'float32' or 'float16' (float32 constants of "
         ">= 1024 elements stored as float16 in the file, widened to float32 at load).");
#ifdef KILN_HAVE_ONNX
  m.def("import_onnx", [](const std::string& path, const std::map<std::string, std::vector<int64_t>>& input_shapes,
                          const std::map<std::string, py::array>& constant_inputs) {
    onnx::ImportOptions o;
    o.input_shapes = input_shapes;
    for (const auto& [name, arr] : constant_inputs) {
      py::array a = py::array::ensure(arr, py::array::c_style);
      const std::string fmt = py::str(a.dtype()).cast<std::string>();
      auto d = dtype_from_name(fmt);
      if (!d) throw KilnError{Error(ErrorCode::InvalidArgument, "constant input '" + name + "': dtype " + fmt + " is not a Kiln dtype")};
      const auto* p = static_cast<const uint8_t*>(a.data());
      o.constant_inputs[name] = {TensorType{*d, std::vector<int64_t>(a.shape(), a.shape() + a.ndim())},
                                 std::vector<uint8_t>(p, p + a.nbytes())};
    }
    Result<onnx::ImportedModel> r = Error();
    {
      py::gil_scoped_release release;
      r = onnx::import_model(path, o);
    }
    if (!r.ok()) throw KilnError{r.error()};
    onnx::ImportedModel m = std::move(r).value();
    py::dict info;
    info["input_names"] = m.input_names;
    info["output_names"] = m.output_names;
    info["opset"] = m.opset;
    info["onnx_nodes"] = m.onnx_nodes;
    info["folded_nodes"] = m.folded_nodes;
    info["notes"] = m.notes;
    return py::make_tuple(std::move(m.graph), info);
  }, py::arg("path"), py::arg("input_shapes") = std::map<std::string, std::vector<int64_t>>{},
     py::arg("constant_inputs") = std::map<std::string, py::array>{},
     "Imports an ONNX model (opsets up to 22) into a Graph of Kiln ops; input_shapes: {name: sizes} for inputs "
     "with dynamic dims; constant_inputs: {name: array} binds inputs to fixed values (they become constants). Returns (Graph, {input_names, output_names, opset, onnx_nodes, folded_nodes, notes}). "
     "Raises KilnError (NotFound, InvalidProgram, NotSupported naming the node/op/attribute, InvalidArgument).");
  m.def("onnx_supported_ops", [] { return onnx::supported_op_types(); },
        "ONNX op types the importer maps onto Kiln ops.");
  m.def("onnx_opset_range", [] { return std::make_pair(onnx::kMinOpset, onnx::kMaxOpset); },
        "(min, max) default-domain opsets the ONNX importer accepts.");
#endif
  m.def("quantize_matrix", [](py::array_t<float, py::array::c_style | py::array::forcecast> w, const std::string& scheme,
                              int64_t group_size, bool symmetric, const std::string& scale_dtype) {
        if (w.ndim() != 2) throw py::value_error("w must be 2-D [rows, k]");
        QuantizeOptions o = quantize_options(scheme, group_size, symmetric, scale_dtype, {});
        std::vector<uint8_t> packed, scales, zeros;
        check(quantize_matrix(w.data(), w.shape(0), w.shape(1), o, packed, scales, zeros));
        auto bytes = [](const std::vector<uint8_t>& v) {
          py::array_t<uint8_t> a(static_cast<py::ssize_t>(v.size()));
          if (!v.empty()) std::memcpy(a.mutable_data(), v.data(), v.size());
          return a;
        };
        return py::make_tuple(bytes(packed), bytes(scales), bytes(zeros));
      }, py::arg("w"), py::arg("scheme"), py::arg("group_size") = 128, py::arg("symmetric") = true,
      py::arg("scale_dtype") = "float32",
      "Quantizes a float32 matrix [rows, k] as the compiler's quantization pass does ('w8' or 'w4'); returns raw "
      "bytes (packed weight, scales, zeros; zeros empty when symmetric). Layout: src/ir/ops/quant.h.");
  m.def("write_file_replacing", [](const std::string& path, py::bytes data) {
        const std::string_view v = data;
        Error e;
        {
          py::gil_scoped_release release;
          e = write_file_replacing(path, v.data(), v.size());
        }
        check(e);
      }, py::arg("path"), py::arg("data"),
      "Writes `data` to `path` complete or not at all (a temporary beside it renamed over it; a "
      "device or FIFO is written into; a symlink's target is replaced). The folder must exist. "
      "Raises KilnError (NotFound, InvalidArgument) naming the path and the system's reason.");
  m.def("backend_names", [] { return BackendRegistry::get().names(); },
        "Delegate backends compiled into this build (e.g. ['xnnpack']).");
  m.def("cpu_target", [] {
        check(cpu_target_status());
        return cpu_target();
      },
      "The SIMD target the optimized cpu kernels run at in this process (e.g. 'avx3_dl', 'avx2', "
      "'neon', 'scalar'): the best one this CPU supports, or the environment's KILN_CPU_TARGET (read "
      "once, at the first program load or call). Raises KilnError (InvalidArgument) when "
      "KILN_CPU_TARGET names a target that is unknown, not compiled or not supported here.");
  m.def("available_cpu_targets", [] { return available_cpu_targets(); },
        "The cpu kernel targets compiled into this build that this CPU supports, best first (ends with 'scalar').");
  m.def("compiled_cpu_targets", [] { return compiled_cpu_targets(); },
        "Every cpu kernel target compiled into this build, best first, whether this CPU supports it or not.");

  py::class_<PySession>(m, "Session", "One set of a program's state tensors (a conversation's KV cache).")
      .def("reset", [](PySession& s) {
        std::lock_guard<std::mutex> lock(*s.mu);
        s.session->reset();
      }, "Restores every state to its initial value.")
      .def("state", [](PySession& s, const std::string& name) {
        std::lock_guard<std::mutex> lock(*s.mu);
        Tensor t = unwrap(s.session->state(name));
        std::vector<uint8_t> copy(static_cast<const uint8_t*>(t.data), static_cast<const uint8_t*>(t.data) + t.nbytes());
        t.data = copy.data();
        return to_numpy(t);
      }, "A copy of state `name` as a NumPy array.")
      .def_property_readonly("failed", [](const PySession& s) { return s.session->failed(); });

  py::class_<PyMethod>(m, "Method", "An executable method instance.")
      .def("execute", [](PyMethod& pm, std::vector<py::array> inputs, PySession* session) {
        const MethodMeta& meta = pm.method.meta();
        std::vector<Tensor> ts;
        std::vector<py::array> keep;  // holds the (possibly converted) input arrays alive
        for (size_t i = 0; i < inputs.size(); ++i) {
          py::array a = py::array::ensure(inputs[i], py::array::c_style);
          if (!a) throw py::type_error("input " + std::to_string(i) + " is not an array");
          auto want = i < meta.inputs.size() ? meta.inputs[i].dtype : DType::Float32;
          std::string fmt = py::str(a.dtype()).cast<std::string>();
          auto d = dtype_from_name(fmt);
          if (fmt == "uint16" && want == DType::BFloat16) d = DType::BFloat16;
          if (!d) {
            const std::string label = i < meta.input_names.size() && !meta.input_names[i].empty()
                                          ? " '" + meta.input_names[i] + "'" : "";
            const std::string want_s =
                i < meta.inputs.size()
                    ? type_to_string(meta.inputs[i], i < meta.input_dims.size() ? meta.input_dims[i] : std::vector<std::string>{})
                    : "no such input";
            throw KilnError{Error(ErrorCode::InvalidArgument, "method '" + meta.name + "' input " + std::to_string(i) +
                                                              label + ": expected " + want_s + ", got a NumPy array of dtype " +
                                                              fmt + " (not a Kiln dtype)")};
          }
          ts.push_back(Tensor{*d, std::vector<int64_t>(a.shape(), a.shape() + a.ndim()), const_cast<void*>(a.data())});
          keep.push_back(a);
        }
        std::vector<Tensor> outs;
        std::vector<std::vector<uint8_t>> copies;  // outputs copied while the method is locked
        Error err;
        {
          py::gil_scoped_release release;
          std::lock_guard<std::mutex> lock(*pm.mu);
          std::unique_lock<std::mutex> slock;
          if (session != nullptr) slock = std::unique_lock<std::mutex>(*session->mu);
          auto r = session != nullptr ? pm.method.execute(*session->session, ts) : pm.method.execute(ts);
          if (r.ok()) {
            outs = std::move(r).value();
            for (const Tensor& t : outs) {
              const auto* p = static_cast<const uint8_t*>(t.data);
              copies.emplace_back(p, p + t.nbytes());
            }
          } else {
            err = r.error();
          }
        }
        if (!err.ok()) throw KilnError{err};
        py::list result;
        for (size_t i = 0; i < outs.size(); ++i) {
          outs[i].data = copies[i].data();
          result.append(to_numpy(outs[i]));
        }
        return result;
      }, py::arg("inputs"), py::arg("session") = nullptr,
         "Runs the method on NumPy arrays (on `session`'s state when given); returns a list of NumPy arrays (copies).")
      .def_property_readonly("meta", [](const PyMethod& pm) { return meta_dict(pm.method.meta()); },
                             "{name, inputs: [{dtype, sizes (upper bounds), name, dims}], outputs, symbols: "
                             "[(name, min, max)], states, arena_bytes}.")
      .def_property_readonly("inputs", [](const PyMethod& pm) {
        py::list l;
        for (const auto& t : pm.method.meta().inputs) l.append(type_dict(t));
        return l;
      })
      .def_property_readonly("outputs", [](const PyMethod& pm) {
        py::list l;
        for (const auto& t : pm.method.meta().outputs) l.append(type_dict(t));
        return l;
      })
      .def_property_readonly("num_fused_instructions", [](const PyMethod& pm) { return pm.method.num_fused_instructions(); },
                             "Instructions fused at load into the kernel before them (e.g. an activation into a convolution).")
      .def_property_readonly("prepared_bytes", [](const PyMethod& pm) { return pm.method.prepared_bytes(); },
                             "Bytes of kernel-prepared state (e.g. weights packed at load).")
      .def_property_readonly("alternative", [](const PyMethod& pm) {
        const MethodMeta& m = pm.method.meta();
        py::dict d;
        d["index"] = m.alternative;
        d["count"] = m.num_alternatives;
        d["skipped"] = m.skipped_alternatives;
        py::dict dc;
        for (const auto& [b, n] : m.delegate_counts) dc[py::str(b)] = n;
        d["delegate_segments"] = dc;
        return d;
      }, "Which of the program's alternatives for this method the loader chose: {index, count, skipped: "
         "[why each earlier one was skipped], delegate_segments: {backend: n}}.");

  py::class_<Program, std::shared_ptr<Program>>(m, "Program", "A loaded, verified .kiln program.")
      .def_static(
          "load",
          [](const std::string& path, const std::map<std::string, std::string>& settings, bool prefault, bool use_mmap) {
            LoadOptions o;
            o.backend_settings.assign(settings.begin(), settings.end());
            o.prefault = prefault;
            o.use_mmap = use_mmap;
            return unwrap(Program::load(path, o));
          },
          py::arg("path"), py::arg("backend_settings") = std::map<std::string, std::string>{}, py::arg("prefault") = false,
          py::arg("use_mmap") = true,
          "Maps and verifies a program. backend_settings: {'<backend>.<key>': value}, e.g. {'mlx.device': 'cpu'}. "
          "prefault: map every page of the file at load (LoadOptions::prefault). use_mmap=False: read the file "
          "into memory instead (LoadOptions::use_mmap).")
      .def_static(
          "from_bytes",
          [](py::bytes b, const std::map<std::string, std::string>& settings) {
            std::string s = b;
            LoadOptions o;
            o.backend_settings.assign(settings.begin(), settings.end());
            return unwrap(Program::load_from_buffer({reinterpret_cast<const uint8_t*>(s.data()), s.size()}, o));
          },
          py::arg("data"), py::arg("backend_settings") = std::map<std::string, std::string>{})
      .def_property_readonly("method_names", &Program::method_names)
      .def_property_readonly("metadata", [](const Program& p) {
        py::dict d;
        for (const auto& [k, v] : p.metadata()) d[py::str(k)] = v;
        return d;
      }, "The program's string key/values (e.g. llm.vocab_size).")
      .def_property_readonly("states", [](const Program& p) {
        py::list l;
        for (const auto& st : p.states()) {
          py::dict d = type_dict(st.type);
          d["name"] = st.name;
          d["zero_initial"] = st.zero_initial;
          l.append(d);
        }
        return l;
      }, "The program's state tensors: [{name, dtype, sizes, zero_initial}].")
      .def("method_meta", [](const Program& p, const std::string& name) { return meta_dict(unwrap(p.method_meta(name))); })
      .def("new_session", [](const Program& p) { return PySession{unwrap(p.new_session())}; },
           "A new session: the program's states at their initial values.")
      .def_property_readonly("constant_bytes", &Program::constant_bytes)
      .def_property_readonly("file_size", &Program::file_size)
      .def(
          "load_method",
          [](const Program& p, const std::string& name, int num_threads, bool portable_kernels_only) {
            if (num_threads < 0 || num_threads > ThreadPool::kMaxThreads) {
              throw py::value_error("num_threads must be between 1 and " + std::to_string(ThreadPool::kMaxThreads) +
                                    " (0 = the process-wide pool), got " + std::to_string(num_threads));
            }
            MethodOptions opts;
            std::shared_ptr<ThreadPool> pool;
            if (num_threads > 0) pool = std::make_shared<ThreadPool>(num_threads);
            opts.pool = pool.get();
            opts.portable_kernels_only = portable_kernels_only;
            return PyMethod{pool, unwrap(p.load_method(name, opts))};
          },
          py::arg("name"), py::arg("num_threads") = 0, py::arg("portable_kernels_only") = false,
          "Instantiates a method. num_threads: 0 = the process-wide pool (KILN_NUM_THREADS or the core "
          "count), else a pool of its own with that many threads (kernels and delegates). "
          "portable_kernels_only: run the reference kernels instead of the optimized cpu kernels.");
  register_llm(m, check);
}
