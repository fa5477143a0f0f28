// Winograd's shared machinery (winograd.cpp: forward and backward data; winograd_bwd_filter.cpp): the
// transform matrices, tile transforms (on csrc/simd/vec.h's vectors), the tiling of the output and
// chunks of tiles, the forward's plan, and the input transform of a channel into the micro-kernel's panels.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "../gemm/gemm.h"
#include "../simd/vec.h"
#include "winograd.h"

namespace dnnkit {
namespace winograd_detail {

template <int M>
struct WinogradMatrices;

// F(2x2, 3x3): interpolation points 0, 1, -1, infinity.
template <>
struct WinogradMatrices<2> {
  static constexpr int alpha = 4;
  static constexpr double BT[4][4] = {{1, 0, -1, 0}, {0, 1, 1, 0}, {0, -1, 1, 0}, {0, 1, 0, -1}};
  static constexpr double G[4][3] = {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}};
  static constexpr double AT[2][4] = {{1, 1, 1, 0}, {0, 1, -1, -1}};
  // Transposes, for the weight gradient (AT^T and G^T).
  static constexpr double A[4][2] = {{1, 0}, {1, 1}, {1, -1}, {0, -1}};
  static constexpr double GT[3][4] = {{1, 0.5, 0.5, 0}, {0, 0.5, -0.5, 0}, {0, 0.5, 0.5, 1}};
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
  // Transposes, for the weight gradient (AT^T and G^T).
  static constexpr double A[6][4] = {{1, 0, 0, 0}, {1, 1, 1, 1},   {1, -1, 1, -1},
                                     {1, 2, 4, 8}, {1, -2, 4, -8}, {0, 0, 0, 1}};
  static constexpr double GT[3][6] = {{1.0 / 4, -1.0 / 6, -1.0 / 6, 1.0 / 24, 1.0 / 24, 0},
                                      {0, -1.0 / 6, 1.0 / 6, 1.0 / 12, -1.0 / 12, 0},
                                      {0, -1.0 / 6, -1.0 / 6, 1.0 / 6, 1.0 / 6, 1}};
};

// Tiles per chunk: one block of tile lanes, a multiple of every micro-kernel's NR (8, 16, 32, 64), so
// a chunk's V is whole B panels whatever the ISA.
constexpr index_t kTileBlock = 64;
// Output channels per M block are a multiple of this (every micro-kernel's MR divides it: 4, 6 and 14),
// so blocks start on A panel boundaries.
constexpr index_t kKStep = 84;
// Bytes of one M block (alpha^2 x kb x kTileBlock): a part of L2 beside the chunk's V.
constexpr index_t kMBlockBytes = 512 << 10;
// Bytes of one thread's U^T block in the few-tiles schedule (alpha^2 x depth x kTileBlock).
constexpr index_t kUtBlockBytes = 1024 << 10;

// y[i*ys] = sum_l mat[i][l] * x[l*xs] for i < R, the coefficients known at compile time once the loops
// unroll (zero terms vanish, +-1 become additions). V: a vector or a scalar type; S its element type.
template <typename S, int R, int A, typename V>
inline void mat_apply(const double (&mat)[R][A], const V* x, int xs, V* y, int ys) {
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) {
    V acc{};
    bool first = true;
#pragma GCC unroll 8
    for (int l = 0; l < A; ++l) {
      const double c = mat[i][l];
      if (c == 0) continue;
      const V t = c == 1 ? x[l * xs] : c == -1 ? -x[l * xs] : x[l * xs] * S(c);
      if (first)
        acc = t;
      else
        acc = acc + t;
      first = false;
    }
    y[i * ys] = acc;
  }
}

// B^T d B on one alpha x alpha tile of values (row-major, d[i*A + j]); r gets alpha x alpha.
template <typename S, int M, typename V>
inline void input_tile(const V* d, V* r) {
  using W = WinogradMatrices<M>;
  constexpr int A = W::alpha;
  V t[A * A];
#pragma GCC unroll 8
  for (int j = 0; j < A; ++j) mat_apply<S>(W::BT, d + j, A, t + j, A);  // t = B^T d (columns)
#pragma GCC unroll 8
  for (int i = 0; i < A; ++i) mat_apply<S>(W::BT, t + i * A, 1, r + i * A, 1);  // r = t B (rows)
}

