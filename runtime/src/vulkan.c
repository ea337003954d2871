/* GPU executor for bundles of Vulkan targets.
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
 * The pipeline cache file (see cache_path) carries a header of ours: the
 * device's vendor, device and driver identity and pipelineCacheUUID, the
 * data's size and checksum. A file whose header does not match this device,
 * or whose data fails its checksum, is ignored whole and rewritten. */
#define _GNU_SOURCE
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

#include "internal.h"

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
  X(vkDestroyFence) X(vkWaitForFences) X(vkResetFences) X(vkDeviceWaitIdle)

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
  VkCommandBuffer cmd;
  VkFence fence;
};

static cb_status vk_fail(VkResult r, const char* what) {
  return cb_fail(r == VK_ERROR_OUT_OF_HOST_MEMORY || r == VK_ERROR_OUT_OF_DEVICE_MEMORY ? CB_ERR_OUT_OF_MEMORY
                                                                                       : CB_ERR_GPU,
                 "Vulkan: %s failed (VkResult %d)", what, (int)r);
}

#define VK_TRY(call, what)         \
  do {                             \
    VkResult r_ = (call);          \
    if (r_ != VK_SUCCESS) return vk_fail(r_, what); \
  } while (0)

static cb_status load_loader(cb_vk* vk) {
  vk->lib = dlopen("libvulkan.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!vk->lib) vk->lib = dlopen("libvulkan.so", RTLD_NOW | RTLD_LOCAL);
  if (!vk->lib)
    return cb_fail(CB_ERR_GPU, "this bundle runs on a Vulkan GPU, but the Vulkan loader (libvulkan.so.1) "
                               "could not be opened: install it (Debian: libvulkan1) and a driver");
  vk->vkGetInstanceProcAddr = (PFN_vkGetInstanceProcAddr)dlsym(vk->lib, "vkGetInstanceProcAddr");
  if (!vk->vkGetInstanceProcAddr) return cb_fail(CB_ERR_GPU, "the Vulkan loader lacks vkGetInstanceProcAddr");
#define CB_VK_LOAD_GLOBAL(name) vk->name = (PFN_##name)vk->vkGetInstanceProcAddr(NULL, #name);
  CB_VK_GLOBAL(CB_VK_LOAD_GLOBAL)
  if (!vk->vkCreateInstance) return cb_fail(CB_ERR_GPU, "the Vulkan loader lacks vkCreateInstance");
  return CB_OK;
}

static int device_rank(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return 4;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return 3;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return 2;
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return 1;
    default: return 0;
  }
}

/* A queue family with compute, or UINT32_MAX. */
static uint32_t compute_family(cb_vk* vk, VkPhysicalDevice d) {
  uint32_t n = 0;
  vk->vkGetPhysicalDeviceQueueFamilyProperties(d, &n, NULL);
  VkQueueFamilyProperties fam[32];
  if (n > 32) n = 32;
  vk->vkGetPhysicalDeviceQueueFamilyProperties(d, &n, fam);
  for (uint32_t i = 0; i < n; i++)
    if (fam[i].queueFlags & VK_QUEUE_COMPUTE_BIT) return i;
  return UINT32_MAX;
}

/* The device: COLDBREW_VULKAN_DEVICE=<index> picks one; otherwise the
 * first discrete GPU, else integrated, virtual, then a CPU implementation. */
static cb_status pick_device(cb_gpu* g) {
  cb_vk* vk = &g->vk;
  uint32_t n = 0;
  VK_TRY(vk->vkEnumeratePhysicalDevices(g->instance, &n, NULL), "vkEnumeratePhysicalDevices");
  if (n == 0) return cb_fail(CB_ERR_GPU, "no Vulkan device found (is a Vulkan driver installed?)");
  VkPhysicalDevice devs[16];
  if (n > 16) n = 16;
  VK_TRY(vk->vkEnumeratePhysicalDevices(g->instance, &n, devs), "vkEnumeratePhysicalDevices");
  const char* want = getenv("COLDBREW_VULKAN_DEVICE");
  int best = -1, best_rank = -1;
  for (uint32_t i = 0; i < n; i++) {
    VkPhysicalDeviceProperties p;
    vk->vkGetPhysicalDeviceProperties(devs[i], &p);
    if (p.apiVersion < VK_API_VERSION_1_1 || compute_family(vk, devs[i]) == UINT32_MAX) continue;
    if (want && *want) {
      if ((uint32_t)atoi(want) == i) best = (int)i;
      continue;
    }
    if (device_rank(p.deviceType) > best_rank) best = (int)i, best_rank = device_rank(p.deviceType);
  }
  if (best < 0)
    return want && *want ? cb_fail(CB_ERR_GPU, "COLDBREW_VULKAN_DEVICE=%s names no Vulkan 1.1 device with compute "
                                               "(%u devices)", want, n)
                         : cb_fail(CB_ERR_GPU, "no Vulkan 1.1 device with a compute queue (%u devices)", n);
  g->phys = devs[best];
  vk->vkGetPhysicalDeviceProperties(g->phys, &g->props);
  vk->vkGetPhysicalDeviceMemoryProperties(g->phys, &g->mem);
  g->family = compute_family(vk, g->phys);
  return CB_OK;
}

