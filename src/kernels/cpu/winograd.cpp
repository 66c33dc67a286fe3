// Winograd F(4x4, 3x3) and F(2x2, 3x3) convolution (see winograd.h).
//
// Transform matrices: Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks"
// (arXiv:1509.09308), section 4.2, F(4x4, 3x3) with interpolation points 0, 1, -1, 2, -2, inf:
//   B^T = [ 4  0 -5  0  1  0 ]    G = [  1/4     0     0  ]    A^T = [ 1  1  1  1  1  0 ]
//         [ 0 -4 -4  1  1  0 ]        [ -1/6  -1/6  -1/6  ]          [ 0  1 -1  2 -2  0 ]
//         [ 0  4 -4 -1  1  0 ]        [ -1/6   1/6  -1/6  ]          [ 0  1  1  4  4  0 ]
//         [ 0 -2 -1  2  1  0 ]        [ 1/24  1/12   1/6  ]          [ 0  1 -1  8 -8  1 ]
//         [ 0  2 -1 -2  1  0 ]        [ 1/24 -1/12   1/6  ]
//         [ 0  4  0 -5  0  1 ]        [   0     0     1   ]
// Output tile (4x4) Y = A^T [ sum_c U_c .* V_c ] A with U_c = G g_c G^T (6x6, per output/input
// channel pair; prepared once) and V_c = B^T d_c B (the 6x6 input tile at rows 4 ty - PH .. +5,
// columns 4 tx - PW .. +5, zero outside the input).
//
// F(2x2, 3x3) (section 4.1, points 0, 1, -1, inf; kG2 below): 4x4 input tiles at rows 2 ty - PH ..
// +3, 16 positions, groups of 8 tiles = 16 output columns (InputGroup2, OutputGroup2); everything
// else as F(4x4, 3x3).
//
// Data flow per block of output tiles (one task of the pool; per-thread scratch):
//   1. input transform: groups of 8 horizontally adjacent tiles of one tile row (at most 4 tiles
//      per row: 4 tiles of two tile rows); the transforms are vectorized ACROSS tiles: lane t of a
//      vector holds tile t of the group (8 lanes of Highway's CappedTag<float, 8>: one vector on
//      AVX2 and AVX-512, two on NEON, eight on the 1-lane scalar target), so the 6x6 transforms
//      are plain lane-wise arithmetic. The column c of every tile comes, with 4 or more lanes, from
//      plain loads and a 4x4 transpose within each 128-bit block (the lanes then hold the tiles
//      in a permuted order, which the output transform undoes), on the scalar target from
//      LoadInterleaved4 (F(2x2, 3x3): LoadInterleaved2 everywhere); V is written straight into
//      the GEMM's packed B
//      panels (cpu::prepacked_b_floats layout), one [C_in x tiles] matrix per position (k, l);
//   2. 36 GEMMs M[pos] [C_out x tiles] = U[pos] [C_out x C_in] * V[pos] (cpu::sgemm_prepacked);
//   3. output transform with the same lanes, + bias, fused activation, and the same transpose
//      within blocks (scalar: StoreInterleaved4; F(2x2, 3x3): StoreInterleaved2) back to rows of
//      32 (16) contiguous output floats.
// Written once over Google Highway (hwy/foreach_target.h: every SIMD target of the build).
// Filters up to 4 MiB: each thread runs whole blocks of a few groups on its own scratch (the
// filters stay in the caches). Larger filters (conv_large; SD UNet: 320..2560 channels): blocks
// of up to 16 groups, each of the three steps split between the threads, the filters packed in
// output-channel chunks of <= 384 rows (a chunk's 256-deep K block, <= 384 KiB, stays in L2 while
// the GEMM sweeps the block's 16-tile panels). There the GEMMs take ~77% of the time (perf,
// 640 -> 640 at 32x32: 1.9 GFLOP of GEMM in ~25 ms at 1 thread) and the transforms ~6%.
// Accuracy (float32, measured against torch eager on random data, tests/python/test_winograd.py):
// max abs error ~1e-6..1e-5 of max|out| for 64..1280 input channels (1280 -> 96 at 32x32: 9e-6;
// F(2x2, 3x3), 1280 -> 96 at 16x16: 3e-6; the full SD UNet denoise: 2.5e-6).
#include "kernels/cpu/winograd.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/parallel_util.h"

// Per-target part: compiled once per SIMD target (hwy/foreach_target.h re-includes this file).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/winograd.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/post_op-inl.h"
#include "kernels/cpu/vec-inl.h"

