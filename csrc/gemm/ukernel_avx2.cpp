// AVX2+FMA micro-kernels: float32 6x16 (12 accumulators), float64 6x8 (12 accumulators).
#include <immintrin.h>

#include <type_traits>

#include "../simd/avx2.h"
#include "pack.h"
#include "ukernel.h"

namespace {
using dnnkit::simd::Avx2F32;
using dnnkit::simd::Avx2F64;
}  // namespace

#include "ukernel_impl.h"

namespace {
constexpr int kMR = 6;  // rows of the tile; 2 vectors wide
void uk_f32(dnnkit::index_t k, const float* a, const float* b, float* c, dnnkit::index_t rs_c,
            dnnkit::index_t cs_c, float alpha, float beta, int m, int n, const float* bias, bool bias_rows) {
  ukernel_tile<Avx2F32, kMR, 2>(k, a, b, c, rs_c, cs_c, alpha, beta, m, n, bias, bias_rows);
}
void uk_f64(dnnkit::index_t k, const double* a, const double* b, double* c, dnnkit::index_t rs_c,
            dnnkit::index_t cs_c, double alpha, double beta, int m, int n, const double* bias, bool bias_rows) {
  ukernel_tile<Avx2F64, kMR, 2>(k, a, b, c, rs_c, cs_c, alpha, beta, m, n, bias, bias_rows);
}
// UKernel::far: B prefetched 64 steps (4 KB of a 16-wide float32 panel) ahead rather than 8.
constexpr int kFarK = 64;
void uk_far_f32(dnnkit::index_t k, const float* a, const float* b, float* c, dnnkit::index_t rs_c,
                dnnkit::index_t cs_c, float alpha, float beta, int m, int n, const float* bias, bool bias_rows) {
  ukernel_tile<Avx2F32, kMR, 2, kFarK>(k, a, b, c, rs_c, cs_c, alpha, beta, m, n, bias, bias_rows);
}
void uk_far_f64(dnnkit::index_t k, const double* a, const double* b, double* c, dnnkit::index_t rs_c,
                dnnkit::index_t cs_c, double alpha, double beta, int m, int n, const double* bias, bool bias_rows) {
  ukernel_tile<Avx2F64, kMR, 2, kFarK>(k, a, b, c, rs_c, cs_c, alpha, beta, m, n, bias, bias_rows);
}
// UKernel::fn_a: A read where it lies.
void uk_a_f32(dnnkit::index_t k, const float* a, dnnkit::index_t lda, const float* b, float* c, dnnkit::index_t rs_c,
              dnnkit::index_t cs_c, float alpha, float beta, int m, int n, const float* bias, bool bias_rows) {
  ukernel_tile<Avx2F32, kMR, 2, 8, 0, true>(k, a, b, c, rs_c, cs_c, alpha, beta, m, n, bias, bias_rows, lda);
}
void uk_a_f64(dnnkit::index_t k, const double* a, dnnkit::index_t lda, const double* b, double* c,
              dnnkit::index_t rs_c, dnnkit::index_t cs_c, double alpha, double beta, int m, int n, const double* bias,
              bool bias_rows) {
  ukernel_tile<Avx2F64, kMR, 2, 8, 0, true>(k, a, b, c, rs_c, cs_c, alpha, beta, m, n, bias, bias_rows, lda);
}
// UKernel::fn_b: B read where it lies, M = 1..kMR rows on A panels of stride M; NV = 1, UKernel::half:
// one vector wide, on a packed B panel of two (ldb = NR).
template <int M, int NV = 2>
void uk_b_f32(dnnkit::index_t k, const float* a, const float* b, dnnkit::index_t ldb, const float* pf, int pf_every,
              float* c, dnnkit::index_t rs_c, dnnkit::index_t cs_c, float alpha, float beta, int m, int n,
              const float* bias, bool bias_rows) {
  ukernel_tile<Avx2F32, M, NV, 8, 0, false, true>(k, a, b, c, rs_c, cs_c, alpha, beta, m, n, bias, bias_rows, 0, ldb,
                                                pf, pf_every);
}
template <int M, int NV = 2>
void uk_b_f64(dnnkit::index_t k, const double* a, const double* b, dnnkit::index_t ldb, const double* pf,
              int pf_every, double* c, dnnkit::index_t rs_c, dnnkit::index_t cs_c, double alpha, double beta, int m,
              int n, const double* bias, bool bias_rows) {
  ukernel_tile<Avx2F64, M, NV, 8, 0, false, true>(k, a, b, c, rs_c, cs_c, alpha, beta, m, n, bias, bias_rows, 0, ldb,
                                                pf, pf_every);
}
const dnnkit::ukernel_b_fn<float> kBRowsF32[kMR] = {uk_b_f32<1>, uk_b_f32<2>, uk_b_f32<3>,
                                                     uk_b_f32<4>, uk_b_f32<5>, uk_b_f32<6>};
const dnnkit::ukernel_b_fn<double> kBRowsF64[kMR] = {uk_b_f64<1>, uk_b_f64<2>, uk_b_f64<3>,
                                                      uk_b_f64<4>, uk_b_f64<5>, uk_b_f64<6>};
const dnnkit::ukernel_b_fn<float> kHalfF32[kMR] = {uk_b_f32<1, 1>, uk_b_f32<2, 1>, uk_b_f32<3, 1>,
                                                    uk_b_f32<4, 1>, uk_b_f32<5, 1>, uk_b_f32<6, 1>};
const dnnkit::ukernel_b_fn<double> kHalfF64[kMR] = {uk_b_f64<1, 1>, uk_b_f64<2, 1>, uk_b_f64<3, 1>,
                                                     uk_b_f64<4, 1>, uk_b_f64<5, 1>, uk_b_f64<6, 1>};
// UKernel::row_panels: 4 panels, 8 accumulators.
constexpr int kRowNP = 4;
constexpr auto kRowF32 = ukernel_row_panels<Avx2F32, 2, kRowNP>;
constexpr auto kRowF64 = ukernel_row_panels<Avx2F64, 2, kRowNP>;
double probe(dnnkit::index_t iters, double* flops) { return fma_probe<Avx2F32, 12>(iters, flops); }

// Exact-row variants (UKernel::rows): ukernel_tile with M = 1..kMR rows and A panels of stride M.
template <int M>
void uk_rows_f32(dnnkit::index_t k, const float* a, const float* b, float* c, dnnkit::index_t rs_c,
                 dnnkit::index_t cs_c, float alpha, float beta, int m, int n, const float* bias, bool bias_rows) {
  ukernel_tile<Avx2F32, M, 2>(k, a, b, c, rs_c, cs_c, alpha, beta, m, n, bias, bias_rows);
}
template <int M>
void uk_rows_f64(dnnkit::index_t k, const double* a, const double* b, double* c, dnnkit::index_t rs_c,
                 dnnkit::index_t cs_c, double alpha, double beta, int m, int n, const double* bias, bool bias_rows) {
  ukernel_tile<Avx2F64, M, 2>(k, a, b, c, rs_c, cs_c, alpha, beta, m, n, bias, bias_rows);
}
const dnnkit::ukernel_fn<float> kRowsF32[kMR] = {uk_rows_f32<1>, uk_rows_f32<2>, uk_rows_f32<3>,
                                                  uk_rows_f32<4>, uk_rows_f32<5>, uk_rows_f32<6>};
const dnnkit::ukernel_fn<double> kRowsF64[kMR] = {uk_rows_f64<1>, uk_rows_f64<2>, uk_rows_f64<3>,
                                                   uk_rows_f64<4>, uk_rows_f64<5>, uk_rows_f64<6>};

void sa_f32(dnnkit::index_t k, const float* a, dnnkit::index_t lda, dnnkit::index_t k2, const float* a2,
            dnnkit::index_t lda2, const float* b, float* c, dnnkit::index_t rs_c, dnnkit::index_t cs_c, float alpha,
            float beta, int m, int n, const float* bias) {
  ukernel_tile_sa<Avx2F32, 4, 3>(k, a, lda, k2, a2, lda2, b, c, rs_c, cs_c, alpha, beta, m, n, bias);
}
void sa_f64(dnnkit::index_t k, const double* a, dnnkit::index_t lda, dnnkit::index_t k2, const double* a2,
            dnnkit::index_t lda2, const double* b, double* c, dnnkit::index_t rs_c, dnnkit::index_t cs_c,
            double alpha, double beta, int m, int n, const double* bias) {
  ukernel_tile_sa<Avx2F64, 4, 3>(k, a, lda, k2, a2, lda2, b, c, rs_c, cs_c, alpha, beta, m, n, bias);
}

constexpr int kDotMI = 2;
constexpr int kDotNJ = 4;
void dot_f32(int mi, dnnkit::index_t k, const float* x, dnnkit::index_t ldx, const float* w, dnnkit::index_t ldw,
             float* out, int ldo, int nj) {
  dot_any<Avx2F32, kDotMI, kDotNJ>(mi, k, x, ldx, w, ldw, out, ldo, nj);
}
void dot_f64(int mi, dnnkit::index_t k, const double* x, dnnkit::index_t ldx, const double* w, dnnkit::index_t ldw,
             double* out, int ldo, int nj) {
  dot_any<Avx2F64, kDotMI, kDotNJ>(mi, k, x, ldx, w, ldw, out, ldo, nj);
}
}  // namespace


