// The delegate contract (../shared/DESIGN.md "Backends"): one interface holding both halves of a
// backend. The compile half decides support and lowers subgraphs to payload bytes; the run half
// turns a payload back into an executable handle. A backend library registers its backend when it
// is linked (KILN_REGISTER_BACKEND below: a registrar next to an anchor symbol that the library's
// CMake target makes the linker resolve, so a static archive's member is never dropped; see
// docs/packaging.md); applications and tests may add more with register_backend.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/compiler.h"
#include "kiln/error.h"
#include "kiln/runtime.h"
#include "kiln/tensor.h"

namespace kiln {

/// A connected, convex set of nodes of one graph handed to a backend for lowering.
/// `inputs`: non-constant values read by the nodes and produced outside (method inputs or
/// other nodes' outputs), in first-use order. `outputs`: values produced inside and read
/// outside (or method outputs), in definition order. `constants`: constant values read by the
/// nodes, in first-use order; at run time `init` receives their bytes in this order.
struct Subgraph {
  const Graph* graph = nullptr;
  std::vector<size_t> nodes;        ///< indices into graph->nodes(), topological order
  std::vector<ValueId> inputs;
  std::vector<ValueId> outputs;
  std::vector<ValueId> constants;
  /// CompileOptions::compute_dtype: Float32, or Float16/BFloat16 for backends that support
  /// reduced precision (others ignore it and compute in float32).
  DType compute_dtype = DType::Float32;
  /// States the backend holds (only for a backend whose holds_state() is true): the graph's state
  /// `state` (index into graph->states()), whose start-of-call value `read` (kNoValue when the
  /// nodes do not read it) only these nodes read, and whose new value `update` (kNoValue: unchanged)
  /// these nodes produce and nothing outside reads. Neither is in `inputs` / `outputs`: at run time
  /// the backend keeps the value between calls (Backend::execute's ExecuteContext::states).
  struct State {
    size_t state = 0;
    ValueId read = kNoValue;
    ValueId update = kNoValue;
  };
  std::vector<State> states;
};

/// What `init` receives for a lowered subgraph, taken from its graph: the constants' bytes (in
/// Subgraph::constants order) and the boundary types. Used by the compile-time build checks
/// (Backend::check_build), which run init's code on the compiler's own graph.
struct SubgraphBoundary {
  std::vector<std::span<const uint8_t>> constants;  ///< views of the graph's constant bytes
  std::vector<TensorType> inputs, outputs;
  explicit SubgraphBoundary(const Subgraph& sg);
};

/// Opaque state a backend builds at init from one payload (e.g. an XNNPACK runtime).
class DelegateHandle {
 public:
  virtual ~DelegateHandle() = default;
};

/// A program state held by a backend for one session (a KV cache kept in MLX's memory): created by
/// the backend at the first call that needs it, from the state's initial bytes, and destroyed by
/// Session::reset() (the next call creates it again) or with the session.
class DelegateState {
 public:
  virtual ~DelegateState() = default;
  /// Copies the current value into `dst` (`nbytes`: the state's TensorType::nbytes(), in its
  /// dtype), for Session::state(). Internal on failure.
  virtual Error read(void* dst, size_t nbytes) const = 0;
};

/// One state a delegate call holds (Subgraph::states), as the runtime hands it to execute.
struct DelegateStateSlot {
  std::unique_ptr<DelegateState>* state = nullptr;  ///< the session's slot; null object = not created yet
  TensorType type;                                  ///< the state's type
  std::span<const uint8_t> initial;                 ///< its initial value (type.nbytes() bytes)
};

/// What a call carries besides its boundary tensors.
struct ExecuteContext {
  /// The method's symbol values for this call (indexed like the graph's symbols; empty without).
  std::span<const int64_t> symbols;
  /// The held states, in the payload's order (Subgraph::states). A backend replaces a slot's
  /// object (or updates it) only when the call succeeds: a failed call leaves every state as it was.
  std::span<const DelegateStateSlot> states;
};

/// Run-time settings for one delegate handle, from the method's load options.
struct DelegateOptions {
  /// Threads the delegate may use (Kiln's pool for this method has as many; it sleeps while
  /// the delegate runs). 1 = run on the calling thread only.
  int num_threads = 1;
  /// The program's LoadOptions::backend_settings (never null while init runs).
  const BackendSettings* settings = nullptr;
  /// The types of the program states the call holds (DelegateCall.states, in the payload's order):
  /// init refuses a payload that expects others (InvalidProgram), at load_method, before a session
  /// allocates them.
  std::span<const TensorType> held_states;
};

/// One delegate backend. Implementations must be thread-safe for concurrent calls on
/// different handles; one handle is used by one thread at a time.
class Backend {
 public:
  virtual ~Backend() = default;
  /// Stable name stored in program files, e.g. "xnnpack".
  virtual std::string name() const = 0;