#ifndef KILN_CPU_WINOGRAD_SHARED_
#define KILN_CPU_WINOGRAD_SHARED_
namespace kiln::cpu {
namespace {

constexpr int64_t kPos = 36;   // 6 x 6 transformed positions of F(4x4, 3x3) (F(2x2, 3x3): 4 x 4)
constexpr int64_t kLanes = 8;  // tiles per group (lanes of the transforms, whatever the vector width)

/// Transformed positions of the variant with output tiles of t x t (t = 4 or 2).
constexpr int64_t positions(int t) { return (t + 2) * (t + 2); }

/// G of F(4x4, 3x3) (Lavin & Gray, section 4.2).
constexpr double kG[6][3] = {{1.0 / 4, 0.0, 0.0},         {-1.0 / 6, -1.0 / 6, -1.0 / 6}, {-1.0 / 6, 1.0 / 6, -1.0 / 6},
                             {1.0 / 24, 1.0 / 12, 1.0 / 6}, {1.0 / 24, -1.0 / 12, 1.0 / 6}, {0.0, 0.0, 1.0}};
/// G of F(2x2, 3x3) (Lavin & Gray, section 4.1, interpolation points 0, 1, -1, inf):
///   G = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1], B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1],
///   A^T = [1 1 1 0; 0 1 -1 -1].
constexpr double kG2[4][3] = {{1.0, 0.0, 0.0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0.0, 0.0, 1.0}};

/// What one call needs to know about the tiling.
struct Tiling {
  int t;          // output tile t x t: 4 (F(4x4, 3x3)) or 2 (F(2x2, 3x3))
  int64_t npos;   // positions(t)
  int64_t IH, IW, OH, OW, PH, PW, cin, cout;
  int64_t tiles_y, tiles_x, gx;  // gx: groups of 8 tiles per tile row (pair: 1)
  bool pair;  // at most 4 tiles per row: a group is 4 tiles of two tile rows (lanes 0-3, 4-7)
  const float* residual;  // fused residual add ([N, C_out, OH, OW]) or null, then `after`
  PostOp after;
  int64_t groups_per_image, groups_total;
  int64_t G;         // groups per block (task)
  int64_t v_stride;  // floats per position of the transformed input (packed B) of a block
  int64_t m_floats;  // floats of the GEMM output of a block ([C_out][36][8 G])
  int64_t pos_stride;  // floats per position of the packed filters
  int64_t chunks, chunk_stride;  // output-channel chunks of the packed filters (chunk_rows), floats apart
};

/// Where the columns of a group lie: c0 = first input column (t tx0 - PW); `direct` when the
/// group is one tile row and every column it reads ([c0, c0 + 36), F(2x2, 3x3): 18) is inside
/// the row, else the rows are copied, zero-padded, into a small buffer first.
struct GroupCols {
  int64_t c0;
  bool direct;
};

GroupCols group_cols(const Tiling& T, int64_t tx0) {
  GroupCols gc;
  gc.c0 = tx0 * T.t - T.PW;
  gc.direct = !T.pair && gc.c0 >= 0 && gc.c0 + (T.t == 4 ? 36 : 18) <= T.IW;
  return gc;
}

/// Per-thread scratch of a block: transformed input (36 packed B operands) then GEMM output.
float* block_scratch(size_t floats) {
  thread_local std::vector<float> scratch;
  if (scratch.size() < floats) {
    scratch.clear();
    scratch.shrink_to_fit();
    scratch.resize(floats);
  }
  return scratch.data();
}

/// Rows of the packed filters' output-channel chunks: at most kMaxChunkRows (a multiple of the
/// GEMM's 6-row panels), the chunks as even as that allows. A chunk's K block of packed filters
/// (rows x 256 floats, <= 384 KiB) stays in L2 while the GEMM sweeps the block's tile panels.
constexpr int64_t kMaxChunkRows = 384;
int64_t chunk_rows(int64_t cout) {
  const int64_t n = (cout + kMaxChunkRows - 1) / kMaxChunkRows;
  return std::min(cout, ((cout + n - 1) / n + 5) / 6 * 6);
}
int64_t chunk_stride(int64_t cout, int64_t cin) { return (packed_a_floats(chunk_rows(cout), cin) + 15) / 16 * 16; }

/// Where the groups of a block lie.
struct Where {
  int64_t n, ty, tx0;
};

/// One block of groups [g0, g1) of the whole batch (gi = gid - g0 below).
struct Block {
  const Tiling* T;
  int64_t ng, N, npanels;
  std::vector<Where> where;
  std::vector<GroupCols> cols;
  float* V;  // 36 packed B operands, v_stride floats apart
  float* M;  // [C_out][36][N]

  void init(const Tiling& t, int64_t g0, int64_t g1, float* scratch) {
    T = &t;
    ng = g1 - g0;
    N = ng * kLanes;
    npanels = (N + kGemmPanelCols - 1) / kGemmPanelCols;
    where.resize(static_cast<size_t>(ng));
    cols.resize(static_cast<size_t>(ng));
    for (int64_t gi = 0; gi < ng; ++gi) {
      const int64_t gid = g0 + gi;
      const int64_t rem = gid % t.groups_per_image;
      where[gi] = {gid / t.groups_per_image, rem / t.gx * (t.pair ? 2 : 1), rem % t.gx * kLanes};
      cols[gi] = group_cols(t, where[gi].tx0);
    }
    V = scratch;
    M = scratch + t.npos * t.v_stride;
  }

  /// 2. the GEMM of position pos for output-channel chunk q. M is [C_out][36][N]: position pos is
  ///    the [C_out x N] matrix at M + pos * N with row stride 36 N, so that the output transform's
  ///    36 reads of one channel are close together (positions a large power of two apart would
  ///    share L1 sets).
  void gemm(const float* packed, int64_t pos, int64_t q) const {
    const int64_t mc = chunk_rows(T->cout), o0 = q * mc, rows = std::min(mc, T->cout - o0);
    sgemm_prepacked(rows, N, T->cin, packed + pos * T->pos_stride + q * T->chunk_stride, V + pos * T->v_stride,
                    M + o0 * T->npos * N + pos * N, T->npos * N);
  }
};

/// dst[i] = row[c0 + i] for i < len, 0 where c0 + i is outside [0, IW).
inline void copy_segment(float* dst, const float* row, int64_t IW, int64_t c0, int64_t len) {
  const int64_t a = std::clamp<int64_t>(-c0, 0, len), b = std::clamp<int64_t>(IW - c0, a, len);
  std::fill(dst, dst + a, 0.0f);
  if (b > a) std::memcpy(dst + a, row + c0 + a, sizeof(float) * static_cast<size_t>(b - a));
  std::fill(dst + b, dst + len, 0.0f);
}

/// Zeros read for an input row outside the plane.
alignas(64) constexpr float kZeroRow[40] = {};

}  // namespace
}  // namespace kiln::cpu
#endif  // KILN_CPU_WINOGRAD_SHARED_

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

/// The lanes of one group of kLanes tiles: Lanes(D8) of them per vector (8 on AVX2 and AVX-512,
/// 4 on NEON, 1 on the scalar target), kLanes / Lanes(D8) vectors per group.
using D8 = hn::CappedTag<float, kLanes>;
using V8 = hn::Vec<D8>;

