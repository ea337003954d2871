/* What a first-ever Vulkan launch spends on the context (loader, instance,
 * device) and on each compute pipeline (no pipeline cache; run with the
 * driver's disk cache off), the pipelines made on THREADS threads at once.
 * Prints one JSON line. Driven by bench/experiments/vk_pipelines.py.
 *
 *     vk_pipelines THREADS a.spv:BINDINGS [b.spv:BINDINGS ...]
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <vulkan/vulkan.h>

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e3 + t.tv_nsec / 1e6; }
static PFN_vkGetInstanceProcAddr gipa;
static VkDevice dev;
static PFN_vkCreateShaderModule csm;
static PFN_vkCreateComputePipelines ccp;
static PFN_vkCreateDescriptorSetLayout cdsl;
static PFN_vkCreatePipelineLayout cpl;
typedef struct { char* path; int nb; uint32_t* code; size_t size; double t0, t1; int thread; } shader;
static shader sh[256];
static int nsh;
static VkPipelineLayout layouts[65];
static atomic_int next_i;

static VkPipelineLayout layout_for(int n) {
  if (layouts[n]) return layouts[n];
  VkDescriptorSetLayoutBinding b[64];
  for (int i = 0; i < n; i++) b[i] = (VkDescriptorSetLayoutBinding){i, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1, VK_SHADER_STAGE_COMPUTE_BIT, NULL};
  VkDescriptorSetLayoutCreateInfo ci = {VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO, NULL, 0, n, b};
  VkDescriptorSetLayout sl;
  cdsl(dev, &ci, NULL, &sl);
  VkPushConstantRange push = {VK_SHADER_STAGE_COMPUTE_BIT, 0, 128};
  VkPipelineLayoutCreateInfo pci = {VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO, NULL, 0, 1, &sl, 1, &push};
  cpl(dev, &pci, NULL, &layouts[n]);
  return layouts[n];
}

static void make(int i, int thread) {
  shader* s = &sh[i];
  s->t0 = now();
  VkShaderModuleCreateInfo mci = {VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO, NULL, 0, s->size, s->code};
  VkShaderModule m;
  VkPipeline p;
  if (csm(dev, &mci, NULL, &m) != VK_SUCCESS) { fprintf(stderr, "module %s failed\n", s->path); exit(1); }
  VkComputePipelineCreateInfo pci = {VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO, NULL, 0,
      {VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO, NULL, 0, VK_SHADER_STAGE_COMPUTE_BIT, m, "main", NULL},
      layouts[s->nb], VK_NULL_HANDLE, -1};
  if (ccp(dev, VK_NULL_HANDLE, 1, &pci, NULL, &p) != VK_SUCCESS) { fprintf(stderr, "pipeline %s failed\n", s->path); exit(1); }
  s->t1 = now();
  s->thread = thread;
}

static void* worker(void* arg) {
  int t = (int)(long)arg;
  for (int i; (i = atomic_fetch_add(&next_i, 1)) < nsh;) make(i, t);
  return NULL;
}

int main(int argc, char** argv) {
  if (argc < 3) { fprintf(stderr, "usage: vk_pipelines THREADS a.spv:BINDINGS ...\n"); return 2; }
  int threads = atoi(argv[1]);
  for (int a = 2; a < argc; a++) {
    shader* s = &sh[nsh++];
    s->path = strdup(argv[a]);
    char* c = strrchr(s->path, ':');
    *c = 0; s->nb = atoi(c + 1);
    FILE* f = fopen(s->path, "rb");
    if (!f) { perror(s->path); return 1; }
    fseek(f, 0, SEEK_END); s->size = ftell(f); fseek(f, 0, SEEK_SET);
    s->code = malloc(s->size); fread(s->code, 1, s->size, f); fclose(f);
  }
  double t0 = now();
  void* lib = dlopen("libvulkan.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) { fprintf(stderr, "no loader\n"); return 1; }
  gipa = (PFN_vkGetInstanceProcAddr)dlsym(lib, "vkGetInstanceProcAddr");
  double t1 = now();
  PFN_vkCreateInstance ci = (PFN_vkCreateInstance)gipa(NULL, "vkCreateInstance");
  VkApplicationInfo app = {VK_STRUCTURE_TYPE_APPLICATION_INFO, NULL, "vk_pipelines", 1, "coldbrew", 1, VK_API_VERSION_1_1};
  VkInstanceCreateInfo ici = {VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, NULL, 0, &app, 0, NULL, 0, NULL};
  VkInstance inst;
  if (ci(&ici, NULL, &inst) != VK_SUCCESS) { fprintf(stderr, "instance failed\n"); return 1; }
  double t2 = now();
  PFN_vkEnumeratePhysicalDevices epd = (PFN_vkEnumeratePhysicalDevices)gipa(inst, "vkEnumeratePhysicalDevices");
  PFN_vkGetPhysicalDeviceProperties gpp = (PFN_vkGetPhysicalDeviceProperties)gipa(inst, "vkGetPhysicalDeviceProperties");
  uint32_t n = 16; VkPhysicalDevice d[16];
  epd(inst, &n, d);
  int best = 0;
  for (uint32_t i = 0; i < n; i++) { VkPhysicalDeviceProperties p; gpp(d[i], &p); if (p.deviceType == VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU) { best = i; break; } }
  VkPhysicalDeviceProperties props; gpp(d[best], &props);
  double t3 = now();
  float prio = 1.0f;
  VkDeviceQueueCreateInfo q = {VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO, NULL, 0, 0, 1, &prio};
  VkDeviceCreateInfo dci = {VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, NULL, 0, 1, &q, 0, NULL, 0, NULL, NULL};
  PFN_vkCreateDevice cd = (PFN_vkCreateDevice)gipa(inst, "vkCreateDevice");
  if (cd(d[best], &dci, NULL, &dev) != VK_SUCCESS) { fprintf(stderr, "device failed\n"); return 1; }
  double t4 = now();
  PFN_vkGetDeviceProcAddr gdpa = (PFN_vkGetDeviceProcAddr)gipa(inst, "vkGetDeviceProcAddr");
  csm = (PFN_vkCreateShaderModule)gdpa(dev, "vkCreateShaderModule");
  ccp = (PFN_vkCreateComputePipelines)gdpa(dev, "vkCreateComputePipelines");
  cdsl = (PFN_vkCreateDescriptorSetLayout)gdpa(dev, "vkCreateDescriptorSetLayout");
  cpl = (PFN_vkCreatePipelineLayout)gdpa(dev, "vkCreatePipelineLayout");
  for (int i = 0; i < nsh; i++) layout_for(sh[i].nb);
  double t5 = now();
  pthread_t tid[64];
  for (int k = 1; k < threads; k++) pthread_create(&tid[k], NULL, worker, (void*)(long)k);
  worker(0);
  for (int k = 1; k < threads; k++) pthread_join(tid[k], NULL);
  double t6 = now();
  printf("{\"device\": \"%s\", \"dlopen\": %.2f, \"instance\": %.2f, \"enumerate\": %.2f, \"device_create\": %.2f, \"layouts\": %.2f, \"pipelines_wall\": %.2f, \"shaders\": [",
         props.deviceName, t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5);
  for (int i = 0; i < nsh; i++)
    printf("%s{\"path\": \"%s\", \"start\": %.2f, \"ms\": %.2f, \"thread\": %d, \"bytes\": %zu}", i ? ", " : "", sh[i].path, sh[i].t0 - t5, sh[i].t1 - sh[i].t0, sh[i].thread, sh[i].size);
  printf("]}\n");
  return 0;
}
