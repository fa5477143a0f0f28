// Element-wise kernels on contiguous arrays: activations, their gradients, and column sums (bias
// gradients). Each runs on get_num_threads() OpenMP threads.
#pragma once
#include "../common.h"
#include "../gemm/epilogue.h"

namespace dnnkit {

// y[i] = act(z[i]) for i < n; y may alias z.
template <typename T>
void activation_forward(const T* z, T* y, index_t n, Activation act);

// grad_z[i] = grad_y[i] * act'(z[i]) with y[i] = act(z[i]); z or y may be null when act does not need
// it (relu, tanh and sigmoid need only one of them; gelu needs z). grad_z may alias grad_y.
template <typename T>
void activation_backward(const T* grad_y, const T* z, const T* y, T* grad_z, index_t n, Activation act);

// out[j] = sum_i x[i*n + j] for an m x n row-major x, accumulated in double; with `accumulate`,
// out[j] += that sum (added to out[j] in double, rounded once). out2, when given, receives the same
// (two bias gradients that see the same sums).
template <typename T>
void column_sums(const T* x, index_t m, index_t n, T* out, bool accumulate = false, T* out2 = nullptr);

}  // namespace dnnkit
