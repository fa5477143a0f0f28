// Blocked GEMM on strided views (Goto/BLIS structure):
//   C := act(alpha * A*B + beta * C + bias)
// A is m x k, B is k x n, C is m x n; element (r, c) of X is x[r*rs + c*cs] (any strides, so transposes
// and non-contiguous views need no copy). When beta == 0, C is never read. bias (length n) may be null.
#pragma once
#include "../common.h"
#include "../cpu_info.h"
#include "epilogue.h"

namespace dnnkit {

template <typename T>
struct GemmArgs {
  index_t m = 0, n = 0, k = 0;
  T alpha = T(1), beta = T(0);
  const T* a = nullptr;
  index_t rs_a = 0, cs_a = 0;
  const T* b = nullptr;
  index_t rs_b = 0, cs_b = 0;
  T* c = nullptr;
  index_t rs_c = 0, cs_c = 0;
  const T* bias = nullptr;       // length n (added to every row), or length m with bias_per_row
  bool bias_per_row = false;     // true: bias[i] is added to row i (a convolution's output channels)
  Activation act = Activation::identity;
};

// Runs on `nthreads` OpenMP threads (<= 0: get_num_threads()) with the active ISA's micro-kernel.
// Throws std::bad_alloc if the packing buffers cannot be allocated; never throws from inside a
// parallel region.
template <typename T>
void gemm(const GemmArgs<T>& g, int nthreads = 0);

// The same contract for few rows of A and B = W^T (requires cs_a == 1 and rs_b == 1): dot products of
// contiguous rows, no packing, no workspace (gemm_small_m.cpp).
template <typename T>
void gemm_small_m(const GemmArgs<T>& g, int nthreads = 0);

// Bytes of packing buffers gemm() allocates for these sizes (the algorithm's workspace).
template <typename T>
index_t gemm_workspace_bytes(index_t m, index_t n, index_t k, int nthreads = 0);

}  // namespace dnnkit
