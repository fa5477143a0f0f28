// Winograd convolution F(m x m, 3 x 3) for 3x3, stride-1, dense filters (Lavin & Gray, "Fast
// Algorithms for Convolutional Neural Networks"), any padding and groups. With alpha = m + 2:
//   U[xi,nu][k][c] = (G g_kc G^T)[xi][nu]                       filter transform   (alpha x alpha per k, c)
//   V[xi,nu][c][t] = (B^T d_ct B)[xi][nu]                       input transform    (d: the alpha x alpha input tile)
//   M[xi,nu]       = U[xi,nu] (Kg x Cg) @ V[xi,nu] (Cg x T)     alpha^2 GEMMs on dnnkit's blocked GEMM
//   y tile (m x m) = A^T M[.,.][k][t] A (+ bias)               output transform
// Tiles t run over (n, tile row, tile column); they are processed tc at a time so V and M stay within
// the workspace. The multiplications per output drop from 9 to alpha^2 / m^2 (4 for m = 2, 2.25 for m = 4).
#include <algorithm>
#include <cstring>
#include <vector>

#include "../gemm/gemm.h"
#include "winograd.h"

namespace dnnkit {
namespace {

template <int M>
struct WinogradMatrices;

// F(2x2, 3x3): interpolation points 0, 1, -1, infinity.
template <>
struct WinogradMatrices<2> {
  static constexpr int alpha = 4;
  static constexpr double BT[4][4] = {{1, 0, -1, 0}, {0, 1, 1, 0}, {0, -1, 1, 0}, {0, 1, 0, -1}};
  static constexpr double G[4][3] = {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}};
  static constexpr double AT[2][4] = {{1, 1, 1, 0}, {0, 1, -1, -1}};
};

// F(4x4, 3x3): interpolation points 0, 1, -1, 2, -2, infinity.
template <>
struct WinogradMatrices<4> {
  static constexpr int alpha = 6;
  static constexpr double BT[6][6] = {{4, 0, -5, 0, 1, 0},  {0, -4, -4, 1, 1, 0}, {0, 4, -4, -1, 1, 0},
                                      {0, -2, -1, 2, 1, 0}, {0, 2, -1, -2, 1, 0}, {0, 4, 0, -5, 0, 1}};
  static constexpr double G[6][3] = {{1.0 / 4, 0, 0},
                                     {-1.0 / 6, -1.0 / 6, -1.0 / 6},
                                     {-1.0 / 6, 1.0 / 6, -1.0 / 6},
                                     {1.0 / 24, 1.0 / 12, 1.0 / 6},
                                     {1.0 / 24, -1.0 / 12, 1.0 / 6},
                                     {0, 0, 1}};
  static constexpr double AT[4][6] = {
      {1, 1, 1, 1, 1, 0}, {0, 1, -1, 2, -2, 0}, {0, 1, 1, 4, 4, 0}, {0, 1, -1, 8, -8, 1}};
};

struct Tiling {
  index_t th, tw, tiles;  // tile rows and columns per image, tiles over the batch
};

template <int M>
Tiling tiling(const ConvShape& sh) {
  Tiling t;
  t.th = ceil_div(sh.p, M);
  t.tw = ceil_div(sh.q, M);
  t.tiles = sh.n * t.th * t.tw;
  return t;
}

// U (G x alpha^2 x Kg x Cg) from w (K x Cg x 3 x 3). Per output channel k: transpose its filters to
// wt (9 x Cg), then each of the alpha^2 outputs is a contiguous multiply-add along c (vectorized), with
// coefficients (G)_{i,a} (G)_{j,b} known at compile time.
template <typename T, int M>
void filter_transform(const ConvShape& sh, const T* w, T* u) {
  using W = WinogradMatrices<M>;
  constexpr int A = W::alpha;
  const index_t Kg = sh.kg(), Cg = sh.cg();
#pragma omp parallel num_threads(get_num_threads()) if (sh.k * Cg > 256)
  {
    std::vector<T> wt(static_cast<std::size_t>(9 * Cg));
#pragma omp for schedule(static)
    for (index_t k = 0; k < sh.k; ++k) {
      const index_t g = k / Kg, kk = k % Kg;
      const T* f = w + k * Cg * 9;
      for (index_t c = 0; c < Cg; ++c)
        for (int ab = 0; ab < 9; ++ab) wt[ab * Cg + c] = f[c * 9 + ab];
      T* ug = u + g * A * A * Kg * Cg;
      for (int i = 0; i < A; ++i)
        for (int j = 0; j < A; ++j) {
          T coef[9];
          for (int a = 0; a < 3; ++a)
            for (int b = 0; b < 3; ++b) coef[a * 3 + b] = T(W::G[i][a] * W::G[j][b]);
          T* dst = ug + ((i * A + j) * Kg + kk) * Cg;
          const T* src = wt.data();
#pragma omp simd
          for (index_t c = 0; c < Cg; ++c) {
            T acc = T(0);
            for (int ab = 0; ab < 9; ++ab) acc += coef[ab] * src[ab * Cg + c];
            dst[c] = acc;
          }
        }
    }
  }
}

// Tiles transformed together: their data sit tile-fastest in L1-resident buffers, so each transform pass
// is a loop of kTileBlock multiply-adds with a compile-time coefficient (vectorized).
constexpr index_t kTileBlock = 64;

// Applies the alpha x alpha (or m x alpha) matrix Mat along one index of a tile-fastest block:
//   out[(i*A + j)*nb + u] = sum_l Mat[i][l] * in[(l*A + j)*nb + u]   (rows: over the first index)
//   out[(i*R + j)*nb + u] = sum_l Mat[j][l] * in[(i*A + l)*nb + u]   (cols: over the second index)
template <typename T, int R, int A, bool kRows>
inline void transform_block(const double (&mat)[R][A], const T* in, T* out, index_t nb, int outer) {
  for (int i = 0; i < (kRows ? R : outer); ++i)
    for (int j = 0; j < (kRows ? A : R); ++j) {
      T* dst = out + (i * (kRows ? A : R) + j) * nb;
      for (index_t u = 0; u < nb; ++u) dst[u] = T(0);
      for (int l = 0; l < A; ++l) {
        const T coef = T(kRows ? mat[i][l] : mat[j][l]);
        if (coef == T(0)) continue;
        const T* src = in + (kRows ? (l * A + j) : (i * A + l)) * nb;
#pragma omp simd
        for (index_t u = 0; u < nb; ++u) dst[u] += coef * src[u];
      }
    }
}

// V (alpha^2 x Cg x tc) for tiles [t0, t0 + tc) of group g; work items are (channel, block of tiles).
template <typename T, int M>
void input_transform(const ConvShape& sh, const Tiling& tl, const T* x, index_t g, index_t t0, index_t tc, T* v) {
  using W = WinogradMatrices<M>;
  constexpr int A = W::alpha;
  const index_t Cg = sh.cg(), H = sh.h, Wd = sh.w, per_image = tl.th * tl.tw;
  const index_t nblocks = ceil_div(tc, kTileBlock);
#pragma omp parallel num_threads(get_num_threads()) if (Cg * tc > 64)
  {
    alignas(64) T db[A * A * kTileBlock];
    alignas(64) T tb[A * A * kTileBlock];
#pragma omp for schedule(static)
    for (index_t item = 0; item < Cg * nblocks; ++item) {
      const index_t c = item / nblocks, b0 = (item % nblocks) * kTileBlock;
      const index_t nb = std::min(kTileBlock, tc - b0);
      // Gather: db[(i*A + j)*nb + u] = x[n, c, ih0 + i, iw0 + j] of tile t0 + b0 + u (0 outside).
      for (index_t u = 0; u < nb; ++u) {
        const index_t t = t0 + b0 + u, n = t / per_image, r = t % per_image;
        const index_t ih0 = (r / tl.tw) * M - sh.ph, iw0 = (r % tl.tw) * M - sh.pw;
        const T* xc = x + (n * sh.c + g * Cg + c) * H * Wd;
        if (ih0 >= 0 && ih0 + A <= H && iw0 >= 0 && iw0 + A <= Wd) {
          const T* x0 = xc + ih0 * Wd + iw0;
          for (int i = 0; i < A; ++i)
            for (int j = 0; j < A; ++j) db[(i * A + j) * nb + u] = x0[i * Wd + j];
        } else {
          for (int i = 0; i < A; ++i) {
            const index_t ih = ih0 + i;
            for (int j = 0; j < A; ++j) {
              const index_t iw = iw0 + j;
              db[(i * A + j) * nb + u] = (ih >= 0 && ih < H && iw >= 0 && iw < Wd) ? xc[ih * Wd + iw] : T(0);
            }
          }
        }
      }
      transform_block<T, A, A, true>(W::BT, db, tb, nb, A);   // B^T d
      transform_block<T, A, A, false>(W::BT, tb, db, nb, A);  // (B^T d) B
      for (int e = 0; e < A * A; ++e)
        std::memcpy(v + (e * Cg + c) * tc + b0, db + e * nb, sizeof(T) * nb);
    }
  }
}

// y tiles [t0, t0 + tc) of group g from M (alpha^2 x Kg x tc); work items are (output channel, block).
template <typename T, int M>
void output_transform(const ConvShape& sh, const Tiling& tl, const T* mm, const T* bias, index_t g, index_t t0,
                      index_t tc, T* y) {
  using W = WinogradMatrices<M>;
  constexpr int A = W::alpha;
  const index_t Kg = sh.kg(), P = sh.p, Q = sh.q, per_image = tl.th * tl.tw;
  const index_t nblocks = ceil_div(tc, kTileBlock);
#pragma omp parallel num_threads(get_num_threads()) if (Kg * tc > 64)
  {
    alignas(64) T mb[A * A * kTileBlock];
    alignas(64) T tb[M * A * kTileBlock];
    alignas(64) T ob[M * M * kTileBlock];
#pragma omp for schedule(static)
    for (index_t item = 0; item < Kg * nblocks; ++item) {
      const index_t kk = item / nblocks, b0 = (item % nblocks) * kTileBlock;
      const index_t nb = std::min(kTileBlock, tc - b0);
      for (int e = 0; e < A * A; ++e) std::memcpy(mb + e * nb, mm + (e * Kg + kk) * tc + b0, sizeof(T) * nb);
      transform_block<T, M, A, true>(W::AT, mb, tb, nb, M);   // A^T m   (M x A)
      transform_block<T, M, A, false>(W::AT, tb, ob, nb, M);  // (A^T m) A  (M x M)
      const index_t k = g * Kg + kk;
      const T bv = bias ? bias[k] : T(0);
      for (index_t u = 0; u < nb; ++u) {
        const index_t t = t0 + b0 + u, n = t / per_image, r = t % per_image;
        const index_t p0 = (r / tl.tw) * M, q0 = (r % tl.tw) * M;
        T* yk = y + (n * sh.k + k) * P * Q;
        const int mi = static_cast<int>(std::min<index_t>(M, P - p0)), mj = static_cast<int>(std::min<index_t>(M, Q - q0));
        for (int i = 0; i < mi; ++i)
          for (int j = 0; j < mj; ++j) yk[(p0 + i) * Q + q0 + j] = ob[(i * M + j) * nb + u] + bv;
      }
    }
  }
}

}  // namespace

