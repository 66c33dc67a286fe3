// Which ops fold into which: the one description of operator fusion in Kiln.
//
// Two tables, in src/ir/fusion.cpp:
// - the epilogue ops: the elementwise activations a kernel may apply to each value it stores
//   (aten.relu, hardswish, hardsigmoid, hardtanh, clamp, sigmoid, silu), each with the Epilogue
//   it computes, how its attributes give the Epilogue's bounds, and whether it may run in place;
// - the producers: the ops whose kernels may take a following epilogue op, a following residual
//   aten.add (alpha 1) of their output and another value of its type, and an epilogue op after
//   that add (aten.convolution: all three; aten.linear: an epilogue only).
//
// Everything that decides about fusion reads these tables and nothing else:
// - the memory planner (src/compiler/memory_planner.cpp): an epilogue op (runs_in_place) after a
//   producer, or after a residual add a producer may fuse, takes its input's bytes; a residual
//   add after a producer keeps the producer's inputs live through the add (residual_add_follows);
// - the loader (src/runtime/loader.cpp): accepts an instruction whose output is exactly its
//   input's bytes only for runs_in_place ops;
// - the runtime (fusion_offer in src/runtime/program.cpp): offers a kernel's prepare the next
//   instruction (KernelPrepareArgs::next) only when this table says it may fold into it;
// - the cpu kernels: cpu::PostOp is Epilogue, and cpu::post_op_of is epilogue_of
//   (src/kernels/cpu/post_op.h); the formulas are in src/kernels/cpu/post_op-inl.h.
// A new fusable activation is one row of the epilogue table (plus its Epilogue::Kind and its
// formula in post_op-inl.h); tests/cpp/fusion_table_test.cpp checks that all of the above agree
// with the tables.
//
// The decision is not stored in the program file: the runtime derives it at load from the ops,
// their attributes and the arena plan, with the same table the compiler used, because it must
// re-check those (an untrusted file) before a kernel writes one instruction's output while
// reading another's inputs. See docs/op-set.md, "Fusion".
#pragma once

#include <limits>
#include <optional>
#include <span>
#include <string_view>

#include "kiln/attributes.h"

namespace kiln {

/// An elementwise activation applied to each value a kernel stores (float32): none, relu
/// (max(x, 0)), clamp to [lo, hi] (an absent bound is -inf / +inf; never NaN), hardswish,
/// hardsigmoid, sigmoid, silu. Semantics and NaN behaviour are the portable kernels'
/// (src/kernels/portable/elementwise.cpp, PyTorch's Activation.cpp). The cpu kernels use it as
/// cpu::PostOp (src/kernels/cpu/post_op.h).
struct Epilogue {
  enum class Kind { None, Relu, Clamp, Hardswish, Hardsigmoid, Sigmoid, Silu };
  Kind kind = Kind::None;
  float lo = -std::numeric_limits<float>::infinity();  ///< Clamp only
  float hi = std::numeric_limits<float>::infinity();   ///< Clamp only
  bool operator==(const Epilogue&) const = default;
};

/// One row of the epilogue table: an op that may be fused as an Epilogue.
struct EpilogueOp {
  std::string_view op;  ///< ATen op name, e.g. "aten.relu"
  Epilogue::Kind kind;
  /// May run in place: every kernel of the op (portable and cpu) computes out[i] from in[i]
  /// alone, reading each element before writing it, so its output may be exactly its input 0's
  /// bytes (the planner's aliasing, accepted by the loader).
  bool in_place;
  /// Clamp: the attributes holding the lower / upper bound (empty: no such attribute, the bound
  /// is infinite), and the bound when the attribute is None or absent.
  std::string_view lo_attr{}, hi_attr{};
  double lo_default = -std::numeric_limits<double>::infinity();
  double hi_default = std::numeric_limits<double>::infinity();
};

/// One row of the producer table: an op whose kernels may compute the instruction after it.
struct FusionProducer {
  std::string_view op;      ///< ATen op name, e.g. "aten.convolution"
  bool epilogue;            ///< may take a following epilogue op on its output
  bool residual_add;        ///< may take a following residual add (is_residual_add) of its output
  bool epilogue_after_add;  ///< with residual_add: may also take an epilogue op on the add's output
};

/// Every epilogue op (the table), and the row of `op` or null.
std::span<const EpilogueOp> epilogue_ops();
const EpilogueOp* find_epilogue_op(std::string_view op);

/// Every producer (the table), and the row of `op` or null.
std::span<const FusionProducer> fusion_producers();
const FusionProducer* find_fusion_producer(std::string_view op);

/// The Epilogue that op `op` with (normalized) attributes `attrs` computes, when `op` is in the
/// epilogue table; nullopt otherwise, and for a NaN bound (the portable kernel runs those).
std::optional<Epilogue> epilogue_of(std::string_view op, const Attributes& attrs);

/// True when `op` is in the epilogue table and may run in place (EpilogueOp::in_place): the
/// memory planner may give its output exactly the bytes of its input 0 when it is that input's
/// only reader, and the loader accepts that exact aliasing for it and no other overlap of an
/// instruction's output with its inputs.
bool runs_in_place(std::string_view op);

/// True for a residual add a producer may fuse: aten.add with alpha 1 (self + other).
bool is_residual_add(std::string_view op, const Attributes& attrs);

/// The ways an instruction may fold into the one before it (the producer).
enum class FoldAs { None, Epilogue, ResidualAdd };

/// How an instruction of op `next` with attributes `attrs` may fold into a preceding `producer`
/// instruction by the tables alone (the caller checks the data flow: `next` reads the producer's
/// only output, nothing else reads it, types and bytes): Epilogue when the producer takes an
/// epilogue and epilogue_of(next, attrs) exists; ResidualAdd when it takes a residual add and
/// is_residual_add(next, attrs); else None.
FoldAs fold_as(std::string_view producer, std::string_view next, const Attributes& attrs);

/// True when an instruction of op `next` with `attrs`, right after a residual add that folds
/// into `producer`, may fold into it too (FusionProducer::epilogue_after_add and epilogue_of).
bool epilogue_after_add(std::string_view producer, std::string_view next, const Attributes& attrs);

}  // namespace kiln
