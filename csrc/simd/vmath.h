// Element-wise functions of vectors, written once over a traits type V of csrc/simd (README.md): exp,
// sigmoid, tanh, gelu and gelu's derivative, for float (fastmath's: exp by range reduction and a degree-6
// polynomial, sigmoid from exp(-|x|) so that no intermediate overflows, tanh as an odd polynomial below
// |x| = 0.625 and (1 - e)/(1 + e), e = exp(-2|x|), above) and for double (exp and expm1 by range reduction
// and their Taylor polynomials of degree 13, to within a few units in the last place); NaN propagates
// through every one. math() applies one to rows of values (the RNN gate passes, the GEMM's epilogue and
// the activations use them: rnn/gates_simd.h, math.h). Included by the per-ISA translation units only.
#pragma once
#include "../common.h"

#include <type_traits>

// The element-wise functions are inlined into every kernel whatever the compiler's size heuristics say:
// called out of line, their vectors pass through memory.
#define DNNKIT_VINLINE inline __attribute__((always_inline))

namespace dnnkit {
namespace vmath {

// The functions below work on N vectors at once, each step applied to all N before the next: their
// dependency chains (about 90 cycles through exp) then run side by side, where one vector at a time
// leaves the cores waiting on latency with the scheduler full.

// exp(x): x = n ln2 + r, |r| <= ln2/2, exp(r) by the degree-6 polynomial of fastmath::exp. kNonPositive:
// every x is <= 0 or NaN (sigmoid's and tanh's arguments), so the upper clamp is not needed.
template <class V, int N, bool kNonPositive = false>
DNNKIT_VINLINE void vexp_f_n(typename V::reg (&x)[N]) {
  using R = typename V::reg;
  R n[N], r[N], p[N];
  // The ISA's input range: what lies outside gives exp at its ends (0 or a denormal, inf or exp(88)).
  for (int u = 0; u < N; ++u) {
    x[u] = V::max_nan(V::set1(V::kExpLo), x[u]);
    if constexpr (!kNonPositive) x[u] = V::min_nan(V::set1(V::kExpHi), x[u]);
  }
  for (int u = 0; u < N; ++u) n[u] = V::round(V::mul(x[u], V::set1(1.44269504088896341f)));
  for (int u = 0; u < N; ++u) r[u] = V::fnma(n[u], V::set1(0.693145751953125f), x[u]);
  for (int u = 0; u < N; ++u) r[u] = V::fnma(n[u], V::set1(1.428606765330187e-6f), r[u]);
  for (int u = 0; u < N; ++u) p[u] = V::fma(r[u], V::set1(1.384365344e-03f), V::set1(8.374155332e-03f));
  for (int u = 0; u < N; ++u) p[u] = V::fma(p[u], r[u], V::set1(4.166800204e-02f));
  for (int u = 0; u < N; ++u) p[u] = V::fma(p[u], r[u], V::set1(1.666643126e-01f));
  for (int u = 0; u < N; ++u) p[u] = V::fma(p[u], r[u], V::set1(4.999999421e-01f));
  for (int u = 0; u < N; ++u) p[u] = V::fma(p[u], r[u], V::set1(1.000000032e+00f));
  for (int u = 0; u < N; ++u) p[u] = V::fma(p[u], r[u], V::set1(1.0f));
  for (int u = 0; u < N; ++u) x[u] = V::exp2i(p[u], n[u]);
}

// tanh: the odd polynomial of fastmath::tanh below |x| = 0.625, (1 - e)/(1 + e) with e = exp(-2 min(|x|, 10))
// above (past |x| = 44 exp(-2|x|) is denormal, and denormal operands cost microcode assists). In two
// halves around the exp pass, so that other functions' exps can share it (vsigmoid_tanh_n): before it,
// |x|, the polynomial's value and exp's argument; after it, the result from e = exp(that argument).
template <class V>
DNNKIT_VINLINE void vtanh_f_before(typename V::reg x, typename V::reg& ax, typename V::reg& small, typename V::reg& e) {
  using R = typename V::reg;
  ax = V::abs(x);
  const R z = V::mul(ax, ax);
  R p = V::fma(z, V::set1(-5.704987415e-03f), V::set1(2.063908765e-02f));
  p = V::fma(p, z, V::set1(-5.373971522e-02f));
  p = V::fma(p, z, V::set1(1.333144220e-01f));
  p = V::fma(p, z, V::set1(-3.333328194e-01f));
  small = V::fma(V::mul(ax, z), p, ax);
  e = V::mul(V::min_nan(V::set1(10.0f), ax), V::set1(-2.0f));  // |x| >= 10: e = 2e-9 gives 1 as
}                                                               // exp(-2|x|) would, never denormal
template <class V>
DNNKIT_VINLINE typename V::reg vtanh_f_after(typename V::reg x, typename V::reg ax, typename V::reg small,
                                             typename V::reg e) {
  const typename V::reg large = V::mul(V::sub(V::set1(1.0f), e), V::recip(V::add(V::set1(1.0f), e)));
  return V::copysign(V::blend(V::lt(ax, V::set1(0.625f)), large, small), x);
}
template <class V, int N>
DNNKIT_VINLINE void vtanh_f_n(typename V::reg (&x)[N]) {
  typename V::reg ax[N], small[N], e[N];
  for (int u = 0; u < N; ++u) vtanh_f_before<V>(x[u], ax[u], small[u], e[u]);
  vexp_f_n<V, N, true>(e);
  for (int u = 0; u < N; ++u) x[u] = vtanh_f_after<V>(x[u], ax[u], small[u], e[u]);
}


// x^2 / 2 as s + d: s rounded, d = x^2/2 - s exactly (by an FMA). In the tails exp(-x^2/2) magnifies
// the rounding of x^2 by up to x^2/2 times, so the gelu functions carry d separately.
template <class V>
inline void vhalf_square(typename V::reg x, typename V::reg& s, typename V::reg& d) {
  const typename V::reg xx = V::mul(x, x);
  s = V::mul(xx, V::set1(0.5f));
  d = V::mul(V::fma(x, x, V::sub(V::set1(0.0f), xx)), V::set1(0.5f));
}

// gelu(x) = x Phi(x), Phi(x) = erfc(-x / sqrt 2) / 2 (torch's exact form), and its derivative.
//
// vgelu_parts_n, for the derivative (vgelu_grad_n), which needs exp(-x^2 / 2) as well as Phi. With
// z = |x| / sqrt 2:
//   z <= 1: erf(z) = z A(z^2), A of degree 5 (relative error 1.2e-7 in float arithmetic);
//   z > 1:  erfc(z) = exp(-z^2) B(1/z) / z, B of degree 10 (relative error 8e-7), exp(-z^2) from the
//           exact square x^2 / 2 = s + d (FMA) as exp(-s)(1 - d); 0 past z = 9, where erfc(z) < 5e-37:
//           nothing on the way is denormal (denormal operands cost the cores microcode assists, which
//           made GEMM outputs of magnitude 13-14 several times slower than the rest).
// Phi is then (1 + sign(x) erf(z)) / 2 below z = 1, 1 - erfc(z)/2 for x > 0, erfc(z)/2 for x < 0: the
// negative tail keeps its relative accuracy. The polynomials are least-squares fits at Chebyshev nodes
// made for this file. gelu(-inf) is NaN and gelu(inf) inf, as x Phi(x) is; below x = -12.7, where
// |gelu(x)| < 3e-36, it is -0.
//
// Phi(x) and exp(-x^2 / 2) (0 past |x| = 9 sqrt 2) of N vectors.
template <class V, int N>
inline void vgelu_parts_n(const typename V::reg (&x)[N], typename V::reg (&phi)[N], typename V::reg (&e)[N]) {
  using R = typename V::reg;
  const R half = V::set1(0.5f);
  R z[N], s[N], a[N], xa[N], t[N], b[N], d[N];
  for (int u = 0; u < N; ++u) z[u] = V::mul(V::abs(x[u]), V::set1(0.70710678118654752f));
  // erf(z), z <= 1
  for (int u = 0; u < N; ++u) s[u] = V::mul(z[u], z[u]);
  for (int u = 0; u < N; ++u) a[u] = V::fma(s[u], V::set1(-5.654105916619301e-04f), V::set1(4.923277534544468e-03f));
  for (int u = 0; u < N; ++u) a[u] = V::fma(a[u], s[u], V::set1(-2.6716385036706924e-02f));
  for (int u = 0; u < N; ++u) a[u] = V::fma(a[u], s[u], V::set1(1.1280364543199539e-01f));
  for (int u = 0; u < N; ++u) a[u] = V::fma(a[u], s[u], V::set1(-3.7612348794937134e-01f));
  for (int u = 0; u < N; ++u) a[u] = V::fma(a[u], s[u], V::set1(1.1283791065216064f));
  for (int u = 0; u < N; ++u) a[u] = V::mul(z[u], a[u]);  // erf(z) below z = 1
  // erfc(z), z > 1 (|x| clamped to [sqrt 2, 9 sqrt 2] for B; the blends below pick what applies). z^2 is
  // taken as x^2 / 2 from x, not from the rounded z: in the tail exp(-z^2) magnifies z's rounding error.
  for (int u = 0; u < N; ++u) xa[u] = V::min_nan(V::set1(12.727922061357855f), V::abs(x[u]));
  for (int u = 0; u < N; ++u)
    t[u] = V::recip(V::mul(V::max_nan(V::set1(1.4142135623730950f), xa[u]), V::set1(0.70710678118654752f)));
  for (int u = 0; u < N; ++u) b[u] = V::fma(t[u], V::set1(-1.590101271867752e-01f), V::set1(8.423112034797668e-01f));
  for (int u = 0; u < N; ++u) b[u] = V::fma(b[u], t[u], V::set1(-1.8407167196273804f));
  for (int u = 0; u < N; ++u) b[u] = V::fma(b[u], t[u], V::set1(2.027833938598633f));
  for (int u = 0; u < N; ++u) b[u] = V::fma(b[u], t[u], V::set1(-9.335841536521912e-01f));
  for (int u = 0; u < N; ++u) b[u] = V::fma(b[u], t[u], V::set1(-2.949764132499695e-01f));
  for (int u = 0; u < N; ++u) b[u] = V::fma(b[u], t[u], V::set1(5.163862705230713e-01f));
  for (int u = 0; u < N; ++u) b[u] = V::fma(b[u], t[u], V::set1(-1.3675500638782978e-02f));
  for (int u = 0; u < N; ++u) b[u] = V::fma(b[u], t[u], V::set1(-2.8115004301071167e-01f));
  for (int u = 0; u < N; ++u) b[u] = V::fma(b[u], t[u], V::set1(-2.4499902792740613e-05f));
  for (int u = 0; u < N; ++u) b[u] = V::fma(b[u], t[u], V::set1(5.641896724700928e-01f));
  for (int u = 0; u < N; ++u) {
    R sq;
    vhalf_square<V>(xa[u], sq, d[u]);
    e[u] = V::sub(V::set1(0.0f), sq);
  }
  vexp_f_n<V, N, true>(e);
  for (int u = 0; u < N; ++u) {
    const auto tail = V::lt(V::set1(9.0f), z[u]);  // past z = 9: erfc and exp(-x^2/2) are 0
    e[u] = V::blend(tail, V::mul(e[u], V::sub(V::set1(1.0f), d[u])), V::set1(0.0f));
    const R erfc_large = V::mul(V::mul(e[u], b[u]), t[u]);
    const R phi_small = V::fma(V::copysign(a[u], x[u]), half, half);
    const R phi_large =
        V::blend(V::ge(x[u], V::set1(0.0f)), V::mul(erfc_large, half), V::fnma(erfc_large, half, V::set1(1.0f)));
    phi[u] = V::blend(V::lt(V::set1(1.0f), z[u]), phi_small, phi_large);
  }
}

// gelu of N vectors, in place (the GEMM's epilogue, activation_forward): x Phi(x) with one formula for
// erfc over 0 <= z = |x| / sqrt 2 <= 9,
//   erfc(z) = t exp(-z^2 + P(t)),  t = 1 / (1 + z/2),
// P of degree 9 (a least-squares fit at Chebyshev nodes of t made for this file; |error| of the
// exponent 4e-8), -z^2 + P summed with its rounding error recovered (the exact x^2 / 2 = s + d, then
// the error of P - s), so that the tail keeps its relative accuracy; Phi = erfc/2 for x < 0 and
// 1 - erfc/2 above; 0 past z = 9 as in vgelu_parts_n. Relative error under 4e-7 from -16 to 16. About 45
// operations a vector, where vgelu_parts_n's two polynomials and blends take about 65.
template <class V, int N>
inline void vgelu_n(typename V::reg (&x)[N]) {
  using R = typename V::reg;
  const R half = V::set1(0.5f);
  R z[N], t[N], p[N], s[N], d[N], r[N];
  for (int u = 0; u < N; ++u) {
    z[u] = V::mul(V::abs(x[u]), V::set1(0.70710678118654752f));
    t[u] = V::recip(V::fma(V::min_nan(V::set1(9.0f), z[u]), half, V::set1(1.0f)));
  }
  for (int u = 0; u < N; ++u) p[u] = V::fma(t[u], V::set1(0.13542471826076508f), V::set1(-0.6286317110061646f));
  for (int u = 0; u < N; ++u) p[u] = V::fma(p[u], t[u], V::set1(1.0327699184417725f));
  for (int u = 0; u < N; ++u) p[u] = V::fma(p[u], t[u], V::set1(-0.5295532941818237f));
  for (int u = 0; u < N; ++u) p[u] = V::fma(p[u], t[u], V::set1(-0.2197604477405548f));
  for (int u = 0; u < N; ++u) p[u] = V::fma(p[u], t[u], V::set1(0.0763455182313919f));
  for (int u = 0; u < N; ++u) p[u] = V::fma(p[u], t[u], V::set1(0.008687084540724754f));
  for (int u = 0; u < N; ++u) p[u] = V::fma(p[u], t[u], V::set1(0.3921549618244171f));
  for (int u = 0; u < N; ++u) p[u] = V::fma(p[u], t[u], V::set1(0.9979783296585083f));
  for (int u = 0; u < N; ++u) p[u] = V::fma(p[u], t[u], V::set1(-1.265415072441101f));
  for (int u = 0; u < N; ++u) {
    vhalf_square<V>(V::min_nan(V::set1(12.727922061357855f), V::abs(x[u])), s[u], d[u]);
    r[u] = V::sub(p[u], s[u]);
    d[u] = V::sub(V::sub(p[u], V::add(r[u], s[u])), d[u]);                 // (P - s - r) - d
  }
  vexp_f_n<V, N>(r);
  for (int u = 0; u < N; ++u) {
    const R q = V::mul(r[u], t[u]);
    R erfc = V::fma(q, d[u], q);
    erfc = V::blend(V::lt(V::set1(9.0f), z[u]), erfc, V::set1(0.0f));  // past z = 9: 0, no denormals
    const R phi = V::blend(V::ge(x[u], V::set1(0.0f)), V::mul(erfc, half), V::fnma(erfc, half, V::set1(1.0f)));
    x[u] = V::mul(x[u], phi);
  }
}

// gelu'(x) = Phi(x) + x phi(x), phi(x) = exp(-x^2 / 2) / sqrt(2 pi), of N vectors in place: the
// derivative linear's backward applies.
template <class V, int N>
inline void vgelu_grad_n(typename V::reg (&x)[N]) {
  typename V::reg phi[N], e[N];
  vgelu_parts_n<V, N>(x, phi, e);
  for (int u = 0; u < N; ++u) x[u] = V::fma(V::mul(x[u], V::set1(0.3989422804014327f)), e[u], phi[u]);
}

// Runs body(j, U, mask, full) over [j0, j1): blocks of U full vectors, then single vectors, the last
// partial one under a mask.
template <class V, int U, class F>
inline void for_vectors(index_t j0, index_t j1, F&& body) {
  index_t j = j0;
  for (; j + U * V::width <= j1; j += U * V::width) body(j, std::integral_constant<int, U>{}, V::tail(V::width), std::true_type{});
  for (; j + V::width <= j1; j += V::width) body(j, std::integral_constant<int, 1>{}, V::tail(V::width), std::true_type{});
  if (j < j1) body(j, std::integral_constant<int, 1>{}, V::tail(j1 - j), std::false_type{});
}

// ------------------------------------------------------------------------------------------- float64
// The reciprocal factorials 1/k!, correctly rounded (the compiler divides in double).
constexpr double inv_factorial(int k) {
  double f = 1.0;
  for (int i = 2; i <= k; ++i) f *= i;  // exact up to 22!
  return 1.0 / f;
}

// x = n ln2 + r, |r| <= ln2/2, of N vectors of doubles (n ln2 in two parts, the first exact for
// |n| < 2^21), and p = sum_{k = lo}^{13} r^(k - lo) / k!, the tail from term lo of exp(r)'s Taylor
// polynomial of degree 13 (truncation under 5e-18 relative), by Horner's rule.
template <class V, int N, int lo>
DNNKIT_VINLINE void vreduce_taylor_d_n(const typename V::reg (&x)[N], typename V::reg (&n)[N],
                                       typename V::reg (&r)[N], typename V::reg (&p)[N]) {
  for (int u = 0; u < N; ++u) n[u] = V::round(V::mul(x[u], V::set1(1.4426950408889634074)));
  for (int u = 0; u < N; ++u) r[u] = V::fnma(n[u], V::set1(6.93147180369123816490e-01), x[u]);
  for (int u = 0; u < N; ++u) r[u] = V::fnma(n[u], V::set1(1.90821492927058770002e-10), r[u]);
  for (int u = 0; u < N; ++u) p[u] = V::fma(r[u], V::set1(inv_factorial(13)), V::set1(inv_factorial(12)));
  for (int k = 11; k >= lo; --k)
    for (int u = 0; u < N; ++u) p[u] = V::fma(p[u], r[u], V::set1(inv_factorial(k)));
}

// exp(x) of N vectors of doubles: exp(r) (vreduce_taylor_d_n from term 0) times 2^n by V::exp2i, exact
// for every n the clamp to [kExpLo, kExpHi] leaves (0 below about -745, inf above 709.78). kNonPositive:
// every x is <= 0 or NaN.
template <class V, int N, bool kNonPositive = false>
DNNKIT_VINLINE void vexp_d_n(typename V::reg (&x)[N]) {
  using R = typename V::reg;
  R n[N], r[N], p[N];
  for (int u = 0; u < N; ++u) {
    x[u] = V::max_nan(V::set1(V::kExpLo), x[u]);
    if constexpr (!kNonPositive) x[u] = V::min_nan(V::set1(V::kExpHi), x[u]);
  }
  vreduce_taylor_d_n<V, N, 0>(x, n, r, p);
  for (int u = 0; u < N; ++u) x[u] = V::exp2i(p[u], n[u]);
}

// expm1(y) for y in [-40, 0] (or NaN) of N vectors: expm1(r) = r + r^2 P(r), P the Taylor tail from term
// 2 (vreduce_taylor_d_n; truncation under 2e-17 relative), then 2^n expm1(r) + (2^n - 1), both terms
// exact or nearly so for n in [-58, 0]: no cancellation.
template <class V, int N>
DNNKIT_VINLINE void vexpm1_d_n(typename V::reg (&y)[N]) {
  using R = typename V::reg;
  R n[N], r[N], p[N];
  vreduce_taylor_d_n<V, N, 2>(y, n, r, p);
  for (int u = 0; u < N; ++u) {
    const R em_r = V::fma(V::mul(r[u], r[u]), p[u], r[u]);  // expm1(r)
    const R s = V::exp2i(V::set1(1.0), n[u]);              // 2^n, exact
    y[u] = V::fma(s, em_r, V::sub(s, V::set1(1.0)));
  }
}

// tanh(x) = -m / (2 + m) with m = expm1(-2|x|), the sign of x restored: accurate at small |x| too, where
// (1 - e)/(1 + e) would cancel. Past |x| = 20 tanh rounds to 1, so |x| is held there.
template <class V, int N>
DNNKIT_VINLINE void vtanh_d_n(typename V::reg (&x)[N]) {
  using R = typename V::reg;
  R m[N];
  for (int u = 0; u < N; ++u) m[u] = V::mul(V::min_nan(V::set1(20.0), V::abs(x[u])), V::set1(-2.0));
  vexpm1_d_n<V, N>(m);
  for (int u = 0; u < N; ++u) {
    const R t = V::mul(V::sub(V::set1(0.0), m[u]), V::recip(V::add(V::set1(2.0), m[u])));
    x[u] = V::copysign(t, x[u]);
  }
}

// The element-wise functions of the gate kernels for either dtype (V::T).
template <class V, int N, bool kNonPositive = false>
DNNKIT_VINLINE void vexp_n(typename V::reg (&x)[N]) {
  if constexpr (std::is_same_v<typename V::T, double>) vexp_d_n<V, N, kNonPositive>(x);
  else vexp_f_n<V, N, kNonPositive>(x);
}
// sigmoid(x) = 1/(1 + e) for x >= 0 and e/(1 + e) below, e = exp(-|x|) <= 1: nothing overflows. Below
// kLo = ln of the smallest normal value (float -87.34, double -708.4), where sigmoid(x) is under it, the
// result is 0 (as with flush to zero) and e is held at that normal value: denormal operands and results
// cost microcode assists (12x the time on float inputs of standard deviation 60).
// In two halves around the exp pass, as tanh's: exp's argument, then the result from e.
template <class V>
constexpr typename V::T kSigmoidLo = std::is_same_v<typename V::T, double> ? -708.39641853226410622 : -87.33654f;
template <class V>
DNNKIT_VINLINE typename V::reg vsigmoid_before(typename V::reg x) {
  using T = typename V::T;
  return V::max_nan(V::set1(kSigmoidLo<V>), V::sub(V::set1(T(0)), V::abs(x)));
}
template <class V>
DNNKIT_VINLINE typename V::reg vsigmoid_after(typename V::reg x, typename V::reg e) {
  using T = typename V::T;
  const typename V::reg q = V::recip(V::add(V::set1(T(1)), e));
  const typename V::reg r = V::blend(V::ge(x, V::set1(T(0))), V::mul(e, q), q);
  return V::blend(V::lt(x, V::set1(kSigmoidLo<V>)), r, V::set1(T(0)));
}
template <class V, int N>
DNNKIT_VINLINE void vsigmoid_n(typename V::reg (&x)[N]) {
  typename V::reg e[N];
  for (int u = 0; u < N; ++u) e[u] = vsigmoid_before<V>(x[u]);
  vexp_n<V, N, true>(e);
  for (int u = 0; u < N; ++u) x[u] = vsigmoid_after<V>(x[u], e[u]);
}
template <class V, int N>
DNNKIT_VINLINE void vtanh_n(typename V::reg (&x)[N]) {
  if constexpr (std::is_same_v<typename V::T, double>) vtanh_d_n<V, N>(x);
  else vtanh_f_n<V, N>(x);
}
// vsigmoid_n of NS vectors s and vtanh_n of NT vectors t, the same values: for float, one exp pass over all
// NS + NT vectors, whose chains then run side by side (an LSTM step's tanh of g alone has only NT).
template <class V, int NS, int NT>
DNNKIT_VINLINE void vsigmoid_tanh_n(typename V::reg (&s)[NS], typename V::reg (&t)[NT]) {
  if constexpr (std::is_same_v<typename V::T, double>) {
    vsigmoid_n<V, NS>(s);
    vtanh_n<V, NT>(t);
  } else {
    typename V::reg e[NS + NT], ax[NT], small[NT];
    for (int u = 0; u < NS; ++u) e[u] = vsigmoid_before<V>(s[u]);
    for (int u = 0; u < NT; ++u) vtanh_f_before<V>(t[u], ax[u], small[u], e[NS + u]);
    vexp_f_n<V, NS + NT, true>(e);
    for (int u = 0; u < NS; ++u) s[u] = vsigmoid_after<V>(s[u], e[u]);
    for (int u = 0; u < NT; ++u) t[u] = vtanh_f_after<V>(t[u], ax[u], small[u], e[NS + u]);
  }
}
template <class V>
DNNKIT_VINLINE typename V::reg vtanh(typename V::reg x) {
  typename V::reg a[1] = {x};
  vtanh_n<V, 1>(a);
  return a[0];
}

template <class V, class Full>
inline typename V::reg ld(const typename V::T* p, typename V::mask m, Full) {
  if constexpr (Full::value) return V::loadu(p);
  else return V::loadm(p, m);
}

template <class V, class Full>
inline void st(typename V::T* p, typename V::mask m, typename V::reg v, Full) {
  if constexpr (Full::value) V::storeu(p, v);
  else V::storem(p, m, v);
}

// The number of vectors in an array of them (a block of math's), from its type.
template <class A>
constexpr int kVectors = static_cast<int>(std::extent_v<std::remove_reference_t<A>>);

// math over m rows of n values (rows ldx and ldy apart; m = 1 for a contiguous array). Vectors at a time
// (see vexp_n): two rows together, each in blocks of 2 vectors (a GEMM tile's rows of 32 values on
// AVX-512: 4 vectors, where one row at a time gave 2), then single vectors; the last row of an odd m alone,
// in blocks of 4, 2, then 1.
template <class V, class F = typename V::T>
void math(int fn, const F* x, index_t ldx, F* y, index_t ldy, index_t m, index_t n) {
  using R = typename V::reg;
  auto run = [&](auto f) {
    index_t i = 0;
    for (; i + 1 < m; i += 2) {
      const F* x0 = x + i * ldx;
      const F* x1 = x0 + ldx;
      F* y0 = y + i * ldy;
      F* y1 = y0 + ldy;
      for_vectors<V, 2>(0, n, [&](index_t j, auto nv, typename V::mask mk, auto full) {
        constexpr int U = decltype(nv)::value;
        R v[2 * U];
        for (int u = 0; u < U; ++u) {
          v[u] = ld<V>(x0 + j + u * V::width, mk, full);
          v[U + u] = ld<V>(x1 + j + u * V::width, mk, full);
        }
        f(v);
        for (int u = 0; u < U; ++u) {
          st<V>(y0 + j + u * V::width, mk, v[u], full);
          st<V>(y1 + j + u * V::width, mk, v[U + u], full);
        }
      });
    }
    if (i < m) {
      const F* x0 = x + i * ldx;
      F* y0 = y + i * ldy;
      auto body = [&](index_t j, auto nv, typename V::mask mk, auto full) {
        constexpr int U = decltype(nv)::value;
        R v[U];
        for (int u = 0; u < U; ++u) v[u] = ld<V>(x0 + j + u * V::width, mk, full);
        f(v);
        for (int u = 0; u < U; ++u) st<V>(y0 + j + u * V::width, mk, v[u], full);
      };
      const index_t n4 = n / (4 * V::width) * (4 * V::width);
      for_vectors<V, 4>(0, n4, body);
      for_vectors<V, 2>(n4, n, body);
    }
  };
  if constexpr (std::is_same_v<F, double>) {  // no float64 gelu here
    switch (fn) {
      case 0: return run([](auto& v) { vexp_n<V, kVectors<decltype(v)>>(v); });
      case 1: return run([](auto& v) { vsigmoid_n<V, kVectors<decltype(v)>>(v); });
      default: return run([](auto& v) { vtanh_n<V, kVectors<decltype(v)>>(v); });
    }
  }
  switch (fn) {
    case 0: return run([](auto& v) { vexp_n<V, kVectors<decltype(v)>>(v); });
    case 1: return run([](auto& v) { vsigmoid_n<V, kVectors<decltype(v)>>(v); });
    case 2: return run([](auto& v) { vtanh_n<V, kVectors<decltype(v)>>(v); });
    case 3: return run([](auto& v) { vgelu_n<V, kVectors<decltype(v)>>(v); });
    default: return run([](auto& v) { vgelu_grad_n<V, kVectors<decltype(v)>>(v); });
  }
}

}  // namespace vmath
}  // namespace dnnkit
