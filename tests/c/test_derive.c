/* test_derive.c: derived outputs (2D/4D masks, cu_seqlens, ids, indices, block masks, MagiAttention
 * slices) checked against the reference predicate and against values computed naively from the
 * segment list, over ~300 random layouts, plus hand examples and error cases. */
#include "check.h"
#include "internal.h" /* f16/bf16 decoding for the additive masks */

#include <float.h>
#include <math.h>
#include <stdlib.h>

#define SENT 0xA5u /* sentinel byte: outputs outside a view (or of a failing call) must keep it */

/* ---- one random test case ---------------------------------------------------------------- */

#define MAX_SEGS  256
#define MAX_SPANS 512

typedef struct tcase {
    maskpack_layout *L;
    int64_t B, S, Skv;
    size_t N;
    int packed;
    maskpack_segment segs[MAX_SEGS];
    maskpack_span spans[MAX_SPANS];
    int64_t prefix[MAX_SEGS];
    maskpack_rule rule;
    uint8_t *ref;   /* [B, S, Skv]: maskpack_allowed */
    int64_t *segid; /* [B, S]: 1-based segment index owning the query column, 0 = pad */
    int64_t *seqid; /* [B, S]: 1-based sequence id (origin + 1 for CP pieces), 0 = pad */
    int sharded;    /* built by maskpack_layout_cp_shard */
} tcase;

static int64_t pick_len(test_rng *r, int64_t remaining) {
    if (remaining <= 0) return 0;
    switch (test_rng_below(r, 7)) {
    case 0: return 0; /* empty segment */
    case 1: return 1; /* length-1 segment */
    case 2: return 1 + test_rng_below(r, remaining);
    default: {
        int64_t cap = 1 + test_rng_below(r, 40);
        return 1 + test_rng_below(r, cap < remaining ? cap : remaining);
    }
    }
}

static int finish_case(tcase *c);
static int make_case(test_rng *r, tcase *c);

/* A context-parallel shard (explicit-position pieces that share keys) of a random self layout,
 * through maskpack_layout_cp_shard. Falls back to another random case when sharding refuses. */
static int make_shard_case(test_rng *r, tcase *c) {
    tcase base;
    memset(&base, 0, sizeof base);
    int64_t cp = 1 + test_rng_below(r, 3), lens[4];
    size_t n = (size_t)(1 + test_rng_below(r, 4));
    for (size_t k = 0; k < n; k++) lens[k] = pick_len(r, 40);
    maskpack_rule ru = maskpack_rule_default();
    ru.causal = test_rng_below(r, 4) != 0;
    if (test_rng_below(r, 3) == 0) ru.window_left = test_rng_below(r, 6);
    int64_t prefix[4];
    if (test_rng_below(r, 3) == 0) {
        for (size_t k = 0; k < n; k++) prefix[k] = test_rng_below(r, lens[k] + 1);
        ru.prefix = prefix;
        ru.n_prefix = n;
    }
    maskpack_span span = {0, 0, 0};
    if (lens[0] > 1 && test_rng_below(r, 2)) {
        span.start = test_rng_below(r, lens[0] - 1);
        span.end = span.start + 1 + test_rng_below(r, lens[0] - span.start);
        ru.spans = &span;
        ru.n_spans = 1;
    }
    maskpack_layout *U = NULL, *P = NULL, *Sh = NULL;
    maskpack_error e;
    int ok = maskpack_layout_from_lengths(lens, n, test_rng_below(r, 2) ? MASKPACK_PLACE_PACKED : MASKPACK_PLACE_RIGHT,
                                          0, &ru, &U, &e) == MASKPACK_OK &&
             maskpack_layout_pad_to_multiple(U, 2 * cp, &P, &e) == MASKPACK_OK &&
             maskpack_layout_cp_shard(P, cp, test_rng_below(r, cp),
                                      test_rng_below(r, 2) ? MASKPACK_CP_ZIGZAG : MASKPACK_CP_CONTIGUOUS, &Sh,
                                      &e) == MASKPACK_OK;
    maskpack_layout_free(U);
    maskpack_layout_free(P);
    if (!ok || maskpack_layout_n_segments(Sh) > MAX_SEGS) {
        maskpack_layout_free(Sh);
        return make_case(r, c);
    }
    memset(c, 0, sizeof *c);
    c->L = Sh;
    c->B = maskpack_layout_n_rows(Sh);
    c->S = maskpack_layout_q_width(Sh);
    c->Skv = maskpack_layout_kv_width(Sh);
    c->packed = maskpack_layout_is_packed(Sh);
    c->N = maskpack_layout_n_segments(Sh);
    for (size_t k = 0; k < c->N; k++) maskpack_layout_segment(Sh, k, &c->segs[k], &e);
    c->rule = maskpack_layout_rule(Sh); /* its arrays live as long as the layout */
    c->sharded = 1;
    return finish_case(c);
}

/* Builds a random layout (kinds: padded rows, packed rows, THD, cross attention, explicit-position
 * pieces, CP shards) and its reference. */
static int make_case(test_rng *r, tcase *c) {
    memset(c, 0, sizeof *c);
    int kind = (int)test_rng_below(r, 6);
    if (kind == 5) return make_shard_case(r, c);
    c->packed = kind == 2 || (kind == 4 && test_rng_below(r, 2));
    c->B = c->packed ? 1 : 1 + test_rng_below(r, 4);
    c->S = test_rng_below(r, 10) == 0 ? test_rng_below(r, 4) : test_rng_below(r, 97);
    c->Skv = kind >= 3 ? (test_rng_below(r, 10) == 0 ? test_rng_below(r, 4) : test_rng_below(r, 97)) : c->S;
    for (int64_t b = 0; b < c->B; b++) {
        if (kind == 0) { /* padded: one segment per row, anywhere in the row */
            int64_t len = pick_len(r, c->S);
            int64_t start = test_rng_below(r, c->S - len + 1);
            if (test_rng_below(r, 8) == 0 && b > 0) continue; /* a row with no segment */
            c->segs[c->N++] = (maskpack_segment){b, start, len, start, len};
            continue;
        }
        if (kind == 4) { /* explicit-position pieces: several query chunks of one key sequence */
            int64_t qc = 0, kc = 0, seq = 0;
            while (c->N < MAX_SEGS - 4 && kc <= c->Skv && qc <= c->S) {
                int64_t kl = pick_len(r, c->Skv - kc), pieces = 1 + test_rng_below(r, 3);
                for (int64_t t = 0; t < pieces; t++) {
                    if (test_rng_below(r, 3) == 0) qc += test_rng_below(r, 3);
                    if (qc > c->S) break;
                    int64_t ql = test_rng_below(r, (kl < c->S - qc ? kl : c->S - qc) + 1);
                    maskpack_segment g = {
                        b, qc, ql, kc, kl, MASKPACK_SEGMENT_EXPLICIT_POS, test_rng_below(r, kl - ql + 1), seq};
                    c->segs[c->N++] = g;
                    qc += ql;
                }
                seq++;
                kc += kl + (test_rng_below(r, 3) == 0 ? test_rng_below(r, 3) : 0);
                if (test_rng_below(r, 5) == 0) break;
            }
            continue;
        }
        int64_t qc = 0, kc = 0;
        while (c->N < MAX_SEGS - 1) {
            if (test_rng_below(r, 3) == 0) qc += test_rng_below(r, 4);
            if (kind == 3 && test_rng_below(r, 3) == 0) kc += test_rng_below(r, 4);
            if (kind != 3) kc = qc;
            if (qc > c->S || kc > c->Skv) break;
            int64_t ql = pick_len(r, c->S - qc), kl = ql;
            if (kind == 3) {
                kl = test_rng_below(r, 3) == 0 ? ql : pick_len(r, c->Skv - kc);
                if (kl > c->Skv - kc) kl = c->Skv - kc;
            }
            c->segs[c->N++] = (maskpack_segment){b, qc, ql, kc, kl};
            qc += ql;
            kc += kl;
            if (test_rng_below(r, 6) == 0) break;
        }
    }
    /* the rule */
    maskpack_rule *ru = &c->rule;
    *ru = maskpack_rule_default();
    ru->causal = test_rng_below(r, 4) != 0;
    ru->alignment = test_rng_below(r, 2) ? MASKPACK_ALIGN_BOTTOM_RIGHT : MASKPACK_ALIGN_TOP_LEFT;
    int extras = (int)test_rng_below(r, 8);
    if (extras & 1) {
        ru->window_left = test_rng_below(r, 3) == 0 ? -1 : test_rng_below(r, 7);
        ru->window_right = test_rng_below(r, 3) == 0 ? -1 : test_rng_below(r, 7);
    }
    if ((extras & 2) && ru->causal) {
        size_t ns = 0;
        for (size_t k = 0; k < c->N; k++) {
            /* spans live in key coordinates: [0, kv_len) for pieces, else self segments only */
            int64_t len = c->segs[k].kv_len;
            if (len == 0 || (!(c->segs[k].flags & MASKPACK_SEGMENT_EXPLICIT_POS) && len != c->segs[k].q_len)) continue;
            int64_t pos = 0;
            for (int t = 0; t < 2 && ns < MAX_SPANS; t++) {
                int64_t s = pos + test_rng_below(r, len - pos + 1);
                if (s >= len) break;
                int64_t e = s + 1 + test_rng_below(r, len - s);
                c->spans[ns++] = (maskpack_span){(int64_t)k, s, e};
                pos = e;
            }
        }
        ru->spans = c->spans;
        ru->n_spans = ns;
    }
    if (extras & 4) {
        for (size_t k = 0; k < c->N; k++)
            c->prefix[k] = test_rng_below(r, 2) ? test_rng_below(r, c->segs[k].kv_len + 1) : 0;
        ru->prefix = c->prefix;
        ru->n_prefix = c->N;
    }
    maskpack_error e;
    CHECK_OK(maskpack_layout_from_segments(c->segs, c->N, c->B, c->S, c->Skv, c->packed, ru, &c->L, &e), e);
    if (!c->L) return 0;
    return finish_case(c);
}

