// The vector post-GEMM kernels of gates.h, written once over a traits type V that each ISA's translation
// unit defines (and includes this file under its target pragma):
//   reg, mask, width; tail(n): the first n lanes; load/store (Full) or loadm/storem (under a mask);
//   set1, add, sub, mul, fma(a, b, c) = a*b + c, fnma(a, b, c) = c - a*b; max_nan(lo, x) and
//   min_nan(hi, x), which return x when x is NaN; abs, copysign(mag, sgn); lt(a, b) and ge(a, b) as
//   masks (false for NaN); blend(m, f, t) = m ? t : f; exp2i(p, n) = p * 2^n for integral n (float);
//   round(x) to the nearest integer; recip(d) = 1/d to within an ulp; kExpLo and kExpHi, the range
//   of x over which exp2i(p, n) is exact.
#pragma once
#include "../common.h"

namespace dnnkit {
namespace gates_simd {

// exp(x): x = n ln2 + r, |r| <= ln2/2, exp(r) by the degree-6 polynomial of fastmath::exp.
template <class V>
inline typename V::reg vexp(typename V::reg x) {
  using R = typename V::reg;
  // The ISA's input range: what lies outside gives exp at its ends (0 or a denormal, inf or exp(88)).
  x = V::min_nan(V::set1(V::kExpHi), V::max_nan(V::set1(V::kExpLo), x));
  const R n = V::round(V::mul(x, V::set1(1.44269504088896341f)));
  R r = V::fnma(n, V::set1(0.693145751953125f), x);
  r = V::fnma(n, V::set1(1.428606765330187e-6f), r);
  R p = V::fma(r, V::set1(1.384365344e-03f), V::set1(8.374155332e-03f));
  p = V::fma(p, r, V::set1(4.166800204e-02f));
  p = V::fma(p, r, V::set1(1.666643126e-01f));
  p = V::fma(p, r, V::set1(4.999999421e-01f));
  p = V::fma(p, r, V::set1(1.000000032e+00f));
  p = V::fma(p, r, V::set1(1.0f));
  return V::exp2i(p, n);
}

// sigmoid(x) = 1/(1 + e) for x >= 0 and e/(1 + e) below, e = exp(-|x|) <= 1: nothing overflows.
template <class V>
inline typename V::reg vsigmoid(typename V::reg x) {
  using R = typename V::reg;
  const R e = vexp<V>(V::sub(V::set1(0.0f), V::abs(x)));
  const R q = V::recip(V::add(V::set1(1.0f), e));
  return V::blend(V::ge(x, V::set1(0.0f)), V::mul(e, q), q);
}

// tanh: the odd polynomial of fastmath::tanh below |x| = 0.625, (1 - e)/(1 + e) with e = exp(-2|x|) above.
template <class V>
inline typename V::reg vtanh(typename V::reg x) {
  using R = typename V::reg;
  const R ax = V::abs(x);
  const R z = V::mul(ax, ax);
  R p = V::fma(z, V::set1(-5.704987415e-03f), V::set1(2.063908765e-02f));
  p = V::fma(p, z, V::set1(-5.373971522e-02f));
  p = V::fma(p, z, V::set1(1.333144220e-01f));
  p = V::fma(p, z, V::set1(-3.333328194e-01f));
  const R small = V::fma(V::mul(ax, z), p, ax);
  const R e = vexp<V>(V::mul(ax, V::set1(-2.0f)));
  const R large = V::mul(V::sub(V::set1(1.0f), e), V::recip(V::add(V::set1(1.0f), e)));
  return V::copysign(V::blend(V::lt(ax, V::set1(0.625f)), large, small), x);
}

// Runs body(j, mask, full) over [j0, j1) a vector at a time, the last partial vector under a mask.
template <class V, class F>
inline void for_vectors(index_t j0, index_t j1, F&& body) {
  index_t j = j0;
  for (; j + V::width <= j1; j += V::width) body(j, V::tail(V::width), std::true_type{});
  if (j < j1) body(j, V::tail(j1 - j), std::false_type{});
}

template <class V, class Full>
inline typename V::reg ld(const float* p, typename V::mask m, Full) {
  if constexpr (Full::value) return V::load(p);
  else return V::loadm(p, m);
}

template <class V, class Full>
inline void st(float* p, typename V::mask m, typename V::reg v, Full) {
  if constexpr (Full::value) V::store(p, v);
  else V::storem(p, m, v);
}

template <class V>
void lstm_fwd(index_t H, index_t j0, index_t j1, const float* xp, const float* gh, const float* cp, float* c,
              float* h, float* save) {
  for_vectors<V>(j0, j1, [&](index_t j, typename V::mask m, auto full) {
    const auto i = vsigmoid<V>(V::add(ld<V>(xp + j, m, full), ld<V>(gh + j, m, full)));
    const auto f = vsigmoid<V>(V::add(ld<V>(xp + H + j, m, full), ld<V>(gh + H + j, m, full)));
    const auto g = vtanh<V>(V::add(ld<V>(xp + 2 * H + j, m, full), ld<V>(gh + 2 * H + j, m, full)));
    const auto o = vsigmoid<V>(V::add(ld<V>(xp + 3 * H + j, m, full), ld<V>(gh + 3 * H + j, m, full)));
    const auto cn = V::fma(f, ld<V>(cp + j, m, full), V::mul(i, g));  // cp may alias c: read first
    st<V>(c + j, m, cn, full);
    st<V>(h + j, m, V::mul(o, vtanh<V>(cn)), full);
    if (save) {
      st<V>(save + j, m, i, full);
      st<V>(save + H + j, m, f, full);
      st<V>(save + 2 * H + j, m, g, full);
      st<V>(save + 3 * H + j, m, o, full);
    }
  });
}

template <class V>
void gru_fwd(index_t H, index_t j0, index_t j1, const float* xp, const float* gh, const float* bhn, const float* hp,
             float* h, float* save, float* aux) {
  for_vectors<V>(j0, j1, [&](index_t j, typename V::mask m, auto full) {
    const auto r = vsigmoid<V>(V::add(ld<V>(xp + j, m, full), ld<V>(gh + j, m, full)));
    const auto z = vsigmoid<V>(V::add(ld<V>(xp + H + j, m, full), ld<V>(gh + H + j, m, full)));
    const auto hn = V::add(ld<V>(gh + 2 * H + j, m, full), ld<V>(bhn + j, m, full));
    const auto n = vtanh<V>(V::fma(r, hn, ld<V>(xp + 2 * H + j, m, full)));
    st<V>(h + j, m, V::fma(z, V::sub(ld<V>(hp + j, m, full), n), n), full);
    if (save) {
      st<V>(save + j, m, r, full);
      st<V>(save + H + j, m, z, full);
      st<V>(save + 2 * H + j, m, n, full);
      st<V>(aux + j, m, hn, full);
    }
  });
}

template <class V>
void rnn_fwd(bool relu, index_t j0, index_t j1, const float* xp, const float* gh, float* h) {
  for_vectors<V>(j0, j1, [&](index_t j, typename V::mask m, auto full) {
    const auto a = V::add(ld<V>(xp + j, m, full), ld<V>(gh + j, m, full));
    // relu as torch.relu: x < 0 ? 0 : x, so that NaN passes.
    st<V>(h + j, m, relu ? V::blend(V::lt(a, V::set1(0.0f)), a, V::set1(0.0f)) : vtanh<V>(a), full);
  });
}

template <class V>
void lstm_bwd(index_t H, index_t j0, index_t j1, const float* dy, const float* dhr, const float* gates, const float* c,
              const float* cp, float* dc, float* dg) {
  const auto one = V::set1(1.0f);
  for_vectors<V>(j0, j1, [&](index_t j, typename V::mask m, auto full) {
    const auto i = ld<V>(gates + j, m, full), f = ld<V>(gates + H + j, m, full);
    const auto g = ld<V>(gates + 2 * H + j, m, full), o = ld<V>(gates + 3 * H + j, m, full);
    const auto dh = V::add(ld<V>(dy + j, m, full), ld<V>(dhr + j, m, full));
    const auto tc = vtanh<V>(ld<V>(c + j, m, full));
    const auto dct = V::fma(V::mul(dh, o), V::fnma(tc, tc, one), ld<V>(dc + j, m, full));
    st<V>(dc + j, m, V::mul(dct, f), full);
    st<V>(dg + j, m, V::mul(V::mul(dct, g), V::mul(i, V::sub(one, i))), full);
    st<V>(dg + H + j, m, V::mul(V::mul(dct, ld<V>(cp + j, m, full)), V::mul(f, V::sub(one, f))), full);
    st<V>(dg + 2 * H + j, m, V::mul(V::mul(dct, i), V::fnma(g, g, one)), full);
    st<V>(dg + 3 * H + j, m, V::mul(V::mul(dh, tc), V::mul(o, V::sub(one, o))), full);
  });
}

template <class V>
void math(int fn, const float* x, float* y, index_t n) {
  for_vectors<V>(0, n, [&](index_t j, typename V::mask m, auto full) {
    const auto v = ld<V>(x + j, m, full);
    st<V>(y + j, m, fn == 0 ? vexp<V>(v) : fn == 1 ? vsigmoid<V>(v) : vtanh<V>(v), full);
  });
}

}  // namespace gates_simd
}  // namespace dnnkit