/// y[i] = after(y[i] + r[i]), i < n (cpu::residual_inplace).
void ResidualRange(float* HWY_RESTRICT y, const float* HWY_RESTRICT r, int64_t n, const PostOp& after) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(ApplyPostOp(d, after, hn::Add(hn::LoadU(d, y + i), hn::LoadU(d, r + i))), d, y + i);
  if (i < n) {
    const size_t k = static_cast<size_t>(n - i);
    StoreTail(d, ApplyPostOp(d, after, hn::Add(LoadTail(d, y + i, k), LoadTail(d, r + i, k))), y + i, k);
  }
}

/// v = B^T d (one dimension of the input transform).
HWY_INLINE void Bt6(const V8 d[6], V8 v[6]) {
  const D8 df;
  const V8 four = hn::Set(df, 4.0f), five = hn::Set(df, 5.0f), two = hn::Set(df, 2.0f);
  v[0] = hn::MulAdd(four, d[0], hn::NegMulAdd(five, d[2], d[4]));
  const V8 t1 = hn::NegMulAdd(four, d[2], d[4]);  // d4 - 4 d2
  const V8 t2 = hn::NegMulAdd(four, d[1], d[3]);  // d3 - 4 d1
  v[1] = hn::Add(t1, t2);
  v[2] = hn::Sub(t1, t2);
  const V8 t3 = hn::Sub(d[4], d[2]);
  const V8 t4 = hn::Mul(two, hn::Sub(d[3], d[1]));
  v[3] = hn::Add(t3, t4);
  v[4] = hn::Sub(t3, t4);
  v[5] = hn::MulAdd(four, d[1], hn::NegMulAdd(five, d[3], d[5]));
}

/// y = A^T m (one dimension of the output transform).
HWY_INLINE void At6(const V8 m[6], V8 y[4]) {
  const D8 df;
  const V8 s12 = hn::Add(m[1], m[2]), d12 = hn::Sub(m[1], m[2]);
  const V8 s34 = hn::Add(m[3], m[4]), d34 = hn::Sub(m[3], m[4]);
  y[0] = hn::Add(hn::Add(m[0], s12), s34);
  y[1] = hn::MulAdd(hn::Set(df, 2.0f), d34, d12);
  y[2] = hn::MulAdd(hn::Set(df, 4.0f), s34, s12);
  y[3] = hn::Add(hn::MulAdd(hn::Set(df, 8.0f), d34, d12), m[5]);
}

/// v = B^T d for F(2x2, 3x3) (one dimension of the input transform).
HWY_INLINE void Bt4(const V8 d[4], V8 v[4]) {
  v[0] = hn::Sub(d[0], d[2]);
  v[1] = hn::Add(d[1], d[2]);
  v[2] = hn::Sub(d[2], d[1]);
  v[3] = hn::Sub(d[1], d[3]);
}

/// y = A^T m for F(2x2, 3x3) (one dimension of the output transform).
HWY_INLINE void At4(const V8 m[4], V8 y[2]) {
  y[0] = hn::Add(hn::Add(m[0], m[1]), m[2]);
  y[1] = hn::Sub(hn::Sub(m[1], m[2]), m[3]);
}

/// Where the `rows` input rows of a group are read: lane t (tile t of the group) of column c
/// (c < 4, or < 2 for F(2x2, 3x3)) at px[r][tile_w t + c], of column tile_w + c at py[r][tile_w t + c]
/// (tile_w = 4, or 2). Direct groups read the input row; the others (plane edges, rows outside
/// the plane, pair groups: tiles 0-3 of row A = r0 + r, 4-7 of row B = r0 + r + tile_w) read
/// zero-padded copies in `stage`.
template <int kRows>
HWY_INLINE void GroupRows(const Tiling& T, const float* plane, int64_t r0, const GroupCols& gc,
                          float (*stage)[2][40], const float* px[kRows], const float* py[kRows]) {
  const int64_t tw = T.t;                       // columns between tiles
  const int64_t seg = kLanes / 2 * tw;          // pair: floats of one row's 4 tiles
  const int64_t span = kLanes * tw + (tw == 4 ? 4 : 2);  // one-row group: floats read (36, 18)
  for (int r = 0; r < kRows; ++r) {
    const int64_t ih = r0 + r;
    if (T.pair) {
      float* X = stage[r][0];
      float* Y = stage[r][1];
      for (int half = 0; half < 2; ++half) {
        const int64_t row = ih + half * tw;
        if (row < 0 || row >= T.IH) {
          std::fill(X + half * seg, X + (half + 1) * seg, 0.0f);
          std::fill(Y + half * seg, Y + (half + 1) * seg, 0.0f);
        } else {
          copy_segment(X + half * seg, plane + row * T.IW, T.IW, gc.c0, seg);
          copy_segment(Y + half * seg, plane + row * T.IW, T.IW, gc.c0 + tw, seg);
        }
      }
      px[r] = X;
      py[r] = Y;
    } else if (ih < 0 || ih >= T.IH) {
      px[r] = py[r] = kZeroRow;
    } else if (gc.direct) {
      px[r] = plane + ih * T.IW + gc.c0;
      py[r] = px[r] + tw;
    } else {
      copy_segment(stage[r][0], plane + ih * T.IW, T.IW, gc.c0, span);
      px[r] = stage[r][0];
      py[r] = px[r] + tw;
    }
  }
}

#undef KILN_WINO_BLOCK_TRANSPOSE  // set again in each target's pass (foreach_target.h)
#if HWY_TARGET != HWY_SCALAR && !HWY_HAVE_SCALABLE
#define KILN_WINO_BLOCK_TRANSPOSE 1
/// In each 128-bit block, the 4x4 transpose: lane i of output c = lane c of input i (32-bit, then
/// 64-bit interleaves within blocks: AVX2's unpacklo/hi and shuffle 0x44/0xEE).
HWY_INLINE void Transpose4InBlocks(V8& a0, V8& a1, V8& a2, V8& a3) {
  const D8 d;
  const hn::Repartition<uint64_t, D8> d64;
  const V8 t0 = hn::InterleaveLower(a0, a1), t1 = hn::InterleaveUpper(d, a0, a1);
  const V8 t2 = hn::InterleaveLower(a2, a3), t3 = hn::InterleaveUpper(d, a2, a3);
  a0 = hn::BitCast(d, hn::InterleaveLower(hn::BitCast(d64, t0), hn::BitCast(d64, t2)));
  a1 = hn::BitCast(d, hn::InterleaveUpper(d64, hn::BitCast(d64, t0), hn::BitCast(d64, t2)));
  a2 = hn::BitCast(d, hn::InterleaveLower(hn::BitCast(d64, t1), hn::BitCast(d64, t3)));
  a3 = hn::BitCast(d, hn::InterleaveUpper(d64, hn::BitCast(d64, t1), hn::BitCast(d64, t3)));
}
#else
#define KILN_WINO_BLOCK_TRANSPOSE 0
#endif