/* Fills the reference of case c (layout built): the dense predicate and the owner of each column. */
static int finish_case(tcase *c) {
    size_t cells = (size_t)(c->B * c->S * c->Skv);
    c->ref = malloc(cells ? cells : 1);
    c->segid = calloc((size_t)(c->B * c->S) + 1, sizeof *c->segid);
    c->seqid = calloc((size_t)(c->B * c->S) + 1, sizeof *c->seqid);
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t i = 0; i < c->S; i++)
            for (int64_t j = 0; j < c->Skv; j++)
                c->ref[(b * c->S + i) * c->Skv + j] = (uint8_t)maskpack_allowed(c->L, b, 0, i, j);
    for (size_t k = 0; k < c->N; k++) {
        for (int64_t t = 0; t < c->segs[k].q_len; t++) {
            int64_t x = c->segs[k].row * c->S + c->segs[k].q_start + t;
            c->segid[x] = (int64_t)k + 1;
            c->seqid[x] = ((c->segs[k].flags & MASKPACK_SEGMENT_EXPLICIT_POS) ? c->segs[k].origin : (int64_t)k) + 1;
        }
    }
    return 1;
}

static void free_case(tcase *c) {
    maskpack_layout_free(c->L);
    free(c->ref);
    free(c->segid);
    free(c->seqid);
}

/* ---- strided views ------------------------------------------------------------------------ */

/* Element offsets of a view with non-negative strides, in row-major order of its indices. */
static size_t view_offsets(const maskpack_tensor *t, int64_t *offs) {
    size_t n = 0;
    int64_t idx[4] = {0, 0, 0, 0};
    int64_t numel = 1;
    for (int d = 0; d < t->ndim; d++) numel *= t->shape[d];
    for (int64_t e = 0; e < numel; e++) {
        int64_t rem = e, off = 0;
        for (int d = t->ndim - 1; d >= 0; d--) {
            idx[d] = rem % t->shape[d];
            rem /= t->shape[d];
            off += idx[d] * t->strides[d];
        }
        offs[n++] = off;
    }
    return n;
}

static int64_t read_int(maskpack_dtype dt, const void *base, int64_t off) {
    switch (dt) {
    case MASKPACK_BOOL:
    case MASKPACK_U8: return ((const uint8_t *)base)[off];
    case MASKPACK_I8: return ((const int8_t *)base)[off];
    case MASKPACK_I32: return ((const int32_t *)base)[off];
    case MASKPACK_I64: return ((const int64_t *)base)[off];
    case MASKPACK_F32: {
        float f = ((const float *)base)[off];
        return f == 0.0f ? 0 : f == 1.0f ? 1 : -999;
    }
    default: return -999;
    }
}

/* Checks that every byte of buf outside the view's elements still holds the sentinel. */
static int untouched_outside(const uint8_t *buf, size_t bytes, const int64_t *offs, size_t n, size_t es) {
    uint8_t *in = calloc(bytes ? bytes : 1, 1);
    for (size_t i = 0; i < n; i++) memset(in + offs[i] * (int64_t)es, 1, es);
    int ok = 1;
    for (size_t i = 0; i < bytes && ok; i++)
        if (!in[i] && buf[i] != SENT) ok = 0;
    free(in);
    return ok;
}

static int all_sentinel(const void *buf, size_t bytes) {
    for (size_t i = 0; i < bytes; i++)
        if (((const uint8_t *)buf)[i] != SENT) return 0;
    return 1;
}

/* A per-token output of dtype dt for case c in one of three forms: 0 contiguous [B,S] (or [T] when
 * packed), 1 strided (row stride S+3, or column stride 2 for [T]), 2 [1,T] for packed layouts. */
typedef struct tview {
    maskpack_tensor t;
    uint8_t *buf;
    size_t bytes;
} tview;

static tview token_view(const tcase *c, maskpack_dtype dt, int form) {
    tview v;
    size_t es = maskpack_dtype_size(dt);
    int64_t shape2[2] = {c->B, c->S};
    if (c->packed && form == 2) {
        v.bytes = (size_t)c->S * es;
        v.buf = malloc(v.bytes + 1);
        v.t = maskpack_tensor_contiguous(v.buf, dt, 2, shape2);
    } else if (c->packed) {
        int64_t cs = form == 1 ? 2 : 1;
        v.bytes = (size_t)(c->S * cs) * es;
        v.buf = malloc(v.bytes + 1);
        v.t = maskpack_tensor_contiguous(v.buf, dt, 1, &c->S);
        v.t.strides[0] = cs;
    } else {
        int64_t rs = form == 1 ? c->S + 3 : c->S;
        v.bytes = (size_t)(c->B * rs) * es;
        v.buf = malloc(v.bytes + 1);
        v.t = maskpack_tensor_contiguous(v.buf, dt, 2, shape2);
        v.t.strides[0] = rs;
    }
    memset(v.buf, SENT, v.bytes + 1);
    return v;
}

/* Compares a per-token view with expected[B*S] and checks nothing else was written. */
static int token_view_equals(const tview *v, const int64_t *expected) {
    int64_t n = 1;
    for (int d = 0; d < v->t.ndim; d++) n *= v->t.shape[d];
    int64_t *offs = malloc((size_t)(n ? n : 1) * sizeof *offs);
    size_t m = view_offsets(&v->t, offs);
    int ok = 1;
    for (size_t i = 0; i < m && ok; i++)
        if (read_int(v->t.dtype, v->buf, offs[i]) != expected[i]) ok = 0;
    if (ok) ok = untouched_outside(v->buf, v->bytes + 1, offs, m, maskpack_dtype_size(v->t.dtype));
    free(offs);
    return ok;
}

/* ---- per-token outputs ---------------------------------------------------------------------- */

static void check_token_outputs(test_rng *r, const tcase *c) {
    maskpack_error e;
    int64_t cells = c->B * c->S;
    int64_t *want = malloc((size_t)(cells + 1) * sizeof *want);
    const maskpack_dtype mask_dts[6] = {MASKPACK_BOOL, MASKPACK_U8,  MASKPACK_I8,
                                        MASKPACK_I32,  MASKPACK_I64, MASKPACK_F32};
    for (int form = 0; form < 3; form++) {
        if (form == 2 && !c->packed) continue;
        /* mask2d */
        tview v = token_view(c, mask_dts[test_rng_below(r, 6)], form);
        for (int64_t x = 0; x < cells; x++) want[x] = c->segid[x] != 0;
        CHECK_OK(maskpack_mask2d(c->L, &v.t, &e), e);
        CHECK(token_view_equals(&v, want));
        free(v.buf);
        /* position ids: 0,1,2,... inside each segment, 0 on pads */
        v = token_view(c, test_rng_below(r, 2) ? MASKPACK_I32 : MASKPACK_I64, form);
        for (int64_t x = 0; x < cells; x++) want[x] = 0;
        for (size_t k = 0; k < c->N; k++)
            for (int64_t t = 0; t < c->segs[k].q_len; t++) /* pieces keep their place in the sequence */
                want[c->segs[k].row * c->S + c->segs[k].q_start + t] =
                    t + ((c->segs[k].flags & MASKPACK_SEGMENT_EXPLICIT_POS) ? c->segs[k].q_pos : 0);
        CHECK_OK(maskpack_position_ids(c->L, &v.t, &e), e);
        CHECK(token_view_equals(&v, want));
        free(v.buf);
        /* segment ids */
        v = token_view(c, test_rng_below(r, 2) ? MASKPACK_I32 : MASKPACK_I64, form);
        CHECK_OK(maskpack_segment_ids(c->L, &v.t, &e), e);
        CHECK(token_view_equals(&v, c->seqid));
        free(v.buf);
    }
    free(want);
}

