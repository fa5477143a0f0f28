// AVX-512F micro-kernels: float32 14x32 and float64 14x16 (28 accumulators, 2 vector loads of B and
// 14 broadcasts of A per k step). The driver keeps the A micro-panel (14 x KC) in L1 and streams B from
// L2: two cache lines of B per 28 FMAs, half the L2 traffic of a 6x64 tile, whose 4 lines per 24 FMAs
// held it at about 80% of the FMA peak.
#include <immintrin.h>

#include <array>
#include <utility>

#include <type_traits>

#include "pack.h"
#include "ukernel.h"

// GCC 12 warns that the _mm512_undefined_*() inside the unmasked intrinsics may be used uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include "../simd/avx512.h"

namespace {
using dnnkit::simd::Avx512F32;
using dnnkit::simd::Avx512F64;
}  // namespace

#include "ukernel_impl.h"

namespace {
constexpr int kMR = 14;  // rows of the tile; 2 vectors wide
void uk_f32(dnnkit::index_t k, const float* a, const float* b, float* c, dnnkit::index_t rs_c,
            dnnkit::index_t cs_c, float alpha, float beta, int m, int n, const float* bias, bool bias_rows) {
  ukernel_tile<Avx512F32, kMR, 2>(k, a, b, c, rs_c, cs_c, alpha, beta, m, n, bias, bias_rows);
}
void uk_f64(dnnkit::index_t k, const double* a, const double* b, double* c, dnnkit::index_t rs_c,
            dnnkit::index_t cs_c, double alpha, double beta, int m, int n, const double* bias, bool bias_rows) {
  ukernel_tile<Avx512F64, kMR, 2>(k, a, b, c, rs_c, cs_c, alpha, beta, m, n, bias, bias_rows);
}
// UKernel::far: B prefetched 64 steps (8 KB of a 32-wide float32 panel) ahead rather than 8, far enough to
// cover a fetch from memory.
constexpr int kFarK = 64;
void uk_far_f32(dnnkit::index_t k, const float* a, const float* b, float* c, dnnkit::index_t rs_c,
                dnnkit::index_t cs_c, float alpha, float beta, int m, int n, const float* bias, bool bias_rows) {
  ukernel_tile<Avx512F32, kMR, 2, kFarK>(k, a, b, c, rs_c, cs_c, alpha, beta, m, n, bias, bias_rows);
}
// UKernel::far_a: A prefetched 48 steps (2.7 KB of a 14-row float32 panel) ahead as well, for the first
// tile of a row of tiles, whose A micro-panel comes from L3 (bench/log/kernel-choices.md).
constexpr int kFarA = 48;
void uk_fara_f32(dnnkit::index_t k, const float* a, const float* b, float* c, dnnkit::index_t rs_c,
                 dnnkit::index_t cs_c, float alpha, float beta, int m, int n, const float* bias, bool bias_rows) {
  ukernel_tile<Avx512F32, kMR, 2, 8, kFarA>(k, a, b, c, rs_c, cs_c, alpha, beta, m, n, bias, bias_rows);
}
void uk_fara_f64(dnnkit::index_t k, const double* a, const double* b, double* c, dnnkit::index_t rs_c,
                 dnnkit::index_t cs_c, double alpha, double beta, int m, int n, const double* bias, bool bias_rows) {
  ukernel_tile<Avx512F64, kMR, 2, 8, kFarA>(k, a, b, c, rs_c, cs_c, alpha, beta, m, n, bias, bias_rows);
}
void uk_far_f64(dnnkit::index_t k, const double* a, const double* b, double* c, dnnkit::index_t rs_c,
                dnnkit::index_t cs_c, double alpha, double beta, int m, int n, const double* bias, bool bias_rows) {
  ukernel_tile<Avx512F64, kMR, 2, kFarK>(k, a, b, c, rs_c, cs_c, alpha, beta, m, n, bias, bias_rows);
}
// UKernel::fn_b: B read where it lies, M = 1..kMR rows on A panels of stride M; NV = 1, UKernel::half:
// one vector wide, on a packed B panel of two (ldb = NR).
template <int M, int NV = 2>
void uk_b_f32(dnnkit::index_t k, const float* a, const float* b, dnnkit::index_t ldb, const float* pf, int pf_every,
              float* c, dnnkit::index_t rs_c, dnnkit::index_t cs_c, float alpha, float beta, int m, int n,
              const float* bias, bool bias_rows) {
  ukernel_tile<Avx512F32, M, NV, 8, 0, false, true>(k, a, b, c, rs_c, cs_c, alpha, beta, m, n, bias, bias_rows, 0, ldb,
                                                  pf, pf_every);
}
template <int M, int NV = 2>
void uk_b_f64(dnnkit::index_t k, const double* a, const double* b, dnnkit::index_t ldb, const double* pf,
              int pf_every, double* c, dnnkit::index_t rs_c, dnnkit::index_t cs_c, double alpha, double beta, int m,
              int n, const double* bias, bool bias_rows) {
  ukernel_tile<Avx512F64, M, NV, 8, 0, false, true>(k, a, b, c, rs_c, cs_c, alpha, beta, m, n, bias, bias_rows, 0, ldb,
                                                  pf, pf_every);
}
double probe(dnnkit::index_t iters, double* flops) { return fma_probe<Avx512F32, 16>(iters, flops); }

// Exact-row variants (UKernel::rows): ukernel_tile with M = 1..kMR rows and A panels of stride M.
template <int M>
void uk_rows_f32(dnnkit::index_t k, const float* a, const float* b, float* c, dnnkit::index_t rs_c,
                 dnnkit::index_t cs_c, float alpha, float beta, int m, int n, const float* bias, bool bias_rows) {
  ukernel_tile<Avx512F32, M, 2>(k, a, b, c, rs_c, cs_c, alpha, beta, m, n, bias, bias_rows);
}
template <int M>
void uk_rows_f64(dnnkit::index_t k, const double* a, const double* b, double* c, dnnkit::index_t rs_c,
                 dnnkit::index_t cs_c, double alpha, double beta, int m, int n, const double* bias, bool bias_rows) {
  ukernel_tile<Avx512F64, M, 2>(k, a, b, c, rs_c, cs_c, alpha, beta, m, n, bias, bias_rows);
}
template <template <int> class F, typename Fn, int... M>
constexpr std::array<Fn, sizeof...(M)> rows_table(std::integer_sequence<int, M...>) {
  return {F<M + 1>::fn...};
}
template <int M> struct RowsF32 { static constexpr dnnkit::ukernel_fn<float> fn = uk_rows_f32<M>; };
template <int M> struct RowsF64 { static constexpr dnnkit::ukernel_fn<double> fn = uk_rows_f64<M>; };
constexpr auto kRowsF32 = rows_table<RowsF32, dnnkit::ukernel_fn<float>>(std::make_integer_sequence<int, kMR>{});
constexpr auto kRowsF64 = rows_table<RowsF64, dnnkit::ukernel_fn<double>>(std::make_integer_sequence<int, kMR>{});

template <int M> struct BRowsF32 { static constexpr dnnkit::ukernel_b_fn<float> fn = uk_b_f32<M>; };
template <int M> struct BRowsF64 { static constexpr dnnkit::ukernel_b_fn<double> fn = uk_b_f64<M>; };
constexpr auto kBRowsF32 =
    rows_table<BRowsF32, dnnkit::ukernel_b_fn<float>>(std::make_integer_sequence<int, kMR>{});
constexpr auto kBRowsF64 =
    rows_table<BRowsF64, dnnkit::ukernel_b_fn<double>>(std::make_integer_sequence<int, kMR>{});
template <int M> struct HalfF32 { static constexpr dnnkit::ukernel_b_fn<float> fn = uk_b_f32<M, 1>; };
template <int M> struct HalfF64 { static constexpr dnnkit::ukernel_b_fn<double> fn = uk_b_f64<M, 1>; };
constexpr auto kHalfF32 = rows_table<HalfF32, dnnkit::ukernel_b_fn<float>>(std::make_integer_sequence<int, kMR>{});
constexpr auto kHalfF64 = rows_table<HalfF64, dnnkit::ukernel_b_fn<double>>(std::make_integer_sequence<int, kMR>{});

// Strided-A tiles of 8 rows of W by NV vectors of the batch: 8 x 1, 8 x 2 and 8 x 3 (up to 24
// accumulators, NV loads and 8 broadcasts per 8 NV FMAs). Batches past 3 vectors run as panels of 8 x 2:
// a 6 x 4 tile reads 4 cache lines of the packed batch from L2 per 24 FMAs, 1.5x the 8 x 2 tile's
// traffic. Each row of W is a stream with a base register of its own, so more than 8 rows run out of
// registers (bench/log/2026-11-22-to-24.md, strided-A tiles).
template <class V, int MR, int NV>
void sa_tile(dnnkit::index_t k, const typename V::T* a, dnnkit::index_t lda, dnnkit::index_t k2,
             const typename V::T* a2, dnnkit::index_t lda2, const typename V::T* b, typename V::T* c,
             dnnkit::index_t rs_c, dnnkit::index_t cs_c, typename V::T alpha, typename V::T beta, int m, int n,
             const typename V::T* bias) {
  ukernel_tile_sa<V, MR, NV>(k, a, lda, k2, a2, lda2, b, c, rs_c, cs_c, alpha, beta, m, n, bias);
}
template <class V>
dnnkit::SaKernel<typename V::T> sa_for_rows(dnnkit::index_t m, const char* const (&names)[3]) {
  constexpr int W = V::width;
  // Up to 128 float32 rows in panels 75% full, from depth 192 (sa_batch_fits, SaKernel::min_depth).
  constexpr int kMaxRows = 8 * W, kFill = 75, kDepth = 192;
  if (m > 0 && m <= W) return {names[0], 8, W, sa_tile<V, 8, 1>, kMaxRows, kFill, kDepth};
  if (m > 2 * W && m <= 3 * W) return {names[2], 8, 3 * W, sa_tile<V, 8, 3>, kMaxRows, kFill, kDepth};
  return {names[1], 8, 2 * W, sa_tile<V, 8, 2>, kMaxRows, kFill, kDepth};
}
constexpr const char* kSaNamesF32[3] = {"ukernel_sa_8x16_avx512", "ukernel_sa_8x32_avx512", "ukernel_sa_8x48_avx512"};
constexpr const char* kSaNamesF64[3] = {"ukernel_sa_8x8_avx512", "ukernel_sa_8x16_avx512", "ukernel_sa_8x24_avx512"};

// UKernel::row_panels: 4 panels, 8 accumulators: FMAs enough in flight to cover the FMA's latency on a core
// that retires one 512-bit FMA a cycle or two, where the one-row tile keeps 2 (bench/log/2026-12-07-zen4.md).
constexpr int kRowNP = 4;
constexpr auto kRowF32 = ukernel_row_panels<Avx512F32, 2, kRowNP>;
constexpr auto kRowF64 = ukernel_row_panels<Avx512F64, 2, kRowNP>;

constexpr int kDotMI = 4;
constexpr int kDotNJ = 4;
void dot_f32(int mi, dnnkit::index_t k, const float* x, dnnkit::index_t ldx, const float* w, dnnkit::index_t ldw,
             float* out, int ldo, int nj) {
  dot_any<Avx512F32, kDotMI, kDotNJ>(mi, k, x, ldx, w, ldw, out, ldo, nj);
}
void dot_f64(int mi, dnnkit::index_t k, const double* x, dnnkit::index_t ldx, const double* w, dnnkit::index_t ldw,
             double* out, int ldo, int nj) {
  dot_any<Avx512F64, kDotMI, kDotNJ>(mi, k, x, ldx, w, ldw, out, ldo, nj);
}
}  // namespace


