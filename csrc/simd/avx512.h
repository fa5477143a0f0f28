// Traits over AVX-512F (csrc/simd/README.md): 16 floats or 8 doubles a vector, tails under a k-mask,
// 2^n by VSCALEFPS/PD, reciprocals by VRCP14PS and one Newton step (relative error about 2^-28 before
// rounding; two steps for double, about 2^-56). Included only by the AVX-512 translation units
// (*_avx512.cpp), built with its flags.
#pragma once
#include <immintrin.h>

#include <cstdint>

#include "../common.h"

namespace dnnkit {
namespace simd {
// Each translation unit its own copy: the traits are compiled with the flags of the unit that includes them.
namespace {

struct Avx512F32 {
  using T = float;
  using reg = __m512;
  using mask = __mmask16;
  static constexpr int width = 16;
  // VSCALEFPS gives denormals and 0 below -87.3 and inf above 88.7 itself.
  static constexpr float kExpLo = -104.0f, kExpHi = 89.0f;
  static inline reg zero() { return _mm512_setzero_ps(); }
  static inline reg set1(T x) { return _mm512_set1_ps(x); }
  static inline reg broadcast(const T* p) { return _mm512_set1_ps(*p); }
  static inline reg load(const T* p) { return _mm512_load_ps(p); }
  static inline reg loadu(const T* p) { return _mm512_loadu_ps(p); }
  static inline void store(T* p, reg v) { _mm512_store_ps(p, v); }
  static inline void storeu(T* p, reg v) { _mm512_storeu_ps(p, v); }
  static inline mask tail(index_t n) { return static_cast<mask>(n >= 16 ? 0xffff : (1u << n) - 1u); }
  static inline reg loadm(const T* p, mask m) { return _mm512_maskz_loadu_ps(m, p); }
  static inline void storem(T* p, mask m, reg v) { _mm512_mask_storeu_ps(p, m, v); }
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
  // out[0..4) = the lane sums of a, b, c, d (a dot tile's four accumulators): pairs interleaved and
  // added within 128-bit lanes, then the four 128-bit lanes added; 11 operations for four sums.
  static inline void reduce4(reg a, reg b, reg c, reg d, T* out) {
    const reg ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));  // a0+a2 b0+b2 a1+a3 b1+b3
    const reg cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    reg s = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                          _mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));  // a b c d per 128-bit lane
    s = _mm512_add_ps(s, _mm512_shuffle_f32x4(s, s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm512_add_ps(s, _mm512_shuffle_f32x4(s, s, _MM_SHUFFLE(2, 3, 0, 1)));
    _mm_storeu_ps(out, _mm512_castps512_ps128(s));
  }
};

struct Avx512F64 {
  using T = double;
  using reg = __m512d;
  using mask = __mmask8;
  static constexpr int width = 8;
  static constexpr double kExpLo = -746.0, kExpHi = 710.0;  // exp is 0 below -745.2 and inf above 709.8
  static inline reg zero() { return _mm512_setzero_pd(); }
  static inline reg set1(T x) { return _mm512_set1_pd(x); }
  static inline reg broadcast(const T* p) { return _mm512_set1_pd(*p); }
  static inline reg load(const T* p) { return _mm512_load_pd(p); }
  static inline reg loadu(const T* p) { return _mm512_loadu_pd(p); }
  static inline void store(T* p, reg v) { _mm512_store_pd(p, v); }
  static inline void storeu(T* p, reg v) { _mm512_storeu_pd(p, v); }
  static inline mask tail(index_t n) { return static_cast<mask>(n >= 8 ? 0xff : (1u << n) - 1u); }
  static inline reg loadm(const T* p, mask m) { return _mm512_maskz_loadu_pd(m, p); }
  static inline void storem(T* p, mask m, reg v) { _mm512_mask_storeu_pd(p, m, v); }
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

}  // namespace
}  // namespace simd
}  // namespace dnnkit