// A^T m A on one alpha x alpha tile; o gets m x m.
template <typename S, int M, typename V>
inline void output_tile(const V* mm, V* o) {
  using W = WinogradMatrices<M>;
  constexpr int A = W::alpha;
  V t[M * A];
#pragma GCC unroll 8
  for (int j = 0; j < A; ++j) mat_apply<S>(W::AT, mm + j, A, t + j, A);  // t = A^T m  (M x A)
#pragma GCC unroll 8
  for (int i = 0; i < M; ++i) mat_apply<S>(W::AT, t + i * A, 1, o + i * M, 1);  // o = t A  (M x M)
}

// G g G^T on one 3x3 filter (g[a*3 + b]); u gets alpha x alpha.
template <typename S, int M, typename V>
inline void filter_tile(const V* g, V* u) {
  using W = WinogradMatrices<M>;
  constexpr int A = W::alpha;
  V t[A * 3];
#pragma GCC unroll 4
  for (int b = 0; b < 3; ++b) mat_apply<S>(W::G, g + b, 3, t + b, 3);  // t = G g  (A x 3)
#pragma GCC unroll 8
  for (int i = 0; i < A; ++i) mat_apply<S>(W::G, t + i * 3, 1, u + i * A, 1);  // u = t G^T  (A x A)
}

// G g G^T on one 3x3 filter, each of the alpha^2 results handed to put(e, value) as soon as it is
// computed, so no more than one row of them is live. F(4x4) shares the sums common to the rows of G:
// -(g0+g2)/6 -+ g1/6 and (g0/24 + g2/6) +- g1/12.
template <typename S, int M, typename V, typename Put>
inline void filter_tile_put(const V* g, Put put) {
  if constexpr (M == 4) {
    const auto gcol = [](V g0, V g1, V g2, V* r) {
      const V s = (g0 + g2) * S(-1.0 / 6), b = g1 * S(1.0 / 6);
      const V a = g0 * S(1.0 / 24) + g2 * S(1.0 / 6), d = g1 * S(1.0 / 12);
      r[0] = g0 * S(0.25);
      r[1] = s - b;
      r[2] = s + b;
      r[3] = a + d;
      r[4] = a - d;
      r[5] = g2;
    };
    V t[3][6];  // t[b][i] = (G g)[i][b]
#pragma GCC unroll 3
    for (int b = 0; b < 3; ++b) gcol(g[b], g[3 + b], g[6 + b], t[b]);
#pragma GCC unroll 6
    for (int i = 0; i < 6; ++i) {
      V u[6];
      gcol(t[0][i], t[1][i], t[2][i], u);
#pragma GCC unroll 6
      for (int j = 0; j < 6; ++j) put(i * 6 + j, u[j]);
    }
  } else {
    constexpr int A = WinogradMatrices<M>::alpha;
    V u[A * A];
    filter_tile<S, M>(g, u);
#pragma GCC unroll 16
    for (int e = 0; e < A * A; ++e) put(e, u[e]);
  }
}

struct Tiling {
  index_t th, tw, tiles;  // tile rows and columns per image, tiles over the batch
};

inline Tiling tiling(const ConvShape& sh, int m) {
  Tiling t;
  t.th = ceil_div(sh.p, m);
  t.tw = ceil_div(sh.q, m);
  t.tiles = sh.n * t.th * t.tw;
  return t;
}

// Packed U of a group: for each A panel of output channels [k0, k0 + rows) (rows = MR, or the tail),
// alpha^2 panels in the micro-kernel's A layout, rows x Cg k-fastest: U[e][k0 + i][c] at
//   ug[u_panel_offset(k0) + e*u_point_stride(rows) + c*rows + i],
// so one output-channel panel's transformed filters are together; consecutive points are a cache
// line more than 64-byte aligned apart, so writing all alpha^2 of them does not hit one cache set.
inline index_t u_point_stride(index_t rows, index_t Cg, index_t elem_size) {
  const index_t line = static_cast<index_t>(kAlign) / elem_size;
  return round_up(rows * Cg, line) + line;
}
inline index_t u_group_elems(index_t Kg, index_t Cg, int mr, index_t a2, index_t elem_size) {
  const index_t full = Kg / mr, tail = Kg % mr;
  return a2 * (full * u_point_stride(mr, Cg, elem_size) + (tail ? u_point_stride(tail, Cg, elem_size) : 0));
}

