// Direct convolution: no workspace, every shape. The inner loop runs along an output row (q) with the
// padding bounds hoisted out, so for stride 1 it is a contiguous multiply-add the compiler vectorizes;
// the forward pass blocks kKB output channels so each input row loaded feeds kKB FMAs.
#include <algorithm>

#include "conv.h"

namespace dnnkit {
namespace {
constexpr index_t kKB = 4;  // output channels computed together in the forward pass
}

template <typename T>
void conv2d_fwd_direct(const ConvShape& sh, const T* x, const T* w, const T* bias, T* y) {
  const index_t Kg = sh.kg(), Cg = sh.cg(), R = sh.r, S = sh.s, P = sh.p, Q = sh.q, H = sh.h, W = sh.w;
  const index_t kblocks = ceil_div(Kg, kKB);
  const index_t tasks = sh.n * sh.g * kblocks;
#pragma omp parallel for schedule(dynamic) num_threads(get_num_threads()) if (tasks > 1)
  for (index_t t = 0; t < tasks; ++t) {
    const index_t n = t / (sh.g * kblocks), g = (t / kblocks) % sh.g, kb = t % kblocks;
    const index_t k0 = g * Kg + kb * kKB, kn = std::min(kKB, Kg - kb * kKB);
    T* yk[kKB];
    for (index_t i = 0; i < kKB; ++i) yk[i] = y + (n * sh.k + k0 + std::min(i, kn - 1)) * P * Q;
    for (index_t i = 0; i < kn; ++i) std::fill(yk[i], yk[i] + P * Q, bias ? bias[k0 + i] : T(0));
    const T* xn = x + (n * sh.c + g * Cg) * H * W;
    for (index_t c = 0; c < Cg; ++c)
      for (index_t r = 0; r < R; ++r) {
        index_t p_lo, p_hi;
        valid_range(P, H, sh.sh, sh.ph, r * sh.dh, &p_lo, &p_hi);
        for (index_t s = 0; s < S; ++s) {
          index_t q_lo, q_hi;
          valid_range(Q, W, sh.sw, sh.pw, s * sh.dw, &q_lo, &q_hi);
          T wv[kKB];
          for (index_t i = 0; i < kKB; ++i)
            wv[i] = i < kn ? w[(((k0 + i) * Cg + c) * R + r) * S + s] : T(0);
          for (index_t p = p_lo; p < p_hi; ++p) {
            const T* xr = xn + (c * H + p * sh.sh - sh.ph + r * sh.dh) * W - sh.pw + s * sh.dw;
            T* y0 = yk[0] + p * Q;
            T* y1 = yk[1] + p * Q;
            T* y2 = yk[2] + p * Q;
            T* y3 = yk[3] + p * Q;
            if (kn == kKB) {
              if (sh.sw == 1) {
#pragma omp simd
                for (index_t q = q_lo; q < q_hi; ++q) {
                  const T xv = xr[q];
                  y0[q] += wv[0] * xv;
                  y1[q] += wv[1] * xv;
                  y2[q] += wv[2] * xv;
                  y3[q] += wv[3] * xv;
                }
              } else {
                for (index_t q = q_lo; q < q_hi; ++q) {
                  const T xv = xr[q * sh.sw];
                  y0[q] += wv[0] * xv;
                  y1[q] += wv[1] * xv;
                  y2[q] += wv[2] * xv;
                  y3[q] += wv[3] * xv;
                }
              }
            } else {  // the last block of a group: fewer than kKB channels
              for (index_t i = 0; i < kn; ++i) {
                T* yr = yk[i] + p * Q;
                for (index_t q = q_lo; q < q_hi; ++q) yr[q] += wv[i] * xr[q * sh.sw];
              }
            }
          }
        }
      }
  }
}

template <typename T>
void conv2d_bwd_data_direct(const ConvShape& sh, const T* w, const T* dy, T* dx) {
  // dx[n, c, ih, iw] = sum_{k in group, r, s, p, q : ih = p*sh - ph + r*dh, iw = q*sw - pw + s*dw} w * dy
  const index_t Kg = sh.kg(), Cg = sh.cg(), R = sh.r, S = sh.s, P = sh.p, Q = sh.q, H = sh.h, W = sh.w;
  const index_t tasks = sh.n * sh.c;
#pragma omp parallel for schedule(dynamic) num_threads(get_num_threads()) if (tasks > 1)
  for (index_t t = 0; t < tasks; ++t) {
    const index_t n = t / sh.c, ci = t % sh.c, g = ci / Cg, c = ci % Cg;
    T* dxc = dx + (n * sh.c + ci) * H * W;
    std::fill(dxc, dxc + H * W, T(0));
    for (index_t kk = 0; kk < Kg; ++kk) {
      const index_t k = g * Kg + kk;
      const T* dyk = dy + (n * sh.k + k) * P * Q;
      for (index_t r = 0; r < R; ++r) {
        index_t p_lo, p_hi;
        valid_range(P, H, sh.sh, sh.ph, r * sh.dh, &p_lo, &p_hi);
        for (index_t s = 0; s < S; ++s) {
          index_t q_lo, q_hi;
          valid_range(Q, W, sh.sw, sh.pw, s * sh.dw, &q_lo, &q_hi);
          const T wv = w[((k * Cg + c) * R + r) * S + s];
          for (index_t p = p_lo; p < p_hi; ++p) {
            T* xr = dxc + (p * sh.sh - sh.ph + r * sh.dh) * W - sh.pw + s * sh.dw;
            const T* dyr = dyk + p * Q;
            if (sh.sw == 1) {
#pragma omp simd
              for (index_t q = q_lo; q < q_hi; ++q) xr[q] += wv * dyr[q];
            } else {
              for (index_t q = q_lo; q < q_hi; ++q) xr[q * sh.sw] += wv * dyr[q];
            }
          }
        }
      }
    }
  }
}

template <typename T>
void conv2d_bwd_filter_direct(const ConvShape& sh, const T* x, const T* dy, T* dw) {
  // dw[k, c, r, s] = sum_{n, p, q} dy[n, k, p, q] * x[n, g*Cg + c, p*sh - ph + r*dh, q*sw - pw + s*dw]
  const index_t Kg = sh.kg(), Cg = sh.cg(), R = sh.r, S = sh.s, P = sh.p, Q = sh.q, H = sh.h, W = sh.w;
  const index_t tasks = sh.k * Cg;
#pragma omp parallel for schedule(dynamic) num_threads(get_num_threads()) if (tasks > 1)
  for (index_t t = 0; t < tasks; ++t) {
    const index_t k = t / Cg, c = t % Cg, g = k / Kg;
    for (index_t r = 0; r < R; ++r) {
      index_t p_lo, p_hi;
      valid_range(P, H, sh.sh, sh.ph, r * sh.dh, &p_lo, &p_hi);
      for (index_t s = 0; s < S; ++s) {
        index_t q_lo, q_hi;
        valid_range(Q, W, sh.sw, sh.pw, s * sh.dw, &q_lo, &q_hi);
        T acc = T(0);
        for (index_t n = 0; n < sh.n; ++n) {
          const T* dyk = dy + (n * sh.k + k) * P * Q;
          const T* xc = x + (n * sh.c + g * Cg + c) * H * W;
          for (index_t p = p_lo; p < p_hi; ++p) {
            const T* xr = xc + (p * sh.sh - sh.ph + r * sh.dh) * W - sh.pw + s * sh.dw;
            const T* dyr = dyk + p * Q;
            if (sh.sw == 1) {
#pragma omp simd reduction(+ : acc)
              for (index_t q = q_lo; q < q_hi; ++q) acc += dyr[q] * xr[q];
            } else {
              for (index_t q = q_lo; q < q_hi; ++q) acc += dyr[q] * xr[q * sh.sw];
            }
          }
        }
        dw[((k * Cg + c) * R + r) * S + s] = acc;
      }
    }
  }
}

#define DNNKIT_INSTANTIATE(T)                                                                  \
  template void conv2d_fwd_direct<T>(const ConvShape&, const T*, const T*, const T*, T*);     \
  template void conv2d_bwd_data_direct<T>(const ConvShape&, const T*, const T*, T*);          \
  template void conv2d_bwd_filter_direct<T>(const ConvShape&, const T*, const T*, T*);
DNNKIT_INSTANTIATE(float)
DNNKIT_INSTANTIATE(double)
#undef DNNKIT_INSTANTIATE

}  // namespace dnnkit