static cb_status create_device(cb_gpu* g) {
  cb_vk* vk = &g->vk;
  VkApplicationInfo app = {VK_STRUCTURE_TYPE_APPLICATION_INFO, NULL, "coldbrew", 1, "coldbrew", 1,
                           VK_API_VERSION_1_1};
  VkInstanceCreateInfo ici = {VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, NULL, 0, &app, 0, NULL, 0, NULL};
  VkResult r = vk->vkCreateInstance(&ici, NULL, &g->instance);
  if (r != VK_SUCCESS)
    return cb_fail(CB_ERR_GPU, "Vulkan: no instance (VkResult %d): is a Vulkan 1.1 driver installed?", (int)r);
#define CB_VK_LOAD_INSTANCE(name) vk->name = (PFN_##name)vk->vkGetInstanceProcAddr(g->instance, #name);
  CB_VK_INSTANCE(CB_VK_LOAD_INSTANCE)
  cb_status s = pick_device(g);
  if (s) return s;
  float prio = 1.0f;
  VkDeviceQueueCreateInfo qci = {VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO, NULL, 0, g->family, 1, &prio};
  VkDeviceCreateInfo dci = {VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, NULL, 0, 1, &qci, 0, NULL, 0, NULL, NULL};
  VK_TRY(vk->vkCreateDevice(g->phys, &dci, NULL, &g->device), "vkCreateDevice");
#define CB_VK_LOAD_DEVICE(name) vk->name = (PFN_##name)vk->vkGetDeviceProcAddr(g->device, #name);
  CB_VK_DEVICE(CB_VK_LOAD_DEVICE)
  vk->vkGetDeviceQueue(g->device, g->family, 0, &g->queue);
  return CB_OK;
}

/* --- the pipeline cache file --- */

#define CB_CACHE_MAGIC "CBVKPC01"
typedef struct cache_header {
  char magic[8];
  uint32_t vendor, device, driver, reserved;
  uint8_t uuid[VK_UUID_SIZE];
  uint64_t size, checksum;
} cache_header;

/* <dir>/<vendor>-<device>-<driver>-<uuid>/<bundle header checksum>.vkcache,
 * dir = $COLDBREW_CACHE_DIR, else $XDG_CACHE_HOME/coldbrew, else
 * ~/.cache/coldbrew. Empty when none can be named. */
static void cache_path(cb_gpu* g, uint64_t bundle_key) {
  const char* dir = getenv("COLDBREW_CACHE_DIR");
  char base[768];
  if (dir && *dir) snprintf(base, sizeof base, "%s", dir);
  else if ((dir = getenv("XDG_CACHE_HOME")) && *dir) snprintf(base, sizeof base, "%s/coldbrew", dir);
  else if ((dir = getenv("HOME")) && *dir) snprintf(base, sizeof base, "%s/.cache/coldbrew", dir);
  else return;
  char uuid[2 * VK_UUID_SIZE + 1];
  for (unsigned i = 0; i < VK_UUID_SIZE; i++) snprintf(uuid + 2 * i, 3, "%02x", g->props.pipelineCacheUUID[i]);
  snprintf(g->cache_path, sizeof g->cache_path, "%s/%04x-%04x-%08x-%s/%016llx.vkcache", base,
           g->props.vendorID, g->props.deviceID, g->props.driverVersion, uuid, (unsigned long long)bundle_key);
}

static cache_header expected_header(const cb_gpu* g) {
  cache_header h;
  memset(&h, 0, sizeof h);
  memcpy(h.magic, CB_CACHE_MAGIC, 8);
  h.vendor = g->props.vendorID, h.device = g->props.deviceID, h.driver = g->props.driverVersion;
  memcpy(h.uuid, g->props.pipelineCacheUUID, VK_UUID_SIZE);
  return h;
}

/* The cache file's data if its header matches this device and its data its
 * checksum; else NULL (ignored whole). */
static void* read_cache(const cb_gpu* g, size_t* size) {
  *size = 0;
  if (!g->cache_path[0]) return NULL;
  FILE* f = fopen(g->cache_path, "rb");
  if (!f) return NULL;
  cache_header h, want = expected_header(g);
  void* data = NULL;
  if (fread(&h, sizeof h, 1, f) == 1 && memcmp(h.magic, want.magic, 8) == 0 && h.vendor == want.vendor &&
      h.device == want.device && h.driver == want.driver && memcmp(h.uuid, want.uuid, VK_UUID_SIZE) == 0 &&
      h.size > 0 && h.size < (1ull << 31) && (data = cb_malloc(h.size)) && fread(data, h.size, 1, f) == 1 &&
      cb_checksum64(data, h.size) == h.checksum) {
    *size = h.size;
  } else {
    cb_free(data);
    data = NULL;
  }
  fclose(f);
  return data;
}

