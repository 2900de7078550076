/* cp_ring.c: ring attention over a maskpack_comm. Every rank keeps its queries; key/value blocks travel
 * so that at step s rank r meets the block of rank (r - s) mod n. The same fused kernels as the
 * single-process call compute each step, on a "step layout" whose segments pair each of r's query
 * pieces with each of the block's key pieces of the same sequence (MASKPACK_SEGMENT_KEY_BLOCK: keys
 * at their true sequence positions), so the rule is evaluated exactly and every tile the rule
 * excludes is skipped by the kernel as usual. Written once against the callback table: MPI programs
 * and the Python binding (torch.distributed) run this same code. */
#include "cp_internal.h"
#include "../kernels/kernel_table.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- the step layouts --------------------------------------------------------------------------- */

/* Whether any (query, key) pair of a query piece at q_pos (q_len queries) and a key block at kv_pos
 * (kv_len keys) of one sequence is allowed by L's base rule (causal, windows). Query i's diagonal key
 * is c = q_pos - kv_pos + i; it sees keys [max(0, c - wl), min(kv_len, c + 1 | c + wr + 1)), which is
 * non-empty exactly when c lies in [lo, hi) below, so one interval test decides the whole piece. */
static int pair_visible(const maskpack_layout *L, int64_t q_pos, int64_t q_len, int64_t kv_pos, int64_t kv_len) {
    if (q_len <= 0 || kv_len <= 0) return 0;
    int64_t c0 = q_pos - kv_pos, c1 = c0 + q_len - 1;
    int64_t lo = INT64_MIN, hi = INT64_MAX;
    if (L->causal) lo = 0;
    if (L->window_right >= 0 && -L->window_right > lo) lo = -L->window_right;
    if (L->window_left >= 0 && L->window_left < INT64_MAX - kv_len) hi = kv_len + L->window_left;
    return c1 >= lo && c0 < hi;
}

/* A shard's segments ordered by (origin, q_pos): the key pieces of one sequence side by side. */
typedef struct piece_index {
    size_t n;
    size_t *order;
} piece_index;

static int by_origin(const void *a, const void *b, const maskpack_layout *L) {
    const maskpack_segment *x = &L->segs[*(const size_t *)a], *y = &L->segs[*(const size_t *)b];
    if (x->origin != y->origin) return x->origin < y->origin ? -1 : 1;
    return (x->q_pos > y->q_pos) - (x->q_pos < y->q_pos);
}

/* Insertion sort by (origin, q_pos): shards list pieces nearly in origin order already (by row and
 * column), so this is close to linear, and unlike qsort it takes the layout without global state. */
static void sort_pieces(const maskpack_layout *L, size_t *order, size_t n) {
    for (size_t i = 1; i < n; i++) {
        size_t v = order[i], j = i;
        while (j > 0 && by_origin(&order[j - 1], &v, L) > 0) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = v;
    }
}

static maskpack_status index_pieces(const maskpack_layout *L, piece_index *ix, maskpack_error *err) {
    ix->n = L->n_segments;
    ix->order = mp_alloc_array(ix->n ? ix->n : 1, sizeof *ix->order);
    if (!ix->order) return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "layout", -1, -1, "out of memory");
    for (size_t i = 0; i < ix->n; i++) ix->order[i] = i;
    sort_pieces(L, ix->order, ix->n);
    return MASKPACK_OK;
}

/* First position in ix (of Lk) whose piece belongs to sequence `origin` (ix->n when none). */
static size_t first_of(const maskpack_layout *Lk, const piece_index *ix, int64_t origin) {
    size_t a = 0, z = ix->n;
    while (a < z) {
        size_t m = a + (z - a) / 2;
        if (Lk->segs[ix->order[m]].origin < origin)
            a = m + 1;
        else
            z = m;
    }
    return a;
}

/* The p-th key piece of Lk (0-based, in position order) that query piece g may see, or NULL. */
static const maskpack_segment *visible_piece(const maskpack_layout *rule, const maskpack_segment *g,
                                             const maskpack_layout *Lk, const piece_index *ix, int p) {
    int seen = 0;
    for (size_t t = first_of(Lk, ix, g->origin); t < ix->n; t++) {
        const maskpack_segment *b = &Lk->segs[ix->order[t]];
        if (b->origin != g->origin) break;
        if (b->row != g->row || !pair_visible(rule, g->q_pos, g->q_len, b->q_pos, b->q_len)) continue;
        if (seen++ == p) return b;
    }
    return NULL;
}

