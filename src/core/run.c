/* run.c: the one run layer of the kernels and moves (see internal.h, "the run layer").
 *
 * Every parallel call of the library runs the same way: a team (the caller's, one started for this
 * call, or none: the caller alone), then items [0, n) claimed from one shared counter by whichever
 * participants run, so a worker that joins late or not at all (mp_workers_run never waits for one)
 * only means fewer hands, and a result never depends on which participant ran what. An item's
 * function maps its claimed index to the work it stands for (heaviest first, groups, shares), so the
 * order of a work list is the order items are claimed in. */
#include "internal.h"

#include <stdlib.h>

/* ---- the team of a call ---------------------------------------------------------------------- */

void mp_run_begin(mp_run *r, maskpack_workers *team, int n_threads, int64_t max_items) {
    r->team = team;
    r->started = NULL;
    if (team || n_threads <= 1 || max_items <= 1) return;
    const int nt = (int64_t)n_threads < max_items ? n_threads : (int)max_items;
    /* one the system cannot start leaves every item to the caller, with the same results */
    if (maskpack_workers_create(nt, &r->started, NULL) != MASKPACK_OK) r->started = NULL;
    r->team = r->started;
}

maskpack_status mp_run_begin_checked(mp_run *r, int n_threads, maskpack_error *err) {
    r->team = r->started = NULL;
    maskpack_status s = mp_check_threads(n_threads, "n_threads", err);
    if (s || n_threads == 1) return s;
    if ((s = maskpack_workers_create(n_threads, &r->started, err))) return s;
    r->team = r->started;
    return MASKPACK_OK;
}

void mp_run_end(mp_run *r) {
    maskpack_workers_free(r->started);
    r->team = r->started = NULL;
}

/* ---- claiming items -------------------------------------------------------------------------- */

/* A failure: the lowest failing item's index (high bits) with its status (low 8 bits), so one
 * atomic minimum keeps the pair; INT64_MAX while none failed. */
#define NO_FAILURE INT64_MAX

typedef struct run_items {
    mp_claim claim;
    mp_item_fn fn;
    void *ctx;
    _Atomic int64_t failed;
    /* guided: chunks [lo, hi) not yet taken (lo in the low 32 bits, hi in the high), each take
     * 1/threads of what is left */
    _Atomic uint64_t range;
    uint64_t threads;
} run_items;

static void note_failure(run_items *R, int64_t item, maskpack_status s) {
    const int64_t v = (item << 8) | (int64_t)(s & 0xff);
    int64_t cur = atomic_load(&R->failed);
    while (v < cur && !atomic_compare_exchange_weak(&R->failed, &cur, v)) {}
}

static maskpack_status failure_status(const run_items *R) {
    const int64_t v = atomic_load(&((run_items *)R)->failed);
    return v == NO_FAILURE ? MASKPACK_OK : (maskpack_status)(v & 0xff);
}

static void claim_items(void *p, int participant) {
    run_items *R = p;
    int64_t i;
    while (mp_claim_take(&R->claim, &i)) {
        const maskpack_status s = R->fn(R->ctx, i, participant);
        if (s) {
            note_failure(R, i, s);
            mp_claim_stop(&R->claim); /* no item is claimed after a failure */
        }
    }
}

/* The caller alone: the items in order, up to the first that fails. */
static maskpack_status run_alone(int64_t n_items, mp_item_fn fn, void *ctx) {
    for (int64_t i = 0; i < n_items; i++) {
        const maskpack_status s = fn(ctx, i, 0);
        if (s) return s;
    }
    return MASKPACK_OK;
}

static int alone(const mp_run *r, int64_t n_items) {
    return n_items <= 1 || !r->team || maskpack_workers_threads(r->team) <= 1;
}

maskpack_status mp_run_for(const mp_run *r, int64_t n_items, mp_item_fn fn, void *ctx) {
    if (alone(r, n_items)) return run_alone(n_items, fn, ctx);
    run_items R;
    mp_claim_init(&R.claim, n_items);
    R.fn = fn;
    R.ctx = ctx;
    atomic_init(&R.failed, NO_FAILURE);
    mp_workers_run(r->team, claim_items, &R);
    return failure_status(&R);
}

/* Guided claims: the caller takes from the front and the workers from the back, each take
 * 1/threads of the items left (at least one), so n items cost a handful of contended atomic
 * operations rather than n, and with a steady team each core runs the same items call after call. */
static void claim_guided(void *p, int participant) {
    run_items *R = p;
    uint64_t r = atomic_load_explicit(&R->range, memory_order_relaxed);
    for (;;) {
        uint64_t lo = r & 0xffffffffu, hi = r >> 32;
        if (lo >= hi) return;
        uint64_t k = (hi - lo) / R->threads;
        if (k < 1) k = 1;
        uint64_t take = participant == 0 ? lo : hi - k;
        uint64_t next = participant == 0 ? (hi << 32) | (lo + k) : ((hi - k) << 32) | lo;
        if (atomic_compare_exchange_weak_explicit(&R->range, &r, next, memory_order_relaxed, memory_order_relaxed)) {
            for (uint64_t j = take; j < take + k; j++) {
                const maskpack_status s = R->fn(R->ctx, (int64_t)j, participant);
                if (s) {
                    note_failure(R, (int64_t)j, s);
                    atomic_store_explicit(&R->range, 0, memory_order_relaxed); /* nothing left to take */
                    return;
                }
            }
            r = atomic_load_explicit(&R->range, memory_order_relaxed);
        }
    }
}

maskpack_status mp_run_for_guided(const mp_run *r, int64_t n_items, mp_item_fn fn, void *ctx) {
    if (alone(r, n_items) || n_items > (int64_t)UINT32_MAX) return run_alone(n_items, fn, ctx);
    run_items R;
    R.fn = fn;
    R.ctx = ctx;
    atomic_init(&R.failed, NO_FAILURE);
    atomic_init(&R.range, (uint64_t)n_items << 32);
    R.threads = (uint64_t)maskpack_workers_threads(r->team);
    mp_workers_run(r->team, claim_guided, &R);
    return failure_status(&R);
}

maskpack_status mp_parallel_for(maskpack_workers *team, int n_threads, int64_t n_items, mp_item_fn fn, void *ctx) {
    if (n_items <= 0) return MASKPACK_OK;
    mp_run r;
    mp_run_begin(&r, team, n_threads, n_items);
    const maskpack_status s = mp_run_for(&r, n_items, fn, ctx);
    mp_run_end(&r);
    return s;
}

/* ---- an op's kept workspace ---------------------------------------------------------------- */

void mp_op_ws_init(mp_op_ws *k) {
    pthread_mutex_init(&k->mu, NULL);
    k->mem = NULL;
    k->bytes = 0;
}

void mp_op_ws_free(mp_op_ws *k) {
    pthread_mutex_destroy(&k->mu);
    free(k->mem);
    k->mem = NULL;
    k->bytes = 0;
}

int mp_op_ws_take(mp_op_ws *k, size_t keep, void **workspace, size_t *workspace_bytes) {
    if (*workspace || *workspace_bytes || pthread_mutex_trylock(&k->mu) != 0) return 0;
    if (k->bytes < keep) {
        free(k->mem);
        k->bytes = 0;
        k->mem = malloc(keep ? keep : 1);
        if (k->mem) k->bytes = keep;
    }
    if (k->mem) {
        *workspace = k->mem;
        *workspace_bytes = k->bytes;
    }
    return 1;
}

void mp_op_ws_release(mp_op_ws *k) { pthread_mutex_unlock(&k->mu); }
