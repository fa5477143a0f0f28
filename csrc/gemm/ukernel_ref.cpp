// Portable reference micro-kernels (any CPU): float32 and float64 4x8, plain C++ on a scalar "vector".
#include <type_traits>

#include "../simd/scalar.h"
#include "pack.h"
#include "ukernel.h"

namespace {
using dnnkit::simd::Scalar;
}  // namespace

#include "ukernel_impl.h"

namespace {
constexpr int kMR = 4;
constexpr int kNR = 8;
void uk_f32(dnnkit::index_t k, const float* a, const float* b, float* c, dnnkit::index_t rs_c,
            dnnkit::index_t cs_c, float alpha, float beta, int m, int n, const float* bias, bool bias_rows) {
  ukernel_tile<Scalar<float>, kMR, kNR>(k, a, b, c, rs_c, cs_c, alpha, beta, m, n, bias, bias_rows);
}
void uk_f64(dnnkit::index_t k, const double* a, const double* b, double* c, dnnkit::index_t rs_c,
            dnnkit::index_t cs_c, double alpha, double beta, int m, int n, const double* bias, bool bias_rows) {
  ukernel_tile<Scalar<double>, kMR, kNR>(k, a, b, c, rs_c, cs_c, alpha, beta, m, n, bias, bias_rows);
}

// Exact-row variants (UKernel::rows): ukernel_tile with M = 1..kMR rows and A panels of stride M.
template <int M>
void uk_rows_f32(dnnkit::index_t k, const float* a, const float* b, float* c, dnnkit::index_t rs_c,
                 dnnkit::index_t cs_c, float alpha, float beta, int m, int n, const float* bias, bool bias_rows) {
  ukernel_tile<Scalar<float>, M, kNR>(k, a, b, c, rs_c, cs_c, alpha, beta, m, n, bias, bias_rows);
}
template <int M>
void uk_rows_f64(dnnkit::index_t k, const double* a, const double* b, double* c, dnnkit::index_t rs_c,
                 dnnkit::index_t cs_c, double alpha, double beta, int m, int n, const double* bias, bool bias_rows) {
  ukernel_tile<Scalar<double>, M, kNR>(k, a, b, c, rs_c, cs_c, alpha, beta, m, n, bias, bias_rows);
}
const dnnkit::ukernel_fn<float> kRowsF32[kMR] = {uk_rows_f32<1>, uk_rows_f32<2>, uk_rows_f32<3>, uk_rows_f32<4>};
const dnnkit::ukernel_fn<double> kRowsF64[kMR] = {uk_rows_f64<1>, uk_rows_f64<2>, uk_rows_f64<3>,
                                                   uk_rows_f64<4>};

constexpr int kDotMI = 4;
constexpr int kDotNJ = 4;
void dot_f32(int mi, dnnkit::index_t k, const float* x, dnnkit::index_t ldx, const float* w, dnnkit::index_t ldw,
             float* out, int ldo, int nj) {
  dot_any<Scalar<float>, kDotMI, kDotNJ>(mi, k, x, ldx, w, ldw, out, ldo, nj);
}
void dot_f64(int mi, dnnkit::index_t k, const double* x, dnnkit::index_t ldx, const double* w, dnnkit::index_t ldw,
             double* out, int ldo, int nj) {
  dot_any<Scalar<double>, kDotMI, kDotNJ>(mi, k, x, ldx, w, ldw, out, ldo, nj);
}
}  // namespace

namespace dnnkit {
template <> UKernel<float> ukernel_ref<float>() {
  return {"ukernel_4x8_ref", kMR, kNR, uk_f32, kRowsF32};
}
template <> UKernel<double> ukernel_ref<double>() {
  return {"ukernel_4x8_ref", kMR, kNR, uk_f64, kRowsF64};
}
double fma_probe_ref(index_t iters, double* flops) { return fma_probe<Scalar<float>, 8>(iters, flops); }
template <> DotKernel<float> dot_kernel_ref<float>() {
  return {"dot_4x4_ref", kDotMI, kDotNJ, dot_f32};
}
template <> DotKernel<double> dot_kernel_ref<double>() {
  return {"dot_4x4_ref", kDotMI, kDotNJ, dot_f64};
}
}  // namespace dnnkit
