// The GEMM micro-kernel contract, written once.
//
//   ukernel(k, a, b, c, rs_c, cs_c, alpha, beta, m, n, bias, bias_rows)
//
//   a : packed A micro-panel, MR x k, stored k-major:  a[p*MR + i] = A(i, p)    (64-byte aligned)
//   b : packed B micro-panel, k x NR, stored k-major:  b[p*NR + j] = B(p, j)    (64-byte aligned)
//   c : the C tile; element (i, j) lives at c[i*rs_c + j*cs_c]
//
//   bias: null, or n per-column values (bias[j]), or with bias_rows m per-row values (bias[i]); any
//         alignment
//
//   For 0 <= i < m <= MR and 0 <= j < n <= NR:
//       C(i,j) := beta * C(i,j) + alpha * sum_p A(i,p) B(p,j)  [+ bias[j], or bias[i] with bias_rows]
//
//   - Rows i >= m and columns j >= n of C are never read or written (edge tiles); the packed panels
//     are zero-padded there by the packing routines, so the kernel always computes a full MR x NR tile.
//   - When beta == 0, C is never read: it may hold NaN or Inf, and the result is alpha * A*B exactly.
//   - k == 0 is allowed: C := beta * C (or 0 when beta == 0), plus the bias.
//   - The bias is added in the tile's store, while it is in registers: a GEMM with a bias (the input
//     projections of an RNN, a linear layer; per row, a convolution's output channels) passes it on its
//     last k block instead of a second pass over C, which costs a sizable share of a product of small depth.
//   - NaN and Inf in A and B propagate through the products as IEEE arithmetic says.
#pragma once
#include "../common.h"
#include "../cpu_info.h"

