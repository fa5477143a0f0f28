// The pybind11 module each instruction-set level builds (dnnkit._cpu_ref, _cpu_avx2, _cpu_avx512), named
// by DNNKIT_MODULE. Thin: checks what a kernel relies on, releases the GIL, calls the kernel. The Python
// layer does the user-facing validation with operator-named errors; the checks here keep direct callers
// from crashing the process.
#include "common.h"

PYBIND11_MODULE(DNNKIT_MODULE, m) {
  m.doc() = "dnnkit CPU kernels (C++, OpenMP)";
  dnnkit::bindings::bind_gemm(m);
  dnnkit::bindings::bind_conv(m);
  dnnkit::bindings::bind_rnn(m);
  dnnkit::bindings::bind_runtime(m);
  dnnkit::bindings::bind_testing(m);
}
