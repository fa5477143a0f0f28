#include "cpu_info.h"

#include <atomic>
#include <fstream>
#include <stdexcept>
#include <string>

#include <unistd.h>

#include "common.h"

namespace dnnkit {

Isa detected_isa() {
#if defined(__x86_64__) || defined(__i386__)
  static const Isa isa = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return Isa::avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::avx2;
    return Isa::ref;
  }();
  return isa;
#else
  return Isa::ref;
#endif
}

static std::atomic<int> g_isa_override{-1};

Isa active_isa() {
  int o = g_isa_override.load(std::memory_order_relaxed);
  return o < 0 ? detected_isa() : static_cast<Isa>(o);
}

void set_isa(Isa isa) {
  if (static_cast<int>(isa) > static_cast<int>(detected_isa()))
    throw std::invalid_argument(std::string("set_isa: this CPU does not support ") + isa_name(isa));
  g_isa_override.store(static_cast<int>(isa));
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::avx512: return "avx512";
    case Isa::avx2: return "avx2";
    default: return "ref";
  }
}

Isa isa_from_name(const std::string& name) {
  if (name == "avx512") return Isa::avx512;
  if (name == "avx2") return Isa::avx2;
  if (name == "ref") return Isa::ref;
  throw std::invalid_argument("set_isa: isa must be one of 'ref', 'avx2', 'avx512', got '" + name + "'");
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

long l2_cache_bytes() {
  static const long bytes = [] {
    long b = 0;
#ifdef _SC_LEVEL2_CACHE_SIZE
    b = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
    for (int i = 0; b <= 0 && i < 8; ++i) {  // /sys/.../cache/indexN: level, size such as "1024K"
      const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
      std::ifstream level(dir + "level"), size(dir + "size");
      int lv = 0;
      std::string sz;
      if (!(level >> lv) || !(size >> sz)) break;
      if (lv != 2 || sz.empty()) continue;
      try {
        b = std::stol(sz) * (sz.back() == 'K' ? 1024L : sz.back() == 'M' ? 1024L * 1024L : 1L);
      } catch (const std::exception&) {
        b = 0;
      }
    }
    return b > 0 ? b : 512L * 1024L;
  }();
  return bytes;
}

static std::atomic<double> g_min_parallel_work{double(1 << 17)};

double min_parallel_work() { return g_min_parallel_work.load(std::memory_order_relaxed); }
void set_min_parallel_work(double fmas) { g_min_parallel_work.store(fmas < 0 ? 0 : fmas); }

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
  if (n < 1) throw std::invalid_argument("set_num_threads: n must be >= 1");
  g_num_threads.store(n);
}

}  // namespace dnnkit