/// Where the 6 input rows of an F(4x4, 3x3) group are read: tiles 0-3 of row r at h[r][0] + 4 t + c
/// (columns c = 0 .. 5), tiles 4-7 at h[r][1] + 4 (t - 4) + c; 20 floats from each pointer.
/// Direct groups and pair groups inside the row read the input rows (pair: h[r][0] on row A =
/// r0 + r, h[r][1] on row B = r0 + r + 4); the others read zero-padded copies in `stage`.
HWY_INLINE void GroupRows4(const Tiling& T, const float* plane, int64_t r0, const GroupCols& gc,
                           float (*stage)[2][40], const float* h[6][2]) {
  const bool inside = gc.c0 >= 0 && gc.c0 + 20 <= T.IW;  // pair: columns c0 .. c0 + 19
  for (int r = 0; r < 6; ++r) {
    const int64_t ih = r0 + r;
    if (T.pair) {
      for (int half = 0; half < 2; ++half) {
        const int64_t row = ih + half * 4;
        if (row < 0 || row >= T.IH) {
          h[r][half] = kZeroRow;
        } else if (inside) {
          h[r][half] = plane + row * T.IW + gc.c0;
        } else {
          copy_segment(stage[r][half], plane + row * T.IW, T.IW, gc.c0, 20);
          h[r][half] = stage[r][half];
        }
      }
    } else if (ih < 0 || ih >= T.IH) {
      h[r][0] = h[r][1] = kZeroRow;
    } else {
      const float* p = plane + ih * T.IW + gc.c0;
      if (!gc.direct) {
        copy_segment(stage[r][0], plane + ih * T.IW, T.IW, gc.c0, 36);
        p = stage[r][0];
      }
      h[r][0] = p;
      h[r][1] = p + 16;
    }
  }
}

/// F(4x4, 3x3) input transform of one group (tile row ty: input rows 4 ty - PH .. + 5; tiles tx0 ..
/// tx0 + 7, columns `gc`) of input channel plane `plane` [IH, IW]: V[pos] lanes written at
/// dst + pos * v_stride (8 floats each). With 4 or more lanes, the columns of the tiles come from
/// plain loads and a 4x4 transpose within each 128-bit block (so lane (block b, position i) of
/// the vector for tiles s .. s + N - 1 holds tile s + i N / 4 + b: the order OutputGroup undoes);
/// with one lane (scalar target), from LoadInterleaved4.
HWY_INLINE void InputGroup4(const Tiling& T, const float* plane, int64_t ty, const GroupCols& gc, float* dst) {
  const D8 d;
  const size_t N = hn::Lanes(d);
  float stage[6][2][40];
  const float* h[6][2];
  GroupRows4(T, plane, ty * 4 - T.PH, gc, stage, h);
  // The float at offset o (= 4 t + c, t < 8 the tile) of row r.
  const auto at = [&](int r, size_t o) { return h[r][o / 16] + o % 16; };
  for (size_t s = 0; s < static_cast<size_t>(kLanes); s += N) {
    V8 hv[6][6];
    for (int r = 0; r < 6; ++r) {
      V8 c[6];
#if KILN_WINO_BLOCK_TRANSPOSE
      V8 a0 = hn::LoadU(d, at(r, 4 * s)), a1 = hn::LoadU(d, at(r, 4 * s + N));
      V8 a2 = hn::LoadU(d, at(r, 4 * s + 2 * N)), a3 = hn::LoadU(d, at(r, 4 * s + 3 * N));
      V8 b0 = hn::LoadU(d, at(r, 4 * s) + 4), b1 = hn::LoadU(d, at(r, 4 * s + N) + 4);
      V8 b2 = hn::LoadU(d, at(r, 4 * s + 2 * N) + 4), b3 = hn::LoadU(d, at(r, 4 * s + 3 * N) + 4);
      Transpose4InBlocks(a0, a1, a2, a3);
      Transpose4InBlocks(b0, b1, b2, b3);
      c[0] = a0;
      c[1] = a1;
      c[2] = a2;
      c[3] = a3;
      c[4] = b0;
      c[5] = b1;
#else
      V8 u0, u1;
      hn::LoadInterleaved4(d, at(r, 4 * s), c[0], c[1], c[2], c[3]);
      hn::LoadInterleaved4(d, at(r, 4 * s) + 4, c[4], c[5], u0, u1);
#endif
      Bt6(c, hv[r]);
    }
    for (int l = 0; l < 6; ++l) {
      const V8 col[6] = {hv[0][l], hv[1][l], hv[2][l], hv[3][l], hv[4][l], hv[5][l]};
      V8 v[6];
      Bt6(col, v);
      for (int k = 0; k < 6; ++k) hn::StoreU(v[k], d, dst + static_cast<int64_t>(k * 6 + l) * T.v_stride + s);
    }
  }
}

