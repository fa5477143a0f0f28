// The one pybind11 module, dnnkit._cpu. Thin: checks what a kernel relies on, releases the GIL, calls
// the kernel. The Python layer (dnnkit.api) does the user-facing validation with operator-named errors;
// the checks here keep direct callers from crashing the process.
#include <pybind11/complex.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <complex>
#include <memory>
#include <type_traits>
#include <string>
#include <limits>
#include <vector>

#include "common.h"
#include "cpu_info.h"
#include "conv/conv.h"
#include "conv/kernels.h"
#include "conv/fft.h"
#include "conv/winograd.h"
#include "eltwise/eltwise.h"
#include "gemm/blocking.h"
#include "gemm/amx.h"
#include "gemm/gemm.h"
#include "gemm/ukernel.h"
#include "rnn/rnn.h"

namespace py = pybind11;
using namespace dnnkit;

namespace {

// Bumped by every setting a dispatch decision depends on (settings_generation): the ISA, AMX, threads.
unsigned long long g_settings_generation = 0;

struct View2D {
  index_t rows, cols, rs, cs;  // strides in elements
};

template <typename T>
View2D view2d(const py::array& x, const char* op, const char* name) {
  if (x.ndim() != 2) throw py::value_error(std::string(op) + ": " + name + " must be 2-D");
  if (!py::isinstance<py::array_t<T>>(x) || x.itemsize() != static_cast<py::ssize_t>(sizeof(T)))
    throw py::type_error(std::string(op) + ": " + name + " has the wrong dtype");
  for (int d = 0; d < 2; ++d)
    if (x.strides(d) % static_cast<py::ssize_t>(sizeof(T)) != 0)
      throw py::value_error(std::string(op) + ": " + name + " has strides that are not a multiple of its itemsize");
  return {x.shape(0), x.shape(1), x.strides(0) / static_cast<index_t>(sizeof(T)),
          x.strides(1) / static_cast<index_t>(sizeof(T))};
}

Activation activation_from_int(int act) {
  if (act < 0 || act > 4) throw py::value_error("activation code must be in 0..4");
  return static_cast<Activation>(act);
}

template <typename T>
void gemm_impl(const py::array& a, const py::array& b, py::array& c, double alpha, double beta,
               const py::object& bias, int act, int nthreads, int kind) {
  // kind: 0 gemm (blocked: every path), 1 gemm_small_m, 2 gemm_wt_direct, 3 the Goto/BLIS path alone,
  // 4 gemm_stream where the operands' strides let it run (else as 0)
  const char* op = "gemm";
  View2D va = view2d<T>(a, op, "a"), vb = view2d<T>(b, op, "b"), vc = view2d<T>(c, op, "c");
  if (va.cols != vb.rows) throw py::value_error("gemm: inner dimensions of a and b differ");
  if (vc.rows != va.rows || vc.cols != vb.cols) throw py::value_error("gemm: c has the wrong shape");
  if (!c.writeable()) throw py::value_error("gemm: c is read-only");
  GemmArgs<T> g;
  g.m = va.rows;
  g.n = vb.cols;
  g.k = va.cols;
  g.alpha = static_cast<T>(alpha);
  g.beta = static_cast<T>(beta);
  g.a = static_cast<const T*>(a.data());
  g.rs_a = va.rs;
  g.cs_a = va.cs;
  g.b = static_cast<const T*>(b.data());
  g.rs_b = vb.rs;
  g.cs_b = vb.cs;
  g.c = static_cast<T*>(c.mutable_data());
  g.rs_c = vc.rs;
  g.cs_c = vc.cs;
  g.act = activation_from_int(act);
  py::array_t<T, py::array::c_style> bias_arr;
  if (!bias.is_none()) {
    bias_arr = py::array_t<T, py::array::c_style>::ensure(bias);
    if (!bias_arr || bias_arr.ndim() != 1 || bias_arr.shape(0) != g.n)
      throw py::value_error("gemm: bias must be 1-D with one element per column of c");
    g.bias = bias_arr.data();
  }
  if ((kind == 1 || kind == 2) && ((g.cs_a != 1 && g.k > 1) || (g.rs_b != 1 && g.k > 1)))
    throw py::value_error(std::string(kind == 1 ? "gemm_small_m" : "gemm_wt_direct") +
                          ": a must be contiguous along k (its rows) and b must be the transpose of a "
                          "row-contiguous matrix");
  py::gil_scoped_release nogil;
  if (kind == 1)
    gemm_small_m<T>(g, nthreads);
  else if (kind == 2)
    gemm_wt_direct<T>(g, nthreads);
  else if (kind == 4 && g.k > 0 && gemm_stream<T>(g, nthreads))
    return;
  else {
    if (kind == 3) g.path = GemmPath::goto_only;
    gemm<T>(g, nthreads);
  }
}

// A C-contiguous array of `shape` on an AlignedBuffer of n >= its size elements, which the array owns
// (blocks of kRecycleBytes and up go back to the block cache when it is freed). Throws std::bad_alloc.
template <typename T>
py::array_t<T, py::array::c_style> buffer_array(const std::vector<py::ssize_t>& shape, std::size_t n) {
  auto buf = std::make_unique<AlignedBuffer<T>>(n);
  T* data = buf->data();
  py::capsule owner(buf.get(), [](void* p) { delete static_cast<AlignedBuffer<T>*>(p); });
  buf.release();  // the capsule owns it now
  return py::array_t<T, py::array::c_style>(shape, data, owner);
}

// A new C-contiguous array for an output: of kRecycleBytes or more, backed by a block of the block cache
// that goes back to it when the array is freed (from glibc, whether such an output faults in fresh pages
// at every call depends on what the process allocated before), else NumPy's. Throws std::bad_alloc.
template <typename T>
py::array_t<T, py::array::c_style> new_output(const std::vector<py::ssize_t>& shape) {
  std::size_t n = 1;
  for (py::ssize_t d : shape) {
    if (d < 0 || (d > 0 && n > SIZE_MAX / sizeof(T) / static_cast<std::size_t>(d))) throw std::bad_alloc();
    n *= static_cast<std::size_t>(d);
  }
  if (n * sizeof(T) < kRecycleBytes) return py::array_t<T, py::array::c_style>(shape);
  return buffer_array<T>(shape, n);
}

// The whole of a linear layer's forward once dispatch has chosen its kernel (kind as gemm_impl's):
// y (x.shape[:-1] + (n,)) := act(x W^T + bias) for x (..., k) and W (n, k), with the output allocated
// here. An x whose leading dimensions do not flatten to one row stride is copied, as is an operand the
// row kernels (kinds 1 and 2) cannot read in place.
template <typename T>
py::array linear_run_impl(const py::array& x, const py::array& w, const py::object& bias, int act, int kind) {
  const char* op = "linear";
  using CArr = py::array_t<T, py::array::c_style>;
  if (x.ndim() < 1 || w.ndim() != 2) throw py::value_error("linear: input must be at least 1-D and weight 2-D");
  if (!py::isinstance<py::array_t<T>>(x) || !py::isinstance<py::array_t<T>>(w))
    throw py::type_error("linear: input and weight must share a float dtype");
  const py::ssize_t nd = x.ndim();
  const index_t k = x.shape(nd - 1), n = w.shape(0);
  if (w.shape(1) != k) throw py::value_error("linear: weight has the wrong number of input features");
  index_t m = 1;
  for (py::ssize_t d = 0; d + 1 < nd; ++d) m *= x.shape(d);
  std::vector<py::ssize_t> shape(x.shape(), x.shape() + nd - 1);
  shape.push_back(static_cast<py::ssize_t>(n));
  CArr y = new_output<T>(shape);
  if (m == 0 || n == 0) return std::move(y);
  const auto item = static_cast<py::ssize_t>(sizeof(T));
  // The row stride of x as an (m, k) matrix: the leading dimensions must nest (sizes of 1 aside).
  py::array xa = x;
  py::ssize_t rs = k * item;
  bool nested = true;
  for (py::ssize_t d = nd - 2, inner = -1; d >= 0; --d) {
    if (x.shape(d) == 1) continue;
    if (inner < 0) {
      rs = x.strides(d);
    } else if (x.strides(d) != x.strides(inner) * x.shape(inner)) {
      nested = false;
      break;
    }
    inner = d;
  }
  if (!nested || rs % item != 0 || x.strides(nd - 1) % item != 0 || (kind != 0 && k > 1 && x.strides(nd - 1) != item)) {
    xa = CArr::ensure(x);
    rs = k * item;
  }
  py::array wa = w;
  if (w.strides(0) % item != 0 || w.strides(1) % item != 0 || (kind != 0 && k > 1 && w.strides(1) != item))
    wa = CArr::ensure(w);
  GemmArgs<T> g;
  g.m = m;
  g.n = n;
  g.k = k;
  g.a = static_cast<const T*>(xa.data());
  g.rs_a = rs / item;
  g.cs_a = xa.strides(xa.ndim() - 1) / item;
  g.b = static_cast<const T*>(wa.data());  // B = W^T
  g.rs_b = wa.strides(1) / item;
  g.cs_b = wa.strides(0) / item;
  g.c = y.mutable_data();
  g.rs_c = n;
  g.cs_c = 1;
  g.act = activation_from_int(act);
  CArr bias_arr;
  if (!bias.is_none()) {
    bias_arr = CArr::ensure(bias);
    if (!bias_arr || bias_arr.ndim() != 1 || bias_arr.shape(0) != n)
      throw py::value_error(std::string(op) + ": bias must be 1-D with one element per output feature");
    g.bias = bias_arr.data();
  }
  {
    py::gil_scoped_release nogil;
    if (kind == 1)
      gemm_small_m<T>(g, 0);
    else if (kind == 2)
      gemm_wt_direct<T>(g, 0);
    else
      gemm<T>(g, 0);
  }
  return std::move(y);
}

// A weight W (n x k, any strides) packed once as W^T for gemm_prepacked (dnnkit.pack_weight). The
// packing is held by shared pointer and replaced whole by repack(), with the GIL held, and every user
// takes its own reference with the GIL held before releasing it: a repack while another thread
// multiplies by the old packing leaves that packing alive until the product ends.
struct PackedWeight {
  index_t n = 0, k = 0;
  int itemsize = 0;
  std::shared_ptr<const PackedB<float>> f32;
  std::shared_ptr<const PackedB<double>> f64;

