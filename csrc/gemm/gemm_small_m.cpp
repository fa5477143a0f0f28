// gemm_small_m: C := act(alpha * A * W^T + beta * C + bias) for few rows of A, with no packing.
// A (m x k) and W (n x k) are both contiguous along k (a fully-connected layer with a small batch), so
// every output is a dot product of two contiguous rows; W is streamed from memory once per block of
// MI_MAX rows of A. Threads split the n dimension.
#include <algorithm>
#include <optional>
#include <stdexcept>

#include "epilogue.h"
#include "gemm.h"
#include "pack.h"
#include "ukernel.h"
#include "../work_share.h"

namespace dnnkit {

namespace {

// The dot products of rows [0, mc) of A with `width` rows of W, into out (row stride ldo), written.
template <typename T>
void dot_block(const DotKernel<T>& dk, index_t mc, index_t k, const T* a, index_t lda, const T* w, index_t ldw, T* out,
               int ldo, index_t width) {
  if (mc <= dk.mi_max) {
    // All rows of A in one call, which streams all of the weight rows.
    dk.fn(static_cast<int>(mc), k, a, lda, w, ldw, out, ldo, static_cast<int>(width));
    return;
  }
  // NJ weight rows at a time against every row of A, so that they are read from L1.
  for (index_t j = 0; j < width; j += dk.nj)
    for (index_t i0 = 0; i0 < mc; i0 += dk.mi_max)
      dk.fn(static_cast<int>(std::min<index_t>(dk.mi_max, mc - i0)), k, a + i0 * lda, lda, w + j * ldw, ldw,
            out + i0 * ldo + j, ldo, static_cast<int>(std::min<index_t>(dk.nj, width - j)));
}

// gemm_small_m's driver.
template <typename T>
void small_m(const GemmArgs<T>& g, int nthreads) {
  // Contract: cs_a == 1 and rs_b == 1 (B = W^T with W row-major, ldw = cs_b); checked by the caller.
  if (g.m == 0 || g.n == 0) return;
  const DotKernel<T> dk = select_dot_kernel<T>(active_isa());
  const index_t n_jb = ceil_div(g.n, dk.nj);
  const int nt_max = static_cast<int>(std::max<index_t>(1, std::min<index_t>(nthreads > 0 ? nthreads : get_num_threads(),
                                                                         ceil_div(n_jb, 4))));
  const int nt = double(g.m) * double(g.n) * double(g.k) < min_parallel_work() ? 1 : nt_max;
  // The dot products land in C as they are when C takes them so (unit column stride, alpha 1, beta 0),
  // else in a tile first; bias and activation then run over a stretch of kCols columns at a time.
  constexpr index_t kRows = 16, kCols = 32;
  const bool direct = g.cs_c == 1 && g.alpha == T(1) && g.beta == T(0) && g.rs_c <= (index_t(1) << 30);
  // Units of kRows x kCols outputs, rows outer: a thread streams a contiguous run of weight rows, and
  // takes over the end of another's run when it finishes its own first (a memory-bound product on cores
  // that do not keep pace with each other).
  const index_t units_j = ceil_div(g.n, kCols), units = ceil_div(g.m, kRows) * units_j;
  std::optional<PanelShare> share;  // none on one thread, or past the shared ranges' 32-bit indices
  if (nt > 1 && units < PanelShare::kMaxPanels) share.emplace(nt, units);
  // Units in the order opposite to the last call's on the same weights (see alternate_direction); each
  // output is summed in the same order either way.
  const bool reverse = alternate_direction(g.b);
  auto run_unit = [&](index_t u, T* tile) {
    const index_t ic = u / units_j * kRows, jg = u % units_j * kCols;
    const index_t mc = std::min(kRows, g.m - ic), width = std::min(kCols, g.n - jg);
    dot_block<T>(dk, mc, g.k, g.a + ic * g.rs_a, g.rs_a, g.b + jg * g.cs_b, g.cs_b,
                 direct ? g.c + ic * g.rs_c + jg : tile, static_cast<int>(direct ? g.rs_c : kCols), width);
    T* c = g.c + ic * g.rs_c + jg * g.cs_c;
    if (!direct)
      for (index_t i = 0; i < mc; ++i)
        for (index_t j = 0; j < width; ++j) {
          T& cij = c[i * g.rs_c + j * g.cs_c];
          cij = g.beta == T(0) ? g.alpha * tile[i * kCols + j] : g.alpha * tile[i * kCols + j] + g.beta * cij;
        }
    if (g.bias || g.act != Activation::identity)
      apply_epilogue<T>(c, g.rs_c, g.cs_c, mc, width, g.bias ? g.bias + (g.bias_per_row ? ic : jg) : nullptr, g.act,
                        g.bias_per_row);
  };
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    alignas(64) T tile[kRows * kCols];
    for_each_unit(share ? &*share : nullptr, units, reverse, [&](index_t u) { run_unit(u, tile); });
  }
}

}  // namespace

