#include "cpu_info.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>

#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#ifdef __linux__
#include <sys/syscall.h>
#endif

#include "common.h"

namespace dnnkit {

namespace {

#if defined(__x86_64__) || defined(__i386__)
// XCR0, the state components the OS saves on a context switch.
unsigned long long xcr0() {
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<unsigned long long>(hi) << 32) | lo;
}

Level detect_level() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return Level::ref;
  const bool osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
  if (!(osxsave && avx && fma && f16c)) return Level::ref;
  const unsigned long long xcr = xcr0();
  if ((xcr & 0x6) != 0x6) return Level::ref;  // SSE and AVX state
  if (__get_cpuid_max(0, nullptr) < 7) return Level::ref;
  __cpuid_count(7, 0, a, b, c, d);
  const bool avx2 = (b >> 5) & 1;
  if (!avx2) return Level::ref;
  const bool avx512 = ((b >> 16) & 1) && ((b >> 17) & 1) && ((b >> 30) & 1) && ((b >> 31) & 1);  // F, DQ, BW, VL
  if (!avx512 || (xcr & 0xe0) != 0xe0) return Level::avx2;  // opmask, ZMM_Hi256, Hi16_ZMM state
  const bool amx_bf16 = (d >> 22) & 1, amx_tile = (d >> 24) & 1;
  __cpuid_count(7, 1, a, b, c, d);
  const bool avx512_bf16 = (a >> 5) & 1;
  if (!(amx_bf16 && amx_tile && avx512_bf16) || (xcr & 0x60000) != 0x60000) return Level::avx512;  // XTILECFG, XTILEDATA
#if defined(__linux__) && DNNKIT_HAVE_AMX
  // Linux hands out the tile data on request (ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), once a process;
  // asked only by a module that has tile kernels.
  if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) return Level::avx512;
#endif
  return Level::amx;
}
#else
Level detect_level() { return Level::ref; }
#endif

Level min_level(Level a, Level b) { return static_cast<int>(a) < static_cast<int>(b) ? a : b; }

struct Limit {
  Level level = Level::amx;
  const char* invalid = nullptr;
};

const Limit& limit() {
  static const Limit l = [] {
    Limit r;
    const char* env = std::getenv("DNNKIT_ISA");
    if (!env || !*env) return r;
    try {
      r.level = level_from_name(env);
    } catch (const std::invalid_argument&) {
      r.invalid = env;
    }
    return r;
  }();
  return l;
}

std::atomic<int> g_isa_override{-1};

}  // namespace

Level cpu_level() {
  static const Level level = detect_level();
  return level;
}

Level built_level() {
#if DNNKIT_HAVE_AMX
  return Level::amx;
#elif DNNKIT_HAVE_AVX512
  return Level::avx512;
#elif DNNKIT_HAVE_AVX2
  return Level::avx2;
#else
  return Level::ref;
#endif
}

Level level_limit() { return limit().level; }
const char* invalid_isa_limit() { return limit().invalid; }

Level max_level() { return min_level(min_level(cpu_level(), built_level()), level_limit()); }

Isa max_isa() { return static_cast<Isa>(static_cast<int>(min_level(max_level(), Level::avx512))); }

Isa active_isa() {
  int o = g_isa_override.load(std::memory_order_relaxed);
  return o < 0 ? max_isa() : static_cast<Isa>(o);
}

void set_isa(Isa isa) {
  if (static_cast<int>(isa) > static_cast<int>(max_isa())) {
    std::string why = static_cast<int>(isa) > static_cast<int>(cpu_level()) ? "this CPU or OS does not run "
                      : static_cast<int>(isa) > static_cast<int>(built_level()) ? "this build of dnnkit has no kernels for "
                                                                             : "DNNKIT_ISA caps the kernels below ";
    throw std::invalid_argument("set_isa: " + why + isa_name(isa));
  }
  g_isa_override.store(static_cast<int>(isa));
}

const char* isa_name(Isa isa) { return level_name(static_cast<Level>(static_cast<int>(isa))); }

Isa isa_from_name(const std::string& name) {
  if (name == "avx512") return Isa::avx512;
  if (name == "avx2") return Isa::avx2;
  if (name == "ref") return Isa::ref;
  throw std::invalid_argument("set_isa: isa must be one of 'ref', 'avx2', 'avx512', got '" + name + "'");
}

const char* level_name(Level level) {
  switch (level) {
    case Level::amx: return "amx";
    case Level::avx512: return "avx512";
    case Level::avx2: return "avx2";
    default: return "ref";
  }
}

Level level_from_name(const std::string& name) {
  for (Level l : {Level::ref, Level::avx2, Level::avx512, Level::amx})
    if (name == level_name(l)) return l;
  throw std::invalid_argument("DNNKIT_ISA must be one of 'ref', 'avx2', 'avx512', 'amx', got '" + name + "'");
}

std::string cpu_model_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto pos = line.find(':');
      if (pos != std::string::npos) return line.substr(pos + 2);
    }
  }
  return "unknown";
}

