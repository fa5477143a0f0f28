// Winograd convolution F(m x m, 3 x 3) for 3x3, stride-1, dense filters (Lavin & Gray, "Fast
// Algorithms for Convolutional Neural Networks"), any padding and groups. With alpha = m + 2 and
// e = (xi, nu) one of the alpha^2 transform-domain points:
//   U[e][k][c] = (G g_kc G^T)[e]                      filter transform, once per call
//   V[e][c][t] = (B^T d_ct B)[e]                      input transform   (d: the alpha x alpha input tile)
//   M[e]       = U[e] (Kg x Cg) @ V[e] (Cg x tiles)   alpha^2 products on the GEMM micro-kernel
//   y tile     = A^T M[.][k][t] A (+ bias)           output transform  (m x m)
// Tiles t run over (n, tile row, tile column). U is packed once per call as the micro-kernel's A
// operand (MR-row panels of output channels). The tiles are cut into chunks of kTileBlock; a thread
// takes a chunk, writes its V straight into the micro-kernel's B layout (NR-column panels of tiles) in
// a private buffer, runs the products for a block of output channels into a private M buffer and
// applies the output transform from there, so V and M stay in the core's L2. When there are too few
// chunks for the threads, the threads share each chunk: the input transform split over channels,
// products and output transform over blocks of output channels. At most 32 tiles, a transposed
// schedule runs instead (winograd_few_tiles): tiles are the micro-kernel's rows, U is never stored.
// Multiplications per output drop from 9 to alpha^2 / m^2 (4 for m = 2, 2.25 for m = 4).
// Both backward passes are here too (stride 1): backward data as this forward pass on dy with the
// filters transposed and turned (conv2d_bwd_data_winograd), backward filter by the transposed
// algorithm F(3x3, m x m) (conv2d_bwd_filter_winograd); see their sections below.
#include <algorithm>
#include <cstdint>
#include <cstring>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include "../gemm/gemm.h"
#include "winograd.h"
#include "kernels.h"

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

// One 64-byte vector of T (GCC vector extension: one AVX-512 register in the AVX-512 module, two or four
// narrower ones in the others).
template <typename T>
struct Vec {
  typedef T type __attribute__((vector_size(64)));
  static constexpr int lanes = 64 / sizeof(T);
};

// Integer vectors of the same shape (shuffle masks).
template <typename T>
struct VecI;
template <>
struct VecI<float> {
  typedef std::int32_t type __attribute__((vector_size(64)));
};
template <>
struct VecI<double> {
  typedef std::int64_t type __attribute__((vector_size(64)));
};

template <typename V, typename T>
inline V vload(const T* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}
template <typename V, typename T>
inline void vstore(T* p, V v) {
  std::memcpy(p, &v, sizeof(V));
}

// Copies n <= lanes values from src to dst: one masked load and store where AVX-512 has them.
template <typename T>
inline void copy_lanes(T* dst, const T* src, int n) {
#ifdef __AVX512F__
  if constexpr (sizeof(T) == 4) {
    const __mmask16 k = static_cast<__mmask16>((1u << n) - 1);
    _mm512_mask_storeu_ps(dst, k, _mm512_maskz_loadu_ps(k, src));
  } else {
    const __mmask8 k = static_cast<__mmask8>((1u << n) - 1);
    _mm512_mask_storeu_pd(dst, k, _mm512_maskz_loadu_pd(k, src));
  }
#else
  for (int i = 0; i < n; ++i) dst[i] = src[i];
#endif
}

// In-place transpose of an L x L block held as L vectors (L = lanes): swap the off-diagonal H x H
// blocks of every 2H x 2H block, for H = L/2, ..., 1.
template <typename T, int H>
inline void transpose_stage(typename Vec<T>::type* r) {
  using IV = typename VecI<T>::type;
  constexpr int L = Vec<T>::lanes;
  IV lo, hi;
  for (int j = 0; j < L; ++j) {
    lo[j] = (j & H) ? L + j - H : j;  // row r keeps its left half, takes row r+H's left half on the right
    hi[j] = (j & H) ? L + j : j + H;  // row r+H takes row r's right half on the left, keeps its right half
  }
#pragma GCC unroll 16
  for (int i = 0; i < L; ++i)
    if (!(i & H)) {
      const typename Vec<T>::type a = r[i], b = r[i + H];
      r[i] = __builtin_shuffle(a, b, lo);
      r[i + H] = __builtin_shuffle(a, b, hi);
    }
  if constexpr (H > 1) transpose_stage<T, H / 2>(r);
}
template <typename T>
inline void transpose_lanes(typename Vec<T>::type* r) {
  transpose_stage<T, Vec<T>::lanes / 2>(r);
}

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

