/* A bundle's format as the runtime reads it (bundle/): the preamble and
 * signature block, the verified description of the header (model.cc), the
 * checks that need only bytes or that description (signature.c, target.c).
 * Includes only base/; C and C++ (the verifier) alike. Not installed. */
#ifndef COLDBREW_MODEL_H_
#define COLDBREW_MODEL_H_

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Container preamble (schemas/README.md): the FlatBuffer header follows it. */
#define CB_MAGIC "COLDBREW"
#define CB_PREAMBLE_SIZE 64u
/* Signature block (signed bundles, at the end of the file; its offset at
 * preamble byte 40): magic, the signer's public key, the Ed25519 signature
 * of CB_SIG_CONTEXT followed by the BLAKE2b-256 hash of the bytes before it. */
#define CB_SIG_MAGIC "CBSIGNv1"
#define CB_SIG_BLOCK_SIZE 104u
#define CB_SIG_CONTEXT "coldbrew signed bundle v1"

/* Check the signature of the bundle `data` (size bytes) by `public_key`
 * (signature.c): CB_OK or CB_ERR_SIGNATURE with its reason. */
cb_status cb_signature_check(const uint8_t* data, uint64_t size, const uint8_t* public_key);

enum { CB_KIND_INPUT = 0, CB_KIND_OUTPUT = 1, CB_KIND_INTERMEDIATE = 2, CB_KIND_WEIGHT = 3, CB_KIND_PREPARED = 4,
       CB_KIND_DIM = 5 };
/* A shape program's words (Tensor.shape_program; w >= 0 pushes w) and its deepest stack. */
enum { CB_OP_END = -1, CB_OP_ADD = -2, CB_OP_SUB = -3, CB_OP_MUL = -4, CB_OP_FLOORDIV = -5, CB_OP_FLOORMOD = -6,
       CB_OP_MIN = -7, CB_OP_MAX = -8, CB_OP_DIM = -9, CB_OP_NEG = -10 };
#define CB_SHAPE_STACK 16
#define CB_MAX_NDIM 32
enum { CB_SEG_WEIGHTS_RAW = 0, CB_SEG_WEIGHTS_CACHED = 1, CB_SEG_CPU_CODE = 2, CB_SEG_SPIRV = 3, CB_SEG_CPU_CODE_LZ4 = 4 };

/* A verified tensor description. Strings and shapes point into the mapped
 * header and live as long as the bundle. */
typedef struct cb_tensor_desc {
  const char* name;
  uint8_t dtype;
  uint8_t kind;
  int32_t ndim;
  const int64_t* shape;
  uint64_t nbytes;
  uint64_t arena_offset;
  uint32_t segment;
  uint64_t segment_offset;
  uint64_t checksum; /* weights, when cb_model.weight_checksums: of the `stored` bytes */
  uint64_t stored;   /* weights: the bytes at segment_offset (nbytes, or a relaid-out weight's form's) */
  /* a GPU bundle's weight stored relaid out (Tensor.relayout, schema 8):
   * stored axis j (of nrelayout, sized relayout_shape[j]) walks axis
   * relayout_axes[j] of `shape` in steps of relayout_mults[j]; 0: stored as `shape` */
  uint32_t nrelayout;
  const int64_t *relayout_shape, *relayout_axes, *relayout_mults;
  /* kind dim (Tensor.bounds): its values min..max in steps of step (it
   * holds value / step), first carried by axis `axis` of input `input`;
   * or, `count` >= 0, counted by a kernel into that tensor (one int64) */
  struct { int64_t min, max, step, typical; uint32_t input, axis; int64_t count; } range;
  uint32_t nprogram; /* a shape set at run time (Tensor.shape_program), or 0: `shape` is fixed */
  const int64_t* program; /* ... else `shape`, nbytes and the arena place hold the largest */
} cb_tensor_desc;

/* A GPU launch (GPU bundles): shader, workgroup grid, tensors bound in order. */
typedef struct cb_dispatch_desc {
  uint32_t shader;
  uint32_t grid[3];
  uint32_t nbindings;
  const uint32_t* bindings;
  uint32_t npush; /* push-constant words, at most CB_MAX_PUSH_WORDS */
  const uint32_t* push;
} cb_dispatch_desc;

#define CB_MAX_PUSH_WORDS 32 /* 128 bytes: every Vulkan device's minimum */
/* The runtime's own CPU weight transform (cpu/widen.c, cb_widen_f16): fp16
 * weights -> the fp32 tensor the kernel reads, same shape. */
#define CB_WIDEN_F16 "cb.widen_f16"
/* ... and int8 weights times their fp32 scales (one per tensor, or one per
 * entry of one axis, shaped to broadcast) -> the fp32 tensor, same shape. */
