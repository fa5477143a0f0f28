// The register-blocked micro-kernel, generic over a traits type V of csrc/simd. Included by the
// ukernel_<isa>.cpp files, each compiled with its ISA's flags (setup.py); everything here is in an
// anonymous namespace, so each file's instances stay its own.
//
// Tile: MR rows x NV vectors of V::width columns. Per k step: NV vector loads of B, MR broadcasts of A,
// MR*NV FMAs into MR*NV accumulator registers (MR*NV + NV + 1 registers must fit the register file).

namespace {

// kStridedA: A read where it lies (UKernel::fn_a), row i at a + i*lda, contiguous along k; rows i >= m
// are never read (row 0 is read in their place). Else a packed micro-panel (lda unused).
// kStridedB: B read where it lies (UKernel::fn_b), row p at b + p*ldb, NR values of it whatever n; and
// every pf_every steps one row of another panel at pf (pf + ldb, ...) is fetched into L2 (pf null: none).
template <class V, int MR, int NV, int kPrefetchK = 8, int kPrefetchA = 0, bool kStridedA = false,
          bool kStridedB = false>
void ukernel_tile(dnnkit::index_t k, const typename V::T* __restrict a, const typename V::T* __restrict b,
                  typename V::T* c, dnnkit::index_t rs_c, dnnkit::index_t cs_c, typename V::T alpha,
                  typename V::T beta, int m, int n, const typename V::T* bias, bool bias_rows,
                  dnnkit::index_t lda = 0, dnnkit::index_t ldb = 0, const typename V::T* pf = nullptr,
                  int pf_every = 1) {
  using T = typename V::T;
  using R = typename V::reg;
  constexpr int W = V::width;
  constexpr int NR = NV * W;

  // Prefetch every cache line of the C tile; the k loop hides the latency.
  if (cs_c == 1) {
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; j += 64 / static_cast<int>(sizeof(T))) __builtin_prefetch(c + i * rs_c + j, 1, 3);
    if (n > 0)
      for (int i = 0; i < m; ++i) __builtin_prefetch(c + i * rs_c + n - 1, 1, 3);
  }

  R acc[MR][NV];
#pragma GCC unroll 64
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) acc[i][j] = V::zero();

  // B streams from L2 (a KC x NR micro-panel is larger than L1 for NR = 64): prefetch it
  // kPrefetchK steps ahead, one prefetch per cache line of a B row (further where B comes from memory).
  constexpr int kRowBytes = NR * static_cast<int>(sizeof(T));
  const T* ar[MR];
  if constexpr (kStridedA) {
#pragma GCC unroll 64
    for (int i = 0; i < MR; ++i) ar[i] = a + (i < m ? i : 0) * lda;
  }
  int pf_count = pf_every;
#pragma GCC unroll 4
  for (dnnkit::index_t p = 0; p < k; ++p) {
    R bv[NV];
    if constexpr (kStridedB) {
      // A row of NR values at any alignment: the lines of its first and last value and those between.
      const char* ahead = reinterpret_cast<const char*>(b + kPrefetchK * ldb);
#pragma GCC unroll 8
      for (int l = 0; l < kRowBytes; l += 64) __builtin_prefetch(ahead + l, 0, 3);
      __builtin_prefetch(ahead + kRowBytes - 1, 0, 3);
      if (pf && --pf_count == 0) {
        pf_count = pf_every;
        const char* row = reinterpret_cast<const char*>(pf);
#pragma GCC unroll 8
        for (int l = 0; l < kRowBytes; l += 64) __builtin_prefetch(row + l, 0, 2);
        __builtin_prefetch(row + kRowBytes - 1, 0, 2);
        pf += ldb;
      }
    } else {
#pragma GCC unroll 8
      for (int l = 0; l < kRowBytes; l += 64)
        __builtin_prefetch(reinterpret_cast<const char*>(b + kPrefetchK * NR) + l, 0, 3);
    }
    // A ahead as well, one line a step (a step of A is MR values: 56 bytes of float32 at MR = 14).
    if constexpr (kPrefetchA > 0) __builtin_prefetch(a + kPrefetchA * MR, 0, 3);
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) bv[j] = kStridedB ? V::loadu(b + j * W) : V::load(b + j * W);
#pragma GCC unroll 64
    for (int i = 0; i < MR; ++i) {
      R av = kStridedA ? V::broadcast(ar[i] + p) : V::broadcast(a + i);
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) acc[i][j] = V::fma(av, bv[j], acc[i][j]);
    }
    if constexpr (!kStridedA) a += MR;
    b += kStridedB ? ldb : NR;
  }

  const R va = V::set1(alpha);
  if (m == MR && n == NR && cs_c == 1) {
    // alpha * acc + bias as one FMA (bias 0 without one): a column bias's vectors plus a row bias's
    // broadcast, one of them zero (adding it is exact).
    R vbias[NV];
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) vbias[j] = bias && !bias_rows ? V::loadu(bias + j * W) : V::zero();
    const bool rows = bias && bias_rows;
    if (beta == T(0)) {
#pragma GCC unroll 64
      for (int i = 0; i < MR; ++i) {
        const R rb = rows ? V::set1(bias[i]) : V::zero();
#pragma GCC unroll 8
        for (int j = 0; j < NV; ++j)
          V::storeu(c + i * rs_c + j * W, V::fma(acc[i][j], va, V::add(vbias[j], rb)));
      }
    } else {
      const R vb = V::set1(beta);
#pragma GCC unroll 64
      for (int i = 0; i < MR; ++i) {
        const R rb = rows ? V::set1(bias[i]) : V::zero();
#pragma GCC unroll 8
        for (int j = 0; j < NV; ++j) {
          T* cp = c + i * rs_c + j * W;
          V::storeu(cp, V::fma(vb, V::loadu(cp), V::fma(acc[i][j], va, V::add(vbias[j], rb))));
        }
      }
    }
    return;
  }
  // Edge tile or strided C: spill the accumulators, then touch only the m x n valid elements.
  alignas(64) T tile[MR * NR];