Tiling tiling(const ConvShape& sh, int m) {
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
index_t point_stride(index_t rows, index_t elem_size) {
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
bool few_tiles(const ConvShape& sh, int m) {
  const index_t tiles = tiling(sh, m).tiles;
  return tiles <= kFewTilesMax && tiles <= sh.kg();
}
inline index_t vt_point_stride(index_t tiles, index_t Cg, index_t elem_size) {
  const index_t line = static_cast<index_t>(kAlign) / elem_size;
  return round_up(tiles * Cg, line) + line;
}

// Input channels per U^T block (a multiple of the vector lanes, or Cg): the block and the M^T it
// accumulates into stay in L2.
index_t ut_depth(const ConvShape& sh, int m, index_t elem_size) {
  const index_t a2 = static_cast<index_t>(m + 2) * (m + 2), lanes = 64 / elem_size;
  const index_t fit = kUtBlockBytes / (a2 * kTileBlock * elem_size) / lanes * lanes;
  return std::min(sh.cg(), std::max(lanes, fit));
}

Plan make_plan(const ConvShape& sh, int m, index_t tc, index_t elem_size) {
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
template <typename T, int M>
void input_channel(const ConvShape& sh, const ChunkTiles& ct, const T* x, index_t g, index_t c, int nr, T* v) {
  constexpr int L = Vec<T>::lanes;
  constexpr int A = WinogradMatrices<M>::alpha;
  const index_t Cg = sh.cg(), vs = point_stride(Cg, sizeof(T));
  alignas(64) T vb[A * A][kTileBlock];
  const int nbv = static_cast<int>(round_up(ct.nb, std::max(L, nr)));  // <= kTileBlock: L and NR divide it
  transform_channel<T, M>(sh, ct, x, g, c, nbv, vb);
  // Into the B panels, whole panels of NR lanes; the next channel's lines are requested as this one's
  // are written (each vector store is a new cache line).
  using V = typename Vec<T>::type;
  if (nr % L == 0) {
    for (int e = 0; e < A * A; ++e) {
      T* ve = v + e * vs + c * nr;
      for (int j = 0; j < nbv; j += L) {
        T* dst = ve + (j / nr) * nr * Cg + j % nr;
        __builtin_prefetch(dst + nr, 1);
        vstore(dst, vload<V>(&vb[e][j]));
      }
    }
    return;
  }
  for (int e = 0; e < A * A; ++e) {
    T* ve = v + e * vs + c * nr;
    for (int j = 0; j < nbv; j += nr) std::memcpy(ve + j * Cg, &vb[e][j], sizeof(T) * nr);
  }
}

// y for output channels [k0, k0 + kn) of group g over the chunk's tiles, from the M block
// mb[e*point_stride(kn) + kk*kTileBlock + u] (+ bias).
template <typename T, int M>
void output_block(const ConvShape& sh, const ChunkTiles& ct, const T* mb, const T* bias, index_t g, index_t k0,
                  index_t kn, T* y) {
  using V = typename Vec<T>::type;
  constexpr int L = Vec<T>::lanes;
  constexpr int A = WinogradMatrices<M>::alpha;
  const index_t P = sh.p, Q = sh.q, Kg = sh.kg(), ms = point_stride(kn, sizeof(T));
  const int nb = ct.nb;
  alignas(64) T ob[M * M][kTileBlock];
  for (index_t kk = 0; kk < kn; ++kk) {
    const index_t k = g * Kg + k0 + kk;
    const T bv = bias ? bias[k] : T(0);
    for (int u = 0; u < nb; u += L) {
      V mv[A * A], o[M * M];
#pragma GCC unroll 36
      for (int e = 0; e < A * A; ++e) mv[e] = vload<V>(mb + e * ms + kk * kTileBlock + u);
      output_tile<T, M>(mv, o);
#pragma GCC unroll 16
      for (int e = 0; e < M * M; ++e) vstore(&ob[e][u], o[e] + bv);
    }
    for (int u = 0; u < nb; ++u) {
      T* yk = y + (ct.n[u] * sh.k + k) * P * Q;
      const index_t p0 = ct.p0[u], q0 = ct.q0[u];
      if (p0 + M <= P && q0 + M <= Q) {
        T* y0 = yk + p0 * Q + q0;
#pragma GCC unroll 4
        for (int i = 0; i < M; ++i)
#pragma GCC unroll 4
          for (int j = 0; j < M; ++j) y0[i * Q + j] = ob[i * M + j][u];
      } else {
        const int mi = static_cast<int>(std::min<index_t>(M, P - p0)), mj = static_cast<int>(std::min<index_t>(M, Q - q0));
        for (int i = 0; i < mi; ++i)
          for (int j = 0; j < mj; ++j) yk[(p0 + i) * Q + q0 + j] = ob[i * M + j][u];
      }
    }
  }
}

// M block for output channels [k0, k0 + kn) (k0 on an A panel boundary): for each point e,
// mb[e*point_stride(kn) ...] (kn x nb, row stride kTileBlock) = U[e] rows [k0, k0 + kn) @ V[e].
template <typename T>
void products(const UKernel<T>& uk, index_t Kg, index_t Cg, int a2, const T* ug, const T* v, index_t k0, index_t kn,
              int nb, T* mb) {
  const int mr = uk.mr, nr = uk.nr;
  const index_t vs = point_stride(Cg, sizeof(T)), ms = point_stride(kn, sizeof(T));
  for (int e = 0; e < a2; ++e) {
    const T* ve = v + e * vs;
    T* me = mb + e * ms;
    for (index_t k = k0; k < k0 + kn; k += mr) {
      const int rows = static_cast<int>(std::min<index_t>(mr, Kg - k));
      const ukernel_fn<T> fn = rows == mr ? uk.fn : uk.rows[rows - 1];
      const T* ue = ug + k / mr * a2 * u_point_stride(mr, Cg, sizeof(T)) + e * u_point_stride(rows, Cg, sizeof(T));
      for (int j = 0; j < nb; j += nr)
        fn(Cg, ue, ve + j * Cg, me + (k - k0) * kTileBlock + j, kTileBlock, 1, T(1), T(0), rows,
           std::min(nr, nb - j), nullptr, false);
    }
  }
}

// ---- The few-tiles schedule (transposed products).

// V^T of channel c of group g for the chunk's tiles (tiles t0 + u of `tiles`): point e, tile t at
// vt[e*vt_point_stride + (t/MR)*MR*Cg + c*rows + t%MR], rows = MR or the tail panel's height.
template <typename T, int M>
void input_channel_t(const ConvShape& sh, const ChunkTiles& ct, const T* x, index_t g, index_t c, index_t t0,
                     index_t tiles, int mr, T* vt) {
  constexpr int L = Vec<T>::lanes;
  constexpr int A = WinogradMatrices<M>::alpha;
  const index_t Cg = sh.cg(), vs = vt_point_stride(tiles, Cg, sizeof(T));
  alignas(64) T vb[A * A][kTileBlock];
  const int nb = ct.nb;
  transform_channel<T, M>(sh, ct, x, g, c, static_cast<int>(round_up(nb, L)), vb);
  for (int u = 0; u < nb;) {
    const index_t t = t0 + u, p0 = t / mr * mr, rows = std::min<index_t>(mr, tiles - p0);
    const int run = static_cast<int>(std::min<index_t>(p0 + rows - t, nb - u));
    T* dst = vt + p0 * Cg + c * rows + (t - p0);
    if (run <= L) {
#pragma GCC unroll 36
      for (int e = 0; e < A * A; ++e) copy_lanes(dst + e * vs, &vb[e][u], run);
    } else {
      for (int e = 0; e < A * A; ++e)
        for (int i = 0; i < run; ++i) dst[e * vs + i] = vb[e][u + i];
    }
    u += run;
  }
}

// U^T for output channels [k0, k0 + kn) (kn <= kTileBlock) and input channels [cs, cs + kc) of group g
// as the micro-kernel's B panels: point e, channel j, input channel cs + c at
// ut[e*point_stride(kc) + (j/NR)*NR*kc + c*NR + j%NR], zero for j >= kn.
// Output channels go one pass of max(L, NR) at a time, and within a pass input channels kFilterC (one
// vector's lanes) at a time: per block of L filter rows, their 9*L contiguous weights are L x L
// transposed in registers into gb, which stays in L1. A pass reads L rows of weights front to back
// (few streams, which the hardware prefetchers follow) and stores each transformed vector straight
// into its panel, front to back at every point, so U^T crosses to L2 once. The stores are what this
// costs (a filter's 9 weights become alpha^2 values, each vector store a new cache line).
template <typename T, int M>
void filter_block_t(const ConvShape& sh, const T* w, bool turned, index_t g, index_t k0, index_t kn, index_t cs,
                    index_t kc, int nr, T* ut) {
  using V = typename Vec<T>::type;
  constexpr int L = Vec<T>::lanes;
  constexpr int A = WinogradMatrices<M>::alpha;
  constexpr int kFilterC = L;
  constexpr int kMaxPass = kTileBlock;
  const index_t Kg = sh.kg(), Cg = sh.cg(), us = point_stride(kc, sizeof(T));
  const int jw = std::min(kMaxPass, std::max(L, nr));
  const int jn = static_cast<int>(round_up(kn, jw));
  const T* wk = w + ((g * Kg + k0) * Cg + cs) * 9;  // w[k0 + j][cs + c][ab] at wk[(j*Cg + c)*9 + ab]
  alignas(64) T gb[kFilterC][9][kMaxPass];          // channel c0 + cc, position ab, channel j0 + jj
  // Each of the L weight rows a pass reads is its own stream (Cg*9 apart), which the hardware
  // prefetchers pick up too late: every load also requests the same row two channel blocks ahead.
  constexpr index_t kAhead = 2 * 9 * kFilterC;
  for (int j0 = 0; j0 < jn; j0 += jw)
    for (index_t c0 = 0; c0 < kc; c0 += kFilterC) {
      const int cb = static_cast<int>(std::min<index_t>(kFilterC, kc - c0));
      int j = j0;
      if (turned) {  // filter_panel's turned w: this pass's channels j are contiguous there, per channel c
        const T* wt = w + ((g * Cg + cs + c0) * Kg + k0) * 9;  // w[k0 + j][cs + c0 + cc][ab] at wt[(cc*Kg + j)*9 + 8 - ab]
        for (int cc = 0; cc < cb; ++cc)
          for (int jj = 0; jj < jw; ++jj) {
            const bool in = j0 + jj < kn;
            const T* src = wt + (cc * Kg + j0 + jj) * 9;
            for (int ab = 0; ab < 9; ++ab) gb[cc][ab][jj] = in ? src[8 - ab] : T(0);
          }
        j = j0 + jw;
      }
      if (cb == kFilterC && !turned)
        for (; j + L <= std::min<index_t>(kn, j0 + jw); j += L)
          for (int q = 0; q < 9; ++q) {  // weights f = q*L + i of the block: channel c0 + f/9, position f%9
            V r[L];
#pragma GCC unroll 16
            for (int jj = 0; jj < L; ++jj) {
              const T* src = wk + ((j + jj) * Cg + c0) * 9 + q * L;
              r[jj] = vload<V>(src);
              __builtin_prefetch(src + kAhead);
            }
            transpose_lanes<T>(r);
#pragma GCC unroll 16
            for (int i = 0; i < L; ++i) vstore(&gb[(q * L + i) / 9][(q * L + i) % 9][j - j0], r[i]);
          }
      for (; j < j0 + jw; ++j) {
        if (j < kn) {
          const T* src = wk + (j * Cg + c0) * 9;
          for (int cc = 0; cc < cb; ++cc)
            for (int ab = 0; ab < 9; ++ab) gb[cc][ab][j - j0] = src[cc * 9 + ab];
        } else {
          for (int cc = 0; cc < cb; ++cc)
            for (int ab = 0; ab < 9; ++ab) gb[cc][ab][j - j0] = T(0);
        }
      }
      for (int cc = 0; cc < cb; ++cc)
        for (int jv = 0; jv < jw; jv += L) {
          V gv[9];
#pragma GCC unroll 9
          for (int ab = 0; ab < 9; ++ab) gv[ab] = vload<V>(&gb[cc][ab][jv]);
          const int jj = j0 + jv;
          if (nr >= L) {
            // Every store below starts a new cache line of U^T; asking for the next channel's lines
            // now lets their reads for ownership overlap this transform.
            T* dst = ut + (jj / nr) * nr * kc + (c0 + cc) * nr + jj % nr;
#pragma GCC unroll 36
            for (int e = 0; e < A * A; ++e) __builtin_prefetch(dst + nr + e * us, 1);
            filter_tile_put<T, M>(gv, [&](int e, V v) { vstore(dst + e * us, v); });
          } else {  // panels narrower than a vector: the same transform, scattered lane by lane
            alignas(64) T lanes[L];
            filter_tile_put<T, M>(gv, [&](int e, V v) {
              vstore(lanes, v);
              for (int l = 0; l < L; ++l)
                ut[e * us + ((jj + l) / nr) * nr * kc + (c0 + cc) * nr + (jj + l) % nr] = lanes[l];
            });
          }
        }
    }
}

// M^T for tiles [ta, tb) (ta, tb multiples of MR, or tb = tiles) and channels [k0, k0 + kn), the part
// of the sum over input channels [cs, cs + kc) (beta 0 for the first part, 1 after):
// mt[e*ms + (t - ta)*kTileBlock + j] (+)= sum_c V^T[e][t][cs + c] U^T[e][c][j].
template <typename T>
void products_t(const UKernel<T>& uk, index_t Cg, int a2, index_t tiles, const T* vt, const T* ut, index_t ta,
                index_t tb, index_t kn, index_t cs, index_t kc, T beta, index_t ms, T* mt) {
  const int mr = uk.mr, nr = uk.nr;
  const index_t vs = vt_point_stride(tiles, Cg, sizeof(T)), us = point_stride(kc, sizeof(T));
  for (int e = 0; e < a2; ++e)
    for (index_t t = ta; t < tb; t += mr) {
      const int rows = static_cast<int>(std::min<index_t>(mr, tiles - t));
      const ukernel_fn<T> fn = rows == mr ? uk.fn : uk.rows[rows - 1];
      // The tile panel at t has `rows` rows; its depth block [cs, cs + kc) starts at + cs*rows.
      for (index_t j = 0; j < kn; j += nr)
        fn(kc, vt + e * vs + t * Cg + cs * rows, ut + e * us + j * kc, mt + e * ms + (t - ta) * kTileBlock + j,
           kTileBlock, 1, T(1), beta, rows, static_cast<int>(std::min<index_t>(nr, kn - j)), nullptr, false);
    }
}

// y for tiles [ta, tb) and output channels [k0, k0 + kn) of group g from M^T (+ bias); vectorized
// over channels.
template <typename T, int M>
void output_block_t(const ConvShape& sh, const Tiling& tl, const T* mt, index_t ms, const T* bias, index_t g,
                    index_t k0, index_t kn, index_t ta, index_t tb, T* y) {
  using V = typename Vec<T>::type;
  constexpr int L = Vec<T>::lanes;
  constexpr int A = WinogradMatrices<M>::alpha;
  const index_t P = sh.p, Q = sh.q, Kg = sh.kg(), per_image = tl.th * tl.tw;
  constexpr int kObRows = M * M > L ? M * M : L;
  alignas(64) T ob[kObRows][L];  // [M * M][L]; with M * M == L, [channel][M * M]
  alignas(64) T bb[kTileBlock];
  for (index_t j = 0; j < kn; ++j) bb[j] = bias ? bias[g * Kg + k0 + j] : T(0);
  for (index_t t = ta; t < tb; ++t) {
    const index_t n = t / per_image, r = t % per_image, p0 = (r / tl.tw) * M, q0 = (r % tl.tw) * M;
    const int mi = static_cast<int>(std::min<index_t>(M, P - p0)), mj = static_cast<int>(std::min<index_t>(M, Q - q0));
    for (index_t j0 = 0; j0 < kn; j0 += L) {
      V mv[A * A], o[M * M];
      const V bv = vload<V>(bb + j0);
#pragma GCC unroll 36
      for (int e = 0; e < A * A; ++e) mv[e] = vload<V>(mt + e * ms + (t - ta) * kTileBlock + j0);
      output_tile<T, M>(mv, o);
      const int nl = static_cast<int>(std::min<index_t>(L, kn - j0));
      if constexpr (M * M == L) {
        // One tile per channel: transposed in registers, channel l's tile is vector l, its rows M
        // contiguous values each (no per-value gathers).
#pragma GCC unroll 16
        for (int e = 0; e < L; ++e) o[e] = o[e] + bv;
        transpose_lanes<T>(o);
        for (int l = 0; l < nl; ++l) {
          T* y0 = y + (n * sh.k + g * Kg + k0 + j0 + l) * P * Q + p0 * Q + q0;
          vstore(ob[l], o[l]);
          if (mi == M && mj == M) {
#pragma GCC unroll 4
            for (int i = 0; i < M; ++i) std::memcpy(y0 + i * Q, &ob[l][i * M], M * sizeof(T));
          } else {
            for (int i = 0; i < mi; ++i)
              for (int jj = 0; jj < mj; ++jj) y0[i * Q + jj] = ob[l][i * M + jj];
          }
        }
        continue;
      }
#pragma GCC unroll 16
      for (int e = 0; e < M * M; ++e) vstore(ob[e], o[e] + bv);
      for (int l = 0; l < nl; ++l) {
        T* y0 = y + (n * sh.k + g * Kg + k0 + j0 + l) * P * Q + p0 * Q + q0;
        for (int i = 0; i < mi; ++i)
          for (int jj = 0; jj < mj; ++jj) y0[i * Q + jj] = ob[i * M + jj][l];
      }
    }
  }
}

template <typename T, int M>
void winograd_few_tiles(const ConvShape& sh, const Plan& pl, const Tiling& tl, const UKernel<T>& uk, const T* x,
                        const T* w, bool turned, const T* bias, T* y, T* base) {
  constexpr int A = WinogradMatrices<M>::alpha;
  constexpr int A2 = A * A;
  const index_t Kg = sh.kg(), Cg = sh.cg(), tiles = tl.tiles;
  const index_t vt_group = A2 * vt_point_stride(tiles, Cg, sizeof(T));
  T* const vt = base;
  T* const thread_bufs = vt + pl.u_elems;
  const index_t kblocks = ceil_div(Kg, kTileBlock);
  // Tile ranges per channel block, so that there are work items for every thread.
  const index_t tsplit = std::max<index_t>(1, std::min(ceil_div(pl.nt, sh.g * kblocks), ceil_div(tiles, kKStep)));
  const index_t tpart = round_up(ceil_div(tiles, tsplit), kKStep);
  const index_t ms = point_stride(std::min(tpart, tiles), sizeof(T));  // rows t - ta < min(tpart, tiles)
  const index_t items = sh.g * kblocks * tsplit;
  const int nt = static_cast<int>(std::max<index_t>(1, std::min<index_t>(pl.nt, std::max(items, sh.g * Cg))));
  const index_t tblocks = ceil_div(tiles, kTileBlock);
  const index_t kcb = ut_depth(sh, M, sizeof(T));
#pragma omp parallel num_threads(nt)
  {
    const int tid = thread_id();
    T* const ut = thread_bufs + tid * (pl.v_elems + pl.m_elems);
    T* const mt = ut + pl.v_elems;
    ChunkTiles ct;
    // Neighbouring channels share cache lines of V^T (a panel's rows of one channel are MR values):
    // each thread transforms one contiguous range of channels, so only the lines at the ends of the
    // ranges are written by two cores.
#pragma omp for schedule(static)
    for (index_t item = 0; item < sh.g * Cg * tblocks; ++item) {
      const index_t gc = item / tblocks, t0 = (item % tblocks) * kTileBlock;
      chunk_tiles<M>(sh, tl, t0, static_cast<int>(std::min(kTileBlock, tiles - t0)), &ct);
      input_channel_t<T, M>(sh, ct, x, gc / Cg, gc % Cg, t0, tiles, uk.mr, vt + gc / Cg * vt_group);
    }  // barrier: V^T complete
#pragma omp for schedule(dynamic, 1)
    for (index_t item = 0; item < items; ++item) {
      const index_t g = item / (kblocks * tsplit), b = item / tsplit % kblocks, s = item % tsplit;
      const index_t k0 = b * kTileBlock, kn = std::min(kTileBlock, Kg - k0);
      const index_t ta = s * tpart, tb = std::min(tiles, ta + tpart);
      if (ta >= tb) continue;
      for (index_t cs = 0; cs < Cg; cs += kcb) {
        const index_t kc = std::min(kcb, Cg - cs);
        filter_block_t<T, M>(sh, w, turned, g, k0, kn, cs, kc, uk.nr, ut);
        products_t<T>(uk, Cg, A2, tiles, vt + g * vt_group, ut, ta, tb, kn, cs, kc, cs == 0 ? T(0) : T(1), ms, mt);
      }
      output_block_t<T, M>(sh, tl, mt, ms, bias, g, k0, kn, ta, tb, y);
    }
  }
}

}  // namespace

index_t winograd_tile_chunk(const ConvShape& sh, int m, index_t max_workspace_elems) {
  (void)max_workspace_elems;  // the chunk is one tile block; buffers depend on the threads, not on it
  const index_t tiles = tiling(sh, m).tiles;
  return std::max<index_t>(1, std::min(tiles, kTileBlock));
}

index_t winograd_workspace_elems(const ConvShape& sh, int m, index_t tc, index_t elem_size) {
  return make_plan(sh, m, tc, elem_size).total;
}

template <typename T, int M>
void conv2d_fwd_winograd_impl(const ConvShape& sh, const T* x, const T* w, bool turned, const T* bias, T* y, T* ws,
                              index_t tc) {
  constexpr int A = WinogradMatrices<M>::alpha;
  constexpr int A2 = A * A;
  const Tiling tl = tiling(sh, M);
  const index_t Kg = sh.kg(), Cg = sh.cg();
  if (tl.tiles == 0 || sh.k == 0) return;
  const Plan pl = make_plan(sh, M, tc, sizeof(T));
  const UKernel<T> uk = select_ukernel<T>(active_isa());
  const int mr = uk.mr;
  const index_t ug_elems = u_group_elems(Kg, Cg, mr, A2, sizeof(T));
  // Buffers: packed U, then per thread V and an M block, each 64-byte aligned.
  T* base = ws;
  while (reinterpret_cast<std::uintptr_t>(base) % kAlign) ++base;
  if (pl.few_tiles) return winograd_few_tiles<T, M>(sh, pl, tl, uk, x, w, turned, bias, y, base);
  T* const u = base;
  T* const thread_bufs = u + pl.u_elems;
  const index_t chunks = ceil_div(tl.tiles, pl.tc);
  const index_t items = sh.g * chunks;  // (group, chunk)
  const index_t kpanels = ceil_div(Kg, mr);
  const int nt = static_cast<int>(std::max<index_t>(1, std::min<index_t>(pl.nt, std::max(items, sh.g * kpanels))));
  // Fewer chunks than threads, or too few to balance: share each chunk (split channels, then
  // output-channel blocks). Chunks that divide evenly among the threads stay private.
  const bool shared = nt > 1 && (items < nt || (items < 2 * nt && items % nt != 0));
  // Output-channel blocks when sharing a chunk: at least one per thread, on A panel boundaries.
  const index_t kb_shared = std::min(pl.kb, round_up(ceil_div(Kg, nt), mr));

#pragma omp parallel num_threads(nt)
  {
    const int tid = thread_id();
    T* const v_own = thread_bufs + tid * (pl.v_elems + pl.m_elems);
    T* const mb = v_own + pl.v_elems;
    ChunkTiles ct;

    // U: one work item per (group, A panel of output channels).
#pragma omp for schedule(dynamic, 1)
    for (index_t item = 0; item < sh.g * kpanels; ++item) {
      const index_t g = item / kpanels, k0 = (item % kpanels) * mr;
      filter_panel<T, M>(sh, w, turned, g, k0, static_cast<int>(std::min<index_t>(mr, Kg - k0)),
                         u + g * ug_elems + k0 / mr * A2 * u_point_stride(mr, Cg, sizeof(T)));
    }  // barrier: U complete

    if (!shared) {
#pragma omp for schedule(dynamic, 1)
      for (index_t item = 0; item < items; ++item) {
        const index_t g = item / chunks, t0 = (item % chunks) * pl.tc;
        const int nb = static_cast<int>(std::min(pl.tc, tl.tiles - t0));
        const T* ug = u + g * ug_elems;
        chunk_tiles<M>(sh, tl, t0, nb, &ct);
        for (index_t c = 0; c < Cg; ++c) input_channel<T, M>(sh, ct, x, g, c, uk.nr, v_own);
        for (index_t k0 = 0; k0 < Kg; k0 += pl.kb) {
          const index_t kn = std::min(pl.kb, Kg - k0);
          products<T>(uk, Kg, Cg, A2, ug, v_own, k0, kn, nb, mb);
          output_block<T, M>(sh, ct, mb, bias, g, k0, kn, y);
        }
      }
    } else {
      T* const v = thread_bufs;  // thread 0's V, shared
      const index_t kblocks = ceil_div(Kg, kb_shared);
      for (index_t item = 0; item < items; ++item) {
        const index_t g = item / chunks, t0 = (item % chunks) * pl.tc;
        const int nb = static_cast<int>(std::min(pl.tc, tl.tiles - t0));
        const T* ug = u + g * ug_elems;
        chunk_tiles<M>(sh, tl, t0, nb, &ct);
#pragma omp for schedule(static)
        for (index_t c = 0; c < Cg; ++c) input_channel<T, M>(sh, ct, x, g, c, uk.nr, v);
#pragma omp for schedule(dynamic, 1)
        for (index_t b = 0; b < kblocks; ++b) {
          const index_t k0 = b * kb_shared, kn = std::min(kb_shared, Kg - k0);
          products<T>(uk, Kg, Cg, A2, ug, v, k0, kn, nb, mb);
          output_block<T, M>(sh, ct, mb, bias, g, k0, kn, y);
        }  // barrier: V is free for the next chunk
      }
    }
  }
}

// ---- Backward data. With stride 1 and dilation 1, dx is the forward convolution of dy with the filters
// transposed per group and turned by 180 degrees, w'[c][k][r][s] = w[k][c][2 - r][2 - s], at padding
// 2 - ph, 2 - pw (so it needs ph, pw <= 2): the forward algorithm runs on that problem, its filter
// transforms reading w' out of w as they go ("turned"), so w' is never stored (a copy of it cost 1 ms
// for ResNet-50's 256 x 256 filters and 3 ms for its 512 x 512 ones, a quarter of the whole pass).

ConvShape winograd_bwd_data_as_fwd(const ConvShape& sh) {
  ConvShape f = sh;
  f.c = sh.k, f.h = sh.p, f.w = sh.q;
  f.k = sh.c, f.p = sh.h, f.q = sh.w;
  f.ph = 2 - sh.ph, f.pw = 2 - sh.pw;
  return f;
}

index_t winograd_bwd_data_workspace_elems(const ConvShape& sh, int m, index_t tc, index_t elem_size) {
  return winograd_workspace_elems(winograd_bwd_data_as_fwd(sh), m, tc, elem_size);
}

template <typename T>
void conv2d_bwd_data_winograd(const ConvShape& sh, int m, const T* w, const T* dy, T* dx, T* ws, index_t tc) {
  const ConvShape f = winograd_bwd_data_as_fwd(sh);
  if (m == 2)
    conv2d_fwd_winograd_impl<T, 2>(f, dy, w, true, nullptr, dx, ws, tc);
  else
    conv2d_fwd_winograd_impl<T, 4>(f, dy, w, true, nullptr, dx, ws, tc);
}

// ---- Backward filter, F(3x3, m x m): the transposed algorithm. Differentiating <dy, y> for the
// forward identity y = A^T [(G g G^T) . (B^T d B)] A in the filter g gives
//   dW = G^T [ sum over tiles t of (A dY_t A^T) . (B^T X_t B) ] G
// with X_t the (m+2) x (m+2) input window and dY_t the m x m gradient tile of the forward's output tile
// t (zero outside P x Q). At each point e the sum over tiles is a GEMM, M[e] (Kg x Cg) = Y[e] (Kg x
// tiles) @ V[e]^T (tiles x Cg), taken over chunks of at most kBwdDepth tiles: the threads transform a
// chunk's V (split over input channels) and Y (over output channels) straight into the micro-kernel's
// panels with the tiles as depth, then share the alpha^2 products by (point, output-channel panel),
// accumulating into M; after the last chunk, G^T M G per filter.
namespace {

constexpr index_t kBwdDepth = 256;

struct BwdFilterPlan {
  index_t depth;             // tiles per chunk
  index_t vps, yps, mps;     // point strides of V, Y and M
  index_t total;             // elements, with alignment slack
};

BwdFilterPlan bwd_filter_plan(const ConvShape& sh, int m, index_t elem_size) {
  const index_t a2 = static_cast<index_t>(m + 2) * (m + 2), line = static_cast<index_t>(kAlign) / elem_size;
  BwdFilterPlan pl;
  pl.depth = std::max<index_t>(1, std::min(tiling(sh, m).tiles, kBwdDepth));
  // V's panels are NR columns of input channels wide; 64 covers every micro-kernel's NR.
  pl.vps = round_up(round_up(sh.cg(), 64) * pl.depth, line) + line;
  pl.yps = round_up(sh.kg() * pl.depth, line) + line;
  pl.mps = round_up(sh.kg() * sh.cg(), line) + line;
  pl.total = line + a2 * (pl.vps + pl.yps + pl.mps);
  return pl;
}

// A dY A^T on one m x m gradient tile (row-major, d[i*M + j]); r gets alpha x alpha.
template <typename S, int M, typename V>
inline void grad_tile(const V* d, V* r) {
  using W = WinogradMatrices<M>;
  constexpr int A = W::alpha;
  V t[A * M];
#pragma GCC unroll 8
  for (int j = 0; j < M; ++j) mat_apply<S>(W::A, d + j, M, t + j, M);  // t = A dY  (A x M)
#pragma GCC unroll 8
  for (int i = 0; i < A; ++i) mat_apply<S>(W::A, t + i * M, 1, r + i * A, 1);  // r = t A^T  (A x A)
}

// G^T m G on one alpha x alpha point set; o gets the 3 x 3 filter gradient.
template <typename S, int M, typename V>
inline void grad_filter_tile(const V* mm, V* o) {
  using W = WinogradMatrices<M>;
  constexpr int A = W::alpha;
  V t[3 * A];
#pragma GCC unroll 8
  for (int j = 0; j < A; ++j) mat_apply<S>(W::GT, mm + j, A, t + j, A);  // t = G^T m  (3 x A)
#pragma GCC unroll 3
  for (int i = 0; i < 3; ++i) mat_apply<S>(W::GT, t + i * A, 1, o + i * 3, 1);  // o = t G  (3 x 3)
}

// yb[e][u] = (A dY A^T)[e] of output channel k of group g for the chunk's tiles u < nbv (lanes past nb
// are zero tiles).
template <typename T, int M>
void transform_grad(const ConvShape& sh, const ChunkTiles& ct, const T* dy, index_t g, index_t k, int nbv,
                    T (*yb)[kTileBlock]) {
  using V = typename Vec<T>::type;
  constexpr int A = WinogradMatrices<M>::alpha;
  const index_t P = sh.p, Q = sh.q, Kg = sh.kg();
  alignas(64) T db[M * M][kTileBlock];
  const int nb = ct.nb;
  for (int u = 0; u < nb; ++u) {
    const T* yk = dy + (ct.n[u] * sh.k + g * Kg + k) * P * Q;
    const index_t p0 = ct.p0[u], q0 = ct.q0[u];
    if (p0 + M <= P && q0 + M <= Q) {
      const T* y0 = yk + p0 * Q + q0;
#pragma GCC unroll 4
      for (int i = 0; i < M; ++i)
#pragma GCC unroll 4
        for (int j = 0; j < M; ++j) db[i * M + j][u] = y0[i * Q + j];
    } else {
      for (int i = 0; i < M; ++i)
        for (int j = 0; j < M; ++j) db[i * M + j][u] = (p0 + i < P && q0 + j < Q) ? yk[(p0 + i) * Q + q0 + j] : T(0);
    }
  }
  transform_lanes<T, M * M, A * A>(db, nb, nbv, yb, [](const V* d, V* r) { grad_tile<T, M>(d, r); });
}

template <typename T, int M>
void conv2d_bwd_filter_winograd_impl(const ConvShape& sh, const T* x, const T* dy, T* dw, T* ws) {
  constexpr int A = WinogradMatrices<M>::alpha;
  constexpr int A2 = A * A;
  constexpr int L = Vec<T>::lanes;
  const Tiling tl = tiling(sh, M);
  const index_t Kg = sh.kg(), Cg = sh.cg();
  if (tl.tiles == 0) {
    std::fill(dw, dw + sh.k * Cg * 9, T(0));
    return;
  }
  const BwdFilterPlan pl = bwd_filter_plan(sh, M, sizeof(T));
  const UKernel<T> uk = select_ukernel<T>(active_isa());
  const int mr = uk.mr, nr = uk.nr;
  T* base = ws;
  while (reinterpret_cast<std::uintptr_t>(base) % kAlign) ++base;
  T* const vp = base;
  T* const yp = vp + A2 * pl.vps;
  T* const mb = yp + A2 * pl.yps;
  const index_t kpanels = ceil_div(Kg, mr), cpanels = ceil_div(Cg, nr);
  const int nt = static_cast<int>(std::max<index_t>(1, std::min<index_t>(get_num_threads(), A2 * kpanels)));
#pragma omp parallel num_threads(nt)
  {
    using V = typename Vec<T>::type;
    ChunkTiles ct;
    AlignedBuffer<T> tbuf(static_cast<std::size_t>(L) * A2 * kTileBlock);  // L channels' transformed tiles
    T(*const tb)[A2][kTileBlock] = reinterpret_cast<T(*)[A2][kTileBlock]>(tbuf.data());
    for (index_t g = 0; g < sh.g; ++g) {
      for (index_t t0 = 0; t0 < tl.tiles; t0 += pl.depth) {
        const index_t dd = std::min(pl.depth, tl.tiles - t0), subs = ceil_div(dd, kTileBlock);
        // Transforms, kTileBlock tiles at a time: V of L input channels, or Y of up to L rows of an A panel,
        // per item; their vectors (lanes = tiles) are L x L transposed so that each store writes one
        // tile's L channels, the run the panels hold together (tile t of the chunk at depth t).
        const index_t vgroups = ceil_div(Cg, L), ygroups = kpanels * ceil_div(mr, L);
#pragma omp for schedule(static)
        for (index_t item = 0; item < (vgroups + ygroups) * subs; ++item) {
          const index_t grp = item / subs, s = item % subs, ts = s * kTileBlock;
          const int nb = static_cast<int>(std::min(kTileBlock, dd - ts));
          const int nbv = static_cast<int>(round_up(nb, L));
          chunk_tiles<M>(sh, tl, t0 + ts, nb, &ct);
          const bool is_v = grp < vgroups;
          index_t ch0, k0 = 0, j0 = 0;
          int rows = 0, nj;
          if (is_v) {
            ch0 = grp * L;
            nj = static_cast<int>(std::min<index_t>(L, Cg - ch0));
            for (int l = 0; l < nj; ++l) transform_channel<T, M>(sh, ct, x, g, ch0 + l, nbv, tb[l]);
          } else {
            const index_t yg = grp - vgroups, per = ceil_div(mr, L);
            k0 = yg / per * mr, j0 = yg % per * L;
            rows = static_cast<int>(std::min<index_t>(mr, Kg - k0));
            if (j0 >= rows) continue;
            nj = static_cast<int>(std::min<index_t>(L, rows - j0));
            ch0 = k0 + j0;
            for (int l = 0; l < nj; ++l) transform_grad<T, M>(sh, ct, dy, g, ch0 + l, nbv, tb[l]);
          }
          for (int e = 0; e < A2; ++e)
            for (int u0 = 0; u0 < nb; u0 += L) {
              V r[L];
#pragma GCC unroll 16
              for (int l = 0; l < L; ++l) r[l] = l < nj ? vload<V>(&tb[l][e][u0]) : V{};
              transpose_lanes<T>(r);
              const int nu = std::min(L, nb - u0);
              if (is_v) {
                T* dst = vp + e * pl.vps + (ch0 / nr) * nr * dd + (ts + u0) * nr + ch0 % nr;
                if (nr % L == 0) {
                  for (int j = 0; j < nu; ++j) vstore(dst + j * nr, r[j]);
                } else {
                  for (int j = 0; j < nu; ++j)
                    for (int l = 0; l < nj; ++l)
                      vp[e * pl.vps + ((ch0 + l) / nr) * nr * dd + (ts + u0 + j) * nr + (ch0 + l) % nr] = r[j][l];
                }
              } else {
                T* dst = yp + e * pl.yps + k0 * dd + (ts + u0) * rows + j0;
                alignas(64) T lanes[L];
                for (int j = 0; j < nu; ++j) {
                  vstore(lanes, r[j]);
                  copy_lanes(dst + j * rows, lanes, nj);
                }
              }
            }
        }  // barrier: the chunk's panels complete
        const T beta = t0 == 0 ? T(0) : T(1);
#pragma omp for schedule(static)
        for (index_t item = 0; item < A2 * kpanels; ++item) {
          const index_t e = item / kpanels, k0 = (item % kpanels) * mr;
          const int rows = static_cast<int>(std::min<index_t>(mr, Kg - k0));
          const ukernel_fn<T> fn = rows == mr ? uk.fn : uk.rows[rows - 1];
          const T* a = yp + e * pl.yps + k0 * dd;
          for (index_t jp = 0; jp < cpanels; ++jp) {
            const index_t c0 = jp * nr;
            fn(dd, a, vp + e * pl.vps + c0 * dd, mb + e * pl.mps + k0 * Cg + c0, Cg, 1, T(1), beta, rows,
               static_cast<int>(std::min<index_t>(nr, Cg - c0)), nullptr, false);
          }
        }  // barrier: M holds the chunks so far; the panels are free
      }
      // dW = G^T M G, vectorized over input channels.
#pragma omp for schedule(static)
      for (index_t k = 0; k < Kg; ++k) {
        alignas(64) T ob[9][L];
        for (index_t c = 0; c < Cg; c += L) {
          V mv[A2], o[9];
#pragma GCC unroll 36
          for (int e = 0; e < A2; ++e) mv[e] = vload<V>(mb + e * pl.mps + k * Cg + c);
          grad_filter_tile<T, M>(mv, o);
#pragma GCC unroll 9
          for (int ab = 0; ab < 9; ++ab) vstore(ob[ab], o[ab]);
          const int nl = static_cast<int>(std::min<index_t>(L, Cg - c));
          T* d = dw + ((g * Kg + k) * Cg + c) * 9;
          for (int l = 0; l < nl; ++l)
            for (int ab = 0; ab < 9; ++ab) d[l * 9 + ab] = ob[ab][l];
        }
      }  // barrier: M is free for the next group
    }
  }
}

}  // namespace

index_t winograd_bwd_filter_workspace_elems(const ConvShape& sh, int m, index_t elem_size) {
  return bwd_filter_plan(sh, m, elem_size).total;
}

template <typename T>
void conv2d_bwd_filter_winograd(const ConvShape& sh, int m, const T* x, const T* dy, T* dw, T* ws) {
  if (m == 2)
    conv2d_bwd_filter_winograd_impl<T, 2>(sh, x, dy, dw, ws);
  else
    conv2d_bwd_filter_winograd_impl<T, 4>(sh, x, dy, dw, ws);
}

template <typename T>
void conv2d_fwd_winograd(const ConvShape& sh, int m, const T* x, const T* w, const T* bias, T* y, T* ws, index_t tc) {
  if (m == 2)
    conv2d_fwd_winograd_impl<T, 2>(sh, x, w, false, bias, y, ws, tc);
  else
    conv2d_fwd_winograd_impl<T, 4>(sh, x, w, false, bias, y, ws, tc);
}

template void conv2d_fwd_winograd<float>(const ConvShape&, int, const float*, const float*, const float*, float*,
                                         float*, index_t);
template void conv2d_fwd_winograd<double>(const ConvShape&, int, const double*, const double*, const double*,
                                          double*, double*, index_t);
template void conv2d_bwd_filter_winograd<float>(const ConvShape&, int, const float*, const float*, float*, float*);
template void conv2d_bwd_filter_winograd<double>(const ConvShape&, int, const double*, const double*, double*,
                                                 double*);
template void conv2d_bwd_data_winograd<float>(const ConvShape&, int, const float*, const float*, float*, float*,
                                              index_t);
template void conv2d_bwd_data_winograd<double>(const ConvShape&, int, const double*, const double*, double*, double*,
                                               index_t);

// ---- the kernel table (kernels.h): F(2x2, 3x3) and F(4x4, 3x3) in each direction; chunk is tiles a
// thread transforms at once (backward filter: unused).
namespace {
std::string winograd_rejects(const ConvShape& sh) {
  if (sh.r != 3 || sh.s != 3 || sh.sh != 1 || sh.sw != 1 || sh.dh != 1 || sh.dw != 1)
    return "winograd needs a 3x3 filter with stride 1 and dilation 1";
  return "";
}
std::string winograd_bwd_data_rejects(const ConvShape& sh) {
  if (!winograd_rejects(sh).empty() || sh.ph > 2 || sh.pw > 2)
    return "winograd needs a 3x3 filter with stride 1, dilation 1 and padding at most 2";
  return "";
}
template <int M>
index_t fwd_workspace(const ConvShape& sh, index_t tc, index_t itemsize) {
  return winograd_workspace_elems(sh, M, tc, itemsize);
}
template <int M>
index_t bwd_data_workspace(const ConvShape& sh, index_t tc, index_t itemsize) {
  return winograd_bwd_data_workspace_elems(sh, M, tc, itemsize);
}
template <int M>
index_t bwd_filter_workspace(const ConvShape& sh, index_t, index_t itemsize) {
  return winograd_bwd_filter_workspace_elems(sh, M, itemsize);
}
template <int M, typename T>
void fwd(const ConvShape& sh, const ConvCall& c) {
  conv2d_fwd_winograd<T>(sh, M, static_cast<const T*>(c.a0), static_cast<const T*>(c.a1),
                         static_cast<const T*>(c.bias), static_cast<T*>(c.out), static_cast<T*>(c.ws), c.chunk);
}
template <int M, typename T>
void bwd_data(const ConvShape& sh, const ConvCall& c) {
  conv2d_bwd_data_winograd<T>(sh, M, static_cast<const T*>(c.a0), static_cast<const T*>(c.a1), static_cast<T*>(c.out),
                              static_cast<T*>(c.ws), c.chunk);
}
template <int M, typename T>
void bwd_filter(const ConvShape& sh, const ConvCall& c) {
  conv2d_bwd_filter_winograd<T>(sh, M, static_cast<const T*>(c.a0), static_cast<const T*>(c.a1),
                                static_cast<T*>(c.out), static_cast<T*>(c.ws));
}
CONV_KERNEL("fwd", "winograd_f2x2_3x3", winograd_rejects, fwd_workspace<2>, &fwd<2, float>, &fwd<2, double>);
CONV_KERNEL("fwd", "winograd_f4x4_3x3", winograd_rejects, fwd_workspace<4>, &fwd<4, float>, &fwd<4, double>);
CONV_KERNEL("bwd_data", "winograd_f2x2_3x3", winograd_bwd_data_rejects, bwd_data_workspace<2>, &bwd_data<2, float>,
            &bwd_data<2, double>);
CONV_KERNEL("bwd_data", "winograd_f4x4_3x3", winograd_bwd_data_rejects, bwd_data_workspace<4>, &bwd_data<4, float>,
            &bwd_data<4, double>);
CONV_KERNEL("bwd_filter", "winograd_f2x2_3x3", winograd_rejects, bwd_filter_workspace<2>, &bwd_filter<2, float>,
            &bwd_filter<2, double>);
CONV_KERNEL("bwd_filter", "winograd_f4x4_3x3", winograd_rejects, bwd_filter_workspace<4>, &bwd_filter<4, float>,
            &bwd_filter<4, double>);
}  // namespace

}  // namespace dnnkit
