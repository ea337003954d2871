/* GPU executor for bundles of Vulkan targets (vulkan/): its internals.
 *
 * The Vulkan loader (libvulkan.so.1) is opened at run time, on the first GPU
 * bundle: an app that only runs CPU bundles needs no Vulkan at all.
 *
 * Per bundle (cb_gpu, made at open): the device, one shader module and one
 * compute pipeline per distinct shader (created on several CPU threads at
 * once, through a VkPipelineCache persisted on disk), the weights buffer.
 * Per session (cb_gpu_session): the arena in device memory, a host-visible
 * staging buffer that holds the inputs and outputs at their arena offsets
 * (the session's CPU view of them), one descriptor set per dispatch and one
 * command buffer recorded once: inputs in, every dispatch with a barrier
 * after it, outputs out.
 *
 * The pipeline cache file (cache_path, vulkan_pipelines.c) carries a header of ours: the
 * device's vendor, device and driver identity and pipelineCacheUUID, the
 * data's size and checksum. A file whose header does not match this device,
 * or whose data fails its checksum, is ignored whole and rewritten. */
#ifndef COLDBREW_VK_H_
#define COLDBREW_VK_H_

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define VK_NO_PROTOTYPES
#include <vulkan/vulkan.h>

#include "vulkan/gpu.h"

#define CB_VK_GLOBAL(X) X(vkCreateInstance) X(vkEnumerateInstanceVersion)
#define CB_VK_INSTANCE(X)                                                                                    \
  X(vkDestroyInstance) X(vkEnumeratePhysicalDevices) X(vkGetPhysicalDeviceProperties)                        \
  X(vkGetPhysicalDeviceQueueFamilyProperties) X(vkGetPhysicalDeviceMemoryProperties) X(vkCreateDevice)       \
  X(vkGetDeviceProcAddr)
#define CB_VK_DEVICE(X)                                                                                      \
  X(vkDestroyDevice) X(vkGetDeviceQueue) X(vkCreateBuffer) X(vkDestroyBuffer) X(vkGetBufferMemoryRequirements) \
  X(vkAllocateMemory) X(vkFreeMemory) X(vkBindBufferMemory) X(vkMapMemory) X(vkUnmapMemory)                 \
  X(vkCreateShaderModule) X(vkDestroyShaderModule) X(vkCreateDescriptorSetLayout)                            \
  X(vkDestroyDescriptorSetLayout) X(vkCreatePipelineLayout) X(vkDestroyPipelineLayout)                       \
  X(vkCreateComputePipelines) X(vkDestroyPipeline) X(vkCreatePipelineCache) X(vkGetPipelineCacheData)        \
  X(vkDestroyPipelineCache) X(vkCreateDescriptorPool) X(vkDestroyDescriptorPool) X(vkAllocateDescriptorSets) \
  X(vkUpdateDescriptorSets) X(vkCreateCommandPool) X(vkDestroyCommandPool) X(vkAllocateCommandBuffers)       \
  X(vkBeginCommandBuffer) X(vkEndCommandBuffer) X(vkCmdBindPipeline) X(vkCmdBindDescriptorSets)              \
  X(vkCmdDispatch) X(vkCmdPushConstants) X(vkCmdPipelineBarrier) X(vkCmdCopyBuffer) X(vkQueueSubmit) X(vkCreateFence)              \
  X(vkDestroyFence) X(vkWaitForFences) X(vkResetFences) X(vkDeviceWaitIdle) X(vkGetFenceStatus) X(vkFreeCommandBuffers)

#define CB_VK_DECLARE(name) PFN_##name name;
typedef struct cb_vk {
  void* lib;
  PFN_vkGetInstanceProcAddr vkGetInstanceProcAddr;
  CB_VK_GLOBAL(CB_VK_DECLARE)
  CB_VK_INSTANCE(CB_VK_DECLARE)
  CB_VK_DEVICE(CB_VK_DECLARE)
} cb_vk;

#define CB_MAX_BINDINGS 64

struct cb_gpu {
  cb_vk vk;
  VkInstance instance;
  VkPhysicalDevice phys;
  VkPhysicalDeviceProperties props;
  VkPhysicalDeviceMemoryProperties mem;
  VkDevice device;
  VkQueue queue;
  uint32_t family;
  VkPipelineCache cache;
  char cache_path[1024];
  VkDescriptorSetLayout set_layouts[CB_MAX_BINDINGS + 1]; /* by binding count */
  VkPipelineLayout layouts[CB_MAX_BINDINGS + 1];
  uint32_t nshaders;
  VkShaderModule* modules;  /* per shader */
  VkPipeline* pipelines;    /* per shader */
  struct pipeline_job* job; /* pipeline creation, from cb_gpu_prepare to cb_gpu_pipelines_finish */
  /* weights: every weight tensor at a 256-aligned offset of one device buffer */
  pthread_mutex_t weights_mu;
  int weights_ready;
  VkBuffer weights;
  VkDeviceMemory weights_mem;
  uint64_t* weight_offset; /* per tensor */
  uint8_t* uploaded;       /* per tensor: held by the weights buffer */
  uint64_t weights_size;
};

struct cb_gpu_session {
  cb_gpu* gpu;
  VkBuffer arena, staging;
  VkDeviceMemory arena_mem, staging_mem;
  void* staging_map;
  VkDescriptorPool pool;
  VkCommandPool cmd_pool;
  VkCommandBuffer cmd; /* every run's, recorded once the pipelines all exist */
  VkFence fence;
  const cb_model* m;
  VkDescriptorSet* sets; /* per dispatch, in plan order */
  int recorded;
};

/* A failed Vulkan call as a status (out of memory, or CB_ERR_GPU) and message. */
static inline cb_status cb_vk_fail(VkResult r, const char* what) {
  int oom = r == VK_ERROR_OUT_OF_HOST_MEMORY || r == VK_ERROR_OUT_OF_DEVICE_MEMORY;
  return cb_fail(oom ? CB_ERR_OUT_OF_MEMORY : CB_ERR_GPU, "Vulkan: %s failed (VkResult %d)", what, (int)r);
}

#define VK_TRY(call, what)         \
  do {                             \
    VkResult r_ = (call);          \
    if (r_ != VK_SUCCESS) return cb_vk_fail(r_, what); \
  } while (0)

/* vulkan_pipelines.c (`bundle_key` names the pipeline cache file) */
cb_status cb_vk_pipelines_start(cb_gpu* g, const uint8_t* base, const cb_model* m, uint64_t bundle_key,
                                uint32_t threads);
void cb_vk_pipelines_stop(cb_gpu* g);

/* vulkan_weights.c */
#define CB_STORAGE (VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT)
#define CB_HOST (VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT)
/* A buffer of `size` bytes in memory with `want` (falling back to `fallback`). */
cb_status cb_vk_make_buffer(cb_gpu* g, uint64_t size, VkBufferUsageFlags usage, VkMemoryPropertyFlags want,
                            VkMemoryPropertyFlags fallback, VkBuffer* buf, VkDeviceMemory* mem);
cb_status cb_vk_layout_weights(cb_gpu* g, const cb_model* m);

#endif /* COLDBREW_VK_H_ */
