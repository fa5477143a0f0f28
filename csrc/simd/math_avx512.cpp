// vmath.h's functions on AVX-512F (vector_math.h).
// GCC 12 warns that the _mm512_undefined_ps() inside the unmasked intrinsics may be used uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include "avx512.h"
#include "vector_math.h"
#include "vmath.h"

namespace dnnkit {

VectorMathFn<float> vector_math_avx512_f32() { return vmath::math<simd::Avx512F32>; }
VectorMathFn<double> vector_math_avx512_f64() { return vmath::math<simd::Avx512F64>; }

}  // namespace dnnkit
