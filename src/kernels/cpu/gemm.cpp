// fp32 GEMM: cache blocking + packing + a register-blocked microkernel (see gemm.h), written once
// over Google Highway for every SIMD target (hwy/foreach_target.h compiles the per-target part
// once per target; the process's target is chosen by cpu::select_target()).
//
// Loop nest (Goto & van de Geijn 2008; BLIS's five loops), for one rectangle of C:
//   for jc in N step NC:           B block  [KC x NC] packed into 16-column panels (L2)
//     for pc in K step KC:
//       for ic in M step MC:       A block  [MC x KC] packed into MR-row panels (L2), alpha folded in
//         for jr in NC step 16:    one B micro-panel [KC x 16] (L1)
//           for ir in MC step MR:  microkernel: MR x 16 tile of C in registers over KC
// The first K block applies beta (C = acc + beta*C, C unread when beta == 0), later ones add,
// the last one adds the bias and clamps.
//
// Per target: the B panels are 16 columns wide on every target (the layout of gemm.h, which other
// kernels write directly); the microkernel's tile is MR rows x W columns of a panel, W = V * Lanes
// with V vectors per row (AVX2: 6 x 16, 2 ymm per row, 12 accumulators of 16 registers;
// AVX-512: 16 x 16, one zmm per row, 16 accumulators of 32, the A broadcast folded into the FMA;
// NEON / SVE-128: 6 x 16, 4 vectors per row; the scalar target: 4 x 2 tiles, 8 per panel).
// Edge tiles run a variant of the kernel with fewer rows (and vectors), from the same source.
#include "kernels/cpu/gemm.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/parallel_util.h"
#include "kernels/cpu/target.h"

// Per-target part: compiled once per SIMD target (hwy/foreach_target.h re-includes this file).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/gemm.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/post_op-inl.h"
#include "kernels/cpu/vec-inl.h"

