// The kernel interface: a kernel implements one op of the registry (src/ir/op_registry.h)
// for contiguous tensors whose shapes the op's inference has already checked.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "kiln/attributes.h"
#include "kiln/error.h"
#include "kiln/tensor.h"
#include "kiln/thread_pool.h"

namespace kiln {

/// State a kernel prepared for one instruction of one Method instance (KernelPrepare), e.g.
/// weights packed once at load instead of on every call; owned by the Method, read-only (and
/// shared by concurrent calls of the kernel) during execute.
struct KernelState {
  virtual ~KernelState() = default;
  size_t bytes = 0;  ///< memory the state holds (reported as Method::prepared_bytes())
  /// True when the kernel also computes the follow-on instruction offered to prepare
  /// (KernelPrepareArgs::next): it writes that instruction's output, which the runtime then skips.
  bool fused_next = false;
  /// True (with fused_next) when the kernel also computes FusionCandidate::then: it writes the
  /// output of the instruction after `next`, which the runtime then skips too.
  bool fused_then = false;
  /// Indices of constant inputs the kernel never reads again after prepare, because the state
  /// holds what it needs (e.g. convolution weights packed for the GEMM). The runtime may drop
  /// their pages from memory (FileBytes::release_pages: re-read from the file if read again).
  std::vector<size_t> released_inputs;
};

/// Arguments of one kernel call. Inputs follow the op's schema order (nullptr = None);
/// outputs are preallocated with their inferred types. `attrs` are normalized.
struct KernelArgs {
  std::span<const Tensor* const> inputs;
  std::span<Tensor* const> outputs;
  const Attributes& attrs;
  ThreadPool* pool = nullptr;         ///< may be null: run single-threaded
  const KernelState* state = nullptr; ///< what the kernel's prepare returned for this instruction, or null
};

/// Runs the op. Returns NotSupported for a dtype or configuration the kernel lacks.
using KernelFn = Error (*)(const KernelArgs&);

/// The types and attributes of one kernel call, known at load time (before any data exists).
/// `inputs[i]` is null for a None argument.
struct KernelSignature {
  std::span<const TensorType* const> inputs;
  std::span<const TensorType* const> outputs;
  const Attributes& attrs;
};

/// True when an optimized kernel handles this call (dtype, rank, attributes); a kernel that
/// accepts a call must run it correctly for every tensor of those types.
using KernelAccepts = bool (*)(const KernelSignature&);

/// The instruction right after a kernel call, offered to the kernel's prepare for fusion only
/// when the fusion table (src/ir/fusion.h, fold_as) lets it fold into the call's op: an epilogue
/// op (e.g. aten.relu; epilogue_of gives its Epilogue, cpu::post_op_of) whose only tensor input is
/// the call's only output, or a residual add (aten.add, alpha 1) of that output and one other
/// tensor of the same type, where nothing else reads the call's output. A kernel may decline it. If the kernel fuses it (KernelState::fused_next),
/// each call must write exactly what the two instructions would have written (`op` applied to
/// the call's result, in the same float operations: bit-identical), into the call's outputs[0],
/// which the runtime then points at the follow-on instruction's output. For the two-input case
/// the runtime passes the other tensor to each call as one extra input after the call's own
/// (KernelArgs::inputs[number of schema inputs]); the planner and loader guarantee that its
/// bytes do not overlap the output's.
struct FusionCandidate {
  std::string_view op;
  const Attributes& attrs;
  const TensorType* other = nullptr;  ///< aten.add's other input (same type as the output), else null
  /// When this is an aten.add (other set): the instruction after it, if it is a single-input op
  /// on the add's output that nothing else reads (e.g. resnet's relu after the residual add),
  /// whose output's bytes overlap none of the fusing call's inputs (nor `other`); else null.
  /// Fused (KernelState::fused_then), the call writes `then` applied to the sum, bit-identical.
  const FusionCandidate* then = nullptr;
};

/// Inputs of a kernel's prepare: the call's signature, its constant inputs (by schema position;
/// null where the input is not a constant or is None; their data stays valid for the Method's
/// lifetime), and the follow-on instruction it may fuse (null when none is eligible).
struct KernelPrepareArgs {
  const KernelSignature& sig;
  std::span<const Tensor* const> constants;
  const FusionCandidate* next = nullptr;
};

/// Builds an instruction's KernelState once per Method instance (load_method). Returning a null
/// state is fine (the kernel then runs unprepared, state == nullptr); an error fails load_method.
using KernelPrepare = Result<std::unique_ptr<KernelState>> (*)(const KernelPrepareArgs&);

/// Which kernels a method runs: the optimized cpu kernels where one accepts the call (the
/// default), or the portable reference kernels only (the numerical oracle; benchmarks).
enum class KernelSet { Optimized, Portable };

/// Every kernel compiled into this build. Each op has one portable kernel (every dtype and
/// configuration the op allows, simple and exact) and any number of optimized "cpu" kernels,
/// each with an accepts() predicate; select() takes the first optimized kernel that accepts
/// the call, else the portable one. Selection happens once per instruction at load time.
class KernelRegistry {
 public:
  /// The registry with every kernel compiled into this build (portable, then cpu).
  static const KernelRegistry& get();
  /// The portable kernel of `op`, or null.
  KernelFn find(std::string_view op) const;
  /// The kernel that runs a call of `op` with `sig` under `set`, or null when `op` has none.
  /// `symbolic`: the call has symbolic sizes (sig holds their upper bounds; each call's actual
  /// sizes may be smaller), so only an optimized kernel registered with sizes_at_call may take it.
  KernelFn select(std::string_view op, const KernelSignature& sig, KernelSet set, bool symbolic = false) const;
  /// Name of the set the kernel select() returns belongs to: "cpu" or "portable".
  const char* set_name(KernelFn fn) const;
  /// The prepare function registered with optimized kernel `fn`, or null.
  KernelPrepare prepare_of(KernelFn fn) const;
  void add(std::string op, KernelFn fn);  ///< portable kernel; used only while building
  /// Optimized kernel, tried in registration order, with an optional per-instruction prepare;
  /// used only while building.
  /// sizes_at_call: the kernel reads every activation size from the tensors of the call and neither
  /// its accepts() nor its prepare depends on them, so it may run calls with symbolic sizes (false:
  /// such calls run the portable kernel).
  void add_optimized(std::string op, KernelFn fn, KernelAccepts accepts, KernelPrepare prepare = nullptr,
                     bool sizes_at_call = true);
  std::vector<std::string> ops() const;
  /// Ops with at least one optimized kernel.
  std::vector<std::string> optimized_ops() const;