template <typename T>
void gemm_small_m(const GemmArgs<T>& g, int nthreads) {
  small_m<T>(g, nthreads);
}

template <typename T>
void gemm_small_m_cell(index_t m, index_t n, index_t k1, const T* x, index_t ldx, index_t k2, const T* h, index_t ldh,
                       const CellGroup<T>* groups, int ngroups, CellDone done, void* ctx, int nthreads) {
  if (m <= 0 || n <= 0) return;
  if (m > kSmallCellRows) throw std::invalid_argument("gemm_small_m_cell: at most 16 rows");
  const DotKernel<T> dk = select_dot_kernel<T>(active_isa());
  // Units of kCols hidden units, as gemm_small_m's: every group's dot products of those units (all m
  // rows), then done() on the same thread. The weights are streamed once, in runs of kCols rows.
  constexpr index_t kCols = 32;
  const index_t units = ceil_div(n, kCols);
  int nt = static_cast<int>(
      std::max<index_t>(1, std::min<index_t>(nthreads > 0 ? nthreads : get_num_threads(), units)));
  if (double(m) * double(ngroups * n) * double(k1 + k2) < min_parallel_work()) nt = 1;
  std::optional<PanelShare> share;
  if (nt > 1 && units < PanelShare::kMaxPanels) share.emplace(nt, units);
  const bool reverse = alternate_direction(groups[0].w1 ? groups[0].w1 : groups[0].w2);
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    alignas(64) T tile[kSmallCellRows * kCols];
    for_each_unit(share ? &*share : nullptr, units, reverse, [&](index_t u) {
      const index_t j0 = u * kCols, width = std::min(kCols, n - j0);
      for (int q = 0; q < ngroups; ++q) {
        const CellGroup<T>& G = groups[q];
        T* c = G.c + j0;
        const int ldc = static_cast<int>(G.ldc);
        // Each output sums x . w1_row, then h . w2_row, then the bias.
        if (G.w1) dot_block<T>(dk, m, k1, x, ldx, G.w1 + j0 * G.ldw1, G.ldw1, c, ldc, width);
        if (G.w2 && !G.w1) dot_block<T>(dk, m, k2, h, ldh, G.w2 + j0 * G.ldw2, G.ldw2, c, ldc, width);
        if (G.w2 && G.w1) {
          dot_block<T>(dk, m, k2, h, ldh, G.w2 + j0 * G.ldw2, G.ldw2, tile, int(kCols), width);
          for (index_t r = 0; r < m; ++r)
            for (index_t j = 0; j < width; ++j) c[r * G.ldc + j] += tile[r * kCols + j];
        }
        if (G.bias)
          for (index_t r = 0; r < m; ++r)
            for (index_t j = 0; j < width; ++j) c[r * G.ldc + j] += G.bias[j0 + j];
      }
      done(ctx, j0, j0 + width);
    });
  }
}

template <typename T>
bool gemm_wt_direct_available() {
  return select_sa_kernel<T>(active_isa()).fn != nullptr;
}

