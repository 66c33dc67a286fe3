// Kiln runtime: load a .kiln program file and execute its methods.
//
//   auto program = kiln::Program::load("model.kiln");
//   if (!program.ok()) { puts(program.error().to_string().c_str()); return 1; }
//   auto method = (*program)->load_method("forward");
//   kiln::Tensor x{kiln::DType::Float32, {1, 3, 224, 224}, pixels};
//   auto outputs = method->execute({x});   // views into the method's arena
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/error.h"
#include "kiln/symbolic.h"
#include "kiln/tensor.h"
#include "kiln/thread_pool.h"

namespace kiln {

class Program;
class Session;
class DelegateState;
namespace detail { struct ProgramData; struct MethodPlan; }

/// A state tensor of a program (format version 2): persists across calls, owned by a Session.
struct StateInfo {
  std::string name;
  TensorType type;
  bool zero_initial = true;  ///< initial value zeros; false: a constant stored in the file
};

/// Description of one method's inputs, outputs and memory.
struct MethodMeta {
  std::string name;
  std::vector<std::string> input_names;
  std::vector<TensorType> inputs;
  std::vector<std::string> output_names;
  std::vector<TensorType> outputs;
  uint64_t arena_bytes = 0;       ///< activation arena planned at compile time
  size_t num_instructions = 0;
  size_t num_kernel_calls = 0;
  size_t num_delegate_calls = 0;  ///< one per delegated segment
  /// How many kernel calls of each op the method makes, sorted by op name
  /// (e.g. {"aten.add", 1}, {"aten.relu", 2}); delegate calls are not included.
  std::vector<std::pair<std::string, int>> op_counts;
  /// Kernel calls that run an optimized "cpu" kernel by default (the rest run the portable
  /// reference kernel; MethodOptions::portable_kernels_only makes all of them portable).
  size_t num_cpu_kernel_calls = 0;
  /// Per op, how many of its calls get an optimized cpu kernel (ops with none are left out),
  /// sorted by op name.
  std::vector<std::pair<std::string, int>> cpu_op_counts;
  /// Delegate segments per backend (e.g. {"xnnpack", 1}), sorted by backend name.
  std::vector<std::pair<std::string, int>> delegate_counts;
  /// Bytes of the constant tensors this method's kernel calls read (each counted once), by dtype
  /// (e.g. {"float32", n}, {"uint8", n}) and by weight scheme: the packed weights of the quantized
  /// ops together with their scales and zeros under "int8 per channel" or "int4 g<group> sym|asym",
  /// every other constant under its dtype. Constants of delegate payloads count under "delegate"
  /// in both lists (their element types are the backend's business). Sorted by name.
  std::vector<std::pair<std::string, uint64_t>> constant_bytes_by_dtype;
  std::vector<std::pair<std::string, uint64_t>> constant_bytes_by_scheme;
  /// Empty, or why load_method will return NotFound: a delegate backend of this method is not
  /// compiled in or not available (only with LoadOptions::defer_backend_errors).
  std::string unavailable;
  /// The program's alternatives for this method (1 without) and the one the loader chose
  /// (the first whose delegate backends are all available); skipped_alternatives holds why
  /// each earlier one was skipped.
  size_t alternative = 0;
  size_t num_alternatives = 1;
  std::vector<std::string> skipped_alternatives;
  /// Symbolic sizes: the method's symbols with their ranges, and per input / output the text of
  /// each dim's expression ("" for a fixed dim; e.g. "seq"). inputs / outputs then hold each
  /// size's upper bound; execute binds the symbols from the inputs' actual sizes.
  std::vector<SymbolDef> symbols;
  std::vector<std::vector<std::string>> input_dims;
  std::vector<std::vector<std::string>> output_dims;
  /// Names of the program states this method reads or writes (it then runs with a Session).
  std::vector<std::string> states;
  /// Per entry of `states`: the delegate backend that holds it for the session (e.g. "mlx": the
  /// KV cache in MLX's memory), or "" when it lives in the session's bytes.
  std::vector<std::string> state_holders;
};

/// Options for Program::load.
/// Settings for delegate backends, as ("<backend>.<key>", value) pairs, e.g. ("mlx.device", "cpu").
/// Each backend reads and validates its own keys (an unknown key of a backend is NotFound at load).
using BackendSettings = std::vector<std::pair<std::string, std::string>>;

/// The value of `key` in `settings` (the last one given), or null.
const std::string* find_setting(const BackendSettings& settings, std::string_view key);

struct LoadOptions {
  /// true: map the file (zero copy; from 2 MiB up at a 2 MiB-aligned address, advised
  /// MADV_HUGEPAGE, so that where the file system caches large folios the weights are mapped with
  /// 2 MiB pages: see docs/generative.md). false: read it into an owned buffer (a copy, aligned to
  /// 2 MiB and madvise(MADV_HUGEPAGE) when larger: transparent huge pages where the kernel grants them).
  bool use_mmap = true;
  /// With use_mmap: map every page of the file at load (MADV_POPULATE_READ), reading it from disk where
  /// it is not in the page cache, so that the first execute takes no page faults on the constants.
  /// Load takes longer and all of the file counts in the resident size at once, also the parts no
  /// method reads (another alternative's segments). `kiln generate` sets it (every decode step reads
  /// every weight); a 1.2 GB w8a8 LLM's first 128-token prefill was 10-15% faster (Zen 4).
  bool prefault = false;
  /// false (default): a delegate backend that is not compiled in or not available makes load
  /// fail with NotFound naming it. true: load verifies everything else and succeeds; the
  /// affected methods carry the reason in MethodMeta::unavailable and load_method returns
  /// that NotFound (tools that inspect any file; programs whose other methods run anyway).
  bool defer_backend_errors = false;
  /// Backend settings for this program (availability checks and every method's delegates), e.g.
  /// {{"mlx.device", "cpu"}} runs mlx segments on MLX's CPU device (like KILN_MLX_DEVICE=cpu).
  BackendSettings backend_settings;
};

/// Options for Program::load_method.
struct MethodOptions {
  /// Caller-supplied arena of at least MethodMeta::arena_bytes bytes, 64-byte aligned;
  /// empty: the method allocates its own.
  std::span<uint8_t> arena;
  /// Pool for kernels; null uses ThreadPool::default_pool(). Delegates run with as many
  /// threads as this pool has (their own pools sleep while Kiln's kernels run, and Kiln's
  /// pool sleeps while a delegate runs, so the two never compete for cores).
  ThreadPool* pool = nullptr;
  /// Portable: run the portable reference kernels only (no optimized cpu kernels); the
  /// default picks an optimized kernel wherever one accepts the call.
  bool portable_kernels_only = false;
};

/// Time spent in one instruction of a method, summed over the executions since profiling was
/// switched on (Method::set_profiling, Method::profile). Wall-clock time (steady_clock) around
/// the kernel or delegate call, so a multithreaded kernel counts once, not per thread.
struct InstructionProfile {
  size_t index = 0;                 ///< instruction index in the method
  std::string op;                   ///< ATen op, or "delegate:<backend>"
  std::string fused;                ///< op of the following instruction fused into this one, or empty
                                    ///< ("aten.add +aten.relu": the two following instructions)
  std::string kernel;               ///< "cpu" (optimized kernel), "portable" or "delegate"
  std::vector<TensorType> inputs;   ///< tensor arguments in schema order (None arguments left out)
  std::vector<TensorType> outputs;
  uint64_t calls = 0;               ///< executions timed
  double total_ms = 0.0;            ///< milliseconds over all of them
  double min_ms = 0.0;              ///< fastest single execution (robust against preemption on a busy machine)
  /// The latest timed execution: its start (std::chrono::steady_clock, nanoseconds since that clock's
  /// epoch) and its duration in nanoseconds; 0 when none was timed. For timelines (`kiln bench --trace`).
  int64_t last_start_ns = 0;
  int64_t last_ns = 0;
};

/// One value an instruction reads or writes, as the loader verified it (Program::method_instructions).
struct InstructionValue {
  int32_t index = -1;         ///< value index in the method; -1 for a None argument (nothing else set)
  std::string name;           ///< the compiler's debug name (may be empty; from the file: untrusted text)
  TensorType type;            ///< dtype and sizes (a symbolic size at its upper bound)
  int64_t arena_offset = -1;  ///< byte offset in the method's arena; -1 when not in the arena
  bool constant = false;      ///< a constant stored in the file
  std::string state;          ///< the program state whose bytes it is, or ""
};

/// One instruction of a method in execution order, as the loader resolved it: a kernel call (the op
/// and the kernel set that runs it by default) or a delegate call (the backend and its payload).
struct InstructionInfo {
  size_t index = 0;                     ///< position in the method (InstructionProfile::index)
  std::string op;                       ///< ATen op, or "delegate:<backend>"
  std::string backend;                  ///< delegate calls: the backend; "" for kernel calls
  std::string kernel;                   ///< "cpu" (optimized), "portable" or "delegate"
  std::string debug_name;               ///< the compiler's name of the node (may be empty)
  std::vector<InstructionValue> inputs;   ///< in schema order (delegate calls: the segment's inputs)
  std::vector<InstructionValue> outputs;
  uint64_t payload_bytes = 0;           ///< delegate calls: bytes of the payload segment
  size_t delegate_constants = 0;        ///< delegate calls: constants the payload refers to
  uint64_t delegate_constant_bytes = 0; ///< and their bytes
};

/// An executable instance of one method. Owns its activation state: separate Method
/// instances of one Program may execute concurrently from different threads; one instance
/// must not be executed from two threads at once.
class Method {
 public:
  Method(Method&&) noexcept;
  Method& operator=(Method&&) noexcept;
  ~Method();

