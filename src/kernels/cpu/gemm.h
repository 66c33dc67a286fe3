// fp32 GEMM for the optimized cpu kernels (conv, linear, attention, ...).
//
// Stable interface for other cpu kernel files: include "kernels/cpu/gemm.h" and call
// cpu::sgemm(). Row-major, BLAS-like argument order.
#pragma once

#include <cstdint>
#include <limits>

#include "kernels/cpu/post_op.h"
#include "kiln/thread_pool.h"

namespace kiln::cpu {

/// Which bias the epilogue adds after alpha * op(A) op(B) + beta * C.
enum class GemmBias {
  None,
  PerRow,  ///< bias[i], i in [0, M)   (e.g. conv: one bias per output channel = row of C)
  PerCol,  ///< bias[j], j in [0, N)   (e.g. linear: one bias per output feature = column of C)
};

/// Post-processing fused into the store of C: C = post(clamp(alpha*op(A)op(B) + beta*C + bias)).
/// The clamp (relu: [0, inf), hardtanh: [lo, hi]) is applied only when `clamp` is true; NaN
/// passes through the clamp unchanged (as torch.clamp / relu). `post` (an activation, see
/// post_op.h) is applied last, with the cpu activation kernels' exact float operations.
struct GemmEpilogue {
  GemmBias bias_kind = GemmBias::None;
  const float* bias = nullptr;  ///< [M] for PerRow, [N] for PerCol; unused for None
  bool clamp = false;
  float clamp_min = -std::numeric_limits<float>::infinity();
  float clamp_max = std::numeric_limits<float>::infinity();
  PostOp post;
};


/// C[M, N] = alpha * op(A)[M, K] * op(B)[K, N] + beta * C, then the epilogue's bias and clamp.
///
/// All matrices are fp32, row-major, with leading dimensions (row strides, in elements):
///   op(A)[i, p] = trans_a ? A[p * lda + i] : A[i * lda + p]   (A is K x M when trans_a)
///   op(B)[p, j] = trans_b ? B[j * ldb + p] : B[p * ldb + j]   (B is N x K when trans_b)
///   C[i, j] at C[i * ldc + j].
/// beta == 0 means C is not read (NaN/inf in C do not propagate), as in BLAS. K == 0 gives
/// C = beta * C + bias. C must not overlap A or B. M, N, K >= 0.
/// Accumulation is fp32 (fused multiply-add), blocked over K in chunks of 256.
///
/// `pool` (may be null: single-threaded) splits C into rectangles along the larger of M and N
/// that the threads claim dynamically (cpu::parallel_tasks); small products (< 4 MFLOP) run on
/// the calling thread. Thread-safe: packing buffers are per thread and bounded (~1.2 MB per thread).
/// Method: cache blocking, packing of A (MR-row panels) and B (16-column panels) and a
/// register-blocked microkernel (Goto & van de Geijn, "Anatomy of high-performance matrix
/// multiplication", ACM TOMS 2008), written once over Highway for every SIMD target; MR and the
/// tile depend on the target (AVX2: 6 x 16, AVX-512: 16 x 16; gemm.cpp), so results may differ
/// between targets in the last bits (the order of the sums does not depend on MR; FMA vs separate
/// rounding on the scalar target does).
/// M == 1 or N == 1 (classifier heads, squeeze-excite) take a matrix-vector path without packing.
///
/// `packed_a` (optional): A already packed by pack_a_for_gemm(M, K, A, lda, ...), with
/// trans_a false and alpha 1 (the caller guarantees both; nothing here can check them);
/// the product then skips packing A on every call (A itself is still read when M == 1 or N == 1).
/// `packed_b` (optional): op(B) already packed by pack_b_for_gemm(trans_b, K, N, B, ldb, ...)
/// (e.g. a linear layer's constant weights, packed when the method is loaded); B itself is then
/// read only when M == 1 or N == 1.
void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc, const GemmEpilogue& ep = {},
           ThreadPool* pool = nullptr, const float* packed_a = nullptr, const float* packed_b = nullptr);

/// Floats of A [M, K] packed by pack_a_for_gemm (the MR-row panels of every K block, plus slack).
/// Depends on the process's SIMD target (MR): a packed A is valid only in the process that packed it.
int64_t packed_a_floats(int64_t M, int64_t K);