/* Whether rank Lq's queries see anything of Lk's block. */
static int block_needed(const maskpack_layout *rule, const maskpack_layout *Lq, const maskpack_layout *Lk,
                        const piece_index *ix) {
    for (size_t k = 0; k < Lq->n_segments; k++)
        if (visible_piece(rule, &Lq->segs[k], Lk, ix, 0)) return 1;
    return 0;
}

/* Part p of the step (queries of Lq, keys of Lk's block): each query piece paired with its p-th visible
 * key piece. Pieces of one sequence on one rank are at most a few (two under zigzag), so a step has
 * that many parts; a query piece appears once per part, as a layout needs. *out = NULL: empty part. */
static maskpack_status step_part(const maskpack_layout *whole, const maskpack_layout *Lq, const maskpack_layout *Lk,
                                 const piece_index *ix, int p, maskpack_layout **out, maskpack_error *err) {
    *out = NULL;
    size_t m = 0;
    for (size_t k = 0; k < Lq->n_segments; k++) m += visible_piece(whole, &Lq->segs[k], Lk, ix, p) != NULL;
    if (m == 0) return MASKPACK_OK;
    maskpack_segment *segs = mp_alloc_array(m, sizeof *segs);
    if (!segs) return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "layout", -1, -1, "out of memory");
    m = 0;
    for (size_t k = 0; k < Lq->n_segments; k++) {
        const maskpack_segment *g = &Lq->segs[k], *b = visible_piece(whole, g, Lk, ix, p);
        if (!b) continue;
        segs[m++] = (maskpack_segment){.row = g->row,
                                       .q_start = g->q_start,
                                       .q_len = g->q_len,
                                       .kv_start = b->q_start,
                                       .kv_len = b->q_len,
                                       .flags = MASKPACK_SEGMENT_EXPLICIT_POS | MASKPACK_SEGMENT_KEY_BLOCK,
                                       .q_pos = g->q_pos,
                                       .origin = g->origin,
                                       .kv_pos = b->q_pos};
    }
    maskpack_rule r = maskpack_layout_rule(whole);
    return mp_layout_build(segs, m, Lq->n_rows, Lq->q_width, Lk->q_width, Lq->packed, &r, out, err);
}

#define RING_MAX_PARTS 4 /* pieces of one sequence one rank may hold: 2 under zigzag, 1 contiguous */

typedef struct ring {
    int n, rank;
    maskpack_layout **shard;                  /* [n]: every rank's shard layout */
    maskpack_layout *(*part)[RING_MAX_PARTS]; /* [n]: step s's parts (src = rank - s), NULL = none */
    unsigned char *need_from, *need_to;       /* [n]: step s receives from src / sends to dst = rank + s */
} ring;

static void ring_free(ring *R) {
    for (int s = 0; R->part && s < R->n; s++)
        for (int p = 0; p < RING_MAX_PARTS; p++) maskpack_layout_free(R->part[s][p]);
    for (int r = 0; R->shard && r < R->n; r++) maskpack_layout_free(R->shard[r]);
    free(R->part);
    free(R->shard);
    free(R->need_from);
    free(R->need_to);
    memset(R, 0, sizeof *R);
}

static int src_of(const ring *R, int s) { return (R->rank - s + R->n) % R->n; }
static int dst_of(const ring *R, int s) { return (R->rank + s) % R->n; }

/* This rank's plan: shards, step layouts and who sends what to whom. Every rank derives the same
 * need_from / need_to relation from the same layout, so a skipped message is skipped on both sides. */
