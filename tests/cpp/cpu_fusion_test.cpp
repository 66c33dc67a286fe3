// Load-time kernel preparation (KernelPrepare) of the cpu convolution: weights packed once per
// Method, and an activation right after a convolution fused into the convolution's stores.
// A fused method must give bit-identical results to the same computation unfused (the
// convolution's output also a method output, which forbids the fusion), and agree with the
// portable reference kernels; the memory planner must keep the activation's output apart from
// the convolution's inputs so that the fusion can happen.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kiln/compiler.h"
#include "kiln/runtime.h"
#include "runtime_test_util.h"

namespace kiln {
namespace {

using testing::float_bytes;
using testing::pattern;
using V = std::vector<int64_t>;

struct Conv {
  int64_t n, cin, h, w, cout, k;
  int64_t stride, padding, groups;
  bool bias;
};

struct Act {
  std::string op;
  Attributes attrs;
};

/// x -> convolution -> activation; outputs {activation} (fusable) or {activation, convolution}.
Result<std::vector<uint8_t>> compile(const Conv& c, const Act& act, bool expose_conv) {
  Graph g;
  const ValueId x = g.add_input("x", {DType::Float32, {c.n, c.cin, c.h, c.w}});
  const int64_t wn = c.cout * (c.cin / c.groups) * c.k * c.k;
  std::vector<float> wv = pattern(static_cast<size_t>(wn), 7);
  for (float& v : wv) v *= 0.5f;
  auto w = g.add_constant("w", {DType::Float32, {c.cout, c.cin / c.groups, c.k, c.k}}, float_bytes(wv));
  if (!w.ok()) return w.error();
  ValueId b = kNoValue;
  if (c.bias) {
    auto bb = g.add_constant("b", {DType::Float32, {c.cout}}, float_bytes(pattern(static_cast<size_t>(c.cout), 8)));
    if (!bb.ok()) return bb.error();
    b = bb.value();
  }
  Attributes attrs{{"stride", V{c.stride, c.stride}}, {"padding", V{c.padding, c.padding}}, {"dilation", V{1, 1}},
                   {"transposed", false}, {"output_padding", V{0, 0}}, {"groups", c.groups}};
  auto y = g.add_node("aten.convolution", {x, w.value(), b}, attrs, "conv");
  if (!y.ok()) return y.error();
  auto z = g.add_node(act.op, {y.value()[0]}, act.attrs, "act");
  if (!z.ok()) return z.error();
  std::vector<ValueId> outs{z.value()[0]};
  if (expose_conv) outs.push_back(y.value()[0]);
  KILN_RETURN_IF_ERROR(g.set_outputs(outs));
  ProgramBuilder pb;
  KILN_RETURN_IF_ERROR(pb.add_method("forward", std::move(g)));
  auto compiled = pb.compile();
  if (!compiled.ok()) return compiled.error();
  return std::move(compiled.value().bytes);
}

struct Run {
  std::vector<float> out;
  size_t fused = 0;
  uint64_t prepared = 0;
};

Result<Run> run(const std::vector<uint8_t>& bytes, const std::vector<float>& x, const TensorType& xt, bool portable,
                ThreadPool* pool) {
  auto program = Program::load_from_buffer(bytes);
  if (!program.ok()) return program.error();
  MethodOptions mo;
  mo.portable_kernels_only = portable;
  mo.pool = pool;
  auto method = program.value()->load_method("forward", mo);
  if (!method.ok()) return method.error();
  Tensor in;
  in.dtype = xt.dtype;
  in.sizes = xt.sizes;
  in.data = const_cast<float*>(x.data());
  auto outs = method->execute({in});
  if (!outs.ok()) return outs.error();
  const Tensor& o = (*outs)[0];
  Run r;
  r.out.assign(o.data_as<float>(), o.data_as<float>() + o.numel());
  r.fused = method->num_fused_instructions();
  r.prepared = method->prepared_bytes();
  return r;
}

std::vector<Act> activations() {
  return {
      {"aten.relu", {}},
      {"aten.hardswish", {}},
      {"aten.hardsigmoid", {}},
      {"aten.hardtanh", {{"min_val", 0.0}, {"max_val", 6.0}}},
      {"aten.clamp", {{"min", -0.25}}},
      {"aten.sigmoid", {}},
      {"aten.silu", {}},
  };
}

std::vector<Conv> convs() {
  return {
      {1, 16, 9, 11, 40, 1, 1, 0, 1, true},    // 1x1: direct GEMM (packed weights)
      {2, 3, 17, 15, 21, 3, 2, 1, 1, true},    // 3x3 stride 2: im2col GEMM (packed weights)
      {1, 12, 10, 10, 24, 3, 1, 1, 3, false},  // grouped im2col (packed per group)
      {1, 24, 13, 12, 24, 3, 1, 1, 24, true},  // depthwise 3x3 stride 1
      {1, 20, 14, 15, 20, 5, 2, 2, 20, true},  // depthwise 5x5 stride 2
      {1, 72, 1, 1, 24, 1, 1, 0, 1, true},     // 1x1 on a 1x1 input: matrix-vector path
  };
}

TEST(CpuFusion, FusedIsBitIdenticalToUnfusedAndMatchesPortable) {
  ThreadPool pool2(2);
  for (const Conv& c : convs()) {
    const TensorType xt{DType::Float32, {c.n, c.cin, c.h, c.w}};
    std::vector<float> x = pattern(static_cast<size_t>(xt.numel()), 3);
    x[5] = std::nanf("");  // NaN propagates through conv and activation alike
    for (const Act& act : activations()) {
      const std::string what = act.op + " after conv cin" + std::to_string(c.cin) + " k" + std::to_string(c.k) + " s" +
                               std::to_string(c.stride) + " g" + std::to_string(c.groups);
      KILN_ASSERT_OK_AND_ASSIGN(fusable, compile(c, act, false));
      KILN_ASSERT_OK_AND_ASSIGN(unfusable, compile(c, act, true));
      for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool2}) {
        ThreadPool one(1);
        ThreadPool* p = pool != nullptr ? pool : &one;
        KILN_ASSERT_OK_AND_ASSIGN(fused, run(fusable, x, xt, false, p));
        KILN_ASSERT_OK_AND_ASSIGN(plain, run(unfusable, x, xt, false, p));
        KILN_ASSERT_OK_AND_ASSIGN(ref, run(fusable, x, xt, true, p));
        EXPECT_EQ(fused.fused, 1u) << what;
        EXPECT_EQ(plain.fused, 0u) << what;
        EXPECT_EQ(ref.fused, 0u) << what << " (portable kernels never fuse)";
        ASSERT_EQ(fused.out.size(), plain.out.size());
        EXPECT_EQ(std::memcmp(fused.out.data(), plain.out.data(), fused.out.size() * sizeof(float)), 0)
            << what << ": fused differs from unfused";
        double maxref = 0, maxerr = 0;
        for (size_t i = 0; i < ref.out.size(); ++i) {
          if (std::isnan(ref.out[i])) {
            EXPECT_TRUE(std::isnan(fused.out[i])) << what << " at " << i;
            continue;
          }
          maxref = std::max(maxref, std::fabs(static_cast<double>(ref.out[i])));
          maxerr = std::max(maxerr, std::fabs(static_cast<double>(fused.out[i]) - ref.out[i]));
        }
        EXPECT_LE(maxerr, 2e-5 * std::max(maxref, 1e-30)) << what;
      }
    }
  }
}

