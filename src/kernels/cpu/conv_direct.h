// Direct convolution for few input channels (network stems: an RGB image into the first layer),
// used by src/kernels/cpu/conv.cpp.
//
// For float32 aten.convolution, 2-D, not transposed, one group, C_in <= 4, a kernel of at most 7x7
// (more than one tap) with C_in * kH * kW <= 64, stride 1 or 2 (the same along H and W), dilation
// 1, any padding, NCHW. There the im2col GEMM is a poor fit: its K (C_in * kH * kW, e.g. 27) is
// short, so packing the im2col matrix and storing each C tile cost as much as the products
// (mobilenet_v3's 3x3 stem: 0.84x the GEMM's time). With a longer K the GEMM is as fast or faster
// (resnet18's 7x7 stem, K = 147: 1.03x), so it keeps those. Here each output row is
// computed from its C_in * kH input rows, copied once into zero-padded rows split by stride
// phase (padded column j goes to phase j % stride at j / stride), so that for output column ow
// and tap kw the input x[ow * stride + kw] is a plain vector load at phase kw % stride, offset
// ow + kw / stride. Tiles of 4 output channels x 3 vectors of output columns (24 on AVX2; 8 x 2
// vectors on AVX-512) accumulate in registers with
// FMA over (c, kh, kw); then + bias and the fused activation (PostOp), as the GEMM epilogue.
#pragma once

#include "ir/ops/conv.h"
#include "kernels/cpu/post_op.h"
#include "kiln/thread_pool.h"

namespace kiln::cpu {

/// True when conv_direct computes `g` (the shape above, at least 8 output columns).
bool direct_conv_applies(const ConvGeometry& g);

/// out[n, o, oh, ow] = post(bias[o] + sum_{c, kh, kw} x[n, c, oh*s - pH + kh, ow*s - pW + kw] * w[o, c, kh, kw])
/// (zero outside the input) for `g` (direct_conv_applies): x float32 [N, C_in, IH, IW],
/// w [C_out, C_in, kH, kW], bias [C_out] or null, out [N, C_out, OH, OW]. Parallel over output
/// rows on `pool` (may be null); per-thread scratch of C_in * kH * stride * (IW + 2 pW + 3 vectors + 8) floats.
void conv_direct(const ConvGeometry& g, const float* x, const float* w, const float* bias, float* out,
                 ThreadPool* pool, const PostOp& post);

}  // namespace kiln::cpu