static maskpack_status ring_build(const maskpack_comm *comm, const maskpack_layout *whole, maskpack_cp_scheme scheme,
                                  ring *R, maskpack_error *err) {
    memset(R, 0, sizeof *R);
    R->n = comm->size;
    R->rank = comm->rank;
    if (whole->n_spans || whole->prefix)
        return mp_fail(err, MASKPACK_ERR_UNSUPPORTED, "layout", -1, -1,
                       "layout: ring attention takes causal, windowed and full rules; this rule has %s (use the "
                       "all-gather form of context parallelism)",
                       whole->n_spans ? "spans" : "a prefix");
    R->shard = mp_calloc_array((size_t)R->n, sizeof *R->shard);
    R->part = mp_calloc_array((size_t)R->n, sizeof *R->part);
    R->need_from = mp_calloc_array((size_t)R->n, 1);
    R->need_to = mp_calloc_array((size_t)R->n, 1);
    if (!R->shard || !R->part || !R->need_from || !R->need_to) {
        ring_free(R);
        return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "layout", -1, -1, "out of memory");
    }
    maskpack_status st = MASKPACK_OK;
    for (int r = 0; r < R->n && !st; r++) st = maskpack_layout_cp_shard(whole, R->n, r, scheme, &R->shard[r], err);
    piece_index mine = {0, NULL}, other = {0, NULL};
    if (!st) st = index_pieces(R->shard[R->rank], &mine, err);
    const maskpack_layout *Lq = st ? NULL : R->shard[R->rank];
    for (int s = 0; s < R->n && !st; s++) {
        const maskpack_layout *Lk = R->shard[src_of(R, s)];
        free(other.order);
        other.order = NULL;
        st = index_pieces(Lk, &other, err);
        for (int p = 0; p < RING_MAX_PARTS && !st; p++) {
            st = step_part(whole, Lq, Lk, &other, p, &R->part[s][p], err);
            if (!st && R->part[s][p]) R->need_from[s] = 1;
        }
        /* a piece with more visible key pieces than parts would lose keys: refuse rather than drop */
        for (size_t k = 0; Lq && k < Lq->n_segments && !st; k++)
            if (visible_piece(whole, &Lq->segs[k], Lk, &other, RING_MAX_PARTS))
                st = mp_fail(err, MASKPACK_ERR_UNSUPPORTED, "layout", (int64_t)k, -1,
                             "layout: a sequence holds more than %d pieces on rank %d; ring attention pairs at most "
                             "that many",
                             RING_MAX_PARTS, src_of(R, s));
        if (!st) R->need_to[s] = (unsigned char)block_needed(whole, R->shard[dst_of(R, s)], R->shard[R->rank], &mine);
    }
    free(other.order);
    free(mine.order);
    if (st) ring_free(R);
    return st;
}

/* ---- argument checks ---------------------------------------------------------------------------- */

/* Each tensor the ring reads or writes as bytes must be f32 and contiguous; the kernel checks shapes. */
static maskpack_status check_flat(const maskpack_tensor *t, const char *name, maskpack_error *err) {
    MP_CHECK_NULL(err, t, name);
    maskpack_status s = mp_check_tensor(t, name, 3, 4, err);
    if (s) return s;
    if (t->dtype != MASKPACK_F32)
        return mp_fail(err, MASKPACK_ERR_DTYPE, name, -1, -1,
                       "%s: ring attention takes float32 (partial outputs merge in f32), found %s; use the "
                       "all-gather form for other dtypes",
                       name, maskpack_dtype_name(t->dtype));
    if (!mp_is_contiguous(t))
        return mp_fail(err, MASKPACK_ERR_SHAPE, name, -1, -1,
                       "%s: expected a contiguous tensor (blocks travel as the bytes lie)", name);
    return MASKPACK_OK;
}

/* Whether t's leading (token) dimensions are this rank's shard Lq's: [T] or [1, T] packed, [B, S] padded,
 * followed by [heads, head dim]. */
static int shard_lead(const maskpack_layout *Lq, const maskpack_tensor *t) {
    if (Lq->packed)
        return (t->ndim == 3 && t->shape[0] == Lq->n_rows * Lq->q_width) ||
               (t->ndim == 4 && Lq->n_rows == 1 && t->shape[0] == 1 && t->shape[1] == Lq->q_width);
    return t->ndim == 4 && t->shape[0] == Lq->n_rows && t->shape[1] == Lq->q_width;
}

static int same_shape(const maskpack_tensor *a, const maskpack_tensor *b) {
    return a->ndim == b->ndim && !memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim);
}

/* Every tensor of a ring call against this rank's shard Lq (the checks the kernel would make at the first
 * step, made before the agreement so that a rank whose tensors are wrong refuses there instead of
 * leaving the ring mid-way while its peers wait): q [tokens, Hq, D], k and v [tokens, Hk, D | Dv] with
 * Hq a multiple of Hk, out like q with v's head dim, dout like out, dq, dk, dv like q, k, v, lse
 * [Hq, T] | [B, Hq, S]. Absent tensors (NULL) are not checked. */