static void make_dirs(char* path) {
  for (char* p = path + 1; *p; p++)
    if (*p == '/') {
      *p = 0;
      mkdir(path, 0755);
      *p = '/';
    }
}

/* Write the cache atomically (a temporary file renamed over the old one). */
static void write_cache(cb_gpu* g) {
  if (!g->cache_path[0]) return;
  size_t size = 0;
  if (g->vk.vkGetPipelineCacheData(g->device, g->cache, &size, NULL) != VK_SUCCESS || !size) return;
  void* data = cb_malloc(size);
  if (!data) return;
  if (g->vk.vkGetPipelineCacheData(g->device, g->cache, &size, data) == VK_SUCCESS) {
    cache_header h = expected_header(g);
    h.size = size, h.checksum = cb_checksum64(data, size);
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", g->cache_path, (int)getpid());
    make_dirs(tmp);
    FILE* f = fopen(tmp, "wb");
    if (f) {
      int ok = fwrite(&h, sizeof h, 1, f) == 1 && fwrite(data, size, 1, f) == 1;
      ok = fclose(f) == 0 && ok;
      if (!ok || rename(tmp, g->cache_path) != 0) unlink(tmp);
    }
  }
  cb_free(data);
}

/* --- pipelines --- */

static cb_status make_buffer(cb_gpu* g, uint64_t size, VkBufferUsageFlags usage, VkMemoryPropertyFlags want,
                             VkMemoryPropertyFlags fallback, VkBuffer* buf, VkDeviceMemory* mem);

static cb_status layouts_for(cb_gpu* g, uint32_t n) {
  if (g->layouts[n]) return CB_OK;
  VkDescriptorSetLayoutBinding b[CB_MAX_BINDINGS];
  for (uint32_t i = 0; i < n; i++)
    b[i] = (VkDescriptorSetLayoutBinding){i, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1, VK_SHADER_STAGE_COMPUTE_BIT, NULL};
  VkDescriptorSetLayoutCreateInfo ci = {VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO, NULL, 0, n, b};
  VK_TRY(g->vk.vkCreateDescriptorSetLayout(g->device, &ci, NULL, &g->set_layouts[n]), "vkCreateDescriptorSetLayout");
  /* every layout has the push-constant range shape-generic shaders read */
  VkPushConstantRange push = {VK_SHADER_STAGE_COMPUTE_BIT, 0, 4 * CB_MAX_PUSH_WORDS};
  VkPipelineLayoutCreateInfo pci = {VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO, NULL, 0, 1, &g->set_layouts[n], 1,
                                    &push};
  VK_TRY(g->vk.vkCreatePipelineLayout(g->device, &pci, NULL, &g->layouts[n]), "vkCreatePipelineLayout");
  return CB_OK;
}

/* Pipeline creation: worker threads take the shaders in order (the first
 * dispatches' shaders first); the thread that finishes the job joins them. */
typedef struct pipeline_job {
  cb_gpu* g;
  const uint8_t* base;
  const cb_model* m;
  _Atomic uint32_t next;
  _Atomic int failed;
  VkResult result;
  cb_trace_event* events; /* per shader: the thread that made its pipeline, when */
  pthread_t tid[16];
  uint32_t nworkers;
  int cached; /* the cache file was accepted: nothing to write back */
} pipeline_job;

/* Worker: takes the next shader, makes its module and pipeline. */
static void* pipeline_worker(void* arg) {
  pipeline_job* job = arg;
  cb_gpu* g = job->g;
  for (;;) {
    uint32_t i = atomic_fetch_add(&job->next, 1);
    if (i >= job->m->nshaders || atomic_load(&job->failed)) return NULL;
    const cb_shader_desc* sh = &job->m->shaders[i];
    uint64_t t0 = cb_now_ns();
    VkShaderModuleCreateInfo mci = {VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO, NULL, 0, (size_t)sh->size,
                                    (const uint32_t*)(job->base + sh->offset)};
    VkResult r = g->vk.vkCreateShaderModule(g->device, &mci, NULL, &g->modules[i]);
    if (r == VK_SUCCESS) {
      VkComputePipelineCreateInfo pci = {VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO, NULL, 0,
                                         {VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO, NULL, 0,
                                          VK_SHADER_STAGE_COMPUTE_BIT, g->modules[i], "main", NULL},
                                         g->layouts[sh->bindings], VK_NULL_HANDLE, -1};
      r = g->vk.vkCreateComputePipelines(g->device, g->cache, 1, &pci, NULL, &g->pipelines[i]);
    }
    job->events[i] = (cb_trace_event){i, CB_PHASE_PIPELINE, sched_getcpu(), 0, t0, cb_now_ns()};
    if (r != VK_SUCCESS) {
      job->result = r;
      atomic_store(&job->failed, 1);
    }
  }
}

/* Start making every shader's pipeline on `threads` - 1 worker threads (the
 * caller joins in cb_gpu_pipelines_finish, after its own preparation work). */
