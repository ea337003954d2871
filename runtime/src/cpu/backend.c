/* The handful of backend symbols TVM-generated CPU code calls. coldbrew
 * provides them itself so the runtime never links TVM, and so it owns the
 * threads that run parallel loops. The ABI is restated here (tvm-ffi C ABI,
 * DLPack) rather than included, to keep the runtime free of TVM headers. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu/cpu.h"

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

/* Kernels allocate scratch tiles (a GEMM's packed column tile, a padded
 * plane) inside their parallel loops, once per iteration. Each thread keeps
 * the blocks it has freed and hands them out again (smallest that fits), so
 * warm runs do not call the allocator at all. Every thread's blocks are
 * freed when it ends (a pthread key's destructor: callers' threads too).
 * A thread's cache lives on the heap, linked into one global list, so the
 * blocks are reachable from a global root: a leak checker sees them even
 * when it cannot read a thread's TLS (LeakSanitizer looks threads up by
 * kernel thread id; under thread-id reuse it can skip a live thread's TLS
 * and report the blocks it caches as leaked). */
#define CB_WS_SLOTS 16

typedef struct {
  void* ptr;
  size_t size;
  int used;
} cb_ws_block;

typedef struct cb_ws_cache {
  struct cb_ws_cache *prev, *next; /* the list of every thread's cache */
  int count;
  cb_ws_block block[CB_WS_SLOTS];
} cb_ws_cache;

static _Thread_local cb_ws_cache* t_cache;
static cb_ws_cache g_caches = {&g_caches, &g_caches, 0, {{0}}};
static pthread_mutex_t g_caches_mu = PTHREAD_MUTEX_INITIALIZER;

static pthread_key_t g_ws_key;
static pthread_once_t g_ws_once = PTHREAD_ONCE_INIT;
static void workspace_release_thread(void);
static void workspace_at_exit(void* unused) { (void)unused, workspace_release_thread(); }
static void workspace_key_init(void) { (void)pthread_key_create(&g_ws_key, workspace_at_exit); }

/* This thread's cache, made and listed on first use; NULL when out of memory
 * (blocks are then allocated and freed one by one). */
static cb_ws_cache* thread_cache(void) {
  if (t_cache) return t_cache;
  cb_ws_cache* c = cb_calloc(1, sizeof *c);
  if (!c) return NULL;
  pthread_once(&g_ws_once, workspace_key_init);
  pthread_setspecific(g_ws_key, (void*)1);
  pthread_mutex_lock(&g_caches_mu);
  c->prev = &g_caches, c->next = g_caches.next;
  g_caches.next->prev = c, g_caches.next = c;
  pthread_mutex_unlock(&g_caches_mu);
  cb_alloc_kept(1);
  return t_cache = c;
}

static void* workspace_alloc(int device_type, int device_id, uint64_t nbytes, int dtype_code,
                             int dtype_bits) {
  (void)device_type, (void)device_id, (void)dtype_code, (void)dtype_bits;
  size_t size = (size_t)((nbytes + 63) & ~(uint64_t)63);
  if (!size) size = 64;
  cb_ws_cache* c = thread_cache();
  int best = -1, spare = -1;
  for (int i = 0; c && i < c->count; i++) {
    if (c->block[i].used) continue;
    if (c->block[i].size >= size && (best < 0 || c->block[i].size < c->block[best].size)) best = i;
    if (spare < 0 || c->block[i].size < c->block[spare].size) spare = i;
  }
  if (best >= 0) {
    c->block[best].used = 1;
    return c->block[best].ptr;
  }
  void* p = cb_aligned_alloc(64, size);
  if (!p || !c) return p;
  if (c->count < CB_WS_SLOTS) {
    c->block[c->count++] = (cb_ws_block){p, size, 1};
    cb_alloc_kept(1);
  } else if (spare >= 0) { /* every free block is too small: replace the smallest */
    cb_free(c->block[spare].ptr);
    c->block[spare] = (cb_ws_block){p, size, 1};
  } /* else every slot is in use: `p` stays uncached and workspace_free frees it */
  return p;
}

static int workspace_free(int device_type, int device_id, void* ptr) {
  (void)device_type, (void)device_id;
  cb_ws_cache* c = t_cache;
  for (int i = 0; c && i < c->count; i++) {
    if (c->block[i].ptr == ptr) {
      c->block[i].used = 0;
      return 0;
    }
  }
  cb_free(ptr); /* allocated uncached */
  return 0;
}

/* A kernel that fails can return without freeing its blocks: every block of
 * this thread is free again once the failed call is over. */
