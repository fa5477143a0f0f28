// Blocked GEMM on strided views (Goto/BLIS structure):
//   C := act(alpha * A*B + beta * C + bias)
// A is m x k, B is k x n, C is m x n; element (r, c) of X is x[r*rs + c*cs] (any strides, so transposes
// and non-contiguous views need no copy). When beta == 0, C is never read. bias (length n) may be null.
#pragma once
#include <cstdint>
#include "../common.h"
#include "../cpu_info.h"
#include "epilogue.h"
#include "ukernel.h"

namespace dnnkit {

// Which of gemm()'s paths may run a product: every one (automatic: a product that streams one operand
// by gemm_stream, float32 on AMX tiles where they take it, the operands' roles exchanged where that fills
// the micro-kernel's tiles better, else Goto/BLIS), or Goto/BLIS alone as the operands are given (the
// registry's gemm_goto, so that the tuner can time it against the others).
enum class GemmPath : int { automatic = 0, goto_only = 1 };

template <typename T>
struct GemmArgs {
  index_t m = 0, n = 0, k = 0;
  GemmPath path = GemmPath::automatic;
  T alpha = T(1), beta = T(0);
  const T* a = nullptr;
  index_t rs_a = 0, cs_a = 0;
  const T* b = nullptr;
  index_t rs_b = 0, cs_b = 0;
  T* c = nullptr;
  index_t rs_c = 0, cs_c = 0;
  const T* bias = nullptr;       // length n (added to every row), or length m with bias_per_row
  bool bias_per_row = false;     // true: bias[i] is added to row i (a convolution's output channels)
  Activation act = Activation::identity;
  // B's columns in groups (images side by side): with b_group_cols > 0, column j of B is column
  // j % b_group_cols of the group at b + (j / b_group_cols) * b_group_stride. Only the packing of B
  // reads it (a convolution's 1x1 input planes batched into one GEMM without copying them).
  index_t b_group_cols = 0, b_group_stride = 0;
  // B computed rather than read (an implicit-GEMM convolution packs its columns from the image): when
  // set, pack_b(pack_b_ctx, pc, kc, j, n_t, nr, dst) writes rows [pc, pc + kc) of columns [j, j + n_t)
  // of B as one packed panel, dst[p*nr + l] = B(pc + p, j + l), zero for l >= n_t. b and its strides
  // are then unused. It runs on the GEMM's threads, concurrently for different panels.
  void (*pack_b)(const void* ctx, index_t pc, index_t kc, index_t j, index_t n_t, int nr, T* dst) = nullptr;
  const void* pack_b_ctx = nullptr;
  // A already packed by pack_a_blocks for these m and k (a and its strides are then unused): a product
  // that reuses one A against many B operands packs it once.
  const T* a_packed = nullptr;
  // B already packed as PackedB packs it (below), full-depth NR-wide panels for the active micro-kernel,
  // panel jp at b_panels + jp*NR*k (b and its strides are then unused): the B blocks are read in place.
  const T* b_panels = nullptr;
};

// The arguments of C (m x n, row stride ldc, unit column stride) := beta * C + A B for A and B given by
// their strides: the common call of the kernels built on the GEMM.
template <typename T>
GemmArgs<T> strided_gemm_args(index_t m, index_t n, index_t k, const T* a, index_t rs_a, index_t cs_a, const T* b,
                              index_t rs_b, index_t cs_b, T* c, index_t ldc, T beta) {
  GemmArgs<T> g;
  g.m = m;
  g.n = n;
  g.k = k;
  g.a = a;
  g.rs_a = rs_a;
  g.cs_a = cs_a;
  g.b = b;
  g.rs_b = rs_b;
  g.cs_b = cs_b;
  g.c = c;
  g.rs_c = ldc;
  g.cs_c = 1;
  g.beta = beta;
  return g;
}

// Runs on `nthreads` OpenMP threads (<= 0: get_num_threads()) with the active ISA's micro-kernel.
// Throws std::bad_alloc if the packing buffers cannot be allocated; never throws from inside a
// parallel region.
template <typename T>
void gemm(const GemmArgs<T>& g, int nthreads = 0);

// The same contract for the products that stream one operand (gemm_stream.cpp): at most 8 rows of A
// against a B with contiguous rows, or a depth of at most 8 into a C with contiguous rows. Runs g and
// returns true where it applies, else returns false at once; gemm() calls it first. Its workspace (the
// few-rows partial products) is gemm_stream_workspace_bytes, within gemm_workspace_bytes.
constexpr index_t kStreamRows = 4, kStreamDepth = 8;
template <typename T>
bool gemm_stream(const GemmArgs<T>& g, int nthreads = 0);
template <typename T>
index_t gemm_stream_workspace_bytes(index_t m, index_t n, index_t k);
// Whether gemm_stream takes an m x n x k product whose B has contiguous rows and C contiguous rows.
bool gemm_stream_takes(index_t m, index_t n, index_t k);

// The same contract for few rows of A and B = W^T (requires cs_a == 1 and rs_b == 1): dot products of
// contiguous rows, no packing, no workspace (gemm_small_m.cpp).
template <typename T>
void gemm_small_m(const GemmArgs<T>& g, int nthreads = 0);

// The same contract again for a batch of rows (up to about a hundred) and B = W^T (cs_a == 1, rs_b == 1),
// computed as C^T = W A^T by the strided-A micro-kernel (ukernel.h): W is read where it lies, once a call
// (a batch past the widest tile runs as panels of rows, each tile of W against all of them while its
// rows are in cache), and only A is packed. What a fully-connected layer or an RNN cell at batch
// 16-128 spends on packing W, which the blocked GEMM does at every call, is saved. Falls back to gemm()
// when the ISA has no strided-A kernel (gemm_wt_direct_available). Throws std::bad_alloc.
template <typename T>
bool gemm_wt_direct_available();
template <typename T>
void gemm_wt_direct(const GemmArgs<T>& g, int nthreads = 0);
// An RNN cell's products, and its post-GEMM, in one pass of the strided-A kernel: [x | h] (m x (k1 + k2);
// x and h with contiguous rows) packed once, and each weight read in place. Group q holds n rows of
// weights: row j at w1 + j*ldw1 (depth [0, k1), against x) and at w2 + j*ldw2 (depth [k1, k1 + k2),
// against h); either may be null, leaving that segment out. It computes
//   c[r*ldc + j] := x[r] . w1_row(j) + h[r] . w2_row(j) + bias[j]     (bias may be null)
// for every batch row r. The hidden units run in blocks [j0, j1) of 32 (or the next multiple of the
// kernel's MR): every group's rows j0..j1, then done(ctx, j0, j1) on the same thread, while those
// pre-activations are still in its cache. done runs concurrently for disjoint blocks. Each output sums in
// the depth blocks of gemm_wt_direct, whatever the batch. Requires the strided-A kernel
// (gemm_wt_direct_available). Throws std::bad_alloc.
template <typename T>
struct CellGroup {
  const T* w1;
  index_t ldw1;
  const T* w2;
  index_t ldw2;
  T* c;
  index_t ldc;
  const T* bias;
};
using CellDone = void (*)(void* ctx, index_t j0, index_t j1);
template <typename T>
void gemm_wt_direct_cell(index_t m, index_t n, index_t k1, const T* x, index_t ldx, index_t k2, const T* h, index_t ldh,
                         const CellGroup<T>* groups, int ngroups, CellDone done, void* ctx, int nthreads = 0);
// The same on gemm_small_m's dot products, for a batch of at most kSmallCellRows rows (an RNN cell at batch
// 1 to 16): nothing is packed, and the blocks of hidden units are gemm_small_m's. Each output sums
// x[r] . w1_row(j), plus h[r] . w2_row(j), plus bias[j].
constexpr index_t kSmallCellRows = 16;
template <typename T>
void gemm_small_m_cell(index_t m, index_t n, index_t k1, const T* x, index_t ldx, index_t k2, const T* h, index_t ldh,
                       const CellGroup<T>* groups, int ngroups, CellDone done, void* ctx, int nthreads = 0);

// ---- Pre-packed B: pack once, multiply many times (an RNN's recurrent weights, reused at every step).
//
// PackedB holds a k x n B as ceil(n/NR) micro-panels of full depth: panel jp is columns
// [jp*NR, jp*NR + NR) stored k x NR, k-major (panel[p*NR + j] = B(p, jp*NR + j)), zero past column n.
// Rows [pc, pc + kc) of a panel start at panel + pc*NR, so the micro-kernel runs on any k block of it
// without repacking. The micro-kernel is the active ISA's at pack time and stays with the packing.
template <typename T>
class PackedB {
 public:
  // Packs B (element (r, c) at b[r*rs + c*cs]) on `nthreads` threads (<= 0: get_num_threads()).
  // Throws std::bad_alloc; call it outside parallel regions.
  void pack(index_t k, index_t n, const T* b, index_t rs, index_t cs, int nthreads = 0);
  index_t k() const { return k_; }
  index_t n() const { return n_; }
  index_t panels() const { return ceil_div(n_, uk_.nr); }
  const UKernel<T>& ukernel() const { return uk_; }
  const T* panel(index_t jp) const { return buf_.data() + jp * uk_.nr * k_; }
  // float32 only: B packed a second time, as AMX tile panels of three bfloat16 parts (amx.h), 32 columns
  // a panel (NR on AVX-512: the same panel jp), where the tiles are enabled and every value of B splits
  // exactly; pack() drops it. amx_panel(jp) is null without it. (A cell stepped on weights packed once
  // multiplies them on the tiles.)
  void pack_amx(const T* b, index_t rs, index_t cs);
  const std::uint16_t* amx_panel(index_t jp) const;

