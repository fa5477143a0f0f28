#include "eltwise.h"

#include <algorithm>
#include <type_traits>
#include <vector>

namespace dnnkit {

template <typename T>
void activation_forward(const T* z, T* y, index_t n, Activation act) {
  {
    // tanh, sigmoid and (float32) gelu by the vector functions the GEMM's epilogue uses (epilogue.h), so
    // that linear's output is the same with and without return_preactivation.
    const int fn = vector_math_fn<T>(act);
    const VectorMathFn<T> vk = fn >= 0 ? vector_math<T>() : nullptr;
    if (vk) {
      constexpr index_t kChunk = 4096;
#pragma omp parallel for schedule(static) num_threads(get_num_threads()) if (n > 65536)
      for (index_t i = 0; i < n; i += kChunk) vk(fn, z + i, kChunk, y + i, kChunk, 1, std::min(kChunk, n - i));
      return;
    }
  }
  if (act == Activation::relu || act == Activation::identity) {
    // Branch-free, vectorized: through activate's switch, relu is a branch on a sign, which is random
    // for real activations and mispredicted half the time.
    const bool relu = act == Activation::relu;
#pragma omp parallel for simd schedule(static) num_threads(get_num_threads()) if (n > 65536)
    for (index_t i = 0; i < n; ++i) {
      const T v = z[i];
      y[i] = relu && v < T(0) ? T(0) : v;  // NaN passes through, as in activate
    }
    return;
  }
#pragma omp parallel for schedule(static) num_threads(get_num_threads()) if (n > 65536)
  for (index_t i = 0; i < n; ++i) y[i] = activate(act, z[i]);
}

template <typename T>
void activation_backward(const T* grad_y, const T* z, const T* y, T* grad_z, index_t n, Activation act) {
  // One loop per activation, the activation a constant in each, so that the compiler vectorizes them;
  // float32 gelu's derivative by vector_math.h's function (erf and exp without the C library, whose
  // scalar calls would dominate linear's backward).
  constexpr index_t kChunk = 2048;  // values per task (and, for gelu, per buffer in L1)
  const int nt = n > 65536 ? get_num_threads() : 1;
  const index_t chunks = ceil_div(n, kChunk);
  VectorMathFn<float> vk = nullptr;
  if constexpr (std::is_same_v<T, float>)
    if (act == Activation::gelu) vk = vector_math<float>();
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
  for (index_t ci = 0; ci < chunks; ++ci) {
    const index_t i0 = ci * kChunk, i1 = std::min(n, i0 + kChunk);
    const T* __restrict gy = grad_y;
    T* __restrict gz = grad_z;
    switch (act) {
      case Activation::relu: {
        // Only relu/tanh/sigmoid come without z: their derivative is a function of y alone, and relu's
        // sign of z equals the sign of y. NaN in z propagates (d = z), as in activate_grad.
        const T* s = z ? z : y;
#pragma omp simd
        for (index_t i = i0; i < i1; ++i) {
          const T v = s[i];
          gz[i] = gy[i] * (v > T(0) ? T(1) : (v != v ? v : T(0)));
        }
        break;
      }
      case Activation::tanh:
      case Activation::sigmoid: {
        if (!y) {  // from z: y recomputed, by activation_forward's function
          alignas(64) T yb[kChunk];
          activation_forward<T>(z + i0, yb, i1 - i0, act);
          for (index_t i = i0; i < i1; ++i) gz[i] = gy[i] * activate_grad(act, z[i], yb[i - i0]);
        } else if (act == Activation::tanh) {
#pragma omp simd
          for (index_t i = i0; i < i1; ++i) gz[i] = gy[i] * (T(1) - y[i] * y[i]);
        } else {
#pragma omp simd
          for (index_t i = i0; i < i1; ++i) gz[i] = gy[i] * (y[i] * (T(1) - y[i]));
        }
        break;
      }
      case Activation::gelu: {
        if constexpr (std::is_same_v<T, float>) {
          if (vk) {
            alignas(64) float d[kChunk];
            vk(4, z + i0, kChunk, d, kChunk, 1, i1 - i0);
#pragma omp simd
            for (index_t i = i0; i < i1; ++i) gz[i] = gy[i] * d[i - i0];
            break;
          }
        }
        for (index_t i = i0; i < i1; ++i) gz[i] = gy[i] * activate_grad(Activation::gelu, z[i], T(0));
        break;
      }
      default:
        std::copy(gy + i0, gy + i1, gz + i0);
    }
  }
}

template <typename T>
void column_sums(const T* x, index_t m, index_t n, T* out, bool accumulate, T* out2) {
  // Stripes of up to kStripe columns, each summed down all rows into doubles held in L1. A stripe as wide
  // as this reads kilobytes of each row at a time, which the prefetchers follow; 64 columns (256 bytes
  // of a row, rows apart by the full width) left a bias gradient over 3200 x 2048 at a fifth of the
  // memory's speed.
  constexpr index_t kStripe = 512;
  const int nt = get_num_threads();
  const index_t stripe = std::max<index_t>(16, std::min<index_t>(kStripe, round_up(ceil_div(n, nt), 16)));
#pragma omp parallel for schedule(static) num_threads(nt) if (m * n > 65536)
  for (index_t j0 = 0; j0 < n; j0 += stripe) {
    const index_t w = std::min(stripe, n - j0);
    double acc[kStripe];
    for (index_t j = 0; j < w; ++j) acc[j] = 0.0;
    for (index_t i = 0; i < m; ++i) {
      const T* row = x + i * n + j0;
#pragma omp simd
      for (index_t j = 0; j < w; ++j) acc[j] += static_cast<double>(row[j]);
    }
    for (T* o : {out, out2}) {
      if (!o) continue;
      for (index_t j = 0; j < w; ++j)
        o[j0 + j] = static_cast<T>(accumulate ? acc[j] + static_cast<double>(o[j0 + j]) : acc[j]);
    }
  }
}

template void activation_forward<float>(const float*, float*, index_t, Activation);
template void activation_forward<double>(const double*, double*, index_t, Activation);
template void activation_backward<float>(const float*, const float*, const float*, float*, index_t, Activation);
template void activation_backward<double>(const double*, const double*, const double*, double*, index_t,
                                          Activation);
template void column_sums<float>(const float*, index_t, index_t, float*, bool, float*);
template void column_sums<double>(const double*, index_t, index_t, double*, bool, double*);

}  // namespace dnnkit
