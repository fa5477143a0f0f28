// Hooks the tests call to reach single kernels: a micro-kernel on packed panels, an AMX tile product,
// the RNN panel sharing and gate math.
#include "common.h"

namespace dnnkit {
namespace bindings {

namespace {

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

}  // namespace

void bind_testing(py::module_& m) {
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
}

}  // namespace bindings
}  // namespace dnnkit