  const MethodMeta& meta() const;
  /// Runs the method. Inputs must match meta().inputs exactly in count, dtype and sizes
  /// (InvalidArgument naming the input, the expected and the actual type otherwise).
  /// Returns views of the outputs, valid until the next execute() or destruction.
  Result<std::vector<Tensor>> execute(std::span<const Tensor> inputs);
  Result<std::vector<Tensor>> execute(std::initializer_list<Tensor> inputs) {
    return execute(std::span<const Tensor>(inputs.begin(), inputs.size()));
  }
  /// Runs the method on `session`'s state (a program with state tensors; another program's
  /// session is InvalidArgument). Inputs with symbolic dims may take any size in the symbol's
  /// range (InvalidArgument naming the input, dim, symbol and range otherwise, or when two inputs
  /// disagree on a symbol); outputs have the actual sizes. The checks happen before anything runs,
  /// and the state is written only when the call succeeds: updates copied at the end, or, for
  /// updates written in place (a KV cache's index_put), by the updating kernel, whose own index
  /// checks come before its writes. If an instruction fails after such a write, the session is
  /// marked failed (Session::failed) and refuses calls (FailedPrecondition-like InvalidArgument)
  /// until reset(). execute(inputs) on a stateful method uses a session owned by this Method.
  Result<std::vector<Tensor>> execute(Session& session, std::span<const Tensor> inputs);
  Result<std::vector<Tensor>> execute(Session& session, std::initializer_list<Tensor> inputs) {
    return execute(session, std::span<const Tensor>(inputs.begin(), inputs.size()));
  }
  /// Bytes this instance holds in kernel-prepared state (e.g. weights packed at load for the
  /// cpu kernels), on top of the arena and the file's constants.
  uint64_t prepared_bytes() const;
  /// Instructions this instance skips because the kernel before them computes them too (an
  /// activation fused into a convolution's epilogue at load, bit-identical results).
  size_t num_fused_instructions() const;
  /// Per-instruction timing: on, every later execute() times each instruction it runs (two clock
  /// reads per instruction; off, the cost is one branch). Switching it on or off clears the
  /// counters.
  void set_profiling(bool on);
  /// The instructions executed since profiling was switched on, in method order (instructions
  /// skipped because the kernel before them computes them are left out; see
  /// InstructionProfile::fused). Empty when profiling is off.
  std::vector<InstructionProfile> profile() const;

