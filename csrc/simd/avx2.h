// Traits over AVX2 and FMA (csrc/simd/README.md): 8 floats or 4 doubles a vector, tails through
// VMASKMOVPS/PD, 2^n built in the exponent bits, reciprocals by division (VRCPPS's 12 bits would need
// two Newton steps). Included only by the AVX2 translation units (*_avx2.cpp), built with its flags.
#pragma once
#include <immintrin.h>

#include "../common.h"

namespace dnnkit {
namespace simd {
// Each translation unit its own copy: the traits are compiled with the flags of the unit that includes them.
namespace {

struct Avx2F32 {
  using T = float;
  using reg = __m256;
  using mask = __m256i;
  static constexpr int width = 8;
  // 2^n built in the exponent bits must stay a normal float: n in [-126, 127] (fastmath::exp's range).
  static constexpr float kExpLo = -87.33654f, kExpHi = 88.0f;  // ln of the smallest normal float: 2^n stays normal
  static inline reg zero() { return _mm256_setzero_ps(); }
  static inline reg set1(T x) { return _mm256_set1_ps(x); }
  static inline reg broadcast(const T* p) { return _mm256_set1_ps(*p); }
  static inline reg load(const T* p) { return _mm256_load_ps(p); }
  static inline reg loadu(const T* p) { return _mm256_loadu_ps(p); }
  static inline void store(T* p, reg v) { _mm256_store_ps(p, v); }
  static inline void storeu(T* p, reg v) { _mm256_storeu_ps(p, v); }
  static inline mask tail(index_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n < 8 ? n : 8)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static inline reg loadm(const T* p, mask m) { return _mm256_maskload_ps(p, m); }
  static inline void storem(T* p, mask m, reg v) { _mm256_maskstore_ps(p, m, v); }
  static inline reg add(reg a, reg b) { return _mm256_add_ps(a, b); }
  static inline reg sub(reg a, reg b) { return _mm256_sub_ps(a, b); }
  static inline reg mul(reg a, reg b) { return _mm256_mul_ps(a, b); }
  static inline reg fma(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
  static inline reg fnma(reg a, reg b, reg c) { return _mm256_fnmadd_ps(a, b, c); }
  // VMAXPS/VMINPS return the second operand when either is NaN.
  static inline reg max_nan(reg lo, reg x) { return _mm256_max_ps(lo, x); }
  static inline reg min_nan(reg hi, reg x) { return _mm256_min_ps(hi, x); }
  static inline reg abs(reg x) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x); }
  static inline reg copysign(reg mag, reg sgn) {
    const reg s = _mm256_set1_ps(-0.0f);
    return _mm256_or_ps(_mm256_andnot_ps(s, mag), _mm256_and_ps(s, sgn));
  }
  static inline reg lt(reg a, reg b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
  static inline reg ge(reg a, reg b) { return _mm256_cmp_ps(a, b, _CMP_GE_OQ); }
  static inline reg blend(reg m, reg f, reg t) { return _mm256_blendv_ps(f, t, m); }
  static inline reg round(reg x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static inline reg exp2i(reg p, reg n) {
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
  }
  static inline reg recip(reg d) { return _mm256_div_ps(_mm256_set1_ps(1.0f), d); }
  // out[0..4) = the lane sums of a, b, c, d: two horizontal adds, then the two 128-bit halves added.
  static inline void reduce4(reg a, reg b, reg c, reg d, T* out) {
    const reg s = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));  // a b c d in each half
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1)));
  }
};

// float64: 2^n as 2^(n/2) 2^(n - n/2), each built in the exponent bits (both normal for every n the clamp
// leaves, so the product is exact down to 0 and up to inf, as VSCALEFPD gives on AVX-512).
struct Avx2F64 {
  using T = double;
  using reg = __m256d;
  using mask = __m256i;
  static constexpr int width = 4;
  static constexpr double kExpLo = -746.0, kExpHi = 710.0;  // exp is 0 below -745.2 and inf above 709.8
  static inline reg zero() { return _mm256_setzero_pd(); }
  static inline reg set1(T x) { return _mm256_set1_pd(x); }
  static inline reg broadcast(const T* p) { return _mm256_set1_pd(*p); }
  static inline reg load(const T* p) { return _mm256_load_pd(p); }
  static inline reg loadu(const T* p) { return _mm256_loadu_pd(p); }
  static inline void store(T* p, reg v) { _mm256_store_pd(p, v); }
  static inline void storeu(T* p, reg v) { _mm256_storeu_pd(p, v); }
  static inline mask tail(index_t n) {
    return _mm256_cmpgt_epi64(_mm256_set1_epi64x(n < 4 ? n : 4), _mm256_setr_epi64x(0, 1, 2, 3));
  }
  static inline reg loadm(const T* p, mask m) { return _mm256_maskload_pd(p, m); }
  static inline void storem(T* p, mask m, reg v) { _mm256_maskstore_pd(p, m, v); }
  static inline reg add(reg a, reg b) { return _mm256_add_pd(a, b); }
  static inline reg sub(reg a, reg b) { return _mm256_sub_pd(a, b); }
  static inline reg mul(reg a, reg b) { return _mm256_mul_pd(a, b); }
  static inline reg fma(reg a, reg b, reg c) { return _mm256_fmadd_pd(a, b, c); }
  static inline reg fnma(reg a, reg b, reg c) { return _mm256_fnmadd_pd(a, b, c); }
  // VMAXPD/VMINPD return the second operand when either is NaN.
  static inline reg max_nan(reg lo, reg x) { return _mm256_max_pd(lo, x); }
  static inline reg min_nan(reg hi, reg x) { return _mm256_min_pd(hi, x); }
  static inline reg abs(reg x) { return _mm256_andnot_pd(_mm256_set1_pd(-0.0), x); }
  static inline reg copysign(reg mag, reg sgn) {
    const reg s = _mm256_set1_pd(-0.0);
    return _mm256_or_pd(_mm256_andnot_pd(s, mag), _mm256_and_pd(s, sgn));
  }
  static inline reg lt(reg a, reg b) { return _mm256_cmp_pd(a, b, _CMP_LT_OQ); }
  static inline reg ge(reg a, reg b) { return _mm256_cmp_pd(a, b, _CMP_GE_OQ); }
  static inline reg blend(reg m, reg f, reg t) { return _mm256_blendv_pd(f, t, m); }
  static inline reg round(reg x) { return _mm256_round_pd(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static inline reg pow2(__m128i e) {  // 2^e for e in [-1022, 1023]
    const __m256i bits = _mm256_slli_epi64(_mm256_add_epi64(_mm256_cvtepi32_epi64(e), _mm256_set1_epi64x(1023)), 52);
    return _mm256_castsi256_pd(bits);
  }
  static inline reg exp2i(reg p, reg n) {
    const __m128i ni = _mm256_cvtpd_epi32(n);
    const __m128i n1 = _mm_srai_epi32(ni, 1);
    return _mm256_mul_pd(_mm256_mul_pd(p, pow2(n1)), pow2(_mm_sub_epi32(ni, n1)));
  }
  static inline reg recip(reg d) { return _mm256_div_pd(_mm256_set1_pd(1.0), d); }
};

}  // namespace
}  // namespace simd
}  // namespace dnnkit