static cb_status pipelines_start(cb_gpu* g, const uint8_t* base, const cb_model* m, uint32_t threads) {
  g->nshaders = m->nshaders;
  g->modules = cb_calloc(m->nshaders, sizeof *g->modules);
  g->pipelines = cb_calloc(m->nshaders, sizeof *g->pipelines);
  g->job = cb_calloc(1, sizeof *g->job);
  cb_trace_event* events = cb_calloc(m->nshaders ? m->nshaders : 1, sizeof *events);
  if (!g->modules || !g->pipelines || !g->job || !events) {
    cb_free(events);
    return cb_fail(CB_ERR_OUT_OF_MEMORY, "out of memory");
  }
  pipeline_job* job = g->job;
  job->g = g, job->base = base, job->m = m, job->events = events, job->result = VK_SUCCESS;
  for (uint32_t i = 0; i < m->nshaders; i++) {
    cb_status s = layouts_for(g, m->shaders[i].bindings);
    if (s) return s;
  }
  size_t cached = 0;
  void* data = read_cache(g, &cached);
  VkPipelineCacheCreateInfo cci = {VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO, NULL, 0, cached, data};
  VkResult r = g->vk.vkCreatePipelineCache(g->device, &cci, NULL, &g->cache);
  if (r != VK_SUCCESS && data) { /* the driver refused the data: start empty */
    cci.initialDataSize = 0, cci.pInitialData = NULL, cached = 0;
    r = g->vk.vkCreatePipelineCache(g->device, &cci, NULL, &g->cache);
  }
  cb_free(data);
  if (r != VK_SUCCESS) return vk_fail(r, "vkCreatePipelineCache");
  job->cached = cached != 0;
  if (threads > 16) threads = 16;
  for (uint32_t k = 1; k < threads && k < m->nshaders; k++)
    if (pthread_create(&job->tid[job->nworkers], NULL, pipeline_worker, job) == 0) job->nworkers++;
  return CB_OK;
}

cb_status cb_gpu_pipelines_finish(cb_gpu* g) {
  pipeline_job* job = g->job;
  if (!job) return cb_fail(CB_ERR_GPU, "pipelines were never started");
  pipeline_worker(job);
  for (uint32_t k = 0; k < job->nworkers; k++) pthread_join(job->tid[k], NULL);
  job->nworkers = 0;
  if (atomic_load(&job->failed)) return vk_fail(job->result, "creating a compute pipeline");
  if (!job->cached) write_cache(g);
  job->cached = 1;
  return CB_OK;
}

const cb_trace_event* cb_gpu_pipeline_events(const cb_gpu* g) { return g && g->job ? g->job->events : NULL; }

/* --- memory --- */

static int memory_type(const cb_gpu* g, uint32_t bits, VkMemoryPropertyFlags want) {
  for (uint32_t i = 0; i < g->mem.memoryTypeCount; i++)
    if ((bits & (1u << i)) && (g->mem.memoryTypes[i].propertyFlags & want) == want) return (int)i;
  return -1;
}

/* A buffer of `size` bytes in memory with `want` (falling back to `fallback`). */
static cb_status make_buffer(cb_gpu* g, uint64_t size, VkBufferUsageFlags usage, VkMemoryPropertyFlags want,
                             VkMemoryPropertyFlags fallback, VkBuffer* buf, VkDeviceMemory* mem) {
  VkBufferCreateInfo bci = {VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, NULL, 0, size ? size : 256, usage,
                            VK_SHARING_MODE_EXCLUSIVE, 0, NULL};
  VK_TRY(g->vk.vkCreateBuffer(g->device, &bci, NULL, buf), "vkCreateBuffer");
  VkMemoryRequirements req;
  g->vk.vkGetBufferMemoryRequirements(g->device, *buf, &req);
  int type = memory_type(g, req.memoryTypeBits, want);
  if (type < 0) type = memory_type(g, req.memoryTypeBits, fallback);
  if (type < 0) return cb_fail(CB_ERR_GPU, "Vulkan: no memory type for a %llu-byte buffer", (unsigned long long)size);
  VkMemoryAllocateInfo mai = {VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, NULL, req.size, (uint32_t)type};
  VK_TRY(g->vk.vkAllocateMemory(g->device, &mai, NULL, mem), "vkAllocateMemory");
  VK_TRY(g->vk.vkBindBufferMemory(g->device, *buf, *mem, 0), "vkBindBufferMemory");
  return CB_OK;
}

#define CB_STORAGE (VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT)
#define CB_HOST (VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT)

static uint64_t align_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