#define CB_WIDEN_I8 "cb.widen_i8"

/* The GPU weight transform the runtime runs on the CPU (vulkan/vulkan.c). */
#define CB_GPU_WINOGRAD_F23 "gpu.winograd_f23"

typedef struct cb_shader_desc {
  const char* name;
  uint64_t offset; /* SPIR-V bytes: from the start of the file */
  uint64_t size;
  uint32_t local_size[3];
  uint32_t bindings;
} cb_shader_desc;

typedef struct cb_step_desc {
  const char* layer_name;
  const char* variant;
  const char* kernel;
  uint32_t nargs;
  const uint32_t* args; /* tensor indices, kernel call order */
  const char* transform; /* weight transform kernel, or NULL */
  uint32_t ntransform_args;
  const uint32_t* transform_args; /* raw weights, then prepared outputs */
  uint8_t prep_queue; /* 0: prepared inline by the executing thread; q > 0: by preparation worker q */
  const char* warm_variant; /* continuous mode's alternate, or NULL */
  const char* warm_kernel;
  uint32_t nwarm_args;
  const uint32_t* warm_args;
  uint32_t ndispatches; /* GPU bundles: the layer's launches, in order */
  const cb_dispatch_desc* dispatches;
  uint32_t nfirst_dispatches; /* ... and through faster-made pipelines, for a run before those exist (or 0) */
  const cb_dispatch_desc* first_dispatches;
  int64_t guard;        /* a branch step's bool tensor (one value), or -1: always executed */
  uint8_t guard_value;  /* executed only when the guard holds this */
  int64_t guard_writer; /* the step that writes the guard (a skipped one skips this step too), or -1 */
  uint32_t nouts;       /* the last nouts args are the step's outputs */
  uint8_t counts;       /* it writes a counted dim's tensor: a run sizes the later tensors by it */
  int32_t loop_start;   /* the loop (index into cb_model.loops) this step starts, or -1 */
  int32_t loop_end;     /* the loop this step ends, or -1 */
} cb_step_desc;

/* A Loop the data stops (schema 6, Plan.loops; compiler/ir/loops.py): steps
 * start..end, its body between; after the body the runtime copies each
 * carried_from onto its carried_to (the condition first) and each scan_from
 * into its row of scan_to, and runs the body again while the condition
 * holds and the iteration number is below the trip count. */
typedef struct cb_loop_desc {
  const char* name; /* what --bound takes for it: its first scan output, else the Loop node's name */
  uint32_t start, end;
  uint32_t iteration, trip, cond; /* int64, int64, bool tensors of one value */
  uint32_t ncarried, nscans;
  const uint32_t* carried_from;
  const uint32_t* carried_to;
  const uint32_t* scan_from;
  const uint32_t* scan_to;
  int64_t most; /* rows of each scan output; -1: no limit */
  uint8_t at_least_once; /* a run that takes no iteration fails */
} cb_loop_desc;

typedef struct cb_segment_desc {
  uint8_t kind;
  uint64_t offset;
  uint64_t size;
  uint64_t checksum;
  uint64_t raw_size; /* cpu_code_lz4: the shared object's size once decoded */
} cb_segment_desc;

typedef struct cb_model {
  const char* triple;
  const char* cpu;
  uint32_t nfeatures;
  const char** features;
  uint32_t ntensors;
  cb_tensor_desc* tensors;
  uint32_t ninputs, noutputs;
  const uint32_t* inputs;
  const uint32_t* outputs;
  uint32_t nsteps;
  cb_step_desc* steps;
  uint32_t nsegments;
  cb_segment_desc* segments;
  uint64_t arena_size;
  uint64_t prepared_size;
  uint32_t threads;
  int weight_checksums; /* weights verified per tensor when first read, not per segment at open */
  uint32_t prep_queues; /* highest prep_queue of any step */
  uint32_t warm_threads; /* execution threads after the first run (0: threads) */
  uint32_t nwarm;        /* steps with a warm alternate */
  const uint8_t* exec_shares;      /* per execution thread (threads of them), or NULL: even */
  const uint8_t* warm_exec_shares; /* per warm thread, or NULL: even */
  const char* gpu_api;   /* "vulkan": the steps run as GPU dispatches; "": on the CPU */
  uint32_t nshaders;
  cb_shader_desc* shaders;
  cb_dispatch_desc* dispatches; /* every step's, back to back, then every step's first-run ones */
  uint32_t ndispatches;         /* all of them */
  uint32_t program_axes; /* the axes of every tensor with a shape program */
  uint32_t nloops;
  cb_loop_desc* loops;   /* in step order, none inside another */
} cb_model;

/* Where weight tensor `t` lies in the mapped bundle at `base`. */
/* off + len <= size, without overflow (the header checks). */
static inline int cb_in_bounds(uint64_t off, uint64_t len, uint64_t size) { return off <= size && len <= size - off; }

