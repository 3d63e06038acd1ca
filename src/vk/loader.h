// vk/loader.h (private) — the Vulkan entry points this module calls, resolved at run time from
// libvulkan.so.1 (dlopen; VK_NO_PROTOTYPES: nothing links against the loader).
#pragma once

#define VK_NO_PROTOTYPES
#include <vulkan/vulkan.h>

#include <string>

namespace k3::vk {

#define K3_VK_INSTANCE_FUNCTIONS(X)           \
  X(vkDestroyInstance)                        \
  X(vkEnumeratePhysicalDevices)               \
  X(vkGetPhysicalDeviceProperties)            \
  X(vkGetPhysicalDeviceQueueFamilyProperties) \
  X(vkGetPhysicalDeviceMemoryProperties)      \
  X(vkCreateDevice)                           \
  X(vkGetDeviceProcAddr)

#define K3_VK_DEVICE_FUNCTIONS(X)  \
  X(vkDestroyDevice)               \
  X(vkGetDeviceQueue)              \
  X(vkDeviceWaitIdle)              \
  X(vkCreateBuffer)                \
  X(vkDestroyBuffer)               \
  X(vkGetBufferMemoryRequirements) \
  X(vkAllocateMemory)              \
  X(vkFreeMemory)                  \
  X(vkBindBufferMemory)            \
  X(vkMapMemory)                   \
  X(vkUnmapMemory)                 \
  X(vkCreateShaderModule)          \
  X(vkDestroyShaderModule)         \
  X(vkCreateDescriptorSetLayout)   \
  X(vkDestroyDescriptorSetLayout)  \
  X(vkCreatePipelineLayout)        \
  X(vkDestroyPipelineLayout)       \
  X(vkCreateComputePipelines)      \
  X(vkDestroyPipeline)             \
  X(vkCreateDescriptorPool)        \
  X(vkDestroyDescriptorPool)       \
  X(vkAllocateDescriptorSets)      \
  X(vkFreeDescriptorSets)          \
  X(vkUpdateDescriptorSets)        \
  X(vkCreateCommandPool)           \
  X(vkDestroyCommandPool)          \
  X(vkAllocateCommandBuffers)      \
  X(vkBeginCommandBuffer)          \
  X(vkEndCommandBuffer)            \
  X(vkResetCommandBuffer)          \
  X(vkCmdBindPipeline)             \
  X(vkCmdBindDescriptorSets)       \
  X(vkCmdPushConstants)            \
  X(vkCmdDispatch)                 \
  X(vkCmdPipelineBarrier)          \
  X(vkCmdCopyBuffer)               \
  X(vkQueueSubmit)                 \
  X(vkCreateFence)                 \
  X(vkDestroyFence)                \
  X(vkWaitForFences)               \
  X(vkResetFences)

// The loader and the functions of one instance and one device.
struct Loader {
  void* library = nullptr;
  PFN_vkGetInstanceProcAddr vkGetInstanceProcAddr = nullptr;
  PFN_vkCreateInstance vkCreateInstance = nullptr;
  PFN_vkEnumerateInstanceLayerProperties vkEnumerateInstanceLayerProperties = nullptr;
  PFN_vkCreateDebugUtilsMessengerEXT vkCreateDebugUtilsMessengerEXT = nullptr;
  PFN_vkDestroyDebugUtilsMessengerEXT vkDestroyDebugUtilsMessengerEXT = nullptr;
  // Optional (Vulkan 1.1 and VK_EXT_memory_budget): null when the loader lacks them.
  PFN_vkEnumerateDeviceExtensionProperties vkEnumerateDeviceExtensionProperties = nullptr;
  PFN_vkGetPhysicalDeviceMemoryProperties2 vkGetPhysicalDeviceMemoryProperties2 = nullptr;
#define K3_VK_MEMBER(name) PFN_##name name = nullptr;
  K3_VK_INSTANCE_FUNCTIONS(K3_VK_MEMBER)
  K3_VK_DEVICE_FUNCTIONS(K3_VK_MEMBER)
#undef K3_VK_MEMBER

  // dlopen()s `path` and resolves the global functions. Throws k3::Error naming the library and
  // the fix when it is missing.
  void open(const std::string& path);
  // The instance-level functions of `instance`.
  void load_instance(VkInstance instance);
  // The device-level functions of `device`.
  void load_device(VkDevice device);
  void close();
};

}  // namespace k3::vk
