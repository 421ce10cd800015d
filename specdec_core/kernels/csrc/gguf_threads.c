/* Runs a GEMM's parts on threads: torch's own OpenMP team where the process has one, else a
 * small pool of ours.
 *
 * Why torch's team: torch's OpenMP workers spin for a while after every parallel op (libgomp's
 * default), so on a 2-core machine a pool of our own that starts right after a torch op shares
 * its cores with a spinning worker. Measured on the 2-core dev machine (2026-11-24, load < 1,
 * `clients/tools/gguf_bench.py --threads 2`, the 1.5B): a one-token gguf step took 133 ms with our
 * pool, 78 ms when torch's workers did not spin (GOMP_SPINCOUNT=0), int8 110-114 ms either way.
 * Running the parts on the team torch itself uses removes the contention without touching the
 * environment: the team is the calling thread's, the one every torch op of the step reuses.
 *
 * The runtime is found among the loaded libraries (libgomp, or Intel's/LLVM's, which export the
 * same GOMP_parallel entry point), never linked: a process without one gets the own pool. Parts
 * are fixed by the caller and part p always computes the same outputs with the same code, so
 * the result does not depend on which pool ran it nor on how many threads it had. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gguf_kernels.h"

#if defined(__linux__)
#include <dlfcn.h>
#include <link.h>
#endif

#define MAX_THREADS 64

typedef struct {
    part_fn fn;
    const void *job;
    int parts;
} work_t;

/* Part p of `parts` on thread `t` of `threads`: parts t, t + threads, ... */
static void run_share(const work_t *w, int t, int threads) {
    for (int p = t; p < w->parts; p += threads) w->fn(w->job, p);
}

/* ---- torch's OpenMP team ---- */
static void (*omp_parallel)(void (*)(void *), void *, unsigned, unsigned);
static int (*omp_thread_num)(void), (*omp_num_threads)(void);
static int omp_found; /* set once, by look_for_omp */
static int forced_own = 0;

#if defined(__linux__)
static int find_omp(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size, (void)data;
    const char *name = info->dlpi_name;
    if (!name || !(strstr(name, "libgomp") || strstr(name, "libiomp") || strstr(name, "libomp"))) return 0;
    void *h = dlopen(name, RTLD_LAZY | RTLD_NOLOAD);
    if (!h) return 0;
    omp_parallel = (void (*)(void (*)(void *), void *, unsigned, unsigned))dlsym(h, "GOMP_parallel");
    omp_thread_num = (int (*)(void))dlsym(h, "omp_get_thread_num");
    omp_num_threads = (int (*)(void))dlsym(h, "omp_get_num_threads");
    return omp_parallel && omp_thread_num && omp_num_threads; /* the first complete one wins */
}
#endif

static pthread_once_t omp_once = PTHREAD_ONCE_INIT;
static void look_for_omp(void) {
#if defined(__linux__)
    omp_found = dl_iterate_phdr(find_omp, NULL) != 0;
#endif
}

static void omp_body(void *arg) {
    run_share((const work_t *)arg, omp_thread_num(), omp_num_threads());
}

/* ---- our own pool (spins briefly after a job, then sleeps) ---- */
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER, call_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pool_cv = PTHREAD_COND_INITIALIZER;
static int pool_workers = 0, pool_threads = 1;
static atomic_uint pool_gen;
static atomic_int pool_done;
static const work_t *pool_work;
static double spin_seconds = -1.0;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void *worker_main(void *arg) {
    const int me = (int)(intptr_t)arg;
    unsigned seen = 0;
    for (;;) {
        const double until = now() + spin_seconds;
        for (unsigned spins = 0; atomic_load_explicit(&pool_gen, memory_order_acquire) == seen; spins++) {
            if ((spins & 255) == 255 && now() > until) {
                pthread_mutex_lock(&pool_mu);
                while (atomic_load(&pool_gen) == seen) pthread_cond_wait(&pool_cv, &pool_mu);
                pthread_mutex_unlock(&pool_mu);
                break;
            }
            cpu_relax();
        }
        seen = atomic_load(&pool_gen);
        if (me < pool_threads) run_share(pool_work, me, pool_threads);
        atomic_fetch_add_explicit(&pool_done, 1, memory_order_release);
    }
    return NULL;
}

static void own_pool(const work_t *w, int threads) {
    if (pthread_mutex_trylock(&call_mu) != 0) { /* a concurrent caller runs alone */
        run_share(w, 0, 1);
        return;
    }
    if (spin_seconds < 0) {
        const char *env = getenv("SPECDEC_GGUF_SPIN_US");
        spin_seconds = (env ? atof(env) : 100.0) * 1e-6;
    }
    while (pool_workers < threads - 1) {
        pthread_t t;
        if (pthread_create(&t, NULL, worker_main, (void *)(intptr_t)(pool_workers + 1)) != 0) break;
        pthread_detach(t);
        pool_workers++;
    }
    pool_threads = threads < pool_workers + 1 ? threads : pool_workers + 1;
    pool_work = w;
    atomic_store(&pool_done, 0);
    pthread_mutex_lock(&pool_mu);
    atomic_fetch_add_explicit(&pool_gen, 1, memory_order_release);
    pthread_cond_broadcast(&pool_cv);
    pthread_mutex_unlock(&pool_mu);
    run_share(w, 0, pool_threads);
    while (atomic_load_explicit(&pool_done, memory_order_acquire) < pool_workers) cpu_relax();
    pthread_mutex_unlock(&call_mu);
}

/* 1 when parts run on the process's OpenMP team, 0 on our own pool. */
int sd_gguf_thread_pool(void) {
    pthread_once(&omp_once, look_for_omp);
    return omp_found && !forced_own;
}

/* own = 1: our pool even where OpenMP is loaded (tests and A/B measurements); returns the active one. */
int sd_gguf_set_pool(int own) {
    forced_own = own != 0;
    return sd_gguf_thread_pool();
}

void sd_run_parts(part_fn fn, const void *job, int parts, int threads) {
    const work_t w = {fn, job, parts};
    if (threads > parts) threads = parts;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads <= 1) run_share(&w, 0, 1);
    else if (sd_gguf_thread_pool()) omp_parallel(omp_body, (void *)&w, (unsigned)threads, 0);
    else own_pool(&w, threads);
}
