// Measured float32 FMA peak of this machine: the ceiling benchmarks and the cost model compare against.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>

#include "../common.h"

#include "ukernel.h"

namespace dnnkit {

// GFLOP/s of `nthreads` threads each running the ISA's FMA probe for about `seconds`.
double measure_peak_gflops(Isa isa, int nthreads, double seconds) {
  double (*probe)(index_t, double*) = fma_probe_ref;
#if DNNKIT_HAVE_AVX512
  if (isa == Isa::avx512) probe = fma_probe_avx512;
#endif
#if DNNKIT_HAVE_AVX2
  if (isa == Isa::avx2) probe = fma_probe_avx2;
#endif
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

double measure_read_gbps(index_t bytes, int nthreads, double seconds, bool alternate) {
  const index_t lines = std::max<index_t>(ceil_div(bytes, index_t(64)), nthreads);  // 8 words a line
  AlignedBuffer<std::uint64_t> buf(static_cast<std::size_t>(lines * 8));
  std::uint64_t* const w = buf.data();
  double best = 0;
  std::uint64_t sink = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int pass = -1; pass < 1000; ++pass) {  // pass -1: each thread faults in and warms its share
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(nthreads) reduction(^ : sink)
    {
      const int t = thread_id(), nt = thread_count();
      const index_t l0 = lines * t / nt, l1 = lines * (t + 1) / nt;
      std::uint64_t acc[8] = {};
      if (pass < 0) {
        for (index_t i = l0 * 8; i < l1 * 8; ++i) w[i] = static_cast<std::uint64_t>(i);
      } else {
        // Eight independent sums: the loads, not a chain, bound the loop. Alternating, odd passes run
        // backwards and so start on what the last pass read last, still in this core's caches.
        const bool back = alternate && (pass & 1);
        for (index_t i = 0; i < l1 - l0; ++i) {
          const index_t l = back ? l1 - 1 - i : l0 + i;
          for (int j = 0; j < 8; ++j) acc[j] += w[l * 8 + j];
        }
      }
      for (int j = 0; j < 8; ++j) sink ^= acc[j];
    }
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (pass >= 0) best = std::max(best, double(lines) * 64 / dt / 1e9);
    if (pass >= 3 && std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > seconds) break;
  }
  return sink == 0x5eed ? best * (1 + 1e-12) : best;  // sink used: the reads are not dropped
}

}  // namespace dnnkit