/* A 1-D int output of n entries, contiguous or with stride 2; the buffer has one spare element. */
static tview vec_view(int64_t n, maskpack_dtype dt, int strided) {
    tview v;
    int64_t st = strided ? 2 : 1;
    v.bytes = (size_t)(n * st + 1) * maskpack_dtype_size(dt);
    v.buf = malloc(v.bytes + 1);
    memset(v.buf, SENT, v.bytes + 1);
    v.t = maskpack_tensor_contiguous(v.buf, dt, 1, &n);
    v.t.strides[0] = st;
    return v;
}

static void check_vector_outputs(test_rng *r, const tcase *c) {
    maskpack_error e;
    int64_t N = (int64_t)c->N;
    int64_t *want = malloc((size_t)(N + 2 + c->B * c->S) * sizeof *want);
    for (int kv = 0; kv < 2; kv++)
        for (int form = 0; form < 2; form++)
            for (int d = 0; d < 2; d++) {
                maskpack_dtype dt = d ? MASKPACK_I64 : MASKPACK_I32;
                int lead = form == MASKPACK_CU_TE;
                tview v = vec_view(N + lead, dt, (int)test_rng_below(r, 2));
                int64_t acc = 0, n = 0;
                if (lead) want[n++] = 0;
                for (size_t k = 0; k < c->N; k++) {
                    acc += kv ? c->segs[k].kv_len : c->segs[k].q_len;
                    want[n++] = acc;
                }
                CHECK_OK(maskpack_cu_seqlens(c->L, (maskpack_cu_form)form, kv, &v.t, &e), e);
                CHECK(token_view_equals(&v, want));
                free(v.buf);
            }
    for (int kv = 0; kv < 2; kv++) {
        tview v = vec_view(N, test_rng_below(r, 2) ? MASKPACK_I32 : MASKPACK_I64, (int)test_rng_below(r, 2));
        for (size_t k = 0; k < c->N; k++) want[k] = kv ? c->segs[k].kv_len : c->segs[k].q_len;
        CHECK_OK(maskpack_seqlens(c->L, kv, &v.t, &e), e);
        CHECK(token_view_equals(&v, want));
        free(v.buf);
    }
    /* valid indices: scan the token grid row-major */
    {
        int64_t n = 0;
        for (int64_t x = 0; x < c->B * c->S; x++)
            if (c->segid[x]) want[n++] = x;
        CHECK_EQ(n, maskpack_layout_n_tokens(c->L));
        tview v = vec_view(n, test_rng_below(r, 2) ? MASKPACK_I32 : MASKPACK_I64, (int)test_rng_below(r, 2));
        CHECK_OK(maskpack_valid_indices(c->L, &v.t, &e), e);
        CHECK(token_view_equals(&v, want));
        free(v.buf);
    }
    /* last token: the last grid position carrying the segment's id */
    {
        for (size_t k = 0; k < c->N; k++) want[k] = -1;
        for (int64_t x = 0; x < c->B * c->S; x++)
            if (c->segid[x]) want[c->segid[x] - 1] = x;
        tview v = vec_view(N, test_rng_below(r, 2) ? MASKPACK_I32 : MASKPACK_I64, (int)test_rng_below(r, 2));
        CHECK_OK(maskpack_last_token_index(c->L, &v.t, &e), e);
        CHECK(token_view_equals(&v, want));
        free(v.buf);
    }
    /* cu_seqlens_padded: invariants, then the documented slot starts */
    {
        tview v = vec_view(N + 1, test_rng_below(r, 2) ? MASKPACK_I32 : MASKPACK_I64, 0);
        CHECK_OK(maskpack_cu_seqlens_padded(c->L, &v.t, &e), e);
        int64_t *got = calloc((size_t)(N + 1), sizeof *got); /* zeroed: GCC cannot see that N >= 0 */
        for (int64_t k = 0; k <= N; k++) got[k] = read_int(v.t.dtype, v.buf, k);
        CHECK_EQ(got[0], 0);
        if (N > 0) CHECK_EQ(got[N], c->B * c->S);
        int mono = 1, holds = 1, starts = 1;
        for (int64_t k = 0; k < N; k++) {
            const maskpack_segment *g = &c->segs[k];
            int64_t first = g->row * c->S + g->q_start;
            if (got[k + 1] < got[k]) mono = 0;
            if (!(got[k] <= first && first + g->q_len <= got[k + 1])) holds = 0;
            /* a slot starts at its segment unless the segment opens its row (then at the row start) */
            int64_t want_start = (k > 0 && c->segs[k - 1].row == g->row) ? first : g->row * c->S;
            if (k > 0 && got[k] != want_start) starts = 0;
        }
        CHECK(mono);
        CHECK(holds);
        CHECK(starts);
        /* the filler between slot starts is all padding: no other segment's token lies in slot k */
        int exclusive = 1;
        for (int64_t k = 0; k < N; k++)
            for (int64_t x = got[k]; x < got[k + 1]; x++)
                if (c->segid[x] != 0 && c->segid[x] != k + 1) exclusive = 0;
        CHECK(exclusive);
        free(got);
        free(v.buf);
    }
    free(want);
}

/* ---- 4D masks ------------------------------------------------------------------------------- */

/* 1 when the element at base[off] is the value the convention gives an allowed (or excluded) cell */
static int cell_value_ok(maskpack_mask_convention conv, maskpack_fill fill, maskpack_dtype dt, const void *base,
                         int64_t off, int allowed) {
    if (conv != MASKPACK_MASK_ADDITIVE) {
        int64_t want = (conv == MASKPACK_MASK_KEEP) == (allowed != 0);
        return read_int(dt, base, off) == want;
    }
    double v;
    uint16_t bits = 0;
    switch (dt) {
    case MASKPACK_F16:
        bits = ((const uint16_t *)base)[off];
        v = mp_f16_to_f32(bits);
        break;
    case MASKPACK_BF16:
        bits = ((const uint16_t *)base)[off];
        v = mp_bf16_to_f32(bits);
        break;
    case MASKPACK_F32: v = ((const float *)base)[off]; break;
    default: v = ((const double *)base)[off]; break;
    }
    if (allowed) return v == 0.0 && !signbit(v);
    if (fill == MASKPACK_FILL_NEG_INF) return isinf(v) && v < 0;
    switch (dt) {
    case MASKPACK_F16: return v == -65504.0;
    case MASKPACK_BF16: return bits == 0xff7fu;
    case MASKPACK_F32: return v == (double)-FLT_MAX;
    default: return v == -DBL_MAX;
    }
}

/* Runs mask4d into `t` (whose buffer is buf, `bytes` long, sentinel-filled) and compares it cell by
 * cell with the reference; also checks that nothing outside the view was written. */
static int mask4d_matches(const tcase *c, maskpack_mask_convention conv, maskpack_fill fill, maskpack_tensor *t,
                          uint8_t *buf, size_t bytes) {
    maskpack_error e;
    maskpack_status s = maskpack_mask4d(c->L, conv, fill, t, &e);
    if (s) {
        fprintf(stderr, "mask4d failed: %s\n", e.message);
        return 0;
    }
    int64_t H = t->shape[1], n = c->B * H * c->S * c->Skv;
    int64_t *offs = malloc((size_t)(n ? n : 1) * sizeof *offs);
    view_offsets(t, offs);
    int ok = 1;
    int64_t x = 0;
    for (int64_t b = 0; b < c->B && ok; b++)
        for (int64_t h = 0; h < H && ok; h++)
            for (int64_t i = 0; i < c->S && ok; i++)
                for (int64_t j = 0; j < c->Skv && ok; j++, x++)
                    if (!cell_value_ok(conv, fill, t->dtype, buf, offs[x], c->ref[(b * c->S + i) * c->Skv + j])) {
                        fprintf(stderr, "mask4d conv %d dtype %s: cell (%lld,%lld,%lld,%lld) wrong\n", (int)conv,
                                maskpack_dtype_name(t->dtype), (long long)b, (long long)h, (long long)i, (long long)j);
                        ok = 0;
                    }
    if (ok) ok = untouched_outside(buf, bytes, offs, (size_t)n, maskpack_dtype_size(t->dtype));
    free(offs);
    return ok;
}

