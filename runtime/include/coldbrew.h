/* coldbrew runtime: load a cold-start bundle and run it.
 *
 * Ownership, stated once: every object returned through an `out_` pointer by
 * a cb_*_open / cb_*_create call belongs to the caller and is released with
 * the matching cb_*_release. A session borrows its bundle: release every
 * session before the bundle. Pointers returned by info / output calls point
 * into the bundle or session and stay valid until that object is released.
 *
 * Every fallible call returns a cb_status (CB_OK == 0). On failure,
 * cb_last_error() returns a message for the calling thread's last failure.
 *
 * The runtime does not link TVM: kernels in a bundle are TVM-generated CPU
 * code whose few backend hooks (errors, workspace, parallel launch) this
 * library provides itself.
 *
 * Threads, stated once:
 * - A bundle, once open, may be shared: sessions over it may be created,
 *   run and released on several threads at once (each tensor's checksum is
 *   checked once, whichever run reads it first). Release it once, after
 *   its last session.
 * - A session belongs to one thread at a time: its calls (set_input_shape,
 *   set_input, run, get_output, info, trace, alternates) must not overlap.
 *   Outputs borrowed from it change with its next run.
 * - Kernels' parallel loops run on one process-wide pool of threads. Each
 *   open, session creation and run sizes the pool to the threads it needs
 *   (the plan's count, or cb_session_options.threads), so sessions of
 *   different thread counts resize it as they alternate: correct, but each
 *   resize starts threads; give sessions that alternate one count. Runs on
 *   several threads at once take turns at each parallel loop: correct,
 *   about as fast as running one after the other.
 * - A first run of a bundle planned with preparation queues starts a
 *   worker thread per queue for that run; a continuous-mode session's first
 *   run starts one idle-priority thread that ends once the warm
 *   alternates are ready (or the session is released).
 */
#ifndef COLDBREW_H_
#define COLDBREW_H_

#include <stddef.h>
#include <stdint.h>

/* The library exports exactly what this header (and, for the runtime's own
 * tests and tools, coldbrew_testing.h) declares, between CB_API_BEGIN and
 * CB_API_END: C linkage, default visibility (the library is built with
 * -fvisibility=hidden). */
#ifdef __cplusplus
#define CB_EXTERN_C_BEGIN extern "C" {
#define CB_EXTERN_C_END }
#else
#define CB_EXTERN_C_BEGIN
#define CB_EXTERN_C_END
#endif
#if defined(__GNUC__)
#define CB_API_BEGIN CB_EXTERN_C_BEGIN _Pragma("GCC visibility push(default)")
#define CB_API_END _Pragma("GCC visibility pop") CB_EXTERN_C_END
#else
#define CB_API_BEGIN CB_EXTERN_C_BEGIN
#define CB_API_END CB_EXTERN_C_END
#endif

CB_API_BEGIN

/* bundles this runtime reads: schemas CB_SCHEMA_MIN_VERSION..CB_SCHEMA_VERSION (schemas/README.md) */
#define CB_SCHEMA_VERSION 9u
#define CB_SCHEMA_MIN_VERSION 4u

typedef enum cb_status {
  CB_OK = 0,
  CB_ERR_INVALID_ARGUMENT = 1, /* a caller mistake: bad name, shape, size */
  CB_ERR_IO = 2,               /* the file could not be opened or mapped */
  CB_ERR_BAD_MAGIC = 3,        /* not a coldbrew bundle */
  CB_ERR_VERSION = 4,          /* a bundle schema this runtime does not read */
  CB_ERR_CORRUPT = 5,          /* failed verification: truncated or altered */
  CB_ERR_TARGET = 6,           /* built for another CPU / ISA */
  CB_ERR_LOAD = 7,             /* kernel code could not be loaded or resolved */
  CB_ERR_KERNEL = 8,           /* a kernel reported an error while running */
  CB_ERR_OUT_OF_MEMORY = 9,
  CB_ERR_GPU = 10,             /* a GPU bundle found no usable Vulkan loader, driver or device */
  CB_ERR_SIGNATURE = 11,       /* a signature was required: the bundle is unsigned, signed by another
                                  key or altered since it was signed (or libsodium is missing) */
} cb_status;