/// Packs row-major A [M, K] (row stride lda) once for repeated products with the same A (e.g. a
/// convolution's constant weights, packed when the method is loaded): `out` holds
/// packed_a_floats(M, K) floats. Same values as the per-call packing (alpha 1). The layout is the
/// target's (opaque: only sgemm / sgemm_packed_b / sgemm_prepacked read it).
void pack_a_for_gemm(int64_t M, int64_t K, const float* A, int64_t lda, float* out);

/// Width of the column panels that a GemmBPacker writes (16 on every SIMD target), and the most
/// columns one call asks for.
inline constexpr int kGemmPanelCols = 16;
inline constexpr int64_t kGemmMaxPackCols = 1024;

/// Floats between consecutive packed B panels for a K block of kc rows (kc * 16 plus one cache line).
constexpr int64_t gemm_panel_stride(int64_t kc) { return kc * kGemmPanelCols + kGemmPanelCols; }

/// Produces B on the fly (implicit GEMM, e.g. convolution without an im2col buffer).
/// fn(ctx, j0, nc, p0, kc, out) writes op(B)[p0 : p0+kc, j0 : j0+nc] as ceil(nc / 16) panels of
/// 16 columns: out[jp * gemm_panel_stride(kc) + p * 16 + t] = op(B)[p0 + p, j0 + jp*16 + t], zero
/// for columns past nc. nc <= kGemmMaxPackCols, kc <= 256. Called concurrently from pool threads
/// (must be reentrant).
struct GemmBPacker {
  void (*fn)(const void* ctx, int64_t j0, int64_t nc, int64_t p0, int64_t kc, float* out);
  const void* ctx;
};

/// Rows of op(B) per K block of the blocked product (and of packed A and prepacked B).
inline constexpr int64_t kGemmKBlock = 256;

/// Floats of a B [K, N] prepacked for sgemm_prepacked: for each K block q (rows 256 q ..
/// 256 q + kc - 1, kc = min(256, K - 256 q)), at q * ceil(N / 16) * gemm_panel_stride(256), the
/// block's ceil(N / 16) panels of 16 columns as GemmBPacker writes them:
///   B[256 q + p, 16 jp + t] at q * ceil(N/16) * gemm_panel_stride(256) + jp * gemm_panel_stride(kc) + p * 16 + t.
/// (The last, possibly shorter, K block takes only its own kc rows.)
constexpr int64_t prepacked_b_floats(int64_t N, int64_t K) {
  if (K <= 0) return 0;
  const int64_t full = (K - 1) / kGemmKBlock, panels = (N + kGemmPanelCols - 1) / kGemmPanelCols;
  return full * panels * gemm_panel_stride(kGemmKBlock) + panels * gemm_panel_stride(K - full * kGemmKBlock);
}

/// Packs op(B) [K, N] (op(B)[p, j] = trans_b ? B[j * ldb + p] : B[p * ldb + j]) once into the
/// prepacked_b_floats(N, K) layout, for repeated products with the same B (sgemm's packed_b,
/// sgemm_prepacked). Columns of the last panel past N are zero.
void pack_b_for_gemm(bool trans_b, int64_t K, int64_t N, const float* B, int64_t ldb, float* out);

/// C[M, N] = A[M, K] * B[K, N] (+ the epilogue; C is not read), on the calling thread, with both
/// operands already packed: A by pack_a_for_gemm(M, K, ...), B in the prepacked_b_floats layout
/// (columns of the last panel past N are never stored, whatever they hold). For many small
/// products whose operands another kernel writes directly in packed form (e.g. the Winograd
/// convolution's batched GEMMs, src/kernels/cpu/winograd.cpp). M, N, K >= 1.
void sgemm_prepacked(int64_t M, int64_t N, int64_t K, const float* packed_a, const float* packed_b, float* C,
                     int64_t ldc, const GemmEpilogue& ep = {});

/// As sgemm (no transpose of A) with op(B) [K, N] supplied by `b`. Never takes the
/// matrix-vector path, so any M, N >= 0 work.
/// `packed_a` as for sgemm (alpha must then be 1).
void sgemm_packed_b(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const GemmBPacker& b,
                    float beta, float* C, int64_t ldc, const GemmEpilogue& ep = {}, ThreadPool* pool = nullptr,
                    const float* packed_a = nullptr);

}  // namespace kiln::cpu