#pragma GCC unroll 64
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) V::store(tile + i * NR + j * W, V::mul(acc[i][j], va));
  if (bias)
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) tile[i * NR + j] += bias[bias_rows ? i : j];
  if (beta == T(0)) {
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) c[i * rs_c + j * cs_c] = tile[i * NR + j];
  } else {
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) {
        T* cp = c + i * rs_c + j * cs_c;
        *cp = beta * *cp + tile[i * NR + j];
      }
  }
}

// UKernel::row_panels: one row of A against up to NP panels of NV vectors each (row_panels_fn). Each panel
// is a stream from memory or L3 (a weight read once per call): its lines are prefetched kRowAheadBytes ahead.
constexpr int kRowAheadBytes = 4096;
template <class V, int NV, int NP>
void ukernel_row_panels(dnnkit::index_t k, const typename V::T* __restrict a, const typename V::T* __restrict b,
                        dnnkit::index_t b_stride, typename V::T* c, typename V::T beta, int n,
                        const typename V::T* bias) {
  using T = typename V::T;
  using R = typename V::reg;
  constexpr int W = V::width;
  constexpr int NR = NV * W;
  const int np = (n + NR - 1) / NR;
  const T* bq[NP];
#pragma GCC unroll 8
  for (int q = 0; q < NP; ++q) bq[q] = b + (q < np ? q : 0) * b_stride;  // panels past n re-read panel 0
  R acc[NP][NV];
#pragma GCC unroll 8
  for (int q = 0; q < NP; ++q)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[q][v] = V::zero();
  constexpr int kLine = 64 / static_cast<int>(sizeof(T)), kAhead = kRowAheadBytes / static_cast<int>(sizeof(T));
#pragma GCC unroll 2
  for (dnnkit::index_t p = 0; p < k; ++p) {
    const R av = V::broadcast(a + p);
#pragma GCC unroll 8
    for (int q = 0; q < NP; ++q) {
#pragma GCC unroll 4
      for (int l = 0; l < NR; l += kLine) __builtin_prefetch(bq[q] + p * NR + kAhead + l, 0, 3);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[q][v] = V::fma(av, V::load(bq[q] + p * NR + v * W), acc[q][v]);
    }
  }
  // The stores of ukernel_tile at alpha 1: acc + bias, then beta * c + that.
  const R vb = V::set1(beta);
#pragma GCC unroll 8
  for (int q = 0; q < NP; ++q) {
    if (q >= np) break;
    const int cols = n - q * NR < NR ? n - q * NR : NR;
    T* cq = c + q * NR;
    if (cols == NR) {
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) {
        const R t = V::fma(acc[q][v], V::set1(T(1)),
                           V::add(bias ? V::loadu(bias + q * NR + v * W) : V::zero(), V::zero()));
        V::storeu(cq + v * W, beta == T(0) ? t : V::fma(vb, V::loadu(cq + v * W), t));
      }
      continue;
    }
    alignas(64) T tile[NR];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) V::store(tile + v * W, acc[q][v]);
    for (int j = 0; j < cols; ++j) {
      const T t = bias ? tile[j] + bias[q * NR + j] : tile[j];
      cq[j] = beta == T(0) ? t : beta * cq[j] + t;
    }
  }
}

