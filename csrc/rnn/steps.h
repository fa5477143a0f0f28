// The fused RNN's step machinery, shared by the drivers (rnn.cpp), the cells (cells.cpp) and the
// wavefront (wavefront.cpp): barriers and thread groups, the per-cell post-GEMM kernels and their
// derivatives, a step's products by micro-panel, the per-direction buffers and the work split.
#pragma once
#include "rnn.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>
#include <type_traits>
#include <vector>

#include "../eltwise/eltwise.h"
#include "../gemm/amx.h"
#include "../gemm/gemm.h"
#include "../gemm/pack.h"
#include "../gemm/ukernel.h"
#include "../work_share.h"
#include "fast_math.h"
#include "gates.h"
#include "../gemm/epilogue.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define DNNKIT_CPU_RELAX() _mm_pause()
#else
#define DNNKIT_CPU_RELAX() ((void)0)
#endif

namespace dnnkit {
namespace rnn_detail {

// Whether A W^T with m rows runs faster as gemm_small_m's unpacked dot products than through the packing
// GEMM: packing W costs a read and a write of it, which few rows do not repay, and more rows repay sooner
// when W is in cache (at 5 to 8 rows from W of about 0.75 MB, at 12 to 16 rows from about 3 MB:
// bench/log/2026-11-22-to-24.md, cells).
inline bool small_m_wins(index_t m, index_t n, index_t k, std::size_t elem) {
  const double w_bytes = double(n) * double(k) * double(elem);
  return k > 0 && (m <= 4 || (m <= 8 && w_bytes > (512 << 10)) || (m <= 16 && w_bytes > (2 << 20)));
}

// Whether A W^T with m rows and depth k runs faster on gemm_wt_direct (W read in place by the strided-A
// kernel) than on the packing GEMM: when the batch fills the kernel's tiles well enough (sa_batch_fits)
// and the depth is the kernel's min_depth or more (gemm_cpu.WtDirectGemm's rule).
template <typename T>
inline bool direct_wins(index_t m, index_t k) {
  const SaKernel<T> sk = select_sa_kernel<T>(active_isa(), m);
  return sk.fn && k >= sk.min_depth && sa_batch_fits(sk, m);
}

// A reusable barrier for the threads of one group (the threads running one direction). Each step
// synchronizes once; the work between barriers is microseconds, so waiting threads spin (and yield
// only after a long wait, in case the machine is oversubscribed).
class SpinBarrier {
 public:
  explicit SpinBarrier(int n = 1) : n_(n) {}
  void wait() {
    if (n_ <= 1) return;
    const unsigned gen = gen_.load(std::memory_order_acquire);
    if (count_.fetch_add(1, std::memory_order_acq_rel) == n_ - 1) {
      count_.store(0, std::memory_order_relaxed);
      gen_.fetch_add(1, std::memory_order_release);
      return;
    }
    for (unsigned spins = 0; gen_.load(std::memory_order_acquire) == gen; ++spins) {
      DNNKIT_CPU_RELAX();
      if (spins > kSpinsBeforeYield) std::this_thread::yield();
    }
  }

