// Element-wise epilogues fused into the GEMM tile store, and their derivatives for the backward pass.
//   y = act(z),  z = alpha*A*B + beta*C + bias[j]
#pragma once
#include <cmath>
#include <type_traits>

#include "../common.h"
#include "../simd/vector_math.h"

namespace dnnkit {

enum class Activation : int { identity = 0, relu = 1, tanh = 2, sigmoid = 3, gelu = 4 };

template <typename T>
inline T activate(Activation act, T z) {
  switch (act) {
    case Activation::relu: return z < T(0) ? T(0) : z;  // NaN passes through, as in torch.relu
    case Activation::tanh: return std::tanh(z);
    case Activation::sigmoid: return T(1) / (T(1) + std::exp(-z));
    case Activation::gelu: {
      // Phi(z) as erfc(-z / sqrt 2) / 2 (1 + erf(z / sqrt 2) cancels in the negative tail), float32 in
      // double: erfcf magnifies its argument's rounding there.
      using W = std::conditional_t<std::is_same_v<T, float>, double, T>;
      const W w = z;
      return static_cast<T>(W(0.5) * w * std::erfc(w * W(-0.70710678118654752440)));
    }
    default: return z;
  }
}

// d act / dz, from z (the pre-activation) and y = act(z).
template <typename T>
inline T activate_grad(Activation act, T z, T y) {
  switch (act) {
    case Activation::relu: return z > T(0) ? T(1) : (z != z ? z : T(0));
    case Activation::tanh: return T(1) - y * y;
    case Activation::sigmoid: return y * (T(1) - y);
    case Activation::gelu: {  // Phi(z) + z phi(z), as in activate
      using W = std::conditional_t<std::is_same_v<T, float>, double, T>;
      const W w = z;
      const W cdf = W(0.5) * std::erfc(w * W(-0.70710678118654752440));
      const W pdf = std::exp(W(-0.5) * w * w) * W(0.39894228040143267794);  // 1/sqrt(2*pi)
      return static_cast<T>(cdf + w * pdf);
    }
    default: return T(1);
  }
}

struct Epilogue {
  const void* bias = nullptr;  // length n, added to every row; nullptr for none
  Activation act = Activation::identity;
  bool empty() const { return bias == nullptr && act == Activation::identity; }
};

// The function of vector_math.h that computes act on T, or -1: tanh, sigmoid
// and, for float32, gelu run there (float32: relative error about 2e-7 for tanh and sigmoid, under 1e-6
// for gelu; float64: within 4 ulp; tests/test_rnn.py and tests/test_gemm.py) where the ISA has them.
// libm's, one element at a time, made linear with tanh 8x and with gelu 6x slower than without an
// activation at 3200 x 1024 x 256 (float32).
template <typename T = float>
inline int vector_math_fn(Activation act) {
  switch (act) {
    case Activation::sigmoid: return 1;
    case Activation::tanh: return 2;
    case Activation::gelu: return std::is_same_v<T, float> ? 3 : -1;
    default: return -1;
  }
}

// Applies bias and activation to an m x n tile at c (row stride rs_c, column stride cs_c); `bias`
// points at the tile's first column, or at its first row when per_row. A C with contiguous rows
// (or contiguous columns: the tiles of a product solved transposed) takes the activation from
// vector_math_fn's function where the ISA has one, the whole tile in one call after the bias (its rows
// in pairs: twice the independent vectors of one row of 32).
template <typename T>
void apply_epilogue(T* c, index_t rs_c, index_t cs_c, index_t m, index_t n, const T* bias, Activation act,
                    bool per_row = false) {
  const int fn = vector_math_fn<T>(act);
  const VectorMathFn<T> vk = (cs_c == 1 || rs_c == 1) && fn >= 0 ? vector_math<T>() : nullptr;
  for (index_t i = 0; i < m; ++i) {
    T* row = c + i * rs_c;
    if (bias && !per_row && cs_c == 1) {
      // The common case (a linear layer's bias on a row-major C) as a unit-stride loop the compiler
      // vectorizes; the loops below index by a run-time stride.
      T* __restrict r = row;
      const T* __restrict b = bias;
#pragma omp simd
      for (index_t j = 0; j < n; ++j) r[j] += b[j];
    } else if (bias) {
      for (index_t j = 0; j < n; ++j) row[j * cs_c] += per_row ? bias[i] : bias[j];
    }
    if (act == Activation::identity || vk) continue;  // vk: the whole tile below
    if (act == Activation::relu)  // the activation a constant: a loop the compiler vectorizes
      for (index_t j = 0; j < n; ++j) row[j * cs_c] = activate(Activation::relu, row[j * cs_c]);
    else
      for (index_t j = 0; j < n; ++j) row[j * cs_c] = activate(act, row[j * cs_c]);
  }
  if (vk && cs_c == 1) vk(fn, c, rs_c, c, rs_c, m, n);
  else if (vk) vk(fn, c, cs_c, c, cs_c, n, m);  // a transposed product's tile: its columns are contiguous
}

}  // namespace dnnkit