  explicit PackedWeight(const py::array& w) { repack(w); }

  void repack(const py::array& w) {
    const char* op = "pack_weight";
    if (w.ndim() != 2) throw py::value_error("pack_weight: weight must be 2-D (out_features, in_features)");
    const bool f = py::isinstance<py::array_t<float>>(w), d = py::isinstance<py::array_t<double>>(w);
    if (!f && !d) throw py::type_error("pack_weight: weight must be float32 or float64");
    const int item = f ? 4 : 8;
    if (itemsize != 0 && (item != itemsize || w.shape(0) != n || w.shape(1) != k))
      throw py::value_error("pack_weight: a repacked weight must keep its shape and dtype");
    if (f) f32 = pack<float>(w, op);
    else f64 = pack<double>(w, op);
    n = w.shape(0);
    k = w.shape(1);
    itemsize = item;
  }

  template <typename T>
  std::shared_ptr<const PackedB<T>> get() const {
    if constexpr (std::is_same_v<T, float>) return f32;
    else return f64;
  }

 private:
  template <typename T>
  static std::shared_ptr<const PackedB<T>> pack(const py::array& w, const char* op) {
    const View2D v = view2d<T>(w, op, "weight");
    auto p = std::make_shared<PackedB<T>>();
    const T* data = static_cast<const T*>(w.data());
    py::gil_scoped_release nogil;
    p->pack(v.cols, v.rows, data, v.cs, v.rs);  // B = W^T: B(q, j) = W(j, q)
    p->pack_amx(data, v.cs, v.rs);               // float32 on AMX tiles: a second packing, where they run
    return p;
  }
};

// y (x.shape[:-1] + (n,)) := act(x W^T + bias) on a weight packed by pack_weight; x of the weight's
// dtype, rows copied to contiguous when they are not.
template <typename T>
py::array linear_prepacked_impl(const py::array& x, const PackedWeight& pw, const py::object& bias, int act) {
  using CArr = py::array_t<T, py::array::c_style>;
  if (x.ndim() < 1) throw py::value_error("linear: input must be at least 1-D");
  const py::ssize_t nd = x.ndim();
  const index_t k = x.shape(nd - 1), n = pw.n;
  if (k != pw.k) throw py::value_error("linear: input has the wrong number of features for the packed weight");
  const Activation a = activation_from_int(act);
  if (!py::isinstance<py::array_t<T>>(x)) throw py::type_error("linear: input must have the packed weight's dtype");
  CArr xa = CArr::ensure(x);
  index_t m = 1;
  for (py::ssize_t d = 0; d + 1 < nd; ++d) m *= x.shape(d);
  std::vector<py::ssize_t> shape(x.shape(), x.shape() + nd - 1);
  shape.push_back(static_cast<py::ssize_t>(n));
  CArr y = new_output<T>(shape);
  CArr bias_arr;
  if (!bias.is_none()) {
    bias_arr = CArr::ensure(bias);
    if (!bias_arr || bias_arr.ndim() != 1 || bias_arr.shape(0) != n)
      throw py::value_error("linear: bias must be 1-D with one element per output feature");
  }
  if (m == 0 || n == 0) return std::move(y);
  const std::shared_ptr<const PackedB<T>> w = pw.get<T>();
  const T* bp = bias.is_none() ? nullptr : bias_arr.data();
  py::gil_scoped_release nogil;
  gemm_prepacked<T>(m, xa.data(), k, *w, y.mutable_data(), n, bp, a);
  return std::move(y);
}

template <typename T>
py::array_t<T> contiguous(const py::object& x, const char* op, const char* name) {
  auto arr = py::array_t<T, py::array::c_style>::ensure(x);
  if (!arr) throw py::type_error(std::string(op) + ": " + name + " must be a contiguous array of the right dtype");
  return arr;
}

template <typename T>
void ukernel_test_impl(Isa isa, const py::array& ap, const py::array& bp, py::array& c, double alpha, double beta,
                       int m, int n, const py::object& bias_obj, bool bias_rows) {
  const UKernel<T> uk = select_ukernel<T>(isa);
  auto a = py::array_t<T, py::array::c_style>::ensure(ap);
  auto b = py::array_t<T, py::array::c_style>::ensure(bp);
  if (!a || !b || a.size() % uk.mr != 0 || b.size() / uk.nr != a.size() / uk.mr || b.size() % uk.nr != 0)
    throw py::value_error("ukernel_test: packed panels must hold k*MR and k*NR elements");
  if (m < 0 || m > uk.mr || n < 0 || n > uk.nr) throw py::value_error("ukernel_test: need 0 <= m <= MR, 0 <= n <= NR");
  View2D vc = view2d<T>(c, "ukernel_test", "c");
  if (vc.rows < m || vc.cols < n) throw py::value_error("ukernel_test: c is smaller than m x n");
  if (!c.writeable()) throw py::value_error("ukernel_test: c is read-only");
  const index_t k = a.size() / uk.mr;
  // Copy into 64-byte-aligned buffers, as the driver's packing provides.
  AlignedBuffer<T> abuf(static_cast<std::size_t>(k * uk.mr + 1)), bbuf(static_cast<std::size_t>(k * uk.nr + 1));
  std::copy(a.data(), a.data() + a.size(), abuf.data());
  std::copy(b.data(), b.data() + b.size(), bbuf.data());
  // The bias, when given, copied to the front of a buffer whose values past n are NaN: a kernel that read
  // past the n values it is given would put NaN in the tile.
  std::vector<T> bias;
  if (!bias_obj.is_none()) {
    auto bv = py::array_t<T, py::array::c_style | py::array::forcecast>::ensure(bias_obj);
    const int len = bias_rows ? m : n;
    if (!bv || bv.ndim() != 1 || bv.size() != len)
      throw py::value_error("ukernel_test: bias must hold n values (m with bias_rows)");
    bias.assign(static_cast<std::size_t>(len + 64), std::numeric_limits<T>::quiet_NaN());
    std::copy(bv.data(), bv.data() + len, bias.begin());
  }
  uk.fn(k, abuf.data(), bbuf.data(), static_cast<T*>(c.mutable_data()), vc.rs, vc.cs, static_cast<T>(alpha),
        static_cast<T>(beta), m, n, bias_obj.is_none() ? nullptr : bias.data(), bias_rows);
}

bool is_f32(const py::array& x) { return py::isinstance<py::array_t<float>>(x) && x.itemsize() == 4; }
bool is_f64(const py::array& x) { return py::isinstance<py::array_t<double>>(x) && x.itemsize() == 8; }

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
  py::gil_scoped_release nogil;
  run(sh, call);
}