/* Element types, numbered as coldbrew.schema.DType. */
typedef enum cb_dtype {
  CB_F32 = 0, CB_F16 = 1, CB_F64 = 2, CB_I8 = 3, CB_I16 = 4, CB_I32 = 5,
  CB_I64 = 6, CB_U8 = 7, CB_U16 = 8, CB_U32 = 9, CB_U64 = 10, CB_BOOL = 11,
} cb_dtype;

/* Flags for cb_bundle_open_*. */
/* Opening verifies the header and code; each weight tensor is verified by
 * the first run, when it is read (a mismatch fails that run with
 * CB_ERR_CORRUPT). This flag skips the weight checks. */
#define CB_OPEN_SKIP_WEIGHT_CHECKSUMS 1u

/* Signed bundles (`coldbrew compile --sign KEY`) end in a signature block:
 * an Ed25519 signature, by the key whose public half it names, over the
 * BLAKE2b-256 hash of every byte before it (preamble, header, every
 * segment). With a `public_key`, opening reads the whole bundle (a file
 * into memory of the bundle's own, not a mapping: what was verified is what
 * runs, whatever happens to the file later), hashes it and checks the
 * signature first, before parsing the header or mapping any
 * code executable, and refuses (CB_ERR_SIGNATURE) a bundle that is
 * unsigned, signed by another key, or altered in any byte. The check uses
 * libsodium (libsodium.so.23), loaded then. Without a key a signature is
 * not required (nor checked). */
#define CB_PUBLIC_KEY_BYTES 32u
/* Multi-target bundles (`coldbrew compile --target host,aarch64,vulkan`)
 * hold one section per target, best first: the open takes the first this
 * machine runs (a GPU section where a Vulkan device opens, unless
 * CB_OPEN_CPU_ONLY; a CPU section whose features this CPU has), or the one
 * `target` names; none: CB_ERR_TARGET naming each and why. */
#define CB_OPEN_CPU_ONLY 2u
typedef struct cb_open_options {
  uint32_t flags;               /* CB_OPEN_* */
  const uint8_t* public_key;    /* CB_PUBLIC_KEY_BYTES bytes, or NULL: no signature required */
  const char* target;           /* a multi-target bundle's section, by name, or NULL: the best that runs */
} cb_open_options;

typedef struct cb_bundle cb_bundle;
typedef struct cb_session cb_session;

typedef struct cb_tensor_info {
  const char* name;
  cb_dtype dtype;
  int32_t ndim;
  const int64_t* shape;
  uint64_t nbytes;
} cb_tensor_info;

/* Session modes. COLD runs the bundle's plan every time. CONTINUOUS
 * (bundles compiled with --continuous; papers/nnv12-cold-inference.txt
 * section 3.5): the first run follows the cold plan, while a thread at idle
 * priority (SCHED_IDLE: it takes only time no other thread wants) reads and
 * checks the weights of each layer's warm-fastest variant once the first
 * run has read its own; every later run executes each layer with its warm
 * variant if that one is ready, else with the plan's, and with the plan's
 * warm thread count. A warm weight that fails its checksum fails the run
 * that follows with CB_ERR_CORRUPT. */
typedef enum cb_mode { CB_MODE_COLD = 0, CB_MODE_CONTINUOUS = 1 } cb_mode;

/* Parallel loops: each execution thread takes a share of a loop's tasks.
 * Bundles for targets whose cores differ in speed carry shares in
 * proportion to the speeds of the cores the threads run on (fastest class
 * first); elsewhere the split is even. `exec_shares` (one entry of 1..255
 * per execution thread of the first run) replaces the plan's for runs with
 * that many threads: an app that knows one core is slower (e.g. busy) can
 * say so. */