/// x -> convolution (any kernel / stride) -> aten.add with r (conv first or second), then with
/// `relu` an aten.relu (resnet's block end). Outputs: the last node's, plus with expose 1 the add
/// (with relu: only the add is fusable) or with expose 2 the convolution (nothing fusable).
Result<std::vector<uint8_t>> compile_residual(const Conv& c, bool conv_first, bool relu, int expose) {
  Graph g;
  const int64_t oh = (c.h + 2 * c.padding - c.k) / c.stride + 1, ow = (c.w + 2 * c.padding - c.k) / c.stride + 1;
  const ValueId x = g.add_input("x", {DType::Float32, {c.n, c.cin, c.h, c.w}});
  const ValueId r = g.add_input("r", {DType::Float32, {c.n, c.cout, oh, ow}});
  std::vector<float> wv = pattern(static_cast<size_t>(c.cout * c.cin * c.k * c.k), 7);
  for (float& v : wv) v *= 0.25f;
  auto w = g.add_constant("w", {DType::Float32, {c.cout, c.cin, c.k, c.k}}, float_bytes(wv));
  if (!w.ok()) return w.error();
  ValueId b = kNoValue;
  if (c.bias) {
    auto bb = g.add_constant("b", {DType::Float32, {c.cout}}, float_bytes(pattern(static_cast<size_t>(c.cout), 8)));
    if (!bb.ok()) return bb.error();
    b = bb.value();
  }
  Attributes attrs{{"stride", V{c.stride, c.stride}}, {"padding", V{c.padding, c.padding}}, {"dilation", V{1, 1}},
                   {"transposed", false}, {"output_padding", V{0, 0}}, {"groups", int64_t{1}}};
  auto y = g.add_node("aten.convolution", {x, w.value(), b}, attrs, "conv");
  if (!y.ok()) return y.error();
  const ValueId yv = y.value()[0];
  auto z = g.add_node("aten.add", {conv_first ? yv : r, conv_first ? r : yv}, {{"alpha", 1.0}}, "add");
  if (!z.ok()) return z.error();
  ValueId last = z.value()[0];
  if (relu) {
    auto u = g.add_node("aten.relu", {last}, {}, "relu");
    if (!u.ok()) return u.error();
    last = u.value()[0];
  }
  std::vector<ValueId> outs{last};
  if (expose == 1) outs.push_back(z.value()[0]);
  if (expose == 2) outs.push_back(yv);
  KILN_RETURN_IF_ERROR(g.set_outputs(outs));
  ProgramBuilder pb;
  KILN_RETURN_IF_ERROR(pb.add_method("forward", std::move(g)));
  auto compiled = pb.compile();
  if (!compiled.ok()) return compiled.error();
  return std::move(compiled.value().bytes);
}

