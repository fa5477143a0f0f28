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
// Backward data is here too (stride 1): this forward pass on dy with the filters transposed and turned
// (conv2d_bwd_data_winograd). Backward filter, by the transposed algorithm F(3x3, m x m), is in
// winograd_bwd_filter.cpp; the machinery they share in winograd_tiles.h.
#include "kernels.h"
#include "winograd_tiles.h"

namespace dnnkit {
using namespace winograd_detail;
namespace {
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
// transforms reading w' out of w as they go ("turned"), so w' is never stored: on large filter banks
// its copy is a sizable share of the pass (bench/log/kernel-choices.md).

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
template void conv2d_bwd_data_winograd<float>(const ConvShape&, int, const float*, const float*, float*, float*,
                                              index_t);
template void conv2d_bwd_data_winograd<double>(const ConvShape&, int, const double*, const double*, double*, double*,
                                               index_t);

// ---- the kernel table (kernels.h): F(2x2, 3x3) and F(4x4, 3x3), forward and backward data; chunk is tiles
// a thread transforms at once.
namespace {
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
CONV_KERNEL("fwd", "winograd_f2x2_3x3", winograd_rejects, fwd_workspace<2>, &fwd<2, float>, &fwd<2, double>);
CONV_KERNEL("fwd", "winograd_f4x4_3x3", winograd_rejects, fwd_workspace<4>, &fwd<4, float>, &fwd<4, double>);
CONV_KERNEL("bwd_data", "winograd_f2x2_3x3", winograd_bwd_data_rejects, bwd_data_workspace<2>, &bwd_data<2, float>,
            &bwd_data<2, double>);
CONV_KERNEL("bwd_data", "winograd_f4x4_3x3", winograd_bwd_data_rejects, bwd_data_workspace<4>, &bwd_data<4, float>,
            &bwd_data<4, double>);
}  // namespace

}  // namespace dnnkit
