// Direct convolution: no workspace, every shape. The forward pass keeps a KB x kQB block of outputs in
// registers over the whole reduction; the backward passes run their inner loop along an output row with
// the padding bounds hoisted out, a contiguous multiply-add for stride 1.
#include <algorithm>
#include <cstring>
#include <vector>

#include "../simd/vec.h"
#include "conv.h"
#include "kernels.h"

namespace dnnkit {
namespace {
constexpr index_t kQB = 32;  // forward: output columns per register block (channels: 8, 4 or 1)
}

template <typename T, int KB>
void conv2d_fwd_direct_kb(const ConvShape& sh, const T* x, const T* w, const T* bias, T* y) {
  // Register blocking: an accumulator block of KB output channels x kQB output columns of one output
  // row stays in registers across the whole (c, r, s) reduction; each step loads one kQB-wide input
  // row segment and KB weights, and does KB x kQB multiply-adds.
  const index_t Kg = sh.kg(), Cg = sh.cg(), R = sh.r, S = sh.s, P = sh.p, Q = sh.q, H = sh.h, W = sh.w;
  const index_t kblocks = ceil_div(Kg, KB), qblocks = ceil_div(Q, kQB);
  const index_t tasks = sh.n * sh.g * kblocks * P;
#pragma omp parallel for schedule(dynamic, 4) num_threads(get_num_threads()) if (tasks > 1)
  for (index_t t = 0; t < tasks; ++t) {
    const index_t p = t % P, kb = (t / P) % kblocks, g = (t / (P * kblocks)) % sh.g, n = t / (P * kblocks * sh.g);
    const index_t k0 = g * Kg + kb * KB, kn = std::min<index_t>(KB, Kg - kb * KB);
    const T* xn = x + (n * sh.c + g * Cg) * H * W;
    index_t r_lo = 0, r_hi = R;  // filter rows that land inside the image for this output row
    while (r_lo < R && p * sh.sh - sh.ph + r_lo * sh.dh < 0) ++r_lo;
    while (r_hi > r_lo && p * sh.sh - sh.ph + (r_hi - 1) * sh.dh >= H) --r_hi;
    using V = vec_t<T>;
    constexpr int L = static_cast<int>(sizeof(V) / sizeof(T));  // lanes per vector
    constexpr int NV = static_cast<int>(kQB) / L;                // vectors per accumulator row
    // One zero-padded copy of an input row: rowbuf[u] = x[.., u - pw] (0 outside), long enough for every
    // window of the row, so each step reads its kQB inputs contiguously (stride 1) with no edge cases.
    const index_t row_len = (qblocks * kQB - 1) * sh.sw + (S - 1) * sh.dw + 1;
    std::vector<T> rowbuf(static_cast<std::size_t>(row_len));
    alignas(64) T xv[kQB];
    for (index_t qb = 0; qb < qblocks; ++qb) {
      const index_t q0 = qb * kQB, qn = std::min(kQB, Q - q0);
      V acc[KB][NV];
#pragma GCC unroll 8
      for (int i = 0; i < KB; ++i) {
        const T b = (bias && i < kn) ? bias[k0 + i] : T(0);
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) acc[i][v] = V{} + b;
      }
      for (index_t c = 0; c < Cg; ++c)
        for (index_t r = r_lo; r < r_hi; ++r) {
          const T* xr = xn + (c * H + p * sh.sh - sh.ph + r * sh.dh) * W;
          const T* wr = w + ((k0 * Cg + c) * R + r) * S;  // w[k0 + i, c, r, s] = wr[i*Cg*R*S + s]
          const index_t wstride = Cg * R * S;
          const index_t u0 = q0 * sh.sw;  // rowbuf index of this block's first window
          const index_t u1 = std::min(row_len, u0 + (kQB - 1) * sh.sw + (S - 1) * sh.dw + 1);
          for (index_t u = u0; u < u1; ++u) {
            const index_t iw = u - sh.pw;
            rowbuf[u] = (iw >= 0 && iw < W) ? xr[iw] : T(0);
          }
          for (index_t s = 0; s < S; ++s) {
            const T* src = rowbuf.data() + u0 + s * sh.dw;
            if (sh.sw != 1) {
              for (index_t j = 0; j < kQB; ++j) xv[j] = src[j * sh.sw];
              src = xv;
            }
            V x_[NV];
#pragma GCC unroll 4
            for (int v = 0; v < NV; ++v) std::memcpy(&x_[v], src + v * L, sizeof(V));
#pragma GCC unroll 8
            for (int i = 0; i < KB; ++i) {
              const T wi = i < kn ? wr[i * wstride + s] : T(0);
#pragma GCC unroll 4
              for (int v = 0; v < NV; ++v) acc[i][v] += x_[v] * wi;
            }
          }
        }
      for (index_t i = 0; i < kn; ++i) {
        T* yr = y + ((n * sh.k + k0 + i) * P + p) * Q + q0;
        alignas(64) T row[kQB];
        for (int v = 0; v < NV; ++v) std::memcpy(row + v * L, &acc[i][v], sizeof(V));
        for (index_t j = 0; j < qn; ++j) yr[j] = row[j];
      }
    }
  }
}

template <typename T>
void conv2d_fwd_direct(const ConvShape& sh, const T* x, const T* w, const T* bias, T* y) {
  // The tallest block a group's output channels fill: depthwise (one channel per group) gets KB = 1
  // instead of computing 7 rows of zeros.
  if (sh.kg() >= 8)
    conv2d_fwd_direct_kb<T, 8>(sh, x, w, bias, y);
  else if (sh.kg() >= 4)
    conv2d_fwd_direct_kb<T, 4>(sh, x, w, bias, y);
  else
    conv2d_fwd_direct_kb<T, 1>(sh, x, w, bias, y);
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

// ---- the kernel table (kernels.h): no workspace, every shape.
namespace {
template <typename T>
void direct_fwd(const ConvShape& sh, const ConvCall& c) {
  conv2d_fwd_direct<T>(sh, static_cast<const T*>(c.a0), static_cast<const T*>(c.a1), static_cast<const T*>(c.bias),
                       static_cast<T*>(c.out));
}
template <typename T>
void direct_bwd_data(const ConvShape& sh, const ConvCall& c) {
  conv2d_bwd_data_direct<T>(sh, static_cast<const T*>(c.a0), static_cast<const T*>(c.a1), static_cast<T*>(c.out));
}
template <typename T>
void direct_bwd_filter(const ConvShape& sh, const ConvCall& c) {
  conv2d_bwd_filter_direct<T>(sh, static_cast<const T*>(c.a0), static_cast<const T*>(c.a1), static_cast<T*>(c.out));
}
CONV_KERNEL("fwd", "direct", nullptr, nullptr, CONV_RUNS(direct_fwd));
CONV_KERNEL("bwd_data", "direct", nullptr, nullptr, CONV_RUNS(direct_bwd_data));
CONV_KERNEL("bwd_filter", "direct", nullptr, nullptr, CONV_RUNS(direct_bwd_filter));
}  // namespace

}  // namespace dnnkit