void cb_backend_kernel_failed(void) {
  cb_ws_cache* c = t_cache;
  for (int i = 0; c && i < c->count; i++) c->block[i].used = 0;
}

static void workspace_release_thread(void) {
  cb_ws_cache* c = t_cache;
  if (!c) return;
  t_cache = NULL;
  pthread_mutex_lock(&g_caches_mu);
  c->prev->next = c->next, c->next->prev = c->prev;
  pthread_mutex_unlock(&g_caches_mu);
  for (int i = 0; i < c->count; i++) cb_free(c->block[i].ptr);
  cb_alloc_kept(-(int64_t)(c->count + 1));
  cb_free(c);
}


void cb_backend_leave_thread(void) { workspace_release_thread(); }

/* The runtime's thread pool: `size - 1` workers plus the launching thread.
 * A launch publishes (fn, cdata, ntask) and bumps a generation counter under
 * `mu`; task 0 runs on the caller, task k on worker k. Between launches
 * workers spin for a short while (layers follow each other within
 * microseconds), then sleep on a condition variable so an idle pool costs
 * nothing. They never sched_yield while waiting: on a core another process
 * keeps busy, a yield hands it a whole time slice, and the next launch
 * waits for it (measured: squeezenet warm with a CPU hog on the worker's
 * core 14 ms yielding, 10 ms sleeping; 5.4 ms unloaded either way), where
 * a sleeper that wakes preempts the busy process at once. Each worker
 * starts from the generation current when it was created, and the
 * generation only moves under `mu`, so no launch is missed.
 * A launch from inside a task (nested parallel loops) runs inline. */
static inline void cpu_relax(void) {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

#define CB_SPIN_ROUNDS 4000 /* the launching thread's pause-spins before it sleeps */
#define CB_WORKER_SPIN_ROUNDS 8000 /* a worker's between launches: a layer on one thread rarely outlasts it */

#define CB_MAX_THREADS 256

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t wake;
  pthread_mutex_t launch_mu; /* one launch at a time */
  pthread_t* threads;
  int size;                  /* tasks per launch (workers + caller) */
  atomic_uint_fast64_t generation;
  atomic_int pending;
  atomic_int caller_sleeps; /* the launching thread sleeps on `pending` (futex) */
  atomic_int failed;
  atomic_int stop;
  cb_parallel_lambda fn;
  void* cdata;
  int ntask;
  atomic_int barrier_count;
  atomic_int barrier_phase;
  int caller_cpu; /* the launching thread's core when the pool was sized (-1: not yet) */
  atomic_int active; /* tasks a launch uses (<= size) */
  /* split by speed (cb_backend_set_split): thread k runs tasks
   * [first[k], first[k] + count[k]) of `total`; total == 0: one task each */
  int total, split_n; /* split_n: the thread count the shares are for */
  int first[CB_MAX_THREADS], count[CB_MAX_THREADS];
  int launch_total; /* the current launch's: total, or 0 */
} cb_pool;

static cb_pool g_pool = {
    .mu = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER,
    .launch_mu = PTHREAD_MUTEX_INITIALIZER, .size = 1, .caller_cpu = -1, .active = 1,
};

static _Thread_local int t_in_task;


static uint64_t wait_for_launch(uint64_t seen) {
  for (int i = 0; i < CB_WORKER_SPIN_ROUNDS; i++) {
    uint64_t g = atomic_load_explicit(&g_pool.generation, memory_order_acquire);
    if (g != seen || atomic_load(&g_pool.stop)) return g;
    cpu_relax();
  }
  pthread_mutex_lock(&g_pool.mu);
  uint64_t g;
  while ((g = atomic_load(&g_pool.generation)) == seen && !atomic_load(&g_pool.stop))
    pthread_cond_wait(&g_pool.wake, &g_pool.mu);
  pthread_mutex_unlock(&g_pool.mu);
  return g;
}

/* Thread `id`'s tasks of the current launch: its share of a split launch,
 * else task `id` of ntask. */
static int run_tasks(int id) {
  int total = g_pool.launch_total, rc = 0;
  cb_parallel_env env = {&g_pool, total ? total : g_pool.ntask};
  int first = total ? g_pool.first[id] : id, end = total ? first + g_pool.count[id] : id + 1;
  for (int t = first; t < end && !rc; t++) rc = g_pool.fn(t, &env, g_pool.cdata);
  if (rc) cb_backend_kernel_failed();
  return rc;
}

typedef struct {
  int id;
  uint64_t generation;
} cb_worker_start;

static void pin_worker(pthread_t thread, int id);

