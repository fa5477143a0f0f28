// Packing routines for the GEMM driver. Source matrices are general strided views: element (r, c) of
// X lives at x[r*rs + c*cs], which covers row-major, transposed and non-contiguous NumPy views alike.
#pragma once
#include <cstring>

#include "../common.h"

namespace dnnkit {

// Packs the m x k block of A into ceil(m/mr) micro-panels, each mr x k stored k-major
// (ap[panel*mr*k + p*mr + i]); rows past m are zero.
template <typename T>
void pack_a_panel(index_t m, index_t k, const T* a, index_t rs, index_t cs, int mr, T* ap) {
  // One micro-panel: m <= mr rows.
  if (rs == 1 && m == mr) {
    for (index_t p = 0; p < k; ++p) std::memcpy(ap + p * mr, a + p * cs, sizeof(T) * mr);
    return;
  }
  if (cs == 1) {
    for (index_t i = 0; i < m; ++i) {
      const T* src = a + i * rs;
      for (index_t p = 0; p < k; ++p) ap[p * mr + i] = src[p];
    }
  } else {
    for (index_t p = 0; p < k; ++p)
      for (index_t i = 0; i < m; ++i) ap[p * mr + i] = a[i * rs + p * cs];
  }
  for (index_t i = m; i < mr; ++i)
    for (index_t p = 0; p < k; ++p) ap[p * mr + i] = T(0);
}

// Packs the k x n block of B into ceil(n/nr) micro-panels, each k x nr stored k-major
// (bp[panel*nr*k + p*nr + j]); columns past n are zero.
template <typename T>
void pack_b_panel(index_t k, index_t n, const T* b, index_t rs, index_t cs, int nr, T* bp) {
  if (cs == 1) {
    for (index_t p = 0; p < k; ++p) {
      std::memcpy(bp + p * nr, b + p * rs, sizeof(T) * n);
      for (index_t j = n; j < nr; ++j) bp[p * nr + j] = T(0);
    }
    return;
  }
  if (rs == 1) {
    // Transposed B (e.g. the weight of a linear layer): read each column contiguously, in blocks of
    // 8 columns so that the writes of one p land in one cache line.
    constexpr index_t kJB = 8;
    index_t j0 = 0;
    for (; j0 + kJB <= n; j0 += kJB) {
      const T* src[kJB];
      for (index_t jj = 0; jj < kJB; ++jj) src[jj] = b + (j0 + jj) * cs;
      for (index_t p = 0; p < k; ++p)
        for (index_t jj = 0; jj < kJB; ++jj) bp[p * nr + j0 + jj] = src[jj][p];
    }
    for (index_t j = j0; j < n; ++j)
      for (index_t p = 0; p < k; ++p) bp[p * nr + j] = b[p + j * cs];
  } else {
    for (index_t p = 0; p < k; ++p)
      for (index_t j = 0; j < n; ++j) bp[p * nr + j] = b[p * rs + j * cs];
  }
  for (index_t p = 0; p < k; ++p)
    for (index_t j = n; j < nr; ++j) bp[p * nr + j] = T(0);
}

}  // namespace dnnkit