/* One-off command buffer: record with `fn`, submit, wait. */
static cb_status submit_once(cb_gpu* g, void (*fn)(cb_gpu*, VkCommandBuffer, void*), void* arg) {
  VkCommandPool pool;
  VkCommandPoolCreateInfo pci = {VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO, NULL, 0, g->family};
  VK_TRY(g->vk.vkCreateCommandPool(g->device, &pci, NULL, &pool), "vkCreateCommandPool");
  VkCommandBuffer cmd;
  VkCommandBufferAllocateInfo ai = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, NULL, pool,
                                    VK_COMMAND_BUFFER_LEVEL_PRIMARY, 1};
  VkResult r = g->vk.vkAllocateCommandBuffers(g->device, &ai, &cmd);
  if (r == VK_SUCCESS) {
    VkCommandBufferBeginInfo bi = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, NULL,
                                   VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT, NULL};
    g->vk.vkBeginCommandBuffer(cmd, &bi);
    fn(g, cmd, arg);
    g->vk.vkEndCommandBuffer(cmd);
    VkFence fence;
    VkFenceCreateInfo fci = {VK_STRUCTURE_TYPE_FENCE_CREATE_INFO, NULL, 0};
    r = g->vk.vkCreateFence(g->device, &fci, NULL, &fence);
    if (r == VK_SUCCESS) {
      VkSubmitInfo si = {VK_STRUCTURE_TYPE_SUBMIT_INFO, NULL, 0, NULL, NULL, 1, &cmd, 0, NULL};
      r = g->vk.vkQueueSubmit(g->queue, 1, &si, fence);
      if (r == VK_SUCCESS) r = g->vk.vkWaitForFences(g->device, 1, &fence, VK_TRUE, UINT64_MAX);
      g->vk.vkDestroyFence(g->device, fence, NULL);
    }
  }
  g->vk.vkDestroyCommandPool(g->device, pool, NULL);
  return r == VK_SUCCESS ? CB_OK : vk_fail(r, "submitting a copy");
}

typedef struct copy_arg {
  VkBuffer src, dst;
  uint64_t size;
} copy_arg;

static void record_copy(cb_gpu* g, VkCommandBuffer cmd, void* arg) {
  copy_arg* c = arg;
  VkBufferCopy region = {0, 0, c->size};
  g->vk.vkCmdCopyBuffer(cmd, c->src, c->dst, 1, &region);
}

/* --- weights --- */

/* Every tensor the weights buffer holds, at a 256-aligned offset (any
 * device's storage-buffer offset alignment): the weights some dispatch binds
 * and the prepared tensors the CPU transforms write (raw weights that only
 * a transform reads stay on the CPU). */
static cb_status layout_weights(cb_gpu* g, const cb_model* m) {
  g->weight_offset = cb_calloc(m->ntensors ? m->ntensors : 1, sizeof *g->weight_offset);
  g->uploaded = cb_calloc(m->ntensors ? m->ntensors : 1, 1);
  if (!g->weight_offset || !g->uploaded) return cb_fail(CB_ERR_OUT_OF_MEMORY, "out of memory");
  for (uint32_t i = 0; i < m->nsteps; i++)
    for (uint32_t j = 0; j < m->steps[i].ndispatches; j++)
      for (uint32_t a = 0; a < m->steps[i].dispatches[j].nbindings; a++) {
        uint32_t t = m->steps[i].dispatches[j].bindings[a];
        g->uploaded[t] = m->tensors[t].kind == CB_KIND_WEIGHT || m->tensors[t].kind == CB_KIND_PREPARED;
      }
  uint64_t pos = 0;
  for (uint32_t i = 0; i < m->ntensors; i++)
    if (g->uploaded[i]) {
      g->weight_offset[i] = pos;
      pos = align_up(pos + m->tensors[i].nbytes, 256);
    }
  g->weights_size = pos;
  return make_buffer(g, pos, CB_STORAGE, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, 0, &g->weights, &g->weights_mem);
}

/* gpu.winograd_f23: raw OIHW [K][C][3][3] -> U = G g G^T as [C][16][K], the
 * layout gpu.conv_winograd reads (G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1]). */
static void winograd_f23(const float* w, float* u, uint64_t K, uint64_t C) {
  for (uint64_t c = 0; c < C; c++)
    for (uint64_t k = 0; k < K; k++) {
      const float* g = w + (k * C + c) * 9;
      float t[4][3]; /* G g */
      for (int j = 0; j < 3; j++) {
        t[0][j] = g[j];
        t[1][j] = 0.5f * (g[j] + g[3 + j] + g[6 + j]);
        t[2][j] = 0.5f * (g[j] - g[3 + j] + g[6 + j]);
        t[3][j] = g[6 + j];
      }
      float* out = u + c * 16 * K + k;
      for (int i = 0; i < 4; i++) { /* (G g) G^T */
        out[(uint64_t)(i * 4 + 0) * K] = t[i][0];
        out[(uint64_t)(i * 4 + 1) * K] = 0.5f * (t[i][0] + t[i][1] + t[i][2]);
        out[(uint64_t)(i * 4 + 2) * K] = 0.5f * (t[i][0] - t[i][1] + t[i][2]);
        out[(uint64_t)(i * 4 + 3) * K] = t[i][2];
      }
    }
}

int cb_gpu_weights_ready(cb_gpu* g) {
  pthread_mutex_lock(&g->weights_mu);
  int r = g->weights_ready;
  pthread_mutex_unlock(&g->weights_mu);
  return r;
}

