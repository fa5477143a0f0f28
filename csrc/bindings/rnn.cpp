// The fused RNN forward and backward.
#include "common.h"

namespace dnnkit {
namespace bindings {

namespace {

// ------------------------------------------------------------------------------------------------- RNN
// The Python layer (dnnkit.rnn) validates shapes with operator-named errors and passes C-contiguous
// arrays of one dtype; these checks only keep direct callers from crashing the process.

// (cell, T, B, I, H, L, D[, P[, schedule[, cell path[, tiles]]]]) with cell 0 lstm, 1 gru, 2 rnn_tanh,
// 3 rnn_relu; P the LSTM projection size (0 or absent: none); schedule an RnnSchedule, cell path an
// RnnCellPath, tiles an RnnTiles (each 0 or absent: automatic).
RnnShape rnn_shape(const py::tuple& t) {
  if (t.size() < 7 || t.size() > 11)
    throw py::value_error("rnn: shape tuple must be (cell, T, B, I, H, L, D[, P[, schedule[, cell path[, tiles]]]])");
  index_t v[11] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  for (std::size_t i = 0; i < t.size(); ++i) v[i] = t[i].cast<index_t>();
  if (v[0] < 0 || v[0] > 3) throw py::value_error("rnn: cell code must be in 0..3");
  for (int i = 1; i < 11; ++i)
    if (v[i] < 0) throw py::value_error("rnn: shape entries must be >= 0");
  if (v[8] > 3) throw py::value_error("rnn: schedule must be in 0..3");
  if (v[9] > 3) throw py::value_error("rnn: cell path must be in 0..3");
  if (v[10] > 2) throw py::value_error("rnn: tiles must be in 0..2");
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
  s.cell_path = static_cast<RnnCellPath>(v[9]);
  s.tiles = static_cast<RnnTiles>(v[10]);
  return s;
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

void bind_rnn(py::module_& m) {
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

  m.def("rnn_cell_path",
        [](const py::tuple& shape, int itemsize) {
          const RnnShape s = rnn_shape(shape);
          return static_cast<int>(rnn_cell_path(s, s.input, itemsize));
        },
        py::arg("shape"), py::arg("itemsize"),
        "The path (RnnCellPath: 1 direct, 2 dots, 3 gemm) a one-step first layer takes from a given h0, AMX\n"
        "tiles aside.");

  m.def("rnn_splits_rows",
        [](const py::tuple& shape, int itemsize) { return rnn_splits_rows(rnn_shape(shape), itemsize); },
        py::arg("shape"), py::arg("itemsize"),
        "Whether the threads of a direction split the time loop by batch rows (no barrier a step) for this shape.");
}

}  // namespace bindings
}  // namespace dnnkit