namespace dnnkit {

template <typename T>
using ukernel_fn = void (*)(index_t k, const T* a, const T* b, T* c, index_t rs_c, index_t cs_c, T alpha,
                            T beta, int m, int n, const T* bias, bool bias_rows);

// ukernel_fn with A read where it lies (UKernel::fn_a): row i of A at a + i*lda, contiguous along k.
template <typename T>
using ukernel_a_fn = void (*)(index_t k, const T* a, index_t lda, const T* b, T* c, index_t rs_c, index_t cs_c, T alpha,
                              T beta, int m, int n, const T* bias, bool bias_rows);

// ukernel_fn with B read where it lies (UKernel::fn_b): row p of B at b + p*ldb, NR values of it read
// whatever n (the caller passes full panels only).
// While it runs, the kernel fetches into L2 one row of NR values every pf_every steps from pf on (rows
// pf, pf + ldb, ...): the caller's next panel of B. pf null: none.
template <typename T>
using ukernel_b_fn = void (*)(index_t k, const T* a, const T* b, index_t ldb, const T* pf, int pf_every, T* c,
                              index_t rs_c, index_t cs_c, T alpha, T beta, int m, int n, const T* bias,
                              bool bias_rows);

// One row of A (a[p], contiguous) against np <= UKernel::row_np packed k x NR panels of B, b_stride
// elements apart: for j < n (n <= np*NR; panel q holds columns [q*NR, q*NR + NR)),
//     c[j] := beta * c[j] + sum_p a[p] B(p, j)  [+ bias[j]]
// summed in the order of ukernel_fn on a one-row panel (one FMA a step of depth per element), so that
// either gives the same result bit for bit (alpha 1, beta 0 or 1). The one-row tile keeps one vector
// chain per NR/width columns and waits on the FMA's latency; np panels at once keep np times as many.
template <typename T>
using row_panels_fn = void (*)(index_t k, const T* a, const T* b, index_t b_stride, T* c, T beta, int n,
                               const T* bias);

template <typename T>
struct UKernel {
  const char* name;  // geometry and ISA: "ukernel_12x32_avx512"
  int mr;
  int nr;
  ukernel_fn<T> fn;
  // rows[m-1] (1 <= m <= mr): the same contract on an A micro-panel packed with stride m instead of MR
  // (a[p*m + i]), computing only m rows: the tail of a short A (an RNN step's few batch rows) costs no
  // wasted FMAs. Every ISA provides them.
  const ukernel_fn<T>* rows = nullptr;
  // fn prefetching B further ahead, for a B that streams from memory rather than L2 (a packed weight
  // larger than the caches, read once per call); null: fn.
  ukernel_fn<T> far = nullptr;
  // fn prefetching A ahead too, for the first tile of a row of tiles, whose A micro-panel comes from L3
  // (the blocked GEMM's packed A block outgrows L2); null: fn.
  ukernel_fn<T> far_a = nullptr;
  // The same contract on A read where it lies (ukernel_a_fn), for any 1 <= m <= MR: rows i >= m of it are
  // never read. The blocked GEMM skips packing an A with contiguous rows for few columns
  // (gemm.cpp, a_in_place); null: the ISA has none.
  ukernel_a_fn<T> fn_a = nullptr;
  // One row of A against up to row_np packed B panels at once (row_panels_fn); null: the ISA has none.
  row_panels_fn<T> row_panels = nullptr;
  int row_np = 0;
  // The same contract on B read where it lies (ukernel_b_fn), for full panels: fn_b[m-1] (1 <= m <= mr) on
  // an A micro-panel of stride m, as rows[m-1]. The blocked GEMM skips packing a B with contiguous rows
  // for few rows of A (gemm.cpp, b_in_place); null: the ISA has none.
  const ukernel_b_fn<T>* fn_b = nullptr;
  // The same contract as fn_b, NR/2 columns wide: half[m-1] on an A micro-panel of stride m and a packed B
  // panel (ldb = NR) whose last n <= NR/2 columns are all there is (a product's last panel), which the
  // full-width kernels would compute at the cost of a whole panel; null: the ISA has none.
  const ukernel_b_fn<T>* half = nullptr;
};

// Small-M dot kernel (gemm_small_m.cpp): out[i*ldo + j] = sum_p x[i*ldx + p] * w[j*ldw + p] for
// i < mi <= MI_MAX, j < nj (any count: the kernel walks the rows of w NJ at a time, in one call); x and
// w rows contiguous along k; out is written, never read.
template <typename T>
using dot_fn = void (*)(int mi, index_t k, const T* x, index_t ldx, const T* w, index_t ldw, T* out, int ldo,
                        int nj);

template <typename T>
struct DotKernel {
  const char* name;  // "dot_4x4_avx512"
  int mi_max;
  int nj;
  dot_fn<T> fn;
};

// Strided-A micro-kernel (gemm_wt_direct, gemm_small_m.cpp): the contract of ukernel above, except that A is
// read where it lies, row i at a + i*lda (a[i*lda + p] = A(i, p), contiguous along k, any alignment), and
// rows i >= m of it are never read (the kernel re-reads row 0 in their place); and bias, when not null,
// adds bias[i] to row i of the result (after beta). A weight matrix used as A this way needs no packing:
// what C^T = W X^T costs a small batch is then the FMAs and one pass over W. C^T's rows are C's columns,
// so the kernel transposes its tile in registers when rs_c == 1 and stores each column's m values as one
// short vector. A second depth segment (k2 > 0) continues the sum over rows of another matrix a2 (row
// stride lda2) against the next k2 rows of the same B panel: A = [a | a2], two weights side by side
// (an RNN cell's W_ih and W_hh) without copying either.
template <typename T>
using ukernel_sa_fn = void (*)(index_t k, const T* a, index_t lda, index_t k2, const T* a2, index_t lda2,
                               const T* b, T* c, index_t rs_c, index_t cs_c, T alpha, T beta, int m, int n,
                               const T* bias);

template <typename T>
struct SaKernel {
  const char* name;  // "ukernel_sa_8x32_avx512"
  int mr;
  int nr;               // rows of the batch a tile covers; a larger batch runs as panels of nr rows
  ukernel_sa_fn<T> fn;  // null: the ISA has none (the caller packs instead)
  int max_rows;         // the largest batch the kernel is used for (sa_batch_fits)
  int panel_fill;       // the percentage of its panels a batch of several must fill (sa_batch_fits)
  int min_depth;        // the depth from which it is used (sa_batch_fits' callers)
};

// One entry per ISA; each is defined in its own file (ukernel_<isa>.cpp), compiled where the build has
// that ISA (DNNKIT_HAVE_<ISA>), and called only where active_isa() is that ISA.
template <typename T> UKernel<T> ukernel_ref();
template <typename T> UKernel<T> ukernel_avx2();
template <typename T> UKernel<T> ukernel_avx512();
template <typename T> DotKernel<T> dot_kernel_ref();
template <typename T> DotKernel<T> dot_kernel_avx2();
template <typename T> DotKernel<T> dot_kernel_avx512();

template <typename T> SaKernel<T> sa_kernel_avx2(index_t m);
template <typename T> SaKernel<T> sa_kernel_avx512(index_t m);

// The strided-A kernel for a product of m rows of A (the batch; m <= 0: the one for large batches): the
// narrowest tile at least m wide where the ISA has several (AVX-512: 16, 32 or 48 float32 rows, and
// larger batches in panels of 32), so that a small batch does not pay for a wide tile's unused columns.
// Every width sums each element in the same order (one FMA per step of depth, in the same depth
// blocks): the choice never changes a result.
template <typename T>
SaKernel<T> select_sa_kernel(Isa isa, index_t m = 0) {
  switch (isa) {
#if DNNKIT_HAVE_AVX512
    case Isa::avx512: return sa_kernel_avx512<T>(m);
#endif
#if DNNKIT_HAVE_AVX2
    case Isa::avx2: return sa_kernel_avx2<T>(m);
#endif
    default: return {"none", 0, 0, nullptr, 0, 0, 0};
  }
}

// SaKernel::min_depth, the depth from which the strided-A kernel beats the packing GEMM (and, at 13-16
// rows, the dot kernels) where its tiles are full enough (sa_batch_fits): 192 for AVX-512's float32 tile,
// 320 for AVX2's 4 x 24 (bench/log/kernel-choices.md).

// The depth blocks gemm_wt_direct cuts a product into (their partial sums added into C): the deepest,
// in multiples of 256 and at least 1024, whose packed batch panels for the largest batch the kernel takes
// (max_rows x depth) fill at most half of this core's L2 (2 MB, float32 on AVX-512: 2048; 1 MB: 1024). It
// does not depend on the batch, so every batch sums each element in the same blocks. (2048 against 1024
// on a 2 MB L2, 16-64 rows at depth 1536-4096: 0.97-1.00 of the time.)
template <typename T>
index_t sa_depth_block(const SaKernel<T>& sk) {
  if (!sk.fn) return 0;  // no kernel
  const index_t panel_bytes = std::max<index_t>(sk.max_rows, 1) * static_cast<index_t>(sizeof(T));
  return std::max<index_t>(1024, static_cast<index_t>(l2_cache_bytes()) / 2 / panel_bytes / 256 * 256);
}

// Whether a batch of m rows is better served by the strided-A kernel (W read in place) than by the
// packing GEMM, by how much of its tiles the batch fills: one tile at least 60% full; panels of several
// tiles at least panel_fill percent full, up to max_rows (AVX-512 float32 75%, AVX2 80%). The depth is
// the caller's rule (min_depth). bench/log/2026-11-22-to-24.md has the measurements; the tuner times
// gemm_wt_direct wherever it can run, so a shape the rule gets wrong is corrected by tuning.
template <typename T>
bool sa_batch_fits(const SaKernel<T>& sk, index_t m) {
  if (!sk.fn || m <= 0 || m > sk.max_rows) return false;
  const index_t tiles = ceil_div(m, static_cast<index_t>(sk.nr));
  return tiles == 1 ? 5 * m >= 3 * sk.nr : 100 * m >= sk.panel_fill * tiles * sk.nr;
}

// The micro-kernel for an ISA (the active one by default).
template <typename T>
UKernel<T> select_ukernel(Isa isa) {
  switch (isa) {
#if DNNKIT_HAVE_AVX512
    case Isa::avx512: return ukernel_avx512<T>();
#endif
#if DNNKIT_HAVE_AVX2
    case Isa::avx2: return ukernel_avx2<T>();
#endif
    default: return ukernel_ref<T>();
  }
}

template <typename T>
DotKernel<T> select_dot_kernel(Isa isa) {
  switch (isa) {
#if DNNKIT_HAVE_AVX512
    case Isa::avx512: return dot_kernel_avx512<T>();
#endif
#if DNNKIT_HAVE_AVX2
    case Isa::avx2: return dot_kernel_avx2<T>();
#endif
    default: return dot_kernel_ref<T>();
  }
}

// Peak-FLOP probes: a loop of independent FMAs on `iters` iterations, per ISA. Returns a value that
// depends on every FMA (so the loop cannot be removed) and sets *flops to the FLOPs executed.
double fma_probe_ref(index_t iters, double* flops);
double fma_probe_avx2(index_t iters, double* flops);
double fma_probe_avx512(index_t iters, double* flops);

// GFLOP/s of nthreads threads running the ISA's FMA probe for about `seconds` (gemm/peak.cpp).
double measure_peak_gflops(Isa isa, int nthreads, double seconds);
// GB/s that `nthreads` threads read from a buffer of `bytes` (each its own contiguous share, streamed
// once a pass), the best pass of about `seconds` of them: the ceiling of a kernel that streams its
// operands from where a buffer of that size lives (L3 or memory), as an RNN cell at batch 1 does its
// weights. With `alternate`, every other pass runs backwards, so that each pass starts on what the last
// one left in the core's caches: the ceiling of a kernel that alternates so (gemm_small_m's products on
// the same weights, see alternate_direction). Throws std::bad_alloc.
double measure_read_gbps(index_t bytes, int nthreads, double seconds, bool alternate = false);

}  // namespace dnnkit