// ------------------------------------------------------------------------------------------------- RNN
// The Python layer (dnnkit.rnn) validates shapes with operator-named errors and passes C-contiguous
// arrays of one dtype; these checks only keep direct callers from crashing the process.

// (cell, T, B, I, H, L, D[, P[, schedule]]) with cell 0 lstm, 1 gru, 2 rnn_tanh, 3 rnn_relu; P the LSTM
// projection size (0 or absent: none); schedule an RnnSchedule (0 or absent: automatic).
RnnShape rnn_shape(const py::tuple& t) {
  if (t.size() < 7 || t.size() > 9)
    throw py::value_error("rnn: shape tuple must be (cell, T, B, I, H, L, D[, P[, schedule]])");
  index_t v[9] = {0, 0, 0, 0, 0, 0, 0, 0, 0};
  for (std::size_t i = 0; i < t.size(); ++i) v[i] = t[i].cast<index_t>();
  if (v[0] < 0 || v[0] > 3) throw py::value_error("rnn: cell code must be in 0..3");
  for (int i = 1; i < 9; ++i)
    if (v[i] < 0) throw py::value_error("rnn: shape entries must be >= 0");
  if (v[8] > 3) throw py::value_error("rnn: schedule must be in 0..3");
  if (v[4] < 1 || v[5] < 1 || (v[6] != 1 && v[6] != 2))
    throw py::value_error("rnn: need hidden >= 1, layers >= 1 and 1 or 2 directions");
  if (v[7] > 0 && (v[0] != 0 || v[7] >= v[4]))
    throw py::value_error("rnn: a projection needs an LSTM and 0 < proj_size < hidden_size");
  RnnShape s;
  s.cell = static_cast<RnnCell>(v[0]);
  s.seq = v[1];
  s.batch = v[2];
  s.input = v[3];
  s.hidden = v[4];
  s.layers = static_cast<int>(v[5]);
  s.dirs = static_cast<int>(v[6]);
  s.proj = v[7];
  s.schedule = static_cast<RnnSchedule>(v[8]);
  return s;
}

// A C-contiguous array of T with exactly `elems` elements (null for None when optional).
template <typename T>
T* rnn_arg(const py::object& o, index_t elems, const std::string& name, bool writable, bool optional = false) {
  if (o.is_none()) {
    if (optional) return nullptr;
    throw py::value_error("rnn: " + name + " is required");
  }
  if (!py::isinstance<py::array_t<T>>(o)) throw py::type_error("rnn: " + name + " has the wrong dtype");
  py::array a = o.cast<py::array>();
  if (!(a.flags() & py::array::c_style)) throw py::value_error("rnn: " + name + " must be C-contiguous");
  if (a.size() != elems) throw py::value_error("rnn: " + name + " has the wrong number of elements");
  if (writable && !a.writeable()) throw py::value_error("rnn: " + name + " is read-only");
  return static_cast<T*>(const_cast<void*>(a.data()));
}

// Four entries per layer-direction: w_ih, w_hh, b_ih, b_hh (the biases both present or both None), and a
// fifth, w_hr, with a projection.
template <typename T, typename P>
void rnn_params(const RnnShape& s, const py::list& lst, bool writable, std::vector<P>& w_ih, std::vector<P>& w_hh,
                std::vector<P>& b_ih, std::vector<P>& b_hh, std::vector<P>& w_hr) {
  const int n = s.layers * s.dirs, per = s.proj > 0 ? 5 : 4;
  if (static_cast<int>(lst.size()) != per * n)
    throw py::value_error(s.proj > 0 ? "rnn: weights must hold 5 entries per layer-direction"
                                     : "rnn: weights must hold 4 entries per layer-direction");
  const index_t GH = rnn_gates(s.cell) * s.hidden;
  for (int li = 0; li < n; ++li) {
    const std::string k = std::to_string(li);
    w_ih.push_back(rnn_arg<T>(lst[per * li], GH * s.input_of(li / s.dirs), "w_ih[" + k + "]", writable));
    w_hh.push_back(rnn_arg<T>(lst[per * li + 1], GH * s.state(), "w_hh[" + k + "]", writable));
    b_ih.push_back(rnn_arg<T>(lst[per * li + 2], GH, "b_ih[" + k + "]", writable, true));
    b_hh.push_back(rnn_arg<T>(lst[per * li + 3], GH, "b_hh[" + k + "]", writable, true));
    if (s.proj > 0) w_hr.push_back(rnn_arg<T>(lst[per * li + 4], s.proj * s.hidden, "w_hr[" + k + "]", writable));
  }
}

template <typename T>
std::vector<T*> rnn_layer_outputs(const RnnShape& s, const py::list& ys) {
  if (static_cast<int>(ys.size()) != s.layers) throw py::value_error("rnn: need one output array per layer");
  std::vector<T*> out;
  for (int l = 0; l < s.layers; ++l)
    out.push_back(rnn_arg<T>(ys[l], s.seq * s.batch * s.dirs * s.state(), "y[" + std::to_string(l) + "]", true));
  return out;
}