cb_status cb_gpu_upload_weights(cb_gpu* g, const uint8_t* base, const cb_model* m) {
  pthread_mutex_lock(&g->weights_mu);
  cb_status s = CB_OK;
  if (!g->weights_ready && g->weights_size) {
    VkBuffer staging = VK_NULL_HANDLE;
    VkDeviceMemory mem = VK_NULL_HANDLE;
    void* map = NULL;
    s = make_buffer(g, g->weights_size, VK_BUFFER_USAGE_TRANSFER_SRC_BIT, CB_HOST, CB_HOST, &staging, &mem);
    if (!s && g->vk.vkMapMemory(g->device, mem, 0, VK_WHOLE_SIZE, 0, &map) != VK_SUCCESS)
      s = cb_fail(CB_ERR_GPU, "Vulkan: cannot map the weights' staging buffer");
    if (!s) {
      for (uint32_t i = 0; i < m->ntensors; i++) {
        const cb_tensor_desc* d = &m->tensors[i];
        if (d->kind == CB_KIND_WEIGHT && g->uploaded[i])
          memcpy((uint8_t*)map + g->weight_offset[i], cb_weight_data(base, m, i), d->nbytes);
      }
      for (uint32_t i = 0; i < m->nsteps; i++) { /* raw-weight steps: their transform, on this CPU thread */
        const cb_step_desc* st = &m->steps[i];
        if (!st->transform) continue;
        const cb_tensor_desc* raw = &m->tensors[st->transform_args[0]];
        const float* w = (const float*)cb_weight_data(base, m, st->transform_args[0]);
        winograd_f23(w, (float*)((uint8_t*)map + g->weight_offset[st->transform_args[1]]), (uint64_t)raw->shape[0],
                     (uint64_t)raw->shape[1]);
      }
      copy_arg c = {staging, g->weights, g->weights_size};
      s = submit_once(g, record_copy, &c);
    }
    if (map) g->vk.vkUnmapMemory(g->device, mem);
    if (staging) g->vk.vkDestroyBuffer(g->device, staging, NULL);
    if (mem) g->vk.vkFreeMemory(g->device, mem, NULL);
    if (!s) g->weights_ready = 1;
  }
  pthread_mutex_unlock(&g->weights_mu);
  return s;
}

/* --- sessions --- */

static void barrier(cb_gpu* g, VkCommandBuffer cmd, VkPipelineStageFlags src, VkAccessFlags src_access,
                    VkPipelineStageFlags dst, VkAccessFlags dst_access) {
  VkMemoryBarrier mb = {VK_STRUCTURE_TYPE_MEMORY_BARRIER, NULL, src_access, dst_access};
  g->vk.vkCmdPipelineBarrier(cmd, src, dst, 0, 1, &mb, 0, NULL, 0, NULL);
}

static void copy_io(cb_gpu_session* gs, const cb_model* m, const uint32_t* ids, uint32_t n, int in) {
  VkBufferCopy regions[64];
  uint32_t k = 0;
  for (uint32_t i = 0; i < n; i++) {
    const cb_tensor_desc* d = &m->tensors[ids[i]];
    regions[k++] = (VkBufferCopy){d->arena_offset, d->arena_offset, d->nbytes};
    if (k == 64 || i + 1 == n) {
      gs->gpu->vk.vkCmdCopyBuffer(gs->cmd, in ? gs->staging : gs->arena, in ? gs->arena : gs->staging, k, regions);
      k = 0;
    }
  }
}

static cb_status record(cb_gpu_session* gs, const cb_model* m, VkDescriptorSet* sets) {
  cb_gpu* g = gs->gpu;
  VkCommandBufferBeginInfo bi = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, NULL, 0, NULL};
  VK_TRY(g->vk.vkBeginCommandBuffer(gs->cmd, &bi), "vkBeginCommandBuffer");
  barrier(g, gs->cmd, VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_WRITE_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT,
          VK_ACCESS_TRANSFER_READ_BIT);
  copy_io(gs, m, m->inputs, m->ninputs, 1);
  barrier(g, gs->cmd, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT,
          VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
  uint32_t k = 0;
  for (uint32_t i = 0; i < m->nsteps; i++)
    for (uint32_t j = 0; j < m->steps[i].ndispatches; j++, k++) {
      const cb_dispatch_desc* d = &m->steps[i].dispatches[j];
      const cb_shader_desc* sh = &m->shaders[d->shader];
      g->vk.vkCmdBindPipeline(gs->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, g->pipelines[d->shader]);
      g->vk.vkCmdBindDescriptorSets(gs->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, g->layouts[sh->bindings], 0, 1, &sets[k],
                                    0, NULL);
      if (d->npush)
        g->vk.vkCmdPushConstants(gs->cmd, g->layouts[sh->bindings], VK_SHADER_STAGE_COMPUTE_BIT, 0, 4 * d->npush,
                                 d->push);
      g->vk.vkCmdDispatch(gs->cmd, d->grid[0], d->grid[1], d->grid[2]);
      barrier(g, gs->cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT,
              VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
              VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT);
    }
  copy_io(gs, m, m->outputs, m->noutputs, 0);
  barrier(g, gs->cmd, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT,
          VK_ACCESS_HOST_READ_BIT);
  VK_TRY(g->vk.vkEndCommandBuffer(gs->cmd), "vkEndCommandBuffer");
  return CB_OK;
}