TEST(CpuFusion, ResidualAddFusedIntoPointwiseIsBitIdenticalToUnfused) {
  ThreadPool pool2(2), one(1);
  // 1x1 convolutions on the direct pointwise path: full tiles, column and channel tails, batch 2.
  for (const Conv& c : {Conv{1, 16, 8, 8, 24, 1, 1, 0, 1, true}, Conv{2, 5, 5, 9, 7, 1, 1, 0, 1, true}}) {
    for (bool conv_first : {true, false}) {
      const TensorType xt{DType::Float32, {c.n, c.cin, c.h, c.w}}, rt{DType::Float32, {c.n, c.cout, c.h, c.w}};
      std::vector<float> x = pattern(static_cast<size_t>(xt.numel()), 3), r = pattern(static_cast<size_t>(rt.numel()), 5);
      r[3] = std::nanf("");
      KILN_ASSERT_OK_AND_ASSIGN(fusable, compile_residual(c, conv_first, /*relu=*/false, 0));
      KILN_ASSERT_OK_AND_ASSIGN(unfusable, compile_residual(c, conv_first, /*relu=*/false, 2));
      for (ThreadPool* p : {&one, &pool2}) {
        std::vector<std::vector<float>> outs;
        for (const auto* bytes : {&fusable, &unfusable, &fusable}) {
          const bool portable = outs.size() == 2;
          auto program = Program::load_from_buffer(*bytes);
          ASSERT_TRUE(program.ok()) << program.error().message();
          MethodOptions mo;
          mo.portable_kernels_only = portable;
          mo.pool = p;
          auto method = program.value()->load_method("forward", mo);
          ASSERT_TRUE(method.ok()) << method.error().message();
          EXPECT_EQ(method->num_fused_instructions(), outs.empty() ? 1u : 0u);
          Tensor tx{DType::Float32, xt.sizes, x.data()}, tr{DType::Float32, rt.sizes, r.data()};
          auto res = method->execute({tx, tr});
          ASSERT_TRUE(res.ok()) << res.error().message();
          const Tensor& o = (*res)[0];
          outs.emplace_back(o.data_as<float>(), o.data_as<float>() + o.numel());
        }
        ASSERT_EQ(outs[0].size(), outs[1].size());
        EXPECT_EQ(std::memcmp(outs[0].data(), outs[1].data(), outs[0].size() * sizeof(float)), 0)
            << "fused residual add differs from unfused (cin " << c.cin << ", conv_first " << conv_first << ")";
        EXPECT_TRUE(std::isnan(outs[0][3]));
        double maxref = 0, maxerr = 0;
        for (size_t i = 0; i < outs[2].size(); ++i) {
          if (std::isnan(outs[2][i])) continue;
          maxref = std::max(maxref, std::fabs(static_cast<double>(outs[2][i])));
          maxerr = std::max(maxerr, std::fabs(static_cast<double>(outs[0][i]) - outs[2][i]));
        }
        EXPECT_LE(maxerr, 2e-5 * std::max(maxref, 1e-30));
      }
    }
  }
}

