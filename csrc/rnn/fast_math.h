// Element-wise functions of the RNN post-GEMM kernels, written so that a loop calling them vectorizes
// (straight-line arithmetic, selects instead of branches, no libm calls).
//
// float: exp by range reduction x = n*ln2 + r (|r| <= ln2/2) and a degree-6 polynomial, scaled by 2^n
// built in the exponent bits; tanh as an odd polynomial below |x| = 0.625 and (1 - e)/(1 + e), e =
// exp(-2|x|), above (no cancellation there: e < 0.29). Relative error <= 2e-7 over the float range
// (tests/test_rnn.py measures it); the polynomial coefficients are minimax fits made for this file.
// double: the C library's exp and tanh (accuracy first; double is not the fast path).
// NaN propagates through every function.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

namespace dnnkit {
namespace fastmath {

inline float exp(float x) {
  constexpr float kMin = -87.33654f, kMax = 88.0f;  // ln of the smallest normal float: 2^n stays normal
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693145751953125f;   // ln 2 = kLn2Hi + kLn2Lo, kLn2Hi exact in 16 bits
  constexpr float kLn2Lo = 1.428606765330187e-6f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  constexpr float c1 = 1.000000032e+00f, c2 = 4.999999421e-01f, c3 = 1.666643126e-01f, c4 = 4.166800204e-02f,
                  c5 = 8.374155332e-03f, c6 = 1.384365344e-03f;
  x = x < kMin ? kMin : x;  // comparisons are false for NaN, which passes through
  x = x > kMax ? kMax : x;
  const float n = (x * kLog2e + kRound) - kRound;
  const float r = (x - n * kLn2Hi) - n * kLn2Lo;
  const float p = 1.0f + r * (c1 + r * (c2 + r * (c3 + r * (c4 + r * (c5 + r * c6)))));
  const std::int32_t bits = (static_cast<std::int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

inline float tanh(float x) {
  constexpr float kSmall = 0.625f;
  constexpr float t1 = -3.333328194e-01f, t2 = 1.333144220e-01f, t3 = -5.373971522e-02f, t4 = 2.063908765e-02f,
                  t5 = -5.704987415e-03f;
  const float ax = std::fabs(x);
  const float z = ax * ax;
  const float small = ax + ax * z * (t1 + z * (t2 + z * (t3 + z * (t4 + z * t5))));
  const float e = fastmath::exp(-2.0f * ax);
  const float large = (1.0f - e) / (1.0f + e);
  return std::copysign(ax < kSmall ? small : large, x);
}

// 0 below x = -87.34, where sigmoid(x) is under the smallest normal float (as the vector kernels give).
inline float sigmoid(float x) { return x < -87.33654f ? 0.0f : 1.0f / (1.0f + fastmath::exp(-x)); }

inline double exp(double x) { return std::exp(x); }
inline double tanh(double x) { return std::tanh(x); }
inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// relu as torch.relu: NaN passes through.
template <typename T>
inline T relu(T x) {
  return x < T(0) ? T(0) : x;
}

}  // namespace fastmath
}  // namespace dnnkit