static void* worker_main(void* arg) {
  cb_worker_start start = *(cb_worker_start*)arg;
  cb_free(arg);
  t_in_task = 1;
  pin_worker(pthread_self(), start.id); /* its own core, the core order asked here rather than by the opener */
  uint64_t seen = start.generation;
  for (;;) {
    wait_for_launch(seen);
    if (atomic_load(&g_pool.stop)) break;
    /* the launch it runs and its generation, read together: a worker that
     * sat out one launch may wake only after the next one is published,
     * and must then run that one once, not once per generation it missed */
    pthread_mutex_lock(&g_pool.mu);
    seen = atomic_load(&g_pool.generation);
    int mine = start.id < g_pool.ntask;
    pthread_mutex_unlock(&g_pool.mu);
    if (!mine) continue;
    int rc = run_tasks(start.id);
    if (rc) atomic_store(&g_pool.failed, rc);
    if (atomic_fetch_sub(&g_pool.pending, 1) == 1 && atomic_load(&g_pool.caller_sleeps)) cb_futex_wake(&g_pool.pending, 1);
  }
  workspace_release_thread();
  return NULL;
}

static void pool_stop(void) {
  if (g_pool.size <= 1) return;
  pthread_mutex_lock(&g_pool.mu);
  atomic_store(&g_pool.stop, 1);
  pthread_cond_broadcast(&g_pool.wake);
  pthread_mutex_unlock(&g_pool.mu);
  for (int i = 1; i < g_pool.size; i++) pthread_join(g_pool.threads[i], NULL);
  cb_free(g_pool.threads);
  g_pool.threads = NULL;
  g_pool.size = 1;
  atomic_store(&g_pool.stop, 0);
}

/* The `k`-th core this process may use after `home` (k = 0: home itself),
 * wrapping around; -1 when unknown. */
static int nth_core_after(int home, int k) {
  cpu_set_t allowed;
  if (home < 0 || sched_getaffinity(0, sizeof allowed, &allowed) != 0) return -1;
  int ncpu = CPU_COUNT(&allowed), cpu = home;
  if (ncpu < 1) return -1;
  for (k %= ncpu; k > 0;) {
    cpu = (cpu + 1) % CPU_SETSIZE;
    if (CPU_ISSET(cpu, &allowed)) k--;
  }
  return cpu;
}

/* Core classes: the cores this process may use, fastest first, by the
 * capacity Linux reports for each (cpu_capacity: Arm's big.LITTLE scale;
 * else cpufreq's cpuinfo_max_freq), ties by core number; asked once per
 * process. The compiler plans execution thread k for the k-th fastest core
 * and preparation workers for the cores after the execution threads
 * (targets/: core classes fastest first), so where the cores differ the
 * pool is placed by this order, whatever core the caller is on; where they
 * report the same (or nothing) the order is left alone (`ranked` 0) and
 * the pool is placed around the caller's core. COLDBREW_SYSFS_CPU names
 * another directory to read (tests: a fake topology). */
#define CB_MAX_CORES 256
typedef struct { int n, ranked, cpu[CB_MAX_CORES]; long capacity[CB_MAX_CORES]; } cb_core_order;

static cb_core_order g_cores;
static pthread_once_t g_cores_once = PTHREAD_ONCE_INIT;

static long read_number(const char* root, int cpu, const char* file) {
  char path[512];
  snprintf(path, sizeof path, "%s/cpu%d/%s", root, cpu, file);
  FILE* f = fopen(path, "r");
  if (!f) return -1;
  long v = -1;
  if (fscanf(f, "%ld", &v) != 1) v = -1;
  fclose(f);
  return v;
}

static void ask_cores(void) {
  const char* root = getenv("COLDBREW_SYSFS_CPU");
  if (!root || !*root) root = "/sys/devices/system/cpu";
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return;
  cb_core_order o;
  memset(&o, 0, sizeof o);
  for (int cpu = 0; cpu < CPU_SETSIZE && o.n < CB_MAX_CORES; cpu++) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    long c = read_number(root, cpu, "cpu_capacity");
    if (c < 0) c = read_number(root, cpu, "cpufreq/cpuinfo_max_freq");
    o.cpu[o.n] = cpu, o.capacity[o.n++] = c;
  }
  for (int i = 1; i < o.n; i++) /* insertion sort: fastest first, stable by core number */
    for (int j = i; j > 0 && o.capacity[j] > o.capacity[j - 1]; j--) {
      int c = o.cpu[j];
      long v = o.capacity[j];
      o.cpu[j] = o.cpu[j - 1], o.capacity[j] = o.capacity[j - 1];
      o.cpu[j - 1] = c, o.capacity[j - 1] = v;
    }
  o.ranked = o.n > 1 && o.capacity[o.n - 1] >= 0 && o.capacity[0] != o.capacity[o.n - 1];
  g_cores = o;
}