static maskpack_status ring_shapes(const maskpack_layout *Lq, const maskpack_tensor *q, const maskpack_tensor *k,
                                   const maskpack_tensor *v, const maskpack_tensor *out, const maskpack_tensor *lse,
                                   const maskpack_tensor *dout, const maskpack_tensor *dq, const maskpack_tensor *dk,
                                   const maskpack_tensor *dv, maskpack_error *err) {
    const maskpack_tensor *all[4] = {q, k, v, out};
    const char *names[4] = {"q", "k", "v", "out"};
    for (int i = 0; i < 4; i++)
        if (all[i] && !shard_lead(Lq, all[i])) {
            char found[200];
            mp_format_shape(found, sizeof found, all[i]->ndim, all[i]->shape);
            return mp_fail(err, MASKPACK_ERR_SHAPE, names[i], -1, -1,
                           "%s: expected this rank's shard %s, heads, head dim], found %s", names[i],
                           Lq->packed ? "[tokens" : "[rows, columns", found);
        }
    const int hq = q->ndim - 2, hk = k->ndim - 2, hv = v->ndim - 2;
    const int64_t Hq = q->shape[hq], D = q->shape[hq + 1], Hk = k->shape[hk], Dv = v->shape[hv + 1];
    if (k->shape[hk + 1] != D || v->shape[hv] != Hk || Hk < 1 || Hq % Hk)
        return mp_fail(
            err, MASKPACK_ERR_SHAPE, "k", -1, -1,
            "k: expected [.., Hk, %lld] and v [.., Hk, Dv] with the %lld query heads a multiple of Hk, found k "
            "[.., %lld, %lld], v [.., %lld, %lld]",
            (long long)D, (long long)Hq, (long long)Hk, (long long)k->shape[hk + 1], (long long)v->shape[hv],
            (long long)Dv);
    if (out && (out->shape[out->ndim - 2] != Hq || out->shape[out->ndim - 1] != Dv))
        return mp_fail(err, MASKPACK_ERR_SHAPE, "out", -1, -1, "out: expected [.., %lld, %lld], found [.., %lld, %lld]",
                       (long long)Hq, (long long)Dv, (long long)out->shape[out->ndim - 2],
                       (long long)out->shape[out->ndim - 1]);
    if (dout && out && !same_shape(dout, out))
        return mp_fail(err, MASKPACK_ERR_SHAPE, "dout", -1, -1, "dout: expected the shape of out");
    if (dq && !same_shape(dq, q)) return mp_fail(err, MASKPACK_ERR_SHAPE, "dq", -1, -1, "dq: expected the shape of q");
    if (dk && !same_shape(dk, k)) return mp_fail(err, MASKPACK_ERR_SHAPE, "dk", -1, -1, "dk: expected the shape of k");
    if (dv && !same_shape(dv, v)) return mp_fail(err, MASKPACK_ERR_SHAPE, "dv", -1, -1, "dv: expected the shape of v");
    if (lse) {
        int ok = lse->dtype == MASKPACK_F32 && mp_is_contiguous(lse) &&
                 (Lq->packed ? lse->ndim == 2 && lse->shape[0] == Hq && lse->shape[1] == Lq->q_width
                             : lse->ndim == 3 && lse->shape[0] == Lq->n_rows && lse->shape[1] == Hq &&
                                   lse->shape[2] == Lq->q_width);
        if (!ok)
            return mp_fail(err, MASKPACK_ERR_SHAPE, "lse", -1, -1,
                           "lse: expected a contiguous float32 %s of this rank's shard",
                           Lq->packed ? "[Hq, T]" : "[B, Hq, S]");
    }
    return MASKPACK_OK;
}

/* ---- buffers and messages ----------------------------------------------------------------------- */

static size_t nbytes(const maskpack_tensor *t) { return (size_t)mp_numel(t) * maskpack_dtype_size(t->dtype); }

/* A view of `like`'s shape on bytes at p (a block that arrived, or a temporary). */
static maskpack_tensor view_like(void *p, const maskpack_tensor *like) {
    return maskpack_tensor_contiguous(p, like->dtype, like->ndim, like->shape);
}

typedef struct pending {
    void *request;
    int active;
} pending;

static int start(const maskpack_comm *c, pending *pd, const void *send, int to, void *recv, int from, size_t bytes,
                 int tag) {
    pd->active = 0;
    if (to < 0 && from < 0) return 0;
    if (c->sendrecv_start(c->ctx, to >= 0 ? send : NULL, to >= 0 ? bytes : 0, to, from >= 0 ? recv : NULL,
                          from >= 0 ? bytes : 0, from, tag, &pd->request) != 0)
        return 1;
    pd->active = 1;
    return 0;
}

static int finish(const maskpack_comm *c, pending *pd) {
    if (!pd->active) return 0;
    pd->active = 0;
    return c->wait(c->ctx, pd->request) != 0;
}

/* out/lse (the running result) <- merge with (o, l) by log-sum-exp, row by row. lse index of (token t
 * of row b at column i, head h): packed [H, T] -> h*T + t; padded [B, H, S] -> (b*H + h)*S + i. */