namespace {

struct Caches {
  long l1d = 0, l2 = 0, l3 = 0;
};

// Data and unified caches by level from the CPU's deterministic cache parameters: CPUID leaf 4 (Intel)
// or 0x8000001D (AMD, with topology extensions). Zero where a level is not reported.
Caches cpuid_caches() {
  Caches out;
#if defined(__x86_64__) || defined(__i386__)
  unsigned a, b, c, d;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return out;
  const bool amd = b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u;  // "AuthenticAMD"
  unsigned leaf = 4;
  if (amd) {
    if (__get_cpuid_max(0x80000000u, nullptr) < 0x8000001Du) return out;
    __cpuid(0x80000001u, a, b, c, d);
    if (!((c >> 22) & 1)) return out;  // TOPOEXT
    leaf = 0x8000001Du;
  } else if (a < 4) {
    return out;
  }
  for (unsigned i = 0; i < 16; ++i) {
    __cpuid_count(leaf, i, a, b, c, d);
    const unsigned type = a & 31, level = (a >> 5) & 7;
    if (type == 0) break;
    if (type != 1 && type != 3) continue;  // data or unified
    const long bytes = long((b >> 22) + 1) * long(((b >> 12) & 0x3ff) + 1) * long((b & 0xfff) + 1) * long(c + 1);
    if (level == 1) out.l1d = bytes;
    if (level == 2) out.l2 = bytes;
    if (level == 3) out.l3 = bytes;
  }
#endif
  return out;
}

// A level's size from sysconf, else /sys (what the OS reports on any architecture); 0 where neither answers.
long os_cache_bytes(int level) {
  long b = 0;
#if defined(_SC_LEVEL1_DCACHE_SIZE) && defined(_SC_LEVEL2_CACHE_SIZE) && defined(_SC_LEVEL3_CACHE_SIZE)
  b = sysconf(level == 1 ? _SC_LEVEL1_DCACHE_SIZE : level == 2 ? _SC_LEVEL2_CACHE_SIZE : _SC_LEVEL3_CACHE_SIZE);
#endif
  for (int i = 0; b <= 0 && i < 8; ++i) {  // /sys/.../cache/indexN: level, type, size such as "1024K"
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream lv_file(dir + "level"), type_file(dir + "type"), size_file(dir + "size");
    int lv = 0;
    std::string type, sz;
    if (!(lv_file >> lv) || !(size_file >> sz)) break;
    type_file >> type;
    if (lv != level || sz.empty() || type == "Instruction") continue;
    try {
      b = std::stol(sz) * (sz.back() == 'K' ? 1024L : sz.back() == 'M' ? 1024L * 1024L : 1L);
    } catch (const std::exception&) {
      b = 0;
    }
  }
  return b > 0 ? b : 0;
}

const Caches& caches() {
  static const Caches c = [] {
    Caches r = cpuid_caches();
    // The OS's answer where CPUID gives none; then the smallest of current x86 server cores.
    if (r.l1d <= 0) r.l1d = os_cache_bytes(1);
    if (r.l2 <= 0) r.l2 = os_cache_bytes(2);
    if (r.l3 <= 0) r.l3 = os_cache_bytes(3);
    if (r.l1d <= 0) r.l1d = 32L << 10;
    if (r.l2 <= 0) r.l2 = 512L << 10;
    if (r.l3 <= 0) r.l3 = 0;  // none
    return r;
  }();
  return c;
}

}  // namespace

long l1d_cache_bytes() { return caches().l1d; }
long l2_cache_bytes() { return caches().l2; }
long l3_cache_bytes() { return caches().l3; }

int fma_datapath_bits() {
#if defined(__x86_64__) || defined(__i386__)
  static const int bits = [] {
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return 128;
    const bool amd = b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u;    // "AuthenticAMD"
    const bool hygon = b == 0x6f677948u && d == 0x6e65476eu && c == 0x656e6975u;  // "HygonGenuine"
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 128;
    const unsigned base = (a >> 8) & 0xf;
    const unsigned family = base == 0xf ? base + ((a >> 20) & 0xff) : base;
    const unsigned model = ((a >> 4) & 0xf) | (base == 0x6 || base == 0xf ? ((a >> 16) & 0xf) << 4 : 0);
    if (hygon || (amd && (family < 0x17 || (family == 0x17 && model < 0x30)))) return 128;
    if (amd && family < 0x1a) return 256;
    if (amd) return 512;
    return static_cast<int>(cpu_level()) >= static_cast<int>(Level::avx512) ? 512 : 256;
  }();
  return bits;
#else
  return 128;
#endif
}

static std::atomic<double> g_min_parallel_work{double(1 << 17)};

double min_parallel_work() { return g_min_parallel_work.load(std::memory_order_relaxed); }
void set_min_parallel_work(double fmas) { g_min_parallel_work.store(fmas < 0 ? 0 : fmas); }

static std::atomic<double> g_past_caches_bytes{-1};

double past_caches_bytes() {
  const double set = g_past_caches_bytes.load(std::memory_order_relaxed);
  if (set >= 0) return set;
  const double l2 = double(l2_cache_bytes()), l3 = double(l3_cache_bytes());
  return l3 > 0 ? std::min(l3, 16 * l2) : l2;
}
void set_past_caches_bytes(double bytes) { g_past_caches_bytes.store(bytes < 0 ? -1 : bytes); }

static std::atomic<int> g_num_threads{0};

int get_num_threads() {
  int n = g_num_threads.load(std::memory_order_relaxed);
  if (n > 0) return n;
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

void set_num_threads(int n) {
  if (n < 1 || n > kMaxThreads)
    throw std::invalid_argument("set_num_threads: n must be between 1 and " + std::to_string(kMaxThreads) + ", got " +
                                std::to_string(n));
  g_num_threads.store(n);
}

}  // namespace dnnkit