/// F(2x2, 3x3) input transform of one group (tile row ty: input rows 2 ty - PH .. + 3; tiles tx0 ..
/// tx0 + 7: input columns c0 .. c0 + 17), as InputGroup4.
HWY_INLINE void InputGroup2(const Tiling& T, const float* plane, int64_t ty, const GroupCols& gc, float* dst) {
  const D8 d;
  const size_t N = hn::Lanes(d);
  float stage[4][2][40];
  const float* px[4];
  const float* py[4];
  GroupRows<4>(T, plane, ty * 2 - T.PH, gc, stage, px, py);
  for (size_t s = 0; s < static_cast<size_t>(kLanes); s += N) {
    V8 h[4][4];
    for (int r = 0; r < 4; ++r) {
      V8 c[4];
      hn::LoadInterleaved2(d, px[r] + 2 * s, c[0], c[1]);
      hn::LoadInterleaved2(d, py[r] + 2 * s, c[2], c[3]);
      Bt4(c, h[r]);
    }
    for (int l = 0; l < 4; ++l) {
      const V8 col[4] = {h[0][l], h[1][l], h[2][l], h[3][l]};
      V8 v[4];
      Bt4(col, v);
      for (int k = 0; k < 4; ++k) hn::StoreU(v[k], d, dst + static_cast<int64_t>(k * 4 + l) * T.v_stride + s);
    }
  }
}

/// Output transform of one group for one output channel (tiles of tw x tw, tw = 4 or 2): M[pos]
/// lanes at src + pos * pos_step; + bias, `post`, then the fused residual and `after`; writes the
/// valid part of rows tw ty .. tw ty + tw - 1, columns tw tx0 .. tw tx0 + 8 tw - 1 of `oplane`
/// [OH, OW] (pair groups: tiles 0-3 to rows tw ty + i, tiles 4-7 to rows tw ty + tw + i).
template <int tw>
HWY_INLINE void OutputGroup(const Tiling& T, const float* src, int64_t pos_step, float bias, const PostOp& post,
                            float* oplane, int64_t ty, int64_t tx0, const float* res) {
  constexpr int n = tw + 2;         // transformed tile n x n
  constexpr int64_t W = kLanes * tw;  // output floats of a group's row
  const D8 d;
  const size_t N = hn::Lanes(d);
  const int64_t ox = tx0 * tw;
  const int64_t valid = T.pair ? std::min<int64_t>(W / 2, T.OW) : std::min<int64_t>(W, T.OW - ox);
  const bool in_place = !T.pair && valid == W;  // whole rows stored straight into the output
  alignas(64) float tmp[tw][W];
  float* rows[tw];
  for (int i = 0; i < tw; ++i) {
    const int64_t oy = ty * tw + i;
    rows[i] = !in_place ? tmp[i] : oy < T.OH ? oplane + oy * T.OW + ox : nullptr;
  }
  const V8 vb = hn::Set(d, bias);
  for (size_t s = 0; s < static_cast<size_t>(kLanes); s += N) {
    V8 t[n][tw];
    for (int k = 0; k < n; ++k) {
      V8 m[n];
      for (int l = 0; l < n; ++l) m[l] = hn::LoadU(d, src + static_cast<int64_t>(k * n + l) * pos_step + s);
      if constexpr (tw == 4) {
        At6(m, t[k]);
      } else {
        At4(m, t[k]);
      }
    }
    V8 y[tw][tw];  // y[i][j]: output row i, column j of each lane's tile
    for (int j = 0; j < tw; ++j) {
      V8 col[n];
      for (int k = 0; k < n; ++k) col[k] = t[k][j];
      V8 r[tw];
      if constexpr (tw == 4) {
        At6(col, r);
      } else {
        At4(col, r);
      }
      for (int i = 0; i < tw; ++i) {
        V8 v = hn::Add(r[i], vb);
        if (post.kind != PostOp::Kind::None) v = ApplyPostOp(d, post, v);
        y[i][j] = v;
      }
    }
    for (int i = 0; i < tw; ++i) {
      if (rows[i] == nullptr) continue;
      if constexpr (tw == 4) {
#if KILN_WINO_BLOCK_TRANSPOSE
        // Lane (block b, position q) holds tile s + q N / 4 + b (InputGroup4): the transpose
        // within blocks gives z_q = the 4 columns of tiles s + q N / 4 .., N contiguous floats.
        V8 z0 = y[i][0], z1 = y[i][1], z2 = y[i][2], z3 = y[i][3];
        Transpose4InBlocks(z0, z1, z2, z3);
        float* o = rows[i] + 4 * s;
        hn::StoreU(z0, d, o);
        hn::StoreU(z1, d, o + N);
        hn::StoreU(z2, d, o + 2 * N);
        hn::StoreU(z3, d, o + 3 * N);
#else
        hn::StoreInterleaved4(y[i][0], y[i][1], y[i][2], y[i][3], d, rows[i] + 4 * s);
#endif
      } else {
        hn::StoreInterleaved2(y[i][0], y[i][1], d, rows[i] + 2 * s);
      }
    }
  }
  for (int i = 0; i < tw; ++i) {
    if (T.pair) {
      for (int half = 0; half < 2; ++half) {
        const int64_t oy = ty * tw + tw * half + i;
        if (oy >= T.OH) continue;
        std::memcpy(oplane + oy * T.OW, tmp[i] + W / 2 * half, sizeof(float) * static_cast<size_t>(valid));
        if (res != nullptr) ResidualRange(oplane + oy * T.OW, res + oy * T.OW, valid, T.after);
      }
      continue;
    }
    const int64_t oy = ty * tw + i;
    if (oy >= T.OH) break;
    if (!in_place) std::memcpy(oplane + oy * T.OW + ox, tmp[i], sizeof(float) * static_cast<size_t>(valid));
    if (res != nullptr) ResidualRange(oplane + oy * T.OW + ox, res + oy * T.OW + ox, valid, T.after);
  }
}