typedef struct cb_session_options {
  uint32_t threads; /* execution threads; 0 = the plan's choice */
  uint32_t trace;   /* 1 = record a trace event per layer and phase */
  uint32_t mode;    /* cb_mode */
  uint32_t exec_share_count; /* entries in exec_shares; 0: the plan's split */
  const uint8_t* exec_shares;
} cb_session_options;

/* Phases of a cold run. Events with step = CB_STEP_BUNDLE cover opening
 * the bundle: verification (header, code), loading its code (the execution
 * threads start meanwhile), then creating the session. READ
 * brings a step's weights into memory and checks them (first run only),
 * TRANSFORM turns raw weights into the kernel's layout (first run only,
 * raw-weight steps), EXECUTE runs it. On the first run, steps the plan puts
 * on a preparation queue are read and transformed by a worker thread pinned
 * to a core after the execution cores, ahead of execution; the executing
 * thread waits (blocking) for a step's preparation before running it. */
typedef enum cb_phase {
  CB_PHASE_TRANSFORM = 1, CB_PHASE_EXECUTE = 2, CB_PHASE_READ = 3, CB_PHASE_VERIFY = 4, CB_PHASE_CODE_LOAD = 5,
  CB_PHASE_SESSION = 6,
  /* GPU bundles prepare at open, CPU threads ahead of the GPU: a reader
   * thread reads and checks every step's weights (READ, on its core) while
   * the opening thread makes the GPU context (GPU_CONTEXT); then worker
   * threads make the pipelines (PIPELINE, one event per shader, through the
   * pipeline cache) while the opening thread copies the weights to the
   * device (UPLOAD) and then helps with the pipelines. GPU_EXECUTE runs the
   * recorded command buffer (inputs in, every dispatch, outputs out); its
   * event's cpu is -1: the GPU's own lane. */
  CB_PHASE_UPLOAD = 7, CB_PHASE_GPU_EXECUTE = 8,
  CB_PHASE_GPU_CONTEXT = 9, /* GPU bundles at open: Vulkan loader, instance and device */
  CB_PHASE_PIPELINE = 10,   /* GPU bundles at open: one shader's pipeline (`step` = shader index) */
  CB_PHASE_THREAD_START = 11 /* starting threads: the execution pool's at open, the preparation workers' at the first run */
} cb_phase;
#define CB_STEP_BUNDLE 0xFFFFFFFFu

/* One traced phase of one plan step (times: CLOCK_MONOTONIC nanoseconds).
 * The first run of a traced session also reports the bundle's open phases. */
typedef struct cb_trace_event {
  uint32_t step;
  uint32_t phase;     /* cb_phase */
  int32_t cpu;        /* core the phase started on */
  uint32_t alternate; /* 1: the step's warm alternate (continuous mode), 0: the plan's variant */
  uint64_t start_ns, end_ns;
  uint32_t worker;    /* q: preparation worker q (queue q's; it may have taken another queue's step), 0: any other thread */
  uint32_t faults;    /* page faults the thread took during the phase (minor: fresh memory, pages already cached) */
} cb_trace_event;

const char* cb_last_error(void);
const char* cb_status_name(cb_status status);

/* Open and verify a bundle file (mapped, zero-copy). */
cb_status cb_bundle_open_file(const char* path, uint32_t flags, cb_bundle** out_bundle);
/* Open and verify a bundle in memory. The caller keeps `data` alive and
 * unchanged until the bundle is released. */
cb_status cb_bundle_open_memory(const void* data, size_t size, uint32_t flags,
                                cb_bundle** out_bundle);
/* The same, with options (NULL: defaults). */
cb_status cb_bundle_open_file_with(const char* path, const cb_open_options* options, cb_bundle** out_bundle);
cb_status cb_bundle_open_memory_with(const void* data, size_t size, const cb_open_options* options,
                                     cb_bundle** out_bundle);
void cb_bundle_release(cb_bundle* bundle);
/* The target an open bundle runs: a multi-target bundle's section name, else its CPU (or GPU API). */
const char* cb_bundle_target(const cb_bundle* bundle);

