// Fused RNN forward and backward through time (rnn.h): the drivers, the per-cell post-GEMM kernels and
// their derivatives.
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
namespace {

// Whether A W^T with m rows runs faster as gemm_small_m's unpacked dot products than through the packing
// GEMM: packing W costs a read and a write of it, which few rows do not repay, and more rows repay sooner
// when W is in cache. Measured on AVX-512, 2 threads (W n x k float32, the cells' products, in-process
// A/B): at 5 to 8 rows the dot products win from W of 0.75 MB (0.67-0.79 of the packing GEMM's time,
// H256) and lose on 512 KB or less (1.2-1.36, H32-H128); at 12 and 16 rows they win from 3 MB
// (0.74-0.85, H512) and tie or lose below it (2 MB at 16 rows: 1.14).
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

ThreadGroup thread_group(int tid, int nt, int dirs) {
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
// writes its part of h_t so, from L1, into step t + 1's operand, where each thread packed all of h_t
// at the start of the step (LSTM, H256, batch 16 and 64: 2-3% of the time).
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

// Whether the RNN kernels (time loop, packed cells) take AMX tiles: amx::active(), unless
// DNNKIT_RNN_AMX=0.
inline bool rnn_tiles_active() {
  const char* e = std::getenv("DNNKIT_RNN_AMX");
  return !(e && e[0] == '0') && amx::active();
}

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

Columns owned_columns(index_t H, int nr, int tid, int nt) {
  const index_t blocks = ceil_div(H, nr);
  const index_t c0 = blocks * tid / nt, c1 = blocks * (tid + 1) / nt;
  return {c0, c1, std::min(H, c0 * nr), std::min(H, c1 * nr)};
}

int team_size(index_t H, int nr, int dirs) {
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

StepShare step_share(bool by_rows, index_t B, index_t H, index_t S, bool proj, int nr, const ThreadGroup& tg) {
  const int part = by_rows ? 0 : tg.tid, parts = by_rows ? 1 : tg.nt;
  const Columns own = owned_columns(H, nr, part, parts);
  return {by_rows ? B * tg.tid / tg.nt : 0, by_rows ? B * (tg.tid + 1) / tg.nt : B, own,
          proj ? owned_columns(S, nr, part, parts) : own};
}

}  // namespace

index_t rnn_reserve_elems_per_dir(const RnnShape& s) {
  const index_t tbh = s.seq * s.batch * s.hidden;
  switch (s.cell) {
    case RnnCell::lstm: return tbh * (s.proj > 0 ? 6 : 5);
    case RnnCell::gru: return tbh * 4;
    default: return 0;
  }
}

index_t rnn_reserve_elems(const RnnShape& s) {
  return rnn_reserve_elems_per_dir(s) * s.layers * s.dirs;
}

namespace {

// ------------------------------------------------------------------------------- wavefront (forward)
// A unidirectional multi-layer RNN whose steps are too small for the threads to share one step (the
// per-step barrier and the split GEMM cost more than they save) runs as a pipeline instead: thread
// l % nw runs layer l on its own, a chunk of steps at a time, so that layer l works on chunk c while
// layer l - 1 works on chunk c + 1. A chunk's input projections are one GEMM on W_ih packed once, and
// the threads meet once per chunk rather than once per step. Every element is summed in the order the
// layer-by-layer driver uses, so the results are identical.
constexpr index_t kWaveChunks = 16;  // chunks per sequence: the pipeline fills in L - 1 of them
// Used when each layer's W_hh is small: above it, two cores sharing each step's GEMM (reading half of
// W_hh each) are faster (bench/rnn_wavefront.py; the tuner times both).
constexpr index_t kWaveMaxWhhBytes = index_t(256) << 10;

// Splitting a step by batch rows: each thread reads all of W_hh every step, which pays where W_hh stays
// in its L2 and each thread takes kRowSplitMinRows rows or more. A stack of layers pipelines as a
// wavefront instead below kRowSplitWaveRows rows a thread (bench/rnn_wavefront.py compares the three
// schedules; the tuner times them: fused_units, fused_rows, fused_wavefront).
constexpr index_t kRowSplitMinRows = 4;
constexpr index_t kRowSplitWaveRows = 8;

template <typename T>
struct WaveLayer {
  AlignedBuffer<T> xp;     // (C*B, GH) input projections of the chunk in flight
  AlignedBuffer<T> gh;     // (B, GH) one step's hidden projections
  AlignedBuffer<T> bias;   // (GH) summed input bias; (H) b_hn after it for GRU
  AlignedBuffer<T> state;  // (B, H) LSTM cell state when no reserve is kept
  AlignedBuffer<T> ap;     // h_{t-1} packed as the micro-kernel's A operand
  AlignedBuffer<T> axp;    // the chunk's inputs packed as the micro-kernel's A operand
  PackedB<T> wih;          // W_ih^T, packed once (the chunks' input projections)
  PackedB<T> whh[4];
};

template <typename T>
void rnn_forward_wavefront(const RnnShape& s, const RnnWeights<T>& w, const T* x, const T* h0, const T* c0,
                           T* const* y, T* h_n, T* c_n, T* reserve, int nt) {
  const index_t Tn = s.seq, B = s.batch, H = s.hidden;
  const int G = rnn_gates(s.cell), L = s.layers;
  const index_t GH = G * H;
  const bool lstm = s.cell == RnnCell::lstm, gru = s.cell == RnnCell::gru;
  const UKernel<T> uk = select_ukernel<T>(active_isa());
  const index_t per_dir = rnn_reserve_elems_per_dir(s);
  const index_t C = ceil_div(Tn, kWaveChunks), chunks = ceil_div(Tn, C);
  const int nw = std::min(nt, L);

  // Whether a layer's input projections run as gemm_a_wt would run them for the whole sequence (on W_ih
  // in place: gemm_small_m or gemm_wt_direct, whose sums do not depend on the rows); otherwise on W_ih
  // packed once, by the blocked GEMM's k blocks.
  auto unpacked_ih = [&](index_t Il) {
    return Il == 0 || small_m_wins(Tn * B, GH, Il, sizeof(T)) || direct_wins<T>(Tn * B, Il);
  };
  std::vector<WaveLayer<T>> lay(static_cast<std::size_t>(L));
  AlignedBuffer<T> zeros(static_cast<std::size_t>(GH));
  std::fill(zeros.data(), zeros.data() + GH, T(0));
  for (int l = 0; l < L; ++l) {
    WaveLayer<T>& b = lay[l];
    b.xp.resize(static_cast<std::size_t>(C * B * GH));
    b.gh.resize(static_cast<std::size_t>(B * GH));
    b.bias.resize(static_cast<std::size_t>(GH + H));
    b.ap.resize(static_cast<std::size_t>(packed_a_elems(uk, B, H)));
    if (lstm && !reserve) b.state.resize(static_cast<std::size_t>(B * H));
    const T *bih = w.b_ih[l], *bhh = w.b_hh[l];
    T* bias = b.bias.data();
    for (index_t j = 0; j < GH; ++j)
      bias[j] = (bih ? bih[j] : T(0)) + (bhh && !(gru && j >= 2 * H) ? bhh[j] : T(0));
    for (index_t j = 0; j < H; ++j) bias[GH + j] = gru && bhh ? bhh[2 * H + j] : T(0);
    for (int q = 0; q < G; ++q) b.whh[q].pack(H, H, w.w_hh[l] + q * H * H, 1, H);
    const index_t Il = s.input_of(l);
    if (!unpacked_ih(Il)) {
      b.wih.pack(Il, GH, w.w_ih[l], 1, Il);
      b.axp.resize(static_cast<std::size_t>(packed_a_elems(uk, C * B, Il)));
    }
  }

  // Layer l, steps [t0, t1) on one thread: the input projections, the steps, and after the last chunk
  // the final states. What it reads of layer l - 1 was written in an earlier round.
  const StepRows step{s.cell, B, H, 0, H};
  auto run_chunk = [&](int l, index_t t0, index_t t1) {
    WaveLayer<T>& b = lay[l];
    const index_t Il = s.input_of(l);
    const T* xl = l == 0 ? x : y[l - 1];
    T* yl = y[l];
    T* save = reserve ? reserve + l * per_dir : nullptr;  // (T, B, GH) gates
    T* aux = reserve ? save + Tn * B * GH : nullptr;       // (T, B, H) c_t or W_hn h + b_hn
    const T* bhn = b.bias.data() + GH;
    // The input projections of the chunk, summed in the order the whole sequence's GEMM would use
    // (gemm_a_wt's choice for T*B rows), so that the results equal the layer-by-layer driver's.
    const index_t rows = (t1 - t0) * B;
    const T* xc = xl + t0 * B * Il;
    T* xp = b.xp.data();
    if (unpacked_ih(Il)) {
      gemm_a_wt<T>(rows, GH, Il, xc, Il, w.w_ih[l], xp, GH, b.bias.data(), T(0), 1, Tn * B);
    } else {
      pack_a_rows<T>(uk, rows, Il, xc, Il, 1, b.axp.data());
      gemm_packed_b<T>(rows, b.axp.data(), b.wih, 0, b.wih.panels(), T(0), xp, GH, false, b.bias.data());
    }
    for (index_t t = t0; t < t1; ++t) {
      const T* hprev = t == 0 ? (h0 ? h0 + l * B * H : nullptr) : yl + (t - 1) * B * H;
      const T* cprev = t == 0 ? (c0 ? c0 + l * B * H : nullptr) : (aux ? aux + (t - 1) * B * H : b.state.data());
      T* xpt = b.xp.data() + (t - t0) * B * GH;
      T* ct = aux ? aux + t * B * H : b.state.data();
      T* st = save ? save + t * B * GH : nullptr;
      T* at = aux ? aux + t * B * H : nullptr;
      if (hprev) {
        pack_a_balanced<T>(uk, B, H, hprev, H, b.ap.data());
        index_t u = 0;
        const index_t units = b.whh[0].panels() * step_row_blocks(uk.mr, B);
        fused_step<T>(step, [&] { return u < units ? u++ : index_t(-1); }, b.ap.data(), b.whh, xpt, b.gh.data(), bhn, hprev, H,
                      cprev, ct, yl + t * B * H, H, st, at, zeros.data());
      } else {
        forward_rows<T>(step, xpt, nullptr, false, bhn, hprev, H, cprev, ct, yl + t * B * H, H, st, at,
                        zeros.data());
      }
    }
    if (t1 == Tn)
      final_states<T>(step, yl + (Tn - 1) * B * H, H, aux ? aux + (Tn - 1) * B * H : b.state.data(),
                      h_n ? h_n + l * B * H : nullptr, c_n ? c_n + l * B * H : nullptr);
  };

  SpinBarrier barrier(nw);
#pragma omp parallel num_threads(nw)
  {
    const int tid = thread_id();
    for (index_t round = 0; round < chunks + L - 1; ++round) {
      for (int l = tid; l < L; l += nw) {
        const index_t c = round - l;
        if (c >= 0 && c < chunks) run_chunk(l, c * C, std::min(Tn, (c + 1) * C));
      }
      barrier.wait();  // every chunk of this round is complete before the next layer reads it
    }
  }
}

}  // namespace

bool rnn_splits_rows(const RnnShape& s, index_t elem_size) {
  const int threads = get_num_threads(), group = s.dirs == 2 ? threads / 2 : threads;
  if (group < 2 || s.seq < 2 || s.batch < kRowSplitMinRows * group) return false;
  if (s.schedule != RnnSchedule::automatic) return s.schedule == RnnSchedule::rows;
  return rnn_gates(s.cell) * s.hidden * s.state() * elem_size <= static_cast<index_t>(l2_cache_bytes());
}

bool rnn_uses_wavefront(const RnnShape& s, index_t elem_size) {
  const bool possible = s.dirs == 1 && s.layers >= 2 && s.seq >= 2 && s.batch > 0 && s.hidden > 0 &&
                        s.proj == 0 && get_num_threads() >= 2;
  if (!possible) return false;
  if (s.schedule != RnnSchedule::automatic) return s.schedule == RnnSchedule::wavefront;
  // Split by rows, the layers' threads never wait for each other, and every layer uses every thread
  // (2 threads, batch 16 and 64: the same time as the wavefront at 2 layers, 0.8 of it at 3).
  const int group = get_num_threads();  // one direction: every thread
  if (rnn_splits_rows(s, elem_size) && s.batch >= kRowSplitWaveRows * group) return false;
  return rnn_gates(s.cell) * s.hidden * s.hidden * elem_size <= kWaveMaxWhhBytes;
}

// A single step of layer l, direction d, with h0 (a cell, or a sequence of one step): the products of
// every gate by gemm_wt_direct_cell (or, with `dots`, gemm_small_m_cell), and for each block of hidden units the post-GEMM and the final
// states on the thread that computed its pre-activations. b.bias holds the summed biases (and GRU's b_hn).
template <typename T>
void fused_cell_step(const RnnShape& s, const RnnWeights<T>& w, int l, int d, const T* xl, const T* h0, const T* c0,
                     T* const* y, T* h_n, T* c_n, T* reserve, DirBuffers<T>& b, const T* zeros, bool dots) {
  const index_t B = s.batch, H = s.hidden, S = s.state(), Il = s.input_of(l);
  const int G = rnn_gates(s.cell), li = l * s.dirs + d;
  const index_t GH = G * H;
  const bool gru = s.cell == RnnCell::gru;
  T* const save = reserve ? reserve + li * rnn_reserve_elems_per_dir(s) : nullptr;  // (1, B, GH) gates
  T* const aux = reserve ? save + B * GH : nullptr;  // (1, B, H) c_t or W_hn h + b_hn
  struct Ctx {
    StepRows step;
    const T *xp, *gh, *bhn, *hprev, *cprev, *zeros;
    T *c, *h, *save, *aux, *h_n, *c_n;
    index_t ldy;
  } ctx{{s.cell, B, H, 0, 0}, b.xp.data(), gru ? b.gh.data() : nullptr, b.bias.data() + GH, h0 + li * B * S,
        c0 ? c0 + li * B * H : nullptr, zeros, nullptr, y[l] + d * S, save, aux,
        h_n ? h_n + li * B * S : nullptr, c_n ? c_n + li * B * H : nullptr,
        index_t(s.dirs) * S};
  // c_t goes to the reserve in training; in inference straight into c_n (no copy), else to scratch.
  ctx.c = aux ? aux : (ctx.c_n ? ctx.c_n : b.state.data());
  if (ctx.c == ctx.c_n) ctx.c_n = nullptr;
  CellDone done = [](void* p, index_t j0, index_t j1) {
    const Ctx& c = *static_cast<const Ctx*>(p);
    StepRows step = c.step;
    step.j0 = j0;
    step.j1 = j1;
    forward_rows<T>(step, c.xp, c.gh, true, c.bhn, c.hprev, step.H, c.cprev, c.c, c.h, c.ldy, c.save, c.aux, c.zeros);
    final_states<T>(step, c.h, c.ldy, c.c, c.h_n, c.c_n);
  };
  // Gate q's rows of W_ih and W_hh into column block q of xp, with its bias; GRU's gate n from the
  // input apart from gate n from h (into gh), which the reset gate scales.
  const T *wih = w.w_ih[li], *whh = w.w_hh[li], *bias = b.bias.data();
  T* xp = b.xp.data();
  CellGroup<T> groups[4];
  int ng = 0;
  for (int q = 0; q < G; ++q) {
    if (gru && q == 2) break;
    groups[ng++] = {wih + q * H * Il, Il, whh + q * H * S, S, xp + q * H, GH, bias + q * H};
  }
  if (gru) {
    groups[ng++] = {wih + 2 * H * Il, Il, nullptr, S, xp + 2 * H, GH, bias + 2 * H};
    groups[ng++] = {nullptr, Il, whh + 2 * H * S, S, b.gh.data() + 2 * H, GH, nullptr};
  }
  if (dots)
    gemm_small_m_cell<T>(B, H, Il, xl, Il, S, h0 + li * B * S, S, groups, ng, done, &ctx);
  else
    gemm_wt_direct_cell<T>(B, H, Il, xl, Il, S, h0 + li * B * S, S, groups, ng, done, &ctx);
}

// Where a cell's outputs go (one layer-direction: reserve and c_n already at its part, or null): the
// gates and c_t (or W_hn h + b_hn) to the reserve in training; in inference c_t straight into c_n (then
// not copied again), else to scratch. And its threads: no more than its panels of hidden units, one for
// a small product (depth: the product's, I + S).
template <typename T>
struct CellOut {
  T *save, *aux, *c, *c_n;
  int nt;
};
template <typename T>
CellOut<T> cell_out(const RnnShape& s, index_t panels, index_t depth, T* c_n, T* reserve, DirBuffers<T>& b) {
  const index_t GH = rnn_gates(s.cell) * s.hidden;
  CellOut<T> o;
  o.save = reserve;                                     // (1, B, GH) gates
  o.aux = reserve ? o.save + s.batch * GH : nullptr;  // (1, B, H) c_t or W_hn h + b_hn
  o.c = o.aux ? o.aux : (c_n ? c_n : b.state.data());
  o.c_n = o.c == c_n ? nullptr : c_n;
  o.nt = static_cast<int>(std::max<index_t>(1, std::min<index_t>(get_num_threads(), panels)));
  if (double(s.batch) * double(GH) * double(depth) < min_parallel_work()) o.nt = 1;
  return o;
}

// fn(hx, ip, i, rows) for each 32-row panel ip of a cell's x (hx false) and then h0's (hx true), rows
// [i, i + rows) of B, dealt to the threads of the region in turn; the caller's barrier follows.
template <class F>
void for_each_xh_panel(index_t B, F&& fn) {
  const index_t panels = ceil_div(B, index_t(amx::kBlock));
  for (index_t u = thread_id(); u < 2 * panels; u += thread_count()) {
    const bool hx = u >= panels;
    const index_t ip = hx ? u - panels : u, i = ip * amx::kBlock;
    fn(hx, ip, i, static_cast<int>(std::min<index_t>(amx::kBlock, B - i)));
  }
}

// A float32 cell on weights in place on AMX tiles, the weights as the A operand: the product is C^T =
// W [x | h]^T, so that 32 rows of a weight become an A panel by the split alone (the tile unit's A is
// row-major in depth, as W is), where as the B operand every 16 x 16 block of them would also be
// transposed; x and h, a few rows, are packed once as B panels and stay in L2. The split of the weights
// at every call (read from L3 and written to L2 as three parts) runs between the tile products
// (fused_cell_step_amx) and is repaid by the batch from 64 rows where I + H >= 512, from 96 below
// (bench/cell_tiles.py against the FMA kernels). A batch whose B panels pass 3/4 of L2 stays on the
// FMA kernels or the blocked GEMM.
bool cell_on_tiles(index_t B, index_t I, const float* x, index_t S, const float* h0) {
  if (!rnn_tiles_active() || !h0 || B < 64 || (I + S < 512 && B < 96)) return false;
  const double panel_bytes = double(ceil_div(B, index_t(amx::kBlock))) *
                             double(amx::panel_elems(I) + amx::panel_elems(S)) * sizeof(amx::bf16);
  if (panel_bytes > 0.75 * double(l2_cache_bytes())) return false;
  return amx::splittable(B, I, x, I, 1) && amx::splittable(B, S, h0, S, 1);
}

// fused_cell_step on the tiles (cell_on_tiles): for each block of 32 hidden units, gate by gate, the
// gate's 32 rows of W_ih and W_hh split into one thread's A panels, then for each 32-row panel of the
// batch one tile summing W_ih x^T and W_hh h^T from the bias (GRU's gate n: the two apart, h's into gh),
// stored batch-major into xp; then the post-GEMM and final states of the block. Each gate's split runs
// between the tile products of the gate before (amx::SplitQueue; the next block's first gate during
// this one's last), into a second copy of the panels; where two copies do not fit in L2 beside the B
// panels, the gate runs in halves instead, W_ih's tiles while W_hh's rows are split and W_hh's (started
// from the tile W_ih's stored) while the next W_ih's are (bench/cell_tiles.py). A block whose weights
// do not split exactly runs on the FMA dot products instead (gemm_small_m; the block alone: the outputs
// are float32's either way).
void fused_cell_step_amx(const RnnShape& s, const RnnWeights<float>& w, int l, int d, const float* xl,
                         const float* h0, const float* c0, float* const* y, float* h_n, float* c_n, float* reserve,
                         DirBuffers<float>& b, const float* zeros) {
  const index_t B = s.batch, H = s.hidden, S = s.state(), I = s.input_of(l);
  const int G = rnn_gates(s.cell), li = l * s.dirs + d;
  const index_t GH = G * H, ldy = index_t(s.dirs) * S;
  const bool gru = s.cell == RnnCell::gru;
  const float* const hp = h0 + li * B * S;
  const float* const cp = c0 ? c0 + li * B * H : nullptr;
  float* const h = y[l] + d * S;
  float* const hn = h_n ? h_n + li * B * S : nullptr;
  const index_t units = ceil_div(H, index_t(amx::kBlock)), batch_panels = ceil_div(B, index_t(amx::kBlock));
  const CellOut<float> o = cell_out(s, units, I + S, c_n ? c_n + li * B * H : nullptr,
                                    reserve ? reserve + li * rnn_reserve_elems_per_dir(s) : nullptr, b);
  float *const save = o.save, *const aux = o.aux, *const c = o.c, *const cn = o.c_n;
  const int nt = o.nt;
  const float *const wih = w.w_ih[li], *const whh = w.w_hh[li], *const bias = b.bias.data();
  float *const xp = b.xp.data(), *const gh = b.gh.data();
  const index_t pe_x = amx::panel_elems(I), pe_h = amx::panel_elems(S), ns_x = amx::steps(I), ns_h = amx::steps(S);
  AlignedBuffer<amx::bf16> bpanels(static_cast<std::size_t>(batch_panels * (pe_x + pe_h)));  // x^T, h^T
  // A gate's W_ih and W_hh rows, twice where two copies and the B panels fit in 3/5 of L2 (the next gate
  // split while the tiles run this one's, one tile for both products), else once (the halves in turn).
  const index_t pe_a = pe_x + pe_h;
  const bool halves =
      double((2 + batch_panels) * pe_a) * sizeof(amx::bf16) > 0.6 * double(l2_cache_bytes());
  AlignedBuffer<amx::bf16> apanels(static_cast<std::size_t>(nt * (halves ? 1 : 2) * pe_a));
  amx::bf16 *const bx = bpanels.data(), *const bh = bx + batch_panels * pe_x;
  std::optional<PanelShare> share;
  if (nt > 1) share.emplace(nt, units);
  const bool reverse = alternate_direction(wih);
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    const int tid = thread_id();
    for_each_xh_panel(B, [&](bool hx, index_t ip, index_t i, int cols) {  // x^T and h0^T as B panels
      if (hx)
        amx::pack_b_panel(S, cols, hp + i * S, 1, S, bh + ip * pe_h);
      else
        amx::pack_b_panel(I, cols, xl + i * I, 1, I, bx + ip * pe_x);
    });
#pragma omp barrier
    const amx::TileScope tiles;
    amx::bf16* const abuf = apanels.data() + tid * (halves ? 1 : 2) * pe_a;
    amx::SplitQueue queue;
    // Item t of a block: gate t's products (panels at slot 0 and 1 in turn); with `halves`, gate t / 2's
    // W_ih products (t even) or W_hh products (t odd), from slot 0's W_ih and W_hh panels. The rows of
    // the item after are split while the tiles run this one's (the next block's first: asked for early).
    auto queue_item = [&](index_t jp, int t, int slot) {
      const index_t j0 = jp * amx::kBlock, row = (halves ? t / 2 : t) * H + j0;
      const int n_u = static_cast<int>(std::min<index_t>(amx::kBlock, H - j0));
      amx::bf16* const a = abuf + slot * pe_a;
      if (!halves || t % 2 == 0) queue.add(n_u, I, wih + row * I, I, a);
      if (!halves || t % 2 == 1) queue.add(n_u, S, whh + row * S, S, a + pe_x);
    };
    const int items = halves ? 2 * G : G;
    UnitCursor cursor(share ? &*share : nullptr, units, reverse);
    index_t jp = cursor.next();
    int slot = 0;
    bool item_ok = true;
    if (jp >= 0) {  // the first item's split alone
      queue_item(jp, 0, slot);
      item_ok = queue.finish();
    }
    while (jp >= 0) {
      const index_t j0 = jp * amx::kBlock;
      const int n_u = static_cast<int>(std::min<index_t>(amx::kBlock, H - j0));
      bool split = true;
      index_t next = -1;
      for (int t = 0; t < items; ++t) {
        split = split && item_ok;
        const int to = halves ? 0 : slot ^ 1;
        queue.clear();
        if (t + 1 < items)
          queue_item(jp, t + 1, to);
        else if ((next = cursor.next()) >= 0)
          queue_item(next, 0, to);
        const int q = halves ? t / 2 : t;
        const bool ih = !halves || t % 2 == 0, hh = !halves || t % 2 == 1;
        const bool apart = gru && q == 2;  // GRU's gate n: W_hn h apart, into gh, which the reset gate scales
        // Row steps of the split to run after every four tile products, so that it ends with them.
        const int side =
            static_cast<int>(ceil_div(queue.left(), 6 * batch_panels * ((ih ? ns_x : 0) + (hh ? ns_h : 0))));
        const amx::bf16 *const aih = abuf + slot * pe_a, *const ahh = aih + pe_x;
        const index_t row = q * H + j0;
        for (index_t ip = 0; split && ip < batch_panels; ++ip) {
          const index_t i = ip * amx::kBlock;
          const int m_b = static_cast<int>(std::min<index_t>(amx::kBlock, B - i));
          float* const xq = xp + i * GH + row;
          if (ih && hh && !apart) {
            amx::tile_t(ns_x, aih, bx + ip * pe_x, xq, GH, n_u, m_b, bias + row, ns_h, ahh, bh + ip * pe_h, &queue,
                        side);
            continue;
          }
          if (ih) amx::tile_t(ns_x, aih, bx + ip * pe_x, xq, GH, n_u, m_b, bias + row, 0, nullptr, nullptr, &queue, side);
          if (hh)  // onto W_ih's sum (float32, stored and loaded back exactly: the same bits), or into gh
            amx::tile_t(ns_h, ahh, bh + ip * pe_h, apart ? gh + i * GH + row : xq, GH, n_u, m_b, nullptr, 0, nullptr,
                        nullptr, &queue, side, !apart);
        }
        item_ok = queue.finish();
        slot = to;
      }
      if (!split) {  // every gate of the block again, on the FMA dot products (no workspace, this thread)
        for (int q = 0; q < G; ++q) {
          const index_t row = q * H + j0;
          const bool apart = gru && q == 2;
          GemmArgs<float> g = strided_gemm_args<float>(B, n_u, I, xl, I, 1, wih + row * I, 1, I, xp + row, GH, 0.f);
          g.bias = bias + row;
          gemm_small_m<float>(g, 1);
          g = strided_gemm_args<float>(B, n_u, S, hp, S, 1, whh + row * S, 1, S, (apart ? gh : xp) + row, GH,
                                       apart ? 0.f : 1.f);
          gemm_small_m<float>(g, 1);
        }
      }
      const StepRows step{s.cell, B, H, j0, j0 + n_u};
      forward_rows<float>(step, xp, gru ? gh : nullptr, true, bias + GH, hp, S, cp, c, h, ldy, save, aux, zeros);
      final_states<float>(step, h, ldy, c, hn, cn);
      jp = next;
    }
  }
}

// A cell on weights packed by the caller (RnnWeights::packed_ih, packed_hh) whose gates' blocks of NR
// hidden units are whole panels (H a multiple of NR) and whose batch is one block of rows, as
// gemm_prepacked takes it: for each block of NR hidden units, every gate's products (x W_ih^T, then
// h W_hh^T added and the bias in the last store; GRU's W_hn h apart, into gh) and then the post-GEMM
// and final states, on one thread, as fused_cell_step does on weights in place.
template <typename T>
bool fused_packed_cell_fits(const RnnShape& s, const RnnWeights<T>& w) {
  if (!w.packed_ih || s.proj > 0 || s.seq != 1 || s.layers != 1 || s.dirs != 1) return false;
  const UKernel<T>& uk = w.packed_ih->ukernel();
  return s.hidden % uk.nr == 0 && s.batch <= std::max(uk.mr, 256 / uk.mr * uk.mr) && s.input > 0 &&
         w.packed_hh->ukernel().fn == uk.fn;
}

// fused_packed_cell_step on AMX tiles (float32): both weights packed a second time into bfloat16 parts
// (PackedB::pack_amx), a batch that fills 3/4 of a 32-row tile or more, x and h0 split exactly. x and h0
// packed once as tile panels; for each 32-unit panel of hidden units, every row panel's gate tiles sum x
// W_ih^T and h W_hh^T (GRU's gate n: the two apart, h's into gh) with the bias, one load and store of
// the tiles each, then the post-GEMM.
bool packed_cell_on_tiles(const RnnShape& s, const RnnWeights<float>& w, const float* x, const float* h0) {
  if (!rnn_tiles_active() || !w.packed_ih->amx_panel(0) || !w.packed_hh->amx_panel(0) || !h0 ||
      4 * s.batch < 3 * amx::kBlock)
    return false;
  return amx::splittable(s.batch, s.input, x, s.input, 1) && amx::splittable(s.batch, s.hidden, h0, s.hidden, 1);
}

void fused_packed_cell_step_amx(const RnnShape& s, const RnnWeights<float>& w, const float* x, const float* h0,
                                const float* c0, float* const* y, float* h_n, float* c_n, float* reserve,
                                DirBuffers<float>& b, const float* zeros) {
  const index_t B = s.batch, H = s.hidden, I = s.input;
  const int G = rnn_gates(s.cell);
  const index_t GH = G * H;
  const bool gru = s.cell == RnnCell::gru;
  const PackedB<float>& wih = *w.packed_ih;
  const PackedB<float>& whh = *w.packed_hh;
  const index_t gate_panels = H / amx::kBlock, row_panels = ceil_div(B, index_t(amx::kBlock));
  const index_t pe_x = amx::panel_elems(I), pe_h = amx::panel_elems(H);
  const CellOut<float> o = cell_out(s, gate_panels, s.input + s.hidden, c_n, reserve, b);
  float *const save = o.save, *const aux = o.aux, *const c = o.c, *const h = y[0];
  c_n = o.c_n;
  const int nt = o.nt;
  float *const xp = b.xp.data(), *const gh = b.gh.data();
  const float* const bias = b.bias.data();
  AlignedBuffer<amx::bf16> ap(static_cast<std::size_t>(row_panels * (pe_x + pe_h)));
  amx::bf16* const ax = ap.data();
  amx::bf16* const ah = ap.data() + row_panels * pe_x;
  std::optional<PanelShare> share;
  if (nt > 1) share.emplace(nt, gate_panels);
  const bool reverse = alternate_direction(&wih);
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    for_each_xh_panel(B, [&](bool hx, index_t ip, index_t i, int rows) {  // x and h0 as A panels
      if (hx)
        amx::pack_a_panel(rows, H, h0 + i * H, H, 1, ah + ip * pe_h);
      else
        amx::pack_a_panel(rows, I, x + i * I, I, 1, ax + ip * pe_x);
    });
#pragma omp barrier
    const amx::TileScope tiles;
    for_each_unit(share ? &*share : nullptr, gate_panels, reverse, [&](index_t jp) {
      for (index_t ip = 0; ip < row_panels; ++ip) {
        const index_t i = ip * amx::kBlock;
        const int m_t = static_cast<int>(std::min<index_t>(amx::kBlock, B - i));
        for (int q = 0; q < G; ++q) {
          const index_t p = q * gate_panels + jp, j = q * H + jp * amx::kBlock;
          if (gru && q == 2) {  // gate n: W_hn h apart, into gh, which the reset gate scales
            amx::tile(amx::steps(I), ax + ip * pe_x, wih.amx_panel(p), xp + i * GH + j, GH, 1, m_t, amx::kBlock,
                      1.f, 0.f, bias + j, false);
            amx::tile(amx::steps(H), ah + ip * pe_h, whh.amx_panel(p), gh + i * GH + j, GH, 1, m_t, amx::kBlock,
                      1.f, 0.f, nullptr, false);
          } else {
            amx::tile(amx::steps(I), ax + ip * pe_x, wih.amx_panel(p), xp + i * GH + j, GH, 1, m_t, amx::kBlock,
                      1.f, 0.f, bias + j, false, amx::steps(H), ah + ip * pe_h, whh.amx_panel(p));
          }
        }
      }
      const index_t j0 = jp * amx::kBlock, j1 = j0 + amx::kBlock;
      const StepRows step{s.cell, B, H, j0, j1};
      forward_rows<float>(step, xp, gru ? gh : nullptr, true, bias + GH, h0, H, c0, c, h, H, save, aux, zeros);
      final_states<float>(step, h, H, c, h_n, c_n);
    });
  }
}