// The strided-A tile (SaKernel in ukernel.h): MR rows of A read in place (row i at a + i*lda), B a packed
// k x NR panel. Per k step: NV vector loads of B, MR broadcasts, MR*NV FMAs, as in ukernel_tile.
template <class V, int MR, int NV>
void ukernel_tile_sa(dnnkit::index_t k, const typename V::T* a, dnnkit::index_t lda, dnnkit::index_t k2,
                     const typename V::T* a2, dnnkit::index_t lda2, const typename V::T* __restrict b,
                     typename V::T* c, dnnkit::index_t rs_c, dnnkit::index_t cs_c, typename V::T alpha,
                     typename V::T beta, int m, int n, const typename V::T* bias) {
  using T = typename V::T;
  using R = typename V::reg;
  constexpr int W = V::width;
  constexpr int NR = NV * W;
  R acc[MR][NV];
#pragma GCC unroll 64
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) acc[i][j] = V::zero();
  constexpr int kPrefetchK = 8;
  constexpr int kRowBytes = NR * static_cast<int>(sizeof(T));
  // One depth segment: rows of A at a + i*ld, depth kk, against the next kk rows of the B panel.
  auto segment = [&](dnnkit::index_t kk, const T* as, dnnkit::index_t ld) {
    const T* ar[MR];
#pragma GCC unroll 64
    for (int i = 0; i < MR; ++i) ar[i] = as + (i < m ? i : 0) * ld;
#pragma GCC unroll 4
    for (dnnkit::index_t p = 0; p < kk; ++p) {
      R bv[NV];
#pragma GCC unroll 8
      for (int l = 0; l < kRowBytes; l += 64)
        __builtin_prefetch(reinterpret_cast<const char*>(b + kPrefetchK * NR) + l, 0, 3);
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) bv[j] = V::load(b + j * W);
#pragma GCC unroll 64
      for (int i = 0; i < MR; ++i) {
        R av = V::broadcast(ar[i] + p);
#pragma GCC unroll 8
        for (int j = 0; j < NV; ++j) acc[i][j] = V::fma(av, bv[j], acc[i][j]);
      }
      b += NR;
    }
  };
  segment(k, a, lda);
  if (k2 > 0) segment(k2, a2, lda2);
  // Through a spill tile: C is written transposed here (C^T = W X^T).
  const R va = V::set1(alpha);
  alignas(64) T tile[MR * NR];
#pragma GCC unroll 64
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) V::store(tile + i * NR + j * W, V::mul(acc[i][j], va));
  if constexpr (sizeof(T) == 4 && MR <= 8 && NR % 8 == 0) {
    if (rs_c == 1 && m == MR) {
      // 8 x 8 blocks of the tile (rows past MR zero) transposed in registers: block column l is column
      // c0 + l of the tile, the MR values that C stores contiguously.
      using dnnkit::tv8f;
      tv8f bv = {};
      if (bias) std::memcpy(&bv, bias, sizeof(T) * MR);
      const tv8f vbeta = tv8f{} + beta;
      for (int c0 = 0; c0 < n; c0 += 8) {
        tv8f r[8], o[8];
#pragma GCC unroll 8
        for (int i = 0; i < 8; ++i) {
          if (i < MR) std::memcpy(&r[i], tile + i * NR + c0, sizeof(tv8f));
          else r[i] = tv8f{};
        }
        dnnkit::transpose_regs(r, o);
        const int cols = n - c0 < 8 ? n - c0 : 8;
        for (int l = 0; l < cols; ++l) {
          T* cp = c + (c0 + l) * cs_c;
          tv8f v = o[l];
          if (beta != T(0)) {
            tv8f old = {};
            std::memcpy(&old, cp, sizeof(T) * MR);
            v += vbeta * old;
          }
          v += bv;
          std::memcpy(cp, &v, sizeof(T) * MR);
        }
      }
      return;
    }
  }
  for (int i = 0; i < m; ++i) {
    const T bi = bias ? bias[i] : T(0);
    for (int j = 0; j < n; ++j) {
      T* cp = c + i * rs_c + j * cs_c;
      *cp = (beta == T(0) ? T(0) : beta * *cp) + tile[i * NR + j] + bi;
    }
  }
}

// Whether V has reduce4 (four accumulators' lane sums at once).
template <class V, class = void>
struct has_reduce4 : std::false_type {};
// (A pointer to a function of vectors drops their alignment attributes: nothing here depends on them.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wignored-attributes"
template <class V>
struct has_reduce4<V, std::void_t<decltype(&V::reduce4)>> : std::true_type {};
#pragma GCC diagnostic pop

