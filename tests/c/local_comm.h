/* local_comm.h: a maskpack_comm between threads of one process, for the tests that run
 * context-parallel ranks as threads (test_cp_local, test_cp_agree): a barrier for the collectives,
 * mailboxes for the point-to-point messages.
 *
 *     local_hub h;
 *     local_hub_init(&h, n);
 *     ... in rank r's thread: local_rank x = {&h, r}; maskpack_comm comm = local_comm(&x); ...
 *     local_hub_destroy(&h);
 *
 * A collective whose ranks pass different byte counts fails on every rank (as a transport would)
 * and sets h.size_mismatch; a message whose two ends disagree on its size fails its wait. */
#ifndef MASKPACK_LOCAL_COMM_H
#define MASKPACK_LOCAL_COMM_H

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "maskpack.h"

#define LOCAL_COMM_MAX_RANKS 4

typedef struct local_slot {
    const void *p;
    size_t bytes;
    int full;
} local_slot;

typedef struct local_hub {
    int n;
    pthread_barrier_t bar;
    const void *send[LOCAL_COMM_MAX_RANKS];
    size_t bytes[LOCAL_COMM_MAX_RANKS];
    int size_mismatch; /* a collective whose ranks passed different byte counts (the transport would fail) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    local_slot box[LOCAL_COMM_MAX_RANKS][LOCAL_COMM_MAX_RANKS][2]; /* [from][to][tag] */
} local_hub;

/* one rank's end: the comm's ctx */
typedef struct local_rank {
    local_hub *h;
    int rank;
} local_rank;

typedef struct local_req {
    int to, from, tag;
    void *recv;
    size_t rbytes;
} local_req;

/* n ranks, 1 <= n <= LOCAL_COMM_MAX_RANKS */
static inline void local_hub_init(local_hub *h, int n) {
    memset(h, 0, sizeof *h);
    h->n = n;
    pthread_barrier_init(&h->bar, NULL, (unsigned)n);
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
}

static inline void local_hub_destroy(local_hub *h) {
    pthread_barrier_destroy(&h->bar);
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cv);
}

static inline int local_collective(local_rank *x, const void *send, void *recv, size_t bytes, int to_all) {
    local_hub *h = x->h;
    h->send[x->rank] = send;
    h->bytes[x->rank] = bytes;
    pthread_barrier_wait(&h->bar);
    int same = 1;
    for (int r = 0; r < h->n; r++) same &= h->bytes[r] == bytes;
    if (!same) h->size_mismatch = 1;
    for (int r = 0; same && r < h->n; r++)
        memcpy((char *)recv + (size_t)r * bytes, (const char *)h->send[r] + (to_all ? (size_t)x->rank * bytes : 0),
               bytes);
    pthread_barrier_wait(&h->bar);
    return same ? 0 : 1;
}

static inline int local_all_gather(void *c, const void *send, void *recv, size_t bytes) {
    return local_collective(c, send, recv, bytes, 0);
}

static inline int local_all_to_all(void *c, const void *send, void *recv, size_t bytes) {
    return local_collective(c, send, recv, bytes, 1);
}

static inline int local_start(void *c, const void *send, size_t sb, int to, void *recv, size_t rb, int from, int tag,
                              void **request) {
    local_rank *x = c;
    local_hub *h = x->h;
    if (tag < 0 || tag > 1) return 1;
    if (to >= 0) {
        pthread_mutex_lock(&h->mu);
        while (h->box[x->rank][to][tag].full) pthread_cond_wait(&h->cv, &h->mu);
        h->box[x->rank][to][tag] = (local_slot){send, sb, 1};
        pthread_cond_broadcast(&h->cv);
        pthread_mutex_unlock(&h->mu);
    }
    local_req *q = malloc(sizeof *q);
    if (!q) return 1;
    *q = (local_req){to, from, tag, recv, rb};
    *request = q;
    return 0;
}

static inline int local_wait(void *c, void *request) {
    local_rank *x = c;
    local_hub *h = x->h;
    local_req *q = request;
    int rc = 0;
    pthread_mutex_lock(&h->mu);
    if (q->from >= 0) {
        local_slot *s = &h->box[q->from][x->rank][q->tag];
        while (!s->full) pthread_cond_wait(&h->cv, &h->mu);
        if (s->bytes != q->rbytes) rc = 1; /* the pair must agree on the size */
        memcpy(q->recv, s->p, s->bytes < q->rbytes ? s->bytes : q->rbytes);
        s->full = 0;
        pthread_cond_broadcast(&h->cv);
    }
    if (q->to >= 0) /* the peer has taken the bytes: the buffer is ours again */
        while (h->box[x->rank][q->to][q->tag].full) pthread_cond_wait(&h->cv, &h->mu);
    pthread_mutex_unlock(&h->mu);
    free(q);
    return rc;
}

/* rank x->rank of x->h->n over the hub */
static inline maskpack_comm local_comm(local_rank *x) {
    maskpack_comm c = {x, x->rank, x->h->n, local_all_gather, local_all_to_all, local_start, local_wait};
    return c;
}

#endif
