// The convolution kernels, one entry each: the direction it computes, its name (the registry
// algorithm's `kernel`), the shapes it cannot run, the workspace it needs, and its run for each dtype.
// Each kernel file registers its own entries (a CONV_KERNEL at namespace scope); the binding finds a
// kernel by direction and name, checks the arrays and the workspace once for all of them, and runs it.
// A new convolution kernel is its file alone on this side.
#pragma once
#include <string>

#include "conv.h"

namespace dnnkit {

// One call's arrays as its direction reads them, checked for size, dtype and layout by the binding:
//   fwd:        a0 = x, a1 = w, bias (may be null), out = y
//   bwd_data:   a0 = w, a1 = dy, out = dx
//   bwd_filter: a0 = x, a1 = dy, out = dw
//   bwd_bias:   a0 = dy, out = db
// ws: workspace_elems(shape, chunk, itemsize) elements (null when that is 0); chunk: the kernel's own
// blocking parameter (output pixels, tiles or threads: see each kernel).
struct ConvCall {
  const void* a0 = nullptr;
  const void* a1 = nullptr;
  const void* bias = nullptr;
  void* out = nullptr;
  void* ws = nullptr;
  index_t ws_elems = 0;
  index_t chunk = 1;
};

struct ConvKernel {
  const char* direction;  // "fwd", "bwd_data", "bwd_filter" or "bwd_bias"
  const char* name;
  // Why the kernel cannot run this shape ("" where it can); null: every shape.
  std::string (*rejects)(const ConvShape&);
  // Workspace elements for (shape, chunk, itemsize); null: none.
  index_t (*workspace_elems)(const ConvShape&, index_t chunk, index_t itemsize);
  void (*run_f32)(const ConvShape&, const ConvCall&);
  void (*run_f64)(const ConvShape&, const ConvCall&);
};

// Adds k to the table (at load time, from the kernel's file); returns true.
bool register_conv_kernel(const ConvKernel& k);
// The kernel of that direction and name, or null.
const ConvKernel* find_conv_kernel(const std::string& direction, const std::string& name);

#define DNNKIT_CONV_CAT2(a, b) a##b
#define DNNKIT_CONV_CAT(a, b) DNNKIT_CONV_CAT2(a, b)
// Registers a ConvKernel from the file it is written in.
#define CONV_KERNEL(...) \
  static const bool DNNKIT_CONV_CAT(conv_kernel_registered_, __LINE__) = register_conv_kernel(ConvKernel{__VA_ARGS__})

// run_f32/run_f64 of a kernel written as fn<T>(shape, call).
#define CONV_RUNS(fn) &fn<float>, &fn<double>

}  // namespace dnnkit
