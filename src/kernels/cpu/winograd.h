// Winograd F(4x4, 3x3) and F(2x2, 3x3) convolution for the optimized cpu kernels (used by
// src/kernels/cpu/conv.cpp).
//
// For float32 aten.convolution with a 3x3 kernel, stride 1, dilation 1, one group (any padding),
// NCHW. Method: Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks" (CVPR 2016,
// arXiv:1509.09308), section 4: each 4x4 output tile is Y = A^T [ sum_c (G g_c G^T) .* (B^T d_c B) ] A
// for the 6x6 input tile d_c of channel c; the sum over c is, for each of the 36 transformed
// positions, one GEMM [C_out x C_in] x [C_in x tiles] (batched GEMM, cpu::sgemm_prepacked).
// F(2x2, 3x3) (section 4.1): 2x2 output tiles from 4x4 input tiles, 16 positions.
#pragma once

#include <cstdint>
#include <vector>

#include "ir/ops/conv.h"
#include "kernels/cpu/post_op.h"
#include "kiln/thread_pool.h"

namespace kiln::cpu {

/// Output tile size of the Winograd variant for the convolution `g`: 4 (F(4x4, 3x3)), 2 (F(2x2,
/// 3x3)) or 0 (not Winograd: the im2col GEMM). Nonzero only for the Winograd path's shape (2-D,
/// not transposed, 3x3 kernel, stride 1, dilation 1, groups 1, any padding) with C_in >= 8 and at
/// least half of the lanes of the 8-tile groups used, where it was measured faster than im2col:
///  - transformed filters (36 C_in C_out floats) <= 4 MiB: 4 with at least 32 tiles of 4x4 per image;
///  - larger filters (each transformed filter float is read from memory once per block of up to
///    128 tiles, so it must serve many tiles): 4 with at least 64 tiles of 4x4 in the batch (e.g.
///    the SD UNet's 64x64 and 32x32 convs) or at least 16 where they take at most 32 MiB and a
///    row has at most 4 tiles of 4x4 (resnet's 256-channel 14x14 convs), else 2 with at least 64 tiles of 2x2 (the SD UNet's
///    16x16 convs), or with at least 16 where the F(2x2, 3x3) filters take at most 32 MiB
///    (resnet's 512-channel 7x7 convs; the SD UNet's 8x8 ones stay on im2col).
/// With at most 4 tiles per row, a group of 8 tiles spans two tile rows.
/// Thresholds and ratios: winograd.cpp. The transformed filters take 4x (F(4x4, 3x3)) or 16/9x
/// (F(2x2, 3x3)) the memory of the weights; conv.cpp keeps them instead of the packed weights.
/// Environment KILN_CPU_WINOGRAD (read at each call; conv.cpp calls this when a method is loaded):
/// "0" never, "1" F(4x4, 3x3) and "2" F(2x2, 3x3) for every convolution of the Winograd shape
/// whatever its size (tests, benchmarks).
int winograd_tile(const ConvGeometry& g);

/// winograd_tile(g) != 0.
bool winograd_applies(const ConvGeometry& g);

/// Transformed filters U = G g G^T of weights w float32 [C_out, C_in, 3, 3] (computed in double,
/// rounded once to float) for output tiles of `tile` x `tile` (4 or 2, as winograd_tile), for
/// each of the n*n positions (k, l) of the n x n transformed tile (n = tile + 2; index k*n + l)
/// packed as GEMM A operands (cpu::pack_a_for_gemm) in chunks of at most 384 output channels
/// ([rows x C_in] each, so that a chunk's K block stays in L2), the positions
/// winograd_pos_stride(C_out, C_in) floats apart. `out` is resized to n*n * that.
void winograd_pack_weights(const float* w, int64_t cout, int64_t cin, int tile, std::vector<float>& out);

/// Floats between consecutive positions of winograd_pack_weights' output.
int64_t winograd_pos_stride(int64_t cout, int64_t cin);

/// out[n, o, :, :] = post(bias[o] + sum_c conv3x3(x[n, c], w[o, c])) for `g` (winograd_applies)
/// with output tiles of `tile` x `tile` (4 or 2, the packing's),
/// x float32 [N, C_in, IH, IW], out float32 [N, C_out, OH, OW], bias [C_out] or null, `packed`
/// from winograd_pack_weights. Filters <= 4 MiB: parallel over blocks of output tiles on `pool`
/// (may be null), per-thread scratch of 36 * (C_in + C_out) * (tiles per block) floats (<= ~400
/// KiB); larger filters: blocks of up to 128 tiles, each split between the threads (input
/// channels, GEMMs per position and output-channel chunk, output channels), one scratch of at most
/// ~24 MiB on the calling thread. Scratch is kept between calls.
/// `residual` (optional, float32 [N, C_out, OH, OW], not overlapping `out`): a fused residual
/// add and activation, out = after(post(...) + residual) (the convolution followed by aten.add and
/// `after`, bit-identical: residual_inplace on each output row as it is written).
void conv_winograd(const ConvGeometry& g, int tile, const float* x, const float* packed, const float* bias,
                   float* out, ThreadPool* pool, const PostOp& post, const float* residual = nullptr,
                   const PostOp& after = {});

/// y[i] = after(y[i] + r[i]) for i < n: a residual aten.add (the add kernel's float addition) and
/// an activation (ApplyPostOp's float operations, post_op-inl.h) fused into a convolution's output.
void residual_inplace(float* y, const float* r, int64_t n, const PostOp& after);

}  // namespace kiln::cpu