static void check_mask4d(test_rng *r, const tcase *c) {
    static const struct {
        maskpack_mask_convention conv;
        maskpack_dtype dt;
        maskpack_fill fill;
    } variants[] = {
        {MASKPACK_MASK_KEEP, MASKPACK_BOOL, 0},     {MASKPACK_MASK_KEEP, MASKPACK_U8, 0},
        {MASKPACK_MASK_KEEP, MASKPACK_I32, 0},      {MASKPACK_MASK_KEEP, MASKPACK_F32, 0},
        {MASKPACK_MASK_MASKED, MASKPACK_BOOL, 0},   {MASKPACK_MASK_MASKED, MASKPACK_U8, 0},
        {MASKPACK_MASK_MASKED, MASKPACK_I32, 0},    {MASKPACK_MASK_MASKED, MASKPACK_F32, 0},
        {MASKPACK_MASK_ADDITIVE, MASKPACK_F32, 0},  {MASKPACK_MASK_ADDITIVE, MASKPACK_F32, 1},
        {MASKPACK_MASK_ADDITIVE, MASKPACK_F16, 0},  {MASKPACK_MASK_ADDITIVE, MASKPACK_F16, 1},
        {MASKPACK_MASK_ADDITIVE, MASKPACK_BF16, 0}, {MASKPACK_MASK_ADDITIVE, MASKPACK_BF16, 1},
        {MASKPACK_MASK_ADDITIVE, MASKPACK_F64, 0},  {MASKPACK_MASK_ADDITIVE, MASKPACK_F64, 1},
    };
    size_t nv = sizeof variants / sizeof variants[0];
    /* every convention and dtype, [B,1,S,Skv] contiguous */
    for (size_t v = 0; v < nv; v++) {
        int64_t shape[4] = {c->B, 1, c->S, c->Skv};
        size_t bytes = (size_t)(c->B * c->S * c->Skv) * maskpack_dtype_size(variants[v].dt) + 8;
        uint8_t *buf = malloc(bytes);
        memset(buf, SENT, bytes);
        maskpack_tensor t = maskpack_tensor_contiguous(buf, variants[v].dt, 4, shape);
        CHECK(mask4d_matches(c, variants[v].conv, variants[v].fill, &t, buf, bytes));
        free(buf);
    }
    /* several heads, contiguous (head planes are copies) */
    {
        size_t v = (size_t)test_rng_below(r, (int64_t)nv);
        int64_t H = 2 + test_rng_below(r, 2);
        int64_t shape[4] = {c->B, H, c->S, c->Skv};
        size_t bytes = (size_t)(c->B * H * c->S * c->Skv) * maskpack_dtype_size(variants[v].dt) + 8;
        uint8_t *buf = malloc(bytes);
        memset(buf, SENT, bytes);
        maskpack_tensor t = maskpack_tensor_contiguous(buf, variants[v].dt, 4, shape);
        CHECK(mask4d_matches(c, variants[v].conv, variants[v].fill, &t, buf, bytes));
        free(buf);
    }
    /* non-contiguous: physical order [B, S, H, W] with W = 2*Skv + 1 and key stride 2 (or 1 with padding) */
    {
        size_t v = (size_t)test_rng_below(r, (int64_t)nv);
        int64_t H = 1 + test_rng_below(r, 2), W = 2 * c->Skv + 1, ks = test_rng_below(r, 2) ? 2 : 1;
        int64_t shape[4] = {c->B, H, c->S, c->Skv};
        size_t bytes = (size_t)(c->B * c->S * H * W) * maskpack_dtype_size(variants[v].dt) + 8;
        uint8_t *buf = malloc(bytes);
        memset(buf, SENT, bytes);
        maskpack_tensor t = maskpack_tensor_contiguous(buf, variants[v].dt, 4, shape);
        t.strides[0] = c->S * H * W;
        t.strides[1] = W;
        t.strides[2] = H * W;
        t.strides[3] = ks;
        CHECK(mask4d_matches(c, variants[v].conv, variants[v].fill, &t, buf, bytes));
        free(buf);
    }
}

/* ---- block masks ---------------------------------------------------------------------------- */

#define BSENT ((int32_t)0x5a5a5a5a)

typedef struct barrays {
    maskpack_block_mask_arrays a;
    int32_t *mem[8];
    size_t len[8];
} barrays;

static void barrays_alloc(barrays *x, int64_t B, int64_t Qb, int64_t Kb) {
    size_t lens[8] = {(size_t)(B * Qb), (size_t)(B * Qb * Kb), (size_t)(B * Qb), (size_t)(B * Qb * Kb),
                      (size_t)(B * Kb), (size_t)(B * Kb * Qb), (size_t)(B * Kb), (size_t)(B * Kb * Qb)};
    for (int i = 0; i < 8; i++) {
        x->len[i] = lens[i];
        x->mem[i] = malloc((lens[i] + 1) * sizeof(int32_t));
        for (size_t j = 0; j <= lens[i]; j++) x->mem[i][j] = BSENT;
    }
    x->a = (maskpack_block_mask_arrays){x->mem[0], x->mem[1], x->mem[2], x->mem[3],
                                        x->mem[4], x->mem[5], x->mem[6], x->mem[7]};
}

static void barrays_free(barrays *x) {
    for (int i = 0; i < 8; i++) free(x->mem[i]);
}

/* Checks one list family: num [B, R], idx [B, R, C]; cls[b][r][c] (or its transpose) must be
 * `want` exactly for the listed entries, which ascend; entries after the count keep the sentinel.
 * listed[] accumulates how often each block is listed. */
static int check_lists(const int32_t *num, const int32_t *idx, int64_t B, int64_t R, int64_t C, int transpose,
                       const uint8_t *cls, int64_t Qb, int64_t Kb, uint8_t want, uint8_t *listed) {
    int ok = 1;
    for (int64_t b = 0; b < B; b++)
        for (int64_t rr = 0; rr < R; rr++) {
            int32_t n = num[b * R + rr];
            int64_t expect = 0;
            for (int64_t cc = 0; cc < C; cc++) {
                int64_t qb = transpose ? cc : rr, kb = transpose ? rr : cc;
                expect += cls[(b * Qb + qb) * Kb + kb] == want;
            }
            if (n != expect) ok = 0;
            if (n < 0 || n > C) return 0;
            const int32_t *row = idx + (b * R + rr) * C;
            for (int32_t t = 0; t < n; t++) {
                if (row[t] < 0 || row[t] >= C || (t > 0 && row[t] <= row[t - 1])) return 0;
                int64_t qb = transpose ? row[t] : rr, kb = transpose ? rr : row[t];
                if (cls[(b * Qb + qb) * Kb + kb] != want) ok = 0;
                if (!transpose) listed[(b * Qb + qb) * Kb + kb]++;
            }
            for (int64_t t = n; t < C; t++)
                if (row[t] != BSENT) ok = 0;
        }
    return ok;
}

static void check_block_mask(const tcase *c, int64_t bq, int64_t bk) {
    maskpack_error e;
    int64_t Qb = -1, Kb = -1;
    CHECK_OK(maskpack_block_mask_dims(c->L, bq, bk, &Qb, &Kb, &e), e);
    CHECK_EQ(Qb, (c->S + bq - 1) / bq);
    CHECK_EQ(Kb, (c->Skv + bk - 1) / bk);
    if (Qb < 0 || Kb < 0) return;
    /* block classes from the dense reference: 0 empty, 1 partial, 2 full */
    size_t nblk = (size_t)(c->B * Qb * Kb);
    uint8_t *cls = calloc(nblk + 1, 1), *listed = calloc(nblk + 1, 1);
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t qb = 0; qb < Qb; qb++)
            for (int64_t kb = 0; kb < Kb; kb++) {
                int64_t cnt = 0, area = 0;
                for (int64_t i = qb * bq; i < c->S && i < (qb + 1) * bq; i++)
                    for (int64_t j = kb * bk; j < c->Skv && j < (kb + 1) * bk; j++) {
                        area++;
                        cnt += c->ref[(b * c->S + i) * c->Skv + j];
                    }
                /* torch's create_block_mask pads the grid to whole blocks with False: a block cut
                 * short by the grid's end is at most partial */
                cls[(b * Qb + qb) * Kb + kb] = cnt == 0 ? 0 : (cnt == area && area == bq * bk) ? 2 : 1;
            }
    barrays x;
    barrays_alloc(&x, c->B, Qb, Kb);
    CHECK_OK(maskpack_block_mask(c->L, bq, bk, &x.a, &e), e);
    int ok_p = check_lists(x.mem[0], x.mem[1], c->B, Qb, Kb, 0, cls, Qb, Kb, 1, listed);
    int ok_f = check_lists(x.mem[2], x.mem[3], c->B, Qb, Kb, 0, cls, Qb, Kb, 2, listed);
    int ok_qp = check_lists(x.mem[4], x.mem[5], c->B, Kb, Qb, 1, cls, Qb, Kb, 1, listed);
    int ok_qf = check_lists(x.mem[6], x.mem[7], c->B, Kb, Qb, 1, cls, Qb, Kb, 2, listed);
    CHECK(ok_p);
    CHECK(ok_f);
    CHECK(ok_qp);
    CHECK(ok_qf);
    if (!(ok_p && ok_f && ok_qp && ok_qf))
        fprintf(stderr,
                "  block mask %lldx%lld on B=%lld S=%lld Skv=%lld N=%zu causal=%d align=%d win=(%lld,%lld) "
                "spans=%zu prefix=%d\n",
                (long long)bq, (long long)bk, (long long)c->B, (long long)c->S, (long long)c->Skv, c->N, c->rule.causal,
                (int)c->rule.alignment, (long long)c->rule.window_left, (long long)c->rule.window_right,
                c->rule.n_spans, c->rule.prefix != NULL);
    /* re-expansion: every block with an allowed cell is listed exactly once (in one of the lists);
     * FULL blocks hold only allowed cells, PARTIAL blocks both kinds, unlisted blocks none */
    int once = 1;
    for (size_t i = 0; i < nblk; i++)
        if (listed[i] != (cls[i] != 0)) once = 0;
    CHECK(once);

    /* the same result with only some outputs requested */
    barrays y;
    barrays_alloc(&y, c->B, Qb, Kb);
    maskpack_block_mask_arrays only_q = {NULL, NULL, NULL, NULL, y.mem[4], y.mem[5], y.mem[6], y.mem[7]};
    CHECK_OK(maskpack_block_mask(c->L, bq, bk, &only_q, &e), e);
    maskpack_block_mask_arrays only_idx = {NULL, y.mem[1], NULL, y.mem[3], NULL, y.mem[5], NULL, NULL};
    for (size_t j = 0; j <= y.len[5]; j++) y.mem[5][j] = BSENT;
    CHECK_OK(maskpack_block_mask(c->L, bq, bk, &only_idx, &e), e);
    int same = 1;
    for (int i = 0; i < 8; i++) {
        if (i == 0 || i == 2) continue; /* not requested: must stay untouched */
        if (memcmp(x.mem[i], y.mem[i], (y.len[i] + 1) * sizeof(int32_t)) != 0) same = 0;
    }
    for (size_t j = 0; j <= y.len[0]; j++)
        if (y.mem[0][j] != BSENT || y.mem[2][j] != BSENT) same = 0;
    CHECK(same);
    barrays_free(&y);
    barrays_free(&x);
    free(cls);
    free(listed);
}

