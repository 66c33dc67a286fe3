// Internal state of a loaded Program and the verified, resolved plan of each method.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "kernels/kernel.h"
#include "kiln/runtime.h"
#include "kiln/symbolic.h"

namespace kiln::detail {

/// Bytes of a program file: a read-only mapping or an owned aligned buffer.
class FileBytes {
 public:
  /// use_mmap: a read-only mapping, 2 MiB-aligned and advised MADV_HUGEPAGE from 2 MiB up (see
  /// map_file in loader.cpp). prefault: every page populated at load (LoadOptions::prefault).
  static Result<std::unique_ptr<FileBytes>> map(const std::string& path, bool use_mmap, bool prefault = false);
  static Result<std::unique_ptr<FileBytes>> copy(std::span<const uint8_t> bytes);
  /// An owned buffer of `size` bytes (contents unset): 2 MiB-aligned and madvise(MADV_HUGEPAGE)
  /// from 2 MiB up, else kSegmentAlignment-aligned.
  static Result<std::unique_ptr<FileBytes>> allocate(uint64_t size);
  ~FileBytes();
  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  /// Drops the whole pages of [p, p + n) that lie in a read-only file mapping from this process's
  /// memory (madvise MADV_DONTNEED): their contents stay valid and are re-read from the file if
  /// anything reads them again. For bytes a kernel copied into its own state (packed weights), so
  /// the copy does not double the resident size. No-op for an owned buffer or outside the mapping.
  void release_pages(const void* p, size_t n) const;

 private:
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  bool mapped_ = false;
  void* owned_ = nullptr;
};

/// One instruction, resolved at load: a kernel call (kernel set) or a delegate call (backend set).
struct PlannedInstruction {
  KernelFn kernel = nullptr;            // the best kernel (an optimized one where it accepts the call)
  KernelFn portable_kernel = nullptr;   // the reference kernel (MethodOptions::portable_kernels_only)
  const Backend* backend = nullptr;                          // delegate calls only (null if backend_error)
  std::string backend_name;                                  // delegate calls only
  Error backend_error;  // NotFound when the backend is missing/unavailable (LoadOptions::defer_backend_errors)
  std::span<const uint8_t> payload;                          // delegate payload segment (in the file)
  std::vector<std::span<const uint8_t>> delegate_constants;  // by position, as the payload refers to them
  std::vector<int32_t> args;     // value indices, -1 = None
  std::vector<int32_t> outputs;
  Attributes attrs;              // normalized
  std::string op;                // ATen op, or "delegate:<backend>"
  std::string debug_name;
  /// Int attributes whose value is a symbolic expression (set into a copy of attrs per call).
  struct SymAttr {
    std::string name;
    int64_t index = -1;
    SymExpr expr;
  };
  std::vector<SymAttr> sym_attrs;
  bool dynamic = false;          // reads or writes a value with symbolic sizes, or has sym_attrs
  bool writes_state = false;     // writes a state's bytes in place (an index_put into a KV cache)
  /// Delegate calls: the program states the backend holds for the session (DelegateCall.states),
  /// in the payload's order. Such a call counts as writing state (writes_state).
  std::vector<uint32_t> held_states;
};

/// A method after verification: everything needed to instantiate it.
struct MethodPlan {
  MethodMeta meta;
  std::vector<TensorType> value_types;
  std::vector<const uint8_t*> constant_data;  // per value; null unless constant
  std::vector<uint8_t> stored_half;           // per value; 1 for a float32 constant stored as float16
  std::vector<int64_t> arena_offsets;         // per value; -1 for constants
  std::vector<std::string> value_names;       // per value; the file's debug name (Program::method_instructions)
  std::vector<int32_t> inputs;
  std::vector<int32_t> outputs;
  std::vector<PlannedInstruction> instructions;
  // Symbolic sizes (format version 2): the method's symbols, per value its size expressions
  // (empty: fixed sizes; value_types then hold the upper bounds), and per symbol the input
  // dimension that binds it at execute: (input position, dim).
  std::vector<SymbolDef> symbols;
  std::vector<std::vector<SymExpr>> value_sym;
  std::vector<std::pair<size_t, size_t>> symbol_binding;
  std::vector<int32_t> dynamic_values;  // values with symbolic sizes
  // State: per value the program state whose bytes it is (-1: none), and the updates copied into
  // the states after a successful call: (state, value) where the value is not the state's bytes.
  std::vector<int32_t> value_state;
  std::vector<std::pair<uint32_t, int32_t>> state_copies;
  bool uses_state = false;
  /// Per program state: the backend holding it in this method (a delegate call's held_states), or
  /// "" when the method keeps it in the session's bytes or does not use it.
  std::vector<std::string> state_holder;
};

/// A state tensor of the program (format version 2).
struct StatePlan {
  std::string name;
  TensorType type;
  const uint8_t* initial = nullptr;  // initial bytes in the file, or null for zeros
};

struct ProgramData {
  std::unique_ptr<FileBytes> bytes;
  uint32_t version = 0;
  uint64_t constant_bytes = 0;
  BackendSettings backend_settings;  // LoadOptions::backend_settings, handed to delegate init
  std::vector<MethodPlan> methods;
  /// The alternatives the loader did not choose, per method name: (alternative index, plan). Never
  /// instantiated; kept for Program::method_instructions (tools that show every alternative).
  std::map<std::string, std::vector<std::pair<size_t, MethodPlan>>> other_alternatives;
  std::vector<StatePlan> states;
  std::vector<StateInfo> state_infos;  // Program::states()
  std::vector<std::pair<std::string, std::string>> metadata;
  // Float32 copies (64-byte aligned) of the constants stored as float16, by constant index;
  // widened once at load and shared by every method that reads them.
  std::map<int32_t, std::shared_ptr<float>> widened;
};

/// What the runtime offers kernel call k's prepare to fuse (KernelPrepareArgs::next).
struct FusionOffer {
  bool next = false;   ///< instruction k + 1 (FusionCandidate): an epilogue op or a residual add
  int32_t other = -1;  ///< for a residual add: its other input (FusionCandidate::other), else -1
  bool then = false;   ///< after a residual add: instruction k + 2, an epilogue op (FusionCandidate::then)
};

/// The fusion the runtime offers kernel call k of `plan` (src/runtime/program.cpp): instruction
/// k + 1 when the fusion table (src/ir/fusion.h, fold_as) lets it fold into instruction k's op and
/// the data flow allows it: it reads k's only output, which nothing else reads (readers[v]: the
/// number of instruction arguments that are value v) and which is no method output; same types and
/// symbolic sizes, no state; its output's arena bytes overlap neither k's inputs nor the add's
/// other input. For a residual add, also instruction k + 2 when the table allows an epilogue after
/// the add (epilogue_after_add) and the same holds for it.
FusionOffer fusion_offer(const MethodPlan& plan, size_t k, const std::vector<int>& readers);

/// Verifies `bytes` and builds the method plans (the loader: src/runtime/loader.cpp).
/// `defer_backend_errors`: a missing or unavailable delegate backend is recorded in the plan
/// (PlannedInstruction::backend_error) instead of failing; load_method then returns it.
Result<std::unique_ptr<ProgramData>> verify_and_plan(std::unique_ptr<FileBytes> bytes, bool defer_backend_errors,
                                                     const BackendSettings& settings);

}  // namespace kiln::detail