namespace {

// Panel jp of the batch [A1 | A2] (rows of m, A1 m x k1 and A2 m x k2, contiguous rows) packed as the
// strided-A kernel's B: nr rows of the batch, k1 + k2 deep, at ap + jp*nr*(k1 + k2).
template <typename T>
void pack_batch_panel(index_t jp, int nr, index_t m, index_t k1, const T* a1, index_t lda1, index_t k2, const T* a2,
                      index_t lda2, T* ap) {
  const index_t j0 = jp * nr, rows = std::min<index_t>(nr, m - j0);
  T* dst = ap + jp * nr * (k1 + k2);
  pack_b_panel<T>(k1, rows, a1 + j0 * lda1, 1, lda1, nr, dst);
  if (k2 > 0) pack_b_panel<T>(k2, rows, a2 + j0 * lda2, 1, lda2, nr, dst + k1 * nr);
}

// The batch panels of a strided-A product, npan panels of `elems` values in all: with own (more than one
// thread, and kOwnPanelBytes or less of them), each thread packs every panel into its own copy at
// base + thread_id() * elems and goes on at once; else the threads pack one shared copy at base
// together and meet at a barrier. Packed once and shared, a thread's share was written into lines the
// other core had read at the last call, each store waiting on the other core's cache (7.5 us for 64 KiB,
// GRU H256 cell at batch 64, where packing all of them from cache takes less). Returns the thread's
// panels. Called by every thread of the region.
constexpr index_t kOwnPanelBytes = index_t(256) << 10;

template <typename T>
bool own_panels(int nt, index_t elems) {
  return nt > 1 && elems * index_t(sizeof(T)) <= kOwnPanelBytes;
}

template <typename T, class Pack>
T* pack_panels(bool own, index_t npan, index_t elems, T* base, Pack&& pack) {
  T* const panels = base + (own ? thread_id() * elems : 0);
  if (own) {
    for (index_t jp = 0; jp < npan; ++jp) pack(jp, panels);
  } else {
#pragma omp for schedule(static)
    for (index_t jp = 0; jp < npan; ++jp) pack(jp, panels);
  }  // implicit barrier: every panel packed
  return panels;
}

// C := act(alpha * A W^T + beta * C + bias) by the strided-A kernel, in depth blocks (sa_depth_block).
template <typename T>
void wt_direct(const GemmArgs<T>& g, const SaKernel<T>& sk, int nthreads) {
  const int mr = sk.mr, nr = sk.nr;
  const index_t m = g.m, n = g.n, k = g.k;
  // C^T (n x m) = W (n x k) A^T (k x m): W = B^T is the kernel's A, read in place (row i at
  // g.b + i*cs_b); A^T is packed into k x NR panels of NR rows of A each (the kernel's B), the only copy.
  const index_t npan = ceil_div(m, nr), elems = npan * nr * k;
  // Depth in equal blocks of at most sa_depth_block (the same for every batch).
  const index_t kc_max = ceil_div(k, ceil_div(k, sa_depth_block(sk)));
  const index_t n_ib = ceil_div(n, mr);
  int nt = static_cast<int>(std::max<index_t>(1, std::min<index_t>(nthreads > 0 ? nthreads : get_num_threads(), n_ib)));
  if (double(m) * double(n) * double(k) < min_parallel_work()) nt = 1;
  // One shared copy of the panels: a copy a thread, as the cells pack them (gemm_wt_direct_cell), is no
  // faster here within the noise of bench/gemm.py's fc rows (bench/log/2026-11-22-to-24.md).
  const bool own = false;
  AlignedBuffer<T> ap(static_cast<std::size_t>(elems));
  // Tiles of W rows shared as gemm_small_m shares its units: each thread runs its own range, in the
  // direction opposite to the last call's on the same W, and takes over the end of another's.
  std::optional<PanelShare> share;
  if (nt > 1 && n_ib < PanelShare::kMaxPanels) share.emplace(nt, n_ib);
  const bool reverse = alternate_direction(g.b);
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    const T* const panels = pack_panels(own, npan, elems, ap.data(), [&](index_t jp, T* dst) {
      pack_batch_panel<T>(jp, nr, m, k, g.a, g.rs_a, 0, nullptr, 0, dst);
    });
    auto run_tile = [&](index_t ib) {
      const index_t i = ib * mr;  // rows [i, i + m_t) of W: columns of C
      const int m_t = static_cast<int>(std::min<index_t>(mr, n - i));
      for (index_t pc = 0; pc < k; pc += kc_max) {
        const index_t kc = std::min(kc_max, k - pc);
        const T beta = pc == 0 ? g.beta : T(1);
        const bool last = pc + kc >= k;
        // A bias per column of C (a linear layer's) is per row of the kernel's tile: added in its store.
        const T* tile_bias = last && g.bias && !g.bias_per_row ? g.bias + i : nullptr;
        for (index_t jp = 0; jp < npan; ++jp) {
          const index_t j0 = jp * nr;  // rows [j0, j0 + n_t) of A and C
          const int n_t = static_cast<int>(std::min<index_t>(nr, m - j0));
          T* c = g.c + j0 * g.rs_c + i * g.cs_c;
          sk.fn(kc, g.b + i * g.cs_b + pc, g.cs_b, 0, nullptr, 0, panels + jp * nr * k + pc * nr, c, g.cs_c,
                g.rs_c, g.alpha, beta, m_t, n_t, tile_bias);
          if (last && (g.act != Activation::identity || (g.bias && g.bias_per_row)))
            apply_epilogue<T>(c, g.rs_c, g.cs_c, n_t, m_t, g.bias && g.bias_per_row ? g.bias + j0 : nullptr, g.act,
                              g.bias_per_row);
        }
      }
    };
    for_each_unit(share ? &*share : nullptr, n_ib, reverse, run_tile);
  }
}

}  // namespace