/* ---- MagiAttention slices --------------------------------------------------------------------- */

static void check_magi(const tcase *c) {
    maskpack_error e;
    size_t count = 12345;
    const maskpack_rule *ru = &c->rule;
    int window = ru->window_left >= 0 || (!ru->causal && ru->window_right >= 0);
    maskpack_status s = maskpack_magi_slices(c->L, NULL, NULL, NULL, 0, &count, &e);
    if (window) {
        CHECK_EQ(s, MASKPACK_ERR_NOT_REPRESENTABLE);
        CHECK_MSG(e, "window");
        return;
    }
    CHECK_EQ(s, count == 0 ? MASKPACK_OK : MASKPACK_ERR_BUFFER_TOO_SMALL);
    if (count == 12345) return;
    size_t cap = count + 2;
    int32_t *q = malloc(2 * cap * sizeof *q), *k = malloc(2 * cap * sizeof *k), *t = malloc(cap * sizeof *t);
    memset(q, SENT, 2 * cap * sizeof *q);
    memset(k, SENT, 2 * cap * sizeof *k);
    memset(t, SENT, cap * sizeof *t);
    size_t count2 = 0;
    CHECK_OK(maskpack_magi_slices(c->L, q, k, t, cap, &count2, &e), e);
    CHECK_EQ(count2, count);
    CHECK(all_sentinel(q + 2 * count, 2 * (cap - count) * sizeof *q));
    /* expand to a dense (B*S) x (B*Skv) coverage count */
    int64_t TQ = c->B * c->S, TK = c->B * c->Skv;
    uint8_t *cover = calloc((size_t)(TQ * TK) + 1, 1);
    int sane = 1;
    for (size_t n = 0; n < count && sane; n++) {
        int64_t q0 = q[2 * n], q1 = q[2 * n + 1], k0 = k[2 * n], k1 = k[2 * n + 1];
        if (!(0 <= q0 && q0 < q1 && q1 <= TQ && 0 <= k0 && k0 < k1 && k1 <= TK)) sane = 0;
        if (t[n] != MASKPACK_MAGI_FULL && t[n] != MASKPACK_MAGI_CAUSAL) sane = 0;
        for (int64_t i = q0; i < q1 && sane; i++)
            for (int64_t j = k0; j < k1; j++) {
                /* CAUSAL is bottom-right aligned: slice row tq sees key tk iff tk <= tq + kn - qn */
                int in = t[n] == MASKPACK_MAGI_FULL || (j - k0) <= (i - q0) + (k1 - k0) - (q1 - q0);
                if (in && cover[i * TK + j] < 255) cover[i * TK + j]++;
            }
    }
    CHECK(sane);
    int exact = 1, overlap = 0;
    for (int64_t i = 0; i < TQ && sane; i++)
        for (int64_t j = 0; j < TK; j++) {
            int64_t bi = i / (c->S ? c->S : 1), bj = j / (c->Skv ? c->Skv : 1);
            int want = bi == bj ? c->ref[(bi * c->S + i % c->S) * c->Skv + j % c->Skv] : 0;
            if (cover[i * TK + j] > 1) overlap = 1;
            if ((cover[i * TK + j] != 0) != want) exact = 0;
        }
    CHECK(exact);
    CHECK(!overlap);
    free(cover);
    free(q);
    free(k);
    free(t);
}

/* ---- the random sweep ------------------------------------------------------------------------- */

static void test_random_layouts(void) {
    test_rng r = {0x9e3779b97f4a7c15ull};
    static tcase c;
    int n_cases = 0, n_cross = 0, n_window = 0, n_span = 0, n_prefix = 0, n_packed = 0, n_explicit = 0, n_shard = 0;
    for (int it = 0; it < 300; it++) {
        if (!make_case(&r, &c)) continue;
        n_cases++;
        n_cross += !maskpack_layout_is_self(c.L);
        n_window += c.rule.window_left >= 0 || c.rule.window_right >= 0;
        n_span += c.rule.n_spans > 0;
        n_prefix += c.rule.prefix != NULL;
        n_packed += c.packed;
        n_shard += c.sharded;
        for (size_t k = 0; k < c.N; k++)
            if (c.segs[k].flags & MASKPACK_SEGMENT_EXPLICIT_POS) {
                n_explicit++;
                break;
            }
        check_token_outputs(&r, &c);
        check_vector_outputs(&r, &c);
        check_mask4d(&r, &c);
        const int64_t sizes[] = {1, 7, 16, 128, c.S + 5, 1 + test_rng_below(&r, 20)};
        for (size_t a = 0; a < sizeof sizes / sizeof sizes[0]; a++) check_block_mask(&c, sizes[a], sizes[a]);
        check_block_mask(&c, 7, 16);
        check_block_mask(&c, 16, 1 + test_rng_below(&r, 9));
        check_block_mask(&c, 1 + test_rng_below(&r, 9), c.Skv + 1);
        check_magi(&c);
        free_case(&c);
    }
    /* the sweep really covered the features it claims to */
    CHECK(n_cases == 300);
    CHECK(n_cross > 20);
    CHECK(n_window > 20);
    CHECK(n_span > 10);
    CHECK(n_prefix > 20);
    CHECK(n_packed > 20);
    CHECK(n_explicit > 40);
    CHECK(n_shard > 10);
    printf("random layouts: %d (cross %d, window %d, spans %d, prefix %d, packed %d, explicit positions %d, "
           "CP shards %d)\n",
           n_cases, n_cross, n_window, n_span, n_prefix, n_packed, n_explicit, n_shard);
}

/* ---- hand examples -------------------------------------------------------------------------- */

static maskpack_layout *build(const maskpack_segment *s, size_t n, int64_t B, int64_t S, int64_t Skv, int packed,
                              const maskpack_rule *rule) {
    maskpack_layout *L = NULL;
    maskpack_error e;
    CHECK_OK(maskpack_layout_from_segments(s, n, B, S, Skv, packed, rule, &L, &e), e);
    return L;
}