 private:
  friend class Program;
  Method();
  Error bind_sizes(std::span<const Tensor> inputs);
  Result<std::vector<Tensor>> execute_impl(Session* session, std::span<const Tensor> inputs);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// A loaded, verified program file. Immutable and shareable between threads.
class Program : public std::enable_shared_from_this<Program> {
 public:
  /// Maps (or reads) and verifies the file: header magic and version, the FlatBuffers
  /// verifier, then semantic checks of every method (indices, offsets and sizes in range,
  /// byte sizes consistent with dtypes and shapes, every kernel call re-typed by the op
  /// registry). Errors: NotFound (no such file), InvalidProgram (anything malformed),
  /// OperatorMissing (an op with no kernel), NotFound (a delegate backend missing).
  static Result<std::shared_ptr<Program>> load(const std::string& path, const LoadOptions& options = {});
  /// Same checks on a buffer in memory (copied).
  static Result<std::shared_ptr<Program>> load_from_buffer(std::span<const uint8_t> bytes,
                                                           const LoadOptions& options = {});

  ~Program();
  uint32_t format_version() const;
  std::vector<std::string> method_names() const;
  /// NotFound when there is no such method.
  Result<MethodMeta> method_meta(const std::string& name) const;
  /// method_instructions' default: the alternative the loader chose (MethodMeta::alternative).
  static constexpr size_t kChosenAlternative = static_cast<size_t>(-1);
  /// The method's instructions in execution order, with each argument's type and arena offset, for
  /// tools that show how a method runs (`kiln report`): of the alternative the loader chose, or of
  /// alternative `alternative` (0 .. MethodMeta::num_alternatives - 1; one that was not chosen is
  /// shown as the file has it, never run). NotFound for no such method or alternative.
  Result<std::vector<InstructionInfo>> method_instructions(const std::string& name,
                                                           size_t alternative = kChosenAlternative) const;
  /// NotFound (no such method), MemoryAllocationFailed (arena too small or allocation failed).
  Result<Method> load_method(const std::string& name, const MethodOptions& options = {}) const;
  /// Total bytes of constant data (stored once even when shared by methods).
  uint64_t constant_bytes() const;
  uint64_t file_size() const;
  /// The program's state tensors (empty for a stateless program).
  const std::vector<StateInfo>& states() const;
  /// The string key/values the compiler stored (ProgramBuilder::set_metadata), in file order.
  const std::vector<std::pair<std::string, std::string>>& metadata() const;
  /// The value of metadata `key`, or null.
  const std::string* metadata_value(std::string_view key) const;
  /// A new session: one set of the program's states at their initial values (two sessions are
  /// two independent conversations). MemoryAllocationFailed when the states do not fit.
  Result<std::unique_ptr<Session>> new_session() const;

