/* A GPU session: arena and staging buffers, descriptor sets (one per
 * dispatch and first-run dispatch), and the command buffer recorded once
 * and submitted by every run. A run that comes while pipelines are still
 * being made submits its layers in chunks instead, each as soon as its
 * pipelines exist, a layer whose own pipelines do not exist yet through its
 * first-run launches where it has them. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "vulkan/vk.h"

static void barrier(cb_gpu* g, VkCommandBuffer cmd, VkPipelineStageFlags src, VkAccessFlags src_access,
                    VkPipelineStageFlags dst, VkAccessFlags dst_access) {
  VkMemoryBarrier mb = {VK_STRUCTURE_TYPE_MEMORY_BARRIER, NULL, src_access, dst_access};
  g->vk.vkCmdPipelineBarrier(cmd, src, dst, 0, 1, &mb, 0, NULL, 0, NULL);
}

static void copy_io(cb_gpu_session* gs, VkCommandBuffer cmd, const cb_model* m, const uint32_t* ids, uint32_t n,
                    int in) {
  VkBufferCopy regions[64];
  uint32_t k = 0;
  for (uint32_t i = 0; i < n; i++) {
    const cb_tensor_desc* d = &m->tensors[ids[i]];
    regions[k++] = (VkBufferCopy){d->arena_offset, d->arena_offset, d->nbytes};
    if (k == 64 || i + 1 == n) {
      gs->gpu->vk.vkCmdCopyBuffer(cmd, in ? gs->staging : gs->arena, in ? gs->arena : gs->staging, k, regions);
      k = 0;
    }
  }
}

/* Begin `cmd`; the first one also copies the inputs in. */
static cb_status begin(cb_gpu_session* gs, VkCommandBuffer cmd, int inputs) {
  cb_gpu* g = gs->gpu;
  VkCommandBufferBeginInfo bi = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, NULL, 0, NULL};
  VK_TRY(g->vk.vkBeginCommandBuffer(cmd, &bi), "vkBeginCommandBuffer");
  if (!inputs) return CB_OK;
  barrier(g, cmd, VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_WRITE_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT,
          VK_ACCESS_TRANSFER_READ_BIT);
  copy_io(gs, cmd, gs->m, gs->m->inputs, gs->m->ninputs, 1);
  barrier(g, cmd, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT,
          VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
  return CB_OK;
}

/* Dispatch `d` (its descriptor set is the one of its place in the model's
 * array of dispatches) and the barrier after it. A barrier's scope spans
 * later submissions to the queue, so a chunk ends with it too. */
static void dispatch(cb_gpu_session* gs, VkCommandBuffer cmd, const cb_dispatch_desc* d) {
  cb_gpu* g = gs->gpu;
  const cb_shader_desc* sh = &gs->m->shaders[d->shader];
  size_t k = (size_t)(d - gs->m->dispatches);
  g->vk.vkCmdBindPipeline(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, g->pipelines[d->shader]);
  g->vk.vkCmdBindDescriptorSets(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, g->layouts[sh->bindings], 0, 1, &gs->sets[k], 0,
                                NULL);
  if (d->npush)
    g->vk.vkCmdPushConstants(cmd, g->layouts[sh->bindings], VK_SHADER_STAGE_COMPUTE_BIT, 0, 4 * d->npush, d->push);
  g->vk.vkCmdDispatch(cmd, d->grid[0], d->grid[1], d->grid[2]);
  barrier(g, cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT,
          VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
          VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT);
}

/* The outputs copied out, and `cmd` ended. */
static cb_status end(cb_gpu_session* gs, VkCommandBuffer cmd) {
  cb_gpu* g = gs->gpu;
  copy_io(gs, cmd, gs->m, gs->m->outputs, gs->m->noutputs, 0);
  barrier(g, cmd, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT,
          VK_ACCESS_HOST_READ_BIT);
  VK_TRY(g->vk.vkEndCommandBuffer(cmd), "vkEndCommandBuffer");
  return CB_OK;
}

/* The command buffer every run submits: the whole plan. */
static cb_status record(cb_gpu_session* gs) {
  cb_status s = begin(gs, gs->cmd, 1);
  for (uint32_t i = 0; !s && i < gs->m->nsteps; i++)
    for (uint32_t j = 0; j < gs->m->steps[i].ndispatches; j++) dispatch(gs, gs->cmd, &gs->m->steps[i].dispatches[j]);
  if (!s) s = end(gs, gs->cmd);
  if (!s) gs->recorded = 1;
  return s;
}

