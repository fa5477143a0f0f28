// Hooks for the tests: the fast math functions on arrays, and the step work sharing run on its own.
#include "steps.h"

namespace dnnkit {
using namespace rnn_detail;

template <typename T>
void rnn_math_test(int fn, const T* x, T* y, index_t n) {
  if (const VectorMathFn<T> vk = vector_math<T>(); vk && (fn <= 2 || std::is_same_v<T, float>))
    return vk(fn, x, n, y, n, 1, n);  // float64 gelu: the C library's erfc below
  if (fn == 0) {
#pragma omp simd
    for (index_t i = 0; i < n; ++i) y[i] = fastmath::exp(x[i]);
  } else if (fn == 1) {
#pragma omp simd
    for (index_t i = 0; i < n; ++i) y[i] = fastmath::sigmoid(x[i]);
  } else if (fn == 2) {
#pragma omp simd
    for (index_t i = 0; i < n; ++i) y[i] = fastmath::tanh(x[i]);
  } else if (fn == 3) {
    for (index_t i = 0; i < n; ++i) y[i] = activate(Activation::gelu, x[i]);
  } else {
    for (index_t i = 0; i < n; ++i) y[i] = activate_grad(Activation::gelu, x[i], T(0));
  }
}

void rnn_panel_share_test(int nt, index_t panels, index_t steps, int max_spin, index_t* errors, index_t* stolen) {
  nt = std::max(1, nt);
  PanelShare share(nt, panels);
  SpinBarrier barrier(nt);
  std::unique_ptr<std::atomic<index_t>[]> runs(new std::atomic<index_t>[static_cast<std::size_t>(std::max<index_t>(panels, 1))]);
  for (index_t p = 0; p < panels; ++p) runs[p].store(0);
  std::atomic<index_t> bad{0}, taken{0};
#pragma omp parallel num_threads(nt)
  {
    const int tid = thread_id();
    std::uint64_t rng = 0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(tid + 1);
    for (index_t st = 0; st < steps; ++st) {
      const int set = static_cast<int>(st & 1);  // odd steps run the ranges backwards, as rnn_forward's do
      for (index_t jp = share.next(set, tid, set == 1); jp >= 0; jp = share.next(set, tid, set == 1)) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        // The last thread runs 4x slower, as on a core shared with a busy neighbour.
        const int spins = max_spin > 0 ? static_cast<int>((rng >> 33) % static_cast<std::uint64_t>(max_spin)) *
                                             (tid == nt - 1 && nt > 1 ? 4 : 1)
                                       : 0;
        for (volatile int k = 0; k < spins; k = k + 1) {
        }
        runs[jp].fetch_add(1);
        if (jp < panels * tid / nt || jp >= panels * (tid + 1) / nt) taken.fetch_add(1);
      }
      share.reset(static_cast<int>((st + 1) & 1), tid);
      barrier.wait();
      if (tid == 0)
        for (index_t p = 0; p < panels; ++p)
          if (runs[p].exchange(0) != 1) bad.fetch_add(1);
      barrier.wait();
    }
  }
  *errors = bad.load();
  *stolen = taken.load();
}

template void rnn_math_test<float>(int, const float*, float*, index_t);
template void rnn_math_test<double>(int, const double*, double*, index_t);

}  // namespace dnnkit