// Small-M dot tile (no packing): out[i*ldo + j] = sum_p x[i*ldx + p] * w[j*ldw + p] for i < MI, j < NJ.
// Both operands are contiguous along k (a fully-connected layer: x rows and weight rows); vector
// accumulators along k, one horizontal sum per output at the end. nj <= NJ rows of w are valid.
template <class V, int MI, int NJ>
inline __attribute__((always_inline)) void dot_tile(dnnkit::index_t k, const typename V::T* __restrict x,
                                                    dnnkit::index_t ldx, const typename V::T* __restrict w,
                                                    dnnkit::index_t ldw, typename V::T* out, int ldo, int nj) {
  using T = typename V::T;
  using R = typename V::reg;
  constexpr int W = V::width;
  R acc[MI][NJ];
#pragma GCC unroll 16
  for (int i = 0; i < MI; ++i)
#pragma GCC unroll 16
    for (int j = 0; j < NJ; ++j) acc[i][j] = V::zero();
  const T* wr[NJ];
#pragma GCC unroll 16
  for (int j = 0; j < NJ; ++j) wr[j] = w + (j < nj ? j : 0) * ldw;  // invalid rows re-read row 0
  dnnkit::index_t p = 0;
  for (; p + W <= k; p += W) {
    R wv[NJ];
#pragma GCC unroll 16
    for (int j = 0; j < NJ; ++j) {
      wv[j] = V::loadu(wr[j] + p);
#if defined(__x86_64__) || defined(__i386__)
      // In a register: the compiler would otherwise fold the load into each row's FMA, loading every
      // vector of w MI times (10 loads to 8 FMAs at MI = 2, NJ = 4, against 6).
      __asm__("" : "+x"(wv[j]));
#endif
    }
#pragma GCC unroll 16
    for (int i = 0; i < MI; ++i) {
      R xv = V::loadu(x + i * ldx + p);
#pragma GCC unroll 16
      for (int j = 0; j < NJ; ++j) acc[i][j] = V::fma(xv, wv[j], acc[i][j]);
    }
  }
  alignas(64) T lanes[W];
  for (int i = 0; i < MI; ++i) {
    T sums[NJ];
    if constexpr (NJ == 4 && has_reduce4<V>::value) {
      V::reduce4(acc[i][0], acc[i][1], acc[i][2], acc[i][3], sums);
    } else {
      for (int j = 0; j < NJ; ++j) {
        V::store(lanes, acc[i][j]);
        T s = T(0);
        for (int l = 0; l < W; ++l) s += lanes[l];
        sums[j] = s;
      }
    }
    for (int j = 0; j < nj; ++j) {
      T s = sums[j];
      for (dnnkit::index_t q = p; q < k; ++q) s += x[i * ldx + q] * wr[j][q];
      out[i * ldo + j] = s;
    }
  }
}

// dot_tile for a run-time mi in [1, MI_MAX] over nj rows of w, NJ at a time (the small-M driver's entry
// point): one call streams a whole stretch of weight rows, with no call between its tiles.
template <class V, int MI_MAX, int NJ>
void dot_any(int mi, dnnkit::index_t k, const typename V::T* x, dnnkit::index_t ldx, const typename V::T* w,
             dnnkit::index_t ldw, typename V::T* out, int ldo, int nj) {
  if constexpr (MI_MAX >= 1) {
    if (mi == MI_MAX) {
      for (int j = 0; j < nj; j += NJ)
        dot_tile<V, MI_MAX, NJ>(k, x, ldx, w + j * ldw, ldw, out + j, ldo, nj - j < NJ ? nj - j : NJ);
      return;
    }
    if constexpr (MI_MAX > 1) return dot_any<V, MI_MAX - 1, NJ>(mi, k, x, ldx, w, ldw, out, ldo, nj);
  }
}

// Peak probe: NACC independent FMA chains (enough to cover FMA latency x throughput), `iters` steps.
template <class V, int NACC>
double fma_probe(dnnkit::index_t iters, double* flops) {
  using R = typename V::reg;
  using T = typename V::T;
  R acc[NACC];
#pragma GCC unroll 32
  for (int i = 0; i < NACC; ++i) acc[i] = V::set1(T(i) * T(1e-3));
  const R x = V::set1(T(0.999999));
  const R y = V::set1(T(1e-7));
  for (dnnkit::index_t it = 0; it < iters; ++it) {
#pragma GCC unroll 32
    for (int i = 0; i < NACC; ++i) acc[i] = V::fma(acc[i], x, y);
    __asm__ volatile("" ::: "memory");
  }
  alignas(64) T out[V::width];
  R s = acc[0];
#pragma GCC unroll 32
  for (int i = 1; i < NACC; ++i) s = V::add(s, acc[i]);
  V::store(out, s);
  *flops = 2.0 * V::width * NACC * static_cast<double>(iters);
  return static_cast<double>(out[0]);
}

}  // namespace