// Buffer sizes (elements) for tile chunk tc and nt threads; every buffer starts 64-byte aligned.
struct Plan {
  index_t tc;        // tiles per chunk (<= kTileBlock)
  index_t kb;        // output channels per M block: a multiple of kKStep, or Kg
  index_t u_elems;   // packed U: G x u_group_elems
  index_t v_elems;   // one thread's V: alpha^2 x v_stride
  index_t m_elems;   // one thread's M block: alpha^2 x (kb x kTileBlock + pad)
  int nt;            // threads
  bool few_tiles;    // the transposed schedule (below); then u_elems holds V^T, v_elems U^T, m_elems M^T
  index_t total;     // with alignment slack
};

// Distance between consecutive points e of V (rows = Cg) or of an M block (rows = kn): rows x
// kTileBlock and one cache line more, so the alpha^2 rows a transform reads or writes together do not
// fall into one cache set (rows x kTileBlock x sizeof(T) is often a power of two).
inline index_t point_stride(index_t rows, index_t elem_size) {
  return rows * kTileBlock + static_cast<index_t>(kAlign) / elem_size;
}

// Few tiles (at most half a chunk, and no more than output channels per group: 7x7 planes, or 14x14
// at batch 1 with F(4x4)): the transposed schedule. V^T (tiles x Cg per point, the micro-kernel's A operand, MR tiles per panel) is computed
// once for all tiles and stays resident; threads take blocks of kTileBlock output channels, transform
// that block's filters into U^T (Cg x kTileBlock per point, the B operand) in their own buffer, and
// compute M^T (tiles x channels) and the output transform. U is never stored whole, and a small tile
// count costs no padded micro-kernel columns.
// Measured (ResNet-50 3x3 layers, 2 threads): it wins at 4 to 32 tiles, loses from 49 on, where the
// chunked schedule's padding of the last B panel is a quarter or less.
constexpr index_t kFewTilesMax = kTileBlock / 2;
inline bool few_tiles(const ConvShape& sh, int m) {
  const index_t tiles = tiling(sh, m).tiles;
  return tiles <= kFewTilesMax && tiles <= sh.kg();
}
inline index_t vt_point_stride(index_t tiles, index_t Cg, index_t elem_size) {
  const index_t line = static_cast<index_t>(kAlign) / elem_size;
  return round_up(tiles * Cg, line) + line;
}

// Input channels per U^T block (a multiple of the vector lanes, or Cg): the block and the M^T it
// accumulates into stay in L2.
inline index_t ut_depth(const ConvShape& sh, int m, index_t elem_size) {
  const index_t a2 = static_cast<index_t>(m + 2) * (m + 2), lanes = 64 / elem_size;
  const index_t fit = kUtBlockBytes / (a2 * kTileBlock * elem_size) / lanes * lanes;
  return std::min(sh.cg(), std::max(lanes, fit));
}

inline Plan make_plan(const ConvShape& sh, int m, index_t tc, index_t elem_size) {
  const index_t a2 = static_cast<index_t>(m + 2) * (m + 2), Kg = sh.kg(), Cg = sh.cg();
  Plan pl;
  pl.few_tiles = few_tiles(sh, m);
  if (pl.few_tiles) {
    const index_t tiles = tiling(sh, m).tiles;
    pl.tc = tiles;
    pl.kb = kTileBlock;
    pl.nt = get_num_threads();
    pl.u_elems = sh.g * a2 * vt_point_stride(tiles, Cg, elem_size);
    pl.v_elems = a2 * point_stride(ut_depth(sh, m, elem_size), elem_size);
    pl.m_elems = a2 * point_stride(round_up(tiles, kKStep), elem_size);
    pl.total = static_cast<index_t>(kAlign) / elem_size + pl.u_elems + pl.nt * (pl.v_elems + pl.m_elems);
    return pl;
  }
  pl.tc = std::max<index_t>(1, std::min(tc, kTileBlock));
  const index_t fit = kMBlockBytes / (a2 * kTileBlock * elem_size) / kKStep * kKStep;
  pl.kb = std::min(Kg, std::max(kKStep, fit));
  pl.nt = get_num_threads();
  // U's padding depends on MR: size it for every ISA's micro-kernel, so a workspace sized before an ISA
  // change still fits.
  pl.u_elems = 0;
  for (Isa isa : {Isa::ref, Isa::avx2, Isa::avx512}) {
    const int mr = elem_size == 4 ? select_ukernel<float>(isa).mr : select_ukernel<double>(isa).mr;
    pl.u_elems = std::max(pl.u_elems, sh.g * u_group_elems(Kg, Cg, mr, a2, elem_size));
  }
  pl.v_elems = a2 * point_stride(Cg, elem_size);
  pl.m_elems = a2 * point_stride(pl.kb, elem_size);
  pl.total = static_cast<index_t>(kAlign) / elem_size + pl.u_elems + pl.nt * (pl.v_elems + pl.m_elems);
  return pl;
}