#ifndef KILN_CPU_GEMM_SHARED_
#define KILN_CPU_GEMM_SHARED_
namespace kiln::cpu::gemm_detail {

constexpr int NR = kGemmPanelCols;  ///< columns of a packed B panel (every target)
constexpr int64_t KC = kGemmKBlock;
constexpr int64_t NC = kGemmMaxPackCols;  // multiple of NR; B block 256 x 1024 x 4 B = 1 MiB: written by packing,
                                          // read from L2/L3 (4096, as BLIS uses on Zen, made resnet18 ~10%
                                          // slower here: packing writes missed L2)
/// Rows of A per A block, before rounding down to a multiple of the target's MR: 144 x 256 x 4 B =
/// 144 KiB (L2 is 1 MiB).
constexpr int64_t kMcTarget = 144;
/// Floats from one packed B panel to the next: kc rows of NR plus one cache line, so that the
/// same row of consecutive panels does not fall into one L1 set (kc * 64 B is a multiple of 4 KiB).
constexpr int64_t panel_stride(int64_t kc) { return kc * NR + NR; }
/// k-steps per block of the transposing copies into packed panels (pack_b, PackA): a row of A
/// (column of op(B)) is copied kPackKBlock values at a time, then the next row, so that the
/// destination lines of the block stay in L1. Measured here (512 x 4608 A, 16-row panels): 1.0 ms
/// against 2.4 ms copying whole rows, and 0.98 ms for the former AVX2 8x8 transposes.
constexpr int64_t kPackKBlock = 16;
static_assert(panel_stride(7) == gemm_panel_stride(7), "gemm.h documents the packer's panel layout");

struct GemmArgs {
  bool trans_a, trans_b;
  int64_t M, N, K;
  float alpha;
  const float* A;
  int64_t lda;
  const float* B;
  int64_t ldb;
  float beta;
  float* C;
  int64_t ldc;
  const GemmEpilogue* ep;
  const GemmBPacker* packer = nullptr;  // when set, B is produced by the packer (B, ldb unused)
  const float* packed_a = nullptr;      // when set, A packed by pack_a_for_gemm (alpha 1, no transpose)
  const float* packed_b = nullptr;      // when set, op(B) packed by pack_b_for_gemm (prepacked_b_floats layout)
};

/// What the microkernel does when it stores a tile: which K block this is and where the tile
/// sits in C (for the bias index).
struct TileStore {
  float beta;
  bool first;  // first K block: C = acc + beta * C
  bool last;   // last K block: + bias, clamp
  int64_t row0, col0;
  const GemmEpilogue* ep;
  const float* prefetch = nullptr;  ///< the slice of the next B panel to prefetch during this tile
  int64_t prefetch_lines = 0;       ///< its 64-byte lines (at most kc / k_per_line); 0: none
};

/// Sets the slice of the next B panel that tile `tile` of the current panel prefetches, one
/// 64-byte line (one row of the panel) per `k_per_line` k-steps of its kc: tiles 0, 1, ... take
/// consecutive slices of kc / k_per_line lines (at kc = 256 and 8 k-steps per line, the first 8
/// tiles cover a whole 256-row panel, 16 KiB). No prefetch when `next_panel` is null or the
/// earlier tiles cover it; never an address past the panel.
/// For B prepacked before the product (a linear layer's weights, packed at load time: hundreds of
/// MiB for a text encoder, read from DRAM on every call; or the B that all parts of a product
/// split along M share). Without it the first tile of every panel waits for the panel: 77-row
/// linear layers went from 84 to 92 GFLOP/s on one core (AVX2). B packed per block (im2col,
/// Winograd) is in cache already and gets none.
inline void set_prefetch(TileStore& s, const float* next_panel, int64_t next_kc, int64_t kc, int64_t tile,
                         int k_per_line) {
  const int64_t per_tile = kc / k_per_line, first = tile * per_tile;
  s.prefetch_lines = next_panel != nullptr ? std::clamp<int64_t>(next_kc - first, 0, per_tile) : 0;
  s.prefetch = s.prefetch_lines > 0 ? next_panel + first * NR : nullptr;
}

/// Packs op(B)[p0 : p0+kc, j0 : j0+nc] into NR-column panels: panel q holds, for each p, NR
/// consecutive values (columns past nc are zero). Plain copies (no shuffles, every target):
/// without transpose row by row (sequential reads of B, one 64-byte copy per full panel row);
/// transposed (rows of B are columns of op(B)) kPackKBlock values of each row of B at a time,
/// stored 64 bytes apart into the panel (about as fast here as the former AVX2 8x8 transposes).
inline void pack_b(const GemmArgs& g, int64_t j0, int64_t nc, int64_t p0, int64_t kc, float* out) {
  if (!g.trans_b) {
    const int64_t full = nc / NR * NR;
    for (int64_t p = 0; p < kc; ++p) {
      const float* src = g.B + (p0 + p) * g.ldb + j0;
      for (int64_t jr = 0; jr < full; jr += NR) std::memcpy(out + jr / NR * panel_stride(kc) + p * NR, src + jr, sizeof(float) * NR);
      if (full < nc) {
        float* d = out + full / NR * panel_stride(kc) + p * NR;
        const int n = static_cast<int>(nc - full);
        int j = 0;
        for (; j < n; ++j) d[j] = src[full + j];
        for (; j < NR; ++j) d[j] = 0.0f;
      }
    }
    return;
  }
  for (int64_t jr = 0; jr < nc; jr += NR) {
    const int n = static_cast<int>(std::min<int64_t>(NR, nc - jr));
    float* dst = out + jr / NR * panel_stride(kc);
    // 16 k-steps of every column at a time (the panel's 16 rows of 64 bytes stay in L1): about
    // twice as fast as whole columns at once.
    for (int64_t q = 0; q < kc; q += kPackKBlock) {
      const int64_t kb = std::min(kPackKBlock, kc - q);
      for (int j = 0; j < n; ++j) {
        const float* src = g.B + (j0 + jr + j) * g.ldb + p0 + q;
        for (int64_t p = 0; p < kb; ++p) dst[(q + p) * NR + j] = src[p];
      }
    }
    for (int j = n; j < NR; ++j) {
      for (int64_t p = 0; p < kc; ++p) dst[p * NR + j] = 0.0f;
    }
  }
}

/// Packs all of op(B) [K, N] of `g` (its packer, or B transposed or not) in the
/// prepacked_b_floats layout, the (K block, NC-column block) pieces spread over `pool` (may be null).
inline void pack_b_whole(const GemmArgs& g, float* out, ThreadPool* pool) {
  const int64_t npanels = (g.N + NR - 1) / NR, kblocks = (g.K + KC - 1) / KC, nblocks = (g.N + NC - 1) / NC;
  parallel_tasks(pool, kblocks * nblocks, [&](int64_t t) {
    const int64_t pc = t / nblocks * KC, jc = t % nblocks * NC;
    const int64_t kc = std::min(KC, g.K - pc), nc = std::min(NC, g.N - jc);
    float* d = out + pc / KC * npanels * panel_stride(KC) + jc / NR * panel_stride(kc);
    if (g.packer != nullptr) {
      g.packer->fn(g.packer->ctx, jc, nc, pc, kc, d);
    } else {
      pack_b(g, jc, nc, pc, kc, d);
    }
  });
}

/// Whether to use the pool: waking a sleeping pool thread costs tens of microseconds here, so
/// products below ~4 MFLOP (~50 us on one core) run on the caller; matrix-vector products
/// (memory-bound, ~4x slower per FLOP: a squeeze-excite 1x1 convolution of 240 x 960 weights
/// takes ~0.1 ms on one core) from 0.25 MFLOP.
inline bool use_pool(ThreadPool* pool, int64_t M, int64_t N, int64_t K) {
  const double flops = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
  const double min_flops = (M == 1 || N == 1) ? 2.5e5 : 4e6;
  return pool != nullptr && pool->num_threads() > 1 && flops >= min_flops;
}

/// Largest operand (floats) that a parallel product packs once for all its parts (the calling
/// thread's buffers, kept for its next products) instead of once per part: op(A) when split along
/// N (1 Mi floats = 4 MiB), op(B) when split along M (4 Mi floats = 16 MiB).
constexpr int64_t kSharedPackAMaxFloats = int64_t{1} << 20;
constexpr int64_t kSharedPackBMaxFloats = int64_t{1} << 22;

}  // namespace kiln::cpu::gemm_detail
#endif  // KILN_CPU_GEMM_SHARED_