/// 1. input transform of input channels [c0, c1) of block `b`, straight into its packed B panels;
///    channel by channel, so that the group's input rows are read left to right and each panel row
///    (kGemmPanelCols / 8 groups) is written whole.
void WinogradInput(const Block& b, const float* x, int64_t c0, int64_t c1) {
  const Tiling& T = *b.T;
  const int64_t IHW = T.IH * T.IW;
  constexpr int64_t kGroupsPerPanel = kGemmPanelCols / kLanes;
  for (int64_t c = c0; c < c1; ++c) {
    const int64_t kb = c / kGemmKBlock, p = c % kGemmKBlock;
    const int64_t kc = std::min<int64_t>(kGemmKBlock, T.cin - kb * kGemmKBlock);
    float* vc = b.V + kb * b.npanels * gemm_panel_stride(kGemmKBlock) + p * kGemmPanelCols;
    for (int64_t gi = 0; gi < b.ng; ++gi) {
      const float* plane = x + (b.where[gi].n * T.cin + c) * IHW;
      float* dst = vc + gi / kGroupsPerPanel * gemm_panel_stride(kc) + gi % kGroupsPerPanel * kLanes;
      if (T.t == 4) {
        InputGroup4(T, plane, b.where[gi].ty, b.cols[gi], dst);
      } else {
        InputGroup2(T, plane, b.where[gi].ty, b.cols[gi], dst);
      }
    }
  }
}

