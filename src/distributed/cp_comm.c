/* cp_comm.c: context parallelism across processes over a communicator the caller owns (a table of
 * callbacks: MPI through maskpack_mpi.h, or any other transport). The algorithms here are written
 * once against the table; the library never starts or tears down processes. */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* FNV-1a over bytes, continued from h: a fingerprint, not a defence against an adversary (the ranks
 * of one job are trusted; this catches the honest mistakes: another batch, another cp, another rule). */
static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 1099511628211ULL;
    }
    return h;
}

static uint64_t fnv_i64(uint64_t h, int64_t v) { return fnv(h, &v, sizeof v); }

/* What every rank must agree on, in a fixed 64-byte record: the group, the scheme, the grid and a hash
 * of the segments and of the rule. */
typedef struct cp_fingerprint {
    int64_t size, scheme, n_rows, q_width, kv_width, n_segments;
    uint64_t segments, rule;
    int64_t local_status; /* the rank's own argument checks: a rank that fails them still takes part */
} cp_fingerprint;

static cp_fingerprint fingerprint(const maskpack_comm *c, const maskpack_layout *L, maskpack_cp_scheme scheme) {
    cp_fingerprint f = {c->size, (int64_t)scheme, L->n_rows, L->q_width, L->kv_width, (int64_t)L->n_segments, 0, 0, 0};
    uint64_t h = 14695981039346656037ULL;
    for (size_t k = 0; k < L->n_segments; k++) { /* field by field: struct padding is never hashed */
        const maskpack_segment *g = &L->segs[k];
        h = fnv_i64(h, g->row);
        h = fnv_i64(h, g->q_start);
        h = fnv_i64(h, g->q_len);
        h = fnv_i64(h, g->kv_start);
        h = fnv_i64(h, g->kv_len);
        h = fnv_i64(h, (int64_t)g->flags);
        h = fnv_i64(h, g->q_pos);
        h = fnv_i64(h, g->origin);
        h = fnv_i64(h, g->kv_pos);
    }
    f.segments = h;
    h = 14695981039346656037ULL;
    h = fnv_i64(h, L->causal);
    h = fnv_i64(h, (int64_t)L->alignment);
    h = fnv_i64(h, L->window_left);
    h = fnv_i64(h, L->window_right);
    for (size_t i = 0; i < L->n_spans; i++) {
        h = fnv_i64(h, L->spans[i].segment);
        h = fnv_i64(h, L->spans[i].start);
        h = fnv_i64(h, L->spans[i].end);
    }
    for (size_t k = 0; L->prefix && k < L->n_segments; k++) h = fnv_i64(h, L->prefix[k]);
    f.rule = h;
    return f;
}

maskpack_status mp_cp_check_comm(const maskpack_comm *c, int p2p, maskpack_error *err) {
    MP_CHECK_NULL(err, c, "comm");
    if (c->size < 1 || c->rank < 0 || c->rank >= c->size)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "comm", -1, -1,
                       "comm: expected 0 <= rank < size, found rank %d of size %d", c->rank, c->size);
    if (!c->all_gather || !c->all_to_all)
        return mp_fail(err, MASKPACK_ERR_NULL_ARGUMENT, "comm", -1, -1,
                       "comm: the callbacks all_gather and all_to_all must be set");
    if (p2p && (!c->sendrecv_start || !c->wait))
        return mp_fail(err, MASKPACK_ERR_NULL_ARGUMENT, "comm", -1, -1,
                       "comm: ring attention needs the callbacks sendrecv_start and wait too");
    return MASKPACK_OK;
}

/* The agreement every collective call starts with: one all-gather of each rank's fingerprint and the
 * status of its own argument checks (local, with *err already filled when not OK). Every rank sees the
 * same records and so returns the same verdict: a rank whose arguments are wrong still joins the
 * exchange, and the others fail with it instead of waiting in a collective it never enters. */