  // ---- compile half ----
  /// Ok when the backend can lower `graph.nodes()[node]` alone; otherwise NotSupported with
  /// the reason (e.g. "alpha=10 on aten.add is not supported"). Must be decided by the same
  /// code that lowers.
  virtual Error support(size_t node, const Graph& graph) const = 0;
  /// Why this backend declines a node with symbolic sizes (a dynamic dim or a symbolic attribute;
  /// the partitioner asks no further). Backends that build for fixed shapes say what stops them.
  /// Empty when the backend lowers nodes with symbolic sizes (its payload then carries the
  /// expressions; execute gets the call's symbol values in ExecuteContext::symbols).
  virtual std::string symbolic_sizes_reason() const {
    return "symbolic sizes: the " + name() + " delegate runs fixed shapes only";
  }
  /// True when the backend can hold program states between calls (Subgraph::states): the
  /// partitioner then gives it the states that only its segment reads and writes.
  virtual bool holds_state() const { return false; }
  /// Lowers a subgraph whose every node `support` accepted into payload bytes.
  virtual Result<std::vector<uint8_t>> lower(const Subgraph& subgraph) const = 0;
  /// Proves at compile time that `payload` (what `lower` wrote for `subgraph`) builds, by running
  /// the code that `init` runs, on this machine, with the graph's constants: a program that
  /// compiled must load wherever its backends are available (docs/delegation.md "Support decided
  /// by building"). Returns Ok when it builds, and also when this backend is not available here
  /// (then `*checked` is false and `lower`'s own limit checks are all that decide). Otherwise
  /// NotSupported with init's reason; `*node_at_fault` is then the position in `subgraph.nodes`
  /// of the node that failed, or SIZE_MAX when the backend cannot tell (the partitioner then
  /// declines the whole group). The default runs `init` then `destroy` (num_threads 1, no
  /// settings) and cannot name the node; backends override it to name one.
  virtual Error check_build(const Subgraph& subgraph, std::span<const uint8_t> payload, size_t* node_at_fault,
                            bool* checked) const;

  // ---- run half ----
  /// Ok, or NotFound with the reason this backend cannot run on this machine.
  /// `settings`: LoadOptions::backend_settings; a backend rejects keys "<name>.*" it does not
  /// know (NotFound naming the key).
  virtual Error is_available(const BackendSettings& settings) const = 0;
  /// Builds an executable handle from an untrusted payload. `constants` are the bytes of the
  /// constants the payload refers to by position; `inputs`/`outputs` the boundary types the
  /// program expects (the payload must agree: InvalidProgram otherwise). Never aborts.
  virtual Result<std::unique_ptr<DelegateHandle>> init(std::span<const uint8_t> payload,
                                                       std::span<const std::span<const uint8_t>> constants,
                                                       std::span<const TensorType> inputs,
                                                       std::span<const TensorType> outputs,
                                                       const DelegateOptions& options) const = 0;
  /// Runs the handle: inputs/outputs are contiguous tensors of the types given to init (for a
  /// payload with symbolic sizes: of this call's sizes, within those bounds).
  virtual Error execute(DelegateHandle& handle, std::span<const Tensor* const> inputs,
                        std::span<Tensor* const> outputs) const = 0;
  /// execute with the call's symbol values and held states (what the runtime calls); the default,
  /// for backends with neither, calls execute(handle, inputs, outputs).
  virtual Error execute_in_context(DelegateHandle& handle, std::span<const Tensor* const> inputs, std::span<Tensor* const> outputs,
                        const ExecuteContext& context) const {
    (void)context;
    return execute(handle, inputs, outputs);
  }
  /// Releases the handle (default: deletes it).
  virtual void destroy(std::unique_ptr<DelegateHandle> handle) const { handle.reset(); }
};

/// The set of backends known to this process: those whose libraries are linked into it
/// (kiln::backend_xnnpack, kiln::backend_mlx: each registers itself at static initialization)
/// plus any added with register_backend.
class BackendRegistry {
 public:
  static BackendRegistry& get();
  /// Null when no backend of that name is registered.
  const Backend* find(std::string_view name) const;
  /// Adds a backend (replaces one of the same name). Backends are never removed, so pointers
  /// returned by find stay valid for the life of the process.
  void add(std::unique_ptr<Backend> backend);
  std::vector<std::string> names() const;

 private:
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Backend>> backends_;
  std::vector<std::unique_ptr<Backend>> retired_;
};

/// Registers a backend in BackendRegistry::get() (applications and tests).
void register_backend(std::unique_ptr<Backend> backend);

}  // namespace kiln

/// Self-registration of a backend library: `KILN_REGISTER_BACKEND(xnnpack, std::make_unique<XnnpackBackend>)` at
/// namespace scope of one of the library's source files defines `kiln_backend_xnnpack_anchor` (an
/// extern "C" function that the CMake target kiln::backend_xnnpack names in its INTERFACE link
/// options, `--undefined=kiln_backend_xnnpack_anchor`) and, in the same object file, a registrar
/// that calls register_backend(factory()) during static initialization. Because the linker must
/// resolve the anchor, the object file (and so the registrar) is linked whenever the target is,
/// even from a static library that nothing else references. `factory` returns
/// std::unique_ptr<Backend> and must be cheap (no device probing: that is is_available's job).
#define KILN_REGISTER_BACKEND(name, factory)                                                      \
  extern "C" __attribute__((used)) void kiln_backend_##name##_anchor() {}                         \
  namespace {                                                                                     \
  [[maybe_unused]] const bool kiln_backend_##name##_registered = (::kiln::register_backend(factory()), true); \
  }

namespace kiln {
}  // namespace kiln
