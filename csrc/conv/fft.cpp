// The frequency-domain channel reduction of FFT convolution (the transforms themselves are scipy.fft's):
//   Y[n, g*Kg + k, f] = sum_{c < Cg} X[n, g*Cg + c, f] * conj(W[g*Kg + k, c, f])
// X is nb x C x F, W is K x Cg x F, Y is nb x K x F, complex and interleaved (re, im), F frequencies.
// conj(W) makes the product a cross-correlation, as conv2d is. Threads split (n, block of output
// channels); frequencies go in blocks that keep kKB accumulator rows in L1, inner loop vectorized.
#include <algorithm>
#include <vector>

#include "fft.h"

namespace dnnkit {
namespace {
constexpr index_t kFB = 256;  // complex frequencies per block
constexpr index_t kKB = 4;    // output channels sharing each loaded X block
}  // namespace

template <typename T>
void fft_channel_reduce(index_t nb, index_t c, index_t k, index_t g, index_t f, const T* x, const T* w, T* y) {
  const index_t Cg = c / g, Kg = k / g;
  const index_t kblocks = ceil_div(Kg, kKB);
  const index_t tasks = nb * g * kblocks;
#pragma omp parallel num_threads(get_num_threads()) if (tasks > 1)
  {
    std::vector<T> acc(static_cast<std::size_t>(2 * kKB * kFB));
#pragma omp for schedule(dynamic)
    for (index_t t = 0; t < tasks; ++t) {
      const index_t n = t / (g * kblocks), gg = (t / kblocks) % g, k0 = (t % kblocks) * kKB;
      const index_t kn = std::min(kKB, Kg - k0);
      for (index_t f0 = 0; f0 < f; f0 += kFB) {
        const index_t fb = std::min(kFB, f - f0);
        std::fill(acc.begin(), acc.end(), T(0));
        for (index_t cc = 0; cc < Cg; ++cc) {
          const T* xp = x + ((n * c + gg * Cg + cc) * f + f0) * 2;
          for (index_t kk = 0; kk < kn; ++kk) {
            const T* wp = w + (((gg * Kg + k0 + kk) * Cg + cc) * f + f0) * 2;
            T* a = acc.data() + kk * 2 * kFB;
#pragma omp simd
            for (index_t j = 0; j < fb; ++j) {
              const T xr = xp[2 * j], xi = xp[2 * j + 1], wr = wp[2 * j], wi = wp[2 * j + 1];
              a[2 * j] += xr * wr + xi * wi;      // Re(x * conj(w))
              a[2 * j + 1] += xi * wr - xr * wi;  // Im(x * conj(w))
            }
          }
        }
        for (index_t kk = 0; kk < kn; ++kk)
          std::copy(acc.data() + kk * 2 * kFB, acc.data() + kk * 2 * kFB + 2 * fb,
                    y + ((n * k + gg * Kg + k0 + kk) * f + f0) * 2);
      }
    }
  }
}

template void fft_channel_reduce<float>(index_t, index_t, index_t, index_t, index_t, const float*, const float*,
                                        float*);
template void fft_channel_reduce<double>(index_t, index_t, index_t, index_t, index_t, const double*, const double*,
                                         double*);

}  // namespace dnnkit