/// 3. output transform of output channels [o0, o1) of block `b` (lanes of group gi at column 8 gi).
void WinogradOutput(const Block& b, const float* bias, const PostOp& post, float* out, int64_t o0, int64_t o1) {
  const Tiling& T = *b.T;
  const int64_t OHW = T.OH * T.OW;
  for (int64_t o = o0; o < o1; ++o) {
    const float bv = bias != nullptr ? bias[o] : 0.0f;
    for (int64_t gi = 0; gi < b.ng; ++gi) {
      const float* src = b.M + o * T.npos * b.N + gi * kLanes;
      float* oplane = out + (b.where[gi].n * T.cout + o) * OHW;
      const float* res = T.residual != nullptr ? T.residual + (b.where[gi].n * T.cout + o) * OHW : nullptr;
      if (T.t == 4) {
        OutputGroup<4>(T, src, b.N, bv, post, oplane, b.where[gi].ty, b.where[gi].tx0, res);
      } else {
        OutputGroup<2>(T, src, b.N, bv, post, oplane, b.where[gi].ty, b.where[gi].tx0, res);
      }
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace kiln
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kiln::cpu {
HWY_EXPORT(ResidualRange);
HWY_EXPORT(WinogradInput);
HWY_EXPORT(WinogradOutput);

namespace {

/// One block of groups [g0, g1) of the whole batch on the calling thread (its own scratch).
void run_block(const Tiling& T, const float* x, const float* packed, const float* bias, float* out,
               const PostOp& post, int64_t g0, int64_t g1) {
  thread_local Block blk;
  blk.init(T, g0, g1, block_scratch(static_cast<size_t>(T.npos * T.v_stride + T.m_floats)));
  KILN_CPU_DISPATCH(WinogradInput)(blk, x, 0, T.cin);
  for (int64_t pos = 0; pos < T.npos; ++pos) {
    for (int64_t q = 0; q < T.chunks; ++q) blk.gemm(packed, pos, q);
  }
  KILN_CPU_DISPATCH(WinogradOutput)(blk, bias, post, out, 0, T.cout);
}
/// True when the transformed filters (36 C_in C_out floats) take at most 4 MiB: they then stay in
/// the caches while each thread runs its own small blocks of tiles; larger ones run conv_large.
bool small_filters(int64_t cin, int64_t cout) {
  return static_cast<double>(cin) * static_cast<double>(cout) * kPos * 4.0 <= 4.0 * 1024 * 1024;
}

/// Floats of scratch (transformed input + GEMM output) of one block of the per-thread path: 2x
/// and 4x larger were 5-10% slower (64 channels, 256x256).
constexpr int64_t kSmallBudget = 96 * 1024;

/// Large channel counts (blocks of fewer than 2 groups in kSmallBudget): blocks of
/// large_block_groups() groups, each transformed, multiplied and transformed back by all threads
/// together (input channels, (position, output-channel chunk) GEMMs, output channels split
/// between them), in one shared scratch of 36 (C_in + C_out) 8 G floats. The packed filters are
/// streamed from memory once per block, so a block has many tiles (each filter float is used for
/// 8 G tiles).
int64_t large_block_groups(const Tiling& T) {
  // Scratch of at most kLargeScratch bytes (also its memory: it is kept for the next call), at
  // most 16 groups (128 tiles: 64x64 has 256), at least 1. (8, 16 and 32 groups measured within
  // the noise of a loaded box for 320 -> 320 and 960 -> 320 at 64x64.)
  constexpr double kLargeScratch = 24.0 * 1024 * 1024;
  const double per_group = static_cast<double>(T.npos * kLanes * (T.cin + T.cout)) * 4.0;
  const int64_t want = std::clamp<int64_t>(static_cast<int64_t>(kLargeScratch / per_group), 1, 16);
  int64_t G = std::min(want, T.groups_total);
  // blocks of nearly equal size, whole 16-column panels where the block is not the whole batch
  const int64_t blocks = (T.groups_total + G - 1) / G;
  G = (T.groups_total + blocks - 1) / blocks;
  if (G > 1 && G < T.groups_total) G = (G + 1) / 2 * 2;
  return G;
}

void conv_large(Tiling& T, const float* x, const float* packed, const float* bias, float* out, ThreadPool* pool,
                const PostOp& post) {
  const int64_t G = large_block_groups(T);
  T.G = G;
  T.v_stride = (prepacked_b_floats(G * kLanes, T.cin) + 15) / 16 * 16;
  T.m_floats = T.cout * T.npos * G * kLanes;
  float* scratch = block_scratch(static_cast<size_t>(T.npos * T.v_stride + T.m_floats));
  Block blk;
  constexpr int64_t kChan = 16;  // channels per task of the transforms
  for (int64_t g0 = 0; g0 < T.groups_total; g0 += G) {
    blk.init(T, g0, std::min(T.groups_total, g0 + G), scratch);
    parallel_tasks(pool, (T.cin + kChan - 1) / kChan, [&](int64_t t) {
      KILN_CPU_DISPATCH(WinogradInput)(blk, x, t * kChan, std::min(T.cin, (t + 1) * kChan));
    });
    parallel_tasks(pool, T.npos * T.chunks, [&](int64_t t) { blk.gemm(packed, t / T.chunks, t % T.chunks); });
    parallel_tasks(pool, (T.cout + kChan - 1) / kChan, [&](int64_t t) {
      KILN_CPU_DISPATCH(WinogradOutput)(blk, bias, post, out, t * kChan, std::min(T.cout, (t + 1) * kChan));
    });
  }
}

}  // namespace

int winograd_tile(const ConvGeometry& g) {
  if (g.spatial_dims != 2 || g.transposed || g.groups != 1) return 0;
  if (g.kernel[0] != 3 || g.kernel[1] != 3 || g.stride[0] != 1 || g.stride[1] != 1) return 0;
  if (g.dilation[0] != 1 || g.dilation[1] != 1) return 0;
  if (g.in_channels < 1 || g.out_channels < 1) return 0;
  const char* env = std::getenv("KILN_CPU_WINOGRAD");
  if (env != nullptr && std::strcmp(env, "0") == 0) return 0;
  if (env != nullptr && std::strcmp(env, "1") == 0) return 4;
  if (env != nullptr && std::strcmp(env, "2") == 0) return 2;
  if (env != nullptr && *env != '\0') {  // anything else is said once, not ignored silently
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true)) {
      std::fprintf(stderr, "kiln: ignoring KILN_CPU_WINOGRAD='%s' (0, 1 or 2); using the default policy\n", env);
    }
  }
  // C_in >= 8, any C_out, enough output tiles, and at least half of the 8-tile groups' lanes used
  // (a row of 4 tiles fills half a group). Measured (1 thread, one conv, Winograd / im2col time,
  // C_in -> C_out at H x W): 64->64 56x56 0.31, 128->128 28x28 0.37, 256->256 14x14 0.98 (16 tiles,
  // half the lanes: left to im2col), 64->64 256x256 0.42, 64->3 512x512 0.57, 64->1 256x256 0.69,
  // 16->3 128x128 0.45, 8->64 128x128 0.88, 8->8 128x128 0.58, 4->64 64x64 1.11 (left to im2col).
  if (g.in_channels < 8) return 0;
  // Tiles of t x t in the batch, when at least half of the 8-tile groups' lanes are used (else 0;
  // at most 4 tiles per row: groups of two tile rows, Tiling::pair).
  const auto tiles = [&](int t) -> int64_t {
    const int64_t ty = (g.out_size[0] + t - 1) / t, tx = (g.out_size[1] + t - 1) / t;
    const int64_t lanes = tx <= kLanes / 2 ? (ty + 1) / 2 * kLanes : ty * ((tx + kLanes - 1) / kLanes * kLanes);
    return 2 * ty * tx >= lanes ? g.batch * ty * tx : 0;
  };
  if (small_filters(g.in_channels, g.out_channels)) {
    const int64_t ty = (g.out_size[0] + 3) / 4, tx = (g.out_size[1] + 3) / 4;
    return tiles(4) > 0 && ty * tx >= 32 ? 4 : 0;
  }
  // Larger filters (conv_large: each block of up to 128 tiles streams all of them from memory)
  // need at least 64 output tiles in the batch, i.e. each transformed filter float used for 64
  // tiles. Measured (1 thread, one conv, Winograd / im2col time, C_in -> C_out at H x W, padding 1):
  // F(4x4, 3x3), 64x64: 320->320 0.35, 640->320 0.34, 960->320 0.32, 640->640 0.29; 32x32: 320->640
  // 0.24, 640->640 0.29, 1280->640 0.29, 1920->640 0.28, 1280->1280 0.26. With fewer than 64 tiles
  // of 4x4, F(2x2, 3x3) (4x the tiles, 16/9 the weights' memory instead of 4x) where that gives
  // 64: 16x16: 1280->1280 0.53, 640->1280 0.51, 1920->1280 0.52, 2560->1280 0.45 (F(4x4, 3x3)
  // there: 1.2x F(2x2, 3x3)'s time, and it would grow the SD UNet's 16x16 convs from 0.77 to 3.1 GB
  // instead of 1.4 GB). Smaller planes, since groups of 8 tiles may span two tile rows (pair):
  // F(2x2, 3x3) from 16 tiles of 2x2 (7x7, 8x8). Measured (1 thread, 2-4 convs in a row,
  // F(2x2, 3x3) / im2col time, noisy box): 512->512 7x7 0.52, 256->256 7x7 0.55, 256->256 14x14
  // 0.55, 512->512 14x14 0.5, 1280->1280 8x8 0.55 (before pairing, with half of the lanes empty, 8x8
  // was 1.04 and stayed on im2col). The transformed filters take 16/9 the weights' memory: below
  // 64 tiles only where they are at most 32 MiB (resnet's 512 -> 512: 16 MiB), so that the SD
  // UNet's 8x8 level (1280 channels: 100 MiB per conv) keeps the smaller packed weights (its
  // prepared state would grow by ~0.5 GB for ~0.55x the time of those convs).
  // The same for F(4x4, 3x3) where its groups are pairs (at most 4 tiles of 4x4 per row; 14x14:
  // 16 tiles in 2 groups), measured against F(2x2, 3x3): 256->256 14x14 0.72 (1 thread), 0.6-0.8
  // (2 threads), 512->512 14x14 0.75.
  constexpr double kCap = 32.0 * 1024 * 1024;
  const double cc = static_cast<double>(g.in_channels) * static_cast<double>(g.out_channels) * 4.0;
  const bool pair4 = (g.out_size[1] + 3) / 4 <= kLanes / 2;
  if (tiles(4) >= 64 || (pair4 && 36.0 * cc <= kCap && tiles(4) >= 16)) return 4;
  if (tiles(2) >= 64 || (16.0 * cc <= kCap && tiles(2) >= 16)) return 2;
  return 0;
}

bool winograd_applies(const ConvGeometry& g) { return winograd_tile(g) != 0; }

int64_t winograd_pos_stride(int64_t cout, int64_t cin) {
  return (cout + chunk_rows(cout) - 1) / chunk_rows(cout) * chunk_stride(cout, cin);
}

void winograd_pack_weights(const float* w, int64_t cout, int64_t cin, int tile, std::vector<float>& out) {
  const int n = tile + 2;  // transformed tile n x n
  const int64_t npos = positions(tile);
  const int64_t stride = winograd_pos_stride(cout, cin);
  const int64_t mc = chunk_rows(cout), cstride = chunk_stride(cout, cin);
  out.assign(static_cast<size_t>(npos * stride), 0.0f);
  std::vector<float> u(static_cast<size_t>(npos * mc * cin));  // one chunk: [pos][o - o0][c]
  double gm[6][3];  // G (n x 3)
  for (int k = 0; k < n; ++k) {
    for (int j = 0; j < 3; ++j) gm[k][j] = tile == 4 ? kG[k][j] : kG2[k][j];
  }
  for (int64_t o0 = 0, q = 0; o0 < cout; o0 += mc, ++q) {
    const int64_t rows = std::min(mc, cout - o0);
    // 32 input channels at a time, lanes innermost (vectorizable; each position's 32 values
    // stored contiguously): the same operations, in the same order, as one channel at a time.
    constexpr int64_t kC = 32;
    for (int64_t o = 0; o < rows; ++o) {
      for (int64_t c0 = 0; c0 < cin; c0 += kC) {
        const int64_t cb = std::min(kC, cin - c0);
        const float* g = w + ((o0 + o) * cin + c0) * 9;
        double gv[9][kC];  // gv[e][cc] = weight element e (row-major 3x3) of channel c0 + cc
        for (int64_t cc = 0; cc < cb; ++cc) {
          for (int e = 0; e < 9; ++e) gv[e][cc] = g[cc * 9 + e];
        }
        double tmp[6][3][kC];  // G g
        for (int k = 0; k < n; ++k) {
          for (int j = 0; j < 3; ++j) {
            for (int64_t cc = 0; cc < cb; ++cc) {
              tmp[k][j][cc] = gm[k][0] * gv[0 * 3 + j][cc] + gm[k][1] * gv[1 * 3 + j][cc] + gm[k][2] * gv[2 * 3 + j][cc];
            }
          }
        }
        for (int k = 0; k < n; ++k) {
          for (int l = 0; l < n; ++l) {  // (G g) G^T
            float* dst = u.data() + ((k * n + l) * rows + o) * cin + c0;
            for (int64_t cc = 0; cc < cb; ++cc) {
              dst[cc] = static_cast<float>(tmp[k][0][cc] * gm[l][0] + tmp[k][1][cc] * gm[l][1] + tmp[k][2][cc] * gm[l][2]);
            }
          }
        }
      }
    }
    for (int64_t pos = 0; pos < npos; ++pos) {
      pack_a_for_gemm(rows, cin, u.data() + pos * rows * cin, cin, out.data() + pos * stride + q * cstride);
    }
  }
}

void residual_inplace(float* y, const float* r, int64_t n, const PostOp& after) {
  KILN_CPU_DISPATCH(ResidualRange)(y, r, n, after);
}

void conv_winograd(const ConvGeometry& g, int tile, const float* x, const float* packed, const float* bias,
                   float* out, ThreadPool* pool, const PostOp& post, const float* residual, const PostOp& after) {
  Tiling T{};
  T.t = tile;
  T.residual = residual;
  T.after = after;
  T.npos = positions(tile);
  T.IH = g.in_size[0];
  T.IW = g.in_size[1];
  T.OH = g.out_size[0];
  T.OW = g.out_size[1];
  T.PH = g.padding[0];
  T.PW = g.padding[1];
  T.cin = g.in_channels;
  T.cout = g.out_channels;
  T.tiles_y = (T.OH + tile - 1) / tile;
  T.tiles_x = (T.OW + tile - 1) / tile;
  T.pair = T.tiles_x <= kLanes / 2;
  T.gx = (T.tiles_x + kLanes - 1) / kLanes;
  T.groups_per_image = T.pair ? (T.tiles_y + 1) / 2 : T.tiles_y * T.gx;
  T.groups_total = g.batch * T.groups_per_image;
  T.pos_stride = winograd_pos_stride(T.cout, T.cin);
  T.chunk_stride = chunk_stride(T.cout, T.cin);
  T.chunks = (T.cout + chunk_rows(T.cout) - 1) / chunk_rows(T.cout);
  const int64_t threads = pool != nullptr ? pool->num_threads() : 1;
  if (!small_filters(T.cin, T.cout)) {
    conv_large(T, x, packed, bias, out, pool, post);
    return;
  }
  // Groups per block: transformed input + GEMM output of a block within ~`budget` floats.
  // Two groups (one whole 16-column panel per GEMM) where they fit in 2x the budget: 128 -> 128
  // channels at 28x28 then runs at ~0.7x the time of one group (8 columns) per block, 1 thread.
  const int64_t per_group = T.npos * kLanes * (T.cin + T.cout);
  int64_t G = std::max<int64_t>(1, kSmallBudget / per_group);
  if (G < 2 && 2 * per_group <= 2 * kSmallBudget) G = 2;
  if (threads > 1) {  // at least ~4 blocks per thread, but not below 2 groups with >= 1.5 blocks per thread
    const int64_t lowest = T.groups_total >= 3 * threads ? std::min<int64_t>(G, 2) : 1;
    G = std::min(G, std::max<int64_t>(lowest, T.groups_total / (4 * threads)));
  }
  G = std::min(G, T.groups_total);
  if (G > 1) G = G / 2 * 2;  // whole 16-column panels
  T.G = G;
  T.v_stride = (prepacked_b_floats(G * kLanes, T.cin) + 15) / 16 * 16;
  T.m_floats = T.cout * T.npos * G * kLanes;
  const int64_t blocks = (T.groups_total + G - 1) / G;
  parallel_tasks(pool, blocks, [&](int64_t b) {
    run_block(T, x, packed, bias, out, post, b * G, std::min(T.groups_total, (b + 1) * G));
  });
}

}  // namespace kiln::cpu
#endif  // HWY_ONCE
