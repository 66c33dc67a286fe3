// Kiln's ONNX frontend (optional component kiln::onnx, built when libonnx-dev and
// libprotobuf-dev are found): imports an ONNX model into a compiler Graph of ATen ops, the same
// input ProgramBuilder takes from the PyTorch capture.
//
//   kiln::onnx::ImportOptions o;
//   o.input_shapes["x"] = {1, 3, 640, 640};
//   auto m = kiln::onnx::import_model("det.onnx", o);
//   kiln::ProgramBuilder pb; pb.add_method("forward", std::move(m->graph));
//
// The runtime never depends on this component (nor on protobuf).
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "kiln/compiler.h"
#include "kiln/error.h"

namespace kiln::onnx {

/// Options of import_model.
struct ImportOptions {
  /// Static sizes for graph inputs, by ONNX input name. Required for every input with a
  /// symbolic or unknown dimension; when given for an input with static dims they must agree
  /// (InvalidArgument otherwise). Every name must be a graph input (InvalidArgument).
  std::map<std::string, std::vector<int64_t>> input_shapes;
  /// Graph inputs bound to fixed values: each becomes a constant (and is no longer a program
  /// input), so shapes, axes, scales, ... computed from it fold at import. The element type must
  /// be the input's and the sizes must agree with its static dims; bytes must hold exactly
  /// type.nbytes() bytes (InvalidArgument otherwise).
  std::map<std::string, std::pair<TensorType, std::vector<uint8_t>>> constant_inputs;
  /// Largest model file accepted (bytes); protobuf itself is limited to 2 GiB.
  uint64_t max_file_bytes = uint64_t{2} << 30;
  /// Largest constant the importer creates or evaluates at import (bytes): a node whose inputs
  /// are all constants is left to the compiler above it, and a converter that would build a
  /// larger helper constant (a mask, an index table) refuses the node (NotSupported). Bounds the
  /// memory a hostile file can make the import allocate (tests/fuzz uses 16 MiB).
  uint64_t max_constant_bytes = uint64_t{1} << 30;
};

/// An imported model.
struct ImportedModel {
  Graph graph;                            ///< inputs and outputs in the ONNX graph's order
  std::vector<std::string> input_names;   ///< ONNX names of graph.inputs()
  std::vector<std::string> output_names;  ///< ONNX names of graph.outputs()
  int64_t opset = 0;                      ///< default-domain opset the model imports
  size_t onnx_nodes = 0;                  ///< nodes in the ONNX graph
  size_t folded_nodes = 0;                ///< ONNX nodes evaluated at import (shape subgraphs, constants)
  std::vector<std::string> notes;         ///< things the user may want to know (e.g. ignored training outputs)
};

/// Opsets of the default ("" / "ai.onnx") domain this importer accepts. Ops whose semantics
/// changed are refused (NotSupported) below the version the importer implements, e.g.
/// Reshape before 5 and BatchNormalization, Gemm, Clip, Cast, Dropout, Sum/Max/Min/Mean before 6;
/// opset 6's legacy broadcast/axis attributes of the binary ops are honoured.
constexpr int64_t kMinOpset = 1;
constexpr int64_t kMaxOpset = 22;

/// Imports the ONNX model at `path`. External data files are read relative to the model's
/// directory and must stay inside it. Errors (never exceptions, never crashes on hostile files):
///   NotFound         the file (or an external data file) cannot be opened;
///   InvalidProgram   not a parseable ModelProto, or inconsistent contents (tensor byte sizes,
///                    dangling or duplicate value names, cycles, bad indices);
///   NotSupported     an op, attribute value, dtype or opset Kiln cannot import; the message
///                    names the node (name and index), its op type and the attribute;
///   InvalidArgument  bad ImportOptions (unknown input name, missing static shape).
Result<ImportedModel> import_model(const std::string& path, const ImportOptions& options = {});

/// The same for a serialized ModelProto in memory; `base_dir` is where external data files are
/// looked up ("" refuses external data).
Result<ImportedModel> import_model_bytes(std::span<const uint8_t> bytes, const std::string& base_dir,
                                         const ImportOptions& options = {});

/// ONNX op types (default domain) this importer maps onto Kiln ops, sorted.
std::vector<std::string> supported_op_types();

}  // namespace kiln::onnx
