// The fusion tables (src/ir/fusion.h): the only place that lists which ops fuse into which.
#include "ir/fusion.h"

#include <cmath>

namespace kiln {

namespace {

using K = Epilogue::Kind;

/// The epilogue ops. Bounds: aten.hardtanh's min_val / max_val (defaults -1, 1, PyTorch's);
/// aten.clamp's min / max (either may be None: no bound).
constexpr EpilogueOp kEpilogueOps[] = {
    {"aten.relu", K::Relu, true},
    {"aten.hardswish", K::Hardswish, true},
    {"aten.hardsigmoid", K::Hardsigmoid, true},
    {"aten.sigmoid", K::Sigmoid, true},
    {"aten.silu", K::Silu, true},
    {"aten.hardtanh", K::Clamp, true, "min_val", "max_val", -1.0, 1.0},
    {"aten.clamp", K::Clamp, true, "min", "max"},
};

/// The producers: the cpu convolution fuses an epilogue into its stores on every path, and a
/// residual add (then an epilogue on the sum) on its direct pointwise, Winograd and GEMM paths
/// (src/kernels/cpu/conv.cpp); the cpu linear fuses an epilogue into its GEMM's stores
/// (src/kernels/cpu/linear.cpp). A kernel may still decline a candidate (a path or dtype that
/// lacks it); it never fuses one this table does not offer.
constexpr FusionProducer kProducers[] = {
    {"aten.convolution", true, true, true},
    {"aten.linear", true, false, false},
};

}  // namespace

std::span<const EpilogueOp> epilogue_ops() { return kEpilogueOps; }

const EpilogueOp* find_epilogue_op(std::string_view op) {
  for (const EpilogueOp& e : kEpilogueOps) {
    if (e.op == op) return &e;
  }
  return nullptr;
}

std::span<const FusionProducer> fusion_producers() { return kProducers; }

const FusionProducer* find_fusion_producer(std::string_view op) {
  for (const FusionProducer& p : kProducers) {
    if (p.op == op) return &p;
  }
  return nullptr;
}

std::optional<Epilogue> epilogue_of(std::string_view op, const Attributes& attrs) {
  const EpilogueOp* row = find_epilogue_op(op);
  if (row == nullptr) return std::nullopt;
  auto bound = [&](std::string_view name, double fallback) {
    if (name.empty() || attrs.is_none(name)) return static_cast<float>(fallback);
    return static_cast<float>(attrs.get_float(name, fallback));
  };
  Epilogue e;
  e.kind = row->kind;
  e.lo = bound(row->lo_attr, row->lo_default);
  e.hi = bound(row->hi_attr, row->hi_default);
  if (std::isnan(e.lo) || std::isnan(e.hi)) return std::nullopt;
  return e;
}

bool runs_in_place(std::string_view op) {
  const EpilogueOp* row = find_epilogue_op(op);
  return row != nullptr && row->in_place;
}

bool is_residual_add(std::string_view op, const Attributes& attrs) {
  return op == "aten.add" && attrs.get_float("alpha", 1.0) == 1.0;
}

FoldAs fold_as(std::string_view producer, std::string_view next, const Attributes& attrs) {
  const FusionProducer* p = find_fusion_producer(producer);
  if (p == nullptr) return FoldAs::None;
  if (p->epilogue && epilogue_of(next, attrs)) return FoldAs::Epilogue;
  if (p->residual_add && is_residual_add(next, attrs)) return FoldAs::ResidualAdd;
  return FoldAs::None;
}

bool epilogue_after_add(std::string_view producer, std::string_view next, const Attributes& attrs) {
  const FusionProducer* p = find_fusion_producer(producer);
  return p != nullptr && p->residual_add && p->epilogue_after_add && epilogue_of(next, attrs).has_value();
}

}  // namespace kiln