TEST(CpuFusion, ResidualAddAndReluFusedIntoWinogradAndGemmAreBitIdenticalToUnfused) {
  ThreadPool pool2(2), one(1);
  // Paths: Winograd F(4x4, 3x3) (16 -> 16 at 24x24: 36 tiles; 176 -> 176 at 14x14: 16 tiles, two
  // tile rows per group), Winograd F(2x2, 3x3) with two tile rows per group (192 -> 192 at 7x7:
  // filters over 4 MiB, 16 tiles), im2col GEMM (1x1 stride 2:
  // resnet's downsample; 3x3 stride 2, batch 2, no bias), the plain 1x1 GEMM (260 input channels on a
  // 9x9 plane: more than the direct pointwise path takes there, C_in <= 256 or planes <= 64 pixels).
  const Conv convs[] = {Conv{1, 16, 24, 24, 16, 3, 1, 1, 1, true}, Conv{1, 192, 7, 7, 192, 3, 1, 1, 1, true},
                        Conv{1, 176, 14, 14, 176, 3, 1, 1, 1, true},  // F(4x4, 3x3), two tile rows per group
                        Conv{1, 24, 14, 13, 40, 1, 2, 0, 1, true}, Conv{2, 8, 9, 11, 12, 3, 2, 1, 1, false},
                        Conv{1, 260, 9, 9, 20, 1, 1, 0, 1, true}};
  for (const Conv& c : convs) {
    for (bool conv_first : {true, false}) {
      const int64_t oh = (c.h + 2 * c.padding - c.k) / c.stride + 1, ow = (c.w + 2 * c.padding - c.k) / c.stride + 1;
      const TensorType xt{DType::Float32, {c.n, c.cin, c.h, c.w}}, rt{DType::Float32, {c.n, c.cout, oh, ow}};
      std::vector<float> x = pattern(static_cast<size_t>(xt.numel()), 3), r = pattern(static_cast<size_t>(rt.numel()), 5);
      r[3] = std::nanf("");
      std::vector<std::vector<uint8_t>> files;
      for (int expose : {0, 1, 2}) {
        KILN_ASSERT_OK_AND_ASSIGN(f, compile_residual(c, conv_first, /*relu=*/true, expose));
        files.push_back(std::move(f));
      }
      for (ThreadPool* p : {&one, &pool2}) {
        std::vector<std::vector<float>> outs;
        for (int run = 0; run < 4; ++run) {  // expose 0, 1, 2 on the cpu kernels, then 0 portable
          auto program = Program::load_from_buffer(files[static_cast<size_t>(run % 3)]);
          ASSERT_TRUE(program.ok()) << program.error().message();
          MethodOptions mo;
          mo.portable_kernels_only = run == 3;
          mo.pool = p;
          auto method = program.value()->load_method("forward", mo);
          ASSERT_TRUE(method.ok()) << method.error().message();
          const size_t want = run == 0 ? 2u : run == 1 ? 1u : 0u;
          EXPECT_EQ(method->num_fused_instructions(), want) << "cin " << c.cin << ", k " << c.k << ", run " << run;
          Tensor tx{DType::Float32, xt.sizes, x.data()}, tr{DType::Float32, rt.sizes, r.data()};
          auto res = method->execute({tx, tr});
          ASSERT_TRUE(res.ok()) << res.error().message();
          const Tensor& o = (*res)[0];
          outs.emplace_back(o.data_as<float>(), o.data_as<float>() + o.numel());
        }
        for (int run = 1; run < 3; ++run) {
          ASSERT_EQ(outs[0].size(), outs[static_cast<size_t>(run)].size());
          EXPECT_EQ(std::memcmp(outs[0].data(), outs[static_cast<size_t>(run)].data(), outs[0].size() * sizeof(float)), 0)
              << "fused residual add + relu differs from unfused (cin " << c.cin << ", k " << c.k << ", run " << run << ")";
        }
        EXPECT_TRUE(std::isnan(outs[0][3]));
        double maxref = 0, maxerr = 0;
        size_t negatives = 0;
        for (size_t i = 0; i < outs[3].size(); ++i) {
          if (std::isnan(outs[3][i])) continue;
          negatives += outs[0][i] < 0.0f;
          maxref = std::max(maxref, std::fabs(static_cast<double>(outs[3][i])));
          maxerr = std::max(maxerr, std::fabs(static_cast<double>(outs[0][i]) - outs[3][i]));
        }
        EXPECT_EQ(negatives, 0u);
        EXPECT_LE(maxerr, 1e-4 * std::max(maxref, 1e-30)) << "cin " << c.cin << ", k " << c.k;
      }
    }
  }
}