 private:
  struct Optimized {
    std::string op;
    KernelFn fn;
    KernelAccepts accepts;
    KernelPrepare prepare;
    bool sizes_at_call;
  };
  std::vector<std::pair<std::string, KernelFn>> kernels_;
  std::vector<Optimized> optimized_;
};

// Registration functions, one per kernel family (src/kernels/portable/*.cpp).
void register_portable_elementwise(KernelRegistry& r);
void register_portable_math(KernelRegistry& r);  // portable/math.cpp: elementwise math, rounding, bitwise
void register_portable_conv(KernelRegistry& r);
void register_portable_linear(KernelRegistry& r);
void register_portable_norm(KernelRegistry& r);
void register_portable_pool(KernelRegistry& r);
void register_portable_upsample(KernelRegistry& r);
void register_portable_reduction(KernelRegistry& r);
void register_portable_shape(KernelRegistry& r);
void register_portable_spatial_extra(KernelRegistry& r);  // portable/spatial_extra.cpp: pads, 3-D pools, grid_sampler, col2im, cdist
void register_portable_quant(KernelRegistry& r);  // portable/quant.cpp: weight-only quantized ops
void register_portable_sort(KernelRegistry& r);      // portable/sort.cpp: sort, topk
void register_portable_creation(KernelRegistry& r);  // portable/creation.cpp: arange, full, fill, copy, ...
void register_portable_layout(KernelRegistry& r);    // portable/layout.cpp: flip, repeat, diagonal, as_strided
void register_portable_indexing(KernelRegistry& r);  // portable/indexing.cpp: index, gather, scatter*, embedding_bag
void register_portable_llm(KernelRegistry& r);       // portable/llm.cpp: kiln.sdpa_kv_cache

// Optimized cpu kernels (src/kernels/cpu/*.cpp); registered after the portable ones.
void register_cpu_kernels(KernelRegistry& r);
void register_cpu_conv(KernelRegistry& r);    // src/kernels/cpu/conv.cpp
void register_cpu_linear(KernelRegistry& r);  // src/kernels/cpu/linear.cpp (mm, bmm, addmm, linear)
void register_cpu_pool(KernelRegistry& r);    // src/kernels/cpu/pool.cpp (global average pooling)
void register_cpu_attention(KernelRegistry& r);   // cpu/attention.cpp: scaled_dot_product_attention, kiln.sdpa_kv_cache
void register_cpu_norm(KernelRegistry& r);        // cpu/norm.cpp: layer/group/batch/rms norm
void register_cpu_softmax(KernelRegistry& r);     // cpu/softmax.cpp: _softmax, _log_softmax
void register_cpu_activation(KernelRegistry& r);  // cpu/activation.cpp: unary float ops
void register_cpu_elementwise(KernelRegistry& r); // cpu/elementwise.cpp: add, sub, mul, div
void register_cpu_shape(KernelRegistry& r);       // cpu/shape.cpp: permute, transpose, slice
void register_cpu_quantized(KernelRegistry& r);   // cpu/quantized.cpp: weight-only quantized linear/conv

}  // namespace kiln
