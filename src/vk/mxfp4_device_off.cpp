// vk/mxfp4_device.h in a build without K3_VULKAN (no Vulkan headers or glslc at configure time):
// asking for a device is an error that says how to get one.
#include "util/error.h"
#include "vk/mxfp4_device.h"

namespace k3::vk {

bool built_with_vulkan() {
  return false;
}

std::unique_ptr<Mxfp4Device> Mxfp4Device::open(const DeviceOptions&, const ExpertShape&) {
  throw Error(
      "Vulkan: this binary was built without it (K3_VULKAN=OFF): install glslc and "
      "libvulkan-dev (scripts/setup.sh) and rebuild, or run without COLI_VULKAN");
}

}  // namespace k3::vk