static void test_hand_examples(void) {
    maskpack_error e;
    /* docs/conventions.md section 1: tokens a a a . b b . . c c c c . -> cu [0,3,5,9], cu_padded [0,4,8,13] */
    maskpack_segment s[3] = {{0, 0, 3, 0, 3}, {0, 4, 2, 4, 2}, {0, 8, 4, 8, 4}};
    maskpack_layout *L = build(s, 3, 1, 13, 13, 1, NULL);
    if (!L) return;
    int32_t cu[4], pad[4];
    int64_t four = 4, three = 3;
    maskpack_tensor t = maskpack_tensor_contiguous(cu, MASKPACK_I32, 1, &four);
    CHECK_OK(maskpack_cu_seqlens(L, MASKPACK_CU_TE, 0, &t, &e), e);
    CHECK(cu[0] == 0 && cu[1] == 3 && cu[2] == 5 && cu[3] == 9);
    t = maskpack_tensor_contiguous(pad, MASKPACK_I32, 1, &four);
    CHECK_OK(maskpack_cu_seqlens_padded(L, &t, &e), e);
    CHECK(pad[0] == 0 && pad[1] == 4 && pad[2] == 8 && pad[3] == 13);
    /* NPU form has no leading 0 */
    t = maskpack_tensor_contiguous(cu, MASKPACK_I32, 1, &three);
    CHECK_OK(maskpack_cu_seqlens(L, MASKPACK_CU_NPU, 0, &t, &e), e);
    CHECK(cu[0] == 3 && cu[1] == 5 && cu[2] == 9);
    int64_t pos[13], thirteen = 13;
    t = maskpack_tensor_contiguous(pos, MASKPACK_I64, 1, &thirteen);
    CHECK_OK(maskpack_position_ids(L, &t, &e), e);
    const int64_t want_pos[13] = {0, 1, 2, 0, 0, 1, 0, 0, 0, 1, 2, 3, 0};
    CHECK(memcmp(pos, want_pos, sizeof pos) == 0);
    CHECK_OK(maskpack_segment_ids(L, &t, &e), e);
    const int64_t want_ids[13] = {1, 1, 1, 0, 2, 2, 0, 0, 3, 3, 3, 3, 0};
    CHECK(memcmp(pos, want_ids, sizeof pos) == 0);
    int64_t nine = 9, idx[9];
    t = maskpack_tensor_contiguous(idx, MASKPACK_I64, 1, &nine);
    CHECK_OK(maskpack_valid_indices(L, &t, &e), e);
    const int64_t want_idx[9] = {0, 1, 2, 4, 5, 8, 9, 10, 11};
    CHECK(memcmp(idx, want_idx, sizeof idx) == 0);
    t = maskpack_tensor_contiguous(idx, MASKPACK_I64, 1, &three);
    CHECK_OK(maskpack_last_token_index(L, &t, &e), e);
    CHECK(idx[0] == 2 && idx[1] == 5 && idx[2] == 11);
    maskpack_layout_free(L);

    /* NPU form with an empty item: lengths 2,2,0,2,2 -> 2,4,4,6,8 */
    maskpack_segment z[5] = {{0, 0, 2, 0, 2}, {0, 2, 2, 2, 2}, {0, 4, 0, 4, 0}, {0, 4, 2, 4, 2}, {0, 6, 2, 6, 2}};
    L = build(z, 5, 1, 8, 8, 1, NULL);
    if (L) {
        int64_t five = 5, six = 6;
        int32_t c5[5];
        t = maskpack_tensor_contiguous(c5, MASKPACK_I32, 1, &five);
        CHECK_OK(maskpack_cu_seqlens(L, MASKPACK_CU_NPU, 0, &t, &e), e);
        CHECK(c5[0] == 2 && c5[1] == 4 && c5[2] == 4 && c5[3] == 6 && c5[4] == 8);
        int64_t c6[6];
        t = maskpack_tensor_contiguous(c6, MASKPACK_I64, 1, &six);
        CHECK_OK(maskpack_cu_seqlens_padded(L, &t, &e), e);
        CHECK(c6[0] == 0 && c6[1] == 2 && c6[2] == 4 && c6[3] == 4 && c6[4] == 6 && c6[5] == 8);
        t = maskpack_tensor_contiguous(c5, MASKPACK_I32, 1, &five);
        CHECK_OK(maskpack_last_token_index(L, &t, &e), e);
        CHECK(c5[2] == -1 && c5[3] == 5);
        maskpack_layout_free(L);
    }

    /* two rows, left padding in row 1 and an empty row 2: slot 1 starts at row 1's column 0 and
     * takes row 2's columns */
    maskpack_segment lp[2] = {{0, 0, 3, 0, 3}, {1, 2, 2, 2, 2}};
    L = build(lp, 2, 3, 4, 4, 0, NULL);
    if (L) {
        int64_t c3[3];
        t = maskpack_tensor_contiguous(c3, MASKPACK_I64, 1, &three);
        CHECK_OK(maskpack_cu_seqlens_padded(L, &t, &e), e);
        CHECK(c3[0] == 0 && c3[1] == 4 && c3[2] == 12);
        uint8_t m2[12];
        int64_t shape[2] = {3, 4};
        t = maskpack_tensor_contiguous(m2, MASKPACK_U8, 2, shape);
        CHECK_OK(maskpack_mask2d(L, &t, &e), e);
        const uint8_t want_m2[12] = {1, 1, 1, 0, 0, 0, 1, 1, 0, 0, 0, 0};
        CHECK(memcmp(m2, want_m2, 12) == 0);
        maskpack_layout_free(L);
    }

    /* 4D, one causal document of 3 and a pad: pad rows see nothing, -inf / 0 in f32 */
    maskpack_segment one[1] = {{0, 0, 3, 0, 3}};
    L = build(one, 1, 1, 4, 4, 0, NULL);
    if (L) {
        float m4[16];
        int64_t shape[4] = {1, 1, 4, 4};
        t = maskpack_tensor_contiguous(m4, MASKPACK_F32, 4, shape);
        CHECK_OK(maskpack_mask4d(L, MASKPACK_MASK_ADDITIVE, MASKPACK_FILL_NEG_INF, &t, &e), e);
        CHECK(m4[0] == 0.0f && isinf(m4[1]) && m4[1] < 0);
        CHECK(m4[2 * 4 + 2] == 0.0f && isinf(m4[2 * 4 + 3]));
        for (int j = 0; j < 4; j++) CHECK(isinf(m4[3 * 4 + j]));
        uint8_t mm[16];
        t = maskpack_tensor_contiguous(mm, MASKPACK_BOOL, 4, shape);
        CHECK_OK(maskpack_mask4d(L, MASKPACK_MASK_MASKED, MASKPACK_FILL_NEG_INF, &t, &e), e);
        const uint8_t want_mm[16] = {0, 1, 1, 1, 0, 0, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1};
        CHECK(memcmp(mm, want_mm, 16) == 0);
        /* block mask with 2x2 blocks: (0,0) partial (causal diagonal); in q block 1 the pad row 3
         * sees nothing, so (1,0) and (1,1) are partial */
        int32_t kvn[2], kvi[4], fkn[2], fki[4];
        maskpack_block_mask_arrays a = {kvn, kvi, fkn, fki, NULL, NULL, NULL, NULL};
        CHECK_OK(maskpack_block_mask(L, 2, 2, &a, &e), e);
        CHECK(kvn[0] == 1 && kvi[0] == 0 && fkn[0] == 0);
        CHECK(kvn[1] == 2 && kvi[2] == 0 && kvi[3] == 1 && fkn[1] == 0);
        maskpack_layout_free(L);
    }
    /* without the pad, block (1,0) is full */
    maskpack_segment full4[1] = {{0, 0, 4, 0, 4}};
    L = build(full4, 1, 1, 4, 4, 0, NULL);
    if (L) {
        int32_t kvn[2], kvi[4], fkn[2], fki[4], qn[2], qi[4], fqn[2], fqi[4];
        maskpack_block_mask_arrays a = {kvn, kvi, fkn, fki, qn, qi, fqn, fqi};
        CHECK_OK(maskpack_block_mask(L, 2, 2, &a, &e), e);
        CHECK(kvn[0] == 1 && kvi[0] == 0 && fkn[0] == 0);
        CHECK(kvn[1] == 1 && kvi[2] == 1 && fkn[1] == 1 && fki[2] == 0);
        CHECK(qn[0] == 1 && qi[0] == 0 && fqn[0] == 1 && fqi[0] == 1 && qn[1] == 1 && qi[2] == 1 && fqn[1] == 0);
        maskpack_layout_free(L);
    }

    /* MagiAttention: top-left, 4 queries over 2 keys -> CAUSAL rows [0,2) + FULL rows [2,4);
     * bottom-right 2 queries over 5 keys -> one CAUSAL */
    maskpack_rule tl = maskpack_rule_default();
    tl.alignment = MASKPACK_ALIGN_TOP_LEFT;
    maskpack_segment x[2] = {{0, 0, 4, 0, 2}, {0, 4, 2, 2, 5}};
    L = build(x, 2, 1, 6, 7, 1, &tl);
    if (L) {
        int32_t q[8], k[8], ty[4];
        size_t n = 0;
        CHECK_OK(maskpack_magi_slices(L, q, k, ty, 4, &n, &e), e);
        CHECK_EQ(n, 3);
        CHECK(ty[0] == MASKPACK_MAGI_CAUSAL && q[0] == 0 && q[1] == 2 && k[0] == 0 && k[1] == 2);
        CHECK(ty[1] == MASKPACK_MAGI_FULL && q[2] == 2 && q[3] == 4 && k[2] == 0 && k[3] == 2);
        /* top-left 2 over 5: row 0 sees key 0 only: CAUSAL over keys [0, 2) */
        CHECK(ty[2] == MASKPACK_MAGI_CAUSAL && q[4] == 4 && q[5] == 6 && k[4] == 2 && k[5] == 4);
        maskpack_layout_free(L);
    }
    maskpack_rule br = maskpack_rule_default();
    L = build(x, 2, 1, 6, 7, 1, &br);
    if (L) {
        int32_t q[8], k[8], ty[4];
        size_t n = 0;
        CHECK_OK(maskpack_magi_slices(L, q, k, ty, 4, &n, &e), e);
        CHECK_EQ(n, 2);
        /* bottom-right 4 over 2: rows 0,1 see nothing, rows 2,3 form a causal square */
        CHECK(ty[0] == MASKPACK_MAGI_CAUSAL && q[0] == 2 && q[1] == 4 && k[0] == 0 && k[1] == 2);
        CHECK(ty[1] == MASKPACK_MAGI_CAUSAL && q[2] == 4 && q[3] == 6 && k[2] == 2 && k[3] == 7);
        maskpack_layout_free(L);
    }
}