static const cb_core_order* core_order(void) {
  pthread_once(&g_cores_once, ask_cores);
  return &g_cores;
}

/* The core of execution thread (or, counting on, preparation worker) `k`:
 * the k-th fastest where the cores differ, else the k-th after `home`. */
static int placed_core(int home, int k) {
  const cb_core_order* o = core_order();
  if (o->ranked) return o->cpu[k % o->n];
  return nth_core_after(home, k);
}

int cb_backend_core_classes(int* cores, long* capacity, int max) {
  const cb_core_order* o = core_order();
  int n = o->n < max ? o->n : max;
  for (int i = 0; i < n; i++) cores[i] = o->cpu[i], capacity[i] = o->capacity[i];
  return o->ranked ? n : 0;
}

/* Task 0's core, the one the workers are placed around: the fastest where
 * the cores differ, else the caller's when the pool was sized. Asked by the
 * workers as they start, so the caller never waits for the core order's
 * sysfs reads at open (2 files a core: 0.1-0.2 ms of a small model's cold
 * start on 2 cores, more on more). */
static int pool_home(void) {
  const cb_core_order* o = core_order();
  return o->ranked ? o->cpu[0] : g_pool.caller_cpu >= 0 ? g_pool.caller_cpu : sched_getcpu();
}

static void pin_thread(pthread_t thread, int cpu) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  pthread_setaffinity_np(thread, sizeof one, &one);
}

/* Give worker `id` a core of its own: the id-th core this process may use,
 * counting from the one after the caller's, so the caller and its workers
 * do not start out sharing a core (the launch waits for every task). */
static void pin_worker(pthread_t thread, int id) {
  int home = pool_home(), cpu = placed_core(home, id);
  if (cpu < 0 || cpu == home) return; /* more workers than cores: leave it to the scheduler */
  pin_thread(thread, cpu);
}

void cb_backend_enter_prep_worker(uint32_t queue) {
  int cpu = placed_core(pool_home(), atomic_load(&g_pool.active) + (int)queue - 1);
  if (cpu >= 0) pin_thread(pthread_self(), cpu);
  t_in_task = 1; /* its parallel launches run inline */
}

int cb_backend_pin_caller(void* saved) {
  if (pthread_getaffinity_np(pthread_self(), sizeof(cpu_set_t), (cpu_set_t*)saved) != 0) return 0;
  /* without pool workers the caller's own core is home: preparation workers
   * then take the cores after it rather than land on it */
  if (g_pool.size <= 1) g_pool.caller_cpu = sched_getcpu();
  int home = pool_home();
  if (home < 0 || !CPU_ISSET(home, (cpu_set_t*)saved)) return 0;
  pin_thread(pthread_self(), home);
  return 1;
}

void cb_backend_restore_caller(const void* saved) {
  pthread_setaffinity_np(pthread_self(), sizeof(cpu_set_t), (const cpu_set_t*)saved);
}

cb_status cb_backend_set_threads(int n) {
  if (n < 1) n = 1;
  if (n > CB_MAX_THREADS) n = CB_MAX_THREADS;
  pthread_mutex_lock(&g_pool.launch_mu);
  cb_status st = CB_OK;
  if (n != g_pool.size) {
    pool_stop();
    g_pool.caller_cpu = sched_getcpu(); /* (the core order is the workers' to ask) */
    if (n > 1) {
      g_pool.threads = cb_calloc((size_t)n, sizeof(pthread_t));
      if (!g_pool.threads) st = cb_fail(CB_ERR_OUT_OF_MEMORY, "out of memory");
      for (int i = 1; i < n && !st; i++) {
        cb_worker_start* start = cb_malloc(sizeof *start);
        if (!start) {
          st = cb_fail(CB_ERR_OUT_OF_MEMORY, "out of memory");
          break;
        }
        start->id = i, start->generation = atomic_load(&g_pool.generation);
        if (pthread_create(&g_pool.threads[i], NULL, worker_main, start) != 0) {
          cb_free(start);
          st = cb_fail(CB_ERR_OUT_OF_MEMORY, "cannot start thread %d of %d", i, n);
          break;
        }
        g_pool.size = i + 1;
      }
    }
  }
  atomic_store(&g_pool.active, g_pool.size);
  pthread_mutex_unlock(&g_pool.launch_mu);
  return st;
}

int cb_backend_threads(void) { return g_pool.size; }

