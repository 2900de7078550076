/* cp_comm.c: context parallelism across processes over a communicator the caller owns (a table of
 * callbacks: MPI through maskpack_mpi.h, or any other transport). The algorithms here are written
 * once against the table; the library never starts or tears down processes. */
#include "cp_internal.h"

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

/* What every rank must agree on, in one fixed-size record (the same for every collective call, so
 * ranks in different calls still meet in this exchange): the group, the call, the status of the rank's
 * own argument checks (a rank that fails them still takes part), the scheme, the grid, a hash of the
 * segments and of the rule, and the call's settings (cp_internal.h). */
typedef struct cp_fingerprint {
    int64_t size, call, local_status;
    char refused[24]; /* the argument this rank's own checks refused (its first 23 bytes) */
    int64_t scheme, n_rows, q_width, kv_width, n_segments;
    uint64_t segments, rule;
    int64_t n_settings;
    int64_t setting[MP_CP_SETTINGS];
} cp_fingerprint;

static const char *const call_names[MP_CP_CALL_COUNT] = {
    "no call",
    "maskpack_cp_check",
    "maskpack_cp_all_gather",
    "maskpack_cp_attention_forward",
    "maskpack_cp_attention_backward",
    "maskpack_cp_gdn_forward",
    "maskpack_cp_gdn_backward",
    "maskpack_cp_causal_conv1d",
    "maskpack_cp_causal_conv1d_backward",
};

static const char *call_name(int64_t id) {
    return id > 0 && id < MP_CP_CALL_COUNT ? call_names[id] : "an unknown call";
}

void mp_cp_set(mp_cp_call *c, const char *argument, const char *what, mp_cp_kind kind, int64_t value) {
    if (c->n >= MP_CP_SETTINGS) return;
    c->s[c->n++] = (mp_cp_setting){argument, what, kind, value};
}

/* A per-token shape in one value: up to 3 dimensions below 2^20 exactly (ndim in bits 60-61), any other
 * as a hash with bit 62 set (equal shapes, equal values; a message shows the hash); a tensor with fewer
 * dimensions than the tokens take: -2 - ndim (-1 is no tensor). */
static int64_t pack_shape(const maskpack_tensor *t, int lead) {
    int nd = t->ndim - lead;
    if (nd < 0) return -2 - (int64_t)t->ndim;
    int exact = nd <= 3;
    for (int i = 0; i < nd && exact; i++) exact = t->shape[lead + i] >= 0 && t->shape[lead + i] < (1 << 20);
    if (exact) {
        int64_t v = nd;
        for (int i = 0; i < 3; i++) v = v << 20 | (i < nd ? t->shape[lead + i] : 0);
        return v;
    }
    uint64_t h = 14695981039346656037ULL;
    for (int i = lead; i < t->ndim; i++) h = fnv_i64(h, t->shape[i]);
    return (int64_t)((h >> 2) | (1ULL << 62));
}

void mp_cp_tensor(mp_cp_call *c, const char *argument, const maskpack_tensor *t, int lead, const char *shape_what) {
    mp_cp_set(c, argument, "dtype", MP_CP_DTYPE, t ? (int64_t)t->dtype : -1);
    mp_cp_set(c, argument, shape_what, MP_CP_SHAPE, t ? pack_shape(t, lead) : -1);
}

/* value as it reads in a message, into buf */
static const char *show(char *buf, size_t n, mp_cp_kind kind, int64_t v) {
    switch (kind) {
    case MP_CP_DTYPE: snprintf(buf, n, "%s", v < 0 ? "no tensor" : maskpack_dtype_name((maskpack_dtype)v)); break;
    case MP_CP_FLAG: snprintf(buf, n, "%s", v ? "yes" : "no"); break;
    case MP_CP_REAL: {
        double d;
        memcpy(&d, &v, sizeof d);
        snprintf(buf, n, "%.17g", d);
        break;
    }
    case MP_CP_SHAPE:
        if (v == -1)
            snprintf(buf, n, "no tensor");
        else if (v < 0)
            snprintf(buf, n, "a tensor of %lld dimensions", (long long)(-2 - v));
        else if (v >> 62)
            snprintf(buf, n, "a shape hashed to %016llx", (unsigned long long)v);
        else {
            int nd = (int)(v >> 60);
            int64_t d[3] = {(v >> 40) & 0xfffff, (v >> 20) & 0xfffff, v & 0xfffff};
            if (nd == 0) snprintf(buf, n, "[]");
            if (nd == 1) snprintf(buf, n, "[%lld]", (long long)d[0]);
            if (nd == 2) snprintf(buf, n, "[%lld, %lld]", (long long)d[0], (long long)d[1]);
            if (nd == 3) snprintf(buf, n, "[%lld, %lld, %lld]", (long long)d[0], (long long)d[1], (long long)d[2]);
        }
        break;
    default: snprintf(buf, n, "%lld", (long long)v);
    }
    return buf;
}

