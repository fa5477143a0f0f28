// Pre-packed B (PackedB) and the single-threaded product over a range of its panels (gemm.h).
#include <algorithm>
#include <optional>

#include "blocking.h"
#include "gemm.h"

#include <type_traits>

#include "amx.h"
#include "pack.h"
#include "../work_share.h"

namespace dnnkit {

template <typename T>
void PackedB<T>::pack(index_t k, index_t n, const T* b, index_t rs, index_t cs, int nthreads) {
  uk_ = select_ukernel<T>(active_isa());
  has_amx_ = false;
  k_ = k;
  n_ = n;
  const int nr = uk_.nr;
  const index_t np = panels();
  buf_.resize(static_cast<std::size_t>(std::max<index_t>(np * nr * k, 1)));
  T* const dst = buf_.data();
  const int nt = static_cast<int>(std::max<index_t>(1, std::min<index_t>(nthreads > 0 ? nthreads : get_num_threads(),
                                                                         np)));
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
  for (index_t jp = 0; jp < np; ++jp) {
    const index_t j = jp * nr;
    pack_b_panel<T>(k, std::min<index_t>(nr, n - j), b + j * cs, rs, cs, nr, dst + jp * nr * k);
  }
}

template <typename T>
void PackedB<T>::pack_amx(const T* b, index_t rs, index_t cs) {
  has_amx_ = false;
  if constexpr (std::is_same_v<T, float>) {
    if (!amx::active() || uk_.nr != amx::kBlock || k_ == 0 || n_ == 0 ||
        !amx::splittable(k_, n_, b, rs, cs))
      return;
    amx_.resize(static_cast<std::size_t>(panels() * amx::panel_elems(k_)));
    amx::pack_b_panels(k_, n_, b, rs, cs, amx_.data(), amx::panel_elems(k_));
    has_amx_ = true;
  }
}

template <typename T>
const std::uint16_t* PackedB<T>::amx_panel(index_t jp) const {
  if constexpr (std::is_same_v<T, float>) {
    if (has_amx_) return amx_.data() + jp * amx::panel_elems(k_);
  }
  return nullptr;
}

template <typename T>
index_t packed_a_elems(const UKernel<T>&, index_t m, index_t k) {
  return std::max<index_t>(m * k, 1);  // full panels and the exact-height tail hold m*k elements, no padding
}

template <typename T>
void pack_a_rows_part(const UKernel<T>& uk, index_t m, index_t k, const T* a, index_t rs, index_t cs, T* ap, int part,
                      int parts, int height) {
  const int h = height > 0 ? std::min(height, uk.mr) : uk.mr;
  for (index_t i = static_cast<index_t>(part) * h; i < m; i += static_cast<index_t>(parts) * h) {
    const int rows = static_cast<int>(std::min<index_t>(h, m - i));  // the tail panel at its exact height
    pack_a_panel<T>(rows, k, a + i * rs, rs, cs, rows, ap + i * k);
  }
}

template <typename T>
void pack_a_rows(const UKernel<T>& uk, index_t m, index_t k, const T* a, index_t rs, index_t cs, T* ap, int height) {
  pack_a_rows_part<T>(uk, m, k, a, rs, cs, ap, 0, 1, height);
}

template <typename T>
void gemm_packed_b(index_t m, const T* ap, const PackedB<T>& b, index_t jp0, index_t jp1, T beta, T* c,
                   index_t ldc, bool reverse, const T* bias, int height) {
  const UKernel<T>& uk = b.ukernel();
  const index_t k = b.k(), n = b.n();
  const int mr = height > 0 ? std::min(height, uk.mr) : uk.mr, nr = uk.nr;
  const ukernel_fn<T> full = mr == uk.mr ? uk.fn : uk.rows[mr - 1];
  // The first tile of each k block reads the block's slice of a weight from memory when the weight is
  // larger than the caches: that tile prefetches further ahead (UKernel::far); the next ones find the
  // slice in cache. Packed 4096 x 4096 at batch 16: 0.82 of the time; 2048 x 2048 at batch 16 and 64:
  // 0.93-0.96.
  const ukernel_fn<T> first = mr == uk.mr && uk.far ? uk.far : full;
  if (m == 0 || jp0 >= jp1) return;
  if (k == 0) {
    const index_t j1 = std::min(n, jp1 * nr);
    for (index_t i = 0; i < m; ++i)
      for (index_t j = jp0 * nr; j < j1; ++j)
        c[i * ldc + j] = (beta == T(0) ? T(0) : beta * c[i * ldc + j]) + (bias ? bias[j] : T(0));
    return;
  }
  const index_t m_full = m / mr * mr;
  const int m_tail = static_cast<int>(m - m_full);
  // k blocks as gemm() cuts them for this product (k_block, deep_k_blocks), so that both sum every
  // element in the same order.
  const index_t kc_max = k_block<T>(k, deep_k_blocks(m, n, static_cast<index_t>(sizeof(T)), thread_count()));
  // One row: whole groups of row_np panels at once (UKernel::row_panels, the same sums as the one-row
  // tile's); the panels left over, and fewer than row_np, by the tile below.
  index_t q_begin = jp0;
  if (m == 1 && uk.row_panels && jp1 - jp0 >= uk.row_np) {
    const index_t np = uk.row_np, groups = (jp1 - jp0) / np;
    for (index_t g = 0; g < groups; ++g) {
      const index_t q0 = jp0 + (reverse ? groups - 1 - g : g) * np;
      const index_t j = q0 * nr;
      const int n_g = static_cast<int>(std::min<index_t>((q0 + np) * nr, n) - j);
      for (index_t pc = 0; pc < k; pc += kc_max) {
        const index_t kc = std::min(kc_max, k - pc);
        uk.row_panels(kc, ap + pc, b.panel(q0) + pc * nr, nr * k, c + j, pc == 0 ? beta : T(1), n_g,
                      bias && pc + kc >= k ? bias + j : nullptr);
      }
    }
    q_begin = jp0 + groups * np;
  }
  for (index_t q = q_begin; q < jp1; ++q) {
    const index_t jp = reverse ? q_begin + jp1 - 1 - q : q;
    const index_t j = jp * nr;
    const int n_t = static_cast<int>(std::min<index_t>(nr, n - j));
    const T* bpanel = b.panel(jp);
    for (index_t pc = 0; pc < k; pc += kc_max) {
      const index_t kc = std::min(kc_max, k - pc);
      const T beta_k = pc == 0 ? beta : T(1);
      const T* bblk = bpanel + pc * nr;
      const T* bias_k = bias && pc + kc >= k ? bias + j : nullptr;
      // A panel of rows [i, i + mr) starts at ap + i*k; its k block [pc, pc + kc) at + pc*mr.
      for (index_t i = 0; i < m_full; i += mr)
        (i == 0 ? first : full)(kc, ap + i * k + pc * mr, bblk, c + i * ldc + j, ldc, 1, T(1), beta_k, mr, n_t, bias_k,
                                false);
      if (m_tail)
        uk.rows[m_tail - 1](kc, ap + m_full * k + pc * m_tail, bblk, c + m_full * ldc + j, ldc, 1, T(1), beta_k,
                            m_tail, n_t, bias_k, false);
    }
  }
}

template <typename T>
void gemm_prepacked(index_t m, const T* a, index_t lda, const PackedB<T>& w, T* c, index_t ldc, const T* bias,
                    Activation act, const T* a2, index_t lda2, const PackedB<T>* w2, int nthreads) {
  const index_t n = w.n(), k = w.k(), k2 = w2 ? w2->k() : 0;
  if (m <= 0 || n <= 0) return;
  const UKernel<T>& uk = w.ukernel();
  const int mr = uk.mr, nr = uk.nr;
  const index_t mc_max = std::max<index_t>(mr, 256 / mr * mr);
  if (!w2 && m > mc_max && uk.fn == select_ukernel<T>(active_isa()).fn) {
    // More rows than one block: the blocked GEMM's order, an A micro-panel in L1 against B blocks in L2,
    // the B blocks read in place from the packed weight. Below, each block of rows would stream the whole
    // weight from memory again, its panels through L1, and the A panels from L2.
    GemmArgs<T> g = strided_gemm_args<T>(m, n, k, a, lda, 1, nullptr, 0, 0, c, ldc, T(0));
    g.b_panels = w.panel(0);
    g.bias = bias;
    g.act = act;
    gemm<T>(g, nthreads);
    return;
  }
  // A packed in panels of its rows; one row (contiguous along k) is its own panel, read where it lies.
  const bool one_row = m == 1;
  AlignedBuffer<T> ap(one_row ? 0 : static_cast<std::size_t>(std::max<index_t>(m * (k + k2), 1)));
  const T* const ap1 = one_row ? a : ap.data();
  const T* const ap2 = one_row ? a2 : ap.data() + m * k;
  // Rows per block: a block's k slice (rows x KC) stays in L2 (256 rows x 336 float32: 336 KB) while
  // each panel's KC x NR slice is reused from L1 across the block's micro-panels.
  // Blocks of equal height (multiples of MR): unequal ones (256 rows as 252 + 4) leave a thread to stream
  // the whole weight for a few rows.
  const index_t mc = round_up(ceil_div(m, ceil_div(m, mc_max)), mr);
  // Panels a unit: row_np for one row (gemm_packed_b runs them at once), else one.
  const index_t per_unit = m == 1 && uk.row_panels ? uk.row_np : 1;
  const index_t mblocks = ceil_div(m, mc), panels = ceil_div(w.panels(), per_unit), units = mblocks * panels;
  int nt = nthreads > 0 ? nthreads : get_num_threads();
  if (double(m) * double(n) * double(k + k2) < min_parallel_work()) nt = 1;
  nt = static_cast<int>(std::max<index_t>(1, std::min<index_t>(nt, units)));
  // Units are (row block, panel) pairs, block-major: with one block (a few rows) the threads split the
  // panels; with many (a narrow output over many rows) they split the blocks.
  std::optional<PanelShare> share;
  if (nt > 1 && units < PanelShare::kMaxPanels) share.emplace(nt, units);
  const bool reverse = alternate_direction(&w);
  const bool epilogue = act != Activation::identity;  // the bias goes into the last product's store
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    const int tid = thread_id(), nth = thread_count();
    if (!one_row) {
      pack_a_rows_part<T>(uk, m, k, a, lda, 1, ap.data(), tid, nth);
      if (w2) pack_a_rows_part<T>(uk, m, k2, a2, lda2, 1, ap.data() + m * k, tid, nth);
#pragma omp barrier
    }
    for_each_unit(share ? &*share : nullptr, units, reverse, [&](index_t u) {
      const index_t mb = u / panels, jp0 = u % panels * per_unit, jp1 = std::min(w.panels(), jp0 + per_unit);
      const index_t i0 = mb * mc, rows = std::min(mc, m - i0);
      T* const cb = c + i0 * ldc;
      gemm_packed_b<T>(rows, ap1 + i0 * k, w, jp0, jp1, T(0), cb, ldc, false, w2 ? nullptr : bias);
      if (w2) gemm_packed_b<T>(rows, ap2 + i0 * k2, *w2, jp0, jp1, T(1), cb, ldc, false, bias);
      if (epilogue) {
        const index_t j = jp0 * nr;
        apply_epilogue<T>(cb + j, ldc, 1, rows, std::min<index_t>(jp1 * nr, n) - j, nullptr, act);
      }
    });
  }
}