int cb_backend_active_threads(void) { return atomic_load(&g_pool.active); }

void cb_backend_set_split(int n, const uint8_t* shares) {
  pthread_mutex_lock(&g_pool.launch_mu); /* not while a launch reads the split */
  n = n < 1 ? 1 : n > g_pool.size ? g_pool.size : n;
  atomic_store(&g_pool.active, n);
  int total = 0, even = 1;
  for (int k = 0; shares && k < n; k++) {
    g_pool.first[k] = total, g_pool.count[k] = shares[k];
    total += shares[k];
    even &= shares[k] == shares[0];
  }
  g_pool.total = shares && !even ? total : 0;
  g_pool.split_n = n;
  pthread_mutex_unlock(&g_pool.launch_mu);
}

static int run_inline(cb_parallel_lambda fn, void* cdata) {
  cb_parallel_env env = {&g_pool, 1};
  return fn(0, &env, cdata);
}

static int parallel_launch(cb_parallel_lambda fn, void* cdata, int num_task) {
  if (num_task == 1 || t_in_task || atomic_load(&g_pool.active) <= 1) return run_inline(fn, cdata);
  pthread_mutex_lock(&g_pool.launch_mu);
  /* read under the lock: another session may resize the pool between launches */
  int active = atomic_load(&g_pool.active);
  int n = num_task > 0 && num_task < active ? num_task : active;
  if (n <= 1) {
    pthread_mutex_unlock(&g_pool.launch_mu);
    return run_inline(fn, cdata);
  }
  atomic_store(&g_pool.failed, 0);
  atomic_store(&g_pool.barrier_count, 0);
  atomic_store(&g_pool.pending, n - 1);
  pthread_mutex_lock(&g_pool.mu); /* a launch and its generation change together (worker_main) */
  g_pool.fn = fn, g_pool.cdata = cdata, g_pool.ntask = n;
  /* a kernel that asks for a task count of its own gets it, evenly */
  g_pool.launch_total = n == active && n == g_pool.split_n && num_task <= 0 ? g_pool.total : 0;
  atomic_fetch_add(&g_pool.generation, 1);
  pthread_cond_broadcast(&g_pool.wake);
  pthread_mutex_unlock(&g_pool.mu);
  t_in_task = 1;
  int rc = run_tasks(0);
  t_in_task = 0;
  /* the caller waits for the workers the same way: spin, then sleep (the
   * last worker to finish wakes it when it said it sleeps) */
  for (int i = 0; atomic_load_explicit(&g_pool.pending, memory_order_acquire) > 0; i++) {
    if (i < CB_SPIN_ROUNDS) {
      cpu_relax();
      continue;
    }
    atomic_store(&g_pool.caller_sleeps, 1);
    int left;
    while ((left = atomic_load(&g_pool.pending)) > 0) cb_futex_wait(&g_pool.pending, left);
    atomic_store(&g_pool.caller_sleeps, 0);
  }
  if (!rc) rc = atomic_load(&g_pool.failed);
  pthread_mutex_unlock(&g_pool.launch_mu);
  return rc;
}

int cb_backend_parallel(cb_parallel_lambda fn, void* cdata, int num_task) {
  return parallel_launch(fn, cdata, num_task);
}

/* Sense-reversing barrier across the tasks of the current launch. */
static int parallel_barrier(int task_id, cb_parallel_env* env) {
  (void)task_id;
  if (env->num_task <= 1) return 0;
  if (g_pool.launch_total) return -1; /* a split launch runs several tasks on one thread: none can wait */
  int phase = atomic_load(&g_pool.barrier_phase);
  if (atomic_fetch_add(&g_pool.barrier_count, 1) == env->num_task - 1) {
    atomic_store(&g_pool.barrier_count, 0);
    atomic_fetch_add(&g_pool.barrier_phase, 1);
  } else {
    while (atomic_load(&g_pool.barrier_phase) == phase) sched_yield();
  }
  return 0;
}

void cb_backend_install(void* (*find)(const cb_bundle* b, const char* name), const cb_bundle* b) {
  static const char* const names[] = {"__TVMBackendAllocWorkspace", "__TVMBackendFreeWorkspace",
                                      "__TVMBackendParallelLaunch", "__TVMBackendParallelBarrier"};
  void* const hooks[] = {(void*)workspace_alloc, (void*)workspace_free, (void*)parallel_launch,
                         (void*)parallel_barrier};
  for (int k = 0; k < 4; k++) {
    void** slot = (void**)find(b, names[k]);
    if (slot) *slot = hooks[k];
  }
}