// Fills one output-channel panel of U: the filters w[k0 + i][c] in order (c, i) are transformed
// independently, so the work is vectorized over the flattened index f = c*rows + i.
// turned: w holds the filters of the convolution whose backward data this forward pass computes,
// (C x Kg x 3 x 3) for this pass's (K x Cg x 3 x 3): this pass's w[k][c][ab] is w[c][k][8 - ab] there.
template <typename T, int M>
void filter_panel(const ConvShape& sh, const T* w, bool turned, index_t g, index_t k0, int rows, T* dst) {
  using V = typename Vec<T>::type;
  constexpr int L = Vec<T>::lanes;
  constexpr int A = WinogradMatrices<M>::alpha;
  const index_t Kg = sh.kg(), Cg = sh.cg(), n = rows * Cg, es = u_point_stride(rows, Cg, sizeof(T));
  // w[k0 + i][c][ab] at wk[(i*Cg + c)*9 + ab]; turned, at wk[(c*Kg + i)*9 + 8 - ab]
  const T* wk = turned ? w + (g * Cg * Kg + k0) * 9 : w + (g * Kg + k0) * Cg * 9;
  index_t c = 0;
  int i = 0;
  for (index_t f = 0; f < n; f += L) {
    const int nl = static_cast<int>(std::min<index_t>(L, n - f));
    alignas(64) T gb[9][L];
    for (int l = 0; l < nl; ++l) {
      if (turned) {
        const T* src = wk + (c * Kg + i) * 9;
        for (int ab = 0; ab < 9; ++ab) gb[ab][l] = src[8 - ab];
      } else {
        const T* src = wk + (i * Cg + c) * 9;
        for (int ab = 0; ab < 9; ++ab) gb[ab][l] = src[ab];
      }
      if (++i == rows) i = 0, ++c;
    }
    for (int l = nl; l < L; ++l)
      for (int ab = 0; ab < 9; ++ab) gb[ab][l] = T(0);
    V gv[9];
    for (int ab = 0; ab < 9; ++ab) gv[ab] = vload<V>(gb[ab]);
    if (nl == L) {
      // Each store starts a new cache line; the next vector's lines are requested now (as in
      // filter_block_t).
#pragma GCC unroll 36
      for (int e = 0; e < A * A; ++e) __builtin_prefetch(dst + e * es + f + L, 1);
      filter_tile_put<T, M>(gv, [&](int e, V v) { vstore(dst + e * es + f, v); });
    } else {  // the last, partial vector: the same transform, stored lane by lane
      alignas(64) T ub[L];
      filter_tile_put<T, M>(gv, [&](int e, V v) {
        vstore(ub, v);
        std::memcpy(dst + e * es + f, ub, sizeof(T) * nl);
      });
    }
  }
}

// Per-chunk tile geometry: for tile u of the chunk, its image and the offset of its window's
// top-left corner in the input plane (ih0*W + iw0) and in the output plane (p0*Q + q0).
struct ChunkTiles {
  index_t n[kTileBlock];
  index_t ih0[kTileBlock], iw0[kTileBlock];
  index_t p0[kTileBlock], q0[kTileBlock];
  int nb;
};