template <typename T>
void fused_packed_cell_step(const RnnShape& s, const RnnWeights<T>& w, const T* x, const T* h0, const T* c0,
                            T* const* y, T* h_n, T* c_n, T* reserve, DirBuffers<T>& b, const T* zeros) {
  if constexpr (std::is_same_v<T, float>) {
    if (packed_cell_on_tiles(s, w, x, h0))
      return fused_packed_cell_step_amx(s, w, x, h0, c0, y, h_n, c_n, reserve, b, zeros);
  }
  const index_t B = s.batch, H = s.hidden, I = s.input;
  const int G = rnn_gates(s.cell);
  const index_t GH = G * H;
  const bool gru = s.cell == RnnCell::gru;
  const PackedB<T>& wih = *w.packed_ih;
  const PackedB<T>& whh = *w.packed_hh;
  const UKernel<T>& uk = wih.ukernel();
  const index_t gate_panels = H / uk.nr;
  const CellOut<T> o = cell_out(s, gate_panels, s.input + s.hidden, c_n, reserve, b);
  T *const save = o.save, *const aux = o.aux, *const c = o.c, *const h = y[0];
  c_n = o.c_n;
  const int nt = o.nt;
  T *const xp = b.xp.data(), *const gh = b.gh.data();
  const T* const bias = b.bias.data();
  AlignedBuffer<T> ap(static_cast<std::size_t>(std::max<index_t>(B * (I + H), 1)));
  T* const ap1 = ap.data();
  T* const ap2 = ap.data() + B * I;
  std::optional<PanelShare> share;
  if (nt > 1) share.emplace(nt, gate_panels);
  const bool reverse = alternate_direction(&wih);
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    const int tid = thread_id(), nth = thread_count();
    pack_a_rows_part<T>(uk, B, I, x, I, 1, ap1, tid, nth);
    if (h0) pack_a_rows_part<T>(uk, B, H, h0, H, 1, ap2, tid, nth);
#pragma omp barrier
    for_each_unit(share ? &*share : nullptr, gate_panels, reverse, [&](index_t jp) {
      for (int q = 0; q < G; ++q) {
        const index_t p = q * gate_panels + jp;
        const bool apart = gru && q == 2;  // gate n: W_hn h into gh, which the reset gate scales
        gemm_packed_b<T>(B, ap1, wih, p, p + 1, T(0), xp, GH, false, h0 && !apart ? nullptr : bias);
        if (h0) gemm_packed_b<T>(B, ap2, whh, p, p + 1, apart ? T(0) : T(1), apart ? gh : xp, GH, false,
                                 apart ? nullptr : bias);
      }
      const index_t j0 = jp * uk.nr, j1 = j0 + uk.nr;
      const StepRows step{s.cell, B, H, j0, j1};
      forward_rows<T>(step, xp, gru && h0 ? gh : nullptr, true, bias + GH, h0, H, c0, c, h, H, save, aux, zeros);
      final_states<T>(step, h, H, c, h_n, c_n);
    });
  }
}