template class PackedB<float>;
template class PackedB<double>;
template index_t packed_a_elems<float>(const UKernel<float>&, index_t, index_t);
template index_t packed_a_elems<double>(const UKernel<double>&, index_t, index_t);
template void pack_a_rows_part<float>(const UKernel<float>&, index_t, index_t, const float*, index_t, index_t, float*,
                                      int, int, int);
template void pack_a_rows_part<double>(const UKernel<double>&, index_t, index_t, const double*, index_t, index_t,
                                       double*, int, int, int);
template void pack_a_rows<float>(const UKernel<float>&, index_t, index_t, const float*, index_t, index_t, float*, int);
template void pack_a_rows<double>(const UKernel<double>&, index_t, index_t, const double*, index_t, index_t,
                                  double*, int);
template void gemm_packed_b<float>(index_t, const float*, const PackedB<float>&, index_t, index_t, float, float*,
                                   index_t, bool, const float*, int);
template void gemm_packed_b<double>(index_t, const double*, const PackedB<double>&, index_t, index_t, double,
                                    double*, index_t, bool, const double*, int);

template void gemm_prepacked<float>(index_t, const float*, index_t, const PackedB<float>&, float*, index_t,
                                    const float*, Activation, const float*, index_t, const PackedB<float>*, int);
template void gemm_prepacked<double>(index_t, const double*, index_t, const PackedB<double>&, double*, index_t,
                                     const double*, Activation, const double*, index_t, const PackedB<double>*, int);

}  // namespace dnnkit
