/* The Vulkan device a GPU bundle runs on: the loader opened at run time,
 * the device picked. (vk.h: how the GPU executor is laid out.) */
#define _GNU_SOURCE
#include "vulkan/vk.h"

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
 * first discrete GPU, else integrated, virtual, then a CPU implementation
 * (none with `hardware`: a multi-target bundle's own choice runs its CPU
 * sections there rather than a software renderer's). */
static cb_status pick_device(cb_gpu* g, int hardware) {
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
    if (device_rank(p.deviceType) > best_rank && !(hardware && p.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU))
      best = (int)i, best_rank = device_rank(p.deviceType);
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

static cb_status create_device(cb_gpu* g, int hardware) {
  cb_vk* vk = &g->vk;
  VkApplicationInfo app = {VK_STRUCTURE_TYPE_APPLICATION_INFO, NULL, "coldbrew", 1, "coldbrew", 1,
                           VK_API_VERSION_1_1};
  VkInstanceCreateInfo ici = {VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, NULL, 0, &app, 0, NULL, 0, NULL};
  VkResult r = vk->vkCreateInstance(&ici, NULL, &g->instance);
  if (r != VK_SUCCESS)
    return cb_fail(CB_ERR_GPU, "Vulkan: no instance (VkResult %d): is a Vulkan 1.1 driver installed?", (int)r);
#define CB_VK_LOAD_INSTANCE(name) vk->name = (PFN_##name)vk->vkGetInstanceProcAddr(g->instance, #name);
  CB_VK_INSTANCE(CB_VK_LOAD_INSTANCE)
  cb_status s = pick_device(g, hardware);
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

/* Whether a GPU's device node is there (a DRM render node; NVIDIA's;
 * Android's Adreno, Mali): a multi-target bundle tries its GPU section
 * only then, sparing a machine without one the tens of milliseconds of a
 * Vulkan instance (a CPU implementation's, which it would not take). */
static int g_node = -1; /* cb_debug_gpu_node's answer, or -1: look */

void cb_debug_gpu_node(int present) { g_node = present; }

int cb_gpu_node_present(void) {
  static const char* nodes[] = {"/dev/dri/renderD128", "/dev/nvidiactl", "/dev/kgsl-3d0", "/dev/mali0"};
  if (g_node >= 0) return g_node;
  for (size_t i = 0; i < sizeof nodes / sizeof nodes[0]; i++)
    if (access(nodes[i], F_OK) == 0) return 1;
  return 0;
}

cb_status cb_gpu_open(cb_gpu** out, int hardware) {
  *out = NULL;
  cb_gpu* g = cb_calloc(1, sizeof *g);
  if (!g) return cb_fail(CB_ERR_OUT_OF_MEMORY, "out of memory");
  pthread_mutex_init(&g->weights_mu, NULL);
  cb_status s = load_loader(&g->vk);
  if (!s) s = create_device(g, hardware);
  if (s) {
    cb_gpu_release(g);
    return s;
  }
  *out = g;
  return CB_OK;
}

cb_status cb_gpu_prepare(cb_gpu* g, const uint8_t* base, const cb_model* m, uint64_t bundle_key, uint32_t threads) {
  cb_status s = cb_vk_pipelines_start(g, base, m, bundle_key, threads); /* first: pipelines take the longest */
  return s ? s : cb_vk_layout_weights(g, m);
}

const char* cb_gpu_device_name(const cb_gpu* g) { return g ? g->props.deviceName : ""; }
const char* cb_gpu_cache_path(const cb_gpu* g) { return g ? g->cache_path : ""; }

void cb_gpu_release(cb_gpu* g) {
  if (!g) return;
  cb_vk* vk = &g->vk;
  cb_vk_pipelines_stop(g);
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
