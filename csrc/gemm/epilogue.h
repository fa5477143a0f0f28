// Element-wise epilogues fused into the GEMM tile store, and their derivatives for the backward pass.
//   y = act(z),  z = alpha*A*B + beta*C + bias[j]
#pragma once
#include <cmath>
#include <type_traits>

#include "../common.h"
#include "../rnn/gates.h"

namespace dnnkit {

enum class Activation : int { identity = 0, relu = 1, tanh = 2, sigmoid = 3, gelu = 4 };

template <typename T>
inline T activate(Activation act, T z) {
  switch (act) {
    case Activation::relu: return z < T(0) ? T(0) : z;  // NaN passes through, as in torch.relu
    case Activation::tanh: return std::tanh(z);
    case Activation::sigmoid: return T(1) / (T(1) + std::exp(-z));
    case Activation::gelu: return T(0.5) * z * (T(1) + std::erf(z * T(0.70710678118654752440)));
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
    case Activation::gelu: {
      const T cdf = T(0.5) * (T(1) + std::erf(z * T(0.70710678118654752440)));
      const T pdf = std::exp(T(-0.5) * z * z) * T(0.39894228040143267794);  // 1/sqrt(2*pi)
      return cdf + z * pdf;
    }
    default: return T(1);
  }
}

struct Epilogue {
  const void* bias = nullptr;  // length n, added to every row; nullptr for none
  Activation act = Activation::identity;
  bool empty() const { return bias == nullptr && act == Activation::identity; }
};

// Applies bias and activation to an m x n tile at c (row stride rs_c, column stride cs_c); `bias`
// points at the tile's first column, or at its first row when per_row.
//
// float32 tanh and sigmoid on a row-major C go a row at a time through the vector functions of the RNN
// kernels (gates.h: relative error about 2e-7, tested in tests/test_rnn.py) where the ISA has them:
// libm's, one element at a time, made linear with tanh 8x slower than without it at 3200 x 1024 x 256.
template <typename T>
void apply_epilogue(T* c, index_t rs_c, index_t cs_c, index_t m, index_t n, const T* bias, Activation act,
                    bool per_row = false) {
  if constexpr (std::is_same_v<T, float>) {
    if (cs_c == 1 && (act == Activation::tanh || act == Activation::sigmoid || act == Activation::gelu)) {
      if (const GateKernelsF32* gk = gate_kernels_f32()) {
        for (index_t i = 0; i < m; ++i) {
          float* __restrict row = c + i * rs_c;
          if (bias && per_row) {
            const float b = bias[i];
            for (index_t j = 0; j < n; ++j) row[j] += b;
          } else if (bias) {
            const float* __restrict b = bias;
#pragma omp simd
            for (index_t j = 0; j < n; ++j) row[j] += b[j];
          }
          gk->math(act == Activation::tanh ? 2 : act == Activation::sigmoid ? 1 : 3, row, row, n);
        }
        return;
      }
    }
  }
  if (cs_c == 1 && bias && !per_row && act == Activation::identity) {
    // The common case (a linear layer's bias on a row-major C) as unit-stride loops the compiler
    // vectorizes; the general loop below indexes by a run-time stride.
    for (index_t i = 0; i < m; ++i) {
      T* __restrict row = c + i * rs_c;
      const T* __restrict b = bias;
#pragma omp simd
      for (index_t j = 0; j < n; ++j) row[j] += b[j];
    }
    return;
  }
  for (index_t i = 0; i < m; ++i) {
    T* row = c + i * rs_c;
    if (bias && per_row)
      for (index_t j = 0; j < n; ++j) row[j * cs_c] += bias[i];
    else if (bias)
      for (index_t j = 0; j < n; ++j) row[j * cs_c] += bias[j];
    switch (act) {
      case Activation::identity: break;
      case Activation::relu:
        for (index_t j = 0; j < n; ++j) row[j * cs_c] = activate(Activation::relu, row[j * cs_c]);
        break;
      default:
        for (index_t j = 0; j < n; ++j) row[j * cs_c] = activate(act, row[j * cs_c]);
    }
  }
}

}  // namespace dnnkit