static cp_fingerprint fingerprint(const maskpack_comm *c, const maskpack_layout *L, maskpack_cp_scheme scheme,
                                  const mp_cp_call *call) {
    cp_fingerprint f;
    memset(&f, 0, sizeof f); /* every byte defined: the record travels as bytes */
    f.size = c->size;
    f.call = call->id;
    f.scheme = (int64_t)scheme;
    f.n_settings = call->n;
    for (int i = 0; i < call->n; i++) f.setting[i] = call->s[i].value;
    if (!L) return f;
    f.n_rows = L->n_rows, f.q_width = L->q_width, f.kv_width = L->kv_width, f.n_segments = (int64_t)L->n_segments;
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

/* The first difference of rank r's record b from rank 0's a (the group, the call, the scheme, the
 * layout, the call's settings), as an error naming the setting and both values; OK when none. */
static maskpack_status differ(const cp_fingerprint *a, const cp_fingerprint *b, int r, const mp_cp_call *call,
                              maskpack_error *err) {
    const maskpack_status bad = MASKPACK_ERR_INVALID_ARGUMENT;
    if (a->size != b->size)
        return mp_fail(err, bad, "comm", r, -1, "comm: rank %d sees a group of %lld ranks, rank 0 one of %lld", r,
                       (long long)b->size, (long long)a->size);
    if (a->call != b->call || a->n_settings != b->n_settings)
        return mp_fail(err, bad, "comm", r, -1,
                       "comm: rank %d disagrees with rank 0 about the collective call: %s on rank %d, %s on rank 0 "
                       "(every rank must make the same CP calls in the same order)",
                       r, call_name(b->call), r, call_name(a->call));
    if (a->scheme != b->scheme)
        return mp_fail(err, bad, "scheme", r, -1, "scheme: rank %d uses CP scheme %lld, rank 0 scheme %lld", r,
                       (long long)b->scheme, (long long)a->scheme);
    if (a->n_rows != b->n_rows || a->q_width != b->q_width || a->kv_width != b->kv_width)
        return mp_fail(
            err, bad, "layout", r, -1,
            "layout: rank %d holds a [%lld, %lld] grid, rank 0 a [%lld, %lld] one (keys: %lld on rank %d, %lld "
            "on rank 0)",
            r, (long long)b->n_rows, (long long)b->q_width, (long long)a->n_rows, (long long)a->q_width,
            (long long)b->kv_width, r, (long long)a->kv_width);
    if (a->n_segments != b->n_segments || a->segments != b->segments)
        return mp_fail(
            err, bad, "layout", r, -1,
            "layout: rank %d holds other sequences than rank 0 (%lld segments against %lld, or the same count "
            "placed differently: fingerprint %016llx on rank %d, %016llx on rank 0)",
            r, (long long)b->n_segments, (long long)a->n_segments, (unsigned long long)b->segments, r,
            (unsigned long long)a->segments);
    if (a->rule != b->rule)
        return mp_fail(err, bad, "layout", r, -1,
                       "layout: rank %d's attention rule (causal, alignment, window, spans, prefix) differs from rank "
                       "0's: fingerprint %016llx on rank %d, %016llx on rank 0",
                       r, (unsigned long long)b->rule, r, (unsigned long long)a->rule);
    for (int i = 0; i < call->n && i < MP_CP_SETTINGS; i++)
        if (a->setting[i] != b->setting[i]) {
            const mp_cp_setting *st = &call->s[i];
            char va[80], vb[80];
            return mp_fail(err, bad, st->argument, r, -1,
                           "%s: rank %d disagrees with rank 0 about the %s %s: %s on rank %d, %s on rank 0 (every rank "
                           "must make the same call of %s)",
                           st->argument, r, st->argument, st->what, show(vb, sizeof vb, st->kind, b->setting[i]), r,
                           show(va, sizeof va, st->kind, a->setting[i]), call_name(a->call));
        }
    return MASKPACK_OK;
}

maskpack_status mp_cp_agree_call(const maskpack_comm *comm, const maskpack_layout *layout, maskpack_cp_scheme scheme,
                                 const mp_cp_call *call, maskpack_status local, maskpack_error *err) {
    cp_fingerprint mine = fingerprint(comm, layout, scheme, call);
    mine.local_status = local;
    for (size_t i = 0; local && err && i + 1 < sizeof mine.refused && err->argument[i]; i++)
        mine.refused[i] = err->argument[i]; /* the rest stays 0 */
    cp_fingerprint *all = mp_alloc_array((size_t)comm->size, sizeof *all);
    if (!all) return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "comm", -1, -1, "out of memory");
    if (comm->all_gather(comm->ctx, &mine, all, sizeof mine) != 0) {
        free(all);
        return mp_fail(err, MASKPACK_ERR_COMM, "comm", -1, -1,
                       "comm: all_gather of the layout fingerprints failed on rank %d", comm->rank);
    }
    /* this rank's own refusal keeps its own reason; the others name the first rank that refused */
    maskpack_status s = local;
    for (int r = 0; r < comm->size && !s; r++)
        if (all[r].local_status != MASKPACK_OK) {
            all[r].refused[sizeof all[r].refused - 1] = 0;
            s = mp_fail(err, (maskpack_status)all[r].local_status, "comm", r, -1,
                        "comm: rank %d refused its arguments (%s) at its argument '%s'; every rank stops with it", r,
                        maskpack_status_name((maskpack_status)all[r].local_status), all[r].refused);
        }
    for (int r = 1; r < comm->size && !s; r++) s = differ(&all[0], &all[r], r, call, err);
    free(all);
    return s;
}

