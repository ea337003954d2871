/* Device memory, one-off copies, and a GPU bundle's weights buffer
 * (uploaded once, transformed on the CPU where the plan says). */
#define _GNU_SOURCE
#include "vulkan/vk.h"

static int memory_type(const cb_gpu* g, uint32_t bits, VkMemoryPropertyFlags want) {
  for (uint32_t i = 0; i < g->mem.memoryTypeCount; i++)
    if ((bits & (1u << i)) && (g->mem.memoryTypes[i].propertyFlags & want) == want) return (int)i;
  return -1;
}

/* A buffer of `size` bytes in memory with `want` (falling back to `fallback`). */
cb_status cb_vk_make_buffer(cb_gpu* g, uint64_t size, VkBufferUsageFlags usage, VkMemoryPropertyFlags want,
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
  return r == VK_SUCCESS ? CB_OK : cb_vk_fail(r, "submitting a copy");
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

/* Every tensor the weights buffer holds, at a 256-aligned offset (any
 * device's storage-buffer offset alignment): the weights some dispatch binds
 * and the prepared tensors the CPU transforms write (raw weights that only
 * a transform reads stay on the CPU). */
cb_status cb_vk_layout_weights(cb_gpu* g, const cb_model* m) {
  g->weight_offset = cb_calloc(m->ntensors ? m->ntensors : 1, sizeof *g->weight_offset);
  g->uploaded = cb_calloc(m->ntensors ? m->ntensors : 1, 1);
  if (!g->weight_offset || !g->uploaded) return cb_fail(CB_ERR_OUT_OF_MEMORY, "out of memory");
  for (uint32_t k = 0; k < m->ndispatches; k++) /* every dispatch and first-run dispatch */
    for (uint32_t a = 0; a < m->dispatches[k].nbindings; a++) {
      uint32_t t = m->dispatches[k].bindings[a];
      if (m->tensors[t].kind == CB_KIND_WEIGHT || m->tensors[t].kind == CB_KIND_PREPARED) g->uploaded[t] = 1;
    }
  uint64_t pos = 0;
  for (uint32_t i = 0; i < m->ntensors; i++)
    if (g->uploaded[i]) {
      g->weight_offset[i] = pos;
      pos = align_up(pos + m->tensors[i].nbytes, 256);
    }
  g->weights_size = pos;
  return cb_vk_make_buffer(g, pos, CB_STORAGE, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, 0, &g->weights, &g->weights_mem);
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

/* A weight stored relaid out (a CPU section's form, Tensor.relayout): each
 * stored element's raw index, walked as an odometer; padding (a raw index
 * past an axis's end) skipped. Every raw element is some stored one's. */
static void unlay(const cb_tensor_desc* d, const float* src, float* dst) {
  int64_t idx[CB_MAX_NDIM] = {0}, comp[CB_MAX_NDIM] = {0};
  for (uint64_t e = 0, n = d->stored / 4; e < n; e++) {
    uint64_t flat = 0;
    int32_t a = 0;
    for (; a < d->ndim && comp[a] < d->shape[a]; a++) flat = flat * (uint64_t)d->shape[a] + (uint64_t)comp[a];
    if (a == d->ndim) dst[flat] = src[e];
    for (int32_t j = (int32_t)d->nrelayout - 1; j >= 0; j--) { /* the next stored index */
      comp[d->relayout_axes[j]] += d->relayout_mults[j];
      if (++idx[j] < d->relayout_shape[j]) break;
      comp[d->relayout_axes[j]] -= d->relayout_mults[j] * idx[j];
      idx[j] = 0;
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
    s = cb_vk_make_buffer(g, g->weights_size, VK_BUFFER_USAGE_TRANSFER_SRC_BIT, CB_HOST, CB_HOST, &staging, &mem);
    if (!s && g->vk.vkMapMemory(g->device, mem, 0, VK_WHOLE_SIZE, 0, &map) != VK_SUCCESS)
      s = cb_fail(CB_ERR_GPU, "Vulkan: cannot map the weights' staging buffer");
    if (!s) {
      for (uint32_t i = 0; i < m->ntensors; i++) {
        const cb_tensor_desc* d = &m->tensors[i];
        uint8_t* to = (uint8_t*)map + g->weight_offset[i];
        if (d->kind != CB_KIND_WEIGHT || !g->uploaded[i]) continue;
        if (d->nrelayout) unlay(d, (const float*)cb_weight_data(base, m, i), (float*)to);
        else memcpy(to, cb_weight_data(base, m, i), d->nbytes);
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
