// Traits of a one-lane "vector" of T in plain C++ (csrc/simd/README.md): the reference micro-kernels
// of any CPU.
#pragma once

namespace dnnkit {
namespace simd {
// Each translation unit its own copy, as the ISAs' traits (avx2.h, avx512.h).
namespace {

template <typename TT>
struct Scalar {
  using T = TT;
  using reg = TT;
  static constexpr int width = 1;
  static inline reg zero() { return T(0); }
  static inline reg set1(T x) { return x; }
  static inline reg load(const T* p) { return *p; }
  static inline reg loadu(const T* p) { return *p; }
  static inline void store(T* p, reg v) { *p = v; }
  static inline void storeu(T* p, reg v) { *p = v; }
  static inline reg broadcast(const T* p) { return *p; }
  static inline reg fma(reg a, reg b, reg c) { return a * b + c; }
  static inline reg mul(reg a, reg b) { return a * b; }
  static inline reg add(reg a, reg b) { return a + b; }
};

}  // namespace
}  // namespace simd
}  // namespace dnnkit