// Whether a float32 sequence's recurrent products run on AMX tiles (fused_step_amx): the tiles are
// enabled, every thread's share of the batch fills at least 3/4 of a 32-row tile, h_t is bounded (LSTM,
// GRU or tanh RNN without projection: |h| <= 1, so the only values the tiles would not split exactly
// are NaN, which propagates, and |h| < 2^-100, whose lost low parts are below float32's resolution of
// the pre-activation they join), and every W_hh and h0 split exactly (amx::splittable).
template <typename T>
bool rnn_amx_fits(const RnnShape& s, const RnnWeights<T>& w, const T* h0) {
  if constexpr (!std::is_same_v<T, float>) {
    return false;
  } else {
    if (!rnn_tiles_active() || s.proj > 0 || s.cell == RnnCell::rnn_relu) return false;
    // The batch rows a thread of a direction gets split by rows, whichever way the time loop splits:
    // both ways then take the same kernels, and give the same bits.
    const int threads = get_num_threads(), group = s.dirs == 2 && threads >= 2 ? threads / 2 : threads;
    if (4 * (s.batch / group) < 3 * amx::kBlock) return false;
    const index_t GH = rnn_gates(s.cell) * s.hidden, S = s.state();
    for (const float* whh : w.w_hh)
      if (!amx::splittable(GH, S, whh, S, 1)) return false;
    return !h0 || amx::splittable(index_t(s.layers) * s.dirs * s.batch, S, h0, S, 1);
  }
}