static void merge(float *out, float *lse, const float *o, const float *l, int64_t n_rows, int64_t width, int packed,
                  int64_t H, int64_t D) {
    for (int64_t b = 0; b < n_rows; b++)
        for (int64_t i = 0; i < width; i++) {
            int64_t t = b * width + i;
            for (int64_t h = 0; h < H; h++) {
                int64_t li = packed ? h * width + i : (b * H + h) * width + i;
                float lb = l[li];
                if (lb == -INFINITY) continue;
                float *acc = out + (t * H + h) * D;
                const float *add = o + (t * H + h) * D;
                float la = lse[li];
                if (la == -INFINITY) {
                    memcpy(acc, add, (size_t)D * sizeof *acc);
                    lse[li] = lb;
                    continue;
                }
                double m = la > lb ? la : lb, wa = exp(la - m), wb = exp(lb - m), s = wa + wb;
                float fa = (float)(wa / s), fb = (float)(wb / s);
                for (int64_t d = 0; d < D; d++) acc[d] = acc[d] * fa + add[d] * fb;
                lse[li] = (float)(m + log(s));
            }
        }
}

static void add_into(float *acc, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) acc[i] += x[i];
}

/* The common start of both directions: checks (local, then agreed by every rank: the call, the layout,
 * q's, k's and v's dtypes and per-token shapes [heads, head dim], the bytes of a key/value block, the
 * scale and softcap), the ring plan. A NULL argument is a local refusal too: its rank still joins. */
static maskpack_status ring_begin(const maskpack_comm *comm, const maskpack_layout *layout, maskpack_cp_scheme scheme,
                                  int call_id, const maskpack_tensor *const *t, const char *const *names, int n_t,
                                  const maskpack_tensor *q, const maskpack_tensor *k, const maskpack_tensor *v,
                                  double scale, double softcap, const maskpack_tensor *const sh[6],
                                  const maskpack_kernel_options *opts, maskpack_status local, ring *R,
                                  maskpack_error *err) {
    maskpack_status s = mp_cp_check_comm(comm, 1, err);
    if (s) return s;
    if (!local && !layout)
        local = mp_fail(err, MASKPACK_ERR_NULL_ARGUMENT, "layout", -1, -1,
                        "layout: expected a non-NULL pointer, found NULL");
    for (int i = 0; i < n_t && !local; i++) local = check_flat(t[i], names[i], err);
    memset(R, 0, sizeof *R);
    if (!local) local = ring_build(comm, layout, scheme, R, err);
    if (!local) local = ring_shapes(R->shard[R->rank], q, k, v, sh[0], sh[1], sh[2], sh[3], sh[4], sh[5], err);
    size_t pick; /* opts.isa, refused here (as the local call refuses it) rather than by a kernel mid-ring */
    if (!local)
        local =
            mp_kernel_pick(MASKPACK_KERNEL_ATTENTION, MASKPACK_F32, opts ? opts->isa : MASKPACK_ISA_AUTO, &pick, err);
    mp_cp_call call = mp_cp_call_of(call_id);
    const int lead = mp_cp_lead(layout);
    mp_cp_tensor(&call, "q", q, lead, "per-token shape [heads, head dim]");
    mp_cp_tensor(&call, "k", k, lead, "per-token shape [heads, head dim]");
    mp_cp_tensor(&call, "v", v, lead, "per-token shape [heads, head dim]");
    mp_cp_set(&call, "k", "and v block bytes (each ring step's message)", MP_CP_INT,
              local ? -1 : mp_numel(k) * 4 + mp_numel(v) * 4);
    int64_t bits;
    memcpy(&bits, &scale, sizeof bits);
    mp_cp_set(&call, "scale", "value", MP_CP_REAL, bits);
    memcpy(&bits, &softcap, sizeof bits);
    mp_cp_set(&call, "softcap", "value", MP_CP_REAL, bits);
    s = mp_cp_agree_call(comm, layout, scheme, &call, local, err);
    if (s) ring_free(R);
    return s;
}

/* Every kernel call of a ring runs on one team (NULL: the caller alone): the caller's, or one the
 * plain entry points start (opts.n_threads) for the whole call; each runs opts.isa. */
