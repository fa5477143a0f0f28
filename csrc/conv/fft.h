// FFT convolution's channel reduction (fft.cpp): a complex product summed over input channels, per
// frequency. Arrays are interleaved complex (re, im) of T.
#pragma once
#include "../common.h"

namespace dnnkit {

// Y[n, gk, f] = sum_c X[n, gc, f] * conj(W[gk, c, f]) for nb images, c input and k output channels,
// g groups, f frequencies: X nb x c x f, W k x (c/g) x f, Y nb x k x f (all complex, interleaved).
template <typename T>
void fft_channel_reduce(index_t nb, index_t c, index_t k, index_t g, index_t f, const T* x, const T* w, T* y);

}  // namespace dnnkit