template <typename T>
void rnn_forward(const RnnShape& s, const RnnWeights<T>& w, const T* x, const T* h0, const T* c0, T* const* y,
                 T* h_n, T* c_n, T* reserve) {
  const index_t Tn = s.seq, B = s.batch, H = s.hidden, S = s.state();
  const int G = rnn_gates(s.cell), D = s.dirs;
  const index_t GH = G * H, DS = D * S;
  const bool proj = s.proj > 0;
  if (Tn == 0 || B == 0 || H == 0) return;
  if (rnn_uses_wavefront(s, sizeof(T)))
    return rnn_forward_wavefront<T>(s, w, x, h0, c0, y, h_n, c_n, reserve, get_num_threads());
  const bool lstm = s.cell == RnnCell::lstm, gru = s.cell == RnnCell::gru;
  const bool packed = Tn > 1;  // a single step multiplies W_hh once: plain GEMM, no packing
  const UKernel<T> uk = select_ukernel<T>(active_isa());
  const bool by_rows = packed && rnn_splits_rows(s, sizeof(T));
  const int nt = by_rows ? get_num_threads() : team_size(H, uk.nr, D);
  const index_t per_dir = rnn_reserve_elems_per_dir(s);
  const index_t a_elems = packed_a_elems(uk, B, std::max(H, S));  // h_{t-1} (B x S), m_t (B x H)
  const bool amx_step = packed && rnn_amx_fits<T>(s, w, h0);
  // h_{t-1} as fused_step_amx's A panels (no projection: S == H).
  const index_t amx_elems = amx_step ? ceil_div(B, index_t(amx::kBlock)) * amx::panel_elems(S) : 0;
  AlignedBuffer<amx::bf16> apack_amx(static_cast<std::size_t>(nt * amx_elems));
  AlignedBuffer<amx::bf16> hpack_amx(static_cast<std::size_t>(2 * (by_rows ? nt : D) * amx_elems));

  DirBuffers<T> buf[2];
  AlignedBuffer<T> zeros(static_cast<std::size_t>(GH));  // a zero row: h_{-1}, c_{-1} or W_hh h_{-1}
  std::fill(zeros.data(), zeros.data() + GH, T(0));
  AlignedBuffer<T> apack(static_cast<std::size_t>(nt * a_elems));
  // Without a projection, each step's post-GEMM writes h_t packed for the next step: two buffers a
  // direction, step st writing buffer st % 2 while reading the other.
  const bool h_packed = packed && !proj && !amx_step;  // (fused_step_amx packs its own)
  // Split by rows, each thread packs h_t of its own rows: two buffers a thread.
  AlignedBuffer<T> hpack(static_cast<std::size_t>(h_packed ? 2 * (by_rows ? nt : D) * a_elems : 0));
  for (int d = 0; d < D; ++d) {
    buf[d].xp.resize(static_cast<std::size_t>(Tn * B * GH));
    buf[d].gh.resize(static_cast<std::size_t>(B * GH));
    buf[d].bias.resize(static_cast<std::size_t>(GH + H));
    if (lstm && !reserve) buf[d].state.resize(static_cast<std::size_t>(B * H));
    if (proj && !reserve) buf[d].m.resize(static_cast<std::size_t>(B * H));
  }

  for (int l = 0; l < s.layers; ++l) {
    const index_t Il = s.input_of(l);
    const T* xl = l == 0 ? x : y[l - 1];
    T* yl = y[l];
    // A single step with h0 (a cell): its products and its post-GEMM in one pass, both weights read in
    // place: where the batch fills the strided-A kernel's tiles, by it ([x | h0] packed once,
    // gemm_wt_direct_cell); at a few rows, by dot products (gemm_small_m_cell).
    const bool prepacked = w.packed_ih != nullptr;
    const bool one_step = !prepacked && !packed && h0 && !proj && Il > 0;
    const bool direct_cell = one_step && direct_wins<T>(B, Il + S);
    const bool dot_cell = one_step && !direct_cell && B <= kSmallCellRows && small_m_wins(B, GH, Il + S, sizeof(T));
    // At a batch that fills the tiles, the products on AMX tiles with the weights as A (float32, x and h0
    // split exactly).
    bool tile_cell[2] = {false, false};
    if constexpr (std::is_same_v<T, float>)
      for (int d = 0; one_step && d < D; ++d) tile_cell[d] = cell_on_tiles(B, Il, xl, S, h0 + (l * D + d) * B * S);
    const bool fused_cell = direct_cell || dot_cell || tile_cell[0] || tile_cell[1];
    const bool fused_packed = fused_packed_cell_fits<T>(s, w);
    // On weights packed by the caller (see RnnWeights), a cell's two products as one; GRU keeps W_hn h
    // apart, for its reset gate.
    const bool one_product = prepacked && !gru;
    for (int d = 0; d < D; ++d) {
      const int li = l * D + d;
      DirBuffers<T>& b = buf[d];
      const T *bih = w.b_ih[li], *bhh = w.b_hh[li];
      T* bias = b.bias.data();
      for (index_t j = 0; j < GH; ++j)
        bias[j] = (bih ? bih[j] : T(0)) + (bhh && !(gru && j >= 2 * H) ? bhh[j] : T(0));
      for (index_t j = 0; j < H; ++j) bias[GH + j] = gru && bhh ? bhh[2 * H + j] : T(0);
      if (fused_packed) {
        fused_packed_cell_step<T>(s, w, xl, h0, c0, y, h_n, c_n, reserve, b, zeros.data());
      } else if (prepacked) {
        const bool both = h0 && !gru;
        gemm_prepacked<T>(B, xl, Il, *w.packed_ih, b.xp.data(), GH, bias, Activation::identity,
                          both ? h0 + li * B * S : nullptr, S, both ? w.packed_hh : nullptr);
        if (h0 && gru)
          gemm_prepacked<T>(B, h0 + li * B * S, S, *w.packed_hh, b.gh.data(), GH, nullptr, Activation::identity);
      } else if (tile_cell[d]) {
        if constexpr (std::is_same_v<T, float>)
          fused_cell_step_amx(s, w, l, d, xl, h0, c0, y, h_n, c_n, reserve, b, zeros.data());
      } else if (fused_cell) {
        fused_cell_step<T>(s, w, l, d, xl, h0, c0, y, h_n, c_n, reserve, b, zeros.data(), dot_cell);
      } else {
        gemm_a_wt<T>(Tn * B, GH, Il, xl, Il, w.w_ih[li], b.xp.data(), GH, bias, T(0));
      }
      if (packed && amx_step) {
        if constexpr (std::is_same_v<T, float>) {
          for (int q = 0; q < G; ++q) {
            b.whh_amx[q].resize(static_cast<std::size_t>(ceil_div(H, index_t(amx::kBlock)) * amx::panel_elems(S)));
            amx::pack_b_panels(S, H, w.w_hh[li] + q * H * S, 1, S, b.whh_amx[q].data(), amx::panel_elems(S));
          }
        }
      } else if (packed) {
        // Gate q's B operand: B_q(p, j) = W_hh[q*H + j, p] (S x H, read down the columns of W_hh).
        for (int q = 0; q < G; ++q) b.whh[q].pack(S, H, w.w_hh[li] + q * H * S, 1, S);
      } else if (h0 && !prepacked && !fused_cell) {
        gemm_a_wt<T>(B, GH, S, h0 + li * B * S, S, w.w_hh[li], b.gh.data(), GH, nullptr, T(0));
      }
      // The projection's B operand: B(p, j) = W_hr[j, p] (H x P).
      if (proj) b.whr.pack(H, S, w.w_hr[li], 1, H);
    }
    if (fused_cell || fused_packed) continue;  // the layer's step, final states included, is done

    SpinBarrier barriers[2] = {SpinBarrier(thread_group(0, nt, D).nt), SpinBarrier(thread_group(nt - 1, nt, D).nt)};
    // fused_step's units (fused_step_amx's: 32 x 32)
    const index_t units = amx_step ? ceil_div(H, index_t(amx::kBlock)) * ceil_div(B, index_t(amx::kBlock))
                                   : ceil_div(H, uk.nr) * step_row_blocks(uk.mr, B);
    PanelShare shares[2] = {PanelShare(thread_group(0, nt, D).nt, units), PanelShare(thread_group(nt - 1, nt, D).nt, units)};
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
      const int tid = thread_id();
      const ThreadGroup tg = thread_group(tid, nt, D);
      // Split by columns, the group's threads share every step (a barrier a step); split by rows, each
      // runs all hidden units of its own batch rows [r0, r1), and needs no other thread's h_t.
      const StepShare sh = step_share(by_rows, B, H, S, proj, uk.nr, tg);
      const index_t r0 = sh.r0, r1 = sh.r1;
      const Columns own = sh.own, own_s = sh.own_s;
      const StepRows step{s.cell, r1 - r0, H, own.j0, own.j1};
      const index_t own_units =
          r1 <= r0   ? 0
          : amx_step ? ceil_div(H, index_t(amx::kBlock)) * ceil_div(r1 - r0, index_t(amx::kBlock))
                     : ceil_div(H, uk.nr) * step_row_blocks(uk.mr, r1 - r0);
      std::optional<amx::TileScope> tiles;  // this thread's tile configuration
      if (amx_step) tiles.emplace();
      const int hgt = balanced_height(uk.mr, r1 - r0);  // the projection products' micro-panel height
      T* ap = apack.data() + tid * a_elems;
      index_t seq = 0;  // steps run by this group so far: which set of panel ranges the next one takes
      for (int d = tg.dir_begin; d < tg.dir_end; ++d) {
        const int li = l * D + d;
        DirBuffers<T>& b = buf[d];
        T* save = reserve ? reserve + li * per_dir : nullptr;  // (T, B, GH) gates
        T* aux = reserve ? save + Tn * B * GH : nullptr;       // (T, B, H) c_t or W_hn h + b_hn
        T* msave = reserve && proj ? aux + Tn * B * H : nullptr;  // (T, B, H) m_t (projection)
        const T* bhn = b.bias.data() + GH;
        for (index_t st = 0; st < Tn; ++st) {
          const index_t t = d == 0 ? st : Tn - 1 - st, tp = d == 0 ? t - 1 : t + 1;
          // Every operand from the thread's first row r0 on (0 unless split by rows).
          const index_t ldh = st == 0 ? S : DS;
          const T* hprev =
              st == 0 ? (h0 ? h0 + li * B * S + r0 * ldh : nullptr) : yl + tp * B * DS + d * S + r0 * ldh;
          const T* cprev = st == 0 ? (c0 ? c0 + li * B * H + r0 * H : nullptr)
                                   : (aux ? aux + tp * B * H : b.state.data()) + r0 * H;
          T* h_t = yl + t * B * DS + d * S + r0 * DS;
          // With a projection the post-GEMM writes m_t (row stride H), and h_t = m_t W_hr^T follows.
          T* m_t = proj ? (msave ? msave + t * B * H : b.m.data()) + r0 * H : nullptr;
          T* xpt = b.xp.data() + t * B * GH + r0 * GH;
          T* ct = (aux ? aux + t * B * H : b.state.data()) + r0 * H;
          T* sv = save ? save + t * B * GH + r0 * GH : nullptr;
          T* at = aux ? aux + t * B * H + r0 * H : nullptr;
          T* ght = b.gh.data() + r0 * GH;
          // h_t packed for step st + 1, and h_{t-1} as step st - 1 packed it.
          const index_t slot = 2 * (by_rows ? tid : d);
          T* const hnext = h_packed && st + 1 < Tn ? hpack.data() + (slot + (st & 1)) * a_elems : nullptr;
          const T* const hcur = h_packed && st > 0 ? hpack.data() + (slot + ((st - 1) & 1)) * a_elems : nullptr;
          amx::bf16* const hnext_amx =
              amx_step && st + 1 < Tn ? hpack_amx.data() + (slot + (st & 1)) * amx_elems : nullptr;
          const amx::bf16* const hcur_amx =
              amx_step && st > 0 ? hpack_amx.data() + (slot + ((st - 1) & 1)) * amx_elems : nullptr;
          if (hprev && packed) {
            PanelShare& share = shares[tg.group];
            const int set = static_cast<int>(seq & 1);
            // Split by rows, the thread's own units, forwards on even steps and backwards on odd ones
            // (as PanelShare runs them).
            index_t next = 0;
            auto next_unit = [&]() -> index_t {
              if (!by_rows) return share.next(set, tg.tid, set == 1);
              return next >= own_units ? -1 : set == 1 ? own_units - 1 - next++ : next++;
            };
            if (amx_step) {
              if constexpr (std::is_same_v<T, float>) {
                amx::bf16* const ax = apack_amx.data() + tid * amx_elems;
                if (!hcur_amx) pack_h_amx(step.B, S, hprev, ldh, ax);
                amx::bf16* const whq[4] = {b.whh_amx[0].data(), b.whh_amx[1].data(), b.whh_amx[2].data(),
                                           b.whh_amx[3].data()};
                fused_step_amx(step, next_unit, hcur_amx ? hcur_amx : ax, whq, S, xpt, ght, bhn, hprev, ldh, cprev,
                               ct, h_t, DS, sv, at, zeros.data(), hnext_amx);
              }
            } else {
              if (!hcur) pack_a_balanced<T>(uk, step.B, S, hprev, ldh, ap);
              fused_step<T>(step, next_unit, hcur ? hcur : ap, b.whh, xpt, ght, bhn, hprev, ldh, cprev, ct,
                            proj ? m_t : h_t, proj ? H : DS, sv, at, zeros.data(), hnext);
            }
          } else {
            // A single step (its products by plain GEMM: into gh, or with x's into xp, GRU's gate n
            // into gh) or h_{t-1} = 0.
            const bool summed = one_product;
            forward_rows<T>(step, xpt, hprev && !one_product ? ght : nullptr, summed, bhn, hprev, ldh, cprev, ct,
                            proj ? m_t : h_t, proj ? H : DS, sv, at, zeros.data());
            if (hnext) pack_a_balanced<T>(uk.mr, step.B, S, h_t, DS, hnext, 0, step.B, own.j0, own.j1);
            if constexpr (std::is_same_v<T, float>) {
              // own.j0 and own.j1 are multiples of NR, 32 on AVX-512 (float32): whole depth steps.
              if (hnext_amx) pack_h_amx(step.B, S, h_t, DS, hnext_amx, own.j0, own.j1);
            }
          }
          if (proj) {
            if (!by_rows) barriers[tg.group].wait();  // m_t complete before any thread packs it
            pack_a_rows<T>(uk, step.B, H, m_t, H, 1, ap, hgt);
            gemm_packed_b<T>(step.B, ap, b.whr, own_s.c0, own_s.c1, T(0), h_t, DS, false, nullptr, hgt);
          }
          if (packed) {
            ++seq;
            if (!by_rows) shares[tg.group].reset(static_cast<int>(seq & 1), tg.tid);  // see PanelShare
          }
          // h_t (and its packing) complete before the next step reads it: other threads' rows of it
          // unless split by rows.
          if (!by_rows) barriers[tg.group].wait();
        }
        // Final states of the owned rows and columns: h_n (S wide) and c_n (H wide).
        const index_t t_last = d == 0 ? Tn - 1 : 0;
        const T* h_last = yl + t_last * B * DS + d * S;
        const T* c_last = aux ? aux + t_last * B * H : b.state.data();
        for (index_t r = r0; r < r1; ++r) {
          if (h_n) std::copy(h_last + r * DS + own_s.j0, h_last + r * DS + own_s.j1, h_n + (li * B + r) * S + own_s.j0);
          if (c_n && lstm)
            std::copy(c_last + r * H + own.j0, c_last + r * H + own.j1, c_n + (li * B + r) * H + own.j0);
        }
      }
    }
  }
}

