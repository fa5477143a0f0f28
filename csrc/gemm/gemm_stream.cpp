// gemm_stream: the products that read one large operand once and do a few FLOPs per element of it, so
// that memory bounds them, not the FMA units (the backward of a fully-connected layer or an RNN cell at
// batch 1-8):
//   few rows:  C (m x n) = A (m x k) B (k x n), m <= kStreamRows (4), B with contiguous rows: dX = dY W.
//              The blocked GEMM copies B (the whole weight) into its panels first, then reads the copy.
//   few deep:  C (m x n) += A (m x k) B (k x n), k <= kStreamDepth (8), C with contiguous rows:
//              dW += dY^T X. The blocked GEMM walks C in tiles of 14 rows, each row's two lines a row
//              stride apart (4 KB and more), which the prefetchers do not follow.
// Here each thread reads contiguous runs of the streamed operand, front to back: rows of B (few rows),
// rows of C (few deep), so that a product bound by reading its operands runs at the read bandwidth
// (a GRU cell's backward at batch 1: bench/gemm.py's bwd rows, bench/log/2026-11-22-to-24.md). From 8
// rows on the blocked GEMM is faster, so the few-rows path stops at 4 rows.
//
// Sums. Few rows: B's rows are cut into chunks whose number depends on m, n and k alone; each chunk's
// partial product sums its rows in order, and C sums the partials in chunk order. Few deep: every
// output sums its k products in order. The bits are therefore the same on any number of threads and in
// either direction (alternate_direction).
#include <algorithm>
#include <cstdint>
#include <optional>

#include "epilogue.h"
#include "gemm.h"
#include "../simd/vec.h"
#include "../work_share.h"