/* The chunks of a first run: command buffers, their fences, their events. */
typedef struct chunks {
  VkCommandBuffer cmd[CB_GPU_MAX_CHUNKS];
  VkFence fence[CB_GPU_MAX_CHUNKS];
  cb_trace_event ev[CB_GPU_MAX_CHUNKS];
  uint32_t n, submitted, done; /* chunks begun, submitted, seen complete (in order) */
} chunks;

static cb_status chunk_begin(cb_gpu_session* gs, chunks* c, uint32_t step) {
  cb_gpu* g = gs->gpu;
  VkCommandBufferAllocateInfo ai = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, NULL, gs->cmd_pool,
                                    VK_COMMAND_BUFFER_LEVEL_PRIMARY, 1};
  VK_TRY(g->vk.vkAllocateCommandBuffers(g->device, &ai, &c->cmd[c->n]), "vkAllocateCommandBuffers");
  VkFenceCreateInfo fci = {VK_STRUCTURE_TYPE_FENCE_CREATE_INFO, NULL, 0};
  VK_TRY(g->vk.vkCreateFence(g->device, &fci, NULL, &c->fence[c->n]), "vkCreateFence");
  c->ev[c->n] = (cb_trace_event){step, CB_PHASE_GPU_EXECUTE, -1, 0, 0, 0, 0, 0};
  uint32_t k = c->n++;
  return begin(gs, c->cmd[k], k == 0);
}

static cb_status chunk_submit(cb_gpu_session* gs, chunks* c) {
  cb_gpu* g = gs->gpu;
  uint32_t k = c->n - 1;
  VK_TRY(g->vk.vkEndCommandBuffer(c->cmd[k]), "vkEndCommandBuffer");
  VkSubmitInfo si = {VK_STRUCTURE_TYPE_SUBMIT_INFO, NULL, 0, NULL, NULL, 1, &c->cmd[k], 0, NULL};
  c->ev[k].start_ns = cb_now_ns();
  VK_TRY(g->vk.vkQueueSubmit(g->queue, 1, &si, c->fence[k]), "vkQueueSubmit");
  c->submitted++;
  return CB_OK;
}

/* Stamp the submitted chunks seen complete (`wait`: wait for them all). */
static cb_status chunks_poll(cb_gpu_session* gs, chunks* c, int wait) {
  cb_gpu* g = gs->gpu;
  for (; c->done < c->submitted; c->done++) {
    VkResult r = wait ? g->vk.vkWaitForFences(g->device, 1, &c->fence[c->done], VK_TRUE, UINT64_MAX)
                      : g->vk.vkGetFenceStatus(g->device, c->fence[c->done]);
    if (r == VK_NOT_READY) return CB_OK;
    if (r != VK_SUCCESS) return cb_vk_fail(r, "waiting for the GPU");
    c->ev[c->done].end_ns = cb_now_ns();
  }
  return CB_OK;
}

/* The launches step `st` makes in a run while pipelines are being made:
 * its own once their pipelines exist, until then its first-run ones where it
 * has them (COLDBREW_GPU_FIRST_RUN=plan: its own, always). */
static const cb_dispatch_desc* launches(const cb_gpu* g, const cb_step_desc* st, int own_only, uint32_t* n) {
  int made = 1;
  for (uint32_t j = 0; made && j < st->ndispatches; j++) made = cb_gpu_pipeline_ready(g, st->dispatches[j].shader);
  int first = !made && !own_only && st->nfirst_dispatches;
  *n = first ? st->nfirst_dispatches : st->ndispatches;
  return first ? st->first_dispatches : st->dispatches;
}

/* A run while pipelines are being made: dispatches recorded in plan order;
 * where the next one's pipeline does not exist yet, the chunk so far is
 * submitted and this thread helps make pipelines until it does. */