namespace dnnkit {
template <> UKernel<float> ukernel_avx512<float>() {
  return {"ukernel_14x32_avx512", kMR, 32, uk_f32, kRowsF32.data(), uk_far_f32, uk_fara_f32, nullptr, kRowF32,
          kRowNP, kBRowsF32.data(), kHalfF32.data()};
}
template <> UKernel<double> ukernel_avx512<double>() {
  return {"ukernel_14x16_avx512", kMR, 16, uk_f64, kRowsF64.data(), uk_far_f64, uk_fara_f64, nullptr, kRowF64,
          kRowNP, kBRowsF64.data(), kHalfF64.data()};
}
double fma_probe_avx512(index_t iters, double* flops) { return probe(iters, flops); }
// A batch of up to 48 rows (float32) reads each weight row once, in the narrowest tile that holds it; a
// larger one reads it once per 32-row panel.
template <> SaKernel<float> sa_kernel_avx512<float>(index_t m) { return sa_for_rows<Avx512F32>(m, kSaNamesF32); }
template <> SaKernel<double> sa_kernel_avx512<double>(index_t m) { return sa_for_rows<Avx512F64>(m, kSaNamesF64); }
template <> DotKernel<float> dot_kernel_avx512<float>() {
  return {"dot_4x4_avx512", kDotMI, kDotNJ, dot_f32};
}
template <> DotKernel<double> dot_kernel_avx512<double>() {
  return {"dot_4x4_avx512", kDotMI, kDotNJ, dot_f64};
}
}  // namespace dnnkit