namespace dnnkit {
template <> UKernel<float> ukernel_avx2<float>() {
  return {"ukernel_6x16_avx2", kMR, 16, uk_f32, kRowsF32, uk_far_f32, nullptr, uk_a_f32, kRowF32, kRowNP, kBRowsF32,
          kHalfF32};
}
template <> UKernel<double> ukernel_avx2<double>() {
  return {"ukernel_6x8_avx2", kMR, 8, uk_f64, kRowsF64, uk_far_f64, nullptr, uk_a_f64, kRowF64, kRowNP, kBRowsF64,
          kHalfF64};
}
double fma_probe_avx2(index_t iters, double* flops) { return probe(iters, flops); }
// 4 x 24: 12 accumulators, 3 vector loads and 4 broadcasts per 12 FMAs (16 registers).
// Up to two panels of it, 80% full, from depth 320 (sa_batch_fits, SaKernel::min_depth).
template <> SaKernel<float> sa_kernel_avx2<float>(index_t) {
  return {"ukernel_sa_4x24_avx2", 4, 24, sa_f32, 48, 80, 320};
}
template <> SaKernel<double> sa_kernel_avx2<double>(index_t) {
  return {"ukernel_sa_4x12_avx2", 4, 12, sa_f64, 24, 80, 320};
}
template <> DotKernel<float> dot_kernel_avx2<float>() {
  return {"dot_2x4_avx2", kDotMI, kDotNJ, dot_f32};
}
template <> DotKernel<double> dot_kernel_avx2<double>() {
  return {"dot_2x4_avx2", kDotMI, kDotNJ, dot_f64};
}
}  // namespace dnnkit