 private:
  static constexpr unsigned kSpinsBeforeYield = 1u << 16;
  int n_;
  alignas(64) std::atomic<int> count_{0};
  alignas(64) std::atomic<unsigned> gen_{0};
};

// How the threads of one parallel region split over the directions of a layer: with two directions
// and at least two threads, each direction gets its own group (no synchronization between them);
// otherwise one group runs the directions one after the other.
struct ThreadGroup {
  int group, tid, nt;  // group index (= direction when split), rank and size within the group
  int dir_begin, dir_end;
};

inline ThreadGroup thread_group(int tid, int nt, int dirs) {
  if (dirs == 2 && nt >= 2) {
    const int half = nt / 2;
    return tid < half ? ThreadGroup{0, tid, half, 0, 1} : ThreadGroup{1, tid - half, nt - half, 1, 2};
  }
  return ThreadGroup{0, tid, nt, 0, dirs};
}

// C (m x n, row stride ldc) := beta*C + A W^T + bias, A (m x k, row stride lda), W (n x k) row-major.
// The kernel is the one small_m_wins or direct_wins picks for `rows` rows (m by default; a part of a larger product
// passes the whole product's rows, so that every part sums in the same order).
template <typename T>
void gemm_a_wt(index_t m, index_t n, index_t k, const T* a, index_t lda, const T* w, T* c, index_t ldc,
               const T* bias, T beta, int nthreads = 0, index_t rows = -1) {
  GemmArgs<T> g = strided_gemm_args<T>(m, n, k, a, lda, 1, w, 1, k, c, ldc, beta);
  g.bias = bias;
  const index_t r = rows < 0 ? m : rows;
  // From 13 rows the strided-A kernel in a tile of at most 16 rows beats the dot kernels where it runs
  // (gemm_cpu's SmallMGemm.DIRECT_FROM).
  const bool direct = direct_wins<T>(r, k);
  const bool narrow_direct = direct && r >= 13 && select_sa_kernel<T>(active_isa(), r).nr <= 16;
  if (small_m_wins(r, n, k, sizeof(T)) && !narrow_direct)
    gemm_small_m<T>(g, nthreads);
  else if (direct)
    gemm_wt_direct<T>(g, nthreads);
  else
    gemm<T>(g, nthreads);
}

// C (m x n) := beta*C + A B for general strides.
template <typename T>
void gemm_strided(index_t m, index_t n, index_t k, const T* a, index_t rs_a, index_t cs_a, const T* b,
                  index_t rs_b, index_t cs_b, T* c, index_t ldc, T beta) {
  gemm<T>(strided_gemm_args<T>(m, n, k, a, rs_a, cs_a, b, rs_b, cs_b, c, ldc, beta));
}

// ------------------------------------------------------------------------------------ post-GEMM (forward)
// Each kernel handles one batch row and the hidden units [j0, j1). xp holds the row's gate pre-activations
// from the input (bias included), G blocks of H contiguous values each; gh those from h_{t-1} (no bias),
// or null when the recurrent product was accumulated into xp already. `save` (null in inference)
// receives the activated gates, `aux` the extra saved state.

// xp[j] + gh[j], or xp[j] alone when gh is null.
template <typename T>
inline T preact(const T* __restrict xp, const T* __restrict gh, index_t j) {
  return gh ? xp[j] + gh[j] : xp[j];
}

template <typename T>
void lstm_fwd(index_t H, index_t j0, index_t j1, const T* __restrict xp, const T* __restrict gh, const T* cp,
              T* c, T* __restrict h, T* __restrict save) {
  using namespace fastmath;
  for (index_t j = j0; j < j1; ++j) {
    const T i = sigmoid(preact(xp, gh, j)), f = sigmoid(preact(xp, gh, H + j));
    const T g = fastmath::tanh(preact(xp, gh, 2 * H + j)), o = sigmoid(preact(xp, gh, 3 * H + j));
    const T cn = f * cp[j] + i * g;  // cp may alias c (in-place state): read before write, same j
    c[j] = cn;
    h[j] = o * fastmath::tanh(cn);
    if (save) {
      save[j] = i;
      save[H + j] = f;
      save[2 * H + j] = g;
      save[3 * H + j] = o;
    }
  }
}

// GRU: r, z from xp + ghrz (ghrz null: summed into xp); n = tanh(xp_n + r * (ghn + b_hn));
// h = (1 - z) n + z h_{t-1}. save: r, z, n (3H); aux: ghn + b_hn (H).
template <typename T>
void gru_fwd(index_t H, index_t j0, index_t j1, const T* __restrict xp, const T* __restrict ghrz,
             const T* __restrict ghn, const T* __restrict bhn, const T* __restrict hp, T* __restrict h,
             T* __restrict save, T* __restrict aux) {
  using namespace fastmath;
  for (index_t j = j0; j < j1; ++j) {
    const T r = sigmoid(preact(xp, ghrz, j)), z = sigmoid(preact(xp, ghrz, H + j));
    const T hn = ghn[j] + bhn[j];
    const T n = fastmath::tanh(xp[2 * H + j] + r * hn);
    h[j] = n + z * (hp[j] - n);
    if (save) {
      save[j] = r;
      save[H + j] = z;
      save[2 * H + j] = n;
      aux[j] = hn;
    }
  }
}

template <typename T>
void rnn_fwd(bool relu, index_t j0, index_t j1, const T* __restrict xp, const T* __restrict gh, T* __restrict h) {
  for (index_t j = j0; j < j1; ++j) {
    const T a = preact(xp, gh, j);
    h[j] = relu ? fastmath::relu(a) : fastmath::tanh(a);
  }
}

// One forward step after its GEMMs, for the B batch rows and hidden units [j0, j1). Row r of each operand:
// xp + r*GH (the pre-activations: input projections with the bias, and with `summed` also W_hh h_{t-1},
// except GRU's gate n); gh + r*GH (W_hh h_{t-1} without `summed`, only its gate n block with it; null
// when h_{t-1} = 0); hprev + r*ldh (h_{t-1}, or null); cprev + r*H (c_{t-1}, or null); h + r*ldy (h_t,
// written); c + r*H (c_t, written; may be cprev); save + r*GH and aux + r*H (saved gates and GRU's
// W_hn h + b_hn, or null).
struct StepRows {
  RnnCell cell;
  index_t B, H;
  index_t j0, j1;
};

template <typename T>
void forward_rows(const StepRows& s, const T* xp, const T* gh, bool summed, const T* bhn, const T* hprev,
                  index_t ldh, const T* cprev, T* c, T* h, index_t ldy, T* save, T* aux, const T* zeros) {
  const index_t H = s.H, GH = rnn_gates(s.cell) * H;
  const GateKernels<T>* vk = gate_kernels<T>();  // null: the portable loops above
  for (index_t r = 0; r < s.B; ++r) {
    const T* xr = xp + r * GH;
    const T* gr = gh && !summed ? gh + r * GH : nullptr;  // what is still to be added to xr
    const T* gn = gh ? gh + r * GH + 2 * H : zeros;       // GRU: W_hn h_{t-1}
    T* hr = h + r * ldy;
    T* sr = save ? save + r * GH : nullptr;
    const T* cr = cprev ? cprev + r * H : zeros;
    const T* hp = hprev ? hprev + r * ldh : zeros;
    T* ar = aux ? aux + r * H : nullptr;
    const bool relu = s.cell == RnnCell::rnn_relu;
    if (vk) {
      if (s.cell == RnnCell::lstm) vk->lstm_fwd(H, s.j0, s.j1, xr, gr, cr, c + r * H, hr, sr);
      else if (s.cell == RnnCell::gru) vk->gru_fwd(H, s.j0, s.j1, xr, gr, gn, bhn, hp, hr, sr, ar);
      else vk->rnn_fwd(relu, s.j0, s.j1, xr, gr, hr);
      continue;
    }
    if (s.cell == RnnCell::lstm) lstm_fwd<T>(H, s.j0, s.j1, xr, gr, cr, c + r * H, hr, sr);
    else if (s.cell == RnnCell::gru) gru_fwd<T>(H, s.j0, s.j1, xr, gr, gn, bhn, hp, hr, sr, ar);
    else rnn_fwd<T>(relu, s.j0, s.j1, xr, gr, hr);
  }
}

// h_n and c_n (rows of H at h_n, c_n; either may be null) from the last step's h (row stride ldy) and c
// (row stride H), hidden units [j0, j1).
template <typename T>
void final_states(const StepRows& s, const T* h, index_t ldy, const T* c, T* h_n, T* c_n) {
  for (index_t r = 0; r < s.B; ++r) {
    if (h_n) std::copy(h + r * ldy + s.j0, h + r * ldy + s.j1, h_n + r * s.H + s.j0);
    if (c_n && s.cell == RnnCell::lstm) std::copy(c + r * s.H + s.j0, c + r * s.H + s.j1, c_n + r * s.H + s.j0);
  }
}

// The micro-panels of balanced_height rows that m rows of h_{t-1} make: with the panels of hidden units,
// the units of a step's work (unit u: panel u / blocks, rows from (u % blocks) * height).
inline index_t step_row_blocks(int mr, index_t m) {
  return ceil_div(std::max<index_t>(m, 1), static_cast<index_t>(balanced_height(mr, m)));
}

// h_{t-1} (m x k, row stride lda) packed for fused_step: micro-panels of balanced_height rows (the last
// possibly fewer), each stored k-major at its exact height, panel i at ap + i*k (m*k elements in all).
// The rows [i0, i1) (on panel boundaries) and columns [j0, j1) of it alone: the post-GEMM of step t
// writes its part of h_t so, from L1, into step t + 1's operand, rather than each thread packing all of
// h_t again from memory at the start of the step.
template <typename T>
void pack_a_balanced(int mr, index_t m, index_t k, const T* a, index_t lda, T* ap, index_t i0, index_t i1, index_t j0,
                     index_t j1) {
  const int h = balanced_height(mr, m);
  for (index_t i = i0; i < i1; i += h) {
    const int rows = static_cast<int>(std::min<index_t>(h, m - i));
    pack_a_panel<T>(rows, j1 - j0, a + i * lda + j0, lda, 1, rows, ap + i * k + j0 * rows);
  }
}
template <typename T>
void pack_a_balanced(const UKernel<T>& uk, index_t m, index_t k, const T* a, index_t lda, T* ap) {
  pack_a_balanced<T>(uk.mr, m, k, a, lda, ap, 0, m, 0, k);
}

// One step's recurrent products and post-GEMM for the units next_unit() returns until it returns -1: a
// unit is one micro-panel of h_{t-1} (step_row_blocks) against one panel of NR hidden units, so that a
// thread that finishes early takes over a few rows' worth of another's work, not a whole panel's (LSTM
// H256 B16 to B64, in-process A/B: 0.91-0.99 of the time). ap is h_{t-1} packed (pack_a_balanced),
// whh[q] gate q's W_hh^T packed. For each unit, the micro-kernel accumulates the products of all gates,
// over the whole depth at once, into the step's pre-activations xp (GRU's gate n, which the reset gate
// scales, into gh), and the post-GEMM of those rows and units follows while the tiles (MR x NR x G
// values, a few KB) are still in L1. The micro-kernel's C prefetch brings xp in during the product.
template <typename T, class NextUnit>
void fused_step(const StepRows& s, NextUnit&& next_unit, const T* ap, const PackedB<T>* whh, T* xp, T* gh,
                const T* bhn, const T* hprev, index_t ldh, const T* cprev, T* c, T* h, index_t ldy, T* save,
                T* aux, const T* zeros, T* hnext = nullptr) {
  const UKernel<T>& uk = whh[0].ukernel();
  const int G = rnn_gates(s.cell), mr = uk.mr, nr = uk.nr, hgt = balanced_height(mr, s.B);
  const index_t GH = G * s.H, K = whh[0].k();
  const bool gru = s.cell == RnnCell::gru;
  const index_t nrb = step_row_blocks(mr, s.B);
  for (index_t u = next_unit(); u >= 0; u = next_unit()) {
    const index_t jp = u / nrb, j = jp * nr, i = (u % nrb) * hgt;
    const int n_t = static_cast<int>(std::min<index_t>(nr, s.H - j));
    const int m_t = static_cast<int>(std::min<index_t>(hgt, s.B - i));
    const ukernel_fn<T> fn = m_t == mr ? uk.fn : uk.rows[m_t - 1];
    for (int q = 0; q < G; ++q) {
      const bool apart = gru && q == 2;
      fn(K, ap + i * K, whh[q].panel(jp), (apart ? gh : xp) + i * GH + q * s.H + j, GH, 1, T(1),
         apart ? T(0) : T(1), m_t, n_t, nullptr, false);
    }
    const StepRows part{s.cell, m_t, s.H, j, j + n_t};
    forward_rows<T>(part, xp + i * GH, gh ? gh + i * GH : nullptr, true, bhn, hprev ? hprev + i * ldh : nullptr,
                    ldh, cprev ? cprev + i * s.H : nullptr, c + i * s.H, h + i * ldy, ldy,
                    save ? save + i * GH : nullptr, aux ? aux + i * s.H : nullptr, zeros);
    if (hnext) pack_a_balanced<T>(mr, s.B, s.H, h, ldy, hnext, i, i + m_t, j, j + n_t);
  }
}

// Whether s may run its products on AMX tiles at all (RnnTiles): amx::active(), unless s.tiles is off.
inline bool rnn_tiles_active(const RnnShape& s) { return s.tiles != RnnTiles::off && amx::active(); }

// fused_step on AMX tiles (float32, gemm/amx.h): a unit is 32 rows of h_{t-1} (one A panel of ap, panels
// amx::panel_elems(K) apart) against 32 hidden units, every gate's 32 x 32 tile accumulated into xp (GRU's
// gate n into gh) over the whole depth, then the post-GEMM of those rows and units. The 32 units of h_t
// it writes are one depth step of step t + 1's A panels, packed into hnext while in L1.
template <class NextUnit>
void fused_step_amx(const StepRows& s, NextUnit&& next_unit, const amx::bf16* ap, amx::bf16* const* whh, index_t K,
                    float* xp, float* gh, const float* bhn, const float* hprev, index_t ldh, const float* cprev,
                    float* c, float* h, index_t ldy, float* save, float* aux, const float* zeros,
                    amx::bf16* hnext = nullptr) {
  const int G = rnn_gates(s.cell);
  const index_t GH = G * s.H, pe = amx::panel_elems(K), ns = amx::steps(K), hpe = amx::panel_elems(s.H);
  const bool gru = s.cell == RnnCell::gru;
  const index_t nrb = ceil_div(s.B, index_t(amx::kBlock));
  for (index_t u = next_unit(); u >= 0; u = next_unit()) {
    const index_t jp = u / nrb, j = jp * amx::kBlock, ip = u % nrb, i = ip * amx::kBlock;
    const int n_t = static_cast<int>(std::min<index_t>(amx::kBlock, s.H - j));
    const int m_t = static_cast<int>(std::min<index_t>(amx::kBlock, s.B - i));
    for (int q = 0; q < G; ++q) {
      const bool apart = gru && q == 2;
      amx::tile(ns, ap + ip * pe, whh[q] + jp * pe, (apart ? gh : xp) + i * GH + q * s.H + j, GH, 1, m_t, n_t, 1.f,
                apart ? 0.f : 1.f, nullptr, false);
    }
    const StepRows part{s.cell, m_t, s.H, j, j + n_t};
    forward_rows<float>(part, xp + i * GH, gh ? gh + i * GH : nullptr, true, bhn, hprev ? hprev + i * ldh : nullptr,
                        ldh, cprev ? cprev + i * s.H : nullptr, c + i * s.H, h + i * ldy, ldy,
                        save ? save + i * GH : nullptr, aux ? aux + i * s.H : nullptr, zeros);
    if (hnext) amx::pack_a_step(m_t, n_t, h + i * ldy + j, ldy, hnext + ip * hpe + jp * amx::kStepElems);
  }
}

// The columns [j0, j1) (whole blocks of 32; all of them by default) of h's m rows (row stride ldh, H
// wide) as depth steps of fused_step_amx's A panels.
inline void pack_h_amx(index_t m, index_t H, const float* h, index_t ldh, amx::bf16* ap, index_t j0 = 0,
                       index_t j1 = -1) {
  const index_t hpe = amx::panel_elems(H);
  for (index_t i = 0; i < m; i += amx::kBlock)
    for (index_t j = j0; j < (j1 < 0 ? H : j1); j += amx::kBlock)
      amx::pack_a_step(static_cast<int>(std::min<index_t>(amx::kBlock, m - i)), std::min<index_t>(amx::kBlock, H - j),
                       h + i * ldh + j, ldh, ap + i / amx::kBlock * hpe + j / amx::kBlock * amx::kStepElems);
}

// ----------------------------------------------------------------------------------- post-GEMM (backward)
// dh = dy + dhr is the gradient reaching h_t (from the output and from step t+1). Each kernel writes
// dg, the gradient of the gates' pre-activations (G blocks of H).

// LSTM: c_t = f c_{t-1} + i g, h_t = o tanh(c_t). dc (in: from step t+1, out: to step t-1).
template <typename T>
void lstm_bwd(index_t H, index_t j0, index_t j1, const T* __restrict dy, const T* __restrict dhr,
              const T* __restrict gates, const T* __restrict c, const T* __restrict cp, T* __restrict dc,
              T* __restrict dg) {
#pragma omp simd
  for (index_t j = j0; j < j1; ++j) {
    const T i = gates[j], f = gates[H + j], g = gates[2 * H + j], o = gates[3 * H + j];
    const T dh = dy[j] + dhr[j];
    const T tc = fastmath::tanh(c[j]);
    const T dct = dc[j] + dh * o * (T(1) - tc * tc);
    dc[j] = dct * f;
    dg[j] = dct * g * i * (T(1) - i);
    dg[H + j] = dct * cp[j] * f * (T(1) - f);
    dg[2 * H + j] = dct * i * (T(1) - g * g);
    dg[3 * H + j] = dh * tc * o * (T(1) - o);
  }
}

// GRU: dgx is the gradient of the input-side pre-activations (r, z, n), dgh of the hidden-side ones
// (r, z, W_hn h + b_hn); dhr is overwritten with the direct term dh * z of dh_{t-1}.
template <typename T>
void gru_bwd(index_t H, index_t j0, index_t j1, const T* __restrict dy, T* __restrict dhr,
             const T* __restrict gates, const T* __restrict hn, const T* __restrict hp, T* __restrict dgx,
             T* __restrict dgh) {
#pragma omp simd
  for (index_t j = j0; j < j1; ++j) {
    const T r = gates[j], z = gates[H + j], n = gates[2 * H + j];
    const T dh = dy[j] + dhr[j];
    const T dan = dh * (T(1) - z) * (T(1) - n * n);
    const T dar = dan * hn[j] * r * (T(1) - r);
    const T daz = dh * (hp[j] - n) * z * (T(1) - z);
    dhr[j] = dh * z;
    dgx[j] = dar;
    dgx[H + j] = daz;
    dgx[2 * H + j] = dan;
    dgh[j] = dar;
    dgh[H + j] = daz;
    dgh[2 * H + j] = dan * r;
  }
}

template <typename T>
void rnn_bwd(bool relu, index_t j0, index_t j1, const T* __restrict dy, const T* __restrict dhr,
             const T* __restrict h, T* __restrict dg) {
  if (relu) {
#pragma omp simd
    for (index_t j = j0; j < j1; ++j) dg[j] = h[j] > T(0) ? dy[j] + dhr[j] : T(0);
  } else {
#pragma omp simd
    for (index_t j = j0; j < j1; ++j) dg[j] = (dy[j] + dhr[j]) * (T(1) - h[j] * h[j]);
  }
}

// ------------------------------------------------------------------------------------------- drivers
// Per-direction buffers of the layer in flight, allocated once per call and reused by every layer.
template <typename T>
struct DirBuffers {
  AlignedBuffer<T> xp;       // (T*B, GH) input projections (forward)
  AlignedBuffer<T> gh;       // (B, GH) one step's hidden projections (forward)
  AlignedBuffer<T> bias;     // (GH) summed bias of the input projection; (H) b_hn after it for GRU
  AlignedBuffer<T> state;    // (B, H) LSTM cell state in inference; dh_{t-1} in backward
  AlignedBuffer<T> dstate;   // (B, H) dc (LSTM, backward)
  AlignedBuffer<T> dg, dgh;  // (T*B, GH) gate gradients (backward; dgh for GRU only)
  PackedB<T> whh[4];         // W_hh packed: per gate W_hh_q^T (forward), W_hh whole (backward)
  AlignedBuffer<amx::bf16> whh_amx[4];  // per gate W_hh_q^T as AMX B panels (float32 forward on tiles)
  // LSTM projection: W_hr packed (W_hr^T forward, W_hr backward); m_t in inference, dm_t in backward
  // (B, H); backward's dh_t of every step (T*B, P), which dW_hr reads.
  PackedB<T> whr;
  AlignedBuffer<T> m, dh;
};

// Hidden units [j0, j1) owned by rank `tid` of `nt` threads: contiguous blocks of NR columns.
struct Columns {
  index_t c0, c1;  // block range
  index_t j0, j1;  // column range
};

inline Columns owned_columns(index_t H, int nr, int tid, int nt) {
  const index_t blocks = ceil_div(H, nr);
  const Share s = even_share(blocks, tid, nt);
  return {s.lo, s.hi, std::min(H, s.lo * nr), std::min(H, s.hi * nr)};
}

inline int team_size(index_t H, int nr, int dirs) {
  // No more threads per direction than blocks of hidden units to share.
  const index_t blocks = ceil_div(std::max<index_t>(H, 1), nr);
  const int nt = get_num_threads();
  return static_cast<int>(std::max<index_t>(1, std::min<index_t>(nt, blocks * dirs)));
}

// A time-loop thread's share of a step: its batch rows [r0, r1) and its hidden units (own, H wide; own_s,
// the state's S columns). Split by rows: its own rows, all units; split by units: every row, its blocks.
struct StepShare {
  index_t r0, r1;
  Columns own, own_s;
};

inline StepShare step_share(bool by_rows, index_t B, index_t H, index_t S, bool proj, int nr, const ThreadGroup& tg) {
  const int part = by_rows ? 0 : tg.tid, parts = by_rows ? 1 : tg.nt;
  const Columns own = owned_columns(H, nr, part, parts);
  return {by_rows ? B * tg.tid / tg.nt : 0, by_rows ? B * (tg.tid + 1) / tg.nt : B, own,
          proj ? owned_columns(S, nr, part, parts) : own};
}

// ---- defined in cells.cpp: a single step from given states (a cell, or a sequence of one step).
template <typename T>
void fused_cell_step(const RnnShape& s, const RnnWeights<T>& w, int l, int d, const T* xl, const T* h0, const T* c0,
                     T* const* y, T* h_n, T* c_n, T* reserve, DirBuffers<T>& b, const T* zeros, bool dots);
bool cell_on_tiles(const RnnShape& s, index_t B, index_t I, const float* x, index_t S, const float* h0);
void fused_cell_step_amx(const RnnShape& s, const RnnWeights<float>& w, int l, int d, const float* xl,
                         const float* h0, const float* c0, float* const* y, float* h_n, float* c_n, float* reserve,
                         DirBuffers<float>& b, const float* zeros);
template <typename T>
bool fused_packed_cell_fits(const RnnShape& s, const RnnWeights<T>& w);
template <typename T>
void fused_packed_cell_step(const RnnShape& s, const RnnWeights<T>& w, const T* x, const T* h0, const T* c0,
                            T* const* y, T* h_n, T* c_n, T* reserve, DirBuffers<T>& b, const T* zeros);
template <typename T>
bool rnn_amx_fits(const RnnShape& s, const RnnWeights<T>& w, const T* h0);

// ---- defined in wavefront.cpp: a unidirectional stack pipelined, one thread a layer.
template <typename T>
void rnn_forward_wavefront(const RnnShape& s, const RnnWeights<T>& w, const T* x, const T* h0, const T* c0,
                           T* const* y, T* h_n, T* c_n, T* reserve, int nw);

}  // namespace rnn_detail
}  // namespace dnnkit