template <typename T>
void rnn_forward_impl(const RnnShape& s, const py::object& x, const py::object& h0, const py::object& c0,
                      const py::list& weights, const py::list& ys, const py::object& h_n, const py::object& c_n,
                      const py::object& reserve) {
  const index_t state = s.layers * s.dirs * s.batch * s.hidden, hstate = s.layers * s.dirs * s.batch * s.state();
  const bool lstm = s.cell == RnnCell::lstm;
  RnnWeights<T> w;
  // A cell's weights packed by pack_weight: entries 0 and 1 are PackedWeight objects (kept alive here by
  // their shared pointers while the GIL is released).
  std::shared_ptr<const PackedB<T>> packed_ih, packed_hh;
  // (NumPy's own array check first: the type lookup of pybind11's isinstance costs a microsecond a call,
  // a few percent of a small cell's.)
  const py::handle e0 = weights.size() >= 2 ? py::handle(PyList_GET_ITEM(weights.ptr(), 0)) : py::handle();
  const py::handle e1 = weights.size() >= 2 ? py::handle(PyList_GET_ITEM(weights.ptr(), 1)) : py::handle();
  const bool pih = e0 && !py::array::check_(e0) && py::isinstance<PackedWeight>(e0);
  const bool phh = e1 && !py::array::check_(e1) && py::isinstance<PackedWeight>(e1);
  if (pih || phh) {
    if (!pih || !phh) throw py::value_error("rnn: w_ih and w_hh must both be packed or both be arrays");
    if (s.seq != 1 || s.layers != 1 || s.dirs != 1 || s.proj > 0 || weights.size() != 4)
      throw py::value_error("rnn: packed weights are taken by the cells only (one step, one layer and direction)");
    const index_t GH = rnn_gates(s.cell) * s.hidden;
    const auto& a = e0.cast<const PackedWeight&>();
    const auto& b = e1.cast<const PackedWeight&>();
    if (a.itemsize != static_cast<int>(sizeof(T)) || b.itemsize != static_cast<int>(sizeof(T)))
      throw py::type_error("rnn: packed weights have the wrong dtype");
    if (a.n != GH || a.k != s.input || b.n != GH || b.k != s.hidden)
      throw py::value_error("rnn: packed weights have the wrong shape");
    packed_ih = a.get<T>();
    packed_hh = b.get<T>();
    w.packed_ih = packed_ih.get();
    w.packed_hh = packed_hh.get();
    w.w_ih.push_back(nullptr);
    w.w_hh.push_back(nullptr);
    w.b_ih.push_back(rnn_arg<T>(weights[2], GH, "b_ih[0]", false, true));
    w.b_hh.push_back(rnn_arg<T>(weights[3], GH, "b_hh[0]", false, true));
  } else {
    rnn_params<T, const T*>(s, weights, false, w.w_ih, w.w_hh, w.b_ih, w.b_hh, w.w_hr);
  }
  for (std::size_t i = 0; i < w.b_ih.size(); ++i)
    if ((w.b_ih[i] == nullptr) != (w.b_hh[i] == nullptr))
      throw py::value_error("rnn: b_ih and b_hh must both be given or both be None");
  const T* xp = rnn_arg<T>(x, s.seq * s.batch * s.input, "x", false);
  const T* h0p = rnn_arg<T>(h0, hstate, "h0", false, true);
  const T* c0p = lstm ? rnn_arg<T>(c0, state, "c0", false, true) : nullptr;
  std::vector<T*> y = rnn_layer_outputs<T>(s, ys);
  T* hn = rnn_arg<T>(h_n, hstate, "h_n", true, true);
  T* cn = lstm ? rnn_arg<T>(c_n, state, "c_n", true, true) : nullptr;
  T* res = rnn_arg<T>(reserve, rnn_reserve_elems(s), "reserve", true, true);
  py::gil_scoped_release nogil;
  rnn_forward<T>(s, w, xp, h0p, c0p, y.data(), hn, cn, res);
}

template <typename T>
void rnn_backward_impl(const RnnShape& s, const py::object& x, const py::object& h0, const py::object& c0,
                       const py::list& weights, const py::list& ys, const py::object& reserve, const py::object& dy,
                       const py::object& dh_n, const py::object& dc_n, const py::object& dx, const py::object& dh0,
                       const py::object& dc0, const py::list& grads, bool accumulate) {
  const index_t state = s.layers * s.dirs * s.batch * s.hidden, hstate = s.layers * s.dirs * s.batch * s.state();
  const bool lstm = s.cell == RnnCell::lstm;
  RnnWeights<T> w;
  rnn_params<T, const T*>(s, weights, false, w.w_ih, w.w_hh, w.b_ih, w.b_hh, w.w_hr);
  RnnWeightGrads<T> g;
  rnn_params<T, T*>(s, grads, true, g.w_ih, g.w_hh, g.b_ih, g.b_hh, g.w_hr);
  g.accumulate = accumulate;
  for (std::size_t i = 0; i < w.b_ih.size(); ++i)
    if ((w.b_ih[i] == nullptr) != (w.b_hh[i] == nullptr) || (g.b_ih[i] == nullptr) != (w.b_ih[i] == nullptr) ||
        (g.b_hh[i] == nullptr) != (w.b_hh[i] == nullptr))
      throw py::value_error("rnn: bias gradients must be given exactly for the biases the forward had");
  const T* xp = rnn_arg<T>(x, s.seq * s.batch * s.input, "x", false);
  const T* h0p = rnn_arg<T>(h0, hstate, "h0", false, true);
  const T* c0p = lstm ? rnn_arg<T>(c0, state, "c0", false, true) : nullptr;
  std::vector<T*> y = rnn_layer_outputs<T>(s, ys);
  std::vector<const T*> yc(y.begin(), y.end());
  const T* res = rnn_arg<T>(reserve, rnn_reserve_elems(s), "reserve", false);
  const T* dyp = rnn_arg<T>(dy, s.seq * s.batch * s.dirs * s.state(), "dy", false, true);
  const T* dhn = rnn_arg<T>(dh_n, hstate, "dh_n", false, true);
  const T* dcn = lstm ? rnn_arg<T>(dc_n, state, "dc_n", false, true) : nullptr;
  T* dxp = rnn_arg<T>(dx, s.seq * s.batch * s.input, "dx", true);
  T* dh0p = rnn_arg<T>(dh0, hstate, "dh0", true, true);
  T* dc0p = lstm ? rnn_arg<T>(dc0, state, "dc0", true, true) : nullptr;
  py::gil_scoped_release nogil;
  rnn_backward<T>(s, w, xp, h0p, c0p, yc.data(), res, dyp, dhn, dcn, dxp, dh0p, dc0p, g);
}

}  // namespace

