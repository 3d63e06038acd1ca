// The Vulkan MXFP4 expert device (vk/mxfp4_device.h): loader, instance, device, pipelines,
// expert buffers, batches.
#include "vk/mxfp4_device.h"

#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <vector>

#include "loader.h"
#include "util/error.h"
#include "vk/block_allocator.h"
#include "vk_shaders.h"  // generated: kMxfp4MmSpv, kSituSpv, kDenseMmSpv (cmake/embed_spirv.cmake)

namespace k3::vk {

bool built_with_vulkan() {
  return true;
}

void Loader::open(const std::string& path) {
  library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!library)
    throw Error("Vulkan: cannot load the loader " + path + " (" + dlerror() +
                "): install libvulkan1 and a driver (Debian: apt-get install libvulkan1 "
                "mesa-vulkan-drivers), or run without COLI_VULKAN");
  vkGetInstanceProcAddr =
      reinterpret_cast<PFN_vkGetInstanceProcAddr>(dlsym(library, "vkGetInstanceProcAddr"));
  if (!vkGetInstanceProcAddr) throw Error("Vulkan: " + path + " has no vkGetInstanceProcAddr");
  vkCreateInstance =
      reinterpret_cast<PFN_vkCreateInstance>(vkGetInstanceProcAddr(nullptr, "vkCreateInstance"));
  vkEnumerateInstanceLayerProperties = reinterpret_cast<PFN_vkEnumerateInstanceLayerProperties>(
      vkGetInstanceProcAddr(nullptr, "vkEnumerateInstanceLayerProperties"));
  if (!vkCreateInstance || !vkEnumerateInstanceLayerProperties)
    throw Error("Vulkan: " + path + " lacks vkCreateInstance");
}

