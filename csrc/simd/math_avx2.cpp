// vmath.h's functions on AVX2 and FMA (vector_math.h).
#include "avx2.h"
#include "vector_math.h"
#include "vmath.h"

namespace dnnkit {

VectorMathFn<float> vector_math_avx2_f32() { return vmath::math<simd::Avx2F32>; }
VectorMathFn<double> vector_math_avx2_f64() { return vmath::math<simd::Avx2F64>; }

}  // namespace dnnkit
