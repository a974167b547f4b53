/* pool.c — the project's own thread pool (kv_common.h, "thread pool").
 *
 * Why not OpenMP for decoding: libgomp ends every parallel region with a barrier at which the
 * threads that finished spin (GOMP_SPINCOUNT, 300000 iterations by default) waiting for the rest.
 * On a machine whose cores are busy with other work, one of our threads is often descheduled, and
 * every barrier then waits a scheduler quantum for it: a decode step has hundreds of regions, and
 * `kvrun generate` fell from ~30 to 0.6 tokens/s with a busy neighbour (issue 13). Here nothing
 * waits for a thread that has not started: items are claimed from a shared counter, the caller
 * takes items too, and run() returns as soon as every item is finished. A worker that wakes late
 * finds the counter exhausted and goes back to sleep. The caller only ever waits for items another
 * thread has claimed and is running, so a loaded machine costs in proportion to the work others
 * took, not a quantum per region.
 *
 * Waiting: workers spin briefly for the next job (decoding runs jobs back to back), then sleep on a
 * condition variable; the caller spins briefly for claimed items, then yields. */
#define _POSIX_C_SOURCE 200809L
#include "kv_common.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define POOL_MAX_THREADS 1024
/* Spins before a worker sleeps / the caller yields: some tens of microseconds. */
#define POOL_SPIN 2000

struct kv_pool {
    int n_threads; /* including the caller */
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* the current job (written by the caller before generation is bumped) */
    kv_pool_fn fn;
    void *ctx;
    int n_items;
    atomic_int next;     /* next item to claim */
    atomic_int finished; /* items done */
    atomic_uint generation; /* bumped for every job; workers compare with the last one they saw */
    atomic_int stop;
    atomic_int busy;     /* workers that joined the current job (run() publishes only at 0) */
};

typedef struct worker_arg {
    kv_pool *p;
    int index;
} worker_arg;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void run_items(kv_pool *p, int thread) {
    for (;;) {
        const int i = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (i >= p->n_items) break;
        p->fn(p->ctx, i, thread);
        atomic_fetch_add_explicit(&p->finished, 1, memory_order_release);
    }
}

static void *worker_main(void *arg) {
    worker_arg *wa = arg;
    kv_pool *p = wa->p;
    const int index = wa->index;
    free(wa);
    unsigned seen = atomic_load_explicit(&p->generation, memory_order_acquire);
    for (;;) {
        for (int spin = 0; spin < POOL_SPIN; spin++) {
            if (atomic_load_explicit(&p->generation, memory_order_acquire) != seen ||
                atomic_load_explicit(&p->stop, memory_order_relaxed))
                break;
            cpu_relax();
        }
        /* Join the job under the mutex: the caller publishes a job under the same mutex and only
         * when no worker is busy, so the job's fields stay fixed while busy > 0. */
        pthread_mutex_lock(&p->mu);
        while (atomic_load_explicit(&p->generation, memory_order_relaxed) == seen &&
               !atomic_load_explicit(&p->stop, memory_order_relaxed))
            pthread_cond_wait(&p->cv, &p->mu);
        if (atomic_load_explicit(&p->stop, memory_order_relaxed)) {
            pthread_mutex_unlock(&p->mu);
            break;
        }
        seen = atomic_load_explicit(&p->generation, memory_order_relaxed);
        atomic_fetch_add_explicit(&p->busy, 1, memory_order_relaxed);
        pthread_mutex_unlock(&p->mu);
        run_items(p, index);
        atomic_fetch_sub_explicit(&p->busy, 1, memory_order_release);
    }
    return NULL;
}

kv_status kv_pool_create(kv_pool **out, int n_threads) {
    *out = NULL;
    if (n_threads < 1 || n_threads > POOL_MAX_THREADS)
        return KV_ERR(KV_EINVAL, "thread pool: %d threads (1..%d)", n_threads, POOL_MAX_THREADS);
    kv_pool *p = calloc(1, sizeof *p);
    if (!p) return KV_ERR(KV_ENOMEM, "out of memory for a thread pool");
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    atomic_init(&p->next, 0);
    atomic_init(&p->finished, 0);
    atomic_init(&p->generation, 0u);
    atomic_init(&p->stop, 0);
    atomic_init(&p->busy, 0);
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads - 1, sizeof *p->threads);
        if (!p->threads) {
            kv_pool_free(p);
            return KV_ERR(KV_ENOMEM, "out of memory for a thread pool");
        }
        for (int i = 1; i < n_threads; i++) {
            worker_arg *wa = malloc(sizeof *wa);
            if (wa) wa->p = p, wa->index = i;
            if (!wa || pthread_create(&p->threads[i - 1], NULL, worker_main, wa) != 0) {
                free(wa);
                p->n_threads = i; /* the threads started so far are joined by kv_pool_free */
                kv_pool_free(p);
                return KV_ERR(KV_ENOMEM, "thread pool: cannot start thread %d of %d", i, n_threads);
            }
        }
    }
    *out = p;
    return KV_OK;
}

void kv_pool_free(kv_pool *p) {
    if (!p) return;
    if (p->threads) {
        pthread_mutex_lock(&p->mu);
        atomic_store(&p->stop, 1);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
        for (int i = 1; i < p->n_threads; i++) pthread_join(p->threads[i - 1], NULL);
    }
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->threads);
    free(p);
}

int kv_pool_threads(const kv_pool *p) { return p ? p->n_threads : 1; }

void kv_pool_run(kv_pool *p, int n_items, kv_pool_fn fn, void *ctx) {
    if (n_items <= 0) return;
    if (!p || p->n_threads == 1 || n_items == 1) {
        for (int i = 0; i < n_items; i++) fn(ctx, i, 0);
        return;
    }
    pthread_mutex_lock(&p->mu);
    /* a worker that joined the previous job late may still be claiming (and finding nothing) */
    while (atomic_load_explicit(&p->busy, memory_order_acquire) != 0) {
        pthread_mutex_unlock(&p->mu);
        cpu_relax();
        pthread_mutex_lock(&p->mu);
    }
    p->fn = fn;
    p->ctx = ctx;
    p->n_items = n_items;
    atomic_store_explicit(&p->finished, 0, memory_order_relaxed);
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    atomic_fetch_add_explicit(&p->generation, 1u, memory_order_release);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    run_items(p, 0);
    /* every item is claimed: wait for the ones other threads are still running */
    for (int spin = 0; atomic_load_explicit(&p->finished, memory_order_acquire) < n_items; spin++) {
        if (spin < POOL_SPIN)
            cpu_relax();
        else
            sched_yield();
    }
}