void Loader::load_instance(VkInstance instance) {
#define K3_VK_LOAD(name)                                                       \
  name = reinterpret_cast<PFN_##name>(vkGetInstanceProcAddr(instance, #name)); \
  if (!name) throw Error("Vulkan: the loader lacks " #name);
  K3_VK_INSTANCE_FUNCTIONS(K3_VK_LOAD)
#undef K3_VK_LOAD
  vkCreateDebugUtilsMessengerEXT = reinterpret_cast<PFN_vkCreateDebugUtilsMessengerEXT>(
      vkGetInstanceProcAddr(instance, "vkCreateDebugUtilsMessengerEXT"));
  vkDestroyDebugUtilsMessengerEXT = reinterpret_cast<PFN_vkDestroyDebugUtilsMessengerEXT>(
      vkGetInstanceProcAddr(instance, "vkDestroyDebugUtilsMessengerEXT"));
  vkEnumerateDeviceExtensionProperties = reinterpret_cast<PFN_vkEnumerateDeviceExtensionProperties>(
      vkGetInstanceProcAddr(instance, "vkEnumerateDeviceExtensionProperties"));
  vkGetPhysicalDeviceMemoryProperties2 = reinterpret_cast<PFN_vkGetPhysicalDeviceMemoryProperties2>(
      vkGetInstanceProcAddr(instance, "vkGetPhysicalDeviceMemoryProperties2"));
}

void Loader::load_device(VkDevice device) {
#define K3_VK_LOAD(name)                                                   \
  name = reinterpret_cast<PFN_##name>(vkGetDeviceProcAddr(device, #name)); \
  if (!name) throw Error("Vulkan: the driver lacks " #name);
  K3_VK_DEVICE_FUNCTIONS(K3_VK_LOAD)
#undef K3_VK_LOAD
}

void Loader::close() {
  if (library) dlclose(library);
  library = nullptr;
}

namespace {

void check(VkResult r, const char* what) {
  if (r != VK_SUCCESS)
    throw Error(std::string("Vulkan: ") + what + " failed (VkResult " +
                std::to_string(static_cast<int>(r)) + ")");
}

// Push constants of shaders/mxfp4_mm.comp and shaders/situ.comp.
struct MmParams {
  uint32_t O, I, rows, w_off, s_off, x_off, y_off;
};
struct SituParams {
  uint32_t n, g_off, u_off;
  float beta, beta_linear;
};

// A buffer and its own host-visible memory, mapped for its lifetime.
struct Buffer {
  VkBuffer buffer = VK_NULL_HANDLE;
  VkDeviceMemory memory = VK_NULL_HANDLE;
  void* map = nullptr;
  uint64_t bytes = 0;
};

// One uploaded matrix set: a region of a block holding the packed words, then (at the next
// aligned offset) the f32 scales, and the descriptor set binding the two ranges.
struct Slot {
  BlockAllocator::Region region;
  uint64_t packed_bytes = 0, scales_offset = 0, scale_bytes = 0;  // within the region
  VkDescriptorSet set = VK_NULL_HANDLE;
  bool used = false;
  // A dense matrix (upload_dense): its format and shape; -1 for an expert.
  int32_t dense_format = -1;
  uint32_t dense_rows = 0, dense_cols = 0;
};

VkBool32 VKAPI_PTR on_message(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                              VkDebugUtilsMessageTypeFlagsEXT,
                              const VkDebugUtilsMessengerCallbackDataEXT* data, void* user) {
  if (severity & VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT) {
    ++*static_cast<uint64_t*>(user);
    std::fprintf(stderr, "Vulkan validation: %s\n", data->pMessage);
  }
  return VK_FALSE;
}

class Device final : public Mxfp4Device {
 public:
  Device(const DeviceOptions& options, const ExpertShape& shape)
      : options_(options), shape_(shape) {
    if (shape.hidden == 0 || shape.intermediate == 0 || shape.hidden % 32 ||
        shape.intermediate % 32)
      throw Error("Vulkan: expert dimensions " + std::to_string(shape.hidden) + " x " +
                  std::to_string(shape.intermediate) + " must be non-zero multiples of 32");
    vk_.open(options.loader);
    try {
      create_instance();
      pick_device();
      create_device();
      create_pipelines();
      const uint64_t R = shape.hidden, I = shape.intermediate;
      expert_bytes_ = align(3 * (I * R / 2)) + align(3 * (I * R / 32) * sizeof(float));
      // Blocks of whole experts: 16 of them, or as many as 256 MiB holds (at least one).
      const uint64_t per_block = std::clamp<uint64_t>((256ull << 20) / expert_bytes_, 1, 16);
      allocator_.emplace(
          BlockAllocator::Options{per_block * expert_bytes_, options.device_cap_bytes, alignment_},
          [this](uint32_t b, uint64_t bytes) { return create_block(b, bytes); },
          [this](uint32_t b) { free_buffer(blocks_[b]); });
      // Activations of one batch: z, gate, up, out per pair; a quarter of the 128 MiB storage
      // range every driver gives at least, so one binding covers it.
      const uint64_t per_pair = (2 * R + 2 * I) * sizeof(float);
      max_pairs_ = std::max<uint64_t>(1, (32ull << 20) / per_pair);
    } catch (...) {
      destroy();
      throw;
    }
  }
  ~Device() override { destroy(); }

  const std::string& name() const override { return name_; }
  bool is_cpu() const override { return cpu_; }
  bool is_discrete() const override { return discrete_; }
  uint64_t expert_bytes() const override { return expert_bytes_; }
  uint64_t bytes_in_use() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return allocator_->held_bytes();
  }
  uint64_t blocks() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return allocator_->blocks();
  }
  uint64_t memory_bytes() const override { return heap_bytes_; }
  std::optional<uint64_t> memory_budget() const override { return budget_; }
  bool staged() const override { return staged_; }
  size_t max_pairs() const override { return max_pairs_; }
  uint64_t validation_errors() const override { return validation_errors_; }

  int32_t upload(const ExpertBytes& e) override {
    const uint64_t R = shape_.hidden, I = shape_.intermediate;
    const uint64_t mat = I * R / 2, groups = I * R / 32;
    std::lock_guard<std::mutex> uploading(upload_mu_);
    const int32_t slot = new_slot(3 * mat, 3 * groups * sizeof(float));
    if (slot < 0) return -1;
    const bool ok = write_slot(slot, [&](uint8_t* packed, float* scales) {
      std::memcpy(packed, e.gate_packed, mat);
      std::memcpy(packed + mat, e.up_packed, mat);
      std::memcpy(packed + 2 * mat, e.down_packed, mat);
      widen(e.gate_scale, groups, scales);
      widen(e.up_scale, groups, scales + groups);
      widen(e.down_scale, groups, scales + 2 * groups);
    });
    if (!ok) {
      std::lock_guard<std::mutex> lock(mu_);
      free_slot(slot);
      return -1;
    }
    return slot;
  }

  void release(int32_t slot) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (slot < 0 || static_cast<size_t>(slot) >= slots_.size() ||
        !slots_[static_cast<size_t>(slot)].used)
      return;
    if (in_flight_)
      retired_.push_back(slot);  // the batch may read it: freed when it is done
    else
      free_slot(slot);
  }

  void issue(std::span<const Group> groups, const float* z) override {
    std::lock_guard<std::mutex> lock(mu_);
    const uint32_t R = shape_.hidden, I = shape_.intermediate;
    uint32_t P = 0;
    for (const Group& g : groups) P += g.rows;
    if (P > max_pairs_)
      throw Error("Vulkan: a batch of " + std::to_string(P) + " pairs exceeds " +
                  std::to_string(max_pairs_));
    ensure_act(static_cast<uint64_t>(P) * (2 * R + 2 * I));
    std::memcpy(act_.map, z, static_cast<size_t>(P) * R * sizeof(float));
    batch_pairs_ = P;
    const uint32_t gate_off = P * R, up_off = gate_off + P * I, out_off = up_off + P * I;
    VkCommandBuffer cb = begin();
    const uint32_t mat_words = I * R / 8, mat_groups = I * R / 32;
    // gate and up of every group, then SiTU over all rows, then down.
    uint32_t row = 0;
    for (const Group& g : groups) {
      bind_slot(cb, g.slot);
      mm(cb, g.rows, {I, R, g.rows, 0, 0, row * R, gate_off + row * I});
      mm(cb, g.rows, {I, R, g.rows, mat_words, mat_groups, row * R, up_off + row * I});
      row += g.rows;
    }
    barrier(cb);
    vk_.vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, situ_);
    const SituParams sp{P * I, gate_off, up_off, shape_.beta, shape_.beta_linear};
    vk_.vkCmdPushConstants(cb, layout_, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof(sp), &sp);
    vk_.vkCmdDispatch(cb, (P * I + 63) / 64, 1, 1);
    barrier(cb);
    row = 0;
    for (const Group& g : groups) {
      bind_slot(cb, g.slot);
      mm(cb, g.rows,
         {R, I, g.rows, 2 * mat_words, 2 * mat_groups, gate_off + row * I, out_off + row * R});
      row += g.rows;
    }
    submit(cb);
    out_off_ = out_off;
    pending_ = true;
  }

  bool join(float* out) override {
    if (!pending_) return true;
    pending_ = false;
    // The wait holds no lock: an upload goes on meanwhile.
    const bool done = !in_flight_ || wait_fence();
    {
      std::lock_guard<std::mutex> lock(mu_);
      batch_done();
    }
    if (!done || lost_) return false;
    std::memcpy(out, static_cast<const float*>(act_.map) + out_off_,
                static_cast<size_t>(batch_pairs_) * shape_.hidden * sizeof(float));
    return true;
  }

  void matmul(const uint8_t* packed, const uint8_t* scales, uint32_t O, uint32_t I, const float* X,
              uint32_t rows, float* Y) override {
    if (I % 32 || O == 0) throw Error("Vulkan matmul: I must be a multiple of 32");
    const uint64_t groups = static_cast<uint64_t>(O) * I / 32;
    std::lock_guard<std::mutex> uploading(upload_mu_);
    const int32_t slot = new_slot(static_cast<uint64_t>(O) * I / 2, groups * sizeof(float));
    if (slot < 0) throw Error("Vulkan matmul: the device refused the matrix's memory");
    if (!write_slot(slot, [&](uint8_t* p, float* sc) {
          std::memcpy(p, packed, static_cast<size_t>(O) * I / 2);
          widen(scales, groups, sc);
        })) {
      std::lock_guard<std::mutex> lock(mu_);
      free_slot(slot);
      throw Error("Vulkan matmul: the device refused the staging copy");
    }
    std::lock_guard<std::mutex> lock(mu_);
    ensure_act(static_cast<uint64_t>(rows) * (I + O));
    std::memcpy(act_.map, X, static_cast<size_t>(rows) * I * sizeof(float));
    VkCommandBuffer cb = begin();
    bind_slot(cb, slot);
    mm(cb, rows, {O, I, rows, 0, 0, 0, rows * I});
    submit(cb);
    const bool ok = wait_fence();
    batch_done();
    if (ok)
      std::memcpy(Y, static_cast<const float*>(act_.map) + static_cast<size_t>(rows) * I,
                  static_cast<size_t>(rows) * O * sizeof(float));
    free_slot(slot);
    if (!ok) throw Error("Vulkan matmul: the device was lost");
  }

  int32_t upload_dense(const DenseMatrix& m) override {
    const uint32_t O = m.rows, I = m.cols;
    const uint32_t group = m.format == DenseFormat::kInt4G64 ? 64 : 32;
    if (O == 0 || I == 0 || I % group || !m.weights || (m.format != DenseFormat::kF32 && !m.scales))
      throw Error("Vulkan: a dense " + std::to_string(O) + " x " + std::to_string(I) +
                  " matrix needs a width that is a multiple of " + std::to_string(group) +
                  " and its scales");
    uint64_t weight_bytes = 0, scale_count = 0;
    switch (m.format) {
      case DenseFormat::kF32:
        weight_bytes = uint64_t{O} * I * sizeof(float);
        break;
      case DenseFormat::kInt8Row:
        weight_bytes = uint64_t{O} * I;
        scale_count = O;
        break;
      case DenseFormat::kInt4G64:
        weight_bytes = uint64_t{O} * I / 2;
        scale_count = uint64_t{O} * I / 64;
        break;
    }
    std::lock_guard<std::mutex> uploading(upload_mu_);
    // An f32 matrix binds a token scale range (a range may not be empty).
    const int32_t slot = new_slot(weight_bytes, std::max<uint64_t>(scale_count, 4) * sizeof(float));
    if (slot < 0) return -1;
    const bool ok = write_slot(slot, [&](uint8_t* weights, float* scales) {
      std::memcpy(weights, m.weights, weight_bytes);
      if (scale_count) std::memcpy(scales, m.scales, scale_count * sizeof(float));
    });
    std::lock_guard<std::mutex> lock(mu_);
    if (!ok) {
      free_slot(slot);
      return -1;
    }
    Slot& s = slots_[static_cast<size_t>(slot)];
    s.dense_format = static_cast<int32_t>(m.format);
    s.dense_rows = O;
    s.dense_cols = I;
    return slot;
  }

  bool dense_matmul(int32_t slot, const float* X, uint32_t rows, float* Y) override {
    uint32_t O = 0, I = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (slot < 0 || static_cast<size_t>(slot) >= slots_.size() ||
          slots_[static_cast<size_t>(slot)].dense_format < 0)
        throw Error("Vulkan: slot " + std::to_string(slot) + " holds no dense matrix");
      const Slot& s = slots_[static_cast<size_t>(slot)];
      O = s.dense_rows;
      I = s.dense_cols;
      if (lost_) return false;
      ensure_buffer(uint64_t{rows} * (I + O), dense_act_, dense_act_set_);
      std::memcpy(dense_act_.map, X, size_t{rows} * I * sizeof(float));
      record(dense_cb_);
      // Staged uploads (at load) before the shader's reads.
      memory_barrier(dense_cb_, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT,
                     VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_READ_BIT);
      vk_.vkCmdBindDescriptorSets(dense_cb_, VK_PIPELINE_BIND_POINT_COMPUTE, layout_, 1, 1,
                                  &dense_act_set_, 0, nullptr);
      vk_.vkCmdBindDescriptorSets(dense_cb_, VK_PIPELINE_BIND_POINT_COMPUTE, layout_, 0, 1, &s.set,
                                  0, nullptr);
      mm(dense_cb_, rows, {O, I, rows, 0, 0, 0, rows * I}, dense_[s.dense_format]);
      end_and_submit(dense_cb_, dense_fence_);
    }
    // The wait holds no lock (an expert batch may be joined on this thread later; uploads go on).
    if (vk_.vkWaitForFences(device_, 1, &dense_fence_, VK_TRUE, UINT64_MAX) != VK_SUCCESS) {
      std::lock_guard<std::mutex> lock(mu_);
      lost_ = true;
      return false;
    }
    vk_.vkResetFences(device_, 1, &dense_fence_);
    std::memcpy(Y, static_cast<const float*>(dense_act_.map) + size_t{rows} * I,
                size_t{rows} * O * sizeof(float));
    return true;
  }

 private:
  static void widen(const uint8_t* e8, uint64_t n, float* out) {
    for (uint64_t i = 0; i < n; ++i)
      out[i] = e8[i] == 255 ? std::numeric_limits<float>::quiet_NaN()
                            : std::ldexp(1.0f, static_cast<int>(e8[i]) - 127);
  }

  void create_instance() {
    VkApplicationInfo app{};
    app.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO;
    app.pApplicationName = "kimi_k3";
    app.apiVersion = VK_API_VERSION_1_1;
    VkInstanceCreateInfo ci{};
    ci.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO;
    ci.pApplicationInfo = &app;
    const char* layer = "VK_LAYER_KHRONOS_validation";
    const char* ext = VK_EXT_DEBUG_UTILS_EXTENSION_NAME;
    VkDebugUtilsMessengerCreateInfoEXT dm{};
    if (options_.validation) {
      uint32_t n = 0;
      vk_.vkEnumerateInstanceLayerProperties(&n, nullptr);
      std::vector<VkLayerProperties> layers(n);
      vk_.vkEnumerateInstanceLayerProperties(&n, layers.data());
      const bool found = std::any_of(layers.begin(), layers.end(), [&](const VkLayerProperties& l) {
        return std::strcmp(l.layerName, layer) == 0;
      });
      if (!found)
        throw Error(
            "Vulkan: the validation layer VK_LAYER_KHRONOS_validation is not installed "
            "(Debian: apt-get install vulkan-validationlayers)");
      ci.enabledLayerCount = 1;
      ci.ppEnabledLayerNames = &layer;
      ci.enabledExtensionCount = 1;
      ci.ppEnabledExtensionNames = &ext;
      dm.sType = VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT;
      dm.messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT |
                           VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT;
      dm.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT |
                       VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT;
      dm.pfnUserCallback = on_message;
      dm.pUserData = &validation_errors_;
      ci.pNext = &dm;
    }
    const VkResult r = vk_.vkCreateInstance(&ci, nullptr, &instance_);
    if (r == VK_ERROR_INCOMPATIBLE_DRIVER)
      throw Error(
          "Vulkan: no driver (ICD) found: install one (Debian: apt-get install "
          "mesa-vulkan-drivers; VK_ICD_FILENAMES selects one)");
    check(r, "vkCreateInstance");
    vk_.load_instance(instance_);
    if (options_.validation && vk_.vkCreateDebugUtilsMessengerEXT)
      check(vk_.vkCreateDebugUtilsMessengerEXT(instance_, &dm, nullptr, &messenger_),
            "vkCreateDebugUtilsMessengerEXT");
  }

  void pick_device() {
    uint32_t n = 0;
    vk_.vkEnumeratePhysicalDevices(instance_, &n, nullptr);
    if (n == 0)
      throw Error(
          "Vulkan: no device found: install a driver (Debian: apt-get install "
          "mesa-vulkan-drivers; VK_ICD_FILENAMES selects one)");
    std::vector<VkPhysicalDevice> devices(n);
    vk_.vkEnumeratePhysicalDevices(instance_, &n, devices.data());
    auto rank = [](VkPhysicalDeviceType t) {
      switch (t) {
        case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU:
          return 0;
        case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU:
          return 1;
        case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU:
          return 2;
        default:
          return 3;
      }
    };
    int best = 99;
    for (VkPhysicalDevice d : devices) {
      VkPhysicalDeviceProperties p;
      vk_.vkGetPhysicalDeviceProperties(d, &p);
      uint32_t qn = 0;
      vk_.vkGetPhysicalDeviceQueueFamilyProperties(d, &qn, nullptr);
      std::vector<VkQueueFamilyProperties> q(qn);
      vk_.vkGetPhysicalDeviceQueueFamilyProperties(d, &qn, q.data());
      for (uint32_t i = 0; i < qn; ++i)
        if ((q[i].queueFlags & VK_QUEUE_COMPUTE_BIT) && rank(p.deviceType) < best) {
          best = rank(p.deviceType);
          physical_ = d;
          family_ = i;
          name_ = p.deviceName;
          cpu_ = p.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU;
          discrete_ = p.deviceType == VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU;
          api_ = p.apiVersion;
          alignment_ = std::max<uint64_t>(256, p.limits.minStorageBufferOffsetAlignment);
          break;
        }
    }
    if (physical_ == VK_NULL_HANDLE) throw Error("Vulkan: no device has a compute queue");
    VkPhysicalDeviceMemoryProperties mp;
    vk_.vkGetPhysicalDeviceMemoryProperties(physical_, &mp);
    memory_ = mp;
    for (uint32_t i = 0; i < mp.memoryHeapCount; ++i)
      if (mp.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT)
        heap_bytes_ = std::max<uint64_t>(heap_bytes_, mp.memoryHeaps[i].size);
    // The largest heap the host can write in place that is also device-local (a BAR window).
    uint64_t window = 0;
    const VkMemoryPropertyFlags bar =
        VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT | VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT;
    for (uint32_t i = 0; i < mp.memoryTypeCount; ++i)
      if ((mp.memoryTypes[i].propertyFlags & bar) == bar)
        window = std::max<uint64_t>(window, mp.memoryHeaps[mp.memoryTypes[i].heapIndex].size);
    staged_ = options_.staged < 0 ? window < heap_bytes_ / 4 : options_.staged > 0;
    read_memory_budget();
  }

  // VK_EXT_memory_budget, when the device offers it: what the largest device-local heap still
  // gives this process (heapBudget less heapUsage).
  void read_memory_budget() {
    if (!vk_.vkEnumerateDeviceExtensionProperties || !vk_.vkGetPhysicalDeviceMemoryProperties2 ||
        api_ < VK_API_VERSION_1_1)
      return;
    uint32_t n = 0;
    vk_.vkEnumerateDeviceExtensionProperties(physical_, nullptr, &n, nullptr);
    std::vector<VkExtensionProperties> ext(n);
    vk_.vkEnumerateDeviceExtensionProperties(physical_, nullptr, &n, ext.data());
    if (std::none_of(ext.begin(), ext.end(), [](const VkExtensionProperties& e) {
          return std::strcmp(e.extensionName, VK_EXT_MEMORY_BUDGET_EXTENSION_NAME) == 0;
        }))
      return;
    VkPhysicalDeviceMemoryBudgetPropertiesEXT budget{};
    budget.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT;
    VkPhysicalDeviceMemoryProperties2 mp{};
    mp.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2;
    mp.pNext = &budget;
    vk_.vkGetPhysicalDeviceMemoryProperties2(physical_, &mp);
    uint64_t best_heap = 0;
    std::optional<uint64_t> free;
    for (uint32_t i = 0; i < mp.memoryProperties.memoryHeapCount; ++i) {
      const VkMemoryHeap& h = mp.memoryProperties.memoryHeaps[i];
      if (!(h.flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) || h.size < best_heap) continue;
      best_heap = h.size;
      free = budget.heapBudget[i] > budget.heapUsage[i] ? budget.heapBudget[i] - budget.heapUsage[i]
                                                        : 0;
    }
    budget_ = free;
  }

  void create_device() {
    const float priority = 1.0f;
    VkDeviceQueueCreateInfo q{};
    q.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO;
    q.queueFamilyIndex = family_;
    q.queueCount = 1;
    q.pQueuePriorities = &priority;
    VkDeviceCreateInfo ci{};
    ci.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO;
    ci.queueCreateInfoCount = 1;
    ci.pQueueCreateInfos = &q;
    check(vk_.vkCreateDevice(physical_, &ci, nullptr, &device_), "vkCreateDevice");
    vk_.load_device(device_);
    vk_.vkGetDeviceQueue(device_, family_, 0, &queue_);
    VkCommandPoolCreateInfo pc{};
    pc.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO;
    pc.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
    pc.queueFamilyIndex = family_;
    check(vk_.vkCreateCommandPool(device_, &pc, nullptr, &pool_), "vkCreateCommandPool");
    VkCommandBufferAllocateInfo ai{};
    ai.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO;
    ai.commandPool = pool_;
    ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    ai.commandBufferCount = 1;
    check(vk_.vkAllocateCommandBuffers(device_, &ai, &cb_), "vkAllocateCommandBuffers");
    check(vk_.vkAllocateCommandBuffers(device_, &ai, &dense_cb_), "vkAllocateCommandBuffers");
    VkFenceCreateInfo fc{};
    fc.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO;
    check(vk_.vkCreateFence(device_, &fc, nullptr, &fence_), "vkCreateFence");
    check(vk_.vkCreateFence(device_, &fc, nullptr, &dense_fence_), "vkCreateFence");
  }

  VkShaderModule module(const unsigned char* spv, size_t bytes) {
    std::vector<uint32_t> words(bytes / 4);
    std::memcpy(words.data(), spv, bytes);
    VkShaderModuleCreateInfo ci{};
    ci.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO;
    ci.codeSize = bytes;
    ci.pCode = words.data();
    VkShaderModule m;
    check(vk_.vkCreateShaderModule(device_, &ci, nullptr, &m), "vkCreateShaderModule");
    return m;
  }

  // A pipeline of `m` with its specialization constants (0: TILE, 1: FORMAT of dense_mm.comp);
  // `constants` 0 = none.
  VkPipeline pipeline(VkShaderModule m, uint32_t tile, uint32_t format = 0,
                      uint32_t constants = 1) {
    const uint32_t values[2] = {tile, format};
    const VkSpecializationMapEntry entries[2] = {{0, 0, sizeof(uint32_t)},
                                                 {1, sizeof(uint32_t), sizeof(uint32_t)}};
    VkSpecializationInfo spec{constants, entries, constants * sizeof(uint32_t), values};
    VkComputePipelineCreateInfo ci{};
    ci.sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO;
    ci.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
    ci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
    ci.stage.module = m;
    ci.stage.pName = "main";
    ci.stage.pSpecializationInfo = constants ? &spec : nullptr;
    ci.layout = layout_;
    VkPipeline p;
    check(vk_.vkCreateComputePipelines(device_, VK_NULL_HANDLE, 1, &ci, nullptr, &p),
          "vkCreateComputePipelines");
    return p;
  }

  void create_pipelines() {
    // set 0: an expert's packed words and scales; set 1: the batch's activations.
    VkDescriptorSetLayoutBinding b[2]{};
    for (uint32_t i = 0; i < 2; ++i) {
      b[i].binding = i;
      b[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
      b[i].descriptorCount = 1;
      b[i].stageFlags = VK_SHADER_STAGE_COMPUTE_BIT;
    }
    VkDescriptorSetLayoutCreateInfo lc{};
    lc.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO;
    lc.bindingCount = 2;
    lc.pBindings = b;
    check(vk_.vkCreateDescriptorSetLayout(device_, &lc, nullptr, &set_layouts_[0]),
          "vkCreateDescriptorSetLayout");
    lc.bindingCount = 1;
    check(vk_.vkCreateDescriptorSetLayout(device_, &lc, nullptr, &set_layouts_[1]),
          "vkCreateDescriptorSetLayout");
    VkPushConstantRange range{VK_SHADER_STAGE_COMPUTE_BIT, 0, 32};
    VkPipelineLayoutCreateInfo pc{};
    pc.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO;
    pc.setLayoutCount = 2;
    pc.pSetLayouts = set_layouts_;
    pc.pushConstantRangeCount = 1;
    pc.pPushConstantRanges = &range;
    check(vk_.vkCreatePipelineLayout(device_, &pc, nullptr, &layout_), "vkCreatePipelineLayout");
    VkDescriptorPoolSize size{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 2 * kMaxSlots + 2};
    VkDescriptorPoolCreateInfo dp{};
    dp.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO;
    dp.flags = VK_DESCRIPTOR_POOL_CREATE_FREE_DESCRIPTOR_SET_BIT;
    dp.maxSets = kMaxSlots + 2;
    dp.poolSizeCount = 1;
    dp.pPoolSizes = &size;
    check(vk_.vkCreateDescriptorPool(device_, &dp, nullptr, &descriptors_),
          "vkCreateDescriptorPool");
    const VkShaderModule mm = module(kMxfp4MmSpv, sizeof(kMxfp4MmSpv));
    const VkShaderModule situ = module(kSituSpv, sizeof(kSituSpv));
    gemv_ = pipeline(mm, 1);
    gemm_ = pipeline(mm, kGemmTile);
    situ_ = pipeline(situ, 0, 0, 0);
    const VkShaderModule dense = module(kDenseMmSpv, sizeof(kDenseMmSpv));
    for (uint32_t f = 0; f < 3; ++f) {
      dense_[f][0] = pipeline(dense, 1, f, 2);
      dense_[f][1] = pipeline(dense, kGemmTile, f, 2);
    }
    vk_.vkDestroyShaderModule(device_, mm, nullptr);
    vk_.vkDestroyShaderModule(device_, situ, nullptr);
    vk_.vkDestroyShaderModule(device_, dense, nullptr);
    VkDescriptorSetAllocateInfo ai{};
    ai.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO;
    ai.descriptorPool = descriptors_;
    ai.descriptorSetCount = 1;
    ai.pSetLayouts = &set_layouts_[1];
    check(vk_.vkAllocateDescriptorSets(device_, &ai, &act_set_), "vkAllocateDescriptorSets");
    check(vk_.vkAllocateDescriptorSets(device_, &ai, &dense_act_set_), "vkAllocateDescriptorSets");
  }

  // A host-visible buffer, mapped (device-local too when the device has such memory); with
  // `device_only` a device-local one the host writes through staging (not mapped). False when
  // the driver refuses.
  bool make_buffer(uint64_t bytes, Buffer* out, bool device_only = false) {
    VkBufferCreateInfo bc{};
    bc.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO;
    bc.size = std::max<uint64_t>(bytes, 16);
    bc.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT |
               (device_only ? VK_BUFFER_USAGE_TRANSFER_DST_BIT : VK_BUFFER_USAGE_TRANSFER_SRC_BIT);
    bc.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
    Buffer b;
    if (vk_.vkCreateBuffer(device_, &bc, nullptr, &b.buffer) != VK_SUCCESS) return false;
    VkMemoryRequirements req;
    vk_.vkGetBufferMemoryRequirements(device_, b.buffer, &req);
    const VkMemoryPropertyFlags host =
        VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    int type = -1;
    for (int pass = 0; pass < 2 && type < 0; ++pass) {
      const VkMemoryPropertyFlags local = VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT;
      const VkMemoryPropertyFlags want = device_only ? local : pass == 0 ? host | local : host;
      for (uint32_t i = 0; i < memory_.memoryTypeCount; ++i)
        if ((req.memoryTypeBits & (1u << i)) &&
            (memory_.memoryTypes[i].propertyFlags & want) == want &&
            memory_.memoryHeaps[memory_.memoryTypes[i].heapIndex].size >= req.size) {
          type = static_cast<int>(i);
          break;
        }
    }
    VkMemoryAllocateInfo ai{};
    ai.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO;
    ai.allocationSize = req.size;
    ai.memoryTypeIndex = static_cast<uint32_t>(type);
    if (type < 0 || vk_.vkAllocateMemory(device_, &ai, nullptr, &b.memory) != VK_SUCCESS) {
      vk_.vkDestroyBuffer(device_, b.buffer, nullptr);
      return false;
    }
    if (vk_.vkBindBufferMemory(device_, b.buffer, b.memory, 0) != VK_SUCCESS ||
        (!device_only &&
         vk_.vkMapMemory(device_, b.memory, 0, VK_WHOLE_SIZE, 0, &b.map) != VK_SUCCESS)) {
      vk_.vkFreeMemory(device_, b.memory, nullptr);
      vk_.vkDestroyBuffer(device_, b.buffer, nullptr);
      return false;
    }
    b.bytes = req.size;
    *out = b;
    return true;
  }

  void free_buffer(Buffer& b) {
    if (b.memory) {
      if (b.map) vk_.vkUnmapMemory(device_, b.memory);
      vk_.vkFreeMemory(device_, b.memory, nullptr);
    }
    if (b.buffer) vk_.vkDestroyBuffer(device_, b.buffer, nullptr);
    b = Buffer{};
  }

  bool create_block(uint32_t b, uint64_t bytes) {
    if (b >= blocks_.size()) blocks_.resize(b + 1);
    return make_buffer(bytes, &blocks_[b], staged_);
  }

  uint64_t align(uint64_t bytes) const {
    return (bytes + alignment_ - 1) / alignment_ * alignment_;
  }

  // A slot for `packed_bytes` of packed words and `scale_bytes` of f32 scales: a region placed
  // best-fit in the blocks, and its descriptor set. -1 when the cap or the driver refuses.
  int32_t new_slot(uint64_t packed_bytes, uint64_t scale_bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    size_t i = 0;
    while (i < slots_.size() && slots_[i].used) ++i;
    if (i == kMaxSlots) return -1;
    const std::optional<BlockAllocator::Region> region =
        allocator_->allocate(align(packed_bytes) + scale_bytes);
    if (!region) return -1;
    VkDescriptorSet set = VK_NULL_HANDLE;
    VkDescriptorSetAllocateInfo ai{};
    ai.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO;
    ai.descriptorPool = descriptors_;
    ai.descriptorSetCount = 1;
    ai.pSetLayouts = &set_layouts_[0];
    if (vk_.vkAllocateDescriptorSets(device_, &ai, &set) != VK_SUCCESS) {
      allocator_->free(*region);
      return -1;
    }
    if (i == slots_.size()) slots_.emplace_back();
    Slot& s = slots_[i];
    s.region = *region;
    s.packed_bytes = packed_bytes;
    s.scales_offset = align(packed_bytes);
    s.scale_bytes = scale_bytes;
    s.set = set;
    const VkBuffer block = blocks_[region->block].buffer;
    VkDescriptorBufferInfo info[2] = {{block, region->offset, packed_bytes},
                                      {block, region->offset + s.scales_offset, scale_bytes}};
    VkWriteDescriptorSet w[2]{};
    for (uint32_t k = 0; k < 2; ++k) {
      w[k].sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET;
      w[k].dstSet = s.set;
      w[k].dstBinding = k;
      w[k].descriptorCount = 1;
      w[k].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
      w[k].pBufferInfo = &info[k];
    }
    vk_.vkUpdateDescriptorSets(device_, 2, w, 0, nullptr);
    s.used = true;
    return static_cast<int32_t>(i);
  }

  // Fills a slot's packed words and f32 scales with `fill(packed, scales)`: in place when they
  // are mapped, else in the staging buffer and copied on the queue (waited for). False when the
  // staging buffer or the copy fails.
  // (upload_mu_ held: the staging buffer and the copy's command pool are the uploads' own.)
  template <class Fill>
  bool write_slot(int32_t slot, Fill fill) {
    Slot s;
    VkBuffer block = VK_NULL_HANDLE;
    uint8_t* map = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      s = slots_[static_cast<size_t>(slot)];
      block = blocks_[s.region.block].buffer;
      map = static_cast<uint8_t*>(blocks_[s.region.block].map);
    }
    if (!staged_) {
      // The region is this upload's alone: written without the lock while a batch runs.
      uint8_t* base = map + s.region.offset;
      fill(base, reinterpret_cast<float*>(base + s.scales_offset));
      return true;
    }
    const uint64_t total = s.scales_offset + s.scale_bytes;
    if (staging_.bytes < total) {
      free_buffer(staging_);
      if (!make_buffer(total, &staging_)) return false;
    }
    auto* base = static_cast<uint8_t*>(staging_.map);
    fill(base, reinterpret_cast<float*>(base + s.scales_offset));
    if (!copy_cb_) {
      VkCommandPoolCreateInfo pc{};
      pc.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO;
      pc.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
      pc.queueFamilyIndex = family_;
      if (vk_.vkCreateCommandPool(device_, &pc, nullptr, &copy_pool_) != VK_SUCCESS) return false;
      VkCommandBufferAllocateInfo ai{};
      ai.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO;
      ai.commandPool = copy_pool_;
      ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
      ai.commandBufferCount = 1;
      VkFenceCreateInfo fc{};
      fc.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO;
      if (vk_.vkAllocateCommandBuffers(device_, &ai, &copy_cb_) != VK_SUCCESS ||
          vk_.vkCreateFence(device_, &fc, nullptr, &copy_fence_) != VK_SUCCESS)
        return false;
    }
    VkCommandBufferBeginInfo bi{};
    bi.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO;
    bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
    if (vk_.vkResetCommandBuffer(copy_cb_, 0) != VK_SUCCESS ||
        vk_.vkBeginCommandBuffer(copy_cb_, &bi) != VK_SUCCESS)
      return false;
    const VkBufferCopy copy{0, s.region.offset, total};
    vk_.vkCmdCopyBuffer(copy_cb_, staging_.buffer, block, 1, &copy);
    if (vk_.vkEndCommandBuffer(copy_cb_) != VK_SUCCESS) return false;
    VkSubmitInfo si{};
    si.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO;
    si.commandBufferCount = 1;
    si.pCommandBuffers = &copy_cb_;
    {
      std::lock_guard<std::mutex> lock(mu_);  // the queue is shared with the batches
      if (vk_.vkQueueSubmit(queue_, 1, &si, copy_fence_) != VK_SUCCESS) return false;
    }
    const VkResult r = vk_.vkWaitForFences(device_, 1, &copy_fence_, VK_TRUE, UINT64_MAX);
    vk_.vkResetFences(device_, 1, &copy_fence_);
    std::lock_guard<std::mutex> lock(mu_);
    copied_ = true;  // the next batch orders its reads after the copy
    return r == VK_SUCCESS;
  }

  // (mu_ held.)
  void free_slot(int32_t slot) {
    Slot& s = slots_[static_cast<size_t>(slot)];
    vk_.vkFreeDescriptorSets(device_, descriptors_, 1, &s.set);
    allocator_->free(s.region);
    s = Slot{};
  }

  // The batch in flight is done (mu_ held): the slots released meanwhile are freed.
  void batch_done() {
    for (int32_t slot : retired_) free_slot(slot);
    retired_.clear();
  }

  void ensure_act(uint64_t floats) {
    if (act_.bytes >= floats * sizeof(float)) return;
    if (in_flight_) {
      wait_fence();
      batch_done();
    }
    ensure_buffer(floats, act_, act_set_);
  }

  // An activation buffer of at least `floats`, bound to `set` (not in use by the device).
  void ensure_buffer(uint64_t floats, Buffer& buffer, VkDescriptorSet set) {
    const uint64_t bytes = floats * sizeof(float);
    if (buffer.bytes >= bytes) return;
    free_buffer(buffer);
    if (!make_buffer(bytes, &buffer))
      throw Error("Vulkan: the device refused " + std::to_string(bytes >> 20) +
                  " MiB of activations");
    VkDescriptorBufferInfo info{buffer.buffer, 0, VK_WHOLE_SIZE};
    VkWriteDescriptorSet w{};
    w.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET;
    w.dstSet = set;
    w.dstBinding = 0;
    w.descriptorCount = 1;
    w.descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    w.pBufferInfo = &info;
    vk_.vkUpdateDescriptorSets(device_, 1, &w, 0, nullptr);
  }

  VkCommandBuffer begin() {
    if (in_flight_) {
      wait_fence();
      batch_done();
    }
    record(cb_);
    if (copied_) {
      // Staged uploads since the last batch: their transfer writes before the shaders' reads.
      memory_barrier(cb_, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT,
                     VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_READ_BIT);
      copied_ = false;
    }
    vk_.vkCmdBindDescriptorSets(cb_, VK_PIPELINE_BIND_POINT_COMPUTE, layout_, 1, 1, &act_set_, 0,
                                nullptr);
    return cb_;
  }

  void bind_slot(VkCommandBuffer cb, int32_t slot) {
    if (slot < 0 || static_cast<size_t>(slot) >= slots_.size() ||
        !slots_[static_cast<size_t>(slot)].used)
      throw Error("Vulkan: expert slot " + std::to_string(slot) + " is not uploaded");
    vk_.vkCmdBindDescriptorSets(cb, VK_PIPELINE_BIND_POINT_COMPUTE, layout_, 0, 1,
                                &slots_[static_cast<size_t>(slot)].set, 0, nullptr);
  }

  // Resets `cb` and begins recording it for one submission.
  void record(VkCommandBuffer cb) {
    check(vk_.vkResetCommandBuffer(cb, 0), "vkResetCommandBuffer");
    VkCommandBufferBeginInfo bi{};
    bi.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO;
    bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
    check(vk_.vkBeginCommandBuffer(cb, &bi), "vkBeginCommandBuffer");
  }

  void memory_barrier(VkCommandBuffer cb, VkPipelineStageFlags src_stage, VkAccessFlags src,
                      VkPipelineStageFlags dst_stage, VkAccessFlags dst) {
    VkMemoryBarrier mb{};
    mb.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER;
    mb.srcAccessMask = src;
    mb.dstAccessMask = dst;
    vk_.vkCmdPipelineBarrier(cb, src_stage, dst_stage, 0, 1, &mb, 0, nullptr, 0, nullptr);
  }

  // The results are read by the host after `fence`: ends `cb` and submits it.
  void end_and_submit(VkCommandBuffer cb, VkFence fence) {
    memory_barrier(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT,
                   VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
    check(vk_.vkEndCommandBuffer(cb), "vkEndCommandBuffer");
    VkSubmitInfo si{};
    si.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO;
    si.commandBufferCount = 1;
    si.pCommandBuffers = &cb;
    check(vk_.vkQueueSubmit(queue_, 1, &si, fence), "vkQueueSubmit");
  }

  // Y = W X over `rows` rows: the GEMV route below gemm_rows, the tiled GEMM route from it, with
  // `routes` = {GEMV, GEMM} pipelines (the experts' MXFP4 ones unless given).
  void mm(VkCommandBuffer cb, uint32_t rows, const MmParams& p,
          const VkPipeline* routes = nullptr) {
    const bool gemm = rows >= options_.gemm_rows;
    const VkPipeline pipeline = routes ? routes[gemm ? 1 : 0] : gemm ? gemm_ : gemv_;
    vk_.vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline);
    vk_.vkCmdPushConstants(cb, layout_, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof(p), &p);
    const uint32_t tile = gemm ? kGemmTile : 1;
    vk_.vkCmdDispatch(cb, p.O, (rows + tile - 1) / tile, 1);
  }

  void barrier(VkCommandBuffer cb) {
    memory_barrier(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT,
                   VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                   VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
  }

  void submit(VkCommandBuffer cb) {
    end_and_submit(cb, fence_);
    in_flight_ = true;
  }

  bool wait_fence() {
    const VkResult r = vk_.vkWaitForFences(device_, 1, &fence_, VK_TRUE, UINT64_MAX);
    in_flight_ = false;
    if (r != VK_SUCCESS) {
      lost_ = true;
      return false;
    }
    vk_.vkResetFences(device_, 1, &fence_);
    return true;
  }

  void destroy() {
    if (device_) {
      vk_.vkDeviceWaitIdle(device_);
      for (size_t i = 0; i < slots_.size(); ++i)
        if (slots_[i].used) free_slot(static_cast<int32_t>(i));
      allocator_.reset();
      for (Buffer& b : blocks_) free_buffer(b);
      free_buffer(act_);
      free_buffer(dense_act_);
      free_buffer(staging_);
      if (fence_) vk_.vkDestroyFence(device_, fence_, nullptr);
      if (dense_fence_) vk_.vkDestroyFence(device_, dense_fence_, nullptr);
      if (copy_fence_) vk_.vkDestroyFence(device_, copy_fence_, nullptr);
      if (pool_) vk_.vkDestroyCommandPool(device_, pool_, nullptr);
      if (copy_pool_) vk_.vkDestroyCommandPool(device_, copy_pool_, nullptr);
      for (VkPipeline p : {gemv_, gemm_, situ_})
        if (p) vk_.vkDestroyPipeline(device_, p, nullptr);
      for (auto& routes : dense_)
        for (VkPipeline p : routes)
          if (p) vk_.vkDestroyPipeline(device_, p, nullptr);
      if (descriptors_) vk_.vkDestroyDescriptorPool(device_, descriptors_, nullptr);
      if (layout_) vk_.vkDestroyPipelineLayout(device_, layout_, nullptr);
      for (VkDescriptorSetLayout l : set_layouts_)
        if (l) vk_.vkDestroyDescriptorSetLayout(device_, l, nullptr);
      vk_.vkDestroyDevice(device_, nullptr);
      device_ = VK_NULL_HANDLE;
    }
    if (instance_) {
      if (messenger_) vk_.vkDestroyDebugUtilsMessengerEXT(instance_, messenger_, nullptr);
      vk_.vkDestroyInstance(instance_, nullptr);
      instance_ = VK_NULL_HANDLE;
    }
    vk_.close();
  }

  static constexpr uint32_t kGemmTile = 16;     // rows per workgroup of the GEMM route
  static constexpr uint32_t kMaxSlots = 16384;  // experts and dense matrices

  DeviceOptions options_;
  ExpertShape shape_;
  Loader vk_;
  VkInstance instance_ = VK_NULL_HANDLE;
  VkDebugUtilsMessengerEXT messenger_ = VK_NULL_HANDLE;
  VkPhysicalDevice physical_ = VK_NULL_HANDLE;
  VkPhysicalDeviceMemoryProperties memory_{};
  uint32_t family_ = 0;
  VkDevice device_ = VK_NULL_HANDLE;
  VkQueue queue_ = VK_NULL_HANDLE;
  VkCommandPool pool_ = VK_NULL_HANDLE;
  VkCommandBuffer cb_ = VK_NULL_HANDLE;
  VkFence fence_ = VK_NULL_HANDLE;
  VkDescriptorSetLayout set_layouts_[2] = {};
  VkPipelineLayout layout_ = VK_NULL_HANDLE;
  VkDescriptorPool descriptors_ = VK_NULL_HANDLE;
  VkPipeline gemv_ = VK_NULL_HANDLE, gemm_ = VK_NULL_HANDLE, situ_ = VK_NULL_HANDLE;
  VkPipeline dense_[3][2] = {};  // [DenseFormat][GEMV, GEMM]
  VkDescriptorSet act_set_ = VK_NULL_HANDLE;
  Buffer act_;
  // Dense matmuls (dense_matmul): their own command buffer, fence and activations, so an expert
  // batch may be in flight meanwhile.
  VkCommandBuffer dense_cb_ = VK_NULL_HANDLE;
  VkFence dense_fence_ = VK_NULL_HANDLE;
  VkDescriptorSet dense_act_set_ = VK_NULL_HANDLE;
  Buffer dense_act_;
  Buffer staging_;  // staged uploads: one expert's bytes on their way to device-local memory
  VkCommandPool copy_pool_ = VK_NULL_HANDLE;  // the uploads' (an uploader thread records)
  VkCommandBuffer copy_cb_ = VK_NULL_HANDLE;
  VkFence copy_fence_ = VK_NULL_HANDLE;
  bool staged_ = false;
  bool copied_ = false;  // a staged upload since the last batch was recorded
  std::vector<Slot> slots_;
  std::vector<Buffer> blocks_;               // [block]: device memory, by allocator_
  std::optional<BlockAllocator> allocator_;  // places slots in blocks_
  std::vector<int32_t> retired_;             // released while a batch was in flight
  mutable std::mutex mu_;           // slots_, blocks_, allocator_, retired_, copied_, the queue
  std::mutex upload_mu_;            // one upload (or matmul) at a time: staging_, copy_pool_
  uint64_t alignment_ = 256;        // offsets of storage-buffer ranges
  uint32_t api_ = 0;                // the device's Vulkan version
  std::optional<uint64_t> budget_;  // VK_EXT_memory_budget's free bytes (memory_budget())
  std::string name_;
  bool cpu_ = false;
  bool discrete_ = false;
  bool in_flight_ = false;  // submitted, fence not waited for
  bool pending_ = false;    // issued, not joined
  bool lost_ = false;       // a wait failed: the device is lost
  uint32_t batch_pairs_ = 0, out_off_ = 0;
  uint64_t expert_bytes_ = 0, heap_bytes_ = 0;
  size_t max_pairs_ = 0;
  uint64_t validation_errors_ = 0;
};

}  // namespace

std::unique_ptr<Mxfp4Device> Mxfp4Device::open(const DeviceOptions& options,
                                               const ExpertShape& shape) {
  return std::make_unique<Device>(options, shape);
}

}  // namespace k3::vk
