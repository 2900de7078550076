/* workers.c: a team of worker threads owned by the caller and reused across calls.
 *
 * Why: starting a thread costs about as much as copying 400 KB (~15 us on a VM), so a per-call thread
 * makes small moves slower, not faster. A team started once hands work over in well under a
 * microsecond while its threads are still spinning from the previous call, and sleeps on a condition
 * variable after SPIN_NS of idleness so an idle team costs nothing.
 *
 * Protocol: the caller publishes (fn, ctx), bumps `gen` to g (release) and wakes sleepers, then runs
 * fn itself. fn shares its work dynamically (an atomic counter of chunks), so the caller never waits
 * for a worker that has not started: a worker busy elsewhere, descheduled or still waking up simply
 * takes no chunk. When the caller's fn returns, it closes g and waits only for the workers inside fn.
 * A worker enters g by incrementing `active` and then checking `closed < g` (both sequentially
 * consistent, Dekker style): either the caller sees it active and waits for its decrement, or the
 * worker sees g closed and never touches fn/ctx, which may already be gone. The caller spins while
 * it waits, then (past SPIN_NS) sleeps until the worker that brings `active` to 0 wakes it. One
 * caller at a time: a second concurrent caller (another thread using the same team) does not wait,
 * it runs every share itself. After fork() the child has none of the threads; calls from
 * another process run inline too, and free() only releases memory.
 *
 * A hosted team (maskpack_workers_create_hosted) has no threads: each run is one parallel region of
 * the caller's own pool, whose threads are the participants. The dynamic sharing above is what makes
 * that safe: a participant the host leaves out only means fewer hands. */
#define _GNU_SOURCE
#include "internal.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MP_PAUSE() _mm_pause()
#else
#define MP_PAUSE() ((void)0)
#endif

/* How long an idle worker spins before it sleeps: long enough to cover the gap between two moves
 * of one training step, short enough not to steal a core from anything else for long. */
#define SPIN_NS 100000

typedef struct worker_arg {
    maskpack_workers *w;
    int tid;
} worker_arg;

struct maskpack_workers {
    int n;       /* participants, the caller included */
    int started; /* worker threads actually running (n - 1 unless the system refused some) */
    pid_t owner; /* process that started the threads */
    pthread_t *threads;
    worker_arg *args;
    pthread_mutex_t mu; /* guards sleepers and the condition */
    pthread_cond_t cv;
    int sleepers;
    pthread_mutex_t busy;    /* held by the one caller currently running work on the team */
    _Atomic uint64_t gen;    /* last published generation */
    _Atomic uint64_t closed; /* last generation whose caller stopped accepting workers */
    _Atomic int active;      /* workers inside fn (or deciding whether to enter) */
    pthread_mutex_t done_mu; /* the caller's sleep while the last workers finish (see mp_workers_run) */
    pthread_cond_t done_cv;
    _Atomic int waiting; /* the caller sleeps on done_cv: the worker that brings active to 0 signals */
    _Atomic int stop;
    mp_work_fn fn; /* published before gen is bumped */
    void *ctx;
    maskpack_parallel_fn parallel; /* hosted: the host's parallel region (no threads of our own) */
    void *host;
};

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void *worker_main(void *p) {
    worker_arg *a = p;
    maskpack_workers *w = a->w;
    uint64_t seen = 0;
    for (;;) {
        uint64_t g = atomic_load_explicit(&w->gen, memory_order_acquire);
        int64_t t0 = 0;
        /* Polite spin: yield the core every 64 pauses, so a thread of another pool (torch's OpenMP
         * team) that becomes runnable on this core gets it at once instead of after a time slice. */
        for (unsigned i = 0; g == seen && !atomic_load_explicit(&w->stop, memory_order_relaxed); i++) {
            MP_PAUSE();
            if ((i & 63) == 0) {
                int64_t t = now_ns();
                if (i == 0)
                    t0 = t;
                else if (t - t0 > SPIN_NS)
                    break;
                else
                    sched_yield();
            }
            g = atomic_load_explicit(&w->gen, memory_order_acquire);
        }
        if (g == seen && !atomic_load(&w->stop)) {
            pthread_mutex_lock(&w->mu);
            w->sleepers++;
            while ((g = atomic_load_explicit(&w->gen, memory_order_acquire)) == seen && !atomic_load(&w->stop))
                pthread_cond_wait(&w->cv, &w->mu);
            w->sleepers--;
            pthread_mutex_unlock(&w->mu);
        }
        if (atomic_load(&w->stop)) return NULL;
        seen = g;
        atomic_fetch_add(&w->active, 1);
        if (atomic_load(&w->closed) < g) w->fn(w->ctx, a->tid);
        /* sequentially consistent against the caller's store of `waiting` and load of `active`:
         * either the caller sees 0, or this worker sees it waiting and wakes it */
        if (atomic_fetch_sub(&w->active, 1) == 1 && atomic_load(&w->waiting)) {
            pthread_mutex_lock(&w->done_mu);
            pthread_cond_signal(&w->done_cv);
            pthread_mutex_unlock(&w->done_mu);
        }
    }
}