/* Opening in the background. cb_bundle_open_async returns at once with a
 * handle; a thread of the handle's own opens the bundle (as
 * cb_bundle_open_file_with) and then reads and checks every step's weights
 * in plan order, so a first run finds them in memory. The bundle can be
 * used as soon as it is open (cb_open_bundle waits for that only): a run
 * then waits only for the weights its layers need, as every first run does.
 * Ready: the weights read, or the open or a weight's check failed.
 * Threads and ownership: every cb_open_* call is safe from any thread. The
 * handle owns the bundle: cb_open_bundle lends it until cb_open_release,
 * which is called once, after every session made from the bundle is
 * released; it cancels what is left (the reading stops at its next
 * tensor; an open under way is waited for), joins the thread and frees
 * everything. `on_ready` (or NULL) runs once, on the handle's thread, when
 * the handle is ready (with the open's status); it may call cb_open_* on
 * the handle, cb_open_release too: the handle's thread then frees
 * everything once the callback returns. */
typedef struct cb_open_handle cb_open_handle;
typedef void (*cb_open_ready_fn)(void* user, cb_status status);
typedef struct cb_open_progress {
  uint64_t bytes_read, bytes_total; /* the bundle's bytes read (its section's, multi-target), of its size */
  uint32_t layers_ready, layers_total; /* steps whose weights are read and checked, of the plan's */
  int32_t opened;                   /* the open has ended (then cb_open_bundle returns at once) */
} cb_open_progress;
cb_status cb_bundle_open_async(const char* path, const cb_open_options* options, cb_open_ready_fn on_ready,
                               void* user, cb_open_handle** out_handle);
int cb_open_ready(cb_open_handle* handle);
/* Wait until ready, at most timeout_ms (< 0: no limit): 1 ready, 0 not yet. */
int cb_open_wait(cb_open_handle* handle, int64_t timeout_ms);
/* Wait for the open and lend its bundle, or return the open's failure (or a weight's). */
cb_status cb_open_bundle(cb_open_handle* handle, cb_bundle** out_bundle);
void cb_open_get_progress(cb_open_handle* handle, cb_open_progress* out);
/* Stop the reading at its next tensor (the handle is then soon ready, the
 * bundle usable; nothing is freed): for a waiter to leave before the release. */
void cb_open_cancel(cb_open_handle* handle);
void cb_open_release(cb_open_handle* handle);
/* The checks an open makes of a bundle's structure (preamble, header,
 * tensors, plan, a GPU bundle's shaders and dispatches), without those of
 * the running machine (target, code, GPU): for tools that write or ship
 * bundles for other machines (the compiler runs it on every bundle it
 * writes). */
cb_status cb_bundle_check_memory(const void* data, size_t size);
/* Check every weight tensor now rather than when a run first reads it (for
 * tools, or apps that prefer to pay the whole read at open). CB_ERR_CORRUPT
 * names the first tensor that fails. */
cb_status cb_bundle_verify_weights(cb_bundle* bundle);

size_t cb_bundle_input_count(const cb_bundle* bundle);
size_t cb_bundle_output_count(const cb_bundle* bundle);
cb_status cb_bundle_input_info(const cb_bundle* bundle, size_t index, cb_tensor_info* out_info);
cb_status cb_bundle_output_info(const cb_bundle* bundle, size_t index, cb_tensor_info* out_info);
/* Index of the input named `name`, or CB_ERR_INVALID_ARGUMENT. */
cb_status cb_bundle_find_input(const cb_bundle* bundle, const char* name, size_t* out_index);

/* Shapes set at run time (schema 5; a model input declared with a range,
 * `coldbrew compile --input-shape x=1x3x[32:640]x[32:640]`): an input axis
 * takes the values min..max in steps of `step`. The bundle's memory is
 * planned for the largest shapes, which cb_bundle_input_info and
 * cb_bundle_output_info give; a session starts at the shapes the plan was
 * weighed for. A fixed axis gives min == max, step 1; an axis that follows
 * from other axes' values (a model's expression of them) gives min 0, max
 * its largest, step 0. */
