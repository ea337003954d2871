/* The CPU executor (cpu/): the kernels' ABI and the thread pool that runs
 * their parallel loops (backend.c), a CPU bundle's code loaded and its
 * kernels found (code.c), the runtime's own fp16 widening (widen.c).
 * Includes only base/, bundle/ and cpu/. */
#ifndef COLDBREW_CPU_H_
#define COLDBREW_CPU_H_

#include "bundle/bundle.h"

/* DLPack's DLTensor and tvm-ffi's TVMFFIAny, restated (ABI-stable): a
 * kernel's arguments. */
typedef struct {
  void* data;
  int32_t device_type, device_id;
  int32_t ndim;
  uint8_t code, bits;
  uint16_t lanes;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
} cb_dltensor;

typedef struct {
  int32_t type_index;
  uint32_t zero_padding;
  union {
    int64_t v_int64;
    void* v_ptr;
  };
} cb_ffi_any;

enum { CB_FFI_NONE = 0, CB_FFI_INT = 1, CB_FFI_DLTENSOR_PTR = 7, CB_DL_CPU = 1 };

/* TVM backend hooks (backend.c). */
/* Run fn's tasks on the pool as a kernel's parallel loop would (inline on a
 * preparation worker, inside a task, or with one active thread: then one
 * task, env->num_task == 1). Nonzero if a task failed. A cb_parallel_launch. */
int cb_backend_parallel(cb_parallel_lambda fn, void* cdata, int num_task);
/* The kernels' hooks into the pool set in the code just loaded (`find`:
 * its symbol's address, or NULL). */
void cb_backend_install(void* (*find)(const cb_bundle* b, const char* name), const cb_bundle* b);
const char* cb_backend_kernel_error(void);
void cb_backend_clear_kernel_error(void);
/* After a kernel call failed on this thread: its workspace blocks are free again. */
void cb_backend_kernel_failed(void);
/* Size the process-wide pool that runs kernels' parallel loops (n >= 1). */
cb_status cb_backend_set_threads(int n);
int cb_backend_threads(void);
/* Threads a parallel launch uses from now on, at most the pool's size (a
 * session whose runs use fewer threads than the pool holds; also where
 * preparation workers are placed), and each one's share of a parallel
 * loop: thread k runs shares[k] consecutive tasks of sum(shares) (cores of
 * different speeds); NULL splits evenly, one task per thread. */
void cb_backend_set_split(int n, const uint8_t* shares);
/* Pin the calling thread to the core the pool was built around (its workers
 * sit on the next cores; without workers, the core it is on, which
 * preparation workers then count from; where the cores' classes differ,
 * the fastest core, the workers on the next fastest); `saved` receives the
 * old mask for restore. Returns 1 if pinned. */
int cb_backend_pin_caller(void* saved_cpu_set);
void cb_backend_restore_caller(const void* saved_cpu_set);
/* Make the calling thread preparation worker `queue` (>= 1): pin it to the
 * first core after the execution cores (wrapping around when there are not
 * enough; where the classes differ, the fastest core the execution threads
 * leave) and run its parallel launches inline, so its transforms never take
 * the execution cores' pool. */
void cb_backend_enter_prep_worker(uint32_t queue);
/* The cores by class, fastest first, with their sysfs capacity: how many
 * were written to `cores` / `capacity` (at most `max`), 0 where every core
 * reports the same (one class: the pool is placed around the caller). */
int cb_backend_core_classes(int* cores, long* capacity, int max);
/* A runtime thread about to end (a preparation worker): its cached
 * workspace blocks freed now, not left to its exit's key destructor. */
void cb_backend_leave_thread(void);

/* code.c: a CPU bundle's open, after bundle/'s checks (cb_bundle_verify;
 * `t0`: when the open began, `flags` as it left them): the pool started,
 * every segment but the weights checked (an older bundle's weights too),
 * the code loaded and each step's kernels found. */
cb_status cb_open_cpu(cb_bundle* b, uint64_t t0, uint32_t flags);
/* The code unloaded and the kernels' tables freed (at release). */
void cb_code_unload(cb_bundle* b);

/* The compiler's kernel object loaded without the system loader (elf.c):
 * from the code segment's bytes `src` (n; an LZ4 block when `compressed`),
 * the object `image` bytes long. *out stays NULL, with CB_OK, for an object
 * this loader does not take (the caller then takes the system loader's
 * way); CB_ERR_CORRUPT where the block does not decode. */
typedef struct cb_elf cb_elf;
cb_status cb_elf_load(const uint8_t* src, uint64_t n, uint64_t image, int compressed, cb_elf** out);
void* cb_elf_symbol(const cb_elf* e, const char* name);
void cb_elf_free(cb_elf* e);

#endif /* COLDBREW_CPU_H_ */
