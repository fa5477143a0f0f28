#include "kernels.h"

#include <vector>

namespace dnnkit {

namespace {
std::vector<ConvKernel>& table() {
  static std::vector<ConvKernel> kernels;  // built while the module loads, read-only after
  return kernels;
}
}  // namespace

bool register_conv_kernel(const ConvKernel& k) {
  table().push_back(k);
  return true;
}

const ConvKernel* find_conv_kernel(const std::string& direction, const std::string& name) {
  for (const ConvKernel& k : table())
    if (direction == k.direction && name == k.name) return &k;
  return nullptr;
}

}  // namespace dnnkit
