// Run-time CPU feature detection and the instruction-set selection used by every kernel family.
//
// Levels, lowest first; a level's CPUs run every level before it, and each level's kernels live in
// their own files (*_avx2.cpp, *_avx512.cpp, *_amx.cpp), compiled with that level's flags only (setup.py):
//   ref     the portable kernels (baseline x86-64, or any architecture)
//   avx2    AVX2, FMA and F16C, with the OS saving the YMM state (XCR0 bits 1-2)
//   avx512  AVX-512 F, BW, DQ and VL, with the OS saving the opmask and ZMM state (XCR0 bits 5-7)
//   amx     avx512 with AVX512-BF16 and AMX-TILE/AMX-BF16, the OS saving the tile state (XCR0 bits
//           17-18) and, on Linux, granting this process the tile data (arch_prctl ARCH_REQ_XCOMP_PERM)
// A level is used only where the CPU has it (CPUID), the OS enables it (XGETBV), this build contains its
// kernels (DNNKIT_HAVE_<LEVEL>) and DNNKIT_ISA (read once, at first use) does not cap it below.
#pragma once
#include <string>

namespace dnnkit {

enum class Level { ref = 0, avx2 = 1, avx512 = 2, amx = 3 };
// The vector ISA of the FMA kernels: the levels without the tiles (amx's is avx512).
enum class Isa { ref = 0, avx2 = 1, avx512 = 2 };

// What this CPU and OS run, whatever the build and DNNKIT_ISA.
Level cpu_level();
// The highest level whose kernels this build contains.
Level built_level();
// DNNKIT_ISA's cap (amx when unset, or when its value names no level: invalid_isa_limit() is then set).
Level level_limit();
const char* invalid_isa_limit();  // the unrecognized DNNKIT_ISA value, or null
// The highest level the kernels may use: the least of the three above.
Level max_level();

// The highest vector ISA the kernels may use (max_level without the tiles).
Isa max_isa();
// The vector ISA the kernels use now: max_isa() unless lowered by set_isa() (tests use this to reach every kernel).
Isa active_isa();
// Selects an ISA no higher than max_isa(); throws std::invalid_argument otherwise.
void set_isa(Isa isa);
const char* isa_name(Isa isa);
Isa isa_from_name(const std::string& name);
const char* level_name(Level level);
// Throws std::invalid_argument for a name that is not a level.
Level level_from_name(const std::string& name);

std::string cpu_model_name();
// Cache sizes in bytes, as the CPU reports them (CPUID's deterministic cache parameters: leaf 4 on Intel,
// 0x8000001D on AMD), else as the OS does (sysconf, /sys): the L1 data cache and the L2 of a core, and
// the L3 (shared; 0 where there is none). Without an answer: 32 KiB and 512 KiB, the smallest of current
// x86 server cores. The GEMM's blocking is sized from them (blocking.h).
long l1d_cache_bytes();
long l2_cache_bytes();
long l3_cache_bytes();
// Bits of a vector FMA a core's two FMA pipes each execute in one pass (a wider instruction takes
// several): 128 on AMD's families before Zen 2 (Bulldozer to Zen+, Hygon's Zen), 256 on Zen 2 to Zen 4
// and on Intel cores without AVX-512, 512 on Zen 5 and on Intel cores with AVX-512. The cost model's
// nominal peak follows it (backends/cpu.py flops_per_cycle).
int fma_datapath_bits();

}  // namespace dnnkit