static maskpack_status ring_forward(const maskpack_comm *comm, const maskpack_layout *layout, maskpack_cp_scheme scheme,
                                    const maskpack_tensor *q, const maskpack_tensor *k, const maskpack_tensor *v,
                                    double scale, double softcap, maskpack_tensor *out, maskpack_tensor *lse,
                                    const maskpack_kernel_options *opts, maskpack_workers *team, maskpack_error *err) {
    const maskpack_tensor *ts[4] = {q, k, v, out};
    const char *names[4] = {"q", "k", "v", "out"};
    ring R;
    const maskpack_tensor *sh[6] = {out, lse, NULL, NULL, NULL, NULL}; /* out, lse, dout, dq, dk, dv */
    maskpack_status s = ring_begin(comm, layout, scheme, MP_CP_CALL_ATTENTION_FORWARD, ts, names, 4, q, k, v, scale,
                                   softcap, sh, opts, MASKPACK_OK, &R, err);
    if (s) return s;
    const maskpack_layout *Lq = R.shard[R.rank];
    int64_t H = q->shape[q->ndim - 2], D = v->shape[v->ndim - 1];
    size_t kb = nbytes(k), vb = nbytes(v), block = kb + vb, ob = nbytes(out);
    size_t lse_n = (size_t)(Lq->n_rows * Lq->q_width * H);
    char *own = NULL, *buf[2] = {NULL, NULL};
    float *tmp_o = mp_alloc_array(ob / sizeof(float) + 1, sizeof(float));
    float *tmp_l = mp_alloc_array(lse_n + 1, sizeof(float));
    float *lse_own = lse ? NULL : mp_alloc_array(lse_n + 1, sizeof(float));
    int any_send = 0;
    for (int st = 1; st < R.n; st++) any_send |= R.need_to[st];
    if (any_send) own = mp_alloc_array(block, 1);
    if (R.n > 1) buf[0] = mp_alloc_array(block, 1), buf[1] = mp_alloc_array(block, 1);
    if (!tmp_o || !tmp_l || (!lse && !lse_own) || (any_send && !own) || (R.n > 1 && (!buf[0] || !buf[1])))
        s = mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "q", -1, -1, "out of memory");
    /* the running result starts empty: out 0, lse -inf (rows no step reaches stay so, as in the kernel) */
    maskpack_tensor lse_t = lse ? *lse : (maskpack_tensor){0};
    if (!s && !lse) {
        int64_t shape[3] = {Lq->n_rows, H, Lq->q_width};
        lse_t = Lq->packed ? maskpack_tensor_contiguous(lse_own, MASKPACK_F32, 2, shape + 1)
                           : maskpack_tensor_contiguous(lse_own, MASKPACK_F32, 3, shape);
    }
    float *lse_p = s ? NULL : lse_t.data;
    if (!s) {
        memset(out->data, 0, ob);
        for (size_t i = 0; i < lse_n; i++) lse_p[i] = -INFINITY;
        if (own) {
            memcpy(own, k->data, kb);
            memcpy(own + kb, v->data, vb);
        }
    }
    pending pd = {0};
    maskpack_tensor o_view = s ? (maskpack_tensor){0} : view_like(tmp_o, out);
    maskpack_tensor l_view = s ? (maskpack_tensor){0} : view_like(tmp_l, &lse_t);
    for (int st = 0; st < R.n && !s; st++) {
        if (finish(comm, &pd))
            s = mp_fail(err, MASKPACK_ERR_COMM, "comm", st, -1, "comm: the blocks of step %d did not arrive on rank %d",
                        st, R.rank);
        if (!s && st + 1 < R.n &&
            start(comm, &pd, own, R.need_to[st + 1] ? dst_of(&R, st + 1) : -1, buf[(st + 1) % 2],
                  R.need_from[st + 1] ? src_of(&R, st + 1) : -1, block, 0))
            s = mp_fail(err, MASKPACK_ERR_COMM, "comm", st + 1, -1,
                        "comm: sending the blocks of step %d failed on rank %d", st + 1, R.rank);
        const char *kv = st == 0 ? NULL : buf[st % 2];
        maskpack_tensor kt = st == 0 ? *k : view_like((void *)kv, k),
                        vt = st == 0 ? *v : view_like((void *)(kv + kb), v);
        for (int p = 0; p < RING_MAX_PARTS && !s; p++) {
            const maskpack_layout *P = R.part[st][p];
            if (!P) continue;
            s = maskpack_attention_forward_on(P, q, &kt, &vt, scale, softcap, &o_view, &l_view, opts, team, NULL, 0,
                                              err);
            if (!s) merge(out->data, lse_p, tmp_o, tmp_l, Lq->n_rows, Lq->q_width, Lq->packed, H, D);
        }
    }
    if (pd.active) finish(comm, &pd); /* never leave a transfer running into freed memory */
    free(own);
    free(buf[0]);
    free(buf[1]);
    free(tmp_o);
    free(tmp_l);
    free(lse_own);
    ring_free(&R);
    return s ? s : mp_ok(err);
}