static inline const uint8_t* cb_weight_data(const uint8_t* base, const cb_model* m, uint32_t t) {
  return base + m->segments[m->tensors[t].segment].offset + m->tensors[t].segment_offset;
}

/* A multi-target bundle's section (schema 7, Bundle.sections): one
 * target's whole header, elsewhere in the file. Strings point into the
 * index header. */
#define CB_INDEX_VERSION 9u       /* a multi-target bundle's index, its later sections' headers compressed */
#define CB_INDEX_VERSION_PLAIN 7u /* ... every section's header stored as it is */
#define cb_is_index_version(v) ((v) == CB_INDEX_VERSION || (v) == CB_INDEX_VERSION_PLAIN)
#define CB_HEADER_MAX (1ull << 31) /* a FlatBuffer's most */
typedef struct cb_section_desc {
  const char* name;  /* the target as the compile named it */
  const char* triple;
  const char* cpu;
  const char* gpu_class; /* "" for a CPU section */
  uint32_t nfeatures;
  const char** features;
  uint64_t header_offset, header_size, header_checksum;
  uint64_t header_raw_size; /* 0: the header is stored as it is; else an LZ4 block decoding to this size */
  uint32_t version;  /* the section header's own: 4 to 6, or 8 */
} cb_section_desc;
/* An index header's sections, best first (*out: one allocation, cb_free):
 * verified as a FlatBuffer, every section's header inside the file and
 * 8-byte aligned, of a version this runtime reads. CB_ERR_CORRUPT. */
cb_status cb_index_parse(const uint8_t* header, uint64_t header_size, uint64_t file_size, cb_section_desc** out,
                         uint32_t* n);

/* Verify the FlatBuffer header (generated verifier), then bounds-check every
 * index, size and offset against the file, and every CPU kernel call against
 * the kernel's recorded argument contract. `version`: the preamble's schema
 * version, which the header's must equal. Fills `out` (arrays malloc'ed;
 * free with cb_model_free). Returns CB_ERR_CORRUPT / CB_ERR_VERSION. */
cb_status cb_model_parse(const uint8_t* header, uint64_t header_size, uint64_t file_size, uint32_t version,
                         cb_model* out);
void cb_model_free(cb_model* model);

/* Shape programs (program.c). Shapes set at run time checked (schema 5
 * on, CPU bundles; after the tensors and inputs are parsed): every dim's
 * range and carrying input axis, every program well formed and giving its
 * tensor's shape at each dim's largest value. CB_ERR_CORRUPT names the tensor. */
cb_status cb_shapes_check(cb_model* m, uint32_t version);
/* Counted dims checked (after the steps are parsed): each one's tensor an
 * int64 of one value, fixed, that one step writes (that step's `counts`
 * set). CB_ERR_CORRUPT names the dim. */
cb_status cb_counts_check(cb_model* m);
/* An element's bytes (0: an unknown dtype). */
uint64_t cb_dtype_size(uint8_t dtype);
/* Tensor t's program evaluated with the dims' values `dims` (indexed by
 * tensor) into `shape`: CB_OK, or CB_ERR_CORRUPT naming the tensor (a
 * malformed program, an overflow, a division by zero, a negative size). */
cb_status cb_shape_eval(const cb_model* m, uint32_t t, const int64_t* dims, int64_t* shape);
/* The bytes of tensor `d` at `shape`: 1, or 0 where they overflow. */
int cb_shape_bytes(const cb_tensor_desc* d, const int64_t* shape, uint64_t* out);
/* The dim whose value axis `axis` of `d` is (its words `DIM t END` or
 * `scale DIM t MUL END`; *scale 1 or the constant), or -1. */
int64_t cb_axis_dim(const cb_model* m, const cb_tensor_desc* d, uint32_t axis, int64_t* scale);
/* The values axis `axis` of input tensor `t` takes: a fixed one min == max,
 * step 1; one a dim's range sets, that range; another (an expression of
 * the dims), 0 to its largest, step 0. */
void cb_axis_range(const cb_model* m, uint32_t t, uint32_t axis, int64_t* min, int64_t* max, int64_t* step);

/* Whether this CPU has an ISA feature by its LLVM name (target.c: CPUID and
 * the OS's saved register state): 1 yes, 0 no, -1 cannot tell. */
int cb_host_has(const char* feature);

/* Target check (target.c): CB_OK if this CPU runs code for (triple, features). */
cb_status cb_target_check(const cb_model* model);
cb_status cb_target_runs(const char* triple, const char* cpu, const char* const* features, uint32_t n);

#ifdef __cplusplus
}
#endif

#endif /* COLDBREW_MODEL_H_ */
