// The GEMM, fully-connected and element-wise kernels, and pack_weight.
#include "common.h"

namespace dnnkit {
namespace bindings {

namespace {

template <typename T>
void gemm_impl(const py::array& a, const py::array& b, py::array& c, double alpha, double beta,
               const py::object& bias, int act, int nthreads, int kind) {
  // kind: 0 gemm (blocked: every path), 1 gemm_small_m, 2 gemm_wt_direct, 3 the Goto/BLIS path alone,
  // 4 gemm_stream where the operands' strides let it run (else as 0), 5 AMX tiles where they take the
  // product (float32; else the Goto/BLIS path)
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
    if constexpr (std::is_same_v<T, float>)
      if (kind == 5 && g.k > 0 && amx::gemm(g, nthreads)) return;
    if (kind == 3 || kind == 5) g.path = GemmPath::goto_only;
    gemm<T>(g, nthreads);
  }
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

// y (x.shape[:-1] + (n,)) := act(x W^T + bias) on a weight packed by pack_weight; x of the weight's
// dtype, rows copied to contiguous when they are not.
template <typename T>
py::array linear_prepacked_impl(const py::array& x, const PackedWeight& pw, const py::object& bias, int act,
                                const py::object& out) {
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
  CArr y;
  if (out.is_none()) {
    y = new_output<T>(shape);
  } else {
    // The caller's output: C-contiguous, writable, of the input's dtype and m x n elements (a plan's run).
    if (!py::isinstance<CArr>(out)) throw py::type_error("linear: out must be a C-contiguous array of the input's dtype");
    y = py::reinterpret_borrow<CArr>(out);
    if (!y.writeable() || y.size() != m * n || !(y.flags() & py::array::c_style))
      throw py::value_error("linear: out must be a writable C-contiguous array of the output's size");
  }
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

}  // namespace

void bind_gemm(py::module_& m) {
  m.def("gemm",
        [](const py::array& a, const py::array& b, py::array& c, double alpha, double beta, const py::object& bias,
           int act, int nthreads, int path) {
          if (path < 0 || path > 3)
            throw py::value_error("gemm: path must be 0 (any), 1 (Goto/BLIS), 2 (stream) or 3 (AMX tiles)");
          const int kind = path == 0 ? 0 : path + 2;
          if (is_f32(c)) return gemm_impl<float>(a, b, c, alpha, beta, bias, act, nthreads, kind);
          if (is_f64(c)) return gemm_impl<double>(a, b, c, alpha, beta, bias, act, nthreads, kind);
          throw py::type_error("gemm: c must be float32 or float64");
        },
        py::arg("a"), py::arg("b"), py::arg("c"), py::arg("alpha") = 1.0, py::arg("beta") = 0.0,
        py::arg("bias") = py::none(), py::arg("activation") = 0, py::arg("nthreads") = 0, py::arg("path") = 0,
        "C := act(alpha*A@B + beta*C + bias) on 2-D strided arrays of one dtype; C is not read when beta == 0.\n"
        "path: 0 every path (blocked_gemm), 1 Goto/BLIS alone (gemm_goto), 2 the streamed products where the\n"
        "operands let them run, else as 0 (gemm_stream), 3 AMX tiles where they take the product (float32),\n"
        "else as 1 (gemm_amx).");

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
        [](const py::array& x, const PackedWeight& w, const py::object& bias, int act, const py::object& out) -> py::array {
          if (w.itemsize == 4) return linear_prepacked_impl<float>(x, w, bias, act, out);
          return linear_prepacked_impl<double>(x, w, bias, act, out);
        },
        py::arg("x"), py::arg("weight"), py::arg("bias") = py::none(), py::arg("activation") = 0,
        py::arg("out") = py::none(),
        "y := act(x @ W.T + bias) for x (..., in_features) and W packed by PackedWeight: into out (C-contiguous,\n"
        "of the output's size) where given, else a new array.");

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
}

}  // namespace bindings
}  // namespace dnnkit