static cb_status bind_sets(cb_gpu_session* gs, const cb_model* m, VkDescriptorSet* sets, uint32_t nsets,
                           uint32_t nbindings) {
  cb_gpu* g = gs->gpu;
  VkDescriptorPoolSize size = {VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, nbindings ? nbindings : 1};
  VkDescriptorPoolCreateInfo pci = {VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO, NULL, 0, nsets, 1, &size};
  VK_TRY(g->vk.vkCreateDescriptorPool(g->device, &pci, NULL, &gs->pool), "vkCreateDescriptorPool");
  uint64_t align = g->props.limits.minStorageBufferOffsetAlignment;
  uint32_t k = 0;
  for (uint32_t i = 0; i < m->nsteps; i++)
    for (uint32_t j = 0; j < m->steps[i].ndispatches; j++, k++) {
      const cb_dispatch_desc* d = &m->steps[i].dispatches[j];
      VkDescriptorSetAllocateInfo ai = {VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO, NULL, gs->pool, 1,
                                        &g->set_layouts[d->nbindings]};
      VK_TRY(g->vk.vkAllocateDescriptorSets(g->device, &ai, &sets[k]), "vkAllocateDescriptorSets");
      VkDescriptorBufferInfo info[CB_MAX_BINDINGS];
      VkWriteDescriptorSet w[CB_MAX_BINDINGS];
      for (uint32_t a = 0; a < d->nbindings; a++) {
        const cb_tensor_desc* t = &m->tensors[d->bindings[a]];
        int weight = t->kind == CB_KIND_WEIGHT || t->kind == CB_KIND_PREPARED; /* in the weights buffer */
        uint64_t off = weight ? g->weight_offset[d->bindings[a]] : t->arena_offset;
        if (align && off % align)
          return cb_fail(CB_ERR_GPU, "tensor '%s' lies at offset %llu, not a multiple of this device's storage "
                                     "buffer alignment %llu", t->name, (unsigned long long)off,
                         (unsigned long long)align);
        info[a] = (VkDescriptorBufferInfo){weight ? g->weights : gs->arena, off, t->nbytes ? t->nbytes : VK_WHOLE_SIZE};
        w[a] = (VkWriteDescriptorSet){VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, NULL, sets[k], a, 0, 1,
                                      VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, NULL, &info[a], NULL};
      }
      g->vk.vkUpdateDescriptorSets(g->device, d->nbindings, w, 0, NULL);
    }
  return CB_OK;
}

cb_status cb_gpu_session_create(cb_gpu* g, const cb_model* m, cb_gpu_session** out, void** host_view) {
  *out = NULL, *host_view = NULL;
  cb_gpu_session* gs = cb_calloc(1, sizeof *gs);
  if (!gs) return cb_fail(CB_ERR_OUT_OF_MEMORY, "out of memory");
  gs->gpu = g;
  uint32_t nsets = 0, nbindings = 0;
  for (uint32_t i = 0; i < m->nsteps; i++)
    for (uint32_t j = 0; j < m->steps[i].ndispatches; j++) nsets++, nbindings += m->steps[i].dispatches[j].nbindings;
  VkDescriptorSet* sets = cb_calloc(nsets ? nsets : 1, sizeof *sets);
  cb_status s = sets ? CB_OK : cb_fail(CB_ERR_OUT_OF_MEMORY, "out of memory");
  if (!s) s = make_buffer(g, m->arena_size, CB_STORAGE, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, 0, &gs->arena,
                          &gs->arena_mem);
  if (!s) s = make_buffer(g, m->arena_size, VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT,
                          CB_HOST | VK_MEMORY_PROPERTY_HOST_CACHED_BIT, CB_HOST, &gs->staging, &gs->staging_mem);
  if (!s && g->vk.vkMapMemory(g->device, gs->staging_mem, 0, VK_WHOLE_SIZE, 0, &gs->staging_map) != VK_SUCCESS)
    s = cb_fail(CB_ERR_GPU, "Vulkan: cannot map the session's staging buffer");
  if (!s) s = bind_sets(gs, m, sets, nsets, nbindings);
  if (!s) {
    VkCommandPoolCreateInfo pci = {VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO, NULL, 0, g->family};
    VkCommandBufferAllocateInfo ai = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, NULL, VK_NULL_HANDLE,
                                      VK_COMMAND_BUFFER_LEVEL_PRIMARY, 1};
    VkFenceCreateInfo fci = {VK_STRUCTURE_TYPE_FENCE_CREATE_INFO, NULL, 0};
    VkResult r = g->vk.vkCreateCommandPool(g->device, &pci, NULL, &gs->cmd_pool);
    if (r == VK_SUCCESS) ai.commandPool = gs->cmd_pool, r = g->vk.vkAllocateCommandBuffers(g->device, &ai, &gs->cmd);
    if (r == VK_SUCCESS) r = g->vk.vkCreateFence(g->device, &fci, NULL, &gs->fence);
    s = r == VK_SUCCESS ? record(gs, m, sets) : vk_fail(r, "creating the session's command buffer");
  }
  cb_free(sets);
  if (s) {
    cb_gpu_session_release(gs);
    return s;
  }
  *out = gs;
  *host_view = gs->staging_map;
  return CB_OK;
}

