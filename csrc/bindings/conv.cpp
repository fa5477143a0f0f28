// The convolution kernels (conv/kernels.h), their sizing rules, and the FFT helpers.
#include <algorithm>

#include "common.h"

namespace dnnkit {
namespace bindings {

namespace {

// (n, c, h, w, k, r, s, p, q, sh, sw, ph, pw, dh, dw, g), dilation 1-based; checked for consistency.
ConvShape conv_shape(const py::tuple& t) {
  if (t.size() != 16) throw py::value_error("conv2d: shape tuple must have 16 entries");
  index_t v[16];
  for (int i = 0; i < 16; ++i) v[i] = t[i].cast<index_t>();
  ConvShape sh{v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10], v[11], v[12], v[13], v[14], v[15]};
  for (int i = 0; i < 16; ++i)
    if (v[i] < 0) throw py::value_error("conv2d: shape entries must be >= 0");
  if (sh.g < 1 || sh.c % sh.g || sh.k % sh.g) throw py::value_error("conv2d: groups must divide channels");
  if (sh.sh < 1 || sh.sw < 1 || sh.dh < 1 || sh.dw < 1) throw py::value_error("conv2d: stride/dilation must be >= 1");
  if (sh.r < 1 || sh.s < 1) throw py::value_error("conv2d: kernel must be at least 1x1");
  const index_t p = (sh.h + 2 * sh.ph - (sh.r - 1) * sh.dh - 1), q = (sh.w + 2 * sh.pw - (sh.s - 1) * sh.dw - 1);
  if (p < 0 || q < 0 || sh.p != p / sh.sh + 1 || sh.q != q / sh.sw + 1)
    throw py::value_error("conv2d: output size does not match input, kernel, stride, padding and dilation");
  // The bounds of problem.py (MAX_CONV_PADDED_INPUT, MAX_CONV_MACS), under which every product of sizes
  // the kernels form fits in 64 bits; counted in double, exact enough for a bound.
  const double padded = double(sh.n) * double(sh.c) * double(sh.h + 2 * sh.ph) * double(sh.w + 2 * sh.pw);
  const double macs = double(sh.n) * double(sh.k) * double(sh.cg()) * double(sh.r) * double(sh.s) * double(sh.p) *
                      double(sh.q);
  if (padded > 0x1p50 || macs > 0x1p62)
    throw py::value_error("conv2d: the padded input exceeds 2^50 elements or the product 2^62 multiply-adds");
  // An output extent of one reads one window whatever the stride: the stride is then the least that gives
  // that extent, so that no kernel's sizes scale with a stride beyond the padded input.
  if (sh.p == 1) sh.sh = std::min(sh.sh, p + 1);
  if (sh.q == 1) sh.sw = std::min(sh.sw, q + 1);
  return sh;
}

// A C-contiguous array of T holding exactly `elems` elements, or an error naming the argument.
template <typename T>
T* conv_arg(const py::object& o, index_t elems, const char* name, bool writable) {
  if (!py::isinstance<py::array_t<T>>(o)) throw py::type_error(std::string("conv2d: ") + name + " has the wrong dtype");
  py::array a = o.cast<py::array>();
  if (!(a.flags() & py::array::c_style)) throw py::value_error(std::string("conv2d: ") + name + " must be C-contiguous");
  if (a.size() != elems) throw py::value_error(std::string("conv2d: ") + name + " has the wrong number of elements");
  if (writable && !a.writeable()) throw py::value_error(std::string("conv2d: ") + name + " is read-only");
  return static_cast<T*>(const_cast<void*>(a.data()));
}

template <typename T>
T* conv_workspace_elems(const py::object& ws, index_t need) {
  if (need == 0) return nullptr;
  if (need < 0) throw py::value_error("conv2d: the workspace size overflows");
  if (ws.is_none()) throw py::value_error("conv2d: this algorithm needs a workspace");
  if (!py::isinstance<py::array_t<T>>(ws)) throw py::type_error("conv2d: workspace has the wrong dtype");
  py::array a = ws.cast<py::array>();
  if (!(a.flags() & py::array::c_style) || !a.writeable() || a.size() < need)
    throw py::value_error("conv2d: workspace is too small, read-only or not contiguous");
  return static_cast<T*>(a.mutable_data());
}


// The public operator a direction's errors name.
inline std::string conv_op(const std::string& dir) {
  if (dir == "bwd_data") return "conv2d_backward_data";
  if (dir == "bwd_filter") return "conv2d_backward_filter";
  if (dir == "bwd_bias") return "conv2d_backward_bias";
  return "conv2d";
}

// Runs the kernel `algo` of direction `dir` (conv/kernels.h) on arrays checked here for all of them.
template <typename T>
void conv_run(const std::string& dir, const std::string& algo, const ConvShape& sh, const py::object& a0,
              const py::object& a1, const py::object& bias, const py::object& out, const py::object& ws, index_t chunk) {
  const std::string op = conv_op(dir);
  const ConvKernel* kernel = find_conv_kernel(dir, algo);
  if (!kernel) throw py::value_error(op + ": unknown kernel " + algo + " for direction " + dir);
  if (chunk < 1) throw py::value_error("conv2d: chunk must be >= 1");
  if (kernel->rejects) {
    const std::string why = kernel->rejects(sh);
    if (!why.empty()) throw py::value_error(op + ": " + why);
  }
  const index_t nx = sh.n * sh.c * sh.h * sh.w, nw = sh.k * sh.cg() * sh.r * sh.s, ny = sh.n * sh.k * sh.p * sh.q;
  ConvCall call;
  call.chunk = chunk;
  if (dir == "fwd") {
    call.a0 = conv_arg<T>(a0, nx, "input", false);
    call.a1 = conv_arg<T>(a1, nw, "weight", false);
    call.bias = bias.is_none() ? nullptr : conv_arg<T>(bias, sh.k, "bias", false);
    call.out = conv_arg<T>(out, ny, "output", true);
  } else if (dir == "bwd_data") {
    call.a0 = conv_arg<T>(a0, nw, "weight", false);
    call.a1 = conv_arg<T>(a1, ny, "grad_output", false);
    call.out = conv_arg<T>(out, nx, "grad_input", true);
  } else if (dir == "bwd_filter") {
    call.a0 = conv_arg<T>(a0, nx, "input", false);
    call.a1 = conv_arg<T>(a1, ny, "grad_output", false);
    call.out = conv_arg<T>(out, nw, "grad_weight", true);
  } else {  // bwd_bias
    call.a0 = conv_arg<T>(a0, ny, "grad_output", false);
    call.out = conv_arg<T>(out, sh.k, "grad_bias", true);
  }
  call.ws_elems = kernel->workspace_elems ? kernel->workspace_elems(sh, chunk, sizeof(T)) : 0;
  if (call.ws_elems > 0) call.ws = conv_workspace_elems<T>(ws, call.ws_elems);
  const auto run = std::is_same_v<T, float> ? kernel->run_f32 : kernel->run_f64;
  try {
    py::gil_scoped_release nogil;
    run(sh, call);
  } catch (const std::bad_alloc&) {
    PyErr_SetString(PyExc_MemoryError, (op + ": " + algo + " could not allocate its buffers").c_str());
    throw py::error_already_set();
  }
}


}  // namespace

void bind_conv(py::module_& m) {
  m.def("conv2d",
        [](const std::string& dir, const std::string& algo, const py::tuple& shape, const py::object& a0,
           const py::object& a1, const py::object& bias, const py::object& out, const py::object& ws, index_t chunk) {
          const ConvShape sh = conv_shape(shape);
          if (py::isinstance<py::array_t<float>>(out)) return conv_run<float>(dir, algo, sh, a0, a1, bias, out, ws, chunk);
          if (py::isinstance<py::array_t<double>>(out)) return conv_run<double>(dir, algo, sh, a0, a1, bias, out, ws, chunk);
          throw py::type_error("conv2d: output must be float32 or float64");
        },
        py::arg("direction"), py::arg("kernel"), py::arg("shape"), py::arg("a0"), py::arg("a1"), py::arg("bias"),
        py::arg("out"), py::arg("workspace"), py::arg("chunk"),
        "Test and algorithm entry: direction fwd|bwd_data|bwd_filter|bwd_bias, kernel direct|im2col_gemm|implicit_gemm|gemm_col2im;\n"
        "fwd: (x, w) -> y; bwd_data: (w, dy) -> dx; bwd_filter: (x, dy) -> dw; bwd_bias: (dy, None) -> db.");

  m.def("im2col_chunk", [](const py::tuple& shape, index_t max_elems, const std::string& batching) {
    Batching b = Batching::none;
    if (batching == "columns") b = Batching::columns;
    else if (batching == "depth") b = Batching::depth;
    else if (batching != "none") throw py::value_error("im2col_chunk: batching must be none, columns or depth");
    return im2col_chunk(conv_shape(shape), std::max<index_t>(max_elems, 1), b);
  }, py::arg("shape"), py::arg("max_elems"), py::arg("batching") = "none",
     "Output pixels per im2col chunk for a workspace of at most max_elems elements; small planes go several\n"
     "images side by side along the GEMM's columns (forward, backward data) or its depth (backward filter).");

  m.def("conv_workspace_elems",
        [](const std::string& dir, const std::string& algo, const py::tuple& shape, index_t chunk, index_t itemsize) {
          const ConvKernel* kernel = find_conv_kernel(dir, algo);
          if (!kernel) throw py::value_error("conv_workspace_elems: unknown kernel " + algo + " for direction " + dir);
          if (itemsize != 4 && itemsize != 8) throw py::value_error("conv_workspace_elems: itemsize must be 4 or 8");
          return kernel->workspace_elems ? kernel->workspace_elems(conv_shape(shape), chunk, itemsize) : index_t(0);
        },
        py::arg("direction"), py::arg("kernel"), py::arg("shape"), py::arg("chunk"), py::arg("itemsize"),
        "Workspace elements the convolution kernel of that direction and name needs for a shape and chunk.");

  m.def("col_elems", [](const py::tuple& shape, index_t chunk) { return col_elems(conv_shape(shape), chunk); });

  m.def("im2col_bwd_filter_elems", [](const py::tuple& shape, index_t chunk) {
    return im2col_bwd_filter_elems(conv_shape(shape), chunk);
  }, "Workspace elements of im2col_gemm's backward filter: per thread (images split among them) a column "
     "buffer of chunk columns and a partial dW.");

  m.def("fft_filter_transform", [](const py::array& w, py::array& out, index_t hf, index_t wf, index_t dh,
                                   index_t dw) {
    // w: K x Cg x R x S real; out: F x 2Cg x K real, F = hf * (wf/2 + 1); one real dtype, C-contiguous.
    if (w.ndim() != 4 || out.ndim() != 3) throw py::value_error("fft_filter_transform: w must be 4-D and out 3-D");
    const index_t K = w.shape(0), Cg = w.shape(1), R = w.shape(2), S = w.shape(3);
    if (hf < 1 || wf < 1 || dh < 1 || dw < 1 || (R - 1) * dh >= hf || (S - 1) * dw >= wf)
      throw py::value_error("fft_filter_transform: the dilated filter must fit the hf x wf grid");
    if (out.shape(0) != hf * (wf / 2 + 1) || out.shape(1) != 2 * Cg || out.shape(2) != K)
      throw py::value_error("fft_filter_transform: out must have shape (hf*(wf//2+1), 2*Cg, K)");
    auto run = [&](auto tag) {
      using T = decltype(tag);
      for (const py::array* a : std::initializer_list<const py::array*>{&w, &out})
        if (!py::isinstance<py::array_t<T>>(*a) || !(a->flags() & py::array::c_style))
          throw py::type_error("fft_filter_transform: arrays must be C-contiguous and of one real dtype");
      if (!out.writeable()) throw py::value_error("fft_filter_transform: out is read-only");
      const T* wp = static_cast<const T*>(w.data());
      T* op = static_cast<T*>(out.mutable_data());
      py::gil_scoped_release nogil;
      fft_filter_transform<T>(K, Cg, R, S, dh, dw, hf, wf, wp, op);
    };
    if (is_f32(out)) run(float{});
    else if (is_f64(out)) run(double{});
    else throw py::type_error("fft_filter_transform: out must be float32 or float64");
  });

  m.def("fft_channel_reduce", [](const py::array& x, const py::array& w, py::array& y, index_t groups) {
    // x: nb x C x F complex, w: F x 2(C/g) x K real (fft_filter_transform's), y: nb x K x F complex.
    if (x.ndim() != 3 || w.ndim() != 3 || y.ndim() != 3)
      throw py::value_error("fft_channel_reduce: x, w and y must be 3-D");
    const index_t nb = x.shape(0), c = x.shape(1), f = x.shape(2), k = w.shape(2);
    if (groups < 1 || c % groups || k % groups || w.shape(0) != f || w.shape(1) != 2 * (c / groups) ||
        y.shape(0) != nb || y.shape(1) != k || y.shape(2) != f)
      throw py::value_error("fft_channel_reduce: shapes do not match");
    auto run = [&](auto tag) {
      using T = decltype(tag);
      using C = std::complex<T>;
      for (const py::array* a : std::initializer_list<const py::array*>{&x, &y})
        if (!py::isinstance<py::array_t<C>>(*a) || !(a->flags() & py::array::c_style))
          throw py::type_error("fft_channel_reduce: x and y must be C-contiguous and of one complex dtype");
      if (!py::isinstance<py::array_t<T>>(w) || !(w.flags() & py::array::c_style))
        throw py::type_error("fft_channel_reduce: w must be C-contiguous and of the matching real dtype");
      if (!y.writeable()) throw py::value_error("fft_channel_reduce: y is read-only");
      const T* xp = reinterpret_cast<const T*>(x.data());
      const T* wp = static_cast<const T*>(w.data());
      T* yp = reinterpret_cast<T*>(y.mutable_data());
      py::gil_scoped_release nogil;
      fft_channel_reduce<T>(nb, c, k, groups, f, xp, wp, yp);
    };
    if (py::isinstance<py::array_t<std::complex<float>>>(y)) run(float{});
    else if (py::isinstance<py::array_t<std::complex<double>>>(y)) run(double{});
    else throw py::type_error("fft_channel_reduce: y must be complex64 or complex128");
  });

  m.def("implicit_workspace_elems", [](const py::tuple& shape, int nthreads, index_t itemsize) {
    if (itemsize != 4 && itemsize != 8) throw py::value_error("implicit_workspace_elems: itemsize must be 4 or 8");
    const ConvShape sh = conv_shape(shape);
    return itemsize == 4 ? implicit_workspace_elems<float>(sh, nthreads) : implicit_workspace_elems<double>(sh, nthreads);
  });

  m.def("depthwise_workspace_elems", [](const py::tuple& shape, int nthreads) {
    return depthwise_workspace_elems(conv_shape(shape), nthreads);
  }, "Workspace elements of the depthwise kernel on nthreads threads: one padded input plane each.");

  m.def("winograd_tile_chunk", [](const py::tuple& shape, int mt, index_t max_elems) {
    if (mt != 2 && mt != 4) throw py::value_error("winograd_tile_chunk: m must be 2 or 4");
    return winograd_tile_chunk(conv_shape(shape), mt, max_elems);
  });

  m.def("winograd_workspace_elems", [](const py::tuple& shape, int mt, index_t tc, index_t itemsize) {
    if (mt != 2 && mt != 4) throw py::value_error("winograd_workspace_elems: m must be 2 or 4");
    if (itemsize != 4 && itemsize != 8) throw py::value_error("winograd_workspace_elems: itemsize must be 4 or 8");
    return winograd_workspace_elems(conv_shape(shape), mt, tc, itemsize);
  });

  m.def("winograd_bwd_filter_workspace_elems", [](const py::tuple& shape, int mt, index_t itemsize) {
    if (mt != 2 && mt != 4) throw py::value_error("winograd_bwd_filter_workspace_elems: m must be 2 or 4");
    if (itemsize != 4 && itemsize != 8)
      throw py::value_error("winograd_bwd_filter_workspace_elems: itemsize must be 4 or 8");
    return winograd_bwd_filter_workspace_elems(conv_shape(shape), mt, itemsize);
  }, "Workspace elements of backward filter by Winograd: a chunk's panels and one group's point sums.");

  m.def("winograd_bwd_data_workspace_elems", [](const py::tuple& shape, int mt, index_t tc, index_t itemsize) {
    if (mt != 2 && mt != 4) throw py::value_error("winograd_bwd_data_workspace_elems: m must be 2 or 4");
    if (itemsize != 4 && itemsize != 8)
      throw py::value_error("winograd_bwd_data_workspace_elems: itemsize must be 4 or 8");
    const ConvShape sh = conv_shape(shape);
    if (sh.r != 3 || sh.s != 3 || sh.sh != 1 || sh.sw != 1 || sh.dh != 1 || sh.dw != 1 || sh.ph > 2 || sh.pw > 2)
      throw py::value_error("winograd_bwd_data_workspace_elems: needs a 3x3 filter, stride 1, dilation 1, padding <= 2");
    return winograd_bwd_data_workspace_elems(sh, mt, tc, itemsize);
  }, "Workspace elements of backward data by Winograd: the turned filters, then the forward pass's.");
}

}  // namespace bindings
}  // namespace dnnkit
