// FFT convolution's filter transform and channel reduction (fft.cpp); the input and output transforms
// are scipy.fft's. Frequencies f = u*V + v of an hf x wf real transform, V = wf/2 + 1.
#pragma once
#include "../common.h"

namespace dnnkit {

// The filters' DFT on the hf x wf grid, written as the reduction's B operands: for each frequency f a
// (2*Cg) x K real block, rows c < Cg the real and rows Cg + c the imaginary parts of
//   W[f, c, k] = sum_{r,s} w[k, c, r, s] exp(-2 pi i (u r dh / hf + v s dw / wf)),
// with w (K, Cg, R, S) C-contiguous and dh, dw the dilations (taps at r*dh, s*dw). A separable DFT of the
// R x S taps (not a transform of zero-padded planes): first along s, then along r, vectorized over k.
template <typename T>
void fft_filter_transform(index_t K, index_t Cg, index_t R, index_t S, index_t dh, index_t dw, index_t hf,
                          index_t wf, const T* w, T* out);

// Y[n, k, f] = sum_{c < Cg} X[n, (k / Kg) Cg + c, f] * conj(W[f, c, k]) for nb images, C input and K output
// channels in g groups (Cg = C/g, Kg = K/g): X (nb, C, F) and Y (nb, K, F) complex interleaved (re, im),
// W as fft_filter_transform writes it. conj(W) makes it a cross-correlation, as conv2d is. Per frequency
// and group, one real GEMM on dnnkit's GEMM:
//   [Yr; Yi] (2nb x Kg) = [[Xr, Xi], [Xi, -Xr]] (2nb x 2Cg) [Wr; Wi] (2Cg x Kg),
// so each W block is read once for all nb images. Threads split the frequencies.
template <typename T>
void fft_channel_reduce(index_t nb, index_t c, index_t k, index_t g, index_t f, const T* x, const T* w, T* y);

}  // namespace dnnkit
