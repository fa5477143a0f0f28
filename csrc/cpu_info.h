// Run-time CPU feature detection and the instruction-set selection used by every kernel family.
#pragma once
#include <string>

namespace dnnkit {

enum class Isa { ref = 0, avx2 = 1, avx512 = 2 };

// Best ISA this CPU supports (CPUID), ignoring any override.
Isa detected_isa();
// ISA kernels use now: detected_isa() unless lowered by set_isa() (tests use this to reach every kernel).
Isa active_isa();
// Selects an ISA no higher than detected_isa(); throws std::invalid_argument otherwise.
void set_isa(Isa isa);
const char* isa_name(Isa isa);
Isa isa_from_name(const std::string& name);
std::string cpu_model_name();
// Bytes of L2 cache per core (sysconf, else /sys; 512 KiB, the smallest of current x86 server cores, if
// neither answers). The GEMM's NC is sized from it (blocking.h).
long l2_cache_bytes();

}  // namespace dnnkit