HWY_BEFORE_NAMESPACE();
namespace kiln {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace gd = gemm_detail;
using gd::GemmArgs;
using gd::NR;
using gd::TileStore;

/// The microkernel's vector: at most one panel row (16 floats) wide.
using DT = hn::CappedTag<float, gd::NR>;
using VT = hn::Vec<DT>;

// Tile shape of this target: kMR rows (also the row count of a packed A panel) and at most
// kMaxNV vectors per row; kKPerLine: k-steps per prefetched 64-byte line of the next B panel.
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// 32 zmm registers: 16 accumulators, one B vector; vbroadcastss folds into the FMA.
constexpr int kMR = 16;
constexpr int kMaxNV = 1;
#elif HWY_TARGET == HWY_SCALAR || HWY_TARGET == HWY_EMU128
// 1-lane "vectors" (or 4, EMU128) in the 16 SSE registers of the baseline: 4 x 2 accumulators.
constexpr int kMR = 4;
constexpr int kMaxNV = 2;
#elif HWY_ARCH_X86
// AVX2 (16 ymm): 6 rows x 2 vectors = 12 accumulators, 2 B vectors, one broadcast.
constexpr int kMR = 6;
constexpr int kMaxNV = 2;
#else
// NEON / SVE (32 registers): 6 rows x up to 4 vectors = 24 accumulators.
constexpr int kMR = 6;
constexpr int kMaxNV = 4;
#endif
constexpr int kKPerLine = kMR >= 12 ? 4 : 8;
static_assert(kMR <= 16 && kMaxNV <= 4, "the microkernel names at most 16 x 4 accumulators");
/// Rows per A block (a multiple of kMR).
constexpr int64_t kMC = gd::kMcTarget / kMR * kMR;

/// Rows of A rounded up to whole kMR-row panels: K block pc of a pack_a_for_gemm buffer starts at
/// pc * PaddedM(M), and its panel ir at + ir * kc.
constexpr int64_t PaddedM(int64_t M) { return (M + kMR - 1) / kMR * kMR; }

/// Floats of a pack_a_for_gemm buffer for A [M, K] on this target.
int64_t PackedAFloats(int64_t M, int64_t K) { return PaddedM(M) * K + 16; }

/// Stores one vector `v` of a tile row (n <= Lanes valid columns at p, column index col, row
/// index row of C) with the epilogue of `s`; lanes past n are never touched (C, bias).
HWY_INLINE void StoreVec(DT d, VT v, float* HWY_RESTRICT p, size_t n, const TileStore& s, int64_t row,
                         int64_t col) {
  const GemmEpilogue& ep = *s.ep;
  const bool full = n == hn::Lanes(d);
  if (!s.first || s.beta != 0.0f) {
    const VT old = full ? hn::LoadU(d, p) : LoadTail(d, p, n);
    v = !s.first ? hn::Add(old, v) : hn::MulAdd(hn::Set(d, s.beta), old, v);
  }
  if (s.last) {
    if (ep.bias_kind == GemmBias::PerRow) {
      v = hn::Add(v, hn::Set(d, ep.bias[row]));
    } else if (ep.bias_kind == GemmBias::PerCol) {
      v = hn::Add(v, full ? hn::LoadU(d, ep.bias + col) : LoadTail(d, ep.bias + col, n));
    }
    // NaN in v passes through the clamp (compare-and-select).
    if (ep.clamp) v = MinNaN(hn::Set(d, ep.clamp_max), MaxNaN(hn::Set(d, ep.clamp_min), v));
    if (ep.post.kind != PostOp::Kind::None) v = ApplyPostOp(d, ep.post, v);
  }
  if (full) {
    hn::StoreU(v, d, p);
  } else {
    StoreTail(d, v, p, n);
  }
}

// The accumulators c<row><vector> of a tile: named variables, not an array (SVE vectors are
// sizeless and cannot be array elements); the ones a variant does not use are dead code.
#define KILN_GEMM_ACC_ROW(r) VT c##r##0 = z, c##r##1 = z, c##r##2 = z, c##r##3 = z;
#define KILN_GEMM_FMA_ROW(r)                                                  \
  if constexpr (R > r) {                                                      \
    const VT a = hn::Set(d, ap[r]);                                           \
    c##r##0 = hn::MulAdd(a, b0, c##r##0);                                     \
    if constexpr (V > 1) c##r##1 = hn::MulAdd(a, b1, c##r##1);                \
    if constexpr (V > 2) c##r##2 = hn::MulAdd(a, b2, c##r##2);                \
    if constexpr (V > 3) c##r##3 = hn::MulAdd(a, b3, c##r##3);                \
  }
#define KILN_GEMM_K_STEP                                                                       \
  do {                                                                                         \
    const VT b0 = hn::LoadU(d, bp);                                                            \
    /* unused (V too small): a reload of b0, dead code */                                    \
    const VT b1 = hn::LoadU(d, bp + (V > 1 ? L : 0));                                          \
    const VT b2 = hn::LoadU(d, bp + (V > 2 ? 2 * L : 0));                                      \
    const VT b3 = hn::LoadU(d, bp + (V > 3 ? 3 * L : 0));                                      \
    KILN_GEMM_FMA_ROW(0) KILN_GEMM_FMA_ROW(1) KILN_GEMM_FMA_ROW(2) KILN_GEMM_FMA_ROW(3)        \
    KILN_GEMM_FMA_ROW(4) KILN_GEMM_FMA_ROW(5) KILN_GEMM_FMA_ROW(6) KILN_GEMM_FMA_ROW(7)        \
    KILN_GEMM_FMA_ROW(8) KILN_GEMM_FMA_ROW(9) KILN_GEMM_FMA_ROW(10) KILN_GEMM_FMA_ROW(11)      \
    KILN_GEMM_FMA_ROW(12) KILN_GEMM_FMA_ROW(13) KILN_GEMM_FMA_ROW(14) KILN_GEMM_FMA_ROW(15)    \
    ap += kMR;                                                                                 \
    bp += NR;                                                                                  \
  } while (0)
#define KILN_GEMM_STORE_ROW(r)                                                                        \
  if constexpr (R > r) {                                                                              \
    if (r < mr) {                                                                                     \
      float* row = c + r * ldc;                                                                       \
      StoreVec(d, c##r##0, row, n0, s, s.row0 + r, s.col0);                                           \
      if constexpr (V > 1) if (n1 > 0) StoreVec(d, c##r##1, row + L, n1, s, s.row0 + r, s.col0 + L);  \
      if constexpr (V > 2) if (n2 > 0) StoreVec(d, c##r##2, row + 2 * L, n2, s, s.row0 + r, s.col0 + 2 * L); \
      if constexpr (V > 3) if (n3 > 0) StoreVec(d, c##r##3, row + 3 * L, n3, s, s.row0 + r, s.col0 + 3 * L); \
    }                                                                                                 \
  }

/// Microkernel: C[0 : mr, 0 : nr] (row stride ldc) of the product of the packed A panel `ap` (kc
/// steps of kMR values, of which the first R are read) and the packed B columns at `bp` (kc rows
/// of stride NR, of which V vectors are read), stored with the epilogue of `s`. mr <= R, nr <=
/// V * Lanes, nr > (V - 1) * Lanes. Per k: V loads of B, R broadcasts of A, R * V FMAs; every
/// kKPerLine k, s.prefetch_lines times: a prefetch of the next line of s.prefetch (into L2: T1
/// was ~3% faster than T0 here, this panel and A stay in L1).
template <int R, int V>
HWY_NOINLINE void Tile(int64_t kc, const float* HWY_RESTRICT ap, const float* HWY_RESTRICT bp, float* HWY_RESTRICT c,
                       int64_t ldc, int mr, int nr, const TileStore& s) {
  const DT d;
  const size_t L = hn::Lanes(d);
  // A large C (e.g. 4096 x 1280) is not in cache: prefetch the tile's rows before the K loop.
  for (int i = 0; i < mr; ++i) {
    __builtin_prefetch(c + i * ldc, 1, 3);
    __builtin_prefetch(c + i * ldc + nr - 1, 1, 3);
  }
  const VT z = hn::Zero(d);
  KILN_GEMM_ACC_ROW(0) KILN_GEMM_ACC_ROW(1) KILN_GEMM_ACC_ROW(2) KILN_GEMM_ACC_ROW(3)
  KILN_GEMM_ACC_ROW(4) KILN_GEMM_ACC_ROW(5) KILN_GEMM_ACC_ROW(6) KILN_GEMM_ACC_ROW(7)
  KILN_GEMM_ACC_ROW(8) KILN_GEMM_ACC_ROW(9) KILN_GEMM_ACC_ROW(10) KILN_GEMM_ACC_ROW(11)
  KILN_GEMM_ACC_ROW(12) KILN_GEMM_ACC_ROW(13) KILN_GEMM_ACC_ROW(14) KILN_GEMM_ACC_ROW(15)
  int64_t p = 0;
  const float* pf = s.prefetch;
  for (int64_t line = 0; line < s.prefetch_lines; ++line, p += kKPerLine) {
    __builtin_prefetch(pf + line * NR, 0, 2);
    for (int u = 0; u < kKPerLine; ++u) KILN_GEMM_K_STEP;
  }
  for (; p < kc; ++p) KILN_GEMM_K_STEP;
  const size_t Lz = L;
  const size_t n0 = std::min<size_t>(static_cast<size_t>(nr), Lz);
  const size_t n1 = V > 1 ? std::min<size_t>(static_cast<size_t>(std::max<int64_t>(nr - static_cast<int64_t>(Lz), 0)), Lz) : 0;
  const size_t n2 = V > 2 ? std::min<size_t>(static_cast<size_t>(std::max<int64_t>(nr - 2 * static_cast<int64_t>(Lz), 0)), Lz) : 0;
  const size_t n3 = V > 3 ? std::min<size_t>(static_cast<size_t>(std::max<int64_t>(nr - 3 * static_cast<int64_t>(Lz), 0)), Lz) : 0;
  KILN_GEMM_STORE_ROW(0) KILN_GEMM_STORE_ROW(1) KILN_GEMM_STORE_ROW(2) KILN_GEMM_STORE_ROW(3)
  KILN_GEMM_STORE_ROW(4) KILN_GEMM_STORE_ROW(5) KILN_GEMM_STORE_ROW(6) KILN_GEMM_STORE_ROW(7)
  KILN_GEMM_STORE_ROW(8) KILN_GEMM_STORE_ROW(9) KILN_GEMM_STORE_ROW(10) KILN_GEMM_STORE_ROW(11)
  KILN_GEMM_STORE_ROW(12) KILN_GEMM_STORE_ROW(13) KILN_GEMM_STORE_ROW(14) KILN_GEMM_STORE_ROW(15)
}
#undef KILN_GEMM_ACC_ROW
#undef KILN_GEMM_FMA_ROW
#undef KILN_GEMM_K_STEP
#undef KILN_GEMM_STORE_ROW

using TileFn = void (*)(int64_t, const float*, const float*, float*, int64_t, int, int, const TileStore&);

template <int R>
TileFn TileForV(int v) {
  constexpr int R1 = R < kMR ? R : kMR;
  switch (v) {
    case 1: return &Tile<R1, 1>;
    case 2: return &Tile<R1, (kMaxNV < 2 ? kMaxNV : 2)>;
    case 3: return &Tile<R1, (kMaxNV < 3 ? kMaxNV : 3)>;
    default: return &Tile<R1, kMaxNV>;
  }
}

/// The kernel variant for mr rows (rounded up to 1, 2, 4, 8, 12 or kMR) and v vectors.
TileFn PickTile(int mr, int v) {
  if (mr >= kMR) return TileForV<kMR>(v);
  if (mr <= 1) return TileForV<1>(v);
  if (mr <= 2) return TileForV<2>(v);
  if (mr <= 4) return TileForV<4>(v);
  if (mr <= 8) return TileForV<8>(v);
  if (mr <= 12) return TileForV<12>(v);
  return TileForV<kMR>(v);
}

/// One mr x nr tile (mr <= kMR, nr <= NR) of a 16-column B panel: the panel's columns in groups
/// of kMaxNV vectors (one group on x86 SIMD targets), each group by the variant of its size.
HWY_INLINE void RunTile(int64_t kc, const float* ap, const float* bp, float* c, int64_t ldc, int mr, int nr,
                        const TileStore& s) {
  const DT d;
  const int L = static_cast<int>(hn::Lanes(d));  // divides 16 (a power of two)
  const int width = std::min(kMaxNV, NR / L) * L;
  if (width >= nr) {
    PickTile(mr, (nr + L - 1) / L)(kc, ap, bp, c, ldc, mr, nr, s);
    return;
  }
  TileStore sg = s;
  for (int j = 0; j < nr; j += width) {
    const int n = std::min(width, nr - j);
    sg.col0 = s.col0 + j;
    PickTile(mr, (n + L - 1) / L)(kc, ap, bp + j, c + j, ldc, mr, n, sg);
    sg.prefetch_lines = 0;  // the first group prefetched the slice
  }
}

/// Packs op(A)[i0 : i0+mc, p0 : p0+kc] * alpha into kMR-row panels: panel r holds, for each p,
/// kMR consecutive values (rows past mc are zero). Plain copies (no shuffles, every target):
/// without transpose, kPackKBlock values of each row of A at a time, stored kMR floats apart.
void PackA(const GemmArgs& g, int64_t i0, int64_t mc, int64_t p0, int64_t kc, float* out) {
  const float alpha = g.alpha;
  for (int64_t ir = 0; ir < mc; ir += kMR) {
    const int m = static_cast<int>(std::min<int64_t>(kMR, mc - ir));
    float* dst = out + ir * kc;
    if (!g.trans_a) {
      for (int64_t q = 0; q < kc; q += gd::kPackKBlock) {
        const int64_t kb = std::min(gd::kPackKBlock, kc - q);
        float* dq = dst + q * kMR;
        for (int i = 0; i < m; ++i) {
          const float* src = g.A + (i0 + ir + i) * g.lda + p0 + q;
          if (alpha == 1.0f) {
            for (int64_t p = 0; p < kb; ++p) dq[p * kMR + i] = src[p];
          } else {
            for (int64_t p = 0; p < kb; ++p) dq[p * kMR + i] = alpha * src[p];
          }
        }
      }
      for (int i = m; i < kMR; ++i) {
        for (int64_t p = 0; p < kc; ++p) dst[p * kMR + i] = 0.0f;
      }
    } else {
      for (int64_t p = 0; p < kc; ++p) {
        const float* src = g.A + (p0 + p) * g.lda + i0 + ir;
        float* dd = dst + p * kMR;
        int i = 0;
        for (; i < m; ++i) dd[i] = alpha * src[i];
        for (; i < kMR; ++i) dd[i] = 0.0f;
      }
    }
  }
}

/// Packs all of op(A) [M, K] * alpha in the pack_a_for_gemm layout (K block pc at
/// pc * PaddedM(M), its kMR-row panels kc * kMR floats apart); `out` holds PackedAFloats(M, K)
/// floats. The K blocks are spread over `pool` (may be null).
void PackAWhole(const GemmArgs& g, float* out, ThreadPool* pool) {
  parallel_tasks(pool, (g.K + gd::KC - 1) / gd::KC, [&](int64_t q) {
    const int64_t pc = q * gd::KC, kc = std::min(gd::KC, g.K - pc);
    PackA(g, 0, g.M, pc, kc, out + pc * PaddedM(g.M));
  });
}

/// Per-thread packing buffers, bounded by the block sizes (kMC*KC + KC*NC floats + padding,
/// ~1.2 MiB), 64-byte aligned.
struct PackBuffers {
  std::vector<float> storage;
  float* a = nullptr;
  float* b = nullptr;
  void ensure() {
    if (a != nullptr) return;
    const size_t na = static_cast<size_t>(kMC * gd::KC), nb = static_cast<size_t>(gd::NC / NR * gd::panel_stride(gd::KC));
    storage.resize(na + 16 + nb + 16 + 16);
    auto addr = reinterpret_cast<uintptr_t>(storage.data());
    a = reinterpret_cast<float*>((addr + 63) & ~uintptr_t{63});
    b = a + na + 16;  // 16 floats of slack after each block; 64-byte aligned
  }
};

PackBuffers& GetPackBuffers() {
  thread_local PackBuffers buf;
  buf.ensure();
  return buf;
}

/// C[m0:m1, n0:n1] on the calling thread.
void GemmRect(const GemmArgs& g, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  PackBuffers& buf = GetPackBuffers();
  for (int64_t jc = n0; jc < n1; jc += gd::NC) {
    const int64_t nc = std::min(gd::NC, n1 - jc);
    for (int64_t pc = 0; pc < g.K; pc += gd::KC) {
      const int64_t kc = std::min(gd::KC, g.K - pc);
      const float* b_block = buf.b;
      if (g.packed_b != nullptr) {  // jc is a whole number of panels (GemmBlocked splits N in panels)
        b_block = g.packed_b + pc / gd::KC * ((g.N + NR - 1) / NR) * gd::panel_stride(gd::KC) + jc / NR * gd::panel_stride(kc);
      } else if (g.packer != nullptr) {
        g.packer->fn(g.packer->ctx, jc, nc, pc, kc, buf.b);
      } else {
        gd::pack_b(g, jc, nc, pc, kc, buf.b);
      }
      TileStore s{g.beta, pc == 0, pc + kc >= g.K, 0, 0, g.ep};
      // The panel after this block's last one, for prefetching prepacked B: the next K block's
      // panel at jc (of next_kc rows).
      const float* after_block = nullptr;
      const int64_t next_kc = std::min(gd::KC, g.K - pc - gd::KC);
      if (g.packed_b != nullptr && pc + gd::KC < g.K) {
        after_block = g.packed_b + (pc / gd::KC + 1) * ((g.N + NR - 1) / NR) * gd::panel_stride(gd::KC) +
                      jc / NR * gd::panel_stride(next_kc);
      }
      for (int64_t ic = m0; ic < m1; ic += kMC) {
        const int64_t mc = std::min(kMC, m1 - ic);
        const float* a_block = buf.a;
        if (g.packed_a != nullptr) {
          a_block = g.packed_a + pc * PaddedM(g.M) + ic * kc;
        } else {
          PackA(g, ic, mc, pc, kc, buf.a);
        }
        for (int64_t jr = 0; jr < nc; jr += NR) {
          const int nr = static_cast<int>(std::min<int64_t>(NR, nc - jr));
          const float* bp = b_block + jr / NR * gd::panel_stride(kc);
          const bool in_block = jr + NR < nc;
          const float* next = g.packed_b == nullptr ? nullptr : in_block ? bp + gd::panel_stride(kc) : after_block;
          for (int64_t ir = 0; ir < mc; ir += kMR) {
            const int mr = static_cast<int>(std::min<int64_t>(kMR, mc - ir));
            s.row0 = ic + ir;
            s.col0 = jc + jr;
            gd::set_prefetch(s, next, in_block ? kc : next_kc, kc, ir / kMR, kKPerLine);
            RunTile(kc, a_block + ir * kc, bp, g.C + (ic + ir) * g.ldc + jc + jr, g.ldc, mr, nr, s);
          }
        }
      }
    }
  }
}

/// Epilogue on one value of C given the product value `acc` (K == 0 and the matrix-vector path).
HWY_INLINE float Finish(const GemmArgs& g, float acc, float cold, int64_t i, int64_t j) {
  float v = acc;
  if (g.beta != 0.0f) v += g.beta * cold;
  const GemmEpilogue& ep = *g.ep;
  if (ep.bias_kind == GemmBias::PerRow) v += ep.bias[i];
  if (ep.bias_kind == GemmBias::PerCol) v += ep.bias[j];
  if (ep.clamp) {
    v = v < ep.clamp_min ? ep.clamp_min : v;  // NaN compares false: passes through
    v = v > ep.clamp_max ? ep.clamp_max : v;
  }
  if (ep.post.kind != PostOp::Kind::None) v = ApplyPostOp1(ep.post, v);
  return v;
}

/// A matrix-vector product (M == 1 or N == 1; memory-bound, no packing). The result vector r
/// (r[t] for t in [0, len)) is C's row 0 (M == 1) or column 0 (N == 1):
///   rows:   r[t] = sum_p mat[t * ld + p] * v[p]   (dot with a contiguous row of mat)
///   !rows:  r[t] = sum_p v[p] * mat[p * ld + t]   (columns of mat, accumulated over its rows)
struct Gemv {
  const float* mat;
  int64_t ld;
  bool rows;
  const float* v;  // [K], contiguous
  bool m_is_one;   // r is row 0 of C (else column 0)
};

HWY_INLINE void GemvStore(const GemmArgs& g, const Gemv& j, int64_t t, float acc) {
  float* c = j.m_is_one ? g.C + t : g.C + t * g.ldc;
  *c = Finish(g, g.alpha * acc, g.beta != 0.0f ? *c : 0.0f, j.m_is_one ? 0 : t, j.m_is_one ? t : 0);
}

/// r[t] for t in [t0, t1): dots of contiguous rows (two vectors per step, then a partial one), or
/// column sums accumulated row by row of mat.
void GemvRange(const GemmArgs& g, const Gemv& j, int64_t t0, int64_t t1) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t K = g.K;
  const float* HWY_RESTRICT v = j.v;
  if (j.rows) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* HWY_RESTRICT b = j.mat + t * j.ld;
      VF s0 = hn::Zero(d), s1 = hn::Zero(d);
      int64_t p = 0;
      for (; p + 2 * N <= K; p += 2 * N) {
        s0 = hn::MulAdd(hn::LoadU(d, v + p), hn::LoadU(d, b + p), s0);
        s1 = hn::MulAdd(hn::LoadU(d, v + p + N), hn::LoadU(d, b + p + N), s1);
      }
      for (; p + N <= K; p += N) s0 = hn::MulAdd(hn::LoadU(d, v + p), hn::LoadU(d, b + p), s0);
      if (p < K) {
        const size_t r = static_cast<size_t>(K - p);
        s1 = hn::MulAdd(LoadTail(d, v + p, r), LoadTail(d, b + p, r), s1);
      }
      GemvStore(g, j, t, ReduceSum(d, hn::Add(s0, s1)));
    }
    return;
  }
  // Columns: rows of mat streamed sequentially (kGemvChunk columns at a time), each added into
  // the chunk's sums r with one multiply-add per element; the same sums in the same order as
  // column-by-column dot products.
  constexpr int64_t kGemvChunk = 1024;
  HWY_ALIGN float r[kGemvChunk];
  for (int64_t t = t0; t < t1; t += kGemvChunk) {
    const int64_t len = std::min(kGemvChunk, t1 - t);
    const int64_t full = len / N * N;
    std::memset(r, 0, sizeof(float) * static_cast<size_t>(len));
    for (int64_t p = 0; p < K; ++p) {
      const VF av = hn::Set(d, v[p]);
      const float* HWY_RESTRICT b = j.mat + p * j.ld + t;
      int64_t q = 0;
      for (; q + 4 * N <= full; q += 4 * N) {
        hn::Store(hn::MulAdd(av, hn::LoadU(d, b + q), hn::Load(d, r + q)), d, r + q);
        hn::Store(hn::MulAdd(av, hn::LoadU(d, b + q + N), hn::Load(d, r + q + N)), d, r + q + N);
        hn::Store(hn::MulAdd(av, hn::LoadU(d, b + q + 2 * N), hn::Load(d, r + q + 2 * N)), d, r + q + 2 * N);
        hn::Store(hn::MulAdd(av, hn::LoadU(d, b + q + 3 * N), hn::Load(d, r + q + 3 * N)), d, r + q + 3 * N);
      }
      for (; q < full; q += N) hn::Store(hn::MulAdd(av, hn::LoadU(d, b + q), hn::Load(d, r + q)), d, r + q);
      if (q < len) {
        const size_t n = static_cast<size_t>(len - q);
        StoreTail(d, hn::MulAdd(av, LoadTail(d, b + q, n), LoadTail(d, r + q, n)), r + q, n);
      }
    }
    for (int64_t q = 0; q < len; ++q) GemvStore(g, j, t + q, r[q]);
  }
}

/// M == 1 or N == 1: C's row (column) as a matrix-vector product; parallel over its length.
void Gemv1(const GemmArgs& g, bool parallel, ThreadPool* pool) {
  const bool m_is_one = g.M == 1;
  std::vector<float> gathered;
  auto contiguous = [&](const float* base, int64_t stride) {
    if (stride == 1 || g.K == 1) return base;
    gathered.resize(static_cast<size_t>(g.K));
    for (int64_t p = 0; p < g.K; ++p) gathered[static_cast<size_t>(p)] = base[p * stride];
    return static_cast<const float*>(gathered.data());
  };
  Gemv j;
  j.m_is_one = m_is_one;
  int64_t len;
  if (m_is_one) {  // v = op(A) row 0; r[t] = op(B) column t . v
    j.v = g.trans_a ? contiguous(g.A, g.lda) : g.A;
    j.mat = g.B;
    j.ld = g.ldb;
    j.rows = g.trans_b;
    len = g.N;
  } else {  // v = op(B) column 0; r[t] = op(A) row t . v
    j.v = g.trans_b ? g.B : contiguous(g.B, g.ldb);
    j.mat = g.A;
    j.ld = g.lda;
    j.rows = !g.trans_a;
    len = g.M;
  }
  if (!parallel) {
    GemvRange(g, j, 0, len);
    return;
  }
  const int64_t threads = pool->num_threads();
  int64_t parts = std::min<int64_t>(4 * threads, (len + 63) / 64);
  if (parts > threads) parts = parts / threads * threads;  // a whole number of parts per thread
  const int64_t per = (len + parts - 1) / parts;
  parallel_tasks(pool, parts, [&](int64_t t) { GemvRange(g, j, std::min(len, t * per), std::min(len, (t + 1) * per)); });
}

/// The blocked product over all of C, split over the pool (shared by sgemm and sgemm_packed_b).
void GemmBlocked(const GemmArgs& g, bool parallel, ThreadPool* pool) {
  const int64_t M = g.M, N = g.N;
  if (!parallel) {
    GemmRect(g, 0, M, 0, N);
    return;
  }
  // Rectangles along the larger dimension, in whole micro-tiles, claimed dynamically, up to 4 per
  // thread. The operand every part would otherwise pack in full (A when split along N, B when
  // split along M) is packed once here, with all threads, when it is not already packed and
  // fits the shared buffer (for a 77-row text-encoder layer on 2 threads: 8 packs of A per call
  // down to 1; for a 3x3 convolution on a 14x14 plane: the im2col gather once instead of per
  // thread). When it does not fit, a split along M keeps one part per thread.
  const bool split_n = N >= M;
  GemmArgs gs = g;
  bool shared = false;
  if (split_n) {
    shared = g.packed_a == nullptr && PackedAFloats(M, g.K) <= gd::kSharedPackAMaxFloats;
    if (shared) {
      thread_local std::vector<float> buf_a;
      buf_a.resize(static_cast<size_t>(PackedAFloats(M, g.K)));
      PackAWhole(g, buf_a.data(), pool);
      gs.packed_a = buf_a.data();
    }
  } else {
    shared = g.packed_b == nullptr && prepacked_b_floats(N, g.K) <= gd::kSharedPackBMaxFloats;
    if (shared) {
      thread_local std::vector<float> buf_b;
      buf_b.resize(static_cast<size_t>(prepacked_b_floats(N, g.K)));
      gd::pack_b_whole(g, buf_b.data(), pool);
      gs.packed_b = buf_b.data();
    }
  }
  const bool cheap_parts = split_n || shared || g.packed_b != nullptr;
  const int64_t unit = split_n ? NR : kMR;
  const int64_t dim = split_n ? N : M;
  const int64_t units = (dim + unit - 1) / unit;
  const int64_t threads = pool->num_threads();
  // A whole number of parts per thread: 3 parts of 13 panels on 2 threads would leave one thread
  // 2 parts (10 panels) and the other 1.
  const int64_t want = cheap_parts ? std::clamp<int64_t>(units / 4, threads, 4 * threads) / threads * threads : threads;
  const int64_t parts = std::min(want, units);
  if (parts <= 1) {
    GemmRect(gs, 0, M, 0, N);
    return;
  }
  const int64_t per = (units + parts - 1) / parts;  // units per part
  parallel_tasks(pool, parts, [&](int64_t t) {
    const int64_t lo = std::min(dim, t * per * unit);
    const int64_t hi = std::min(dim, (t + 1) * per * unit);
    if (lo >= hi) return;
    if (split_n) {
      GemmRect(gs, 0, M, lo, hi);
    } else {
      GemmRect(gs, lo, hi, 0, N);
    }
  });
}

/// sgemm / sgemm_packed_b on `g` (M, N >= 1): K == 0, matrix-vector (not with a B packer) or
/// blocked product.
void Gemm(const GemmArgs& g, ThreadPool* pool) {
  if (g.K <= 0) {  // C = beta * C + bias, clamped
    for (int64_t i = 0; i < g.M; ++i) {
      for (int64_t jj = 0; jj < g.N; ++jj) {
        float* c = g.C + i * g.ldc + jj;
        *c = Finish(g, 0.0f, g.beta != 0.0f ? *c : 0.0f, i, jj);
      }
    }
    return;
  }
  const bool parallel = gd::use_pool(pool, g.M, g.N, g.K);
  if (g.packer == nullptr && (g.M == 1 || g.N == 1)) {
    Gemv1(g, parallel, pool);
    return;
  }
  GemmBlocked(g, parallel, pool);
}

void PackAForGemm(int64_t M, int64_t K, const float* A, int64_t lda, float* out) {
  const GemmArgs g{false, false, M, 0, K, 1.0f, A, lda, nullptr, 0, 0.0f, nullptr, 0, nullptr};
  PackAWhole(g, out, nullptr);
}

void SgemmPrepacked(int64_t M, int64_t N, int64_t K, const float* packed_a, const float* packed_b, float* C,
                    int64_t ldc, const GemmEpilogue& ep) {
  const int64_t npanels = (N + NR - 1) / NR;
  for (int64_t pc = 0; pc < K; pc += gd::KC) {
    const int64_t kc = std::min(gd::KC, K - pc);
    const float* b_block = packed_b + pc / gd::KC * npanels * gd::panel_stride(gd::KC);
    const float* a_block = packed_a + pc * PaddedM(M);
    TileStore s{0.0f, pc == 0, pc + kc >= K, 0, 0, &ep};
    for (int64_t jr = 0; jr < N; jr += NR) {
      const int nr = static_cast<int>(std::min<int64_t>(NR, N - jr));
      const float* bp = b_block + jr / NR * gd::panel_stride(kc);
      for (int64_t ir = 0; ir < M; ir += kMR) {
        const int mr = static_cast<int>(std::min<int64_t>(kMR, M - ir));
        s.row0 = ir;
        s.col0 = jr;
        RunTile(kc, a_block + ir * kc, bp, C + ir * ldc + jr, ldc, mr, nr, s);
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

HWY_EXPORT(PackedAFloats);
HWY_EXPORT(Gemm);
HWY_EXPORT(PackAForGemm);
HWY_EXPORT(SgemmPrepacked);

using gemm_detail::GemmArgs;

int64_t packed_a_floats(int64_t M, int64_t K) {
  select_target();
  return KILN_CPU_DISPATCH(PackedAFloats)(M, K);
}

void pack_a_for_gemm(int64_t M, int64_t K, const float* A, int64_t lda, float* out) {
  select_target();
  KILN_CPU_DISPATCH(PackAForGemm)(M, K, A, lda, out);
}

void pack_b_for_gemm(bool trans_b, int64_t K, int64_t N, const float* B, int64_t ldb, float* out) {
  const GemmArgs g{false, trans_b, 0, N, K, 1.0f, nullptr, 0, B, ldb, 0.0f, nullptr, 0, nullptr};
  gemm_detail::pack_b_whole(g, out, nullptr);
}

void sgemm_prepacked(int64_t M, int64_t N, int64_t K, const float* packed_a, const float* packed_b, float* C,
                     int64_t ldc, const GemmEpilogue& ep) {
  if (M <= 0 || N <= 0 || K <= 0) return;
  select_target();
  KILN_CPU_DISPATCH(SgemmPrepacked)(M, N, K, packed_a, packed_b, C, ldc, ep);
}

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc, const GemmEpilogue& ep, ThreadPool* pool,
           const float* packed_a, const float* packed_b) {
  if (M <= 0 || N <= 0) return;
  GemmArgs g{trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, &ep};
  g.packed_a = packed_a;
  g.packed_b = packed_b;
  select_target();
  KILN_CPU_DISPATCH(Gemm)(g, pool);
}

void sgemm_packed_b(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const GemmBPacker& b,
                    float beta, float* C, int64_t ldc, const GemmEpilogue& ep, ThreadPool* pool,
                    const float* packed_a) {
  if (M <= 0 || N <= 0) return;
  GemmArgs g{false, false, M, N, K, alpha, A, lda, nullptr, 0, beta, C, ldc, &ep};
  g.packer = &b;
  g.packed_a = packed_a;
  select_target();
  KILN_CPU_DISPATCH(Gemm)(g, pool);
}

}  // namespace kiln::cpu
#endif  // HWY_ONCE