static cb_status run_chunked(cb_gpu_session* gs, chunks* c, int own_only) {
  cb_gpu* g = gs->gpu;
  const cb_model* m = gs->m;
  cb_status s = chunk_begin(gs, c, 0);
  uint32_t in_chunk = 0, n = 0;
  for (uint32_t i = 0; !s && i < m->nsteps; i++) {
    const cb_dispatch_desc* ds = launches(g, &m->steps[i], own_only, &n);
    for (uint32_t j = 0; !s && j < n; j++) {
      const cb_dispatch_desc* d = &ds[j];
      if (!cb_gpu_pipeline_ready(g, d->shader)) {
        if (in_chunk && c->n < CB_GPU_MAX_CHUNKS) {
          if ((s = chunk_submit(gs, c)) || (s = chunk_begin(gs, c, i))) break;
          in_chunk = 0;
        }
        if ((s = cb_gpu_pipeline_wait(g, d->shader)) || (s = chunks_poll(gs, c, 0))) break;
      }
      dispatch(gs, c->cmd[c->n - 1], d);
      if (j == 0 && ds != m->steps[i].dispatches) c->ev[c->n - 1].alternate++; /* first-run layers, per chunk */
      in_chunk++;
    }
  }
  if (!s) s = end(gs, c->cmd[c->n - 1]);
  if (!s) s = chunk_submit(gs, c);
  cb_status w = chunks_poll(gs, c, 1);
  return s ? s : w;
}