 private:
  index_t k_ = 0, n_ = 0;
  UKernel<T> uk_{};
  AlignedBuffer<T> buf_;
  AlignedBuffer<std::uint16_t> amx_;
  bool has_amx_ = false;
};

// A (m x k) packed for gemm_packed_b: floor(m/h) micro-panels of h rows (stride h) and, when h does not
// divide m, one tail panel of exactly m % h rows (stride m % h), so no padding row is computed; h is
// `height` (at most MR; 0: MR). packed_a_elems is the size of `ap` (64-byte aligned) for the
// micro-kernel uk, whatever the height.
template <typename T>
index_t packed_a_elems(const UKernel<T>& uk, index_t m, index_t k);
template <typename T>
void pack_a_rows(const UKernel<T>& uk, index_t m, index_t k, const T* a, index_t rs, index_t cs, T* ap,
                 int height = 0);
// The share `part` of `parts` of pack_a_rows (micro-panels part, part + parts, ...), for threads that
// pack one A together: together they write what pack_a_rows writes.
template <typename T>
void pack_a_rows_part(const UKernel<T>& uk, index_t m, index_t k, const T* a, index_t rs, index_t cs, T* ap, int part,
                      int parts, int height = 0);

// The panel height that cuts m rows into panels of at most MR rows as equal as they can be (16 rows:
// two of 8 rather than 14 and 2, whose kernel, with four accumulators, is bound by FMA latency; 64
// rows: 13, 13, 13, 13, 12 rather than four of 14 and one of 8).
inline int balanced_height(int mr, index_t m) {
  const index_t rows = std::max<index_t>(m, 1);
  return static_cast<int>(ceil_div(rows, ceil_div(rows, static_cast<index_t>(mr))));
}

// One thread, no allocation (callable inside a parallel region): for the column panels [jp0, jp1) of b,
//   C(i, j) := beta * C(i, j) + sum_p A(i, p) B(p, j),   0 <= i < m,  jp0*NR <= j < min(n, jp1*NR),
// with A packed by pack_a_rows (panels of `height` rows, as packed) and C row-major (row stride ldc; c
// points at C(0, 0)). Each element's sum is the same whatever the height. beta == 0: C is
// not read. k is blocked as gemm() blocks it, so each element is summed in the same order as there.
// `reverse` runs the panels from jp1 - 1 down (same results): a loop that streams the same panels every
// step alternates it, so that each step starts on the panels still in cache from the last. bias (n
// values, may be null) is added to every row in the micro-kernel's store on the last k block, as gemm()
// adds a column bias.
template <typename T>
void gemm_packed_b(index_t m, const T* ap, const PackedB<T>& b, index_t jp0, index_t jp1, T beta, T* c,
                   index_t ldc, bool reverse = false, const T* bias = nullptr, int height = 0);

// C (m x n, row stride ldc) := act(A W^T + A2 W2^T + bias) with W^T packed once by the caller: w holds
// W^T (k x n) for a weight W (n x k), w2 (may be null) W2^T (k2 x n); A (m x k, row stride lda) and A2
// (m x k2, row stride lda2) have contiguous rows. What a fully-connected layer or an RNN cell called
// again and again on the same weights would otherwise pay at every call, the packing of W, is paid
// once (dnnkit.pack_weight). A is packed per call (it is small: few rows), in blocks of rows that stay
// in L2 while the weight's panels stream past; the threads share the (row block, panel) pairs, run in
// a direction that alternates from call to call (alternate_direction). bias (length n) may be null;
// beta is 0 (C is not read).
// Throws std::bad_alloc before its parallel region.
template <typename T>
void gemm_prepacked(index_t m, const T* a, index_t lda, const PackedB<T>& w, T* c, index_t ldc, const T* bias,
                    Activation act, const T* a2 = nullptr, index_t lda2 = 0, const PackedB<T>* w2 = nullptr,
                    int nthreads = 0);

// A (m x k, element (r, c) at a[r*rs + c*cs]) packed the way gemm() packs it, every cache block of it, so
// that GemmArgs::a_packed can skip the packing: packed_a_blocks_elems(m, k) elements, 64-byte aligned.
// For the active ISA's micro-kernel at the time of the gemm() call; the cache blocks split over up to
// nthreads threads (the calling thread alone by default).
template <typename T>
index_t packed_a_blocks_elems(index_t m, index_t k);
template <typename T>
void pack_a_blocks(index_t m, index_t k, const T* a, index_t rs, index_t cs, T* ap, int nthreads = 1);

// Bytes of packing buffers gemm() allocates for these sizes (the algorithm's workspace).
template <typename T>
index_t gemm_workspace_bytes(index_t m, index_t n, index_t k, int nthreads = 0);

}  // namespace dnnkit