PYBIND11_MODULE(DNNKIT_MODULE, m) {
  m.doc() = "dnnkit CPU kernels (C++, OpenMP)";

  m.def("gemm",
        [](const py::array& a, const py::array& b, py::array& c, double alpha, double beta, const py::object& bias,
           int act, int nthreads, int path) {
          if (path < 0 || path > 2) throw py::value_error("gemm: path must be 0 (any), 1 (Goto/BLIS) or 2 (stream)");
          const int kind = path == 0 ? 0 : path + 2;
          if (is_f32(c)) return gemm_impl<float>(a, b, c, alpha, beta, bias, act, nthreads, kind);
          if (is_f64(c)) return gemm_impl<double>(a, b, c, alpha, beta, bias, act, nthreads, kind);
          throw py::type_error("gemm: c must be float32 or float64");
        },
        py::arg("a"), py::arg("b"), py::arg("c"), py::arg("alpha") = 1.0, py::arg("beta") = 0.0,
        py::arg("bias") = py::none(), py::arg("activation") = 0, py::arg("nthreads") = 0, py::arg("path") = 0,
        "C := act(alpha*A@B + beta*C + bias) on 2-D strided arrays of one dtype; C is not read when beta == 0.\n"
        "path: 0 every path (blocked_gemm), 1 Goto/BLIS alone (gemm_goto), 2 the streamed products where the\n"
        "operands let them run, else as 0 (gemm_stream).");

  m.def("gemm_stream_takes", &gemm_stream_takes, py::arg("m"), py::arg("n"), py::arg("k"),
        "Whether gemm_stream takes this product (B and C with contiguous rows).");

  m.def("gemm_small_m",
        [](const py::array& a, const py::array& b, py::array& c, double alpha, double beta, const py::object& bias,
           int act, int nthreads) {
          if (is_f32(c)) return gemm_impl<float>(a, b, c, alpha, beta, bias, act, nthreads, 1);
          if (is_f64(c)) return gemm_impl<double>(a, b, c, alpha, beta, bias, act, nthreads, 1);
          throw py::type_error("gemm: c must be float32 or float64");
        },
        py::arg("a"), py::arg("b"), py::arg("c"), py::arg("alpha") = 1.0, py::arg("beta") = 0.0,
        py::arg("bias") = py::none(), py::arg("activation") = 0, py::arg("nthreads") = 0,
        "gemm's contract for A with rows contiguous along k and B = W^T with W rows contiguous: no packing.");

  m.def("gemm_wt_direct",
        [](const py::array& a, const py::array& b, py::array& c, double alpha, double beta, const py::object& bias,
           int act, int nthreads) {
          if (is_f32(c)) return gemm_impl<float>(a, b, c, alpha, beta, bias, act, nthreads, 2);
          if (is_f64(c)) return gemm_impl<double>(a, b, c, alpha, beta, bias, act, nthreads, 2);
          throw py::type_error("gemm: c must be float32 or float64");
        },
        py::arg("a"), py::arg("b"), py::arg("c"), py::arg("alpha") = 1.0, py::arg("beta") = 0.0,
        py::arg("bias") = py::none(), py::arg("activation") = 0, py::arg("nthreads") = 0,
        "gemm_small_m's layout for a batch of rows: C^T = W A^T with W read in place (the strided-A kernel).");

  py::class_<PackedWeight>(m, "PackedWeight",
                           "A weight (out_features, in_features) packed once for linear_prepacked and the cells.")
      .def(py::init<const py::array&>(), py::arg("weight"))
      .def("repack", &PackedWeight::repack, py::arg("weight"),
           "Packs a weight of the same shape and dtype in place of the current packing.")
      .def_readonly("out_features", &PackedWeight::n)
      .def_readonly("in_features", &PackedWeight::k)
      .def_readonly("itemsize", &PackedWeight::itemsize)
      .def_property_readonly("nbytes", [](const PackedWeight& p) -> index_t {
        const index_t nr = p.itemsize == 4 ? p.f32->ukernel().nr : p.f64->ukernel().nr;
        // With the AMX tiles' second packing (float32): three bfloat16 parts, depth in steps of 32.
        const index_t tiles = p.itemsize == 4 && p.f32->amx_panel(0)
                                  ? p.f32->panels() * amx::panel_elems(p.k) * index_t(sizeof(amx::bf16))
                                  : 0;
        return ceil_div(p.n, nr) * nr * p.k * p.itemsize + tiles;
      });
  m.def("linear_prepacked",
        [](const py::array& x, const PackedWeight& w, const py::object& bias, int act) -> py::array {
          if (w.itemsize == 4) return linear_prepacked_impl<float>(x, w, bias, act);
          return linear_prepacked_impl<double>(x, w, bias, act);
        },
        py::arg("x"), py::arg("weight"), py::arg("bias") = py::none(), py::arg("activation") = 0,
        "y := act(x @ W.T + bias), y allocated, for x (..., in_features) and W packed by PackedWeight.");

  m.def("linear_run",
        [](const py::array& x, const py::array& w, const py::object& bias, int act, int kind) -> py::array {
          if (kind < 0 || kind > 2) throw py::value_error("linear_run: kind must be 0, 1 or 2");
          if (py::isinstance<py::array_t<float>>(x)) return linear_run_impl<float>(x, w, bias, act, kind);
          if (py::isinstance<py::array_t<double>>(x)) return linear_run_impl<double>(x, w, bias, act, kind);
          throw py::type_error("linear: input must be float32 or float64");
        },
        "y := act(x @ w.T + bias), y allocated, for x (..., k) and w (n, k) of one dtype; kind as gemm's "
        "kernels: 0 blocked, 1 gemm_small_m, 2 gemm_wt_direct.");
  m.def("gemm_wt_direct_width", [](int itemsize, index_t rows) {
          return itemsize == 4 ? select_sa_kernel<float>(active_isa(), rows).nr
                               : select_sa_kernel<double>(active_isa(), rows).nr;
        }, py::arg("itemsize"), py::arg("rows") = 0,
        "Rows of A one tile of gemm_wt_direct's strided-A kernel covers on the active ISA for a product of "
        "`rows` rows (0: the tile of large batches, which run as panels of it; 0 returned: the ISA has none).");
  m.def("gemm_wt_direct_fits", [](int itemsize, index_t rows) {
          return itemsize == 4 ? sa_batch_fits(select_sa_kernel<float>(active_isa(), rows), rows)
                               : sa_batch_fits(select_sa_kernel<double>(active_isa(), rows), rows);
        }, py::arg("itemsize"), py::arg("rows"),
        "Whether a product of `rows` rows fills the active ISA's strided-A tiles well enough for gemm_wt_direct "
        "to beat the packing GEMM (the depth rule aside).");
  m.def("gemm_wt_direct_min_depth", [](int itemsize) {
          return itemsize == 4 ? select_sa_kernel<float>(active_isa()).min_depth
                               : select_sa_kernel<double>(active_isa()).min_depth;
        }, py::arg("itemsize"),
        "The depth from which gemm_wt_direct is chosen on the active ISA (where its tiles are full enough).");
  m.def("gemm_wt_direct_depth_block", [](int itemsize) {
          return itemsize == 4 ? sa_depth_block(select_sa_kernel<float>(active_isa()))
                               : sa_depth_block(select_sa_kernel<double>(active_isa()));
        }, py::arg("itemsize"), "The depth of gemm_wt_direct's blocks on the active ISA (partial sums added into C); 0: no kernel.");
  m.def("gemm_wt_direct_max_rows", [](int itemsize) {
          return itemsize == 4 ? select_sa_kernel<float>(active_isa()).max_rows
                               : select_sa_kernel<double>(active_isa()).max_rows;
        }, py::arg("itemsize"), "The largest batch gemm_wt_direct is chosen for on the active ISA (0: no kernel).");

  m.def("gemm_workspace_bytes",
        [](index_t mm, index_t n, index_t k, int itemsize, int nthreads) {
          if (mm < 0 || n < 0 || k < 0) throw py::value_error("gemm_workspace_bytes: sizes must be >= 0");
          if (itemsize == 4) return gemm_workspace_bytes<float>(mm, n, k, nthreads);
          if (itemsize == 8) return gemm_workspace_bytes<double>(mm, n, k, nthreads);
          throw py::value_error("gemm_workspace_bytes: itemsize must be 4 or 8");
        },
        py::arg("m"), py::arg("n"), py::arg("k"), py::arg("itemsize"), py::arg("nthreads") = 0);

  m.def("activation_forward", [](const py::array& z, py::array& y, int act) {
    const Activation a = activation_from_int(act);
    if (z.size() != y.size() || !y.writeable()) throw py::value_error("activation_forward: y must match z");
    if (is_f32(z)) {
      auto zz = contiguous<float>(z, "activation_forward", "z");
      auto yy = contiguous<float>(y, "activation_forward", "y");
      if (yy.ptr() != y.ptr()) throw py::value_error("activation_forward: y must be C-contiguous");
      py::gil_scoped_release nogil;
      activation_forward<float>(zz.data(), yy.mutable_data(), zz.size(), a);
    } else if (is_f64(z)) {
      auto zz = contiguous<double>(z, "activation_forward", "z");
      auto yy = contiguous<double>(y, "activation_forward", "y");
      if (yy.ptr() != y.ptr()) throw py::value_error("activation_forward: y must be C-contiguous");
      py::gil_scoped_release nogil;
      activation_forward<double>(zz.data(), yy.mutable_data(), zz.size(), a);
    } else {
      throw py::type_error("activation_forward: z must be float32 or float64");
    }
  });

  m.def("activation_backward", [](const py::array& grad_y, const py::object& z, const py::object& y,
                                  py::array& grad_z, int act) {
    const Activation a = activation_from_int(act);
    if (grad_y.size() != grad_z.size() || !grad_z.writeable())
      throw py::value_error("activation_backward: grad_z must match grad_y");
    if (z.is_none() && (y.is_none() || a == Activation::gelu))
      throw py::value_error("activation_backward: gelu needs z; the others need z or y");
    auto run = [&](auto tag) {
      using T = decltype(tag);
      auto gy = contiguous<T>(grad_y, "activation_backward", "grad_y");
      auto gz = contiguous<T>(grad_z, "activation_backward", "grad_z");
      if (gz.ptr() != grad_z.ptr()) throw py::value_error("activation_backward: grad_z must be C-contiguous");
      // A default-constructed array_t is an empty array, not a null handle: track presence explicitly.
      const bool has_z = !z.is_none(), has_y = !y.is_none();
      py::array_t<T> zz, yy;
      if (has_z) zz = contiguous<T>(z, "activation_backward", "z");
      if (has_y) yy = contiguous<T>(y, "activation_backward", "y");
      if ((has_z && zz.size() != gy.size()) || (has_y && yy.size() != gy.size()))
        throw py::value_error("activation_backward: z and y must match grad_y");
      const T* zp = has_z ? zz.data() : nullptr;
      const T* yp = has_y ? yy.data() : nullptr;
      py::gil_scoped_release nogil;
      activation_backward<T>(gy.data(), zp, yp, gz.mutable_data(), gy.size(), a);
    };
    if (is_f32(grad_y)) run(float{});
    else if (is_f64(grad_y)) run(double{});
    else throw py::type_error("activation_backward: grad_y must be float32 or float64");
  });

  m.def("column_sums", [](const py::array& x, const py::object& into) -> py::array {
    if (x.ndim() != 2) throw py::value_error("column_sums: x must be 2-D");
    auto run = [&](auto tag) -> py::array {
      using T = decltype(tag);
      auto xx = contiguous<T>(x, "column_sums", "x");
      const index_t rows = xx.shape(0), cols = xx.shape(1);
      py::array_t<T> out;
      if (into.is_none()) {
        out = py::array_t<T>(cols);
      } else {
        if (!py::isinstance<py::array_t<T>>(into))
          throw py::type_error("column_sums: into must be an array of x's dtype");
        out = into.cast<py::array_t<T>>();
        if (out.ndim() != 1 || out.shape(0) != cols || !(out.flags() & py::array::c_style) || !out.writeable())
          throw py::value_error("column_sums: into must be a writable contiguous 1-D array of x's column count");
      }
      T* o = out.mutable_data();
      {
        py::gil_scoped_release nogil;
        column_sums<T>(xx.data(), rows, cols, o, !into.is_none());
      }
      return out;
    };
    if (is_f32(x)) return run(float{});
    if (is_f64(x)) return run(double{});
    throw py::type_error("column_sums: x must be float32 or float64");
  }, py::arg("x"), py::arg("into") = py::none(),
        "Column sums of a 2-D array (accumulated in double); with `into`, added to that array and returned.");

  m.def("amx_tile_test",
        [](const py::array& a, const py::array& b, py::array& c, double alpha, double beta, const py::object& bias_obj,
           bool bias_rows) {
          if (!amx::enabled()) throw py::value_error("amx_tile_test: AMX tiles are not enabled");
          const View2D va = view2d<float>(a, "amx_tile_test", "a"), vb = view2d<float>(b, "amx_tile_test", "b");
          const View2D vc = view2d<float>(c, "amx_tile_test", "c");
          if (va.cols != vb.rows || va.rows != vc.rows || vb.cols != vc.cols || vc.rows > 32 || vc.cols > 32)
            throw py::value_error("amx_tile_test: need a (m x k), b (k x n), c (m x n), m and n <= 32");
          if (!c.writeable()) throw py::value_error("amx_tile_test: c is read-only");
          std::vector<float> bias;
          if (!bias_obj.is_none()) {
            auto bv = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(bias_obj);
            if (!bv || bv.ndim() != 1 || bv.size() != (bias_rows ? vc.rows : vc.cols))
              throw py::value_error("amx_tile_test: bias must have m values (bias_rows) or n");
            bias.assign(bv.data(), bv.data() + bv.size());
          }
          const index_t k = va.cols;
          AlignedBuffer<amx::bf16> ap(static_cast<std::size_t>(amx::panel_elems(k))),
              bp(static_cast<std::size_t>(amx::panel_elems(k)));
          const float* pa = static_cast<const float*>(a.data());
          const float* pb = static_cast<const float*>(b.data());
          float* pc = static_cast<float*>(c.mutable_data());
          py::gil_scoped_release nogil;
          const amx::TileScope tiles;
          amx::pack_a_panel(static_cast<int>(va.rows), k, pa, va.rs, va.cs, ap.data());
          amx::pack_b_panel(k, static_cast<int>(vb.cols), pb, vb.rs, vb.cs, bp.data());
          amx::tile(amx::steps(k), ap.data(), bp.data(), pc, vc.rs, vc.cs, static_cast<int>(vc.rows),
                    static_cast<int>(vc.cols), static_cast<float>(alpha), static_cast<float>(beta),
                    bias.empty() ? nullptr : bias.data(), bias_rows);
        },
        py::arg("a"), py::arg("b"), py::arg("c"), py::arg("alpha") = 1.0, py::arg("beta") = 0.0,
        py::arg("bias") = py::none(), py::arg("bias_rows") = false,
        "Test-only: C := alpha*A@B + beta*C (+ bias) for float32 views of at most 32 rows and columns, by\n"
        "the AMX tile kernel on panels packed from the views' strides (amx.h).");
  m.def("amx_splittable", [](const py::array& x) {
    if (!amx::available()) throw py::value_error("amx_splittable: AMX tiles are not available");
    const View2D v = view2d<float>(x, "amx_splittable", "x");
    return amx::splittable(v.rows, v.cols, static_cast<const float*>(x.data()), v.rs, v.cs);
  }, "Test-only: whether every value of a float32 2-D view splits exactly into AMX's bfloat16 parts.");

  m.def("ukernel_test",
        [](const std::string& isa, const py::array& ap, const py::array& bp, py::array& c, double alpha, double beta,
           int mm, int n, const py::object& bias, bool bias_rows) {
          const Isa i = isa_from_name(isa);
          if (static_cast<int>(i) > static_cast<int>(max_isa()))
            throw py::value_error("ukernel_test: the kernels may not use " + isa + " here (dnnkit.info())");
          if (is_f32(c)) return ukernel_test_impl<float>(i, ap, bp, c, alpha, beta, mm, n, bias, bias_rows);
          if (is_f64(c)) return ukernel_test_impl<double>(i, ap, bp, c, alpha, beta, mm, n, bias, bias_rows);
          throw py::type_error("ukernel_test: c must be float32 or float64");
        },
        py::arg("isa"), py::arg("a"), py::arg("b"), py::arg("c"), py::arg("alpha"), py::arg("beta"), py::arg("m"),
        py::arg("n"), py::arg("bias") = py::none(), py::arg("bias_rows") = false,
        "Test-only: run one ISA's micro-kernel on packed panels (a: k*MR, b: k*NR) into the m x n tile c, adding\n"
        "bias (n values per column, or m per row with bias_rows) when given.");

  m.def("ukernel_info", [](const std::string& isa, int itemsize) {
    const Isa i = isa_from_name(isa);
    if (static_cast<int>(i) > static_cast<int>(built_level()))
      throw py::value_error("ukernel_info: this build of dnnkit has no " + isa + " kernels");
    if (itemsize == 4) {
      auto u = select_ukernel<float>(i);
      auto b = blocking_for<float>(i);
      return py::make_tuple(u.name, u.mr, u.nr, b.mc, b.kc, nc_for_l2(b, b.kc, sizeof(float)));
    }
    auto u = select_ukernel<double>(i);
    auto b = blocking_for<double>(i);
    return py::make_tuple(u.name, u.mr, u.nr, b.mc, b.kc, nc_for_l2(b, b.kc, sizeof(double)));
  }, "(name, MR, NR, MC, KC, NC) of an ISA's micro-kernel and blocking for itemsize 4 or 8 (NC for a full KC, sized to this L2).");

  m.def("sa_kernel_info", [](const std::string& isa, int itemsize, index_t rows) {
    const Isa i = isa_from_name(isa);
    if (static_cast<int>(i) > static_cast<int>(built_level()))
      throw py::value_error("sa_kernel_info: this build of dnnkit has no " + isa + " kernels");
    if (itemsize == 4) {
      auto k = select_sa_kernel<float>(i, rows);
      return py::make_tuple(k.name, k.mr, k.nr);
    }
    auto k = select_sa_kernel<double>(i, rows);
    return py::make_tuple(k.name, k.mr, k.nr);
  }, py::arg("isa"), py::arg("itemsize"), py::arg("rows") = 0,
     "(name, MR, NR) of an ISA's strided-A micro-kernel (gemm_wt_direct) for itemsize 4 or 8 and a batch of "
     "`rows` rows (0: the tile of large batches); 'none', 0, 0 where it has none.");

  m.def("measure_peak_gflops", [](const std::string& isa, int nthreads, double seconds) {
    if (nthreads < 1) throw py::value_error("measure_peak_gflops: nthreads must be >= 1");
    if (!(seconds > 0) || seconds > 60) throw py::value_error("measure_peak_gflops: seconds must be in (0, 60]");
    const Isa i = isa_from_name(isa);
    if (static_cast<int>(i) > static_cast<int>(max_isa()))
      throw py::value_error("measure_peak_gflops: the kernels may not use " + isa + " here (dnnkit.info())");
    py::gil_scoped_release nogil;
    return dnnkit::measure_peak_gflops(i, nthreads, seconds);
  }, py::arg("isa"), py::arg("nthreads"), py::arg("seconds") = 0.2,
     "float32 FMA throughput of nthreads threads, GFLOP/s.");
  m.def("measure_read_gbps", [](long long bytes, int nthreads, double seconds, bool alternate) {
    if (nthreads < 1) throw py::value_error("measure_read_gbps: nthreads must be >= 1");
    if (bytes < 1 || bytes > (1ll << 34)) throw py::value_error("measure_read_gbps: bytes must be in [1, 16 GiB]");
    if (!(seconds > 0) || seconds > 60) throw py::value_error("measure_read_gbps: seconds must be in (0, 60]");
    py::gil_scoped_release nogil;
    return dnnkit::measure_read_gbps(static_cast<index_t>(bytes), nthreads, seconds, alternate);
  }, py::arg("bytes"), py::arg("nthreads"), py::arg("seconds") = 0.2, py::arg("alternate") = false,
     "GB/s that nthreads threads stream from a buffer of `bytes` (its share each), the best pass; with "
     "alternate, every other pass backwards (each starts on what the last left in cache).");

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

  m.def("im2col_chunk", [](const py::tuple& shape, index_t max_elems, bool batch_images) {
    return im2col_chunk(conv_shape(shape), std::max<index_t>(max_elems, 1), batch_images);
  }, py::arg("shape"), py::arg("max_elems"), py::arg("batch_images") = false,
     "Output pixels per im2col chunk for a workspace of at most max_elems elements (batch_images: forward).");
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

  // ----------------------------------------------------------------------------------------------- RNN
  m.def("rnn_forward",
        [](const py::tuple& shape, const py::object& x, const py::object& h0, const py::object& c0,
           const py::list& weights, const py::list& ys, const py::object& h_n, const py::object& c_n,
           const py::object& reserve) {
          const RnnShape s = rnn_shape(shape);
          if (py::isinstance<py::array_t<float>>(x))
            return rnn_forward_impl<float>(s, x, h0, c0, weights, ys, h_n, c_n, reserve);
          if (py::isinstance<py::array_t<double>>(x))
            return rnn_forward_impl<double>(s, x, h0, c0, weights, ys, h_n, c_n, reserve);
          throw py::type_error("rnn: x must be float32 or float64");
        },
        py::arg("shape"), py::arg("x"), py::arg("h0"), py::arg("c0"), py::arg("weights"), py::arg("ys"),
        py::arg("h_n"), py::arg("c_n"), py::arg("reserve"),
        "Fused RNN forward over a whole sequence. shape: (cell, T, B, I, H, L, D), cell 0 lstm, 1 gru, 2 rnn_tanh,\n"
        "3 rnn_relu; x (T, B, I); h0, c0, h_n, c_n (L*D, B, H) or None; weights: [w_ih, w_hh, b_ih, b_hh] per\n"
        "layer-direction (biases None for none); ys: one (T, B, D*H) output per layer; reserve: None\n"
        "(inference) or rnn_reserve_elems(shape) elements, read by rnn_backward.");

  m.def("rnn_backward",
        [](const py::tuple& shape, const py::object& x, const py::object& h0, const py::object& c0,
           const py::list& weights, const py::list& ys, const py::object& reserve, const py::object& dy,
           const py::object& dh_n, const py::object& dc_n, const py::object& dx, const py::object& dh0,
           const py::object& dc0, const py::list& grads, bool accumulate) {
          const RnnShape s = rnn_shape(shape);
          if (py::isinstance<py::array_t<float>>(x))
            return rnn_backward_impl<float>(s, x, h0, c0, weights, ys, reserve, dy, dh_n, dc_n, dx, dh0, dc0, grads,
                                             accumulate);
          if (py::isinstance<py::array_t<double>>(x))
            return rnn_backward_impl<double>(s, x, h0, c0, weights, ys, reserve, dy, dh_n, dc_n, dx, dh0, dc0, grads,
                                              accumulate);
          throw py::type_error("rnn: x must be float32 or float64");
        },
        py::arg("shape"), py::arg("x"), py::arg("h0"), py::arg("c0"), py::arg("weights"), py::arg("ys"),
        py::arg("reserve"), py::arg("dy"), py::arg("dh_n"), py::arg("dc_n"), py::arg("dx"), py::arg("dh0"),
        py::arg("dc0"), py::arg("grads"), py::arg("accumulate") = false,
        "Backward through time from rnn_forward's x, h0, c0, ys and reserve. dy, dh_n, dc_n may be None (zeros);\n"
        "writes dx, dh0, dc0 (LSTM; may be None) and grads ([dw_ih, dw_hh, db_ih, db_hh] per layer-direction),\n"
        "or with accumulate adds the weight and bias gradients to what grads hold.");

  m.def("rnn_reserve_elems", [](const py::tuple& shape) { return rnn_reserve_elems(rnn_shape(shape)); },
        py::arg("shape"), "Elements of the reserve rnn_forward fills for rnn_backward.");

  m.def("rnn_uses_wavefront",
        [](const py::tuple& shape, int itemsize) { return rnn_uses_wavefront(rnn_shape(shape), itemsize); },
        py::arg("shape"), py::arg("itemsize"),
        "Whether rnn_forward pipelines the layers (one thread per layer, chunks of steps) for this shape.");

  m.def("rnn_splits_rows",
        [](const py::tuple& shape, int itemsize) { return rnn_splits_rows(rnn_shape(shape), itemsize); },
        py::arg("shape"), py::arg("itemsize"),
        "Whether the threads of a direction split the time loop by batch rows (no barrier a step) for this shape.");

  m.def("rnn_panel_share_test",
        [](int nt, index_t panels, index_t steps, int max_spin) {
          if (nt < 1 || nt > 64 || panels < 0 || steps < 0 || max_spin < 0)
            throw py::value_error("rnn_panel_share_test: nt in [1, 64], panels, steps and max_spin >= 0");
          index_t errors = 0, stolen = 0;
          {
            py::gil_scoped_release nogil;
            rnn_panel_share_test(nt, panels, steps, max_spin, &errors, &stolen);
          }
          return py::make_tuple(errors, stolen);
        },
        py::arg("nt"), py::arg("panels"), py::arg("steps"), py::arg("max_spin"),
        "Test of the RNN step's work sharing: (panels not run exactly once, panels run by a non-owner).");

  m.def("rnn_math_test", [](int fn, const py::array& x, py::array& y) {
    if (fn < 0 || fn > 4)
      throw py::value_error("rnn_math_test: fn must be 0 (exp), 1 (sigmoid), 2 (tanh), 3 (gelu) or 4 (gelu')");
    auto run = [&](auto tag) {
      using T = decltype(tag);
      const T* xp = rnn_arg<T>(x, x.size(), "x", false);
      T* yp = rnn_arg<T>(y, x.size(), "y", true);
      py::gil_scoped_release nogil;
      rnn_math_test<T>(fn, xp, yp, x.size());
    };
    if (is_f32(x)) run(float{});
    else if (is_f64(x)) run(double{});
    else throw py::type_error("rnn_math_test: x must be float32 or float64");
  }, "Test-only: the vector exp (0), sigmoid (1), tanh (2), gelu (3) or gelu's derivative (4) on a contiguous array, into y.");

  m.def("detected_isa", [] { return std::string(isa_name(max_isa())); },
        "The highest vector ISA the kernels may use: the CPU's and the OS's, within this build and DNNKIT_ISA.");
  m.def("cpu_level", [] { return std::string(level_name(cpu_level())); },
        "What this CPU and OS run: 'ref', 'avx2', 'avx512' or 'amx' (CPUID and XGETBV; the tile data granted).");
  m.def("built_level", [] { return std::string(level_name(built_level())); },
        "The highest level whose kernels this build of dnnkit contains.");
  m.def("level_limit", [] { return std::string(level_name(level_limit())); },
        "DNNKIT_ISA's cap on the kernels' level ('amx' when unset).");
  m.def("invalid_isa_limit", [] {
    const char* v = invalid_isa_limit();
    return v ? py::object(py::str(v)) : py::object(py::none());
  }, "DNNKIT_ISA's value where it names no level (it is then ignored), else None.");
  m.def("max_level", [] { return std::string(level_name(max_level())); },
        "The highest level the kernels may use: the least of cpu_level, built_level and level_limit.");
  m.def("active_isa", [] { return std::string(isa_name(active_isa())); });
  m.def("set_isa", [](const std::string& name) {
    try {
      set_isa(isa_from_name(name));
      ++g_settings_generation;
    } catch (const std::invalid_argument& e) {
      throw py::value_error(e.what());
    }
  });
  m.def("settings_generation", [] { return g_settings_generation; },
        "A count bumped by set_isa, set_amx and set_num_threads: what a remembered choice was made under.");
  m.def("amx_available", &amx::available,
        "Whether the kernels may use AMX-BF16 tiles (float32 products split into bfloat16 parts, amx.h): the "
        "CPU and OS run them, this build has them, DNNKIT_ISA allows them.");
  m.def("amx_enabled", &amx::enabled, "Whether float32 products run on AMX tiles where they can.");
  m.def("amx_takes_shape", [](index_t m, index_t n, index_t k) { return amx::active() && amx::shape_fits(m, n, k); },
        py::arg("m"), py::arg("n"), py::arg("k"),
        "Whether the blocked GEMM runs a float32 m x n x k product on AMX tiles now (the tiles active and the shape\n"
        "one they take), provided every value of both operands splits into bfloat16 parts (amx.h).");
  m.def("measure_amx_peak_gflops", [](int nthreads, double seconds) {
    if (nthreads < 1) throw py::value_error("measure_amx_peak_gflops: nthreads must be >= 1");
    if (!amx::available()) return 0.0;
    py::gil_scoped_release nogil;
    return amx::measure_peak_gflops(nthreads, seconds);
  }, py::arg("nthreads"), py::arg("seconds") = 0.2,
     "GFLOP/s of bfloat16 tile products on nthreads threads (0 without AMX); a float32 product costs six.");
  m.def("set_amx", [](bool on) {
    try {
      amx::set_enabled(on);
      ++g_settings_generation;
    } catch (const std::invalid_argument& e) {
      throw py::value_error(e.what());
    }
  }, py::arg("on"));
  m.def("cpu_model_name", &cpu_model_name);
  m.def("l1d_cache_bytes", &l1d_cache_bytes, "Bytes of L1 data cache per core (CPUID), as the blocking sees it.");
  m.def("l2_cache_bytes", &l2_cache_bytes, "Bytes of L2 cache per core (CPUID), as the blocking sees it.");
  m.def("l3_cache_bytes", &l3_cache_bytes, "Bytes of L3 cache (CPUID; shared; 0: none), as the blocking sees it.");
  m.def("get_num_threads", &get_num_threads);
  m.def("set_num_threads", [](int n) {
    if (n < 1) throw py::value_error("set_num_threads: n must be >= 1");
    set_num_threads(n);
    ++g_settings_generation;
  });
  m.def("block_cache_release", [] { return block_cache_release(); },
        "Frees the blocks kept for reuse (DNNKIT_BLOCK_CACHE_MB); returns the bytes released.");
  m.def("block_cache_bytes", [] { return block_cache_bytes(); }, "Bytes of blocks now kept for reuse.");
  m.def("empty", [](const py::iterable& dims, int itemsize) -> py::array {
    std::vector<py::ssize_t> shape;
    for (const py::handle d : dims) {
      const py::ssize_t v = PyLong_AsSsize_t(py::int_(py::reinterpret_borrow<py::object>(d)).ptr());
      if (v == -1 && PyErr_Occurred()) {  // past py::ssize_t: no such array fits in memory
        PyErr_Clear();
        throw std::bad_alloc();
      }
      shape.push_back(v);
    }
    if (itemsize == 4) return new_output<float>(shape);
    if (itemsize == 8) return new_output<double>(shape);
    throw py::value_error("empty: itemsize must be 4 (float32) or 8 (float64)");
  }, py::arg("shape"), py::arg("itemsize"),
     "An uninitialised C-contiguous float32 or float64 array; from 128 KiB up, its memory comes from the block "
     "cache and goes back to it when the array is freed (outputs that do not fault in fresh pages at every call).");
  m.def("scratch", [](std::size_t nbytes) -> py::array {
    if (nbytes > static_cast<std::size_t>(PTRDIFF_MAX)) throw std::bad_alloc();  // MemoryError
    return buffer_array<std::uint8_t>({static_cast<py::ssize_t>(nbytes)}, std::max<std::size_t>(nbytes, 1));
  }, "An uninitialised, 64-byte aligned byte array; blocks of 128 KiB and up come from the block cache and go "
     "back to it when the array is freed.");
  m.def("set_min_parallel_work", [](double fmas) { set_min_parallel_work(fmas); }, py::arg("fmas"),
        "Test-only: multiply-adds below which a GEMM runs on one thread (default 2^17; 0: always threaded).");
  m.def("min_parallel_work", [] { return min_parallel_work(); });
  m.def("has_openmp", [] {
#ifdef _OPENMP
    return true;
#else
    return false;
#endif
  });
}