 private:
  friend class Session;
  friend class Method;
  Program();
  std::unique_ptr<detail::ProgramData> data_;
};

/// One set of a program's state tensors (e.g. a KV cache), shared by the program's methods:
/// Method::execute(session, ...) reads and updates it. Sessions are independent: two of one
/// program may run concurrently from different threads (each with its own Method instance); one
/// session must not be used by two threads at once.
class Session {
 public:
  ~Session();
  /// Restores every state to its initial value and clears failed().
  void reset();
  /// A view of state `name` (valid for the session's life): NotFound when there is none. A state
  /// that a delegate holds (docs/mlx.md "State in the delegate") is copied from the delegate into
  /// the session's bytes first; the view shows it as of this call.
  Result<Tensor> state(std::string_view name) const;
  /// True after a call failed once it had written state in place; execute refuses until reset().
  bool failed() const { return !failure_.empty(); }
  const std::string& failure() const { return failure_; }
  const Program& program() const { return *program_; }

 private:
  friend class Program;
  friend class Method;
  Session() = default;
  std::shared_ptr<const Program> program_;
  std::vector<void*> buffers_;  ///< per program state, 64-byte aligned
  /// Per program state: the delegate's copy when a delegate holds it (created by the delegate's
  /// first call after new_session / reset, from buffers_, which hold the initial value until then).
  std::vector<std::unique_ptr<DelegateState>> held_;
  std::string failure_;
};

}  // namespace kiln
