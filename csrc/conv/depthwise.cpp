// Depthwise forward convolution (one input channel per group: C/G == 1, any channel multiplier K/G).
//
// Per (image, group): the input plane is copied once into a zero-padded buffer (caller workspace, one
// plane per thread) wide enough that every output vector reads its window with no edge case; then each
// output channel of the group is computed from it with the R x S weights as scalars and the outputs as
// vectors: kRows output rows x a block of kColVecs register vectors of columns at a time, so that
// many independent accumulators, all in registers, hide the multiply-add latency. The work is a few
// multiply-adds per element moved, so the plane copy and the output write bound it: one pass over the
// input and one over the output.
#include <algorithm>
#include <cstring>

#include "../simd/vec.h"
#include "conv.h"
#include "kernels.h"

namespace dnnkit {
namespace {

constexpr index_t kRows = 4;
// Register vectors of columns a block: up to 64 bytes of them, the accumulators (kRows of them each)
// within half the register file.
constexpr index_t kColVecs = std::max(1, std::min(64 / kRegBytes, kVecRegs / 2 / static_cast<int>(kRows)));
// Columns a block.
template <typename T>
constexpr index_t kBlockCols = kColVecs * RegVec<T>::lanes;

struct Plane {
  index_t rows, cols;  // padded plane: rows x cols, row stride cols
};

template <typename T>
Plane padded_plane(const ConvShape& sh) {
  const index_t qv = round_up(std::max<index_t>(sh.q, 1), kBlockCols<T>);  // outputs per row, whole blocks
  const index_t pr = round_up(std::max<index_t>(sh.p, 1), kRows);      // output rows, whole row blocks
  return {(pr - 1) * sh.sh + (sh.r - 1) * sh.dh + 1, (qv - 1) * sh.sw + (sh.s - 1) * sh.dw + 1};
}

// One output plane from the padded input plane: kRows output rows x one block of columns at a time.
// RS, SS > 0: the filter size and unit stride/dilation along the row fixed at compile time.
template <typename T, int RS, int SS>
void plane_rows(const ConvShape& sh, const Plane& pl, const T* buf, const T* wk, T b, T* yk) {
  using V = reg_vec_t<T>;
  constexpr index_t L = RegVec<T>::lanes, NV = kColVecs, CB = kBlockCols<T>;
  const index_t R = RS > 0 ? RS : sh.r, S = SS > 0 ? SS : sh.s, P = sh.p, Q = sh.q;
  const index_t sw = SS > 0 ? 1 : sh.sw, dw = SS > 0 ? 1 : sh.dw;
  const index_t row_step = sh.sh * pl.cols;
  for (index_t p0 = 0; p0 < P; p0 += kRows) {
    const index_t pn = std::min(kRows, P - p0);
    for (index_t q0 = 0; q0 < Q; q0 += CB) {
      V acc[kRows][NV];
#pragma GCC unroll 4
      for (index_t i = 0; i < kRows; ++i)
#pragma GCC unroll 4
        for (index_t v = 0; v < NV; ++v) acc[i][v] = splat<V>(b);
#pragma GCC unroll 3
      for (index_t r = 0; r < R; ++r)
#pragma GCC unroll 3
        for (index_t s = 0; s < S; ++s) {
          const V wv = splat<V>(wk[r * S + s]);
          const T* src = buf + (p0 * sh.sh + r * sh.dh) * pl.cols + q0 * sw + s * dw;
#pragma GCC unroll 4
          for (index_t i = 0; i < kRows; ++i)
#pragma GCC unroll 4
            for (index_t v = 0; v < NV; ++v) {
              V xv;
              if (sw == 1) {
                std::memcpy(&xv, src + i * row_step + v * L, sizeof(V));
              } else {
                for (index_t l = 0; l < L; ++l) xv[l] = src[i * row_step + (v * L + l) * sw];
              }
              acc[i][v] += xv * wv;
            }
        }
      const index_t qn = std::min(CB, Q - q0);
      for (index_t i = 0; i < pn; ++i) {
        T* dst = yk + (p0 + i) * Q + q0;
        if (qn == CB) {
          std::memcpy(dst, acc[i], sizeof(V) * NV);
        } else {
          alignas(64) T lanes[CB];
          std::memcpy(lanes, acc[i], sizeof(V) * NV);
          std::memcpy(dst, lanes, sizeof(T) * qn);
        }
      }
    }
  }
}

}  // namespace

index_t depthwise_workspace_elems(const ConvShape& sh, int nthreads) {
  // Sized for float32's block, which needs more padding columns than float64's.
  const Plane pl = padded_plane<float>(sh);
  return std::max<index_t>(1, nthreads) * pl.rows * pl.cols;
}

template <typename T>
void conv2d_fwd_depthwise(const ConvShape& sh, const T* x, const T* w, const T* bias, T* y, T* ws,
                          index_t ws_elems) {
  const Plane pl = padded_plane<T>(sh);
  const index_t plane = pl.rows * pl.cols;
  const index_t H = sh.h, W = sh.w, P = sh.p, Q = sh.q, R = sh.r, S = sh.s, Kg = sh.kg();
  const index_t tasks = sh.n * sh.g;
  const int nt = static_cast<int>(std::max<index_t>(
      1, std::min<index_t>({static_cast<index_t>(get_num_threads()), ws_elems / plane, tasks})));
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    T* buf = ws + static_cast<index_t>(thread_id()) * plane;
#pragma omp for schedule(static)
    for (index_t t = 0; t < tasks; ++t) {
      const index_t n = t / sh.g, g = t % sh.g;
      // buf[u][v] = x[n, g, u - ph, v - pw], zero outside the image.
      const T* xc = x + (n * sh.c + g) * H * W;
      for (index_t u = 0; u < pl.rows; ++u) {
        T* row = buf + u * pl.cols;
        const index_t ih = u - sh.ph;
        if (ih < 0 || ih >= H) {
          std::fill(row, row + pl.cols, T(0));
          continue;
        }
        const index_t lead = std::min(pl.cols, sh.pw);
        std::fill(row, row + lead, T(0));
        const index_t n_in = std::max<index_t>(0, std::min(W, pl.cols - sh.pw));
        std::memcpy(row + lead, xc + ih * W, sizeof(T) * n_in);
        std::fill(row + lead + n_in, row + pl.cols, T(0));
      }
      for (index_t kk = 0; kk < Kg; ++kk) {
        const index_t k = g * Kg + kk;
        const T* wk = w + k * R * S;
        const T b = bias ? bias[k] : T(0);
        T* yk = y + (n * sh.k + k) * P * Q;
        if (R == 3 && S == 3 && sh.sw == 1 && sh.dw == 1)
          plane_rows<T, 3, 3>(sh, pl, buf, wk, b, yk);  // the common case, with the loops unrolled
        else
          plane_rows<T, 0, 0>(sh, pl, buf, wk, b, yk);
      }
    }
  }
}

template void conv2d_fwd_depthwise<float>(const ConvShape&, const float*, const float*, const float*, float*, float*,
                                          index_t);
template void conv2d_fwd_depthwise<double>(const ConvShape&, const double*, const double*, const double*, double*,
                                           double*, index_t);

// ---- the kernel table (kernels.h): chunk is the threads (one padded plane each).
namespace {
std::string depthwise_rejects(const ConvShape& sh) {
  return sh.cg() == 1 ? "" : "depthwise needs one input channel per group";
}
index_t depthwise_workspace(const ConvShape& sh, index_t threads, index_t) {
  return depthwise_workspace_elems(sh, static_cast<int>(threads));
}
template <typename T>
void depthwise_fwd(const ConvShape& sh, const ConvCall& c) {
  conv2d_fwd_depthwise<T>(sh, static_cast<const T*>(c.a0), static_cast<const T*>(c.a1), static_cast<const T*>(c.bias),
                          static_cast<T*>(c.out), static_cast<T*>(c.ws), c.ws_elems);
}
CONV_KERNEL("fwd", "depthwise", depthwise_rejects, depthwise_workspace, CONV_RUNS(depthwise_fwd));
}  // namespace

}  // namespace dnnkit