namespace dnnkit {

namespace {

constexpr index_t kChunkRows = 256;        // few rows: rows of B a chunk, at least
constexpr index_t kMaxChunks = 16;         //            chunks at most
constexpr index_t kPartialElems = 65536;   //            all chunks' partials together, elements at most
constexpr index_t kRowUnitElems = 16384;   // few deep: elements of C a unit of work, about

// Few rows: the chunks B's k rows are cut into (>= 2 where any split is possible; 1: not streamed).
index_t stream_chunks(index_t m, index_t n, index_t k) {
  const index_t by_depth = std::max<index_t>(1, k / kChunkRows);
  const index_t by_space = std::max<index_t>(1, kPartialElems / std::max<index_t>(1, m * n));
  return std::min({by_depth, by_space, kMaxChunks});
}

// Operands as strides alone (no packed operand, no computed B, no column groups).
template <typename T>
bool plain(const GemmArgs<T>& g) {
  return !g.pack_b && !g.a_packed && !g.b_panels && g.b_group_cols == 0;
}

template <typename T>
bool few_rows_fits(const GemmArgs<T>& g) {
  return plain(g) && g.m <= kStreamRows && g.cs_b == 1 && g.n >= 16 && stream_chunks(g.m, g.n, g.k) >= 2;
}

template <typename T>
bool few_deep_fits(const GemmArgs<T>& g) {
  return plain(g) && g.k <= kStreamDepth && g.cs_b == 1 && g.cs_c == 1 && g.n >= 16 && g.m >= 16;
}

// P (m x n, contiguous) := sum over p in [p0, p1) of A(:, p) B(p, :), each element summing its products
// in order of p. Columns in blocks whose m rows of P stay in L1 (kAccBytes), each block down all of the
// chunk's rows of B, eight at a time: per vector of B, m * (8 FMAs, a load and a store of P).
constexpr index_t kAccBytes = 16384;

template <typename T>
void chunk_product(index_t m, index_t n, index_t p0, index_t p1, const T* a, index_t rs_a, index_t cs_a, const T* b,
                   index_t rs_b, T* __restrict P) {
  std::fill(P, P + m * n, T(0));
  constexpr int G = 8;
  const index_t nb = std::max<index_t>(64, kAccBytes / index_t(sizeof(T)) / m / 16 * 16);
  for (index_t j0 = 0; j0 < n; j0 += nb) {
    const index_t j1 = std::min(n, j0 + nb);
    index_t p = p0;
    for (; p + G <= p1; p += G) {
      const T* __restrict bq[G];
      for (int q = 0; q < G; ++q) bq[q] = b + (p + q) * rs_b;
      for (index_t r = 0; r < m; ++r) {
        T ar[G];
        for (int q = 0; q < G; ++q) ar[q] = a[r * rs_a + (p + q) * cs_a];
        T* __restrict pr = P + r * n;
#pragma omp simd
        for (index_t j = j0; j < j1; ++j) {
          T s = pr[j];
          for (int q = 0; q < G; ++q) s += ar[q] * bq[q][j];
          pr[j] = s;
        }
      }
    }
    for (; p < p1; ++p) {
      const T* __restrict b0 = b + p * rs_b;
      for (index_t r = 0; r < m; ++r) {
        const T a0 = a[r * rs_a + p * cs_a];
        T* __restrict pr = P + r * n;
#pragma omp simd
        for (index_t j = j0; j < j1; ++j) pr[j] = pr[j] + a0 * b0[j];
      }
    }
  }
}

template <typename T>
void few_rows(const GemmArgs<T>& g, int nthreads) {
  const index_t m = g.m, n = g.n, k = g.k;
  const index_t chunks = stream_chunks(m, n, k), elems = m * n;
  AlignedBuffer<T> partial(static_cast<std::size_t>(chunks * elems));
  int nt = static_cast<int>(std::min<index_t>(nthreads > 0 ? nthreads : get_num_threads(), chunks));
  if (double(m) * double(n) * double(k) < min_parallel_work()) nt = 1;
  std::optional<PanelShare> share;
  if (nt > 1) share.emplace(nt, chunks);
  // Each call on the same B starts where the last one ended (the same bits: the partials are summed in
  // chunk order whichever thread computed them, and when).
  const bool reverse = alternate_direction(g.b);
  const index_t cols = 64;  // columns of C a unit of the final sum
  const index_t col_units = ceil_div(n, cols);
  const T* const sums = partial.data();
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    for_each_unit(share ? &*share : nullptr, chunks, reverse, [&](index_t c) {
      const index_t p0 = k * c / chunks, p1 = k * (c + 1) / chunks;
      chunk_product<T>(m, n, p0, p1, g.a, g.rs_a, g.cs_a, g.b, g.rs_b, partial.data() + c * elems);
    });
#pragma omp barrier
#pragma omp for schedule(static)
    for (index_t u = 0; u < col_units; ++u) {
      const index_t j0 = u * cols, j1 = std::min(n, j0 + cols);
      for (index_t r = 0; r < m; ++r) {
        T* c = g.c + r * g.rs_c;
        for (index_t j = j0; j < j1; ++j) {
          T s = sums[r * n + j];
          for (index_t q = 1; q < chunks; ++q) s += sums[q * elems + r * n + j];
          T& cj = c[j * g.cs_c];
          cj = g.beta == T(0) ? g.alpha * s : g.alpha * s + g.beta * cj;
        }
      }
      if (g.bias || g.act != Activation::identity)
        apply_epilogue<T>(g.c + j0 * g.cs_c, g.rs_c, g.cs_c, m, j1 - j0,
                          g.bias ? g.bias + (g.bias_per_row ? 0 : j0) : nullptr, g.act, g.bias_per_row);
    }
  }
}

// Rows [0, R) of C (R <= 4, row stride ldc), few deep: c := alpha * sum_p A(i, p) B(p, :) + beta * c,
// the products in order of p. The R rows share each vector of B's K rows (R * K FMAs to K + R loads).
template <typename T, int K, int R>
void deep_rows(index_t n, const T* a, index_t rs_a, index_t cs_a, const T* b, index_t rs_b, T alpha, T beta, T* c,
               index_t ldc) {
  T ai[R][K];
  const T* __restrict bp[K];
  T* __restrict cr[R];
  for (int r = 0; r < R; ++r) {
    for (int p = 0; p < K; ++p) ai[r][p] = a[r * rs_a + p * cs_a];
    cr[r] = c + r * ldc;
  }
  for (int p = 0; p < K; ++p) bp[p] = b + p * rs_b;
  const bool read_c = beta != T(0);
#pragma omp simd
  for (index_t j = 0; j < n; ++j) {
    T bj[K];
    for (int p = 0; p < K; ++p) bj[p] = bp[p][j];
    for (int r = 0; r < R; ++r) {
      T s = ai[r][0] * bj[0];
      for (int p = 1; p < K; ++p) s += ai[r][p] * bj[p];
      cr[r][j] = read_c ? alpha * s + beta * cr[r][j] : alpha * s;
    }
  }
}

// One row of C, few deep, beta = 0, stored past the caches (a C written once and larger than them: no
// read for ownership, no eviction of the operands): its k products summed in order, as deep_rows does.
template <typename T, int K>
void deep_row_stream(index_t n, const T* a, index_t cs_a, const T* b, index_t rs_b, T alpha, T* c) {
  using V = reg_vec_t<T>;
  constexpr index_t L = RegVec<T>::lanes;
  T ai[K];
  for (int p = 0; p < K; ++p) ai[p] = a[p * cs_a];
  auto sum = [&](index_t j) {
    T s = ai[0] * b[j];
    for (int p = 1; p < K; ++p) s += ai[p] * b[p * rs_b + j];
    return alpha * s;
  };
  index_t j = 0;
  for (; j < n && reinterpret_cast<std::uintptr_t>(c + j) % kRegBytes != 0; ++j) c[j] = sum(j);
  for (; j + L <= n; j += L) {
    V s = splat<V>(ai[0]) * vload<V>(b + j);
    for (int p = 1; p < K; ++p) s += splat<V>(ai[p]) * vload<V>(b + p * rs_b + j);
    vstore_stream(c + j, splat<V>(alpha) * s);
  }
  for (; j < n; ++j) c[j] = sum(j);
}

template <typename T>
using DeepRowsFn = void (*)(index_t, const T*, index_t, index_t, const T*, index_t, T, T, T*, index_t);

// Vector registers of the level this file is compiled for (setup.py builds it once per level).
#ifdef __AVX512F__
constexpr int kVectorRegs = 32;
#else
constexpr int kVectorRegs = 16;
#endif

// Rows of C deep_rows computes at once for depth K: the most (of 4, 2, 1) whose R*K broadcasts of A, R
// sums and, shared by the rows, K vectors of B fit the register file (one row takes B's vectors as
// memory operands). More would spill to the stack at every vector of C (bench/gemm.py's bwd:dw rows).
template <int K>
constexpr int deep_rows_at_once() {
  for (int r : {4, 2}) if (r * K + r + K <= kVectorRegs - 2) return r;
  return 1;
}

template <typename T, int K>
void deep_block(index_t rows, index_t n, const T* a, index_t rs_a, index_t cs_a, const T* b, index_t rs_b, T alpha,
                T beta, T* c, index_t ldc, bool stream) {
  if (stream) {
    for (index_t i = 0; i < rows; ++i) deep_row_stream<T, K>(n, a + i * rs_a, cs_a, b, rs_b, alpha, c + i * ldc);
    return;
  }
  constexpr int R = deep_rows_at_once<K>();
  index_t i = 0;
  for (; i + R <= rows; i += R)
    deep_rows<T, K, R>(n, a + i * rs_a, rs_a, cs_a, b, rs_b, alpha, beta, c + i * ldc, ldc);
  for (; i < rows; ++i) deep_rows<T, K, 1>(n, a + i * rs_a, rs_a, cs_a, b, rs_b, alpha, beta, c + i * ldc, ldc);
}

template <typename T>
using DeepBlockFn = void (*)(index_t, index_t, const T*, index_t, index_t, const T*, index_t, T, T, T*, index_t,
                             bool);

template <typename T>
DeepBlockFn<T> deep_block_fn(index_t k) {
  switch (k) {
    case 1: return deep_block<T, 1>;
    case 2: return deep_block<T, 2>;
    case 3: return deep_block<T, 3>;
    case 4: return deep_block<T, 4>;
    case 5: return deep_block<T, 5>;
    case 6: return deep_block<T, 6>;
    case 7: return deep_block<T, 7>;
    default: return deep_block<T, 8>;
  }
}

template <typename T>
void few_deep(const GemmArgs<T>& g, int nthreads) {
  const index_t m = g.m, n = g.n;
  const DeepBlockFn<T> fn = deep_block_fn<T>(g.k);
  const index_t rows = round_up(std::max<index_t>(1, kRowUnitElems / n), 4), units = ceil_div(m, rows);
  int nt = static_cast<int>(std::max<index_t>(1, std::min<index_t>(nthreads > 0 ? nthreads : get_num_threads(), units)));
  if (double(m) * double(n) * double(std::max<index_t>(g.k, 4)) < min_parallel_work()) nt = 1;
  std::optional<PanelShare> share;
  if (nt > 1 && units < PanelShare::kMaxPanels) share.emplace(nt, units);
  const bool reverse = alternate_direction(g.c);  // C is what streams
  // A C only written (no beta, bias or activation) and larger than the last-level cache goes past the
  // caches (past_caches_bytes): it would go on to memory anyway, after a read for ownership of each of its
  // lines. Either way each output sums its k products in order.
  const bool past_caches = g.beta == T(0) && !g.bias && g.act == Activation::identity &&
                           double(m) * double(n) * sizeof(T) > past_caches_bytes();
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    for_each_unit(share ? &*share : nullptr, units, reverse, [&](index_t u) {
      const index_t i0 = u * rows, i1 = std::min(m, i0 + rows);
      fn(i1 - i0, n, g.a + i0 * g.rs_a, g.rs_a, g.cs_a, g.b, g.rs_b, g.alpha, g.beta, g.c + i0 * g.rs_c, g.rs_c,
         past_caches);
      if (g.bias || g.act != Activation::identity)
        apply_epilogue<T>(g.c + i0 * g.rs_c, g.rs_c, 1, i1 - i0, n,
                          g.bias ? g.bias + (g.bias_per_row ? i0 : 0) : nullptr, g.act, g.bias_per_row);
    });
    if (past_caches) stream_fence();
  }
}

}  // namespace

