// dnnkit._cpu_detect: which instruction-set level this CPU and OS run, asked before any kernel module is
// imported (python/dnnkit/_cpu.py picks the module of that level). Compiled for the baseline only.
#include <pybind11/pybind11.h>

#include "cpu_info.h"

namespace py = pybind11;

PYBIND11_MODULE(DNNKIT_MODULE, m) {
  m.doc() = "dnnkit: the CPU's instruction-set level, before a kernel module is chosen";
  m.def("cpu_level", [] { return std::string(dnnkit::level_name(dnnkit::cpu_level())); },
        "What this CPU and OS run: 'ref', 'avx2', 'avx512' or 'amx' (CPUID and XGETBV).");
  m.def("level_limit", [] { return std::string(dnnkit::level_name(dnnkit::level_limit())); },
        "DNNKIT_ISA's cap on the kernels' level ('amx' when unset or invalid).");
  m.def("invalid_isa_limit", [] {
    const char* v = dnnkit::invalid_isa_limit();
    return v ? py::object(py::str(v)) : py::object(py::none());
  }, "DNNKIT_ISA's value where it names no level (it is then ignored), else None.");
}
