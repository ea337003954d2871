/* A GPU bundle's pipelines: one per distinct shader, created on several
 * CPU threads at once through the pipeline cache, read from its file and
 * written back once all exist (vk.h: the file). Each shader's pipeline is
 * marked ready as it is made, so a first run can dispatch the layers whose
 * pipelines exist (or their first-run launches') while later ones are still
 * being made; the workers go on past that run, and a bundle released before
 * they are done lets them finish the pipelines in hand and writes the cache
 * if those were the last. */
#define _GNU_SOURCE
#include <time.h>

#include "vulkan/vk.h"

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

static cb_status layouts_for(cb_gpu* g, uint32_t n) {
  if (g->layouts[n]) return CB_OK;
  if (n > g->props.limits.maxPerStageDescriptorStorageBuffers)
    return cb_fail(CB_ERR_GPU, "a shader binds %u storage buffers; this device allows %u", n,
                   g->props.limits.maxPerStageDescriptorStorageBuffers);
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
  _Atomic uint32_t next; /* shaders before it are all taken */
  _Atomic int failed;
  _Atomic int stopping; /* the bundle is released: no new pipeline is begun */
  _Atomic uint32_t begun, made; /* pipelines taken by a thread; that exist */
  VkResult result;
  cb_trace_event* events; /* per shader: the thread that made its pipeline, when */
  _Atomic uint8_t* ready; /* per shader: 0 nobody's, 1 being made, 2 made */
  pthread_t tid[16];
  uint32_t nworkers;
  int cached; /* the cache file was accepted: nothing to write back (else written by the last pipeline's maker) */
  pthread_mutex_t finish_mu;
  _Atomic int finished; /* every pipeline made, the workers joined */
} pipeline_job;

/* cb_debug_gpu_hold_shader: the shader whose pipeline is held back, and until when. */
static char g_held[64];
static _Atomic uint64_t g_held_until;

void cb_debug_gpu_hold_shader(const char* name, uint32_t ms) {
  atomic_store(&g_held_until, 0); /* released: the name is no longer read */
  if (!name || !*name) return;
  snprintf(g_held, sizeof g_held, "%s", name);
  atomic_store(&g_held_until, cb_now_ns() + (uint64_t)ms * 1000000u);
}

static void hold(const cb_shader_desc* sh) {
  while (atomic_load(&g_held_until) && !strcmp(sh->name, g_held) && cb_now_ns() < atomic_load(&g_held_until)) {
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
}

/* Shader `i` taken by this thread (nobody had), unless creation stopped. */
static int take(pipeline_job* job, uint32_t i) {
  uint8_t free_ = 0;
  if (atomic_load(&job->failed) || atomic_load(&job->stopping) ||
      !atomic_compare_exchange_strong(&job->ready[i], &free_, 1))
    return 0;
  atomic_fetch_add(&job->begun, 1);
  return 1;
}

/* Makes shader `i`'s module and pipeline (taken): 0 when it failed. */
static int make(pipeline_job* job, uint32_t i) {
  cb_gpu* g = job->g;
  const cb_shader_desc* sh = &job->m->shaders[i];
  hold(sh);
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
    return 0;
  }
  atomic_store_explicit(&job->ready[i], 2, memory_order_release);
  if (atomic_fetch_add(&job->made, 1) + 1 == job->m->nshaders && !job->cached) write_cache(g); /* for the next launch */
  return 1;
}

/* Takes the first shader nobody has (in order of first use) and makes it:
 * 0 when none is left or one failed. */
static int make_next(pipeline_job* job) {
  for (;;) {
    uint32_t i = atomic_load(&job->next);
    if (i >= job->m->nshaders || atomic_load(&job->failed) || atomic_load(&job->stopping)) return 0;
    if (atomic_compare_exchange_weak(&job->next, &i, i + 1) && take(job, i)) return make(job, i);
  }
}

/* Worker: makes pipelines until none is left. */
static void* pipeline_worker(void* arg) {
  while (make_next(arg)) {
  }
  return NULL;
}

/* Start making every shader's pipeline on `threads` - 1 worker threads (the
 * caller joins in cb_gpu_pipelines_finish, after its own preparation work). */