template <typename T>
index_t gemm_stream_workspace_bytes(index_t m, index_t n, index_t k) {
  if (m > kStreamRows || stream_chunks(m, n, k) < 2) return 0;
  return stream_chunks(m, n, k) * m * n * static_cast<index_t>(sizeof(T));
}

template <typename T>
bool gemm_stream(const GemmArgs<T>& g, int nthreads) {
  if (g.m <= 0 || g.n <= 0 || g.k <= 0) return false;
  if (few_rows_fits(g)) {
    few_rows<T>(g, nthreads);
    return true;
  }
  if (few_deep_fits(g)) {
    few_deep<T>(g, nthreads);
    return true;
  }
  return false;
}

bool gemm_stream_takes(index_t m, index_t n, index_t k) {
  if (m <= 0 || n <= 0 || k <= 0 || n < 16) return false;
  return (m <= kStreamRows && stream_chunks(m, n, k) >= 2) || (k <= kStreamDepth && m >= 16);
}

template index_t gemm_stream_workspace_bytes<float>(index_t, index_t, index_t);
template index_t gemm_stream_workspace_bytes<double>(index_t, index_t, index_t);
template bool gemm_stream<float>(const GemmArgs<float>&, int);
template bool gemm_stream<double>(const GemmArgs<double>&, int);

}  // namespace dnnkit
