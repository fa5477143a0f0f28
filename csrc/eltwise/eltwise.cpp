#include "eltwise.h"

#include <vector>

namespace dnnkit {

template <typename T>
void activation_forward(const T* z, T* y, index_t n, Activation act) {
#pragma omp parallel for schedule(static) num_threads(get_num_threads()) if (n > 65536)
  for (index_t i = 0; i < n; ++i) y[i] = activate(act, z[i]);
}

template <typename T>
void activation_backward(const T* grad_y, const T* z, const T* y, T* grad_z, index_t n, Activation act) {
#pragma omp parallel for schedule(static) num_threads(get_num_threads()) if (n > 65536)
  for (index_t i = 0; i < n; ++i) {
    T zi, yi;
    if (z) {
      zi = z[i];
      yi = y ? y[i] : activate(act, zi);
    } else {
      // Only relu/tanh/sigmoid come without z: their derivative is a function of y alone, and relu's
      // sign of z equals the sign of y.
      yi = y[i];
      zi = yi;
    }
    grad_z[i] = grad_y[i] * activate_grad(act, zi, yi);
  }
}

template <typename T>
void column_sums(const T* x, index_t m, index_t n, T* out) {
  const int nt = get_num_threads();
#pragma omp parallel for schedule(static) num_threads(nt) if (m * n > 65536)
  for (index_t j0 = 0; j0 < n; j0 += 64) {
    const index_t j1 = j0 + 64 < n ? j0 + 64 : n;
    double acc[64] = {0};
    for (index_t i = 0; i < m; ++i)
      for (index_t j = j0; j < j1; ++j) acc[j - j0] += static_cast<double>(x[i * n + j]);
    for (index_t j = j0; j < j1; ++j) out[j] = static_cast<T>(acc[j - j0]);
  }
}

template void activation_forward<float>(const float*, float*, index_t, Activation);
template void activation_forward<double>(const double*, double*, index_t, Activation);
template void activation_backward<float>(const float*, const float*, const float*, float*, index_t, Activation);
template void activation_backward<double>(const double*, const double*, const double*, double*, index_t,
                                          Activation);
template void column_sums<float>(const float*, index_t, index_t, float*);
template void column_sums<double>(const double*, index_t, index_t, double*);

}  // namespace dnnkit
