/* The runtime's top layer (exec/), which may include every layer below:
 * a bundle opened to run (load.c) and a session as the runtime holds it,
 * shared by session.c (create, release, inputs and outputs), shapes.c
 * (shapes set at run time, kernel arguments), run.c (the run loop and its
 * preparation), warmer.c (continuous mode) and step.c (what the last two
 * both do to a step). */
#ifndef COLDBREW_SESSION_H_
#define COLDBREW_SESSION_H_

#include "cpu/cpu.h"
#include "vulkan/gpu.h"

struct cb_session {
  cb_bundle* bundle;
  uint8_t* arena;
  uint8_t* prepared;      /* transformed weights, made once, kept across runs */
  uint8_t* is_prepared;   /* per step */
  uint8_t* skipped;       /* per step: not executed by the current run (a branch its If did not take) */
  _Atomic uint8_t* was_read; /* per step: its weights read and checked (by the first run that prepared it) */
  cb_dltensor* tensors;
  cb_ffi_any* args;       /* all steps' execute arguments, back to back */
  uint32_t* arg_start;    /* per step */
  cb_ffi_any* targs;      /* all steps' transform arguments, back to back */
  uint32_t* targ_start;   /* per step */
  cb_ffi_any* aargs;      /* all steps' warm alternates' arguments, back to back */
  uint32_t* aarg_start;   /* per step */
  cb_trace_event* trace;  /* 4 per step + the open and create events when tracing, else NULL */
  cb_trace_event create_event; /* session creation (reported by the first traced run) */
  size_t trace_cap;
  _Atomic size_t ntrace;  /* the executing thread and preparation workers both record */
  uint32_t threads;       /* execution threads of the first run */
  uint32_t later_threads; /* ... and of later runs (continuous mode: the warm plan's) */
  const uint8_t* shares;       /* the first run's parallel-loop split (NULL: even) */
  const uint8_t* later_shares; /* ... and later runs' */
  uint8_t own_shares[256];     /* the caller's exec_shares, copied */
  int warm;               /* a run has completed: weights read, checked and prepared */
  _Atomic uint64_t read_sink; /* keeps the weight reads observable */
  /* the first run's preparation workers (plan steps with prep_queue > 0) */
  pthread_mutex_t mu;
  pthread_cond_t ready_cv;
  _Atomic uint8_t* ready;   /* per step: 0 pending, 1 prepared, 2 failed */
  _Atomic uint8_t* claimed; /* per step: a thread has taken its preparation */
  atomic_int abort;       /* the executing thread failed: workers stop */
  cb_status prep_status;
  char prep_error[1024];
  _Atomic uint32_t prepared_steps; /* first-run preparations done (the warmer waits for all) */
  /* continuous mode: the warmer readies the steps' warm alternates */
  int continuous;
  int warmer_started;
  pthread_t warmer;
  atomic_int warmer_stop;
  _Atomic uint8_t* alt_ready; /* per step: its warm alternate's weights are read and checked */
  cb_gpu_session* gpu;        /* GPU bundles: arena, staging (= arena above), command buffer */
  cb_step_observer observe;   /* cb_session_run_observed's, during that run; else NULL */
  void* observe_ctx;
  cb_status alt_status;       /* a warm weight failed its check (set by the warmer, under mu) */
  char alt_error[1024];
  /* shapes set at run time (shapes.c) */
  int64_t* dims;        /* per tensor: a dim's value / step (2 x ntensors: the second half a shape being set) */
  uint64_t* nbytes;     /* per tensor: its bytes at its current shape */
  int64_t* shapes;      /* the current shapes of the tensors with a shape program (their DLTensors'), back to back */
  int64_t* out_shapes;  /* the outputs' shapes in the last run (before one: the current), back to back */
  uint64_t* out_nbytes; /* ... and their bytes */
};

/* step.c: a step's weights read and checked; its phases traced (`queue`:
 * the preparation worker the calling thread is, named by its events) */
cb_status cb_read_tensors(cb_session* s, const uint32_t* ids, uint32_t n, const char* layer, int on_pool);
cb_trace_event* cb_trace_step(cb_session* s, uint32_t step, uint32_t phase, uint32_t alternate);
void cb_trace_end(cb_trace_event* ev);
void cb_trace_worker(uint32_t queue);

/* shapes.c: a new session's shapes (each dim at its typical value) and
 * kernel arguments bound; the outputs' shapes kept for a run (its first act) */
cb_status cb_shapes_start(cb_session* s);
/* After step `step` (m->steps[step].counts): each dim it counted set from
 * its tensor (a count over the dim's bound fails the run, naming it) and
 * every shape and kernel argument that follows from it. */
cb_status cb_shapes_count(cb_session* s, uint32_t step);
void cb_shapes_keep_outputs(cb_session* s);

/* warmer.c: continuous mode's warm alternates */
void cb_warmer_start(cb_session* s);
void cb_warmer_stop(cb_session* s);
cb_status cb_alternate_ready(cb_session* s, uint32_t i);
int cb_alternate_resident(cb_session* s, uint32_t i);

#endif /* COLDBREW_SESSION_H_ */