/* ---- errors ------------------------------------------------------------------------------- */

static void test_errors(void) {
    maskpack_error e;
    maskpack_segment s[2] = {{0, 0, 3, 0, 3}, {1, 1, 4, 1, 4}};
    maskpack_layout *L = build(s, 2, 2, 6, 6, 0, NULL);
    if (!L) return;
    uint8_t buf[512];
    int64_t sh4[4] = {2, 1, 6, 5};
    maskpack_tensor t = maskpack_tensor_contiguous(buf, MASKPACK_U8, 4, sh4);

    /* mask4d: wrong shape names expected and found, buffer untouched */
    memset(buf, SENT, sizeof buf);
    CHECK_STATUS(maskpack_mask4d(L, MASKPACK_MASK_KEEP, 0, &t, &e), MASKPACK_ERR_SHAPE, e);
    CHECK_MSG(e, "expected shape [2, 1, 6, 6], found [2, 1, 6, 5]");
    CHECK_MSG(e, "out");
    int64_t sh3[3] = {2, 6, 6};
    t = maskpack_tensor_contiguous(buf, MASKPACK_U8, 3, sh3);
    CHECK_STATUS(maskpack_mask4d(L, MASKPACK_MASK_KEEP, 0, &t, &e), MASKPACK_ERR_SHAPE, e);
    int64_t ok4[4] = {2, 2, 6, 6};
    t = maskpack_tensor_contiguous(buf, MASKPACK_I64, 4, ok4);
    CHECK_STATUS(maskpack_mask4d(L, MASKPACK_MASK_KEEP, 0, &t, &e), MASKPACK_ERR_DTYPE, e);
    CHECK_MSG(e, "int64");
    t = maskpack_tensor_contiguous(buf, MASKPACK_U8, 4, ok4);
    CHECK_STATUS(maskpack_mask4d(L, MASKPACK_MASK_ADDITIVE, 0, &t, &e), MASKPACK_ERR_DTYPE, e);
    CHECK_STATUS(maskpack_mask4d(L, (maskpack_mask_convention)7, 0, &t, &e), MASKPACK_ERR_CONVENTION, e);
    CHECK_STATUS(maskpack_mask4d(L, MASKPACK_MASK_KEEP, (maskpack_fill)9, &t, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_STATUS(maskpack_mask4d(NULL, MASKPACK_MASK_KEEP, 0, &t, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
    CHECK_STATUS(maskpack_mask4d(L, MASKPACK_MASK_KEEP, 0, NULL, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
    t.data = NULL;
    CHECK_STATUS(maskpack_mask4d(L, MASKPACK_MASK_KEEP, 0, &t, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
    t.data = buf;
    t.strides[0] = INT64_MAX / 2; /* offsets would wrap */
    t.strides[1] = INT64_MAX / 2;
    CHECK_STATUS(maskpack_mask4d(L, MASKPACK_MASK_KEEP, 0, &t, &e), MASKPACK_ERR_OVERFLOW, e);
    CHECK(all_sentinel(buf, sizeof buf));
    /* and the same buffer, correctly described, is written */
    t = maskpack_tensor_contiguous(buf, MASKPACK_U8, 4, ok4);
    CHECK_OK(maskpack_mask4d(L, MASKPACK_MASK_KEEP, 0, &t, &e), e);
    CHECK(!all_sentinel(buf, 144));
    CHECK_EQ(e.status, MASKPACK_OK);

    /* per-token outputs: wrong shapes and dtypes */
    memset(buf, SENT, sizeof buf);
    int64_t bad2[2] = {2, 7};
    t = maskpack_tensor_contiguous(buf, MASKPACK_U8, 2, bad2);
    CHECK_STATUS(maskpack_mask2d(L, &t, &e), MASKPACK_ERR_SHAPE, e);
    CHECK_MSG(e, "expected shape [2, 6], found [2, 7]");
    int64_t flat[1] = {12};
    t = maskpack_tensor_contiguous(buf, MASKPACK_I64, 1, flat); /* [T] only for packed layouts */
    CHECK_STATUS(maskpack_position_ids(L, &t, &e), MASKPACK_ERR_SHAPE, e);
    int64_t sh2[2] = {2, 6};
    t = maskpack_tensor_contiguous(buf, MASKPACK_F16, 2, sh2);
    CHECK_STATUS(maskpack_mask2d(L, &t, &e), MASKPACK_ERR_DTYPE, e);
    t = maskpack_tensor_contiguous(buf, MASKPACK_U8, 2, sh2);
    CHECK_STATUS(maskpack_position_ids(L, &t, &e), MASKPACK_ERR_DTYPE, e);
    CHECK_STATUS(maskpack_segment_ids(L, &t, &e), MASKPACK_ERR_DTYPE, e);
    CHECK_STATUS(maskpack_mask2d(L, NULL, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
    CHECK_STATUS(maskpack_position_ids(NULL, &t, &e), MASKPACK_ERR_NULL_ARGUMENT, e);

    /* vectors: wrong lengths, unknown form, NULL */
    int64_t n2 = 2, n3 = 3, n8 = 8;
    t = maskpack_tensor_contiguous(buf, MASKPACK_I32, 1, &n2);
    CHECK_STATUS(maskpack_cu_seqlens(L, MASKPACK_CU_TE, 0, &t, &e), MASKPACK_ERR_SHAPE, e);
    CHECK_MSG(e, "expected shape [3], found [2]");
    CHECK_STATUS(maskpack_cu_seqlens(L, (maskpack_cu_form)4, 0, &t, &e), MASKPACK_ERR_CONVENTION, e);
    CHECK_STATUS(maskpack_cu_seqlens_padded(L, &t, &e), MASKPACK_ERR_SHAPE, e);
    t = maskpack_tensor_contiguous(buf, MASKPACK_I32, 1, &n8); /* n_tokens is 7 */
    CHECK_STATUS(maskpack_valid_indices(L, &t, &e), MASKPACK_ERR_SHAPE, e);
    CHECK_MSG(e, "expected shape [7], found [8]");
    t = maskpack_tensor_contiguous(buf, MASKPACK_I32, 1, &n3);
    CHECK_STATUS(maskpack_seqlens(L, 0, &t, &e), MASKPACK_ERR_SHAPE, e);
    CHECK_STATUS(maskpack_last_token_index(L, &t, &e), MASKPACK_ERR_SHAPE, e);
    t = maskpack_tensor_contiguous(buf, MASKPACK_F32, 1, &n2);
    CHECK_STATUS(maskpack_seqlens(L, 0, &t, &e), MASKPACK_ERR_DTYPE, e);
    CHECK_STATUS(maskpack_cu_seqlens(L, MASKPACK_CU_NPU, 0, NULL, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
    CHECK_STATUS(maskpack_valid_indices(NULL, &t, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
    CHECK(all_sentinel(buf, sizeof buf));

    /* block masks */
    int64_t qb = 0, kb = 0;
    CHECK_STATUS(maskpack_block_mask_dims(L, 0, 4, &qb, &kb, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "block_q");
    CHECK_STATUS(maskpack_block_mask_dims(L, 4, -1, &qb, &kb, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "block_k");
    CHECK_STATUS(maskpack_block_mask_dims(L, 4, 4, NULL, &kb, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
    int32_t arr[8][16];
    memset(arr, SENT, sizeof arr);
    maskpack_block_mask_arrays a = {arr[0], arr[1], arr[2], arr[3], arr[4], arr[5], arr[6], arr[7]};
    CHECK_STATUS(maskpack_block_mask(L, 0, 4, &a, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_STATUS(maskpack_block_mask(L, 4, 4, NULL, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
    CHECK_STATUS(maskpack_block_mask(NULL, 4, 4, &a, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
    CHECK(all_sentinel(arr, sizeof arr));

    /* magi: sizing call, too small, NULL */
    size_t count = 0;
    int32_t q[8], k[8], ty[4];
    memset(q, SENT, sizeof q);
    memset(k, SENT, sizeof k);
    memset(ty, SENT, sizeof ty);
    CHECK_STATUS(maskpack_magi_slices(L, NULL, NULL, NULL, 0, &count, &e), MASKPACK_ERR_BUFFER_TOO_SMALL, e);
    CHECK_EQ(count, 2);
    CHECK_MSG(e, "expected >= 2 slices, found 0");
    count = 0;
    CHECK_STATUS(maskpack_magi_slices(L, q, k, ty, 1, &count, &e), MASKPACK_ERR_BUFFER_TOO_SMALL, e);
    CHECK_EQ(count, 2);
    CHECK(all_sentinel(q, sizeof q) && all_sentinel(k, sizeof k) && all_sentinel(ty, sizeof ty));
    CHECK_STATUS(maskpack_magi_slices(L, NULL, k, ty, 4, &count, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
    CHECK_STATUS(maskpack_magi_slices(L, q, k, ty, 4, NULL, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
    CHECK(all_sentinel(q, sizeof q));
    CHECK_OK(maskpack_magi_slices(L, q, k, ty, 4, &count, &e), e);
    CHECK_EQ(count, 2);
    CHECK(q[0] == 0 && q[1] == 3 && q[2] == 7 && q[3] == 11 && k[2] == 7 && k[3] == 11);
    maskpack_layout_free(L);

    /* windows are not representable as slices */
    maskpack_rule w = maskpack_rule_default();
    w.window_left = 2;
    L = build(s, 2, 2, 6, 6, 0, &w);
    if (L) {
        count = 99;
        CHECK_STATUS(maskpack_magi_slices(L, q, k, ty, 4, &count, &e), MASKPACK_ERR_NOT_REPRESENTABLE, e);
        CHECK_MSG(e, "window");
        maskpack_layout_free(L);
    }
}

/* int32 overflow: a packed layout of 3e9 tokens (never materialised) */
static void test_overflow(void) {
    maskpack_error e;
    const int64_t big = 3000000000LL;
    maskpack_segment s[2] = {{0, 0, 5, 0, 5}, {0, 10, big - 10, 10, big - 10}};
    maskpack_layout *L = build(s, 2, 1, big, big, 1, NULL);
    if (!L) return;
    int32_t b32[4];
    int64_t b64[4];
    int64_t n2 = 2, n3 = 3;
    memset(b32, SENT, sizeof b32);
    maskpack_tensor t = maskpack_tensor_contiguous(b32, MASKPACK_I32, 1, &n3);
    CHECK_STATUS(maskpack_cu_seqlens(L, MASKPACK_CU_TE, 0, &t, &e), MASKPACK_ERR_OVERFLOW, e);
    CHECK_MSG(e, "int32");
    CHECK_EQ(e.index[0], 2);
    CHECK_STATUS(maskpack_cu_seqlens_padded(L, &t, &e), MASKPACK_ERR_OVERFLOW, e);
    t = maskpack_tensor_contiguous(b32, MASKPACK_I32, 1, &n2);
    CHECK_STATUS(maskpack_seqlens(L, 1, &t, &e), MASKPACK_ERR_OVERFLOW, e);
    CHECK_EQ(e.index[0], 1);
    CHECK_STATUS(maskpack_last_token_index(L, &t, &e), MASKPACK_ERR_OVERFLOW, e);
    CHECK(all_sentinel(b32, sizeof b32));
    /* the same in int64 works */
    t = maskpack_tensor_contiguous(b64, MASKPACK_I64, 1, &n3);
    CHECK_OK(maskpack_cu_seqlens(L, MASKPACK_CU_TE, 0, &t, &e), e);
    CHECK(b64[2] == big - 5);
    CHECK_OK(maskpack_cu_seqlens_padded(L, &t, &e), e);
    CHECK(b64[1] == 10 && b64[2] == big);
    t = maskpack_tensor_contiguous(b64, MASKPACK_I64, 1, &n2);
    CHECK_OK(maskpack_last_token_index(L, &t, &e), e);
    CHECK(b64[0] == 4 && b64[1] == big - 1);
    /* per-token outputs claim 3e9 elements over a tiny buffer: validation must fail before any
     * write (position 2^31 does not fit int32; indices beyond 2^31 neither) */
    memset(b32, SENT, sizeof b32);
    t = maskpack_tensor_contiguous(b32, MASKPACK_I32, 1, &big);
    CHECK_STATUS(maskpack_position_ids(L, &t, &e), MASKPACK_ERR_OVERFLOW, e);
    CHECK_EQ(e.index[0], 10 + 2147483648LL);
    int64_t ntok = big - 5;
    t = maskpack_tensor_contiguous(b32, MASKPACK_I32, 1, &ntok);
    CHECK_STATUS(maskpack_valid_indices(L, &t, &e), MASKPACK_ERR_OVERFLOW, e);
    CHECK_EQ(e.index[0], 2147483648LL - 5); /* token 2^31 - 5 sits at column 2^31 */
    CHECK(all_sentinel(b32, sizeof b32));
    size_t count = 0;
    int32_t q[4], k[4], ty[2];
    CHECK_STATUS(maskpack_magi_slices(L, q, k, ty, 2, &count, &e), MASKPACK_ERR_OVERFLOW, e);
    maskpack_layout_free(L);
}

/* Pieces sharing keys: key-side sums exceed the key grid (int32), and even int64 */
static void test_shared_key_overflow(void) {
    maskpack_error e;
    const int64_t w = (int64_t)1 << 30, huge = (int64_t)1 << 62;
    maskpack_segment s[4];
    for (int k = 0; k < 4; k++) s[k] = (maskpack_segment){0, k, 1, 0, w, MASKPACK_SEGMENT_EXPLICIT_POS, k, 0};
    maskpack_layout *L = build(s, 3, 1, 4, w, 1, NULL);
    if (L) {
        int32_t b32[4];
        int64_t b64[4], n4 = 4;
        memset(b32, SENT, sizeof b32);
        maskpack_tensor t = maskpack_tensor_contiguous(b32, MASKPACK_I32, 1, &n4);
        CHECK_STATUS(maskpack_cu_seqlens(L, MASKPACK_CU_TE, 1, &t, &e), MASKPACK_ERR_OVERFLOW, e);
        CHECK_EQ(e.index[0], 2); /* 2^31 does not fit */
        CHECK(all_sentinel(b32, sizeof b32));
        CHECK_OK(maskpack_cu_seqlens(L, MASKPACK_CU_TE, 0, &t, &e), e); /* the query side does */
        CHECK(b32[3] == 3);
        t = maskpack_tensor_contiguous(b64, MASKPACK_I64, 1, &n4);
        CHECK_OK(maskpack_cu_seqlens(L, MASKPACK_CU_TE, 1, &t, &e), e);
        CHECK(b64[3] == 3 * w);
        /* explicit positions: position ids are q_pos + i */
        int64_t pos[4];
        t = maskpack_tensor_contiguous(pos, MASKPACK_I64, 1, &n4);
        CHECK_OK(maskpack_position_ids(L, &t, &e), e);
        CHECK(pos[0] == 0 && pos[1] == 1 && pos[2] == 2 && pos[3] == 0);
        maskpack_layout_free(L);
    }
    for (int k = 0; k < 4; k++) s[k].kv_len = huge;
    L = build(s, 4, 1, 4, huge, 1, NULL);
    if (L) {
        int64_t b64[5], n5 = 5;
        memset(b64, SENT, sizeof b64);
        maskpack_tensor t = maskpack_tensor_contiguous(b64, MASKPACK_I64, 1, &n5);
        CHECK_STATUS(maskpack_cu_seqlens(L, MASKPACK_CU_TE, 1, &t, &e), MASKPACK_ERR_OVERFLOW, e);
        CHECK_EQ(e.index[0], 2); /* 2^62 + 2^62 overflows at the second piece */
        CHECK(all_sentinel(b64, sizeof b64));
        maskpack_layout_free(L);
    }
}

/* Block mask at benchmark scale stays sparse: 131072 packed tokens, causal, 128 blocks */
static void test_block_mask_scale(void) {
    test_rng r = {12345};
    static maskpack_segment s[1000];
    int64_t T = 131072, pos = 0;
    for (int k = 0; k < 1000; k++) {
        int64_t left = T - pos, len = k == 999 ? left : 1 + test_rng_below(&r, 2 * left / (1000 - k));
        if (len > left - (999 - k)) len = left - (999 - k);
        s[k] = (maskpack_segment){0, pos, len, pos, len};
        pos += len;
    }
    maskpack_layout *L = build(s, 1000, 1, T, T, 1, NULL);
    if (!L) return;
    maskpack_error e;
    int64_t Qb = 0, Kb = 0;
    CHECK_OK(maskpack_block_mask_dims(L, 128, 128, &Qb, &Kb, &e), e);
    int32_t *num = calloc((size_t)Qb, 4), *idx = calloc((size_t)(Qb * Kb), 4), *fnum = calloc((size_t)Qb, 4),
            *fidx = calloc((size_t)(Qb * Kb), 4);
    maskpack_block_mask_arrays a = {num, idx, fnum, fidx, NULL, NULL, NULL, NULL};
    CHECK_OK(maskpack_block_mask(L, 128, 128, &a, &e), e);
    /* spot-check the classification of every listed block against the predicate on its corners and
     * the diagonal block structure: each q block lists its diagonal block */
    int diag = 1;
    for (int64_t qb = 0; qb < Qb; qb++) {
        int found = 0;
        for (int32_t t = 0; t < num[qb]; t++) found |= idx[qb * Kb + t] == qb;
        for (int32_t t = 0; t < fnum[qb]; t++) found |= fidx[qb * Kb + t] == qb;
        if (!found) diag = 0;
    }
    CHECK(diag);
    free(num);
    free(idx);
    free(fnum);
    free(fidx);
    maskpack_layout_free(L);
}

int main(void) {
    test_hand_examples();
    test_errors();
    test_overflow();
    test_shared_key_overflow();
    test_block_mask_scale();
    test_random_layouts();
    return check_report("test_derive");
}