cb_status cb_bundle_input_range(const cb_bundle* bundle, size_t index, int32_t axis, int64_t* out_min,
                                int64_t* out_max, int64_t* out_step);
/* The same for an output's axis: one the inputs' ranges or the data set
 * (a NonZero's count, planned at its bound: `coldbrew compile --bound`)
 * gives min 0, max its largest, step 0, or the counted dim's range where the
 * axis is that count. A run gives the output's actual shape:
 * cb_session_output_info after cb_session_run. */
cb_status cb_bundle_output_range(const cb_bundle* bundle, size_t index, int32_t axis, int64_t* out_min,
                                 int64_t* out_max, int64_t* out_step);

cb_status cb_session_create(cb_bundle* bundle, const cb_session_options* options,
                            cb_session** out_session);
void cb_session_release(cb_session* session);
/* Input `index`'s shape for the runs that follow (ndim axes): each fixed
 * axis as the bundle has it, each ranged one in its range (else
 * CB_ERR_INVALID_ARGUMENT naming the input, the axis and the range). It
 * sets the shapes of every tensor that follows from it, other inputs'
 * among them: an input whose shape it changes must be set again, its
 * shape then its data, before the next run. A shape equal to the current
 * one changes nothing. */
cb_status cb_session_set_input_shape(cb_session* session, size_t index, const int64_t* shape, int32_t ndim);
/* Input `index` at its current shape; output `index` at its shape in the
 * last run (before one: the shape the current inputs give). `shape` points
 * into the session: its values change with set_input_shape (inputs) and
 * runs (outputs). */
cb_status cb_session_input_info(const cb_session* session, size_t index, cb_tensor_info* out_info);
cb_status cb_session_output_info(const cb_session* session, size_t index, cb_tensor_info* out_info);
/* Copy `nbytes` (must equal the input's bytes at its current shape) into
 * input `index`. An input keeps its value until set again: runs never
 * overwrite it. */
cb_status cb_session_set_input(cb_session* session, size_t index, const void* data, size_t nbytes);
/* Borrow input `index`'s storage, to write its value in place (what
 * set_input copies there; its bytes at its current shape); valid until release. */
cb_status cb_session_input_buffer(cb_session* session, size_t index, void** out_data, size_t* out_nbytes);
cb_status cb_session_run(cb_session* session);
/* Borrow output `index` (its bytes at its shape in the last run); valid until the next run or release. */
cb_status cb_session_get_output(const cb_session* session, size_t index, const void** out_data,
                                size_t* out_nbytes);

/* Debugging (`coldbrew compare`): a run that hands every output of each
 * step it executes to `observe` right after the step, before a later step
 * reuses the memory: the step, the tensor's index in the bundle, its bytes
 * (valid during the call). A GPU session runs step by step, reading each
 * step's outputs back: slow. */
typedef void (*cb_step_observer)(void* ctx, uint32_t step, uint32_t tensor, const void* data, uint64_t nbytes);
cb_status cb_session_run_observed(cb_session* session, cb_step_observer observe, void* ctx);

/* Continuous mode: how many steps have a warm alternate, and how many of
 * those are ready (later runs use them). */
cb_status cb_session_alternates(const cb_session* session, size_t* out_ready, size_t* out_total);

/* The events of the last run of a session created with trace = 1. */
cb_status cb_session_trace(const cb_session* session, const cb_trace_event** out_events, size_t* out_count);
/* Name and variant of plan step `step`, for reading traces; the variant of
 * its warm alternate, or NULL (cb_bundle_step_alternate). */
cb_status cb_bundle_step_info(const cb_bundle* bundle, size_t step, const char** out_layer, const char** out_variant);
cb_status cb_bundle_step_alternate(const cb_bundle* bundle, size_t step, const char** out_variant);

CB_API_END

#endif /* COLDBREW_H_ */