static maskpack_status ring_backward(const maskpack_comm *comm, const maskpack_layout *layout,
                                     maskpack_cp_scheme scheme, const maskpack_tensor *dout, const maskpack_tensor *q,
                                     const maskpack_tensor *k, const maskpack_tensor *v, const maskpack_tensor *out,
                                     const maskpack_tensor *lse, double scale, double softcap, maskpack_tensor *dq,
                                     maskpack_tensor *dk, maskpack_tensor *dv, const maskpack_kernel_options *opts,
                                     maskpack_workers *team, maskpack_error *err) {
    const maskpack_tensor *ts[8] = {dout, q, k, v, out, dq, dk, dv};
    const char *names[8] = {"dout", "q", "k", "v", "out", "dq", "dk", "dv"};
    maskpack_status local =
        lse ? MASKPACK_OK
            : mp_fail(err, MASKPACK_ERR_NULL_ARGUMENT, "lse", -1, -1, "lse: expected a non-NULL pointer, found NULL");
    ring R;
    const maskpack_tensor *sh[6] = {out, lse, dout, dq, dk, dv};
    maskpack_status s = ring_begin(comm, layout, scheme, MP_CP_CALL_ATTENTION_BACKWARD, ts, names, 8, q, k, v, scale,
                                   softcap, sh, opts, local, &R, err);
    if (s) return s;
    size_t kb = nbytes(k), vb = nbytes(v), block = kb + vb, qb = nbytes(q);
    char *own = NULL, *kvbuf[2] = {NULL, NULL}, *gout[2] = {NULL, NULL}, *gin[2] = {NULL, NULL};
    float *tmp_q = mp_alloc_array(qb / sizeof(float) + 1, sizeof(float));
    char *tmp_kv = mp_alloc_array(block, 1);
    int fail = !tmp_q || !tmp_kv;
    if (R.n > 1) {
        own = mp_alloc_array(block, 1);
        for (int i = 0; i < 2; i++) {
            kvbuf[i] = mp_alloc_array(block, 1);
            gout[i] = mp_alloc_array(block, 1);
            gin[i] = mp_alloc_array(block, 1);
            fail |= !kvbuf[i] || !gout[i] || !gin[i];
        }
        fail |= !own;
    }
    if (fail) s = mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "q", -1, -1, "out of memory");
    if (!s) {
        memset(dq->data, 0, qb);
        memset(dk->data, 0, kb);
        memset(dv->data, 0, vb);
        if (own) {
            memcpy(own, k->data, kb);
            memcpy(own + kb, v->data, vb);
        }
    }
    pending kv_pd = {0}, g_pd = {0};
    int g_prev = -1; /* the step whose gradients are in flight back to us */
    maskpack_tensor dq_t = s ? (maskpack_tensor){0} : view_like(tmp_q, q);
    maskpack_tensor dk_t = s ? (maskpack_tensor){0} : view_like(tmp_kv, k);
    maskpack_tensor dv_t = s ? (maskpack_tensor){0} : view_like(tmp_kv + kb, v);
    for (int st = 0; st < R.n && !s; st++) {
        if (finish(comm, &kv_pd))
            s = mp_fail(err, MASKPACK_ERR_COMM, "comm", st, -1, "comm: the blocks of step %d did not arrive on rank %d",
                        st, R.rank);
        if (!s && st + 1 < R.n &&
            start(comm, &kv_pd, own, R.need_to[st + 1] ? dst_of(&R, st + 1) : -1, kvbuf[(st + 1) % 2],
                  R.need_from[st + 1] ? src_of(&R, st + 1) : -1, block, 0))
            s = mp_fail(err, MASKPACK_ERR_COMM, "comm", st + 1, -1,
                        "comm: sending the blocks of step %d failed on rank %d", st + 1, R.rank);
        const char *kv = st == 0 ? NULL : kvbuf[st % 2];
        maskpack_tensor kt = st == 0 ? *k : view_like((void *)kv, k),
                        vt = st == 0 ? *v : view_like((void *)(kv + kb), v);
        /* this step's gradient of the block: own block straight into dk/dv, another's into gout to send */
        float *gk = st == 0 ? dk->data : (float *)gout[st % 2];
        float *gv = st == 0 ? dv->data : (float *)(gout[st % 2] + kb);
        if (!s && st > 0 && R.need_from[st]) memset(gout[st % 2], 0, block);
        for (int p = 0; p < RING_MAX_PARTS && !s; p++) {
            const maskpack_layout *P = R.part[st][p];
            if (!P) continue;
            s = maskpack_attention_backward_on(P, dout, q, &kt, &vt, out, lse, scale, softcap, &dq_t, &dk_t, &dv_t,
                                               opts, team, NULL, 0, err);
            if (!s) {
                add_into(dq->data, tmp_q, qb / sizeof(float));
                add_into(gk, (const float *)tmp_kv, kb / sizeof(float));
                add_into(gv, (const float *)(tmp_kv + kb), vb / sizeof(float));
            }
        }
        if (s || st == 0) continue;
        /* the previous step's gradients of our block have had a step's compute to arrive */
        if (finish(comm, &g_pd))
            s = mp_fail(err, MASKPACK_ERR_COMM, "comm", g_prev, -1,
                        "comm: the key/value gradients of step %d did not arrive on rank %d", g_prev, R.rank);
        if (!s && g_prev > 0 && R.need_to[g_prev]) {
            add_into(dk->data, (const float *)gin[g_prev % 2], kb / sizeof(float));
            add_into(dv->data, (const float *)(gin[g_prev % 2] + kb), vb / sizeof(float));
        }
        /* gradients of src's block go home; ours come back from the rank that held our block */
        if (!s && start(comm, &g_pd, gout[st % 2], R.need_from[st] ? src_of(&R, st) : -1, gin[st % 2],
                        R.need_to[st] ? dst_of(&R, st) : -1, block, 1))
            s = mp_fail(err, MASKPACK_ERR_COMM, "comm", st, -1,
                        "comm: returning the key/value gradients of step %d failed on rank %d", st, R.rank);
        g_prev = st;
    }
    if (!s && finish(comm, &g_pd))
        s = mp_fail(err, MASKPACK_ERR_COMM, "comm", g_prev, -1,
                    "comm: the key/value gradients of step %d did not arrive on rank %d", g_prev, R.rank);
    if (!s && g_prev > 0 && R.need_to[g_prev]) {
        add_into(dk->data, (const float *)gin[g_prev % 2], kb / sizeof(float));
        add_into(dv->data, (const float *)(gin[g_prev % 2] + kb), vb / sizeof(float));
    }
    if (kv_pd.active) finish(comm, &kv_pd);
    if (g_pd.active) finish(comm, &g_pd);
    free(own);
    for (int i = 0; i < 2; i++) {
        free(kvbuf[i]);
        free(gout[i]);
        free(gin[i]);
    }
    free(tmp_q);
    free(tmp_kv);
    ring_free(&R);
    return s ? s : mp_ok(err);
}

