// The machine and the settings: instruction sets, AMX, caches, threads, the block cache, the FMA peak.
#include "common.h"

namespace dnnkit {
namespace bindings {

namespace {

// Bumped by every setting a dispatch decision depends on (settings_generation): the ISA, AMX, threads.
unsigned long long g_settings_generation = 0;


}  // namespace

void bind_runtime(py::module_& m) {
  m.def("amx_splittable", [](const py::array& x) {
    if (!amx::available()) throw py::value_error("amx_splittable: AMX tiles are not available");
    const View2D v = view2d<float>(x, "amx_splittable", "x");
    return amx::splittable(v.rows, v.cols, static_cast<const float*>(x.data()), v.rs, v.cs);
  }, "Test-only: whether every value of a float32 2-D view splits exactly into AMX's bfloat16 parts.");

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

  m.def("fma_datapath_bits", &fma_datapath_bits,
        "Bits of a vector FMA each of a core's FMA pipes executes in one pass (128, 256 or 512).");

  m.def("get_num_threads", &get_num_threads);

  m.def("set_num_threads", [](int n) {
    try {
      set_num_threads(n);
    } catch (const std::invalid_argument& e) {
      throw py::value_error(e.what());
    }
    ++g_settings_generation;
  });

  m.def("block_cache_release", [] { return block_cache_release(); },
        "Frees the blocks kept for reuse (DNNKIT_BLOCK_CACHE_MB); returns the bytes released.");

  m.def("block_cache_bytes", [] { return block_cache_bytes(); }, "Bytes of blocks now kept for reuse.");

  m.attr("RECYCLE_BYTES") = py::int_(kRecycleBytes);  // empty's and scratch's smallest block-cache block
  m.attr("MAX_THREADS") = py::int_(kMaxThreads);      // the most threads set_num_threads takes

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

  m.def("set_past_caches_bytes", [](double bytes) { set_past_caches_bytes(bytes); }, py::arg("bytes"),
        "Test-only: bytes of output from which a kernel that only writes it stores past the caches (default, "
        "or negative: the last-level cache's size).");

  m.def("past_caches_bytes", [] { return past_caches_bytes(); });

  m.def("has_openmp", [] {
#ifdef _OPENMP
    return true;
#else
    return false;
#endif
  });
}

}  // namespace bindings
}  // namespace dnnkit