cb_status cb_vk_pipelines_start(cb_gpu* g, const uint8_t* base, const cb_model* m, uint64_t bundle_key,
                                uint32_t threads) {
  cache_path(g, bundle_key);
  g->nshaders = m->nshaders;
  g->modules = cb_calloc(m->nshaders, sizeof *g->modules);
  g->pipelines = cb_calloc(m->nshaders, sizeof *g->pipelines);
  g->job = cb_calloc(1, sizeof *g->job);
  cb_trace_event* events = cb_calloc(m->nshaders ? m->nshaders : 1, sizeof *events);
  _Atomic uint8_t* ready = cb_calloc(m->nshaders ? m->nshaders : 1, sizeof *ready);
  if (!g->modules || !g->pipelines || !g->job || !events || !ready) {
    cb_free(events);
    cb_free((void*)ready);
    return cb_fail(CB_ERR_OUT_OF_MEMORY, "out of memory");
  }
  pipeline_job* job = g->job;
  job->g = g, job->base = base, job->m = m, job->events = events, job->ready = ready, job->result = VK_SUCCESS;
  pthread_mutex_init(&job->finish_mu, NULL);
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
  if (r != VK_SUCCESS) return cb_vk_fail(r, "vkCreatePipelineCache");
  job->cached = cached != 0;
  if (threads > 16) threads = 16;
  for (uint32_t k = 1; k < threads && k < m->nshaders; k++)
    if (pthread_create(&job->tid[job->nworkers], NULL, pipeline_worker, job) == 0) job->nworkers++;
  return CB_OK;
}

int cb_gpu_pipeline_ready(const cb_gpu* g, uint32_t shader) {
  const pipeline_job* job = g->job;
  return job && shader < job->m->nshaders && atomic_load_explicit(&job->ready[shader], memory_order_acquire) == 2;
}

/* Wait for one shader's pipeline. */
cb_status cb_gpu_pipeline_wait(cb_gpu* g, uint32_t shader) {
  pipeline_job* job = g->job;
  if (!job || shader >= job->m->nshaders) return cb_fail(CB_ERR_GPU, "pipelines were never started");
  while (!cb_gpu_pipeline_ready(g, shader)) {
    if (atomic_load(&job->failed)) return cb_vk_fail(job->result, "creating a compute pipeline");
    /* make it here if nobody has taken it; else wait: another shader taken
     * now (a GEMM's, say) would hold this thread past the moment it could
     * dispatch */
    if (take(job, shader)) {
      make(job, shader);
    } else {
      struct timespec ts = {0, 20000};
      nanosleep(&ts, NULL);
    }
  }
  return CB_OK;
}

cb_status cb_gpu_pipelines_finish(cb_gpu* g) {
  pipeline_job* job = g->job;
  if (!job) return cb_fail(CB_ERR_GPU, "pipelines were never started");
  pthread_mutex_lock(&job->finish_mu); /* two sessions' first runs may both finish */
  if (!atomic_load(&job->finished)) {
    pipeline_worker(job);
    for (uint32_t k = 0; k < job->nworkers; k++) pthread_join(job->tid[k], NULL);
    job->nworkers = 0;
    while (atomic_load(&job->made) < job->m->nshaders && !atomic_load(&job->failed)) { /* another run's thread */
      struct timespec ts = {0, 20000};
      nanosleep(&ts, NULL);
    }
    atomic_store(&job->finished, 1);
  }
  pthread_mutex_unlock(&job->finish_mu);
  return atomic_load(&job->failed) ? cb_vk_fail(job->result, "creating a compute pipeline") : CB_OK;
}

int cb_gpu_pipelines_done(const cb_gpu* g) {
  return g->job && atomic_load(&g->job->finished) && !atomic_load(&g->job->failed);
}

int cb_gpu_pipelines_made(const cb_gpu* g) {
  return g->job && atomic_load(&g->job->made) == g->job->m->nshaders && !atomic_load(&g->job->failed);
}

const cb_trace_event* cb_gpu_pipeline_events(const cb_gpu* g) { return g && g->job ? g->job->events : NULL; }

/* Pipeline creation stopped (workers finish the pipelines in hand; where
 * every pipeline was begun, they are made and the last one's maker writes
 * the cache, for the next launch) and its state freed: the bundle is
 * released. */
void cb_vk_pipelines_stop(cb_gpu* g) {
  if (!g->job) return;
  if (atomic_load(&g->job->begun) < g->job->m->nshaders) atomic_store(&g->job->stopping, 1);
  for (uint32_t k = 0; k < g->job->nworkers; k++) pthread_join(g->job->tid[k], NULL);
  pthread_mutex_destroy(&g->job->finish_mu);
  cb_free(g->job->events);
  cb_free((void*)g->job->ready);
  cb_free(g->job);
  g->job = NULL;
}