static cb_status bind_sets(cb_gpu_session* gs, const cb_model* m, VkDescriptorSet* sets, uint32_t nsets,
                           uint32_t nbindings) {
  cb_gpu* g = gs->gpu;
  VkDescriptorPoolSize size = {VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, nbindings ? nbindings : 1};
  VkDescriptorPoolCreateInfo pci = {VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO, NULL, 0, nsets, 1, &size};
  VK_TRY(g->vk.vkCreateDescriptorPool(g->device, &pci, NULL, &gs->pool), "vkCreateDescriptorPool");
  uint64_t align = g->props.limits.minStorageBufferOffsetAlignment;
  for (uint32_t k = 0; k < nsets; k++) {
    const cb_dispatch_desc* d = &m->dispatches[k];
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
      /* whole 32-bit words (shaders read bool tensors four bytes to a word; slots are 256-byte aligned) */
      info[a] = (VkDescriptorBufferInfo){weight ? g->weights : gs->arena, off,
                                         t->nbytes ? (t->nbytes + 3) & ~(uint64_t)3 : VK_WHOLE_SIZE};
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
  gs->gpu = g, gs->m = m;
  uint32_t nsets = m->ndispatches, nbindings = 0; /* every dispatch and first-run dispatch */
  for (uint32_t k = 0; k < nsets; k++) nbindings += m->dispatches[k].nbindings;
  VkDescriptorSet* sets = gs->sets = cb_calloc(nsets ? nsets : 1, sizeof *sets);
  cb_status s = sets ? CB_OK : cb_fail(CB_ERR_OUT_OF_MEMORY, "out of memory");
  if (!s) s = cb_vk_make_buffer(g, m->arena_size, CB_STORAGE, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, 0, &gs->arena,
                          &gs->arena_mem);
  if (!s) s = cb_vk_make_buffer(g, m->arena_size, VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT,
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
    s = r != VK_SUCCESS ? cb_vk_fail(r, "creating the session's command buffer")
        : cb_gpu_pipelines_done(g) ? record(gs) : CB_OK; /* else the first run records it */
  }
  if (s) {
    cb_gpu_session_release(gs);
    return s;
  }
  *out = gs;
  *host_view = gs->staging_map;
  return CB_OK;
}

/* Every pipeline made (waiting for them, helping), the cache written, and
 * the command buffer every later run submits recorded. */
static cb_status finish(cb_gpu_session* gs) {
  cb_status s = cb_gpu_pipelines_finish(gs->gpu);
  return s ? s : record(gs);
}

cb_status cb_gpu_session_run(cb_gpu_session* gs, cb_trace_event* events, uint32_t* nevents) {
  cb_gpu* g = gs->gpu;
  if (nevents) *nevents = 0;
  /* COLDBREW_GPU_FIRST_RUN: "whole" waits for every pipeline first; "plan"
   * dispatches each layer once its own pipelines exist, without first-run
   * launches; unset: each layer as soon as it can (bench/gpu.py samples all three) */
  const char* mode = gs->recorded ? NULL : getenv("COLDBREW_GPU_FIRST_RUN");
  if (!gs->recorded && ((mode && !strcmp(mode, "whole")) || cb_gpu_pipelines_made(g))) {
    cb_status s = finish(gs);
    if (s) return s;
  }
  if (!gs->recorded) {
    chunks c = {0};
    cb_status s = run_chunked(gs, &c, mode && !strcmp(mode, "plan"));
    for (uint32_t k = 0; k < c.n; k++) {
      if (events && nevents && c.ev[k].end_ns) events[(*nevents)++] = c.ev[k];
      if (c.fence[k]) g->vk.vkDestroyFence(g->device, c.fence[k], NULL);
    }
    if (c.n) g->vk.vkFreeCommandBuffers(g->device, gs->cmd_pool, c.n, c.cmd);
    /* the pipelines still being made go on: the first run after they all exist records */
    return !s && cb_gpu_pipelines_made(g) ? finish(gs) : s;
  }
  VK_TRY(g->vk.vkResetFences(g->device, 1, &gs->fence), "vkResetFences");
  VkSubmitInfo si = {VK_STRUCTURE_TYPE_SUBMIT_INFO, NULL, 0, NULL, NULL, 1, &gs->cmd, 0, NULL};
  uint64_t t0 = cb_now_ns();
  VK_TRY(g->vk.vkQueueSubmit(g->queue, 1, &si, gs->fence), "vkQueueSubmit");
  VK_TRY(g->vk.vkWaitForFences(g->device, 1, &gs->fence, VK_TRUE, UINT64_MAX), "vkWaitForFences");
  if (events && nevents) events[(*nevents)++] = (cb_trace_event){CB_STEP_BUNDLE, CB_PHASE_GPU_EXECUTE, -1, 0, t0,
                                                                 cb_now_ns(), 0, 0};
  return CB_OK;
}

/* One step's dispatches (the first step's with the inputs copied in), its
 * outputs copied to staging; submitted and waited for. */
static cb_status run_step(cb_gpu_session* gs, VkCommandBuffer cmd, uint32_t i) {
  cb_gpu* g = gs->gpu;
  const cb_step_desc* st = &gs->m->steps[i];
  cb_status s = begin(gs, cmd, i == 0);
  for (uint32_t j = 0; !s && j < st->ndispatches; j++) dispatch(gs, cmd, &st->dispatches[j]);
  if (s) return s;
  copy_io(gs, cmd, gs->m, st->args + st->nargs - st->nouts, st->nouts, 0);
  barrier(g, cmd, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT,
          VK_ACCESS_HOST_READ_BIT);
  VK_TRY(g->vk.vkEndCommandBuffer(cmd), "vkEndCommandBuffer");
  VK_TRY(g->vk.vkResetFences(g->device, 1, &gs->fence), "vkResetFences");
  VkSubmitInfo si = {VK_STRUCTURE_TYPE_SUBMIT_INFO, NULL, 0, NULL, NULL, 1, &cmd, 0, NULL};
  VK_TRY(g->vk.vkQueueSubmit(g->queue, 1, &si, gs->fence), "vkQueueSubmit");
  VK_TRY(g->vk.vkWaitForFences(g->device, 1, &gs->fence, VK_TRUE, UINT64_MAX), "vkWaitForFences");
  return CB_OK;
}

cb_status cb_gpu_session_run_steps(cb_gpu_session* gs, void (*done)(void*, uint32_t), void* ctx) {
  cb_gpu* g = gs->gpu;
  VkCommandBufferAllocateInfo ai = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, NULL, gs->cmd_pool,
                                    VK_COMMAND_BUFFER_LEVEL_PRIMARY, 1};
  cb_status s = gs->recorded ? CB_OK : finish(gs); /* every layer's own pipelines */
  for (uint32_t i = 0; !s && i < gs->m->nsteps; i++) {
    VkCommandBuffer cmd;
    VK_TRY(g->vk.vkAllocateCommandBuffers(g->device, &ai, &cmd), "vkAllocateCommandBuffers");
    s = run_step(gs, cmd, i);
    g->vk.vkFreeCommandBuffers(g->device, gs->cmd_pool, 1, &cmd);
    if (!s) done(ctx, i);
  }
  return s;
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
  cb_free(gs->sets);
  cb_free(gs);
}
