// gemm_small_m: C := act(alpha * A * W^T + beta * C + bias) for few rows of A, with no packing.
// A (m x k) and W (n x k) are both contiguous along k (a fully-connected layer with a small batch), so
// every output is a dot product of two contiguous rows; W is streamed from memory once per block of
// MI_MAX rows of A. Threads split the n dimension.
#include <algorithm>

#include "gemm.h"
#include "ukernel.h"

namespace dnnkit {

template <typename T>
void gemm_small_m(const GemmArgs<T>& g, int nthreads) {
  // Contract: cs_a == 1 and rs_b == 1 (B = W^T with W row-major, ldw = cs_b); checked by the caller.
  if (g.m == 0 || g.n == 0) return;
  const DotKernel<T> dk = select_dot_kernel<T>(active_isa());
  const int nj = dk.nj;
  const index_t n_jb = ceil_div(g.n, nj);
  const int nt_max = static_cast<int>(std::max<index_t>(1, std::min<index_t>(nthreads > 0 ? nthreads : get_num_threads(),
                                                                         ceil_div(n_jb, 4))));
  const int nt = double(g.m) * double(g.n) * double(g.k) < min_parallel_work() ? 1 : nt_max;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
  for (index_t jb = 0; jb < n_jb; ++jb) {
    const index_t j0 = jb * nj;
    const int nj_t = static_cast<int>(std::min<index_t>(nj, g.n - j0));
    T tile[64];  // MI_MAX x NJ <= 64
    for (index_t i0 = 0; i0 < g.m; i0 += dk.mi_max) {
      const int mi = static_cast<int>(std::min<index_t>(dk.mi_max, g.m - i0));
      dk.fn(mi, g.k, g.a + i0 * g.rs_a, g.rs_a, g.b + j0 * g.cs_b, g.cs_b, tile, nj, nj_t);
      for (int i = 0; i < mi; ++i) {
        T* c = g.c + (i0 + i) * g.rs_c + j0 * g.cs_c;
        for (int j = 0; j < nj_t; ++j) {
          T v = g.alpha * tile[i * nj + j];
          if (g.beta != T(0)) v += g.beta * c[j * g.cs_c];
          if (g.bias) v += g.bias[g.bias_per_row ? i0 + i : j0 + j];
          c[j * g.cs_c] = activate(g.act, v);
        }
      }
    }
  }
}

template void gemm_small_m<float>(const GemmArgs<float>&, int);
template void gemm_small_m<double>(const GemmArgs<double>&, int);

}  // namespace dnnkit