maskpack_status maskpack_workers_create(int n_threads, maskpack_workers **out, maskpack_error *err) {
    MP_CHECK_NULL(err, out, "out");
    maskpack_status s = mp_check_threads(n_threads, "n_threads", err);
    if (s) return s;
    maskpack_workers *w = calloc(1, sizeof *w);
    if (w) {
        w->threads = calloc((size_t)n_threads, sizeof *w->threads);
        w->args = calloc((size_t)n_threads, sizeof *w->args);
    }
    if (!w || !w->threads || !w->args) {
        if (w) {
            free(w->threads);
            free(w->args);
        }
        free(w);
        return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "workers", -1, -1, "out of memory");
    }
    w->n = n_threads;
    w->owner = getpid();
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    pthread_mutex_init(&w->busy, NULL);
    pthread_mutex_init(&w->done_mu, NULL);
    pthread_cond_init(&w->done_cv, NULL);
    atomic_init(&w->waiting, 0);
    atomic_init(&w->gen, 0);
    atomic_init(&w->closed, 0);
    atomic_init(&w->active, 0);
    atomic_init(&w->stop, 0);
    /* Threads the system refuses are not an error: their shares run on the caller. */
    for (int t = 1; t < n_threads; t++) {
        w->args[w->started] = (worker_arg){w, t};
        if (pthread_create(&w->threads[w->started], NULL, worker_main, &w->args[w->started]) != 0) break;
        w->started++;
    }
    *out = w;
    return mp_ok(err);
}

maskpack_status maskpack_workers_create_hosted(int n_threads, maskpack_parallel_fn parallel, void *host,
                                               maskpack_workers **out, maskpack_error *err) {
    MP_CHECK_NULL(err, out, "out");
    MP_CHECK_NULL(err, parallel, "parallel");
    maskpack_status s = mp_check_threads(n_threads, "n_threads", err);
    if (s) return s;
    maskpack_workers *w = calloc(1, sizeof *w);
    if (!w) return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "workers", -1, -1, "out of memory");
    w->n = n_threads;
    w->owner = getpid();
    w->parallel = parallel;
    w->host = host;
    *out = w;
    return mp_ok(err);
}

void maskpack_workers_free(maskpack_workers *w) {
    if (!w) return;
    if (!w->parallel && getpid() == w->owner) {
        atomic_store(&w->stop, 1);
        pthread_mutex_lock(&w->mu);
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->mu);
        for (int t = 0; t < w->started; t++) pthread_join(w->threads[t], NULL);
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
        pthread_mutex_destroy(&w->busy);
        pthread_mutex_destroy(&w->done_mu);
        pthread_cond_destroy(&w->done_cv);
    }
    free(w->threads);
    free(w->args);
    free(w);
}

int maskpack_workers_threads(const maskpack_workers *w) { return w ? w->n : 1; }

void mp_workers_run(maskpack_workers *w, mp_work_fn fn, void *ctx) {
    if (w && w->parallel) { /* hosted: the host's region, unless this is a child after fork() */
        if (w->n > 1 && getpid() == w->owner)
            w->parallel(w->host, fn, ctx, w->n);
        else
            fn(ctx, 0);
        return;
    }
    /* alone: no team, no thread started, another process (after fork), or the team busy elsewhere */
    if (!w || w->started == 0 || getpid() != w->owner || pthread_mutex_trylock(&w->busy) != 0) {
        fn(ctx, 0);
        return;
    }
    w->fn = fn;
    w->ctx = ctx;
    uint64_t g = atomic_fetch_add_explicit(&w->gen, 1, memory_order_release) + 1;
    pthread_mutex_lock(&w->mu);
    if (w->sleepers) pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    fn(ctx, 0);
    atomic_store(&w->closed, g);
    /* The workers still inside fn finish their last share. Spin while that is short (a share of a
     * small move); past SPIN_NS sleep instead, so that on a machine with more runnable threads than
     * cores the waiting caller gives its core to the worker it waits for (as a join would). */
    int64_t t0 = 0;
    for (unsigned i = 1; atomic_load_explicit(&w->active, memory_order_acquire) > 0; i++) {
        MP_PAUSE();
        if ((i & 63) != 0) continue;
        const int64_t t = now_ns();
        if (t0 == 0) {
            t0 = t;
        } else if (t - t0 > SPIN_NS) {
            pthread_mutex_lock(&w->done_mu);
            atomic_store(&w->waiting, 1);
            while (atomic_load(&w->active) > 0) pthread_cond_wait(&w->done_cv, &w->done_mu);
            atomic_store(&w->waiting, 0);
            pthread_mutex_unlock(&w->done_mu);
            break;
        }
        if ((i & 1023) == 0) sched_yield(); /* a descheduled worker needs the core back */
    }
    pthread_mutex_unlock(&w->busy);
}