cb_status cb_gpu_session_run(cb_gpu_session* gs) {
  cb_gpu* g = gs->gpu;
  VK_TRY(g->vk.vkResetFences(g->device, 1, &gs->fence), "vkResetFences");
  VkSubmitInfo si = {VK_STRUCTURE_TYPE_SUBMIT_INFO, NULL, 0, NULL, NULL, 1, &gs->cmd, 0, NULL};
  VK_TRY(g->vk.vkQueueSubmit(g->queue, 1, &si, gs->fence), "vkQueueSubmit");
  VK_TRY(g->vk.vkWaitForFences(g->device, 1, &gs->fence, VK_TRUE, UINT64_MAX), "vkWaitForFences");
  return CB_OK;
}

void cb_gpu_session_release(cb_gpu_session* gs) {
  if (!gs) return;
  cb_gpu* g = gs->gpu;
  cb_vk* vk = &g->vk;
  vk->vkDeviceWaitIdle(g->device);
  if (gs->fence) vk->vkDestroyFence(g->device, gs->fence, NULL);
  if (gs->cmd_pool) vk->vkDestroyCommandPool(g->device, gs->cmd_pool, NULL);
  if (gs->pool) vk->vkDestroyDescriptorPool(g->device, gs->pool, NULL);
  if (gs->staging_map) vk->vkUnmapMemory(g->device, gs->staging_mem);
  if (gs->staging) vk->vkDestroyBuffer(g->device, gs->staging, NULL);
  if (gs->staging_mem) vk->vkFreeMemory(g->device, gs->staging_mem, NULL);
  if (gs->arena) vk->vkDestroyBuffer(g->device, gs->arena, NULL);
  if (gs->arena_mem) vk->vkFreeMemory(g->device, gs->arena_mem, NULL);
  cb_free(gs);
}

/* --- the bundle's GPU --- */

cb_status cb_gpu_open(cb_gpu** out) {
  *out = NULL;
  cb_gpu* g = cb_calloc(1, sizeof *g);
  if (!g) return cb_fail(CB_ERR_OUT_OF_MEMORY, "out of memory");
  pthread_mutex_init(&g->weights_mu, NULL);
  cb_status s = load_loader(&g->vk);
  if (!s) s = create_device(g);
  if (s) {
    cb_gpu_release(g);
    return s;
  }
  *out = g;
  return CB_OK;
}

cb_status cb_gpu_prepare(cb_gpu* g, const uint8_t* base, const cb_model* m, uint64_t bundle_key, uint32_t threads) {
  cache_path(g, bundle_key);
  cb_status s = pipelines_start(g, base, m, threads); /* the workers start first: pipelines are the longest */
  return s ? s : layout_weights(g, m);
}

const char* cb_gpu_device_name(const cb_gpu* g) { return g ? g->props.deviceName : ""; }
const char* cb_gpu_cache_path(const cb_gpu* g) { return g ? g->cache_path : ""; }

void cb_gpu_release(cb_gpu* g) {
  if (!g) return;
  cb_vk* vk = &g->vk;
  if (g->job) {
    atomic_store(&g->job->failed, 1); /* workers stop after the pipeline in hand */
    for (uint32_t k = 0; k < g->job->nworkers; k++) pthread_join(g->job->tid[k], NULL);
    cb_free(g->job->events);
    cb_free(g->job);
  }
  cb_free(g->weight_offset);
  cb_free(g->uploaded);
  if (g->device) {
    vk->vkDeviceWaitIdle(g->device);
    for (uint32_t i = 0; i < g->nshaders; i++) {
      if (g->pipelines && g->pipelines[i]) vk->vkDestroyPipeline(g->device, g->pipelines[i], NULL);
      if (g->modules && g->modules[i]) vk->vkDestroyShaderModule(g->device, g->modules[i], NULL);
    }
    if (g->weights) vk->vkDestroyBuffer(g->device, g->weights, NULL);
    if (g->weights_mem) vk->vkFreeMemory(g->device, g->weights_mem, NULL);
    if (g->cache) vk->vkDestroyPipelineCache(g->device, g->cache, NULL);
    for (uint32_t n = 0; n <= CB_MAX_BINDINGS; n++) {
      if (g->layouts[n]) vk->vkDestroyPipelineLayout(g->device, g->layouts[n], NULL);
      if (g->set_layouts[n]) vk->vkDestroyDescriptorSetLayout(g->device, g->set_layouts[n], NULL);
    }
    vk->vkDestroyDevice(g->device, NULL);
  }
  cb_free(g->modules);
  cb_free(g->pipelines);
  if (g->instance) vk->vkDestroyInstance(g->instance, NULL);
  if (vk->lib) dlclose(vk->lib);
  pthread_mutex_destroy(&g->weights_mu);
  cb_free(g);
}
