/* A GPU session: arena and staging buffers, descriptor sets, and the
 * command buffer recorded once and submitted by every run. */
#define _GNU_SOURCE
#include "vulkan/vk.h"

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
    s = r == VK_SUCCESS ? record(gs, m, sets) : cb_vk_fail(r, "creating the session's command buffer");
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