template <int M>
void chunk_tiles(const ConvShape& sh, const Tiling& tl, index_t t0, int nb, ChunkTiles* ct) {
  const index_t per_image = tl.th * tl.tw;
  ct->nb = nb;
  index_t n = t0 / per_image, r = t0 % per_image, row = r / tl.tw, col = r % tl.tw;
  for (int u = 0; u < nb; ++u) {
    ct->n[u] = n;
    ct->p0[u] = row * M;
    ct->q0[u] = col * M;
    ct->ih0[u] = row * M - sh.ph;
    ct->iw0[u] = col * M - sh.pw;
    if (++col == tl.tw) {
      col = 0;
      if (++row == tl.th) row = 0, ++n;
    }
  }
}

// The vector pass after a transform's gather: db's lanes [nb, nbv) zeroed (tiles past the chunk's
// end), then each block of L tiles, its EI values a tile loaded as vectors, through tile (EI vectors
// in, EO out) into out[e][u].
template <typename T, int EI, int EO, typename Tile>
inline void transform_lanes(T (*db)[kTileBlock], int nb, int nbv, T (*out)[kTileBlock], Tile tile) {
  using V = typename Vec<T>::type;
  constexpr int L = Vec<T>::lanes;
  for (int u = nb; u < nbv; ++u)
    for (int e = 0; e < EI; ++e) db[e][u] = T(0);
  for (int u = 0; u < nbv; u += L) {
    V d[EI], r[EO];
#pragma GCC unroll 36
    for (int e = 0; e < EI; ++e) d[e] = vload<V>(&db[e][u]);
    tile(d, r);
#pragma GCC unroll 36
    for (int e = 0; e < EO; ++e) vstore(&out[e][u], r[e]);
  }
}

// vb[e][u] = (B^T d B)[e] of channel c of group g for the chunk's tiles u < nbv (nbv a multiple of
// the vector length, <= kTileBlock); lanes past nb are zero tiles.
template <typename T, int M>
void transform_channel(const ConvShape& sh, const ChunkTiles& ct, const T* x, index_t g, index_t c, int nbv,
                       T (*vb)[kTileBlock]) {
  using V = typename Vec<T>::type;
  constexpr int A = WinogradMatrices<M>::alpha;
  const index_t H = sh.h, Wd = sh.w, Cg = sh.cg();
  alignas(64) T db[A * A][kTileBlock];
  const int nb = ct.nb;
  for (int u = 0; u < nb; ++u) {
    const T* xc = x + (ct.n[u] * sh.c + g * Cg + c) * H * Wd;
    const index_t ih0 = ct.ih0[u], iw0 = ct.iw0[u];
    if (ih0 >= 0 && ih0 + A <= H && iw0 >= 0 && iw0 + A <= Wd) {
      const T* x0 = xc + ih0 * Wd + iw0;
#pragma GCC unroll 8
      for (int i = 0; i < A; ++i)
#pragma GCC unroll 8
        for (int j = 0; j < A; ++j) db[i * A + j][u] = x0[i * Wd + j];
    } else {
      for (int i = 0; i < A; ++i) {
        const index_t ih = ih0 + i;
        const bool row_in = ih >= 0 && ih < H;
        for (int j = 0; j < A; ++j) {
          const index_t iw = iw0 + j;
          db[i * A + j][u] = (row_in && iw >= 0 && iw < Wd) ? xc[ih * Wd + iw] : T(0);
        }
      }
    }
  }
  transform_lanes<T, A * A, A * A>(db, nb, nbv, vb, [](const V* d, V* r) { input_tile<T, M>(d, r); });
}

// V for channel c of group g over the chunk's tiles, into the B panels: point e, tile u at
// v[e*point_stride(Cg) + (u/NR)*NR*Cg + c*NR + u%NR]. Lanes past nb, to the end of their panel, hold zero.

// Why the Winograd kernels cannot run a shape ("" where they can): a 3x3 filter, stride 1, dilation 1.
inline std::string winograd_rejects(const ConvShape& sh) {
  if (sh.r != 3 || sh.s != 3 || sh.sh != 1 || sh.sw != 1 || sh.dh != 1 || sh.dw != 1)
    return "winograd needs a 3x3 filter with stride 1 and dilation 1";
  return "";
}

}  // namespace winograd_detail
}  // namespace dnnkit
