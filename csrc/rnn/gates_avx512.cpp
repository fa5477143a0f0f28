// The RNN post-GEMM kernels of gates.h for AVX-512F: 16 floats a vector, tails under a k-mask, 2^n by
// VSCALEFPS, reciprocals by VRCP14PS and one Newton step (relative error about 2^-28 before rounding);
// 8 doubles a vector likewise (Avx512D).
#include <immintrin.h>

#include <type_traits>

#include "gates.h"

// GCC 12 warns that the _mm512_undefined_ps() inside the unmasked intrinsics may be used uninitialized.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include "gates_simd.h"

namespace dnnkit {
namespace {

struct Avx512 {
  using T = float;
  using reg = __m512;
  using mask = __mmask16;
  static constexpr index_t width = 16;
  // VSCALEFPS gives denormals and 0 below -87.3 and inf above 88.7 itself.
  static constexpr float kExpLo = -104.0f, kExpHi = 89.0f;
  static inline mask tail(index_t n) { return static_cast<mask>(n >= 16 ? 0xffff : (1u << n) - 1u); }
  static inline reg load(const float* p) { return _mm512_loadu_ps(p); }
  static inline reg loadm(const float* p, mask m) { return _mm512_maskz_loadu_ps(m, p); }
  static inline void store(float* p, reg v) { _mm512_storeu_ps(p, v); }
  static inline void storem(float* p, mask m, reg v) { _mm512_mask_storeu_ps(p, m, v); }
  static inline reg set1(float x) { return _mm512_set1_ps(x); }
  static inline reg add(reg a, reg b) { return _mm512_add_ps(a, b); }
  static inline reg sub(reg a, reg b) { return _mm512_sub_ps(a, b); }
  static inline reg mul(reg a, reg b) { return _mm512_mul_ps(a, b); }
  static inline reg fma(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
  static inline reg fnma(reg a, reg b, reg c) { return _mm512_fnmadd_ps(a, b, c); }
  // VMAXPS/VMINPS return the second operand when either is NaN.
  static inline reg max_nan(reg lo, reg x) { return _mm512_max_ps(lo, x); }
  static inline reg min_nan(reg hi, reg x) { return _mm512_min_ps(hi, x); }
  static inline reg abs(reg x) {
    return _mm512_castsi512_ps(_mm512_and_epi32(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fffffff)));
  }
  static inline reg copysign(reg mag, reg sgn) {
    // bits of sgn where the mask (sign bit) is set, of mag elsewhere
    return _mm512_castsi512_ps(_mm512_ternarylogic_epi32(_mm512_set1_epi32(INT32_MIN), _mm512_castps_si512(sgn),
                                                         _mm512_castps_si512(mag), 0xca));
  }
  static inline mask lt(reg a, reg b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
  static inline mask ge(reg a, reg b) { return _mm512_cmp_ps_mask(a, b, _CMP_GE_OQ); }
  static inline reg blend(mask m, reg f, reg t) { return _mm512_mask_blend_ps(m, f, t); }
  static inline reg round(reg x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static inline reg exp2i(reg p, reg n) { return _mm512_scalef_ps(p, n); }
  static inline reg recip(reg d) {
    const reg y = _mm512_rcp14_ps(d);
    return _mm512_fmadd_ps(y, _mm512_fnmadd_ps(d, y, _mm512_set1_ps(1.0f)), y);
  }
};

// float64: 8 doubles a vector; 2^n by VSCALEFPD (exact down to 0 and up to inf), reciprocals by
// VRCP14PD and two Newton steps (about 2^-56 before rounding).
struct Avx512D {
  using T = double;
  using reg = __m512d;
  using mask = __mmask8;
  static constexpr index_t width = 8;
  static constexpr double kExpLo = -746.0, kExpHi = 710.0;  // exp is 0 below -745.2 and inf above 709.8
  static inline mask tail(index_t n) { return static_cast<mask>(n >= 8 ? 0xff : (1u << n) - 1u); }
  static inline reg load(const double* p) { return _mm512_loadu_pd(p); }
  static inline reg loadm(const double* p, mask m) { return _mm512_maskz_loadu_pd(m, p); }
  static inline void store(double* p, reg v) { _mm512_storeu_pd(p, v); }
  static inline void storem(double* p, mask m, reg v) { _mm512_mask_storeu_pd(p, m, v); }
  static inline reg set1(double x) { return _mm512_set1_pd(x); }
  static inline reg add(reg a, reg b) { return _mm512_add_pd(a, b); }
  static inline reg sub(reg a, reg b) { return _mm512_sub_pd(a, b); }
  static inline reg mul(reg a, reg b) { return _mm512_mul_pd(a, b); }
  static inline reg fma(reg a, reg b, reg c) { return _mm512_fmadd_pd(a, b, c); }
  static inline reg fnma(reg a, reg b, reg c) { return _mm512_fnmadd_pd(a, b, c); }
  // VMAXPD/VMINPD return the second operand when either is NaN.
  static inline reg max_nan(reg lo, reg x) { return _mm512_max_pd(lo, x); }
  static inline reg min_nan(reg hi, reg x) { return _mm512_min_pd(hi, x); }
  static inline reg abs(reg x) {
    return _mm512_castsi512_pd(_mm512_and_epi64(_mm512_castpd_si512(x), _mm512_set1_epi64(0x7fffffffffffffffLL)));
  }
  static inline reg copysign(reg mag, reg sgn) {
    return _mm512_castsi512_pd(_mm512_ternarylogic_epi64(_mm512_set1_epi64(INT64_MIN), _mm512_castpd_si512(sgn),
                                                         _mm512_castpd_si512(mag), 0xca));
  }
  static inline mask lt(reg a, reg b) { return _mm512_cmp_pd_mask(a, b, _CMP_LT_OQ); }
  static inline mask ge(reg a, reg b) { return _mm512_cmp_pd_mask(a, b, _CMP_GE_OQ); }
  static inline reg blend(mask m, reg f, reg t) { return _mm512_mask_blend_pd(m, f, t); }
  static inline reg round(reg x) { return _mm512_roundscale_pd(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static inline reg exp2i(reg p, reg n) { return _mm512_scalef_pd(p, n); }
  static inline reg recip(reg d) {
    reg y = _mm512_rcp14_pd(d);
    y = _mm512_fmadd_pd(y, _mm512_fnmadd_pd(d, y, _mm512_set1_pd(1.0)), y);
    return _mm512_fmadd_pd(y, _mm512_fnmadd_pd(d, y, _mm512_set1_pd(1.0)), y);
  }
};

const GateKernelsF32 kAvx512 = {gates_simd::lstm_fwd<Avx512>, gates_simd::gru_fwd<Avx512>,
                                gates_simd::rnn_fwd<Avx512>, gates_simd::lstm_bwd<Avx512>, gates_simd::math<Avx512>};
const GateKernelsF64 kAvx512D = {gates_simd::lstm_fwd<Avx512D>, gates_simd::gru_fwd<Avx512D>,
                                 gates_simd::rnn_fwd<Avx512D>, gates_simd::lstm_bwd<Avx512D>, gates_simd::math<Avx512D>};

}  // namespace

const GateKernelsF32* gate_kernels_avx512() { return &kAvx512; }
const GateKernelsF64* gate_kernels_avx512_f64() { return &kAvx512D; }

}  // namespace dnnkit

#pragma GCC diagnostic pop
