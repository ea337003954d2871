/* The handful of backend symbols TVM-generated CPU code calls. coldbrew
 * provides them itself so the runtime never links TVM, and so it owns the
 * threads that run parallel loops. The ABI is restated here (tvm-ffi C ABI,
 * DLPack) rather than included, to keep the runtime free of TVM headers. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define CB_EXPORT __attribute__((visibility("default")))

static _Thread_local char g_kernel_error[512];

const char* cb_backend_kernel_error(void) { return g_kernel_error; }
void cb_backend_clear_kernel_error(void) { g_kernel_error[0] = 0; }

/* Kernels report argument-check failures here (it is the one undefined
 * symbol in their shared object, so it must be global in the process). */
CB_EXPORT void TVMFFIErrorSetRaisedFromCStrParts(const char* kind, const char** parts, int32_t n) {
  size_t len = (size_t)snprintf(g_kernel_error, sizeof g_kernel_error, "%s: ", kind ? kind : "Error");
  for (int32_t i = 0; i < n && len < sizeof g_kernel_error; i++) {
    if (!parts[i]) continue;
    len += (size_t)snprintf(g_kernel_error + len, sizeof g_kernel_error - len, "%s", parts[i]);
  }
}

static void* workspace_alloc(int device_type, int device_id, uint64_t nbytes, int dtype_code,
                             int dtype_bits) {
  (void)device_type, (void)device_id, (void)dtype_code, (void)dtype_bits;
  size_t size = (size_t)((nbytes + 63) & ~(uint64_t)63);
  return aligned_alloc(64, size ? size : 64);
}

static int workspace_free(int device_type, int device_id, void* ptr) {
  (void)device_type, (void)device_id;
  free(ptr);
  return 0;
}

/* TVMParallelGroupEnv and FTVMParallelLambda, restated. */
typedef struct {
  void* sync_handle;
  int32_t num_task;
} cb_parallel_env;
typedef int (*cb_parallel_lambda)(int task_id, cb_parallel_env* env, void* cdata);

/* Single-task launch: the generated loop covers the whole range in task 0. */
static int parallel_launch(cb_parallel_lambda fn, void* cdata, int num_task) {
  (void)num_task;
  cb_parallel_env env = {NULL, 1};
  return fn(0, &env, cdata);
}

static int parallel_barrier(int task_id, cb_parallel_env* env) {
  (void)task_id, (void)env;
  return 0;
}

static void set_slot(void* handle, const char* name, void* fn) {
  void** slot = (void**)dlsym(handle, name);
  if (slot) *slot = fn;
}

void cb_backend_install(void* handle) {
  set_slot(handle, "__TVMBackendAllocWorkspace", (void*)workspace_alloc);
  set_slot(handle, "__TVMBackendFreeWorkspace", (void*)workspace_free);
  set_slot(handle, "__TVMBackendParallelLaunch", (void*)parallel_launch);
  set_slot(handle, "__TVMBackendParallelBarrier", (void*)parallel_barrier);
}