// H_prev of a layer's direction as a GEMM's B operand (GemmArgs::pack_b), TB x S: the rows of step t hold
// h_{t-1} (forward) or h_{t+1} (reverse) from the layer's output y (row stride ldy), those of the step that
// read the initial state (t_first) h0, or zeros without one.
template <typename T>
struct HPrevRows {
  index_t batch, S, ldy;
  const T* y;   // the direction's first column of the layer output
  const T* h0;  // (batch x S), or null
  index_t t_first;
  bool forward;
};

template <typename T>
void pack_h_prev(const void* ctx, index_t pc, index_t kc, index_t j, index_t n_t, int nr, T* dst) {
  const HPrevRows<T>& h = *static_cast<const HPrevRows<T>*>(ctx);
  for (index_t p = 0; p < kc; ++p) {
    const index_t r = pc + p, t = r / h.batch, b = r % h.batch;
    const T* src = t == h.t_first ? (h.h0 ? h.h0 + b * h.S : nullptr)
                                  : h.y + ((h.forward ? t - 1 : t + 1) * h.batch + b) * h.ldy;
    T* out = dst + p * nr;
    if (src)
      std::copy(src + j, src + j + n_t, out);
    else
      std::fill(out, out + n_t, T(0));
    std::fill(out + n_t, out + nr, T(0));
  }
}

