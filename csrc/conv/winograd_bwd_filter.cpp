// Winograd's backward filter, F(3x3, m x m), the transposed algorithm (winograd.cpp has the forward
// pass and backward data; winograd_tiles.h the machinery they share).
#include "kernels.h"
#include "winograd_tiles.h"

namespace dnnkit {
using namespace winograd_detail;

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
        // Dynamic: an item of V (L input channels) costs more than one of Y (a panel's rows).
#pragma omp for schedule(dynamic)
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

template void conv2d_bwd_filter_winograd<float>(const ConvShape&, int, const float*, const float*, float*, float*);
template void conv2d_bwd_filter_winograd<double>(const ConvShape&, int, const double*, const double*, double*,
                                                 double*);

// ---- the kernel table (kernels.h): F(2x2, 3x3) and F(4x4, 3x3) backward filter (chunk unused).
namespace {
template <int M>
index_t bwd_filter_workspace(const ConvShape& sh, index_t, index_t itemsize) {
  return winograd_bwd_filter_workspace_elems(sh, M, itemsize);
}
template <int M, typename T>
void bwd_filter(const ConvShape& sh, const ConvCall& c) {
  conv2d_bwd_filter_winograd<T>(sh, M, static_cast<const T*>(c.a0), static_cast<const T*>(c.a1),
                                static_cast<T*>(c.out), static_cast<T*>(c.ws));
}
CONV_KERNEL("bwd_filter", "winograd_f2x2_3x3", winograd_rejects, bwd_filter_workspace<2>, &bwd_filter<2, float>,
            &bwd_filter<2, double>);
CONV_KERNEL("bwd_filter", "winograd_f4x4_3x3", winograd_rejects, bwd_filter_workspace<4>, &bwd_filter<4, float>,
            &bwd_filter<4, double>);
}  // namespace

}  // namespace dnnkit