maskpack_status mp_cp_agree(const maskpack_comm *comm, const maskpack_layout *layout, maskpack_cp_scheme scheme,
                                maskpack_status local, maskpack_error *err) {
    cp_fingerprint mine = fingerprint(comm, layout, scheme);
    mine.local_status = local;
    cp_fingerprint *all = mp_alloc_array((size_t)comm->size, sizeof *all);
    if (!all) return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "comm", -1, -1, "out of memory");
    if (comm->all_gather(comm->ctx, &mine, all, sizeof mine) != 0) {
        free(all);
        return mp_fail(err, MASKPACK_ERR_COMM, "comm", -1, -1,
                       "comm: all_gather of the layout fingerprints failed on rank %d", comm->rank);
    }
    maskpack_status s = local;
    for (int r = 0; r < comm->size && !s; r++)
        if (all[r].local_status != MASKPACK_OK)
            s = mp_fail(err, (maskpack_status)all[r].local_status, "comm", r, -1,
                        "comm: rank %d refused its arguments (%s); every rank stops with it", r,
                        maskpack_status_name((maskpack_status)all[r].local_status));
    for (int r = 1; r < comm->size && !s; r++) {
        const cp_fingerprint *a = &all[0], *b = &all[r];
        if (a->size != b->size)
            s = mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "comm", r, -1,
                        "comm: rank %d sees a group of %lld ranks, rank 0 one of %lld", r, (long long)b->size,
                        (long long)a->size);
        else if (a->scheme != b->scheme)
            s = mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "scheme", r, -1,
                        "scheme: rank %d uses CP scheme %lld, rank 0 scheme %lld", r, (long long)b->scheme,
                        (long long)a->scheme);
        else if (a->n_rows != b->n_rows || a->q_width != b->q_width || a->kv_width != b->kv_width)
            s = mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "layout", r, -1,
                        "layout: rank %d holds a [%lld, %lld] grid, rank 0 a [%lld, %lld] one", r, (long long)b->n_rows,
                        (long long)b->q_width, (long long)a->n_rows, (long long)a->q_width);
        else if (a->n_segments != b->n_segments || a->segments != b->segments)
            s = mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "layout", r, -1,
                        "layout: rank %d holds other sequences than rank 0 (%lld segments against %lld, or the same "
                        "count placed differently)",
                        r, (long long)b->n_segments, (long long)a->n_segments);
        else if (a->rule != b->rule)
            s = mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "layout", r, -1,
                        "layout: rank %d's attention rule (causal, alignment, window, spans, prefix) differs from "
                        "rank 0's",
                        r);
    }
    free(all);
    return s;
}

maskpack_status maskpack_cp_check(const maskpack_comm *comm, const maskpack_layout *layout, maskpack_cp_scheme scheme,
                                  maskpack_error *err) {
    maskpack_status s = mp_cp_check_comm(comm, 0, err);
    if (s) return s;
    MP_CHECK_NULL(err, layout, "layout");
    s = mp_cp_agree(comm, layout, scheme, MASKPACK_OK, err);
    return s ? s : mp_ok(err);
}

/* This rank's own checks of cp_all_gather's arguments (no communication): the shard layouts of every
 * rank into shards[] on success. */
