// Measured float32 FMA peak of this machine: the ceiling benchmarks and the cost model compare against.
#include <chrono>

#include "ukernel.h"

namespace dnnkit {

// GFLOP/s of `nthreads` threads each running the ISA's FMA probe for about `seconds`.
double measure_peak_gflops(Isa isa, int nthreads, double seconds) {
  auto probe = isa == Isa::avx512 ? fma_probe_avx512 : isa == Isa::avx2 ? fma_probe_avx2 : fma_probe_ref;
  double flops_one = 0;
  probe(1000, &flops_one);  // warm-up, and flops per 1000 iterations
  // Calibrate iterations to the time budget on one thread.
  index_t iters = 1 << 16;
  for (;;) {
    auto t0 = std::chrono::steady_clock::now();
    double f;
    probe(iters, &f);
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (dt > seconds / 4 || iters > (index_t(1) << 40)) {
      iters = static_cast<index_t>(iters * (seconds / dt));
      break;
    }
    iters *= 4;
  }
  if (iters < 1) iters = 1;
  double total = 0, sink = 0;
  auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(nthreads) reduction(+ : total, sink)
  {
    double f = 0;
    sink += probe(iters, &f);
    total += f;
  }
  double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return sink == 12345.678 ? 0.0 : total / dt / 1e9;
}

}  // namespace dnnkit
