// Elementwise activations that the cpu kernels apply on their own output (activation fusion) and
// that the cpu activation kernels (activation.cpp) apply on whole tensors: one definition of each
// formula, so a fused result is bit-identical to the convolution followed by the activation.
//
// Formulas and NaN behaviour are the portable kernels' (src/kernels/portable/elementwise.cpp,
// PyTorch Activation.cpp); _mm256_max_ps/min_ps(c, x) return x when x is NaN (the second operand),
// so NaN propagates.
#pragma once

#include <cmath>
#include <limits>
#include <optional>
#include <string_view>

#include "ir/fusion.h"
#include "kiln/attributes.h"

namespace kiln::cpu {

/// An activation applied to each output value: the fusion table's Epilogue (src/ir/fusion.h):
/// none, relu, clamp [lo, hi] (aten.clamp, aten.hardtanh; an absent bound is -inf / +inf),
/// hardswish, hardsigmoid, sigmoid, silu.
using PostOp = Epilogue;

/// The PostOp computing aten op `op` with (normalized) `attrs`, when it is one of the fusable
/// activations of the epilogue table (epilogue_of, src/ir/fusion.h); false otherwise (also for
/// NaN clamp bounds, which the portable kernel handles).
inline bool post_op_of(std::string_view op, const Attributes& attrs, PostOp* out) {
  const std::optional<Epilogue> e = epilogue_of(op, attrs);
  if (!e) return false;
  *out = *e;
  return true;
}

}  // namespace kiln::cpu