static maskpack_status gather_args(const maskpack_comm *comm, const maskpack_layout *layout, maskpack_cp_scheme scheme,
                                   const maskpack_tensor *part, const maskpack_tensor *whole, maskpack_layout **shards,
                                   maskpack_error *err) {
    MP_CHECK_NULL(err, part, "part");
    MP_CHECK_NULL(err, whole, "whole");
    maskpack_status s = mp_check_tensor(part, "part", 1, MASKPACK_MAX_DIMS, err);
    for (int r = 0; r < comm->size && !s; r++) s = maskpack_layout_cp_shard(layout, comm->size, r, scheme, &shards[r], err);
    if (s) return s;
    /* a per-token tensor of the rank's shard layout: [T_local, ...] packed, [B, S/cp, ...] padded */
    const maskpack_layout *mine = shards[comm->rank];
    if (mine->packed ? part->shape[0] != mine->n_rows * mine->q_width
                     : part->ndim < 2 || part->shape[0] != mine->n_rows || part->shape[1] != mine->q_width) {
        char found[200], want[64];
        mp_format_shape(found, sizeof found, part->ndim, part->shape);
        if (mine->packed)
            snprintf(want, sizeof want, "[%lld, ...]", (long long)(mine->n_rows * mine->q_width));
        else
            snprintf(want, sizeof want, "[%lld, %lld, ...]", (long long)mine->n_rows, (long long)mine->q_width);
        return mp_fail(err, MASKPACK_ERR_SHAPE, "part", -1, -1,
                       "part: expected this rank's shard (rank %d of %d), %s, found %s", comm->rank, comm->size, want,
                       found);
    }
    if (!mp_is_contiguous(part))
        return mp_fail(err, MASKPACK_ERR_SHAPE, "part", -1, -1,
                       "part: expected a contiguous tensor (its bytes are sent as they lie)");
    return MASKPACK_OK;
}

maskpack_status maskpack_cp_all_gather(const maskpack_comm *comm, const maskpack_layout *layout,
                                       maskpack_cp_scheme scheme, const maskpack_tensor *part, maskpack_tensor *whole,
                                       const void *pad_value, maskpack_error *err) {
    maskpack_status s = mp_cp_check_comm(comm, 0, err);
    if (s) return s;
    MP_CHECK_NULL(err, layout, "layout");
    const int n = comm->size;
    maskpack_layout **shards = mp_calloc_array((size_t)n, sizeof *shards);
    if (!shards) return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "comm", -1, -1, "out of memory");
    /* local checks first, then the agreement (collective even when the local checks failed) */
    s = mp_cp_agree(comm, layout, scheme, gather_args(comm, layout, scheme, part, whole, shards, err), err);
    /* the parts travel as bytes: [n, T_local, ...] in rank order, then one move into the layout; every
     * rank passed its checks here, so every rank allocates and enters the all-gather alike */
    size_t bytes = 0, total = 0;
    void *buf = NULL;
    if (!s && (mp_mul_size((size_t)mp_numel(part), maskpack_dtype_size(part->dtype), &bytes) ||
               mp_mul_size(bytes, (size_t)n, &total)))
        s = mp_fail(err, MASKPACK_ERR_OVERFLOW, "part", -1, -1, "part: %d shards of this size overflow", n);
    if (!s && !(buf = mp_alloc_array(total ? total : 1, 1)))
        s = mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "part", -1, -1, "out of memory");
    if (!s && comm->all_gather(comm->ctx, part->data, buf, bytes) != 0)
        s = mp_fail(err, MASKPACK_ERR_COMM, "comm", -1, -1, "comm: all_gather of the shards failed on rank %d",
                    comm->rank);
    maskpack_tensor *views = s ? NULL : mp_alloc_array((size_t)n, sizeof *views);
    const maskpack_tensor **xs = s ? NULL : mp_alloc_array((size_t)n, sizeof *xs);
    if (!s && (!views || !xs)) s = mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "part", -1, -1, "out of memory");
    maskpack_relayout_plan *plan = NULL;
    if (!s) {
        for (int r = 0; r < n; r++) {
            views[r] = maskpack_tensor_contiguous((char *)buf + (size_t)r * bytes, part->dtype, part->ndim, part->shape);
            xs[r] = &views[r];
        }
        s = maskpack_relayout_plan_create((const maskpack_layout *const *)shards, (size_t)n, layout, &plan, err);
    }
    if (!s) s = maskpack_relayout_execute(plan, xs, whole, pad_value, 1, err);
    maskpack_relayout_plan_free(plan);
    free(views);
    free(xs);
    free(buf);
    for (int r = 0; r < n; r++) maskpack_layout_free(shards[r]);
    free(shards);
    return s ? s : mp_ok(err);
}
