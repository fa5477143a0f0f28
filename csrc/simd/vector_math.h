// The element-wise functions of vmath.h, compiled for each ISA (math_avx2.cpp, math_avx512.cpp) and
// chosen at run time: vector_math<T>() is, for the active ISA, the function that computes exp (fn 0),
// sigmoid (1), tanh (2), gelu (3) or gelu's derivative (4) of m rows of n values (x's rows ldx apart,
// y's ldy; in place allowed; float64: fn 0-2 only), or null below AVX2 (callers then use fastmath's
// scalar functions). The GEMM's epilogue (a tile at a time), the activations' forward and backward
// passes and the tests call it.
#pragma once
#include "../common.h"
#include "../cpu_info.h"

#include <type_traits>

namespace dnnkit {

template <typename T>
using VectorMathFn = void (*)(int fn, const T* x, index_t ldx, T* y, index_t ldy, index_t m, index_t n);

VectorMathFn<float> vector_math_avx2_f32();
VectorMathFn<double> vector_math_avx2_f64();
VectorMathFn<float> vector_math_avx512_f32();
VectorMathFn<double> vector_math_avx512_f64();

template <typename T>
VectorMathFn<T> vector_math() {
  switch (active_isa()) {
#if DNNKIT_HAVE_AVX512
    case Isa::avx512:
      if constexpr (std::is_same_v<T, float>) return vector_math_avx512_f32();
      else return vector_math_avx512_f64();
#endif
#if DNNKIT_HAVE_AVX2
    case Isa::avx2:
      if constexpr (std::is_same_v<T, float>) return vector_math_avx2_f32();
      else return vector_math_avx2_f64();
#endif
    default: return nullptr;
  }
}

}  // namespace dnnkit