template <typename T>
void rnn_backward(const RnnShape& s, const RnnWeights<T>& w, const T* x, const T* h0, const T* c0,
                  const T* const* y, const T* reserve, const T* dy, const T* dh_n, const T* dc_n, T* dx, T* dh0,
                  T* dc0, const RnnWeightGrads<T>& dw) {
  const index_t Tn = s.seq, B = s.batch, H = s.hidden, S = s.state(), TB = s.seq * s.batch;
  const int G = rnn_gates(s.cell), D = s.dirs, L = s.layers;
  const index_t GH = G * H, DS = D * S;
  const bool lstm = s.cell == RnnCell::lstm, gru = s.cell == RnnCell::gru, relu = s.cell == RnnCell::rnn_relu;
  const bool proj = s.proj > 0;
  const bool packed = Tn > 1;
  const UKernel<T> uk = select_ukernel<T>(active_isa());
  // Split by rows (rnn_splits_rows), each thread runs its own batch rows through every step, all hidden
  // units, with no barrier; split by hidden units, the threads of a direction meet twice a step.
  const bool by_rows = packed && rnn_splits_rows(s, sizeof(T));
  const int nt = by_rows ? get_num_threads() : team_size(H, uk.nr, D);
  const index_t per_dir = rnn_reserve_elems_per_dir(s);
  const GateKernels<T>* vk = gate_kernels<T>();  // null: the portable loops above

  DirBuffers<T> buf[2];
  const index_t zlen = std::max<index_t>(D * std::max(H, S), 1);
  AlignedBuffer<T> zeros(static_cast<std::size_t>(zlen));
  std::fill(zeros.data(), zeros.data() + zlen, T(0));
  // dG_t packed once a step, each thread of a direction's group packing a share of its panels (split
  // by rows: each thread its own rows, into its own buffer).
  const index_t a_elems = packed_a_elems(uk, B, GH);
  AlignedBuffer<T> apack(static_cast<std::size_t>((by_rows ? nt : D) * a_elems));
  // With a projection, each thread packs dh_t (B x P) itself for dm_t = dh_t W_hr.
  const index_t p_elems = proj ? packed_a_elems(uk, B, S) : 0;
  AlignedBuffer<T> ppack(static_cast<std::size_t>(nt * p_elems));
  AlignedBuffer<T> dybuf[2];  // gradients of intermediate layer outputs, (T, B, DS), ping-pong
  for (int i = 0; i < (L > 1 ? std::min(L - 1, 2) : 0); ++i) dybuf[i].resize(static_cast<std::size_t>(TB * DS));
  for (int d = 0; d < D; ++d) {
    buf[d].state.resize(static_cast<std::size_t>(std::max<index_t>(B * S, 1)));
    if (lstm) buf[d].dstate.resize(static_cast<std::size_t>(std::max<index_t>(B * H, 1)));
    buf[d].dg.resize(static_cast<std::size_t>(std::max<index_t>(TB * GH, 1)));
    if (gru) buf[d].dgh.resize(static_cast<std::size_t>(std::max<index_t>(TB * GH, 1)));
    if (proj) {
      buf[d].m.resize(static_cast<std::size_t>(std::max<index_t>(B * H, 1)));
      buf[d].dh.resize(static_cast<std::size_t>(std::max<index_t>(TB * S, 1)));
    }
  }

  for (int l = L - 1; l >= 0; --l) {
    const index_t Il = s.input_of(l);
    const T* xl = l == 0 ? x : y[l - 1];
    const T* yl = y[l];
    const T* dyl = l == L - 1 ? dy : dybuf[l % 2].data();
    T* dxl = l == 0 ? dx : dybuf[(l - 1) % 2].data();
    for (int d = 0; d < D; ++d) {
      const int li = l * D + d;
      DirBuffers<T>& b = buf[d];
      if (dh_n)
        std::copy(dh_n + li * B * S, dh_n + (li + 1) * B * S, b.state.data());
      else
        std::fill(b.state.data(), b.state.data() + B * S, T(0));
      if (lstm) {
        if (dc_n)
          std::copy(dc_n + li * B * H, dc_n + (li + 1) * B * H, b.dstate.data());
        else
          std::fill(b.dstate.data(), b.dstate.data() + B * H, T(0));
      }
      // dh_{t-1} (B x S) = dG_t (B x GH) W_hh (GH x S): W_hh is already k-major.
      if (packed) b.whh[0].pack(GH, S, w.w_hh[li], S, 1);
      // dm_t (B x H) = dh_t (B x P) W_hr (P x H).
      if (proj) b.whr.pack(S, H, w.w_hr[li], H, 1);
    }

    SpinBarrier barriers[2] = {SpinBarrier(thread_group(0, nt, D).nt), SpinBarrier(thread_group(nt - 1, nt, D).nt)};
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
      const int tid = thread_id();
      const ThreadGroup tg = thread_group(tid, nt, D);
      // The thread's rows [r0, r1) (all of them unless split by rows) and columns.
      const StepShare sh = step_share(by_rows, B, H, S, proj, uk.nr, tg);
      const index_t r0 = sh.r0, r1 = sh.r1, Bs = r1 - r0;
      const Columns own = sh.own, own_s = sh.own_s;
      const int hgt = balanced_height(uk.mr, Bs);  // the micro-panels' height for those rows
      T* ap = apack.data() + (by_rows ? tid : tg.group) * a_elems;
      T* pp = ppack.data() + tid * p_elems;
      for (int d = tg.dir_begin; d < tg.dir_end; ++d) {
        const int li = l * D + d;
        DirBuffers<T>& b = buf[d];
        const T* save = reserve + li * per_dir;
        const T* aux = save + TB * GH;
        T* dgh_all = gru ? b.dgh.data() : b.dg.data();
        for (index_t st = Tn - 1; st >= 0; --st) {
          const index_t t = d == 0 ? st : Tn - 1 - st, tp = d == 0 ? t - 1 : t + 1;
          if (proj) {
            // dh_t = dy_t + (the gradient from step t+1), owned P columns, kept for dW_hr; then, once all
            // of it is there, dm_t = dh_t W_hr: the gradient the cell's output m_t receives.
            T* dh_t = b.dh.data() + t * B * S;
            for (index_t r = r0; r < r1; ++r) {
              const T* dyr = dyl ? dyl + (t * B + r) * DS + d * S : zeros.data();
              const T* dhr = b.state.data() + r * S;
              for (index_t j = own_s.j0; j < own_s.j1; ++j) dh_t[r * S + j] = dyr[j] + dhr[j];
            }
            if (!by_rows) barriers[tg.group].wait();  // dh_t complete before any thread packs it
            pack_a_rows<T>(uk, Bs, S, dh_t + r0 * S, S, 1, pp, hgt);
            gemm_packed_b<T>(Bs, pp, b.whr, own.c0, own.c1, T(0), b.m.data() + r0 * H, H, false, nullptr, hgt);
          }
          for (index_t r = r0; r < r1; ++r) {
            const index_t row = t * B + r;
            // With a projection the cell sees dm_t (in place of dy + dhr, whose sum is already in it).
            const T* dyr = proj ? b.m.data() + r * H : (dyl ? dyl + row * DS + d * S : zeros.data());
            const T* dhr = proj ? zeros.data() : b.state.data() + r * S;
            T* dg = b.dg.data() + row * GH;
            if (lstm) {
              const T* cp = st == 0 ? (c0 ? c0 + (li * B + r) * H : zeros.data()) : aux + (tp * B + r) * H;
              if (vk) {
                vk->lstm_bwd(H, own.j0, own.j1, dyr, dhr, save + row * GH, aux + row * H, cp, b.dstate.data() + r * H,
                             dg);
                continue;
              }
              lstm_bwd<T>(H, own.j0, own.j1, dyr, dhr, save + row * GH, aux + row * H, cp,
                          b.dstate.data() + r * H, dg);
            } else if (gru) {
              T* dhw = b.state.data() + r * S;
              const T* hp = st == 0 ? (h0 ? h0 + (li * B + r) * H : zeros.data()) : yl + (tp * B + r) * DS + d * H;
              gru_bwd<T>(H, own.j0, own.j1, dyr, dhw, save + row * GH, aux + row * H, hp, dg,
                         b.dgh.data() + row * GH);
            } else {
              rnn_bwd<T>(relu, own.j0, own.j1, dyr, dhr, yl + row * DS + d * H, dg);
            }
          }
          if (by_rows) {
            // The thread's rows of dG_t packed, and its rows of dh_{t-1}.
            pack_a_rows<T>(uk, Bs, GH, dgh_all + (t * B + r0) * GH, GH, 1, ap, hgt);
            gemm_packed_b<T>(Bs, ap, b.whh[0], own_s.c0, own_s.c1, gru ? T(1) : T(0), b.state.data() + r0 * S, S,
                             (st & 1) != 0, nullptr, hgt);  // alternate directions: see gemm_packed_b
            continue;
          }
          barriers[tg.group].wait();  // dG_t complete before any thread packs it
          if (packed) {
            // The group packs dG_t together into one buffer. It is free: every thread of the group
            // passed the barrier above after its last step's products.
            // Micro-panels of balanced height (B16 on a 14-row kernel: 8 + 8 rows, not 14 + 2).
            pack_a_rows_part<T>(uk, B, GH, dgh_all + t * B * GH, GH, 1, ap, tg.tid, tg.nt, hgt);
            if (tg.nt > 1) barriers[tg.group].wait();  // packed dG_t complete before the products
            gemm_packed_b<T>(B, ap, b.whh[0], own_s.c0, own_s.c1, gru ? T(1) : T(0), b.state.data(), S,
                             (st & 1) != 0, nullptr, hgt);  // alternate directions: see gemm_packed_b
          }
        }
      }
    }

    for (int d = 0; d < D; ++d) {
      const int li = l * D + d;
      DirBuffers<T>& b = buf[d];
      const T* dgx = b.dg.data();
      const T* dgh = gru ? b.dgh.data() : b.dg.data();
      const index_t t_first = d == 0 ? 0 : Tn - 1;  // the step that read h0
      const T wbeta = dw.accumulate ? T(1) : T(0);  // the weight gradients' beta
      if (!packed)  // one step: dh0 = dG_0 W_hh, unpacked
        gemm_strided<T>(B, S, GH, dgh, GH, 1, w.w_hh[li], S, 1, b.state.data(), S, gru ? T(1) : T(0));
      if (dh0) std::copy(b.state.data(), b.state.data() + B * S, dh0 + li * B * S);
      if (lstm && dc0) std::copy(b.dstate.data(), b.dstate.data() + B * H, dc0 + li * B * H);
      // A cell at a batch of at most kStreamDepth: each weight gradient in one pass of gemm_stream's
      // rank-k update, which the shared packing below would send to the blocked GEMM.
      const bool streamed = Tn == 1 && B <= kStreamDepth;
      if (dgh == dgx && !streamed) {
        // dW_ih (GH x Il) = dG^T (GH x TB) X_l (TB x Il) and dW_hh (GH x S) = dG^T H_prev, H_prev's rows
        // of step t holding h_{t-1} (HPrevRows): one packing of dG^T for both products.
        AlignedBuffer<T> dgt(static_cast<std::size_t>(packed_a_blocks_elems<T>(GH, TB)));
        pack_a_blocks<T>(GH, TB, dgx, 1, GH, dgt.data(), get_num_threads());
        GemmArgs<T> gi = strided_gemm_args<T>(GH, Il, TB, dgx, 1, GH, xl, Il, 1, dw.w_ih[li], Il, wbeta);
        gi.a_packed = dgt.data();
        gemm<T>(gi);
        const HPrevRows<T> hp{B, S, DS, yl + d * S, h0 ? h0 + li * B * S : nullptr, t_first, d == 0};
        GemmArgs<T> gh = strided_gemm_args<T>(GH, S, TB, dgx, 1, GH, nullptr, 0, 0, dw.w_hh[li], S, wbeta);
        gh.a_packed = dgt.data();
        gh.pack_b = pack_h_prev<T>;
        gh.pack_b_ctx = &hp;
        gemm<T>(gh);
      } else {
        // dW_ih (GH x Il) = dGx^T (GH x TB) X_l (TB x Il)
        gemm_strided<T>(GH, Il, TB, dgx, 1, GH, xl, Il, 1, dw.w_ih[li], Il, wbeta);
        // dW_hh (GH x S) = sum over steps of dGh_t^T h_{t-1}: the steps after the first read the layer
        // output one step back (forward direction) or ahead (reverse); the first reads h0.
        const index_t k_steps = (Tn - 1) * B;
        const T* dgh_later = d == 0 ? dgh + B * GH : dgh;
        const T* h_prev = d == 0 ? yl + d * S : yl + B * DS + d * S;
        // (One step with h0: the h0 product alone, in one pass over dW_hh.)
        const bool h0_only = k_steps == 0 && h0;
        if (!h0_only) gemm_strided<T>(GH, S, k_steps, dgh_later, 1, GH, h_prev, DS, 1, dw.w_hh[li], S, wbeta);
        if (h0)
          gemm_strided<T>(GH, S, B, dgh + t_first * B * GH, 1, GH, h0 + li * B * S, S, 1, dw.w_hh[li], S,
                          h0_only ? wbeta : T(1));
      }
      // dW_hr (P x H) = dH^T (P x TB) M (TB x H), M the saved m_t.
      if (proj)
        gemm_strided<T>(S, H, TB, b.dh.data(), 1, S, reserve + li * per_dir + TB * (GH + H), H, 1, dw.w_hr[li], H,
                        wbeta);
      if (dgh == dgx && dw.b_ih[li] && dw.b_hh[li]) {  // both biases see the same gate gradients (all but GRU)
        column_sums<T>(dgx, TB, GH, dw.b_ih[li], dw.accumulate, dw.b_hh[li]);
      } else {
        if (dw.b_ih[li]) column_sums<T>(dgx, TB, GH, dw.b_ih[li], dw.accumulate);
        if (dw.b_hh[li]) column_sums<T>(dgh, TB, GH, dw.b_hh[li], dw.accumulate);
      }
      // dX_l (TB x Il) = sum_d dGx_d (TB x GH) W_ih_d (GH x Il)
      gemm_strided<T>(TB, Il, GH, dgx, GH, 1, w.w_ih[li], Il, 1, dxl, Il, d == 0 ? T(0) : T(1));
    }
  }
}