maskpack_status maskpack_cp_attention_forward(const maskpack_comm *comm, const maskpack_layout *layout,
                                              maskpack_cp_scheme scheme, const maskpack_tensor *q,
                                              const maskpack_tensor *k, const maskpack_tensor *v, double scale,
                                              double softcap, maskpack_tensor *out, maskpack_tensor *lse,
                                              const maskpack_kernel_options *opts, maskpack_error *err) {
    mp_run run;
    maskpack_status s = mp_run_begin_checked(&run, opts ? opts->n_threads : 1, err);
    if (!s) s = ring_forward(comm, layout, scheme, q, k, v, scale, softcap, out, lse, opts, run.team, err);
    mp_run_end(&run);
    return s;
}

maskpack_status maskpack_cp_attention_forward_on(const maskpack_comm *comm, const maskpack_layout *layout,
                                                 maskpack_cp_scheme scheme, const maskpack_tensor *q,
                                                 const maskpack_tensor *k, const maskpack_tensor *v, double scale,
                                                 double softcap, maskpack_tensor *out, maskpack_tensor *lse,
                                                 const maskpack_kernel_options *opts, maskpack_workers *team,
                                                 maskpack_error *err) {
    return ring_forward(comm, layout, scheme, q, k, v, scale, softcap, out, lse, opts, team, err);
}

maskpack_status maskpack_cp_attention_backward(const maskpack_comm *comm, const maskpack_layout *layout,
                                               maskpack_cp_scheme scheme, const maskpack_tensor *dout,
                                               const maskpack_tensor *q, const maskpack_tensor *k,
                                               const maskpack_tensor *v, const maskpack_tensor *out,
                                               const maskpack_tensor *lse, double scale, double softcap,
                                               maskpack_tensor *dq, maskpack_tensor *dk, maskpack_tensor *dv,
                                               const maskpack_kernel_options *opts, maskpack_error *err) {
    mp_run run;
    maskpack_status s = mp_run_begin_checked(&run, opts ? opts->n_threads : 1, err);
    if (!s)
        s = ring_backward(comm, layout, scheme, dout, q, k, v, out, lse, scale, softcap, dq, dk, dv, opts, run.team,
                          err);
    mp_run_end(&run);
    return s;
}

maskpack_status maskpack_cp_attention_backward_on(
    const maskpack_comm *comm, const maskpack_layout *layout, maskpack_cp_scheme scheme, const maskpack_tensor *dout,
    const maskpack_tensor *q, const maskpack_tensor *k, const maskpack_tensor *v, const maskpack_tensor *out,
    const maskpack_tensor *lse, double scale, double softcap, maskpack_tensor *dq, maskpack_tensor *dk,
    maskpack_tensor *dv, const maskpack_kernel_options *opts, maskpack_workers *team, maskpack_error *err) {
    return ring_backward(comm, layout, scheme, dout, q, k, v, out, lse, scale, softcap, dq, dk, dv, opts, team, err);
}