maskpack_status mp_cp_agree(const maskpack_comm *comm, const maskpack_layout *layout, maskpack_cp_scheme scheme,
                            maskpack_status local, maskpack_error *err) {
    mp_cp_call call = mp_cp_call_of(MP_CP_CALL_CHECK);
    return mp_cp_agree_call(comm, layout, scheme, &call, local, err);
}

maskpack_status maskpack_cp_check(const maskpack_comm *comm, const maskpack_layout *layout, maskpack_cp_scheme scheme,
                                  maskpack_error *err) {
    maskpack_status s = mp_cp_check_comm(comm, 0, err);
    if (s) return s;
    /* a NULL layout still joins the exchange: the other ranks fail with this one instead of waiting */
    maskpack_status local = layout ? MASKPACK_OK
                                   : mp_fail(err, MASKPACK_ERR_NULL_ARGUMENT, "layout", -1, -1,
                                             "layout: expected a non-NULL pointer, found NULL");
    s = mp_cp_agree(comm, layout, scheme, local, err);
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
    for (int r = 0; r < comm->size && !s; r++)
        s = maskpack_layout_cp_shard(layout, comm->size, r, scheme, &shards[r], err);
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
    const int n = comm->size;
    maskpack_layout **shards = mp_calloc_array((size_t)n, sizeof *shards);
    /* local checks first (a NULL layout or part among them), then the agreement (collective even when
     * the local checks failed): the call, the layout and the part's dtype, per-token shape and bytes */
    maskpack_status local = !shards   ? mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "comm", -1, -1, "out of memory")
                            : !layout ? mp_fail(err, MASKPACK_ERR_NULL_ARGUMENT, "layout", -1, -1,
                                                "layout: expected a non-NULL pointer, found NULL")
                                      : gather_args(comm, layout, scheme, part, whole, shards, err);
    mp_cp_call call = mp_cp_call_of(MP_CP_CALL_ALL_GATHER);
    mp_cp_tensor(&call, "part", part, mp_cp_lead(layout), "per-token shape");
    mp_cp_set(&call, "part", "payload bytes", MP_CP_INT,
              part && !local ? mp_numel(part) * (int64_t)maskpack_dtype_size(part->dtype) : -1);
    s = mp_cp_agree_call(comm, layout, scheme, &call, local, err);
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
            views[r] =
                maskpack_tensor_contiguous((char *)buf + (size_t)r * bytes, part->dtype, part->ndim, part->shape);
            xs[r] = &views[r];
        }
        s = maskpack_relayout_plan_create((const maskpack_layout *const *)shards, (size_t)n, layout, &plan, err);
    }
    if (!s) s = maskpack_relayout_execute(plan, xs, whole, pad_value, 1, err);
    maskpack_relayout_plan_free(plan);
    free(views);
    free(xs);
    free(buf);
    for (int r = 0; shards && r < n; r++) maskpack_layout_free(shards[r]);
    free(shards);
    return s ? s : mp_ok(err);
}