template <typename T>
void rnn_math_test(int fn, const T* x, T* y, index_t n) {
  if (const GateKernels<T>* vk = gate_kernels<T>(); vk && (fn <= 2 || std::is_same_v<T, float>))
    return vk->math(fn, x, n, y, n, 1, n);  // float64 gelu: the C library's erfc below
  if (fn == 0) {
#pragma omp simd
    for (index_t i = 0; i < n; ++i) y[i] = fastmath::exp(x[i]);
  } else if (fn == 1) {
#pragma omp simd
    for (index_t i = 0; i < n; ++i) y[i] = fastmath::sigmoid(x[i]);
  } else if (fn == 2) {
#pragma omp simd
    for (index_t i = 0; i < n; ++i) y[i] = fastmath::tanh(x[i]);
  } else if (fn == 3) {
    for (index_t i = 0; i < n; ++i) y[i] = activate(Activation::gelu, x[i]);
  } else {
    for (index_t i = 0; i < n; ++i) y[i] = activate_grad(Activation::gelu, x[i], T(0));
  }
}

void rnn_panel_share_test(int nt, index_t panels, index_t steps, int max_spin, index_t* errors, index_t* stolen) {
  nt = std::max(1, nt);
  PanelShare share(nt, panels);
  SpinBarrier barrier(nt);
  std::unique_ptr<std::atomic<index_t>[]> runs(new std::atomic<index_t>[static_cast<std::size_t>(std::max<index_t>(panels, 1))]);
  for (index_t p = 0; p < panels; ++p) runs[p].store(0);
  std::atomic<index_t> bad{0}, taken{0};
#pragma omp parallel num_threads(nt)
  {
    const int tid = thread_id();
    std::uint64_t rng = 0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(tid + 1);
    for (index_t st = 0; st < steps; ++st) {
      const int set = static_cast<int>(st & 1);  // odd steps run the ranges backwards, as rnn_forward's do
      for (index_t jp = share.next(set, tid, set == 1); jp >= 0; jp = share.next(set, tid, set == 1)) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        // The last thread runs 4x slower, as on a core shared with a busy neighbour.
        const int spins = max_spin > 0 ? static_cast<int>((rng >> 33) % static_cast<std::uint64_t>(max_spin)) *
                                             (tid == nt - 1 && nt > 1 ? 4 : 1)
                                       : 0;
        for (volatile int k = 0; k < spins; k = k + 1) {
        }
        runs[jp].fetch_add(1);
        if (jp < panels * tid / nt || jp >= panels * (tid + 1) / nt) taken.fetch_add(1);
      }
      share.reset(static_cast<int>((st + 1) & 1), tid);
      barrier.wait();
      if (tid == 0)
        for (index_t p = 0; p < panels; ++p)
          if (runs[p].exchange(0) != 1) bad.fetch_add(1);
      barrier.wait();
    }
  }
  *errors = bad.load();
  *stolen = taken.load();
}

template void rnn_forward<float>(const RnnShape&, const RnnWeights<float>&, const float*, const float*, const float*,
                                 float* const*, float*, float*, float*);
template void rnn_forward<double>(const RnnShape&, const RnnWeights<double>&, const double*, const double*,
                                  const double*, double* const*, double*, double*, double*);
template void rnn_backward<float>(const RnnShape&, const RnnWeights<float>&, const float*, const float*, const float*,
                                  const float* const*, const float*, const float*, const float*, const float*, float*,
                                  float*, float*, const RnnWeightGrads<float>&);
template void rnn_backward<double>(const RnnShape&, const RnnWeights<double>&, const double*, const double*,
                                   const double*, const double* const*, const double*, const double*, const double*,
                                   const double*, double*, double*, double*, const RnnWeightGrads<double>&);
template void rnn_math_test<float>(int, const float*, float*, index_t);
template void rnn_math_test<double>(int, const double*, double*, index_t);

}  // namespace dnnkit
