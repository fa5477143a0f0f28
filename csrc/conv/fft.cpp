#include "fft.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "../gemm/gemm.h"

namespace dnnkit {
template <typename T>
void fft_filter_transform(index_t K, index_t Cg, index_t R, index_t S, index_t dh, index_t dw, index_t hf,
                          index_t wf, const T* w, T* out) {
  const index_t V = wf / 2 + 1, F = hf * V;
  if (K == 0 || Cg == 0 || F == 0) return;
  const double two_pi = 6.283185307179586476925286766559;
  // Twiddles in double, rounded once: es[v][s] = exp(-2 pi i v s dw / wf), er[u][r] = exp(-2 pi i u r dh / hf).
  // The phase is reduced mod the transform size in integers, so large products lose nothing.
  std::vector<T> es_re(V * S), es_im(V * S), er_re(hf * R), er_im(hf * R);
  for (index_t v = 0; v < V; ++v)
    for (index_t s = 0; s < S; ++s) {
      const double ph = two_pi * double((v * s * dw) % wf) / double(wf);
      es_re[v * S + s] = T(std::cos(ph));
      es_im[v * S + s] = T(-std::sin(ph));
    }
  for (index_t u = 0; u < hf; ++u)
    for (index_t r = 0; r < R; ++r) {
      const double ph = two_pi * double((u * r * dh) % hf) / double(hf);
      er_re[u * R + r] = T(std::cos(ph));
      er_im[u * R + r] = T(-std::sin(ph));
    }
  // wt[c][r][s][k]: the taps with k innermost; t1 (planar) [c][r][v][k] = sum_s wt[c][r][s][k] es[v][s].
  AlignedBuffer<T> wt(static_cast<std::size_t>(Cg * R * S * K));
  AlignedBuffer<T> t1(static_cast<std::size_t>(2 * Cg * R * V * K));
  T* const wtp = wt.data();
  T* const t1r = t1.data();
  T* const t1i = t1.data() + Cg * R * V * K;
  const int nt = get_num_threads();
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
#pragma omp for schedule(static)
    for (index_t c = 0; c < Cg; ++c)
      for (index_t k = 0; k < K; ++k)
        for (index_t rs = 0; rs < R * S; ++rs) wtp[(c * R * S + rs) * K + k] = w[(k * Cg + c) * R * S + rs];
#pragma omp for schedule(static)
    for (index_t cr = 0; cr < Cg * R; ++cr)
      for (index_t v = 0; v < V; ++v) {
        T* tr = t1r + (cr * V + v) * K;
        T* ti = t1i + (cr * V + v) * K;
        std::fill(tr, tr + K, T(0));
        std::fill(ti, ti + K, T(0));
        for (index_t s = 0; s < S; ++s) {
          const T* ws = wtp + (cr * S + s) * K;
          const T cr_ = es_re[v * S + s], ci_ = es_im[v * S + s];
#pragma omp simd
          for (index_t k = 0; k < K; ++k) {
            tr[k] += ws[k] * cr_;
            ti[k] += ws[k] * ci_;
          }
        }
      }
    // out[f][c][k] = sum_r t1[c][r][v][k] er[u][r] (complex), f = u*V + v; threads own rows u.
#pragma omp for schedule(static)
    for (index_t u = 0; u < hf; ++u)
      for (index_t v = 0; v < V; ++v) {
        T* blk = out + (u * V + v) * 2 * Cg * K;
        for (index_t c = 0; c < Cg; ++c) {
          T* o_re = blk + c * K;
          T* o_im = blk + (Cg + c) * K;
          std::fill(o_re, o_re + K, T(0));
          std::fill(o_im, o_im + K, T(0));
          for (index_t r = 0; r < R; ++r) {
            const T* ar = t1r + ((c * R + r) * V + v) * K;
            const T* ai = t1i + ((c * R + r) * V + v) * K;
            const T br = er_re[u * R + r], bi = er_im[u * R + r];
#pragma omp simd
            for (index_t k = 0; k < K; ++k) {
              o_re[k] += ar[k] * br - ai[k] * bi;
              o_im[k] += ar[k] * bi + ai[k] * br;
            }
          }
        }
      }
  }
}

template <typename T>
void fft_channel_reduce(index_t nb, index_t c, index_t k, index_t g, index_t f, const T* x, const T* w, T* y) {
  if (nb == 0 || k == 0 || f == 0) return;
  const index_t Cg = c / g, Kg = k / g;
  if (Cg == 0) {  // no input channels: the sums are empty
    std::fill(y, y + nb * k * f * 2, T(0));
    return;
  }
  const index_t M = 2 * nb, KK = 2 * Cg;
  const int nt = static_cast<int>(std::max<index_t>(1, std::min<index_t>(get_num_threads(), f)));
  // Per thread: the A operand of one group (M x KK) and the C block of one frequency (M x K).
  AlignedBuffer<T> abuf(static_cast<std::size_t>(nt * M * KK)), cbuf(static_cast<std::size_t>(nt * M * k));
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    const int tid = thread_id();
    T* a = abuf.data() + tid * M * KK;
    T* cb = cbuf.data() + tid * M * k;
    // Contiguous ranges of frequencies: neighbouring f share the cache lines of X and Y.
#pragma omp for schedule(static)
    for (index_t ff = 0; ff < f; ++ff) {
      for (index_t gg = 0; gg < g; ++gg) {
        // A = [[Xr, Xi], [Xi, -Xr]]: row n holds (Xr, Xi) of image n, row nb + n (Xi, -Xr).
        for (index_t n = 0; n < nb; ++n) {
          const T* xn = x + ((n * c + gg * Cg) * f + ff) * 2;
          T* top = a + n * KK;
          T* bot = a + (nb + n) * KK;
          for (index_t cc = 0; cc < Cg; ++cc) {
            const T re = xn[cc * f * 2], im = xn[cc * f * 2 + 1];
            top[cc] = re;
            top[Cg + cc] = im;
            bot[cc] = im;
            bot[Cg + cc] = -re;
          }
        }
        const T* b = w + ff * KK * k + gg * Kg;
        gemm<T>(strided_gemm_args<T>(M, Kg, KK, a, KK, 1, b, k, 1, cb + gg * Kg, k, T(0)), 1);
      }
      for (index_t n = 0; n < nb; ++n)
        for (index_t kk = 0; kk < k; ++kk) {
          T* yp = y + ((n * k + kk) * f + ff) * 2;
          yp[0] = cb[n * k + kk];
          yp[1] = cb[(nb + n) * k + kk];
        }
    }
  }
}

template void fft_filter_transform<float>(index_t, index_t, index_t, index_t, index_t, index_t, index_t, index_t,
                                          const float*, float*);
template void fft_filter_transform<double>(index_t, index_t, index_t, index_t, index_t, index_t, index_t, index_t,
                                           const double*, double*);
template void fft_channel_reduce<float>(index_t, index_t, index_t, index_t, index_t, const float*, const float*,
                                        float*);
template void fft_channel_reduce<double>(index_t, index_t, index_t, index_t, index_t, const double*, const double*,
                                         double*);

}  // namespace dnnkit
