// im2col + GEMM convolution, and its col2im backward. Per image n and group g, with output pixels taken
// `chunk` columns at a time (j in [j0, j1) indexes the P*Q output pixels):
//   forward        Y[n,g][:, j0:j1] (Kg x J)   = W_g (Kg x CRS) @ col (CRS x J)
//   backward data  col (CRS x J)                = W_g^T (CRS x Kg) @ dY[n,g][:, j0:j1];  dX += col2im(col)
//   backward filt  dW_g (Kg x CRS)             += dY[n,g][:, j0:j1] (Kg x J) @ col^T (J x CRS)
// where col[(c*R + r)*S + s][j] = x[n, g*Cg + c, p*sh - ph + r*dh, q*sw - pw + s*dw] (0 outside). Small
// planes go several images side by side (conv.h, Batching).
#include <algorithm>
#include <cstring>

#include "../cpu_info.h"
#include "../gemm/gemm.h"
#include "../gemm/pack.h"
#include "conv.h"
#include "kernels.h"

namespace dnnkit {

index_t im2col_chunk(const ConvShape& sh, index_t max_workspace_elems, Batching batching) {
  const index_t pq = sh.pq();
  if (pq == 0) return 1;
  const index_t narrow = batching == Batching::depth ? kMinGemmDepth : kMinGemmColumns;
  if (batching != Batching::none && pq < narrow && sh.n >= 2) {
    const index_t per_image = batched_elems_per_image(sh, batching);
    const index_t nb = std::min<index_t>(sh.n, max_workspace_elems / std::max<index_t>(per_image, 1));
    if (nb >= 2) return nb * pq;
  }
  if (sh.is_pointwise()) return pq;
  index_t chunk = std::max<index_t>(1, max_workspace_elems / std::max<index_t>(sh.crs(), 1));
  if (chunk >= pq) return pq;
  // Whole output rows when possible: the im2col copy then runs along contiguous q.
  if (chunk >= sh.q) chunk = chunk / sh.q * sh.q;
  return chunk;
}

namespace {

// d[q] = s[q*stride] for q < n.
template <typename T>
inline void sample_row(T* d, const T* s, index_t n, index_t stride) {
  if (stride == 1)
    std::memcpy(d, s, sizeof(T) * n);
  else if (stride == 2)
    copy_stride2(d, s, n);
  else
    for (index_t q = 0; q < n; ++q) d[q] = s[q * stride];
}

// col (CRS x (j1-j0), row stride ldcol) from one image-group plane x (Cg x H x W).
template <typename T>
void im2col(const ConvShape& sh, const T* x, index_t j0, index_t j1, T* col, index_t ldcol = -1) {
  const index_t J = j1 - j0, R = sh.r, S = sh.s, H = sh.h, W = sh.w, Q = sh.q;
  if (ldcol < 0) ldcol = J;
  const index_t rows = sh.crs();
  // A 1x1 filter without padding reads inside the plane only: its row is channel `row`, and a run of
  // output row p is input row p*sh sampled every sw; no division or bounds test per row (on small
  // planes, a stride-2 layer's rows are a few values each, and those would take most of the time).
  const bool plain = R == 1 && S == 1 && sh.ph == 0 && sh.pw == 0;
  const index_t p_first = j0 / Q, q_first = j0 % Q;
#pragma omp parallel for schedule(static) num_threads(get_num_threads()) if (rows * J > 32768)
  for (index_t row = 0; row < rows; ++row) {
    if (plain) {
      const T* xc = x + row * H * W;
      T* dst = col + row * ldcol;
      index_t p = p_first, q0 = q_first;
      for (index_t j = j0; j < j1; ++p, q0 = 0) {
        const index_t n = std::min<index_t>(Q - q0, j1 - j);  // this output row's part of the chunk
        const T* xr = xc + p * sh.sh * W + q0 * sh.sw;
        T* d = dst + (j - j0);
        sample_row(d, xr, n, sh.sw);
        j += n;
      }
      continue;
    }
    const index_t c = row / (R * S), r = (row / S) % R, s = row % S;
    const T* xc = x + c * H * W;
    T* dst = col + row * ldcol;
    index_t q_lo, q_hi;
    valid_range(Q, W, sh.sw, sh.pw, s * sh.dw, &q_lo, &q_hi);
    // Output pixel j = p*Q + q: one division for the chunk's start, then whole output rows.
    index_t p = j0 / Q, q0 = j0 % Q;
    for (index_t j = j0; j < j1; ++p, q0 = 0) {
      const index_t q1 = std::min<index_t>(Q, q0 + (j1 - j));  // this output row's part of the chunk
      T* d = dst + (j - j0);
      const index_t ih = p * sh.sh - sh.ph + r * sh.dh;
      if (ih < 0 || ih >= H) {
        std::fill(d, d + (q1 - q0), T(0));
      } else {
        const T* xr = xc + ih * W - sh.pw + s * sh.dw;
        const index_t a = std::max(q0, q_lo), b = std::min(q1, q_hi);
        for (index_t q = q0; q < std::min(a, q1); ++q) d[q - q0] = T(0);
        if (b > a) sample_row(d + (a - q0), xr + a * sh.sw, b - a, sh.sw);
        for (index_t q = std::max(b, q0); q < q1; ++q) d[q - q0] = T(0);
      }
      j += q1 - q0;
    }
  }
}

// dx (Cg x H x W) += col2im(col) (CRS x (j1-j0), row stride ldcol); threads own whole input channels, so
// no two write one element.
template <typename T>
void col2im(const ConvShape& sh, const T* col, index_t j0, index_t j1, T* dx, index_t ldcol = -1) {
  const index_t J = j1 - j0, R = sh.r, S = sh.s, H = sh.h, W = sh.w, Q = sh.q;
  if (ldcol < 0) ldcol = J;
#pragma omp parallel for schedule(static) num_threads(get_num_threads()) if (sh.crs() * J > 32768)
  for (index_t c = 0; c < sh.cg(); ++c) {
    T* dxc = dx + c * H * W;
    for (index_t r = 0; r < R; ++r)
      for (index_t s = 0; s < S; ++s) {
        const T* src = col + ((c * R + r) * S + s) * ldcol;
        index_t q_lo, q_hi;
        valid_range(Q, W, sh.sw, sh.pw, s * sh.dw, &q_lo, &q_hi);
        index_t p = j0 / Q, q0 = j0 % Q;  // output pixel j = p*Q + q, advanced a row at a time
        for (index_t j = j0; j < j1; ++p, q0 = 0) {
          const index_t q1 = std::min<index_t>(Q, q0 + (j1 - j));
          const index_t ih = p * sh.sh - sh.ph + r * sh.dh;
          if (ih >= 0 && ih < H) {
            T* xr = dxc + ih * W - sh.pw + s * sh.dw;
            const T* sr = src + (j - j0) - q0;
            const index_t a = std::max(q0, q_lo), b = std::min(q1, q_hi);
            for (index_t q = a; q < b; ++q) xr[q * sh.sw] += sr[q];
          }
          j += q1 - q0;
        }
      }
  }
}

// nn images' planes side by side (rows x nn*PQ, row stride nn*PQ): row r of image n0 + i from
// in + ((n0 + i)*planes + r)*PQ. The inverse of unbatch.
template <typename T>
void batch(const T* in, index_t rows, index_t nn, index_t PQ, index_t n0, index_t planes, T* blk) {
  const index_t J = nn * PQ;
#pragma omp parallel for collapse(2) schedule(static) num_threads(get_num_threads()) if (rows * J > 32768)
  for (index_t i = 0; i < nn; ++i)
    for (index_t r = 0; r < rows; ++r)
      std::memcpy(blk + r * J + i * PQ, in + ((n0 + i) * planes + r) * PQ, sizeof(T) * PQ);
}

// The GEMM's output block for nn images side by side (rows x nn*PQ, row stride nn*PQ) back to NCHW:
// row r of image n0 + i to out + ((n0 + i)*planes + r)*PQ.
template <typename T>
void unbatch(const T* blk, index_t rows, index_t nn, index_t PQ, index_t n0, index_t planes, T* out) {
  const index_t J = nn * PQ;
#pragma omp parallel for collapse(2) schedule(static) num_threads(get_num_threads()) if (rows * J > 32768)
  for (index_t i = 0; i < nn; ++i)
    for (index_t r = 0; r < rows; ++r)
      std::memcpy(out + ((n0 + i) * planes + r) * PQ, blk + r * J + i * PQ, sizeof(T) * PQ);
}

}  // namespace

template <typename T>
void conv2d_fwd_im2col(const ConvShape& sh, const T* x, const T* w, const T* bias, T* y, T* col, index_t chunk) {
  const index_t Kg = sh.kg(), CRS = sh.crs(), PQ = sh.pq(), HW = sh.h * sh.w;
  const index_t nb = images_per_chunk(sh, chunk);
  if (nb > 1) {
    // nb images side by side: col (CRS x nb*PQ), one GEMM into yt (Kg x nb*PQ), then yt -> NCHW. A 1x1
    // stride-1 convolution needs no col: the GEMM packs its B straight from the nb input planes.
    const bool pointwise = sh.is_pointwise();
    T* yt = pointwise ? col : col + CRS * nb * PQ;
    for (index_t n0 = 0; n0 < sh.n; n0 += nb) {
      const index_t nn = std::min(nb, sh.n - n0), J = nn * PQ;
      for (index_t g = 0; g < sh.g; ++g) {
        const T* xg = x + (n0 * sh.c + g * sh.cg()) * HW;
        if (!pointwise)
          for (index_t i = 0; i < nn; ++i) im2col(sh, xg + i * sh.c * HW, 0, PQ, col + i * PQ, J);
        GemmArgs<T> a = strided_gemm_args<T>(Kg, J, CRS, w + g * Kg * CRS, CRS, 1, pointwise ? xg : col,
                                             pointwise ? HW : J, 1, yt, J, T(0));
        if (pointwise) {
          a.b_group_cols = PQ;
          a.b_group_stride = sh.c * HW;
        }
        a.bias = bias ? bias + g * Kg : nullptr;
        a.bias_per_row = true;
        gemm<T>(a);
        unbatch(yt, Kg, nn, PQ, n0, sh.k, y + g * Kg * PQ);
      }
    }
    return;
  }
  for (index_t n = 0; n < sh.n; ++n)
    for (index_t g = 0; g < sh.g; ++g) {
      const T* xg = x + (n * sh.c + g * sh.cg()) * HW;
      const T* wg = w + g * Kg * CRS;
      T* yg = y + (n * sh.k + g * Kg) * PQ;
      for (index_t j0 = 0; j0 < PQ; j0 += chunk) {
        const index_t J = std::min(chunk, PQ - j0);
        const T* b = xg + j0;  // pointwise: the input plane is B (Cg x HW)
        index_t ldb = HW;
        if (!sh.is_pointwise()) {
          im2col(sh, xg, j0, j0 + J, col);
          b = col;
          ldb = J;
        }
        GemmArgs<T> a = strided_gemm_args<T>(Kg, J, CRS, wg, CRS, 1, b, ldb, 1, yg + j0, PQ, T(0));
        a.bias = bias ? bias + g * Kg : nullptr;
        a.bias_per_row = true;
        gemm<T>(a);
      }
    }
}

template <typename T>
void conv2d_bwd_data_col2im(const ConvShape& sh, const T* w, const T* dy, T* dx, T* col, index_t chunk) {
  const index_t Kg = sh.kg(), CRS = sh.crs(), PQ = sh.pq(), HW = sh.h * sh.w;
  const index_t nb = images_per_chunk(sh, chunk);
  if (nb > 1) {
    // nb images side by side as in the forward pass: one GEMM whose B is packed straight from the nb
    // gradient planes, into col (CRS x nb*PQ); then a 1x1 stride-1 layer's block goes to NCHW as it is
    // (CRS == Cg, PQ == HW), other kernels' through col2im image by image.
    for (index_t n0 = 0; n0 < sh.n; n0 += nb) {
      const index_t nn = std::min(nb, sh.n - n0), J = nn * PQ;
      for (index_t g = 0; g < sh.g; ++g) {
        GemmArgs<T> a = strided_gemm_args<T>(CRS, J, Kg, w + g * Kg * CRS, 1, CRS, dy + (n0 * sh.k + g * Kg) * PQ, PQ,
                                             1, col, J, T(0));
        a.b_group_cols = PQ;
        a.b_group_stride = sh.k * PQ;
        gemm<T>(a);
        if (sh.is_pointwise()) {
          unbatch(col, CRS, nn, PQ, n0, sh.c, dx + g * sh.cg() * HW);
          continue;
        }
        for (index_t i = 0; i < nn; ++i) {
          T* dxg = dx + ((n0 + i) * sh.c + g * sh.cg()) * HW;
          std::fill(dxg, dxg + sh.cg() * HW, T(0));
          col2im(sh, col + i * PQ, 0, PQ, dxg, J);
        }
      }
    }
    return;
  }
  for (index_t n = 0; n < sh.n; ++n)
    for (index_t g = 0; g < sh.g; ++g) {
      const T* wg = w + g * Kg * CRS;
      const T* dyg = dy + (n * sh.k + g * Kg) * PQ;
      T* dxg = dx + (n * sh.c + g * sh.cg()) * HW;
      if (sh.is_pointwise()) {  // dX_g (Cg x HW) = W_g^T (Cg x Kg) @ dY_g (Kg x PQ), PQ == HW
        gemm<T>(strided_gemm_args<T>(sh.cg(), PQ, Kg, wg, 1, CRS, dyg, PQ, 1, dxg, HW, T(0)));
        continue;
      }
      std::fill(dxg, dxg + sh.cg() * HW, T(0));
      for (index_t j0 = 0; j0 < PQ; j0 += chunk) {
        const index_t J = std::min(chunk, PQ - j0);
        gemm<T>(strided_gemm_args<T>(CRS, J, Kg, wg, 1, CRS, dyg + j0, PQ, 1, col, J, T(0)));
        col2im(sh, col, j0, j0 + J, dxg);
      }
    }
}

template <typename T>
void conv2d_bwd_filter_im2col(const ConvShape& sh, const T* x, const T* dy, T* dw, T* col, index_t chunk) {
  const index_t Kg = sh.kg(), CRS = sh.crs(), PQ = sh.pq(), HW = sh.h * sh.w;
  const int nt = im2col_bwd_filter_threads(sh);
  const index_t nb = nt > 1 ? 1 : images_per_chunk(sh, chunk);
  if (nb > 1) {
    // nb images side by side along the depth: colb (CRS x nb*PQ) and dyb (Kg x nb*PQ), one GEMM.
    T* const colb = col;
    T* const dyb = col + CRS * nb * PQ;
    for (index_t g = 0; g < sh.g; ++g) {
      T* dwg = dw + g * Kg * CRS;
      T beta = T(0);
      for (index_t n0 = 0; n0 < sh.n; n0 += nb) {
        const index_t nn = std::min(nb, sh.n - n0), J = nn * PQ;
        if (sh.is_pointwise()) {
          batch(x + g * sh.cg() * HW, CRS, nn, PQ, n0, sh.c, colb);  // 1x1 stride 1: HW == PQ, CRS == Cg
        } else {
          const T* xg = x + (n0 * sh.c + g * sh.cg()) * HW;
          for (index_t i = 0; i < nn; ++i) im2col(sh, xg + i * sh.c * HW, 0, PQ, colb + i * PQ, J);
        }
        batch(dy + g * Kg * PQ, Kg, nn, PQ, n0, sh.k, dyb);
        gemm<T>(strided_gemm_args<T>(Kg, CRS, J, dyb, J, 1, colb, 1, J, dwg, CRS, beta));
        beta = T(1);
      }
      if (beta == T(0)) std::fill(dwg, dwg + Kg * CRS, T(0));
    }
    return;
  }
  if (nt > 1) {
    const index_t col_part = round_up(col_elems(sh, chunk), 16), per = col_part + round_up(sh.k * CRS, 16);
    // Each thread's columns within a quarter of its share of L3 (whole output rows, one at least), so that
    // the GEMM's packing reads them back from cache rather than memory (bench/conv.py --direction
    // bwd_filter --filter conv1).
    const index_t fit = static_cast<index_t>(l3_cache_bytes()) / (4 * nt * CRS * static_cast<index_t>(sizeof(T)));
    if (!sh.is_pointwise() && fit > 0 && fit < chunk) chunk = std::min(chunk, std::max(fit / sh.q, index_t(1)) * sh.q);
#pragma omp parallel num_threads(nt)
    {
      const int tid = thread_id();
      T* const mycol = col + tid * per;
      T* const mydw = mycol + col_part;
      for (index_t g = 0; g < sh.g; ++g) {
        T* dwg = mydw + g * Kg * CRS;
        T beta = T(0);
        for (index_t n = tid; n < sh.n; n += nt) {
          const T* xg = x + (n * sh.c + g * sh.cg()) * HW;
          const T* dyg = dy + (n * sh.k + g * Kg) * PQ;
          for (index_t j0 = 0; j0 < PQ; j0 += chunk) {
            const index_t J = std::min(chunk, PQ - j0);
            const T* b = xg + j0;
            index_t ldb = HW;
            if (!sh.is_pointwise()) {
              im2col(sh, xg, j0, j0 + J, mycol);  // nested: on this thread alone
              b = mycol;
              ldb = J;
            }
            gemm<T>(strided_gemm_args<T>(Kg, CRS, J, dyg + j0, PQ, 1, b, 1, ldb, dwg, CRS, beta), 1);
            beta = T(1);
          }
        }
        if (beta == T(0)) std::fill(dwg, dwg + Kg * CRS, T(0));
      }
#pragma omp barrier
      const index_t total = sh.k * CRS;
#pragma omp for schedule(static)
      for (index_t i = 0; i < total; ++i) {
        T s = col[col_part + i];
        for (int t = 1; t < nt; ++t) s += col[t * per + col_part + i];
        dw[i] = s;
      }
    }
    return;
  }
  for (index_t g = 0; g < sh.g; ++g) {
    T* dwg = dw + g * Kg * CRS;
    T beta = T(0);
    for (index_t n = 0; n < sh.n; ++n) {
      const T* xg = x + (n * sh.c + g * sh.cg()) * HW;
      const T* dyg = dy + (n * sh.k + g * Kg) * PQ;
      for (index_t j0 = 0; j0 < PQ; j0 += chunk) {
        const index_t J = std::min(chunk, PQ - j0);
        const T* b = xg + j0;  // pointwise: col^T is the input plane, transposed
        index_t ldb = HW;
        if (!sh.is_pointwise()) {
          im2col(sh, xg, j0, j0 + J, col);
          b = col;
          ldb = J;
        }
        // dW_g (Kg x CRS) (+)= dY (Kg x J) @ col^T (J x CRS); col^T(j, crs) = b[crs*ldb + j]
        gemm<T>(strided_gemm_args<T>(Kg, CRS, J, dyg + j0, PQ, 1, b, 1, ldb, dwg, CRS, beta));
        beta = T(1);
      }
    }
    if (beta == T(0)) std::fill(dwg, dwg + Kg * CRS, T(0));  // empty batch or output
  }
}

template <typename T>
void conv2d_bwd_bias(const ConvShape& sh, const T* dy, T* db) {
  const index_t PQ = sh.pq();
#pragma omp parallel for schedule(static) num_threads(get_num_threads()) if (sh.k * sh.n * PQ > 65536)
  for (index_t k = 0; k < sh.k; ++k) {
    double acc = 0;
    for (index_t n = 0; n < sh.n; ++n) {
      const T* p = dy + (n * sh.k + k) * PQ;
      for (index_t j = 0; j < PQ; ++j) acc += static_cast<double>(p[j]);
    }
    db[k] = static_cast<T>(acc);
  }
}

#define DNNKIT_INSTANTIATE(T)                                                                            \
  template void conv2d_fwd_im2col<T>(const ConvShape&, const T*, const T*, const T*, T*, T*, index_t);   \
  template void conv2d_bwd_data_col2im<T>(const ConvShape&, const T*, const T*, T*, T*, index_t);        \
  template void conv2d_bwd_filter_im2col<T>(const ConvShape&, const T*, const T*, T*, T*, index_t);      \
  template void conv2d_bwd_bias<T>(const ConvShape&, const T*, T*);
DNNKIT_INSTANTIATE(float)
DNNKIT_INSTANTIATE(double)
#undef DNNKIT_INSTANTIATE

// ---- the kernel table (kernels.h): chunk is output pixels a column buffer holds.
namespace {
index_t col_workspace(const ConvShape& sh, index_t chunk, index_t) { return col_elems(sh, chunk); }
index_t bwd_filter_workspace(const ConvShape& sh, index_t chunk, index_t) { return im2col_bwd_filter_elems(sh, chunk); }
template <typename T>
void im2col_fwd(const ConvShape& sh, const ConvCall& c) {
  conv2d_fwd_im2col<T>(sh, static_cast<const T*>(c.a0), static_cast<const T*>(c.a1), static_cast<const T*>(c.bias),
                       static_cast<T*>(c.out), static_cast<T*>(c.ws), c.chunk);
}
template <typename T>
void col2im_bwd_data(const ConvShape& sh, const ConvCall& c) {
  conv2d_bwd_data_col2im<T>(sh, static_cast<const T*>(c.a0), static_cast<const T*>(c.a1), static_cast<T*>(c.out),
                            static_cast<T*>(c.ws), c.chunk);
}
template <typename T>
void im2col_bwd_filter(const ConvShape& sh, const ConvCall& c) {
  conv2d_bwd_filter_im2col<T>(sh, static_cast<const T*>(c.a0), static_cast<const T*>(c.a1), static_cast<T*>(c.out),
                              static_cast<T*>(c.ws), c.chunk);
}
template <typename T>
void bias_grad(const ConvShape& sh, const ConvCall& c) {
  conv2d_bwd_bias<T>(sh, static_cast<const T*>(c.a0), static_cast<T*>(c.out));
}
CONV_KERNEL("fwd", "im2col_gemm", nullptr, col_workspace, CONV_RUNS(im2col_fwd));
CONV_KERNEL("bwd_data", "gemm_col2im", nullptr, col_workspace, CONV_RUNS(col2im_bwd_data));
CONV_KERNEL("bwd_filter", "im2col_gemm", nullptr, bwd_filter_workspace, CONV_RUNS(im2col_bwd_filter));
CONV_KERNEL("bwd_bias", "sum", nullptr, nullptr, CONV_RUNS(bias_grad));
}  // namespace

}  // namespace dnnkit
