/* A GPU bundle's pipelines: one per distinct shader, created on several
 * CPU threads at once through the pipeline cache. */
#define _GNU_SOURCE
#include "vulkan/vk.h"

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
    job->events[i] = (cb_trace_event){i, CB_PHASE_PIPELINE, sched_getcpu(), 0, t0, cb_now_ns(), 0, 0};
    if (r != VK_SUCCESS) {
      job->result = r;
      atomic_store(&job->failed, 1);
    }
  }
}

/* Start making every shader's pipeline on `threads` - 1 worker threads (the
 * caller joins in cb_gpu_pipelines_finish, after its own preparation work). */
cb_status cb_vk_pipelines_start(cb_gpu* g, const uint8_t* base, const cb_model* m, uint32_t threads) {
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
  void* data = cb_vk_read_cache(g, &cached);
  VkPipelineCacheCreateInfo cci = {VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO, NULL, 0, cached, data};
  VkResult r = g->vk.vkCreatePipelineCache(g->device, &cci, NULL, &g->cache);
  if (r != VK_SUCCESS && data) { /* the driver refused the data: start empty */
    cci.initialDataSize = 0, cci.pInitialData = NULL, cached = 0;
    r = g->vk.vkCreatePipelineCache(g->device, &cci, NULL, &g->cache);
  }
  cb_free(data);
  if (r != VK_SUCCESS) return cb_vk_fail(r, "vkCreatePipelineCache");
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
  if (atomic_load(&job->failed)) return cb_vk_fail(job->result, "creating a compute pipeline");
  if (!job->cached) cb_vk_write_cache(g);
  job->cached = 1;
  return CB_OK;
}

const cb_trace_event* cb_gpu_pipeline_events(const cb_gpu* g) { return g && g->job ? g->job->events : NULL; }

/* Pipeline creation stopped (workers finish the pipeline in hand) and its
 * state freed: the bundle is released. */
void cb_vk_pipelines_stop(cb_gpu* g) {
  if (!g->job) return;
  atomic_store(&g->job->failed, 1);
  for (uint32_t k = 0; k < g->job->nworkers; k++) pthread_join(g->job->tid[k], NULL);
  cb_free(g->job->events);
  cb_free(g->job);
  g->job = NULL;
}