template <typename T>
void gemm_wt_direct(const GemmArgs<T>& g, int nthreads) {
  // Contract: cs_a == 1 and rs_b == 1, as gemm_small_m's; checked by the caller.
  if (g.m == 0 || g.n == 0) return;
  const SaKernel<T> sk = select_sa_kernel<T>(active_isa(), g.m);
  if (g.k == 0 || !sk.fn) return gemm<T>(g, nthreads);
  wt_direct<T>(g, sk, nthreads);
}

template <typename T>
void gemm_wt_direct_cell(index_t m, index_t n, index_t k1, const T* x, index_t ldx, index_t k2, const T* h, index_t ldh,
                         const CellGroup<T>* groups, int ngroups, CellDone done, void* ctx, int nthreads) {
  if (m <= 0 || n <= 0) return;
  const SaKernel<T> sk = select_sa_kernel<T>(active_isa(), m);
  if (!sk.fn) throw std::invalid_argument("gemm_wt_direct_cell: needs the strided-A kernel");
  const int mr = sk.mr, nr = sk.nr;
  const index_t k = k1 + k2;
  // Units of `width` hidden units: every group's tiles of those units (width / mr tiles each, against
  // every batch panel), then done() on the same thread, while the unit's pre-activations (m x width per
  // group) are still in its cache (a pass after the products, each thread on its own half of the units,
  // would find half of what it reads in the other core's cache). 32 units: no slower than 16, 64 or 128
  // (bench/log/kernel-choices.md).
  const index_t width = round_up(32, mr), units = ceil_div(n, width);
  const index_t npan = ceil_div(m, nr);
  const index_t kc_max = ceil_div(k, ceil_div(k, sa_depth_block(sk)));
  int nt = static_cast<int>(
      std::max<index_t>(1, std::min<index_t>(nthreads > 0 ? nthreads : get_num_threads(), units)));
  if (double(m) * double(ngroups * n) * double(k) < min_parallel_work()) nt = 1;
  // The batch panels, one copy a thread up to kOwnPanelBytes (pack_panels): each thread then reads its
  // own copy from its own L2 (bench/rnn.py's cell rows, bench/log/2026-11-22-to-24.md).
  const index_t panels_elems = npan * nr * k;
  const bool own = own_panels<T>(nt, panels_elems);
  AlignedBuffer<T> ap(static_cast<std::size_t>(own ? nt * panels_elems : panels_elems));
  std::optional<PanelShare> share;
  if (nt > 1 && units < PanelShare::kMaxPanels) share.emplace(nt, units);
  const bool reverse = alternate_direction(groups[0].w1 ? groups[0].w1 : groups[0].w2);
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    const T* const panels = pack_panels(own, npan, panels_elems, ap.data(), [&](index_t jp, T* dst) {
      pack_batch_panel<T>(jp, nr, m, k1, x, ldx, k2, h, ldh, dst);
    });
    // Rows [i, i + m_t) of group G: over its depth (W1's segment [0, k1), W2's [k1, k), or both), in the
    // depth blocks every product of this kernel uses, against every batch panel.
    auto run_tile = [&](const CellGroup<T>& G, index_t i, int m_t) {
      const index_t lo = G.w1 ? 0 : k1, hi = G.w2 ? k : k1;
      bool first = true;
      for (index_t pc = 0; pc < k; pc += kc_max) {
        const index_t b0 = std::max(pc, lo), b1 = std::min(pc + kc_max, hi);
        if (b0 >= b1) continue;
        const index_t s1 = std::max<index_t>(0, std::min(b1, k1) - b0);  // depth in the first segment
        const index_t p2 = std::max(b0, k1) - k1;                        // start in the second
        const bool last = b1 >= hi;
        const T* a1 = G.w1 ? G.w1 + i * G.ldw1 + b0 : G.w2 + i * G.ldw2 + p2;  // unread when s1 == 0
        for (index_t jp = 0; jp < npan; ++jp) {
          const index_t j0 = jp * nr;  // rows [j0, j0 + n_t) of x, h and C
          const int n_t = static_cast<int>(std::min<index_t>(nr, m - j0));
          sk.fn(s1, a1, G.ldw1, b1 - b0 - s1, G.w2 ? G.w2 + i * G.ldw2 + p2 : nullptr, G.ldw2,
                panels + jp * nr * k + b0 * nr, G.c + j0 * G.ldc + i, 1, G.ldc, T(1), first ? T(0) : T(1), m_t,
                n_t, last && G.bias ? G.bias + i : nullptr);
        }
        first = false;
      }
    };
    for_each_unit(share ? &*share : nullptr, units, reverse, [&](index_t u) {
      const index_t j0 = u * width, j1 = std::min(n, j0 + width);
      for (int q = 0; q < ngroups; ++q)
        for (index_t i = j0; i < j1; i += mr)
          run_tile(groups[q], i, static_cast<int>(std::min<index_t>(mr, j1 - i)));
      done(ctx, j0, j1);
    });
  }
}

template void gemm_wt_direct_cell<float>(index_t, index_t, index_t, const float*, index_t, index_t, const float*,
                                         index_t, const CellGroup<float>*, int, CellDone, void*, int);
template void gemm_wt_direct_cell<double>(index_t, index_t, index_t, const double*, index_t, index_t, const double*,
                                          index_t, const CellGroup<double>*, int, CellDone, void*, int);
template void gemm_small_m_cell<float>(index_t, index_t, index_t, const float*, index_t, index_t, const float*, index_t,
                                       const CellGroup<float>*, int, CellDone, void*, int);
template void gemm_small_m_cell<double>(index_t, index_t, index_t, const double*, index_t, index_t, const double*,
                                        index_t, const CellGroup<double>*, int, CellDone, void*, int);
template bool gemm_wt_direct_available<float>();
template bool gemm_wt_direct_available<double>();
template void gemm_wt_direct<float>(const GemmArgs<float>&, int);
template void gemm_wt_direct<double>(const GemmArgs<double>&, int);
template void gemm_small_m<float>(const GemmArgs<float>&, int);
template void gemm_small_m<double>(const GemmArgs<double>&, int);

}  // namespace dnnkit