TEST(CpuFusion, ConstantWeightsArePackedOnceForGemmPaths) {
  const Act relu{"aten.relu", {}};
  const Conv gemm{1, 16, 9, 11, 40, 1, 1, 0, 1, true};
  const Conv dw{1, 24, 13, 12, 24, 3, 1, 1, 24, true};
  for (const auto& [c, expect_packed] : {std::pair{gemm, true}, std::pair{dw, false}}) {
    const TensorType xt{DType::Float32, {c.n, c.cin, c.h, c.w}};
    const std::vector<float> x = pattern(static_cast<size_t>(xt.numel()), 4);
    KILN_ASSERT_OK_AND_ASSIGN(bytes, compile(c, relu, false));
    ThreadPool one(1);
    KILN_ASSERT_OK_AND_ASSIGN(r, run(bytes, x, xt, false, &one));
    if (expect_packed) {
      // At least the weights themselves (40 x 16 floats; packed GEMM panels pad the rows to the
      // target's MR, 6 on AVX2 and 16 on AVX-512, and a pointwise layout may not pad at all).
      EXPECT_GE(r.prepared, uint64_t{40 * 16 * 4});
    } else {
      EXPECT_EQ(r.prepared, 0u) << "depthwise convolutions read their weights directly";
    }
    KILN_ASSERT_OK_AND_ASSIGN(p, run(bytes, x, xt, true, &one));
    EXPECT_EQ(p.prepared, 0u);
  }
}

TEST(CpuFusion, PackedWeightsGiveTheSameProductAsPerCallPacking) {
  // K spans two K blocks (256 + 44), M not a multiple of 6, N with a partial panel.
  const int64_t M = 29, N = 37, K = 300;
  const std::vector<float> A = pattern(static_cast<size_t>(M * K), 11), B = pattern(static_cast<size_t>(K * N), 12);
  std::vector<float> packed(static_cast<size_t>(cpu::packed_a_floats(M, K)));
  cpu::pack_a_for_gemm(M, K, A.data(), K, packed.data());
  std::vector<float> c1(static_cast<size_t>(M * N)), c2(c1.size());
  cpu::GemmEpilogue ep;
  ep.post.kind = cpu::PostOp::Kind::Hardswish;
  cpu::sgemm(false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, c1.data(), N, ep);
  cpu::sgemm(false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, c2.data(), N, ep, nullptr, packed.data());
  EXPECT_EQ(std::memcmp(c1.data(), c2.data(), c1.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace kiln
