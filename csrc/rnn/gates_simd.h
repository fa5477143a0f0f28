// The vector post-GEMM kernels of gates.h, written once over a traits type V of csrc/simd (Avx2F32,
// Avx512F64, ...: csrc/simd/README.md lists what they provide) with the element-wise functions of
// csrc/simd/vmath.h; each ISA's translation unit instantiates them for float and for double.
#pragma once
#include "../common.h"
#include "../simd/vmath.h"

#include <type_traits>

namespace dnnkit {
namespace gates_simd {

using namespace vmath;

// The pre-activation of gate block `off` of xp, plus gh's when gh is not null (gh null: the hidden
// projection is already summed into xp).
template <class V, class Full>
inline typename V::reg preact(const typename V::T* xp, const typename V::T* gh, index_t off, typename V::mask m,
                              Full full) {
  const auto x = ld<V>(xp + off, m, full);
  return gh ? V::add(x, ld<V>(gh + off, m, full)) : x;
}

// Vectors at a time in the gate kernels (see vexp_n).
constexpr int kGateBlock = 2;

template <class V, class F = typename V::T>
void lstm_fwd(index_t H, index_t j0, index_t j1, const F* xp, const F* gh, const F* cp, F* c, F* h, F* save) {
  using R = typename V::reg;
  constexpr index_t W = V::width;
  for_vectors<V, kGateBlock>(j0, j1, [&](index_t j, auto n, typename V::mask m, auto full) {
    constexpr int U = decltype(n)::value;
    R s[3 * U], g[U], cn[U], tc[U];  // s: i, f, o
    for (int u = 0; u < U; ++u) {
      const index_t k = j + u * W;
      s[u] = preact<V>(xp, gh, k, m, full);
      s[U + u] = preact<V>(xp, gh, H + k, m, full);
      s[2 * U + u] = preact<V>(xp, gh, 3 * H + k, m, full);
      g[u] = preact<V>(xp, gh, 2 * H + k, m, full);
    }
    vsigmoid_tanh_n<V, 3 * U, U>(s, g);
    for (int u = 0; u < U; ++u) {
      const index_t k = j + u * W;
      cn[u] = V::fma(s[U + u], ld<V>(cp + k, m, full), V::mul(s[u], g[u]));  // cp may alias c: read first
      st<V>(c + k, m, cn[u], full);
      tc[u] = cn[u];
    }
    vtanh_n<V, U>(tc);
    for (int u = 0; u < U; ++u) {
      const index_t k = j + u * W;
      st<V>(h + k, m, V::mul(s[2 * U + u], tc[u]), full);
      if (save) {
        st<V>(save + k, m, s[u], full);
        st<V>(save + H + k, m, s[U + u], full);
        st<V>(save + 2 * H + k, m, g[u], full);
        st<V>(save + 3 * H + k, m, s[2 * U + u], full);
      }
    }
  });
}

// ghrz: the hidden projections of r and z (null: summed into xp); ghn: W_hn h (no bias).
template <class V, class F = typename V::T>
void gru_fwd(index_t H, index_t j0, index_t j1, const F* xp, const F* ghrz, const F* ghn, const F* bhn, const F* hp,
             F* h, F* save, F* aux) {
  using R = typename V::reg;
  constexpr index_t W = V::width;
  for_vectors<V, kGateBlock>(j0, j1, [&](index_t j, auto nv, typename V::mask m, auto full) {
    constexpr int U = decltype(nv)::value;
    R rz[2 * U], hn[U], n[U];
    for (int u = 0; u < U; ++u) {
      const index_t k = j + u * W;
      rz[u] = preact<V>(xp, ghrz, k, m, full);
      rz[U + u] = preact<V>(xp, ghrz, H + k, m, full);
    }
    vsigmoid_n<V, 2 * U>(rz);
    for (int u = 0; u < U; ++u) {
      const index_t k = j + u * W;
      hn[u] = V::add(ld<V>(ghn + k, m, full), ld<V>(bhn + k, m, full));
      n[u] = V::fma(rz[u], hn[u], ld<V>(xp + 2 * H + k, m, full));
    }
    vtanh_n<V, U>(n);
    for (int u = 0; u < U; ++u) {
      const index_t k = j + u * W;
      st<V>(h + k, m, V::fma(rz[U + u], V::sub(ld<V>(hp + k, m, full), n[u]), n[u]), full);
      if (save) {
        st<V>(save + k, m, rz[u], full);
        st<V>(save + H + k, m, rz[U + u], full);
        st<V>(save + 2 * H + k, m, n[u], full);
        st<V>(aux + k, m, hn[u], full);
      }
    }
  });
}

template <class V, class F = typename V::T>
void rnn_fwd(bool relu, index_t j0, index_t j1, const F* xp, const F* gh, F* h) {
  using R = typename V::reg;
  constexpr index_t W = V::width;
  for_vectors<V, kGateBlock>(j0, j1, [&](index_t j, auto nv, typename V::mask m, auto full) {
    constexpr int U = decltype(nv)::value;
    R a[U];
    for (int u = 0; u < U; ++u) a[u] = preact<V>(xp, gh, j + u * W, m, full);
    if (relu) {
      // relu as torch.relu: x < 0 ? 0 : x, so that NaN passes.
      for (int u = 0; u < U; ++u) a[u] = V::blend(V::lt(a[u], V::set1(0.0f)), a[u], V::set1(0.0f));
    } else {
      vtanh_n<V, U>(a);
    }
    for (int u = 0; u < U; ++u) st<V>(h + j + u * W, m, a[u], full);
  });
}

template <class V, class F = typename V::T>
void lstm_bwd(index_t H, index_t j0, index_t j1, const F* dy, const F* dhr, const F* gates, const F* c, const F* cp,
              F* dc, F* dg) {
  const auto one = V::set1(1.0f);
  for_vectors<V, 1>(j0, j1, [&](index_t j, auto, typename V::mask m, auto full) {
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

}  // namespace gates_simd
}  // namespace dnnkit
