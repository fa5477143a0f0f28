// What the binding files share: array views and checks, outputs from the block cache, and the packed
// weight type (one type for the whole module: the GEMM and RNN bindings both take it).
#pragma once
#include <pybind11/complex.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <complex>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "../common.h"
#include "../cpu_info.h"
#include "../conv/conv.h"
#include "../conv/fft.h"
#include "../conv/kernels.h"
#include "../conv/winograd.h"
#include "../eltwise/eltwise.h"
#include "../gemm/amx.h"
#include "../gemm/blocking.h"
#include "../gemm/gemm.h"
#include "../gemm/ukernel.h"
#include "../rnn/rnn.h"

namespace dnnkit {
namespace bindings {

namespace py = pybind11;

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

inline Activation activation_from_int(int act) {
  if (act < 0 || act > 4) throw py::value_error("activation code must be in 0..4");
  return static_cast<Activation>(act);
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

template <typename T>
py::array_t<T> contiguous(const py::object& x, const char* op, const char* name) {
  auto arr = py::array_t<T, py::array::c_style>::ensure(x);
  if (!arr) throw py::type_error(std::string(op) + ": " + name + " must be a contiguous array of the right dtype");
  return arr;
}

inline bool is_f32(const py::array& x) { return py::isinstance<py::array_t<float>>(x) && x.itemsize() == 4; }
inline bool is_f64(const py::array& x) { return py::isinstance<py::array_t<double>>(x) && x.itemsize() == 8; }

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

// Each family's functions, added to the module by module.cpp.
void bind_gemm(py::module_& m);
void bind_conv(py::module_& m);
void bind_rnn(py::module_& m);
void bind_runtime(py::module_& m);
void bind_testing(py::module_& m);

}  // namespace bindings
}  // namespace dnnkit