index_t winograd_tile_chunk(const ConvShape& sh, int m, index_t max_workspace_elems) {
  const index_t a2 = static_cast<index_t>(m + 2) * (m + 2);
  const index_t tiles = sh.n * ceil_div(sh.p, m) * ceil_div(sh.q, m);
  const index_t u = sh.g * a2 * sh.kg() * sh.cg();
  const index_t per_tile = a2 * (sh.cg() + sh.kg());
  const index_t room = max_workspace_elems - u;
  if (tiles == 0) return 1;
  if (room < per_tile) return 1;  // at least one tile; workspace_elems() reports what that needs
  return std::min<index_t>(tiles, room / per_tile);
}

index_t winograd_workspace_elems(const ConvShape& sh, int m, index_t tc) {
  const index_t a2 = static_cast<index_t>(m + 2) * (m + 2);
  return sh.g * a2 * sh.kg() * sh.cg() + a2 * (sh.cg() + sh.kg()) * tc;
}

template <typename T, int M>
void conv2d_fwd_winograd_impl(const ConvShape& sh, const T* x, const T* w, const T* bias, T* y, T* ws, index_t tc) {
  constexpr int A = WinogradMatrices<M>::alpha;
  const Tiling tl = tiling<M>(sh);
  const index_t Kg = sh.kg(), Cg = sh.cg();
  T* u = ws;
  T* v = u + sh.g * A * A * Kg * Cg;
  T* mm = v + A * A * Cg * tc;
  filter_transform<T, M>(sh, w, u);
  for (index_t g = 0; g < sh.g; ++g) {
    const T* ug = u + g * A * A * Kg * Cg;
    for (index_t t0 = 0; t0 < tl.tiles; t0 += tc) {
      const index_t n_t = std::min(tc, tl.tiles - t0);
      input_transform<T, M>(sh, tl, x, g, t0, n_t, v);
      for (int e = 0; e < A * A; ++e) {
        GemmArgs<T> a;
        a.m = Kg;
        a.n = n_t;
        a.k = Cg;
        a.a = ug + e * Kg * Cg;
        a.rs_a = Cg;
        a.cs_a = 1;
        a.b = v + e * Cg * n_t;
        a.rs_b = n_t;
        a.cs_b = 1;
        a.c = mm + e * Kg * n_t;
        a.rs_c = n_t;
        a.cs_c = 1;
        gemm<T>(a);
      }
      output_transform<T, M>(sh, tl, mm, bias, g, t0, n_t, y);
    }
  }
}

template <typename T>
void conv2d_fwd_winograd(const ConvShape& sh, int m, const T* x, const T* w, const T* bias, T* y, T* ws, index_t tc) {
  if (m == 2)
    conv2d_fwd_winograd_impl<T, 2>(sh, x, w, bias, y, ws, tc);
  else
    conv2d_fwd_winograd_impl<T, 4>(sh, x, w, bias, y, ws, tc);
}

template void conv2d_fwd_winograd<float>(const ConvShape&, int, const float*, const float*, const float*, float*,
                                         float*, index_t);
template void conv2d_fwd_winograd<double>(const ConvShape&, int, const double*, const double*, const double*,
                                          double*, double*, index_t);

}  // namespace dnnkit
